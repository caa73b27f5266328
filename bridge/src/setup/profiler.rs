//! The CPU profiler as one piece: the sampler, the blocked-in-poll watchdog, the
//! collector thread and its sinks.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::collector::{
    Collector, CollectorConfig, ProfileSink, MAX_AGGREGATION_KEYS, MAX_PROFILE_INTERVAL,
    MIN_PROFILE_INTERVAL,
};
use crate::config::ConfigError;
use crate::export::local_budget::{LocalBudget, DEFAULT_OUTPUT_MAX_BYTES};
use crate::local_sink::{output_dir, LocalProfileSink};
use crate::sampler::watchdog::{self, Watchdog, WatchdogConfig, WatchdogError, WatchdogStats};
use crate::sampler::{self, Sampler, SamplerConfig, SamplerError, SamplerStats};

/// Errors starting the profiler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfilerError {
    /// The sampler could not start (its message names the field or the conflict).
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// The blocked-in-poll watchdog could not start (its message names the field).
    #[error(transparent)]
    Watchdog(#[from] WatchdogError),
    /// `interval` must be from
    /// [`MIN_PROFILE_INTERVAL`](crate::collector::MIN_PROFILE_INTERVAL) (100 ms) to
    /// [`MAX_PROFILE_INTERVAL`](crate::collector::MAX_PROFILE_INTERVAL) (60 s).
    #[error("profiler.interval must be from 100 ms to 60 s, got {0:?}")]
    InvalidInterval(Duration),
    /// `allocation_sample_bytes` must be at most
    /// [`MAX_SAMPLE_BYTES`](crate::allocations::MAX_SAMPLE_BYTES) (1 TiB).
    #[error("profiler.allocation_sample_bytes must be at most 1 TiB (0 switches allocation sampling off), got {0}")]
    InvalidAllocationSampleBytes(u64),
    /// `aggregation_max_keys` must be from 1 to
    /// [`MAX_AGGREGATION_KEYS`](crate::collector::MAX_AGGREGATION_KEYS).
    #[error("profiler.aggregation_max_keys must be from 1 to 1048576, got {0}")]
    InvalidAggregationMaxKeys(usize),
    /// A variable the profiler reads was malformed (its message names it).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A file or thread could not be created.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Counters of the whole profiler: a snapshot ([`Profiler::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfilerStats {
    /// The sampler's counters.
    pub sampler: SamplerStats,
    /// The allocation sampler's counters (process-wide; see
    /// [`ProfilingAllocator`](crate::ProfilingAllocator)).
    pub allocations: crate::allocations::AllocationStats,
    /// Allocation samples that went into allocation profiles.
    pub alloc_samples_in_profiles: u64,
    /// Profiles handed to sinks.
    pub profiles_exported: u64,
    /// Profiles a sink refused.
    pub profiles_failed: u64,
    /// Samples that went into profiles.
    pub samples_in_profiles: u64,
    /// Time spent naming stacks (symbolization), all intervals together, in nanoseconds.
    pub symbolize_nanos: u64,
    /// The longest one interval's symbolization took, in nanoseconds.
    pub symbolize_nanos_max: u64,
    /// The blocked-in-poll watchdog's counters (process-wide).
    pub blocked: WatchdogStats,
    /// Blocked-in-poll stacks that went into blocked profiles.
    pub blocked_in_profiles: u64,
    /// CPU sampling periods drained from the threads' buffers but not kept, because the
    /// profiles before them were still being named, encoded or exported two intervals
    /// after theirs was due (a sink stalled), or could no longer be (a sink panicked):
    /// memory stays bounded while a sink stalls. Samples dropped at the source (a full
    /// buffer) are [`SamplerStats::dropped`].
    pub dropped_encoder_busy: u64,
    /// Blocked-in-poll blocks (the blocked profile's `contentions`) dropped likewise.
    pub blocked_dropped_encoder_busy: u64,
    /// CPU sampling periods that lost their span labels because their interval's
    /// aggregation already held [`aggregation_max_keys`](ProfilerBuilder::aggregation_max_keys)
    /// distinct (stack, span labels) keys: their CPU time stays in the profile, under
    /// their stack with no span labels, or (when even the unlabelled stacks took their
    /// room, an eighth more keys) under the one frame
    /// [`AGGREGATION_FULL_FRAME`](crate::collector::AGGREGATION_FULL_FRAME).
    pub aggregation_folded: u64,
    /// Blocked-in-poll blocks likewise.
    pub blocked_aggregation_folded: u64,
    /// Distinct (stack, span labels) keys of the last interval's CPU aggregation handed
    /// to the encoder: at most the cap plus an eighth plus one.
    pub aggregation_keys: u64,
    /// The same for the blocked-in-poll aggregation.
    pub blocked_aggregation_keys: u64,
    /// Addresses whose names the symbolizer keeps between intervals, all files together,
    /// after the last interval: at most 32,768 a file (about 150 bytes each), within one
    /// naming pass too.
    pub symbol_cache_entries: u64,
    /// Times a file's kept names were full and forgotten (found again as they are
    /// sampled): a count that keeps rising means the hot addresses do not fit.
    pub symbol_cache_clears: u64,
    /// Local profile and span files removed to keep the local directory within its
    /// bound ([`ProfilerBuilder::output_max_bytes`]); 0 without local files. Under
    /// [`Telemetry`](crate::Telemetry) the bound is shared with the span file and this
    /// is [`HealthStats::local_files_removed`](crate::HealthStats::local_files_removed).
    pub local_files_removed: u64,
    /// Their bytes.
    pub local_bytes_removed: u64,
    /// The process's CPU time over the 10 s windows in which the samples' CPU is checked
    /// against it, all windows so far (`getrusage`), in nanoseconds.
    pub cpu_process_ns: u64,
    /// Of it, the profiler's own threads' (collector, encoder, watchdog, uploaders): never
    /// sampled, by design.
    pub cpu_own_threads_ns: u64,
    /// The CPU time the samples stand for over the same windows.
    pub cpu_sampled_ns: u64,
    /// The last window's samples' share of the process's CPU, its own threads left out,
    /// per mille (0 before a window had enough CPU to judge). Under 1000 by more than the
    /// sampling's error: threads that never entered a span (nor registered) burned CPU
    /// no profile holds.
    pub cpu_coverage_permille: u64,
    /// Windows whose samples held under 80 % of that CPU (each said on stderr, the first
    /// at once, then at most once an hour).
    pub cpu_low_coverage_windows: u64,
}

/// Builds a [`Profiler`].
///
/// With no sink given, profiles go to the local directory (see
/// [`local_sink`](crate::local_sink)).
#[derive(Default)]
#[must_use]
pub struct ProfilerBuilder {
    sampler: SamplerConfig,
    collector: CollectorConfig,
    output_dir: Option<PathBuf>,
    sinks: Vec<Box<dyn ProfileSink>>,
    local_files: Option<bool>,
    /// The bound on the local directory, in bytes (0: none).
    output_max_bytes: Option<u64>,
    /// The bound on the local directory (from `Telemetry`, shared with its span file).
    budget: Option<Arc<LocalBudget>>,
    /// `None`: the default watchdog; `Some(None)`: switched off.
    blocked: Option<Option<WatchdogConfig>>,
    /// Mean bytes between allocation samples (`None`: the variable, else the default).
    alloc_sample_bytes: Option<u64>,
    /// Whether sampled allocations are tracked until freed (`None`: the variable, else
    /// off).
    alloc_inuse: Option<bool>,
}

impl std::fmt::Debug for ProfilerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfilerBuilder")
            .field("sampler", &self.sampler)
            .field("collector", &self.collector)
            .field("output_dir", &self.output_dir)
            .field("sinks", &self.sinks.len())
            .field("output_max_bytes", &self.output_max_bytes)
            .field("blocked", &self.blocked)
            .finish()
    }
}

impl ProfilerBuilder {
    /// Samples per second of each thread's CPU time (default 100).
    pub fn frequency_hz(mut self, hz: u32) -> Self {
        self.sampler.frequency_hz = hz;
        self
    }

    /// Length of one profile (default 10 s; 100 ms to
    /// [`MAX_PROFILE_INTERVAL`](crate::collector::MAX_PROFILE_INTERVAL), 60 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.collector.interval = interval;
        self
    }

    /// The mean bytes allocated between two allocation samples, per thread (default
    /// [`DEFAULT_SAMPLE_BYTES`](crate::allocations::DEFAULT_SAMPLE_BYTES), 512 KiB, or
    /// `OTEL_PROFILING_ALLOC_SAMPLE_BYTES`; 0 switches allocation sampling off; at most
    /// 1 TiB). Takes effect only with a [`ProfilingAllocator`](crate::ProfilingAllocator)
    /// as the `#[global_allocator]`: allocation profiles then sit beside the CPU ones.
    pub fn allocation_sample_bytes(mut self, bytes: u64) -> Self {
        self.alloc_sample_bytes = Some(bytes);
        self
    }

    /// Whether sampled allocations are tracked until they are freed (default off, or
    /// `OTEL_PROFILING_ALLOC_INUSE`): allocation profiles then also hold in-use memory,
    /// `inuse_objects` and `inuse_space`, by span — which requests' allocations the
    /// program still holds. Sampled objects up to 64 KiB are then served from a 20 MiB
    /// reserved arena (pages backed only where they are used), so that a free is told by
    /// its address; larger ones are tracked in 512 slots. What finds no room is profiled
    /// but not tracked, counted in
    /// [`AllocationStats::inuse_untracked`](crate::allocations::AllocationStats::inuse_untracked).
    /// A block must be freed by the allocator that made it (Rust's rule): with tracking
    /// on, a sampled block handed to C and freed with C's `free()` aborts there. See
    /// `docs/allocations.md`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), otel_profiling::ProfilerError> {
    /// let profiler = otel_profiling::Profiler::builder()
    ///     .allocation_inuse(true)
    ///     .start()?;
    /// # drop(profiler);
    /// # Ok(())
    /// # }
    /// ```
    pub fn allocation_inuse(mut self, on: bool) -> Self {
        self.alloc_inuse = Some(on);
        self
    }

    /// Whether samples carry the `span_name` label (default true).
    pub fn span_name_label(mut self, on: bool) -> Self {
        self.collector.span_name_label = on;
        self
    }

    /// Whether samples carry the `trace_id` label (default true). Pyroscope needs only
    /// `span_id` for the span link; `trace_id` is a 32-character string per trace, about a
    /// quarter of a sample's uncompressed bytes (see `docs/benchmarks.md`), which counts
    /// against Pyroscope's per-profile size and per-tenant ingestion limits.
    pub fn trace_id_label(mut self, on: bool) -> Self {
        self.collector.trace_id_label = on;
        self
    }

    /// The most distinct (stack, span labels) keys one interval's aggregation holds, for
    /// CPU samples and blocked-in-poll looks each (default
    /// [`DEFAULT_MAX_AGGREGATION_KEYS`](crate::collector::DEFAULT_MAX_AGGREGATION_KEYS),
    /// 65,536; 1 to [`MAX_AGGREGATION_KEYS`](crate::collector::MAX_AGGREGATION_KEYS)).
    /// Past it a sample with a new key keeps its CPU time but not its span labels,
    /// counted in [`ProfilerStats::aggregation_folded`].
    pub fn aggregation_max_keys(mut self, keys: usize) -> Self {
        self.collector.max_keys = keys;
        self
    }

    /// The window over which the CPU the samples stand for is checked against the
    /// process's (default 10 s; at least 100 ms): a window whose samples hold under 80 %
    /// of it, the profiler's own threads left out, is counted in
    /// [`ProfilerStats::cpu_low_coverage_windows`] and said on stderr.
    pub fn cpu_coverage_window(mut self, window: Duration) -> Self {
        self.collector.coverage_window = window.max(Duration::from_millis(100));
        self
    }

    /// Whether threads that never enter a span (nor call
    /// [`register_current_thread`](crate::sampler::register_current_thread) or run the
    /// runtime hooks) are sampled too (default true; docs/signal-path.md, "Threads that
    /// never register"): every second the profiler lists the
    /// process's threads and gives each new one a CPU timer, so the profiles hold the
    /// CPU of `spawn_blocking` closures run without a span, of thread pools and of C
    /// libraries' threads, with no span label. The profiler's own threads, the
    /// OpenTelemetry SDK's and threads that block `SIGPROF` are left out; see
    /// [`SamplerStats::adopted_threads`](crate::sampler::SamplerStats::adopted_threads).
    pub fn sample_unregistered_threads(mut self, on: bool) -> Self {
        self.collector.adopt_threads = on;
        self
    }

    /// Records buffered per thread between drains (default: sized from the rate and the
    /// drain period, see [`SamplerConfig::effective_ring_capacity`]).
    pub fn ring_capacity(mut self, capacity: usize) -> Self {
        self.sampler.ring_capacity = Some(capacity);
        self
    }

    /// How long a thread must be held inside one poll of a span, off-CPU in a system
    /// call, before the watchdog takes its stack for the blocked-in-poll profile (default
    /// 10 ms; see [`watchdog`](crate::sampler::watchdog)). `None` switches the watchdog off.
    pub fn blocked_threshold(mut self, threshold: Option<Duration>) -> Self {
        self.blocked = Some(threshold.map(|t| WatchdogConfig::default().with_threshold(t)));
        self
    }

    /// The blocked-in-poll watchdog's full settings (`None`: off).
    pub fn blocked_watchdog(mut self, config: Option<WatchdogConfig>) -> Self {
        self.blocked = Some(config);
        self
    }

    /// Where local files go (overrides `OTEL_PROFILING_OUTPUT_DIR`).
    pub fn output_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.output_dir = Some(dir.into());
        self
    }

    /// Adds a sink. Once a sink is added, local files are written only if
    /// [`local_files(true)`](Self::local_files) is also set.
    pub fn sink(mut self, sink: impl ProfileSink) -> Self {
        self.sinks.push(Box::new(sink));
        self
    }

    /// Adds an already boxed sink (see [`sink`](Self::sink)).
    pub fn sink_boxed(mut self, sink: Box<dyn ProfileSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Whether profiles are also written to the local directory.
    pub fn local_files(mut self, on: bool) -> Self {
        self.local_files = Some(on);
        self
    }

    /// The bound on this crate's profile and span files in the local directory, earlier
    /// runs' included: the oldest go first. Default: `OTEL_PROFILING_OUTPUT_MAX_BYTES`,
    /// else [`DEFAULT_OUTPUT_MAX_BYTES`] (256 MiB). `0` is no bound at all, the explicit
    /// opt-out: the directory then grows for as long as the profiler runs.
    pub fn output_max_bytes(mut self, bytes: u64) -> Self {
        self.output_max_bytes = Some(bytes);
        self
    }

    /// Keeps the local directory within `budget` (shared with the setup's span file).
    pub(crate) fn local_budget(mut self, budget: Arc<LocalBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Starts sampling (the calling thread is registered) and the collector thread.
    pub fn start(mut self) -> Result<Profiler, ProfilerError> {
        let interval = self.collector.interval;
        if !(MIN_PROFILE_INTERVAL..=MAX_PROFILE_INTERVAL).contains(&interval) {
            return Err(ProfilerError::InvalidInterval(interval));
        }
        if !(1..=MAX_AGGREGATION_KEYS).contains(&self.collector.max_keys) {
            return Err(ProfilerError::InvalidAggregationMaxKeys(
                self.collector.max_keys,
            ));
        }
        self.collector.drain_every = self.collector.drain_every.min(self.collector.interval);
        self.sampler.drain_period = self.collector.drain_every;
        let (mut output, mut local_budget) = (None, None);
        if self.local_files.unwrap_or(self.sinks.is_empty()) {
            let dir = output_dir(self.output_dir.as_deref());
            let budget = match self.budget.take() {
                Some(budget) => budget,
                None => {
                    let max_bytes = match self.output_max_bytes {
                        Some(bytes) => bytes,
                        None => crate::config::output_max_bytes_variable(|name| {
                            std::env::var(name).ok()
                        })?
                        .unwrap_or(DEFAULT_OUTPUT_MAX_BYTES),
                    };
                    Arc::new(LocalBudget::new(&dir, max_bytes))
                }
            };
            let sink = LocalProfileSink::new(&dir)
                .map_err(|source| ProfilerError::Io {
                    what: format!("creating the output directory {}", dir.display()),
                    source,
                })?
                .with_budget(budget.clone());
            self.sinks.push(Box::new(sink));
            output = Some(dir);
            local_budget = Some(budget);
        }
        if let Some(Some(config)) = &self.blocked {
            config.validate()?;
        }
        let alloc_mean = match self.alloc_sample_bytes {
            Some(bytes) if bytes > crate::allocations::MAX_SAMPLE_BYTES => {
                return Err(ProfilerError::InvalidAllocationSampleBytes(bytes));
            }
            Some(bytes) => bytes,
            None => crate::config::alloc_sample_bytes_variable(|name| std::env::var(name).ok())?
                .unwrap_or(crate::allocations::DEFAULT_SAMPLE_BYTES),
        };
        let alloc_inuse = match self.alloc_inuse {
            Some(on) => on,
            None => crate::config::alloc_inuse_variable(|name| std::env::var(name).ok())?
                .unwrap_or(false),
        };
        let period_ns = 1_000_000_000 / i64::from(self.sampler.frequency_hz.max(1));
        let sampler = Sampler::start(self.sampler)?;
        let collector =
            Collector::start(self.collector, period_ns, self.sinks).map_err(|source| {
                ProfilerError::Io {
                    what: "starting the collector thread".into(),
                    source,
                }
            })?;
        // Before any registration of this run: each gets its allocation ring.
        crate::allocations::start(alloc_mean, alloc_inuse).map_err(|source| ProfilerError::Io {
            what: "reserving the in-use allocation arena (profiler.allocation_inuse)".into(),
            source,
        })?;
        let _ = sampler.register_current_thread();
        let watchdog = match self
            .blocked
            .unwrap_or_else(|| Some(WatchdogConfig::default()))
        {
            Some(config) => Watchdog::start(config)?,
            None => None,
        };
        Ok(Profiler {
            watchdog,
            sampler: Some(sampler),
            collector: Some(collector),
            output_dir: output,
            local_budget,
        })
    }
}

/// A running CPU profiler. Dropping it stops sampling, writes the last profile and stops
/// the collector (waiting at most 5 s).
///
/// ```no_run
/// let profiler = otel_profiling::Profiler::builder()
///     .interval(std::time::Duration::from_secs(10))
///     .start()?;
/// println!("profiles go to {}", profiler.output_dir().unwrap().display());
/// # Ok::<(), otel_profiling::ProfilerError>(())
/// ```
#[derive(Debug)]
#[must_use = "dropping the profiler stops sampling at once: keep it for as long as you profile"]
pub struct Profiler {
    /// `None` when switched off, or when another profiler's watchdog serves the process.
    watchdog: Option<Watchdog>,
    sampler: Option<Sampler>,
    collector: Option<Collector>,
    output_dir: Option<PathBuf>,
    /// The bound kept on `output_dir`.
    local_budget: Option<Arc<LocalBudget>>,
}

impl Profiler {
    /// A builder with the defaults (100 Hz, 10 s profiles, local files).
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }

    /// The local directory profiles are written to, if local files are on.
    pub fn output_dir(&self) -> Option<&Path> {
        self.output_dir.as_deref()
    }

    /// The bound kept on [`output_dir`](Self::output_dir), if local files are on: give it
    /// to a [`LocalSpanExporter`](crate::local_sink::LocalSpanExporter) writing there
    /// (`with_budget`) so that one bound holds for both.
    pub fn local_budget(&self) -> Option<&Arc<LocalBudget>> {
        self.local_budget.as_ref()
    }

    /// Ends the current profile now and waits (up to `timeout`) until the sinks have it;
    /// `false` if they did not in time. Flushes asked before a profile ended share it, so
    /// calls against a stuck sink end no extra profiles and keep nothing per call.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.collector.as_ref().is_some_and(|c| c.flush(timeout))
    }

    /// Starts or stops tracking sampled allocations until they are freed while the
    /// profiler runs (see
    /// [`ProfilerBuilder::allocation_inuse`](crate::ProfilerBuilder::allocation_inuse)):
    /// in-use memory for an hour while a leak is looked for, say. Objects tracked before
    /// it is switched off stay tracked until freed; only new samples are not.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), otel_profiling::ProfilerError> {
    /// let profiler = otel_profiling::Profiler::builder().start()?;
    /// profiler.set_allocation_inuse(true)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_allocation_inuse(&self, on: bool) -> Result<(), ProfilerError> {
        if self.sampler.is_some() {
            crate::allocations::set_inuse(on).map_err(|source| ProfilerError::Io {
                what: "reserving the in-use allocation arena (profiler.allocation_inuse)".into(),
                source,
            })?;
        }
        Ok(())
    }

    /// Changes the mean bytes between allocation samples while the profiler runs (0
    /// pauses allocation sampling; at most
    /// [`MAX_SAMPLE_BYTES`](crate::allocations::MAX_SAMPLE_BYTES)). A profiler started
    /// with allocation sampling off gives threads no allocation buffer: those that
    /// registered before it is switched on here are counted as dropped, not profiled.
    pub fn set_allocation_sample_bytes(&self, bytes: u64) -> Result<(), ProfilerError> {
        if bytes > crate::allocations::MAX_SAMPLE_BYTES {
            return Err(ProfilerError::InvalidAllocationSampleBytes(bytes));
        }
        if self.sampler.is_some() {
            crate::allocations::set_mean(bytes);
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> ProfilerStats {
        let mut stats = ProfilerStats {
            sampler: sampler::stats(),
            allocations: crate::allocations::stats(),
            blocked: watchdog::stats(),
            ..ProfilerStats::default()
        };
        if let Some(c) = &self.collector {
            let s = c.stats();
            stats.profiles_exported = s.profiles_exported;
            stats.profiles_failed = s.profiles_failed;
            stats.samples_in_profiles = s.samples_in_profiles;
            stats.symbolize_nanos = s.symbolize_nanos;
            stats.symbolize_nanos_max = s.symbolize_nanos_max;
            stats.blocked_in_profiles = s.blocked_in_profiles;
            stats.alloc_samples_in_profiles = s.alloc_samples_in_profiles;
            stats.dropped_encoder_busy = s.dropped_encoder_busy;
            stats.blocked_dropped_encoder_busy = s.blocked_dropped_encoder_busy;
            stats.aggregation_folded = s.aggregation_folded;
            stats.blocked_aggregation_folded = s.blocked_aggregation_folded;
            stats.aggregation_keys = s.aggregation_keys;
            stats.blocked_aggregation_keys = s.blocked_aggregation_keys;
            stats.symbol_cache_entries = s.symbol_cache_entries;
            stats.symbol_cache_clears = s.symbol_cache_clears;
            stats.cpu_process_ns = s.cpu_process_ns;
            stats.cpu_own_threads_ns = s.cpu_own_threads_ns;
            stats.cpu_sampled_ns = s.cpu_sampled_ns;
            stats.cpu_coverage_permille = s.cpu_coverage_permille;
            stats.cpu_low_coverage_windows = s.cpu_low_coverage_windows;
        }
        if let Some(budget) = &self.local_budget {
            (stats.local_files_removed, stats.local_bytes_removed) = budget.removed();
        }
        stats
    }

    /// Stops sampling and writes the last profile, waiting at most `timeout`; returns
    /// whether everything finished in time.
    pub fn shutdown(mut self, timeout: Duration) -> bool {
        self.stop(timeout)
    }

    fn stop(&mut self, timeout: Duration) -> bool {
        // The allocator's hook passes through from here (its rings are drained last).
        if self.sampler.is_some() {
            crate::allocations::stop();
        }
        // The watchdog first: its last looks are drained into the last profile.
        drop(self.watchdog.take());
        drop(self.sampler.take());
        match self.collector.take() {
            Some(c) => c.shutdown(timeout),
            None => true,
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checked before anything starts: no sampler, thread or file comes of a bad setting.
    #[test]
    fn settings_out_of_range_fail_at_start_naming_the_field() {
        let start_err = |builder: ProfilerBuilder| match builder.local_files(false).start() {
            Ok(_) => panic!("started"),
            Err(e) => e.to_string(),
        };
        for bad in [Duration::from_millis(99), Duration::from_secs(61)] {
            let e = start_err(Profiler::builder().interval(bad));
            assert!(
                e.starts_with("profiler.interval must be from 100 ms to 60 s"),
                "{e}"
            );
        }
        let e = start_err(
            Profiler::builder().allocation_sample_bytes(crate::allocations::MAX_SAMPLE_BYTES + 1),
        );
        assert!(
            e.starts_with("profiler.allocation_sample_bytes must be at most 1 TiB"),
            "{e}"
        );
        for bad in [0, MAX_AGGREGATION_KEYS + 1] {
            let e = start_err(Profiler::builder().aggregation_max_keys(bad));
            assert!(
                e.starts_with("profiler.aggregation_max_keys must be"),
                "{e}"
            );
            assert!(e.contains(&MAX_AGGREGATION_KEYS.to_string()), "{e}");
        }
    }
}
