//! The collector: drains the sampler's per-thread buffers, aggregates samples by
//! (stack, span labels), and every interval turns them into one pprof CPU profile for the
//! sinks.
//!
//! ```text
//!  collector thread, every drain tick (100 ms)      encoder thread, every interval (10 s)
//!  sampler::drain_into ─► counts by ─► interval ══► symbolize (cached) ─► pprof ─► gzip
//!                         (stack, root)   (one queued)                    ─► sinks: local
//!                                                                            dir, Pyroscope…
//! ```
//!
//! Each interval also gives a second profile when the blocked-in-poll watchdog recorded
//! anything ([`ProfileKind::Blocked`]): its looks are drained on the same tick and named
//! with the same symbolizer.
//!
//! Each interval's aggregation holds at most [`DEFAULT_MAX_AGGREGATION_KEYS`] distinct
//! (stack, span labels) keys by default (`ProfilerBuilder::aggregation_max_keys`). Keys
//! carry the root span's ids, so under many short roots nearly every sample is a new key.
//! Past the cap a sample with a new key keeps its CPU time but loses its span labels: it
//! goes to its stack's unlabelled key, which may take up to an eighth more keys; past
//! those, to one key whose stack is the single frame [`AGGREGATION_FULL_FRAME`]. Totals
//! stay true; what lost its labels is counted (`ProfilerStats::aggregation_folded`) and
//! the last interval's key count is a gauge (`ProfilerStats::aggregation_keys`). An
//! interval is [`MIN_PROFILE_INTERVAL`] to [`MAX_PROFILE_INTERVAL`] (60 s) long.
//!
//! Two threads, so that the drain ticks never wait for naming, encoding or a sink: a
//! thread's buffer holds a few drain periods of samples (`SamplerConfig::
//! effective_ring_capacity`), while the first naming pass over a large binary can take
//! seconds. Neither thread holds a lock the sampler or the application needs.

mod coverage;
mod encoder;
mod inuse;
pub(crate) use coverage::{is_own_thread, own_thread};
pub(crate) mod symbolize;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::fork::ProcessBound;
use std::time::{Duration, Instant, SystemTime};

use crate::pprof::SampleLabels;
use crate::sampler::{self, SampleRecord};
use crate::span_name::SpanName;

/// Which profile type an [`EncodedProfile`] is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProfileKind {
    /// CPU samples (`cpu`/`nanoseconds`); Pyroscope's `process_cpu`.
    #[default]
    Cpu,
    /// Blocked-in-poll stacks (`contentions`/`count`, `delay`/`nanoseconds`), in the shape
    /// of Go's block profile; Pyroscope's `block` (see `docs/blocked-in-poll.md`).
    Blocked,
    /// Allocation samples (`alloc_objects`/`count`, `alloc_space`/`bytes`), estimated
    /// from the [`ProfilingAllocator`](crate::ProfilingAllocator)'s samples; Pyroscope's
    /// `memory` (see `docs/allocations.md`).
    Alloc,
}

impl ProfileKind {
    /// The part of local file names that tells the kind (`<start>_<tag>.pb.gz`).
    pub fn file_tag(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::Blocked => "blocked",
            ProfileKind::Alloc => "alloc",
        }
    }

    /// How a local profile file of this kind ends (`<start>_cpu.pb.gz`, ...): what the
    /// local sink writes and what readers of its directory look for.
    pub fn file_suffix(self) -> &'static str {
        match self {
            ProfileKind::Cpu => crate::local_sink::CPU_PROFILE_SUFFIX,
            ProfileKind::Blocked => crate::local_sink::BLOCKED_PROFILE_SUFFIX,
            ProfileKind::Alloc => crate::local_sink::ALLOC_PROFILE_SUFFIX,
        }
    }
}

/// One finished profile interval, encoded.
#[derive(Clone, Debug)]
pub struct EncodedProfile {
    /// The profile type.
    pub kind: ProfileKind,
    /// Start of the interval.
    pub start: SystemTime,
    /// Length of the interval.
    pub duration: Duration,
    /// Samples in the profile.
    pub samples: u64,
    /// The gzipped pprof bytes.
    pub gzip_pprof: Vec<u8>,
}

/// Where finished profiles go (the local directory, Pyroscope, a test double).
///
/// Called on the collector's encoder thread, never on the thread that drains the
/// sampler's buffers: a sink that blocks (file I/O) delays the profiles, not the samples.
/// It should still hand network work to its own thread.
pub trait ProfileSink: Send + 'static {
    /// Takes one profile.
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()>;
}

/// The default cap on distinct (stack, span labels) keys in one interval's aggregation,
/// for CPU samples and for blocked-in-poll looks alike (each has its own).
///
/// A key costs a 64-byte hash-table slot plus its boxed stack (8 bytes a frame). A full
/// aggregation (the cap, an eighth more unlabelled stacks, one more key) measured 32 MB at
/// 40 frames a stack and 84 MB at the sampler's
/// [`MAX_FRAMES`](crate::sampler::MAX_FRAMES) (128); while a sink is slow, three may be
/// alive (one filling, one queued, one being encoded). A 10 s interval at 100 Hz has at
/// most 1,000 samples a CPU, so 64 busy CPUs with every sample under another root stay
/// within it; a profile that large is already four times Pyroscope's 16,000 samples.
pub const DEFAULT_MAX_AGGREGATION_KEYS: usize = 1 << 16;

/// The largest cap `ProfilerBuilder::aggregation_max_keys` accepts (a full aggregation
/// is then about 1.3 GB at the deepest stacks).
pub const MAX_AGGREGATION_KEYS: usize = 1 << 20;

/// The shortest profile interval.
pub const MIN_PROFILE_INTERVAL: Duration = Duration::from_millis(100);

/// The longest profile interval. A profile is stamped with its interval's start and
/// Grafana's "Profiles for this span" link searches 60 s around a span, so a span late
/// in a longer interval could not find its profile (Pyroscope also refuses profiles
/// older than an hour); and the longer the interval, the more of a busy host's samples
/// go past the aggregation cap.
pub const MAX_PROFILE_INTERVAL: Duration = Duration::from_secs(60);

/// The one frame of the stack that samples past the aggregation cap go to when even
/// their stack found no room: their CPU time stays in the profile's total.
pub const AGGREGATION_FULL_FRAME: &str = "[otel-profiling: past the aggregation cap]";

/// The one frame of an allocation sample whose stack could not be walked (too little
/// stack left, counted in [`AllocationStats::low_stack`](crate::allocations::AllocationStats);
/// a stack copy refused, or no unwinder yet, in `truncated`): its bytes stay in the
/// profile's totals.
pub const ALLOCATION_NOT_WALKED_FRAME: &str = "[otel-profiling: allocation stack not walked]";

/// The stack key of [`AGGREGATION_FULL_FRAME`]: not an address a sample can hold.
const AGGREGATION_FULL_STACK: [u64; 1] = [u64::MAX];

/// Collector settings (set through [`ProfilerBuilder`](crate::ProfilerBuilder)).
#[derive(Clone, Debug)]
pub(crate) struct CollectorConfig {
    /// Length of one profile (default 10 s).
    pub(crate) interval: Duration,
    /// How often the per-thread buffers are drained (default 100 ms).
    pub(crate) drain_every: Duration,
    /// Whether samples carry the `span_name` label (default true). Pyroscope turns it into
    /// a series label, so switch it off if root span names are unbounded.
    pub(crate) span_name_label: bool,
    /// Whether samples carry the `trace_id` label (default true). Pyroscope needs only
    /// `span_id` for the span link; `trace_id` is a 32-character string per trace, about
    /// 25 % of a sample's uncompressed bytes (see `docs/benchmarks.md`), which counts
    /// against Pyroscope's per-profile size and per-tenant ingestion limits.
    pub(crate) trace_id_label: bool,
    /// Distinct keys one interval's aggregation holds before samples lose their labels
    /// (default [`DEFAULT_MAX_AGGREGATION_KEYS`]).
    pub(crate) max_keys: usize,
    /// The window over which the samples' CPU is compared with the process's
    /// (`coverage`; default 10 s).
    pub(crate) coverage_window: Duration,
    /// Whether threads that never register are found and sampled
    /// (`sampler::adopt`; default true).
    pub(crate) adopt_threads: bool,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        CollectorConfig {
            interval: Duration::from_secs(10),
            drain_every: Duration::from_millis(100),
            span_name_label: true,
            trace_id_label: true,
            max_keys: DEFAULT_MAX_AGGREGATION_KEYS,
            coverage_window: coverage::WINDOW,
            adopt_threads: true,
        }
    }
}

/// Said once when spans were created (or samples taken) and no span ever reached the
/// hooks.
pub(crate) const NO_SPANS_WARNING: &str = "otel-profiling: CPU samples were taken or spans \
    created, but no span has reached otel-profiling's layer, so no sample can name a span. \
    Most often a filter in front of the layer drops every span: an `EnvFilter` or level \
    filter on the whole subscriber (RUST_LOG=warn, say) hides `info` spans from every layer. \
    Put the filter on the fmt layer only \
    (`fmt::layer().with_filter(EnvFilter::from_default_env())`), or let the spans' level \
    through.";

/// The collector's live counters, updated by its thread (read them through
/// [`Collector::stats`]).
#[derive(Debug, Default)]
pub(crate) struct CollectorStats {
    /// Profiles handed to the sinks successfully.
    pub(crate) profiles_exported: AtomicU64,
    /// Profiles a sink failed to take.
    pub(crate) profiles_failed: AtomicU64,
    /// Samples put into profiles.
    pub(crate) samples_in_profiles: AtomicU64,
    /// Nanoseconds spent naming the stacks of all intervals so far.
    pub(crate) symbolize_nanos: AtomicU64,
    /// The longest any one interval's naming took, in nanoseconds.
    pub(crate) symbolize_nanos_max: AtomicU64,
    /// Blocked-in-poll looks put into blocked profiles.
    pub(crate) blocked_in_profiles: AtomicU64,
    /// Allocation samples put into allocation profiles.
    pub(crate) alloc_samples_in_profiles: AtomicU64,
    /// CPU periods drained but not kept: the encoder was still busy with earlier profiles
    /// [`MAX_HELD_PAST_DUE`] intervals after the one in progress was due, or gone.
    pub(crate) dropped_encoder_busy: AtomicU64,
    /// Blocked-in-poll blocks (`contentions`) likewise.
    pub(crate) blocked_dropped_encoder_busy: AtomicU64,
    /// CPU periods that lost their span labels (or stack) past the aggregation cap.
    pub(crate) aggregation_folded: AtomicU64,
    /// Blocked-in-poll blocks likewise.
    pub(crate) blocked_aggregation_folded: AtomicU64,
    /// Allocation samples likewise.
    pub(crate) alloc_aggregation_folded: AtomicU64,
    /// Keys of the CPU aggregation last handed to the encoder.
    pub(crate) aggregation_keys: AtomicU64,
    /// Keys of the blocked-in-poll aggregation last handed to the encoder.
    pub(crate) blocked_aggregation_keys: AtomicU64,
    /// Addresses whose names the symbolizer keeps, after the last interval.
    pub(crate) symbol_cache_entries: AtomicU64,
    /// Times a file's kept names were full and forgotten, so far.
    pub(crate) symbol_cache_clears: AtomicU64,
    /// CPU of the process over the coverage windows ended so far (`coverage`), ns.
    pub(crate) cpu_process_ns: AtomicU64,
    /// Of it, the crate's own threads', ns.
    pub(crate) cpu_own_threads_ns: AtomicU64,
    /// CPU the samples stand for over the same windows, ns.
    pub(crate) cpu_sampled_ns: AtomicU64,
    /// The last judged window's samples' share of the process's CPU (own threads left
    /// out), per mille.
    pub(crate) cpu_coverage_permille: AtomicU64,
    /// Windows whose samples held under 80 % of it.
    pub(crate) cpu_low_coverage_windows: AtomicU64,
}

/// A snapshot of the collector's counters ([`Collector::stats`]); users read them in
/// [`ProfilerStats`](crate::ProfilerStats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CollectorSnapshot {
    /// Profiles handed to the sinks successfully.
    pub(crate) profiles_exported: u64,
    /// Profiles a sink failed to take.
    pub(crate) profiles_failed: u64,
    /// Samples put into profiles.
    pub(crate) samples_in_profiles: u64,
    /// Nanoseconds spent naming the stacks of all intervals so far.
    pub(crate) symbolize_nanos: u64,
    /// The longest any one interval's naming took, in nanoseconds.
    pub(crate) symbolize_nanos_max: u64,
    /// Blocked-in-poll looks put into blocked profiles.
    pub(crate) blocked_in_profiles: u64,
    /// Allocation samples put into allocation profiles.
    pub(crate) alloc_samples_in_profiles: u64,
    /// CPU periods dropped while the encoder was busy (or gone).
    pub(crate) dropped_encoder_busy: u64,
    /// Blocked-in-poll blocks dropped likewise.
    pub(crate) blocked_dropped_encoder_busy: u64,
    /// CPU periods that lost their span labels past the aggregation cap.
    pub(crate) aggregation_folded: u64,
    /// Blocked-in-poll blocks likewise.
    pub(crate) blocked_aggregation_folded: u64,
    /// Allocation samples likewise.
    pub(crate) alloc_aggregation_folded: u64,
    /// Keys of the last CPU aggregation handed over.
    pub(crate) aggregation_keys: u64,
    /// Keys of the last blocked-in-poll aggregation handed over.
    pub(crate) blocked_aggregation_keys: u64,
    /// Addresses whose names the symbolizer keeps.
    pub(crate) symbol_cache_entries: u64,
    /// Times a file's kept names were forgotten.
    pub(crate) symbol_cache_clears: u64,
    /// See [`CollectorStats::cpu_process_ns`].
    pub(crate) cpu_process_ns: u64,
    /// See [`CollectorStats::cpu_own_threads_ns`].
    pub(crate) cpu_own_threads_ns: u64,
    /// See [`CollectorStats::cpu_sampled_ns`].
    pub(crate) cpu_sampled_ns: u64,
    /// See [`CollectorStats::cpu_coverage_permille`].
    pub(crate) cpu_coverage_permille: u64,
    /// See [`CollectorStats::cpu_low_coverage_windows`].
    pub(crate) cpu_low_coverage_windows: u64,
}

impl CollectorStats {
    fn snapshot(&self) -> CollectorSnapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CollectorSnapshot {
            profiles_exported: load(&self.profiles_exported),
            profiles_failed: load(&self.profiles_failed),
            samples_in_profiles: load(&self.samples_in_profiles),
            symbolize_nanos: load(&self.symbolize_nanos),
            symbolize_nanos_max: load(&self.symbolize_nanos_max),
            blocked_in_profiles: load(&self.blocked_in_profiles),
            alloc_samples_in_profiles: load(&self.alloc_samples_in_profiles),
            dropped_encoder_busy: load(&self.dropped_encoder_busy),
            blocked_dropped_encoder_busy: load(&self.blocked_dropped_encoder_busy),
            aggregation_folded: load(&self.aggregation_folded),
            blocked_aggregation_folded: load(&self.blocked_aggregation_folded),
            alloc_aggregation_folded: load(&self.alloc_aggregation_folded),
            aggregation_keys: load(&self.aggregation_keys),
            blocked_aggregation_keys: load(&self.blocked_aggregation_keys),
            symbol_cache_entries: load(&self.symbol_cache_entries),
            symbol_cache_clears: load(&self.symbol_cache_clears),
            cpu_process_ns: load(&self.cpu_process_ns),
            cpu_own_threads_ns: load(&self.cpu_own_threads_ns),
            cpu_sampled_ns: load(&self.cpu_sampled_ns),
            cpu_coverage_permille: load(&self.cpu_coverage_permille),
            cpu_low_coverage_windows: load(&self.cpu_low_coverage_windows),
        }
    }
}

enum Command {
    /// End the interval in progress, unless an interval ended since the last
    /// [`FlushBoard::ask`] already answers every flush asked so far.
    Flush,
    Stop,
}

/// Flushes waiting for their interval to reach the sinks: tickets in order and one
/// notification shared by every waiter. A channel per call, kept until its interval was
/// written, grew by one each call for as long as a sink was stuck (issue 42); this is the
/// same size however many flushes wait.
#[derive(Debug, Default)]
struct FlushBoard {
    state: Mutex<FlushState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct FlushState {
    /// Tickets given out so far (the last one's number).
    asked: u64,
    /// Every ticket up to this one reached the sinks.
    written: u64,
    /// The encoder is gone: no more tickets will be written.
    closed: bool,
}

impl FlushBoard {
    fn lock(&self) -> std::sync::MutexGuard<'_, FlushState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ticket for a flush asked now: the next interval to end answers it.
    fn ask(&self) -> u64 {
        let mut state = self.lock();
        state.asked += 1;
        state.asked
    }

    /// The last ticket given out.
    fn asked(&self) -> u64 {
        self.lock().asked
    }

    /// Tickets up to `ticket` reached the sinks: their waiters return `true`.
    fn written(&self, ticket: u64) {
        let mut state = self.lock();
        state.written = state.written.max(ticket);
        self.changed.notify_all();
    }

    /// No ticket will be written any more: waiters return at once.
    fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Waits (up to `timeout`) until `ticket` reached the sinks; `false` if it did not.
    fn wait(&self, ticket: u64, timeout: Duration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| s.written < ticket && !s.closed)
            .unwrap_or_else(PoisonError::into_inner);
        state.written >= ticket
    }
}

/// A running collector thread. Dropping it (or [`Collector::shutdown`]) writes the last
/// profile and stops the thread. Started and owned by [`Profiler`](crate::Profiler):
/// the collector is the one reader of the sampler's buffers.
pub(crate) struct Collector {
    /// The thread and its command channel: the starting process's alone (a forked child
    /// inherits neither the thread nor a channel it may use).
    running: ProcessBound<Running>,
    stats: Arc<CollectorStats>,
    flushes: Arc<FlushBoard>,
}

struct Running {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Collector {
    /// Starts the collector thread (`otel-profiling-collector`).
    pub(crate) fn start(
        config: CollectorConfig,
        period_ns: i64,
        sinks: Vec<Box<dyn ProfileSink>>,
    ) -> std::io::Result<Collector> {
        let (commands, receiver) = mpsc::channel();
        let stats = Arc::new(CollectorStats::default());
        // One interval queued while the one before is written: memory stays bounded, and
        // a busy encoder makes the interval in progress longer, never loses it.
        let (to_encoder, intervals) = mpsc::sync_channel(1);
        let flushes = Arc::new(FlushBoard::default());
        let encoder = encoder::Encoder::new(
            config.clone(),
            period_ns,
            sinks,
            stats.clone(),
            flushes.clone(),
        );
        let encoder = spawn_suppressed("otel-profiling-encoder", move || encoder.run(intervals))?;
        let config_window = config.coverage_window;
        let adopting = config.adopt_threads;
        let adopter = adopting.then(sampler::adopt::Adopter::new);
        let state = State {
            counts: Aggregation::new(config.max_keys),
            blocked: Aggregation::new(config.max_keys),
            allocs: Aggregation::new(config.max_keys),
            live: inuse::LiveObjects::default(),
            config,
            stats: stats.clone(),
            interval_start: SystemTime::now(),
            flushes: flushes.clone(),
            flush_pending: 0,
            flush_handed: 0,
            held: None,
            encoder: to_encoder,
            health: HealthLog::default(),
            coverage: coverage::Coverage::new(
                config_window,
                u64::try_from(period_ns).unwrap_or(1),
                adopting,
            ),
            adopter,
        };
        let thread = spawn_suppressed("otel-profiling-collector", move || {
            state.run(receiver, encoder)
        })?;
        Ok(Collector {
            running: ProcessBound::new(Running {
                commands,
                thread: Some(thread),
            }),
            stats,
            flushes,
        })
    }

    /// Ends the current interval now and waits (up to `timeout`) until its profile has
    /// been handed to the sinks. Flushes asked while one is pending share its interval.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let Some(running) = self.running.get() else {
            return false;
        };
        let ticket = self.flushes.ask();
        if running.commands.send(Command::Flush).is_err() {
            return false;
        }
        self.flushes.wait(ticket, timeout)
    }

    /// The counters, as they are now.
    pub(crate) fn stats(&self) -> CollectorSnapshot {
        self.stats.snapshot()
    }

    /// Writes the last profile and stops the thread, waiting at most `timeout`.
    pub(crate) fn shutdown(mut self, timeout: Duration) -> bool {
        self.stop(timeout)
    }

    /// Stops the thread; in a forked child, where it does not exist, does nothing (the
    /// parent writes its profiles).
    fn stop(&mut self, timeout: Duration) -> bool {
        let Some(running) = self.running.get_mut() else {
            return true;
        };
        let Some(thread) = running.thread.take() else {
            return true;
        };
        let _ = running.commands.send(Command::Stop);
        let deadline = Instant::now() + timeout;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                // Never hang the host: the thread is left to finish on its own.
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        thread.join().is_ok()
    }
}

/// Starts one of the collector's threads. Telemetry is suppressed for the thread's life,
/// as the SDK's batch span processor does: what the sinks run there (file writes, a test
/// double, instrumented code) makes no spans, and a span entered there does not register
/// the thread for sampling.
fn spawn_suppressed(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _suppressed = opentelemetry::Context::enter_telemetry_suppressed_scope();
            let _own = coverage::own_thread();
            body()
        })
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Longest `span_name` label value written. Pyroscope turns `span_name` into a series
/// label and refuses (400) a whole push with a label value over 2048 bytes
/// (`validation.max-label-value-length`).
pub const MAX_SPAN_NAME_LABEL_BYTES: usize = 2048;
/// Ends a `span_name` value cut to [`MAX_SPAN_NAME_LABEL_BYTES`].
pub const CUT_MARKER: &str = "…[cut]";

/// `name`, or its first bytes (on a character boundary) followed by [`CUT_MARKER`] so
/// that the whole stays within [`MAX_SPAN_NAME_LABEL_BYTES`].
fn bounded_label_value(name: Arc<str>) -> Arc<str> {
    if name.len() <= MAX_SPAN_NAME_LABEL_BYTES {
        return name;
    }
    let mut end = MAX_SPAN_NAME_LABEL_BYTES - CUT_MARKER.len();
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    Arc::from(format!("{}{CUT_MARKER}", &name[..end]))
}

/// The labels written for a sample of `key`, as `config` asks; names resolved (and cut)
/// once per interval through `names`.
fn sample_labels(
    config: &CollectorConfig,
    key: &LabelKey,
    names: &mut HashMap<SpanName, Arc<str>>,
) -> SampleLabels {
    let span_name = if config.span_name_label {
        key.name.map(|n| {
            names
                .entry(n)
                .or_insert_with(|| bounded_label_value(n.resolve()))
                .clone()
        })
    } else {
        None
    };
    SampleLabels {
        span_id: (key.span_id != 0).then_some(key.span_id),
        trace_id: (config.trace_id_label && key.trace_id != 0).then_some(key.trace_id),
        span_name,
    }
}

/// Aggregation key: the labels of a sample, before name resolution.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct LabelKey {
    span_id: u64,
    trace_id: u128,
    name: Option<SpanName>,
}

impl LabelKey {
    /// No span labels: samples outside any root, and samples past the aggregation cap.
    const NONE: LabelKey = LabelKey {
        span_id: 0,
        trace_id: 0,
        name: None,
    };
}

/// One stack's blocked-in-poll totals in an interval: (blocks, blocked nanoseconds).
type BlockedTotals = (u64, u64);

/// One stack's allocation totals in an interval: samples, and the (objects, bytes) they
/// stand for (estimates: fractional until the profile is written).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct AllocTotals {
    samples: u64,
    objects: f64,
    bytes: f64,
}

/// Totals by (stack, labels).
type Totals<V> = HashMap<(Box<[u64]>, LabelKey), V>;

/// Where [`Aggregation::add`] put a sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Added {
    /// Under its own key.
    Kept,
    /// Past the cap: under its stack with no span labels, or under
    /// [`AGGREGATION_FULL_FRAME`].
    Folded,
}

/// One interval's totals by (stack, labels), with at most `max_keys` keys plus an eighth
/// for unlabelled stacks plus one ([`AGGREGATION_FULL_STACK`]): the keys carry root span
/// ids, so the host's traffic, not its code, would set their number otherwise.
struct Aggregation<V> {
    totals: Totals<V>,
    max_keys: usize,
}

impl<V: Default> Aggregation<V> {
    fn new(max_keys: usize) -> Aggregation<V> {
        Aggregation {
            totals: HashMap::new(),
            max_keys,
        }
    }

    /// The most keys a label-free stack may take: distinct stacks are bounded by the
    /// host's code, not its traffic, so they get room past the cap before totals lose
    /// their stacks too.
    fn max_unlabelled(&self) -> usize {
        self.max_keys + self.max_keys / 8
    }

    /// Adds a sample of `frames` under `labels` (`add` updates its total). Past the cap a
    /// new key loses its labels and, past the unlabelled room, its stack: the total is
    /// always kept.
    fn add(&mut self, frames: &[u64], labels: LabelKey, add: impl FnOnce(&mut V)) -> Added {
        use std::collections::hash_map::Entry;
        let len = self.totals.len();
        let stack = match self.totals.entry((Box::from(frames), labels)) {
            Entry::Occupied(total) => {
                add(total.into_mut());
                return Added::Kept;
            }
            Entry::Vacant(slot) if len < self.max_keys => {
                add(slot.insert(V::default()));
                return Added::Kept;
            }
            Entry::Vacant(slot) => slot.into_key().0,
        };
        let room = len < self.max_unlabelled();
        let added = if labels == LabelKey::NONE {
            Added::Kept
        } else {
            Added::Folded
        };
        match self.totals.entry((stack, LabelKey::NONE)) {
            Entry::Occupied(total) => add(total.into_mut()),
            Entry::Vacant(slot) if room => add(slot.insert(V::default())),
            Entry::Vacant(_) => {
                let full = (Box::from(AGGREGATION_FULL_STACK), LabelKey::NONE);
                add(self.totals.entry(full).or_default());
                return Added::Folded;
            }
        }
        added
    }

    /// The totals so far; the aggregation starts again empty.
    fn take(&mut self) -> Totals<V> {
        std::mem::take(&mut self.totals)
    }

    /// Takes back totals [`take`](Self::take) gave (their interval goes on).
    fn put_back(&mut self, totals: Totals<V>) {
        self.totals = totals;
    }
}

/// The labels a sample under `root` gets.
fn label_key(root: Option<crate::span_context::RootLabel>) -> LabelKey {
    match root {
        Some(root) => LabelKey {
            span_id: root.span_id_u64(),
            trace_id: root.trace_id_u128(),
            name: root.name(),
        },
        None => LabelKey {
            span_id: 0,
            trace_id: 0,
            name: None,
        },
    }
}

/// The collector thread's state: the aggregation of the interval in progress. Naming,
/// encoding and the sinks run on the encoder thread (`encoder`), so a slow first naming
/// pass (the debug-info index of a large binary), a slow disk or a slow sink never stops
/// the drain ticks: the per-thread buffers hold only a few drain periods of samples.
struct State {
    config: CollectorConfig,
    stats: Arc<CollectorStats>,
    /// CPU periods by (stack, labels).
    counts: Aggregation<u64>,
    /// Blocked-in-poll looks: (blocks, blocked nanoseconds) by (stack, labels).
    blocked: Aggregation<BlockedTotals>,
    /// Allocation samples by (stack, labels).
    allocs: Aggregation<AllocTotals>,
    /// The sampled objects tracked for in-use memory, still alive when last looked at.
    live: inuse::LiveObjects,
    interval_start: SystemTime,
    /// Where flushes wait; the encoder tells them.
    flushes: Arc<FlushBoard>,
    /// The last flush ticket the interval in progress answers (0: none).
    flush_pending: u64,
    /// The last flush ticket of an interval handed to the encoder.
    flush_handed: u64,
    /// Set while the interval in progress is due but the encoder has no room for it yet:
    /// it goes on (nothing is lost, memory stays one aggregation) and is handed over at a
    /// later tick.
    held: Option<Held>,
    encoder: SyncSender<encoder::Interval>,
    health: HealthLog,
    /// The samples' CPU against the process's (`coverage`).
    coverage: coverage::Coverage,
    /// Finds the threads that never register (`None`: switched off).
    adopter: Option<sampler::adopt::Adopter>,
}

/// An interval held past its due hand-over.
#[derive(Clone, Copy)]
struct Held {
    /// When its hand-over first found the encoder busy.
    since: Instant,
    /// When it stopped taking samples ([`MAX_HELD_PAST_DUE`]): its profile ends there,
    /// and the time until its hand-over is a gap that the dropped counters account for.
    full_at: Option<SystemTime>,
}

/// Logs losses (dropped samples, truncated stacks, failed profiles) to stderr: the first at
/// once, then at most one line a minute, and only when something new was lost.
#[derive(Default)]
struct HealthLog {
    last: Option<Instant>,
    reported: (u64, u64, u64, u64),
    /// Whether the "signals come at the kernel tick" note was given.
    tick_noted: bool,
    /// Whether the "watchdog cannot read threads" note was given.
    watchdog_noted: bool,
    /// Whether the "aggregation cap reached" note was given.
    cap_noted: bool,
}

/// Intervals the one in progress may be held past its due hand-over (the encoder busy)
/// before the samples drained are counted and dropped instead of kept: with one interval
/// queued and one being written, at most five intervals' aggregation is held.
const MAX_HELD_PAST_DUE: u32 = 2;

/// Minimum time between two health lines.
const HEALTH_LOG_EVERY: Duration = Duration::from_secs(60);

impl HealthLog {
    fn check(&mut self, stats: &CollectorStats) {
        if self.last.is_some_and(|t| t.elapsed() < HEALTH_LOG_EVERY) {
            return;
        }
        let sampler = sampler::stats();
        if !self.tick_noted && sampler.periods > sampler.taken + sampler.taken / 20 {
            self.tick_noted = true;
            eprintln!(
                "otel-profiling: the kernel delivers fewer CPU timer signals than the sampling \
                 rate ({} signals for {} periods): samples are weighted, so CPU totals stay \
                 right, but stacks are taken at the kernel tick rate",
                sampler.taken, sampler.periods
            );
        }
        let folded = stats.aggregation_folded.load(Ordering::Relaxed)
            + stats.blocked_aggregation_folded.load(Ordering::Relaxed);
        if !self.cap_noted && folded > 0 {
            // Said once: the profiles look whole, only fewer samples name their span.
            self.cap_noted = true;
            eprintln!(
                "otel-profiling: an interval reached its cap of distinct (stack, span) keys \
                 (aggregation_max_keys): samples with new keys keep their CPU time but lose \
                 their span labels until the interval ends; counted in aggregation_folded"
            );
        }
        let watchdog = sampler::watchdog::stats();
        if !self.watchdog_noted && watchdog.read_failed >= 10 && watchdog.captures == 0 {
            // Silent otherwise: an empty blocked profile looks like "nothing blocks".
            self.watchdog_noted = true;
            eprintln!(
                "otel-profiling: the blocked-in-poll watchdog cannot read threads' state \
                 ({} failed reads of /proc/self/task/*/syscall, the thread CPU clocks or \
                 process_vm_readv, for example under a seccomp profile); no blocked-in-poll \
                 profile will be written",
                watchdog.read_failed
            );
        }
        let failed = stats.profiles_failed.load(Ordering::Relaxed);
        let busy = stats.dropped_encoder_busy.load(Ordering::Relaxed);
        let now = (sampler.dropped, sampler.truncated, failed, busy);
        if now.0 <= self.reported.0
            && now.1 <= self.reported.1
            && now.2 <= self.reported.2
            && now.3 <= self.reported.3
        {
            return;
        }
        eprintln!(
            "otel-profiling: samples taken {}, dropped {} (buffer full) and {} (profiles \
             before them still being written), truncated stacks {}; profiles exported {}, \
             failed {}",
            sampler.taken,
            sampler.dropped,
            busy,
            sampler.truncated,
            stats.profiles_exported.load(Ordering::Relaxed),
            failed
        );
        self.reported = now;
        self.last = Some(Instant::now());
    }
}

impl State {
    fn run(mut self, commands: Receiver<Command>, encoder: JoinHandle<()>) {
        let mut next_profile = Instant::now() + self.config.interval;
        loop {
            let wait = self
                .config
                .drain_every
                .min(next_profile.saturating_duration_since(Instant::now()));
            match commands.recv_timeout(wait) {
                Ok(Command::Flush) => {
                    // One interval answers every flush asked before it ended: a burst of
                    // flushes (or one per call while a sink is stuck) ends one interval.
                    let asked = self.flushes.asked();
                    if asked > self.flush_pending.max(self.flush_handed) {
                        self.drain();
                        self.flush_pending = asked;
                        self.hand_over();
                        next_profile = Instant::now() + self.config.interval;
                    }
                }
                Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    self.drain();
                    // The last interval waits for room: the encoder takes it once the one
                    // before is written, then ends when its channel closes.
                    let last = self.take_interval();
                    self.note_keys((last.counts.len(), last.blocked.len()));
                    if let Err(std::sync::mpsc::SendError(lost)) = self.encoder.send(last) {
                        self.count_lost(&lost);
                    }
                    drop(self);
                    if let Err(panic) = encoder.join() {
                        // A sink panicked: the stop reports it as before (the collector's
                        // own join fails), the panic hook having printed it.
                        std::panic::resume_unwind(panic);
                    }
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(adopter) = &mut self.adopter {
                        adopter.scan_if_due();
                    }
                    self.drain();
                    self.health.check(&self.stats);
                    self.coverage.check(&self.stats);
                    if self.held.is_some() || Instant::now() >= next_profile {
                        if Instant::now() >= next_profile {
                            next_profile += self.config.interval;
                            if next_profile < Instant::now() {
                                next_profile = Instant::now() + self.config.interval;
                            }
                        }
                        self.hand_over();
                    }
                }
            }
        }
    }

    fn drain(&mut self) {
        // Libraries loaded or unloaded since the last tick become unwindable (cheap when
        // nothing changed: two counters compared).
        sampler::refresh_modules();
        if let Some(held) = self
            .held
            .as_mut()
            .filter(|h| h.since.elapsed() > self.config.interval * MAX_HELD_PAST_DUE)
        {
            // Held too long: memory stays bounded by a few intervals' aggregation however
            // long a sink stalls. The buffers are still emptied (a full one would drop at
            // the source, unseen) and what they held is counted.
            held.full_at.get_or_insert_with(SystemTime::now);
            let (mut periods, mut blocks) = (0u64, 0u64);
            sampler::SamplerState::global().drain_both(
                |record: &SampleRecord| periods += u64::from(record.weight.max(1)),
                crate::allocations::count_dropped,
            );
            sampler::check_handler();
            // Sampled, then dropped (counted apart): not a thread left unsampled.
            self.coverage.add_sampled(periods);
            sampler::watchdog::drain_blocked(|record| blocks += u64::from(record.first_look));
            self.count_dropped(periods, blocks);
            return;
        }
        let (counts, mut folded, mut drained) = (&mut self.counts, 0u64, 0u64);
        let (allocs, mut alloc_folded) = (&mut self.allocs, 0u64);
        let live = &mut self.live;
        sampler::SamplerState::global().drain_both(
            |record: &SampleRecord| {
                // Weighted: a signal standing for several periods (rates above the kernel
                // tick) counts for all of them.
                let periods = u64::from(record.weight.max(1));
                drained += periods;
                let added = counts.add(record.frames(), label_key(record.root), |total| {
                    *total += periods;
                });
                if added == Added::Folded {
                    folded += periods;
                }
            },
            |record: &crate::allocations::AllocRecord| {
                let stack = &record.stack;
                let added = allocs.add(stack.frames(), label_key(stack.root), |total| {
                    total.samples += 1;
                    total.objects += record.objects;
                    total.bytes += record.bytes;
                });
                if added == Added::Folded {
                    alloc_folded += 1;
                }
                live.add(record);
            },
        );
        sampler::check_handler();
        self.coverage.add_sampled(drained);
        let (blocked, mut blocked_folded) = (&mut self.blocked, 0u64);
        sampler::watchdog::drain_blocked(|record| {
            let blocks = u64::from(record.first_look);
            let added = blocked.add(&record.frames[..], label_key(record.root), |total| {
                total.0 += blocks;
                total.1 = total.1.saturating_add(record.delay_ns);
            });
            if added == Added::Folded {
                blocked_folded += blocks;
            }
        });
        let stats = &self.stats;
        stats
            .aggregation_folded
            .fetch_add(folded, Ordering::Relaxed);
        stats
            .blocked_aggregation_folded
            .fetch_add(blocked_folded, Ordering::Relaxed);
        stats
            .alloc_aggregation_folded
            .fetch_add(alloc_folded, Ordering::Relaxed);
    }

    /// Sets the gauges of the keys (CPU, blocked) of the interval just handed over.
    fn note_keys(&self, (cpu, blocked): (usize, usize)) {
        let gauge = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let stats = &self.stats;
        stats.aggregation_keys.store(gauge(cpu), Ordering::Relaxed);
        stats
            .blocked_aggregation_keys
            .store(gauge(blocked), Ordering::Relaxed);
    }

    fn count_dropped(&self, periods: u64, blocks: u64) {
        let stats = &self.stats;
        stats
            .dropped_encoder_busy
            .fetch_add(periods, Ordering::Relaxed);
        stats
            .blocked_dropped_encoder_busy
            .fetch_add(blocks, Ordering::Relaxed);
    }

    /// An interval the encoder can no longer take (its thread is gone: a sink panicked).
    fn count_lost(&self, lost: &encoder::Interval) {
        let kinds = u64::from(!lost.counts.is_empty())
            + u64::from(!lost.blocked.is_empty())
            + u64::from(!lost.allocs.is_empty());
        for totals in lost.allocs.values() {
            crate::allocations::count_dropped_totals(totals.samples, totals.bytes);
        }
        self.stats
            .profiles_failed
            .fetch_add(kinds, Ordering::Relaxed);
        self.count_dropped(
            lost.counts.values().sum(),
            lost.blocked.values().map(|b| b.0).sum(),
        );
    }

    /// Ends the interval in progress (where it stopped taking samples, if it was held too
    /// long) and starts the next one now.
    fn take_interval(&mut self) -> encoder::Interval {
        let start = self.interval_start;
        let now = SystemTime::now();
        let end = self.held.and_then(|h| h.full_at).unwrap_or(now);
        self.interval_start = now;
        encoder::Interval {
            start,
            duration: end.duration_since(start).unwrap_or_default(),
            counts: self.counts.take(),
            blocked: self.blocked.take(),
            allocs: self.allocs.take(),
            inuse: self.live.totals(),
            flush: std::mem::take(&mut self.flush_pending),
        }
    }

    /// Hands the interval in progress to the encoder, or, while the encoder is still busy
    /// with the one before, lets it go on until a later tick.
    fn hand_over(&mut self) {
        let interval = self.take_interval();
        let keys = (interval.counts.len(), interval.blocked.len());
        let flush = interval.flush;
        match self.encoder.try_send(interval) {
            Ok(()) => {
                self.held = None;
                self.flush_handed = self.flush_handed.max(flush);
                self.note_keys(keys);
            }
            Err(TrySendError::Full(back)) => {
                // Put back: the interval keeps its start and its flushes.
                self.interval_start = back.start;
                self.counts.put_back(back.counts);
                self.blocked.put_back(back.blocked);
                self.allocs.put_back(back.allocs);
                self.flush_pending = back.flush;
                self.held.get_or_insert(Held {
                    since: Instant::now(),
                    full_at: None,
                });
            }
            Err(TrySendError::Disconnected(lost)) => {
                self.held = None;
                self.count_lost(&lost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_config() {
        let name = SpanName::intern(&"n".repeat(3000));
        let key = LabelKey {
            span_id: 7,
            trace_id: 9,
            name: Some(name),
        };
        let mut names = HashMap::new();
        let all = sample_labels(&CollectorConfig::default(), &key, &mut names);
        assert_eq!((all.span_id, all.trace_id), (Some(7), Some(9)));
        let cut = all.span_name.expect("span_name");
        assert!(cut.len() <= MAX_SPAN_NAME_LABEL_BYTES && cut.ends_with(CUT_MARKER));
        let config = CollectorConfig {
            trace_id_label: false,
            span_name_label: false,
            ..CollectorConfig::default()
        };
        let few = sample_labels(&config, &key, &mut names);
        assert_eq!(
            (few.span_id, few.trace_id, few.span_name),
            (Some(7), None, None)
        );
    }

    /// One ticket answers every flush asked before it; a closed board answers `false`
    /// at once rather than at each waiter's timeout.
    #[test]
    fn flushes_share_one_answer_and_a_closed_board_ends_every_wait() {
        let board = Arc::new(FlushBoard::default());
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let (board, ticket) = (board.clone(), board.ask());
                std::thread::spawn(move || board.wait(ticket, Duration::from_secs(20)))
            })
            .collect();
        let late = board.ask();
        board.written(board.asked() - 1);
        for waiter in waiters {
            assert!(waiter.join().expect("waiter"));
        }
        assert!(
            !board.wait(late, Duration::from_millis(10)),
            "not written yet"
        );
        let waiting = {
            let board = board.clone();
            std::thread::spawn(move || board.wait(late, Duration::from_secs(20)))
        };
        let closed_at = Instant::now();
        board.close();
        assert!(!waiting.join().expect("waiter"));
        assert!(closed_at.elapsed() < Duration::from_secs(10));
        // What was written before the close still counts.
        assert!(board.wait(late - 1, Duration::ZERO));
    }

    fn labelled(span_id: u64) -> LabelKey {
        LabelKey {
            span_id,
            trace_id: u128::from(span_id) << 64 | 1,
            name: None,
        }
    }

    /// Issue 42: with a root per request, every sample was a new key and one interval's
    /// map grew with the traffic. Past the cap a new key loses its labels (then its
    /// stack); the keys stay within cap + cap/8 + 1 and every period is still counted.
    #[test]
    fn past_the_cap_new_keys_lose_their_labels_but_not_their_time() {
        let mut agg = Aggregation::<u64>::new(16);
        let stack = |i: u64| [0x1000 + i, 0x2000];
        let add = |agg: &mut Aggregation<u64>, s: u64, labels: LabelKey, n: u64| {
            agg.add(&stack(s), labels, |total| *total += n)
        };
        for i in 0..16 {
            assert_eq!(add(&mut agg, i, labelled(i + 1), 1), Added::Kept);
        }
        // Known keys still add up where they are.
        assert_eq!(add(&mut agg, 5, labelled(6), 2), Added::Kept);
        // Full: a new root on stack 0 goes to stack 0 with no labels (a new key within
        // the unlabelled room), and so does the next one.
        assert_eq!(add(&mut agg, 0, labelled(100), 3), Added::Folded);
        assert_eq!(add(&mut agg, 0, labelled(101), 4), Added::Folded);
        assert_eq!(agg.totals[&(Box::from(&stack(0)[..]), LabelKey::NONE)], 7);
        // An unlabelled sample takes the last unlabelled room and loses nothing.
        assert_eq!(add(&mut agg, 1, LabelKey::NONE, 1), Added::Kept);
        assert_eq!(agg.totals.len(), 18);
        // No room left: the stack goes too, into the one full key.
        assert_eq!(add(&mut agg, 2, labelled(102), 5), Added::Folded);
        assert_eq!(add(&mut agg, 3, LabelKey::NONE, 6), Added::Folded);
        let full = (Box::from(&AGGREGATION_FULL_STACK[..]), LabelKey::NONE);
        assert_eq!(agg.totals[&full], 11);
        assert_eq!(agg.totals.len(), 19);

        // A flood of roots and stacks: the size holds and the total is every period.
        let mut fed = 16 + 2 + 3 + 4 + 1 + 5 + 6;
        let mut folded = 0;
        for i in 0..20_000u64 {
            let n = i % 7 + 1;
            fed += n;
            if add(&mut agg, i % 500, labelled(1_000 + i), n) == Added::Folded {
                folded += n;
            }
        }
        assert_eq!(agg.totals.len(), 19);
        assert_eq!(agg.totals.values().sum::<u64>(), fed);
        assert!(folded > 19_000, "{folded}");
        // A new interval starts empty, with the same cap.
        assert_eq!(agg.take().len(), 19);
        assert_eq!(add(&mut agg, 9, labelled(9), 1), Added::Kept);
    }

    /// The memory figures of [`DEFAULT_MAX_AGGREGATION_KEYS`] count a 64-byte table slot
    /// a key: a larger key must update them.
    #[test]
    fn a_key_costs_a_table_slot_and_its_stack() {
        assert_eq!(std::mem::size_of::<((Box<[u64]>, LabelKey), u64)>(), 64);
        assert_eq!(
            std::mem::size_of::<((Box<[u64]>, LabelKey), BlockedTotals)>(),
            64
        );
    }

    #[test]
    fn long_span_names_are_cut_with_a_marker_within_the_limit() {
        let short: Arc<str> = Arc::from("GET /report");
        assert_eq!(bounded_label_value(short.clone()), short);
        let exact: Arc<str> = Arc::from("x".repeat(MAX_SPAN_NAME_LABEL_BYTES));
        assert_eq!(bounded_label_value(exact.clone()), exact);
        // Multi-byte characters around the cut point stay whole.
        let long: Arc<str> = Arc::from("é".repeat(MAX_SPAN_NAME_LABEL_BYTES));
        let cut = bounded_label_value(long.clone());
        assert!(cut.len() <= MAX_SPAN_NAME_LABEL_BYTES, "{}", cut.len());
        assert!(cut.ends_with(CUT_MARKER));
        assert!(long.starts_with(cut.trim_end_matches(CUT_MARKER)));
        assert!(cut.len() > MAX_SPAN_NAME_LABEL_BYTES - CUT_MARKER.len() - 2);
    }
}
