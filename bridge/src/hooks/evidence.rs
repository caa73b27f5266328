//! CPU evidence on spans: when a local root span ends, its exported data carries the CPU
//! samples taken under it and the CPU time they stand for, so a slow span with almost no
//! CPU reads as "waiting" without opening a profile.
//!
//! The sampler's signal handler counts into the root's counters (a `root_cpu` slot) as it
//! samples. [`CpuEvidenceProcessor`] wraps the exporting span processor: it claims the
//! counters of each local root span as it starts (so only roots of providers that have
//! one are counted) and adds the totals as it ends. The layer and the wrappers find the
//! counters by span id in a sharded table, to label the threads that work for the root:
//! an entry is added once per local root span and removed when it ends; entries of spans
//! that never end through the processor are purged after [`ORPHAN_AGE`]. Each shard also
//! keeps its free and released counter slots, so claiming and releasing them takes no
//! lock beyond the shard's.

use std::cell::RefCell;
use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::Duration;

use opentelemetry::trace::SpanId;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;

use crate::fork::AtforkMutex;
use crate::label::{release_slot, Label, LabelOwner};
use crate::local_root::is_local_root;
use crate::processor::{mark_profile_id_known, ProfileIdScope};
use crate::root_cpu::{CpuHandle, RootTotals, RunDelay, SlotLists};

/// Samples taken while the span (or its local children) ran on some thread.
pub const CPU_SAMPLES_ATTRIBUTE: &str = "profiling.cpu.samples";
/// The CPU time those samples stand for, in nanoseconds (samples × sampling period).
pub const CPU_TIME_ATTRIBUTE: &str = "profiling.cpu.time_ns";
/// Wall time threads spent running inside the span or its local descendants (entered, or
/// being polled), summed over threads, in nanoseconds. With the span's duration and
/// [`CPU_TIME_ATTRIBUTE`] it says where the elapsed time went: active − CPU was spent
/// blocked inside a poll (off CPU, holding the thread); duration − active was spent with
/// no thread working for the span (awaiting something, or queued). Measured at the
/// thread's root transitions with the monotonic clock, so it is exact up to the span's
/// end; the CPU it is compared with is sampled (± one sampling period per thread, see
/// [`CPU_SAMPLES_ATTRIBUTE`] for how many samples back it).
pub const WALL_ACTIVE_ATTRIBUTE: &str = "profiling.wall.active_ns";
/// Wall time the root's futures spent woken but not yet polled — queued for a worker, not
/// awaiting anything — in nanoseconds, summed over wakes. Measured where a wrapper sees the
/// waker ([`ProfiledFuture`](crate::ProfiledFuture), the plain-API futures), so it is
/// present only on roots such a future ran under; without it, queued time is part of
/// "awaiting" (duration − active).
pub const WALL_QUEUED_ATTRIBUTE: &str = "profiling.wall.queued_ns";

/// Run delay: wall time the root's threads were runnable inside it but not running (the
/// CPUs ran other work, or the container's quota was used up), summed over threads, in
/// nanoseconds. Part of [`WALL_ACTIVE_ATTRIBUTE`] and disjoint from the CPU time: it is
/// not blocked time. Read from the scheduler (the thread's own
/// `/proc/thread-self/schedstat`) where a stretch of 250 µs or more on one thread ends;
/// 0 for a root with no such stretch (a shorter one cannot hold a preemption); absent
/// when a reading failed — unknown, not 0 (see `docs/elapsed-time.md` for its precision
/// and cost).
pub const WALL_RUNQUEUE_ATTRIBUTE: &str = "profiling.wall.runqueue_ns";
/// Bytes allocated under the local root (by any of its threads), estimated from the
/// allocation samples of [`ProfilingAllocator`](crate::ProfilingAllocator): each sample
/// weighs its size over its probability, so the sum is unbiased. One root's figure is
/// noisy: of small allocations, its relative standard error is about
/// `sqrt(mean / bytes)` (a root that allocated 100 means, 51 MiB at the default, is within
/// ±20 % in 95 % of roots; one that allocated one mean is 0 a third of the time; see
/// `docs/allocations.md`); sums over many roots are tight. Present when allocations are
/// sampled (the allocator installed and a mean set), 0 for a root that allocated
/// nothing sampled.
pub const ALLOC_BYTES_ATTRIBUTE: &str = "profiling.alloc.bytes";
/// Allocations made under the local root, estimated as [`ALLOC_BYTES_ATTRIBUTE`] is.
pub const ALLOC_COUNT_ATTRIBUTE: &str = "profiling.alloc.count";
/// Time the process's cgroup was throttled for its CPU quota while the local root ran, in
/// nanoseconds (cgroup v2 `throttled_usec`, v1 `throttled_time`; kept by the blocked-in-poll
/// watchdog every 100 ms, so within that at each end). Present when the cgroup's files can
/// be read and a watchdog runs. The process's threads were runnable but not run for that
/// long: time that reads as off CPU without being any wait of the span's own.
pub const CGROUP_THROTTLED_ATTRIBUTE: &str = "profiling.cgroup.throttled_ns";
/// Why a local root carries none of the evidence attributes above, when the processor
/// knows: `"not_followed"` (a sampler ran and counters were kept, but no
/// [`ProfilingLayer`](crate::ProfilingLayer) or wrapper of this crate ever entered the
/// root: its work ran outside them, e.g. under the plain `FutureExt::with_context`),
/// `"no_sampler"` (no sampler ran when it started), `"root_cap"` (the live-root cap,
/// `max_live_roots`, was reached when it started). Absent on roots with evidence, and on
/// spans the processor never saw start.
pub const EVIDENCE_MISSING_ATTRIBUTE: &str = "profiling.evidence.missing";

/// The cgroup's CPU limit, in CPUs (`cpu.max`, or `cpu.cfs_quota_us` / `cpu.cfs_period_us`),
/// on roots with a non-zero [`CGROUP_THROTTLED_ATTRIBUTE`].
pub const CGROUP_CPU_LIMIT_ATTRIBUTE: &str = "profiling.cgroup.cpu_limit";

/// Entries whose span is gone without having ended through a processor are purged
/// after at least this long. (Entries of roots that no layer or wrapper has followed yet
/// are kept for an hour: a root may wait, unentered, in a queue before its first poll.)
/// An entry's age counts from the first sweep of its shard that saw it (a sweep every
/// 1,024 roots started in the shard), so a root's start reads no clock: an orphan goes
/// at a sweep at least this long after one that saw it.
pub const ORPHAN_AGE: Duration = Duration::from_secs(120);
/// How long an entry that nothing has followed yet is kept: such a root holds no reference
/// to its counters, so only its age tells a span still waiting for its first poll from one
/// whose end the processor never saw (a leaked span, a provider shut down under it).
const UNFOLLOWED_AGE: Duration = Duration::from_secs(3600);

const SHARDS: usize = 64;
/// Inserts into a shard between two sweeps for orphans.
const SWEEP_EVERY: u32 = 1024;

/// What spans and contexts of one root hold: while any holds it, the root is alive (the
/// orphan sweep looks at the reference count). It also owns the root's label slot once
/// the root's first handle is made ([`LabelOwner`]), so a root costs one allocation for
/// both, released with the last of the table's entry and the root's handles; when that
/// last is a handle, its thread keeps the allocation for its next root (`SPARE`).
#[derive(Debug)]
pub(crate) struct RootCounters {
    /// The counter slot's index and generation ([`CpuHandle::parts`]): atomics so that a
    /// thread reusing a spare allocation (`counters_for`) sets them without taking the
    /// `Arc` apart.
    index: AtomicU32,
    generation: AtomicU64,
    /// A layer or wrapper followed the root (took its counters to label threads with): only
    /// then do the totals say something. A root nothing followed ends with no evidence,
    /// not with a zero that would read as "never ran".
    followed: AtomicBool,
    /// The word of the label slot this owns (0: none yet).
    label: AtomicU64,
}

impl LabelOwner for RootCounters {
    fn adopt(&self, label: Label) -> bool {
        self.label
            .compare_exchange(0, label.word(), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The last holder (usually the root span's handle, as the span closes after its end)
    /// releases the label slot as `drop` would, and keeps the allocation on its thread
    /// for the next root's counters.
    fn let_go(self: Arc<Self>) {
        // No `Weak` of the counters is ever made: one strong reference is the only one
        // (a load, where `Arc::get_mut` takes a compare-and-swap of the weak count).
        if Arc::strong_count(&self) != 1 {
            return;
        }
        // The other holders' last uses happen before what follows (their drops released
        // the count, as `Arc`'s own drop pairs them).
        std::sync::atomic::fence(Ordering::Acquire);
        // The only reference: no other thread can touch the word, a load and a store do
        // what a swap would, without a locked instruction.
        let word = self.label.load(Ordering::Relaxed);
        self.label.store(0, Ordering::Relaxed);
        if let Some(label) = Label::from_raw(word) {
            release_slot(label);
        }
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut() {
                if spare.len() < SPARES {
                    spare.push(self);
                }
            }
        });
    }
}

/// Allocations of released roots' counters a thread keeps for its next roots.
const SPARES: usize = 8;

thread_local! {
    // Filled where roots' last handles drop, emptied where roots start: bounded per thread.
    static SPARE: RefCell<Vec<Arc<RootCounters>>> = const { RefCell::new(Vec::new()) };
}

/// Counters for a root starting with the counter slot `handle`: a spare allocation of
/// this thread's if it has one (kept only when no other reference to it existed, and
/// none can be made since), else a new one.
fn counters_for(handle: CpuHandle) -> Arc<RootCounters> {
    let spare = SPARE
        .try_with(|spare| spare.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    let (index, generation) = handle.parts();
    match spare {
        Some(cpu) => {
            cpu.index.store(index, Ordering::Relaxed);
            cpu.generation.store(generation, Ordering::Relaxed);
            cpu.followed.store(false, Ordering::Relaxed);
            cpu
        }
        None => Arc::new(RootCounters {
            index: AtomicU32::new(index),
            generation: AtomicU64::new(generation),
            followed: AtomicBool::new(false),
            label: AtomicU64::new(0),
        }),
    }
}

impl Drop for RootCounters {
    fn drop(&mut self) {
        if let Some(label) = Label::from_raw(*self.label.get_mut()) {
            release_slot(label);
        }
    }
}

impl RootCounters {
    /// The handle the root's label carries.
    pub(crate) fn handle(&self) -> CpuHandle {
        CpuHandle::from_parts(
            self.index.load(Ordering::Relaxed),
            self.generation.load(Ordering::Relaxed),
        )
    }
}

struct Entry {
    cpu: Arc<RootCounters>,
    /// When a sweep first saw the entry (coarse monotonic ns: only compared with
    /// [`ORPHAN_AGE`]); 0 until then.
    since: u64,
    /// The process's cgroup throttled time at the root's start, when it is kept.
    throttled_at_start: Option<u64>,
}

impl Entry {
    /// An entry made at `since` whose counters were `followed` or not (tests). Their
    /// handle names no slot: releasing it touches no real root's counters.
    #[cfg(test)]
    fn for_test(followed: bool, since: u64) -> Entry {
        Entry {
            cpu: Arc::new(RootCounters {
                index: AtomicU32::new(u32::MAX),
                generation: AtomicU64::new(0),
                followed: AtomicBool::new(followed),
                label: AtomicU64::new(0),
            }),
            since,
            throttled_at_start: None,
        }
    }

    /// Whether the entry's span is gone without having ended through a processor, at
    /// `now` (coarse monotonic ns). While a span or context of a followed root lives, it
    /// holds the counters (more than the table's one reference); once nothing does, the
    /// span is gone. A root nothing has followed yet never holds them: only its age counts.
    fn is_orphan(&self, now: u64) -> bool {
        if self.since == 0 || Arc::strong_count(&self.cpu) > 1 {
            return false;
        }
        let max_age = if self.cpu.followed.load(Ordering::Relaxed) {
            ORPHAN_AGE
        } else {
            UNFOLLOWED_AGE
        };
        now.saturating_sub(self.since) >= max_age.as_nanos() as u64
    }
}

/// Span ids are random (W3C trace context): their bits are already a good hash, so the
/// table does not pay for SipHash on every root's start and end.
#[derive(Default)]
struct SpanIdHasher(u64);

impl Hasher for SpanIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        // The shard took the low bits (`% SHARDS`): the map hashes the rest.
        self.0 = id.rotate_right(6);
    }
}

#[derive(Default)]
struct Shard {
    entries: entries::Entries,
    inserts: u32,
    slots: SlotLists,
}

impl Shard {
    /// Frees the orphans' counters at `now` (their counters go to `gone`, to be dropped
    /// after the shard's lock) and starts the age of entries no sweep saw yet.
    fn sweep(&mut self, now: u64, gone: &mut Vec<Arc<RootCounters>>) {
        let slots = &mut self.slots;
        self.entries.retain(|e| {
            if e.since == 0 {
                e.since = now;
                return true;
            }
            let orphan = e.is_orphan(now);
            if orphan {
                slots.release(e.cpu.handle());
                gone.push(e.cpu.clone());
            }
            !orphan
        });
    }
}

/// The table's shards: locks a `fork` can leave held by a parent thread, so the forking
/// thread holds them all across it (`crate::fork`).
static TABLE: OnceLock<Box<[AtforkMutex<Shard>]>> = OnceLock::new();
/// Live `CpuEvidenceProcessor`s: without one, nothing would ever read the counters.
static PROCESSORS: AtomicUsize = AtomicUsize::new(0);

fn shards() -> &'static [AtforkMutex<Shard>] {
    // Before the table exists, never inside its initialisation: a fork in progress holds
    // glibc's handler list while its prepare handler waits for that initialisation.
    crate::fork::install_handlers();
    table()
}

fn table() -> &'static [AtforkMutex<Shard>] {
    TABLE.get_or_init(|| {
        (0..SHARDS)
            .map(|_| AtforkMutex::new(Shard::default()))
            .collect()
    })
}

/// Each shard's direct array's address (0: not made yet), for [`prefetch`].
static CELLS: [AtomicUsize; SHARDS] = [const { AtomicUsize::new(0) }; SHARDS];

/// Starts loading the two cache lines a claim for `key` will touch, its shard's lock and
/// its cell, so that the misses (the cells are spread over 64 shards' arrays, and a
/// root's cell was last touched by the root before it) overlap the work done before the
/// claim. A hint only: no load, no fault, nothing on targets other than x86-64.
#[inline]
fn prefetch(key: u64) {
    if !cfg!(target_arch = "x86_64") {
        return; // no hint to give: skip the loads that find the addresses
    }
    let shard = (key as usize) % SHARDS;
    if let Some(table) = TABLE.get() {
        crate::sync::prefetch(&table[shard]);
    }
    let cells = CELLS[shard].load(Ordering::Relaxed);
    if cells != 0 {
        crate::sync::prefetch(cells.wrapping_add(entries::cell_offset(key)) as *const u8);
    }
}

/// The locked shard of `span_id`.
#[inline]
fn shard(span_id: u64) -> MutexGuard<'static, Shard> {
    let shards = shards();
    // Span ids are random: their low bits spread evenly.
    shards[(span_id as usize) % SHARDS].lock()
}

/// Free counter slots no shard keeps: a shard keeps at most [`SPARES_KEPT`] free ones,
/// and a shard with none takes one from here before a fresh one. Without it the table
/// would hold the sum of every shard's own peak of roots, which creeps up for weeks as
/// shards meet new peaks by chance; with it, the peak of all roots at once plus
/// `SHARDS × SPARES_KEPT`. A lock a `fork` can leave held: the forking thread holds it
/// (`hold_for_fork`). Only ever `try_lock`ed while a shard is held, so no thread waits on
/// it holding a shard: a slot that could not go to the pool stays in its shard.
static SPARE_POOL: AtforkMutex<Vec<u32>> = AtforkMutex::new(Vec::new());

/// Free counter slots a shard keeps for its own next roots.
const SPARES_KEPT: usize = 2;

/// `slots` (a shard's, which has none free) takes a slot from the pool, if it has one.
fn take_spare(slots: &mut SlotLists) {
    if let Some(index) = SPARE_POOL.try_lock().and_then(|mut pool| pool.pop()) {
        slots.adopt(index);
    }
}

/// `slots` (a shard's, after a release) gives its free slots past [`SPARES_KEPT`] to the
/// pool.
fn give_spares(slots: &mut SlotLists) {
    if let Some(index) = slots.extra(SPARES_KEPT) {
        match SPARE_POOL.try_lock() {
            Some(mut pool) => {
                pool.push(index);
                while let Some(index) = slots.extra(SPARES_KEPT) {
                    pool.push(index);
                }
            }
            None => slots.adopt(index),
        }
    }
}

/// Roots with counters now (each shard's entries, under its lock; none before the
/// table is made).
pub(crate) fn entries() -> u64 {
    TABLE.get().map_or(0, |shards| {
        shards.iter().map(|s| s.lock().entries.len() as u64).sum()
    })
}

/// Before `fork`: the forking thread takes every shard (see `crate::fork`).
pub(crate) fn hold_for_fork() {
    // Made here if it is not yet: an initialisation left half done by another thread at
    // the fork would block the child's first use for ever.
    for shard in table() {
        shard.hold();
    }
    SPARE_POOL.hold();
}

/// After `fork`, in the parent and in the child.
pub(crate) fn release_after_fork() {
    SPARE_POOL.release();
    for shard in table().iter().rev() {
        shard.release();
    }
}

thread_local! {
    // The root whose counters this thread's processor claimed last, kept for the layer or
    // wrapper that resolves the root next: usually the same thread right after (the SDK
    // starts a span inside the call that asks for its context), which then takes them
    // without the shard's lock.
    static CLAIMED: RefCell<Option<(u64, Arc<RootCounters>)>> = const { RefCell::new(None) };
}

/// Claims counters for the local root `span_id` that a [`CpuEvidenceProcessor`] is
/// starting, if a sampler runs (only spans that start while one runs get evidence).
fn claim(span_id: SpanId) -> Result<Arc<RootCounters>, &'static str> {
    if !crate::sampler::is_running() {
        return Err("no_sampler");
    }
    let key = u64::from_be_bytes(span_id.to_bytes());
    // Entries taken out are dropped after the shard's lock: the last holder of an entry's
    // counters releases the root's label slot, which may reclaim records (a syscall).
    let mut gone = Vec::new();
    let mut guard = shard(key);
    let shard = &mut *guard;
    shard.inserts = shard.inserts.wrapping_add(1);
    if shard.inserts.is_multiple_of(SWEEP_EVERY) {
        shard.sweep(crate::clock::coarse_monotonic_ns(), &mut gone);
    }
    if shard.slots.needs_fresh() {
        take_spare(&mut shard.slots);
    }
    // A full table (millions of live roots) only loses the evidence, never the span.
    let Ok(handle) = shard.slots.claim() else {
        return Err("root_cap");
    };
    let cpu = counters_for(handle);
    let replaced = shard.entries.insert(
        key,
        Entry {
            cpu: cpu.clone(),
            since: 0,
            throttled_at_start: crate::sampler::cgroup::throttled_ns(),
        },
    );
    if let Some(old) = &replaced {
        // The same span id twice (a caller reusing ids): the older root stops counting.
        shard.slots.release(old.cpu.handle());
    }
    let cells = &CELLS[(key as usize) % SHARDS];
    if cells.load(Ordering::Relaxed) == 0 {
        cells.store(shard.entries.cells_addr(), Ordering::Relaxed);
    }
    drop(guard);
    drop((replaced, gone));
    Ok(cpu)
}

/// The counters of the local root `span_id`, if the processor of the span's provider
/// claimed them as the span started. A root whose provider has no
/// [`CpuEvidenceProcessor`] gets none: nothing would ever report them.
pub(crate) fn counters_of(span_id: SpanId) -> Option<Arc<RootCounters>> {
    // Nothing was claimed without both (a sampler stopped since only costs this root's
    // evidence, as a root started before it ran has none).
    if PROCESSORS.load(Ordering::Relaxed) == 0 || !crate::sampler::is_running() {
        return None;
    }
    let key = u64::from_be_bytes(span_id.to_bytes());
    // Taken whatever it holds: a claim is kept only until the next root is resolved here,
    // so a stale one cannot outlive its span for long.
    let claimed = CLAIMED
        .try_with(|claimed| claimed.try_borrow_mut().ok().and_then(|mut c| c.take()))
        .ok()
        .flatten();
    let cpu = match claimed {
        Some((id, cpu)) if id == key => cpu,
        _ => {
            let shard = shard(key);
            shard.entries.get(key)?.cpu.clone()
        }
    };
    cpu.followed.store(true, Ordering::Relaxed);
    Some(cpu)
}

/// Ends counting for the root `span_id`: its totals and its cgroup throttled time at the
/// start if anything followed it, else whether it had counters nothing followed.
fn take(span_id: SpanId) -> Taken {
    let key = u64::from_be_bytes(span_id.to_bytes());
    // The entry outlives the shard's guard (see `claim`).
    let (entry, totals) = {
        let mut shard = shard(key);
        let Some(entry) = shard.entries.remove(key) else {
            return Taken::Nothing;
        };
        let totals = shard.slots.release(entry.cpu.handle());
        give_spares(&mut shard.slots);
        (entry, totals)
    };
    if entry.cpu.followed.load(Ordering::Relaxed) {
        Taken::Evidence(totals, entry.throttled_at_start)
    } else {
        Taken::NotFollowed
    }
}

/// What [`take`] finds for a span that ends.
enum Taken {
    /// The root's totals, and the cgroup's throttled time at its start.
    Evidence(RootTotals, Option<u64>),
    /// Counters were kept, and nothing of this crate ever entered the root.
    NotFollowed,
    /// No counters: not a local root, or none could be claimed (the reason is on the span
    /// since its start), or swept as an orphan.
    Nothing,
}

/// Wraps the exporting span processor and adds [`CPU_SAMPLES_ATTRIBUTE`],
/// [`CPU_TIME_ATTRIBUTE`] and [`WALL_ACTIVE_ATTRIBUTE`] to local root spans as they end.
///
/// Spans that started while no sampler ran carry no evidence attributes (rather than a
/// misleading zero), and so do roots that no [`ProfilingLayer`](crate::ProfilingLayer) or
/// wrapper followed (the bridge never saw their work).
///
/// ```
/// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
/// use otel_profiling::{CpuEvidenceProcessor, ProfileIdScope};
///
/// let exporter = InMemorySpanExporter::default();
/// let provider = SdkTracerProvider::builder()
///     .with_span_processor(
///         CpuEvidenceProcessor::new(SimpleSpanProcessor::new(exporter))
///             .with_profile_id(ProfileIdScope::LocalRoots),
///     )
///     .build();
/// ```
///
/// It can also set [`PROFILE_ID_ATTRIBUTE`](crate::PROFILE_ID_ATTRIBUTE) itself
/// ([`with_profile_id`](CpuEvidenceProcessor::with_profile_id)), in place of a separate
/// [`ProfileIdSpanProcessor`](crate::ProfileIdSpanProcessor): the SDK hands each processor
/// but the last its own copy of every ended span, so one processor instead of two saves a
/// copy of each span's data (its attributes, events and links) at every span end.
#[derive(Debug)]
pub struct CpuEvidenceProcessor<P> {
    inner: P,
    profile_id: ProfileIdScope,
}

impl<P: SpanProcessor> CpuEvidenceProcessor<P> {
    /// Adds the evidence to what `inner` receives.
    pub fn new(inner: P) -> CpuEvidenceProcessor<P> {
        PROCESSORS.fetch_add(1, Ordering::Relaxed);
        CpuEvidenceProcessor {
            inner,
            profile_id: ProfileIdScope::None,
        }
    }

    /// Also marks the spans in `scope` with `pyroscope.profile.id` as they start, as a
    /// [`ProfileIdSpanProcessor`](crate::ProfileIdSpanProcessor) would (default: none, so
    /// that a pipeline that has one does not get the attribute twice).
    ///
    /// ```
    /// use opentelemetry::trace::{Tracer, TracerProvider as _};
    /// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
    /// use otel_profiling::{CpuEvidenceProcessor, ProfileIdScope, PROFILE_ID_ATTRIBUTE};
    ///
    /// let exporter = InMemorySpanExporter::default();
    /// let provider = SdkTracerProvider::builder()
    ///     .with_span_processor(
    ///         CpuEvidenceProcessor::new(SimpleSpanProcessor::new(exporter.clone()))
    ///             .with_profile_id(ProfileIdScope::LocalRoots),
    ///     )
    ///     .build();
    /// provider.tracer("doc").in_span("GET /report", |_cx| {});
    /// let span = &exporter.get_finished_spans().unwrap()[0];
    /// let id = span.attributes.iter().find(|kv| kv.key.as_str() == PROFILE_ID_ATTRIBUTE);
    /// assert_eq!(id.unwrap().value.to_string(), span.span_context.span_id().to_string());
    /// ```
    pub fn with_profile_id(mut self, scope: ProfileIdScope) -> CpuEvidenceProcessor<P> {
        self.profile_id = scope;
        self
    }
}

impl<P> Drop for CpuEvidenceProcessor<P> {
    fn drop(&mut self) {
        PROCESSORS.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<P: SpanProcessor> SpanProcessor for CpuEvidenceProcessor<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        let local_root = is_local_root(cx);
        let span_context = opentelemetry::trace::Span::span_context(span);
        let (counted, span_id) = (
            local_root && span_context.is_sampled(),
            span_context.span_id(),
        );
        if counted {
            prefetch(u64::from_be_bytes(span_id.to_bytes()));
        }
        mark_profile_id_known(self.profile_id, span, local_root);
        if counted {
            match claim(span_id) {
                Ok(cpu) => {
                    let key = u64::from_be_bytes(span_id.to_bytes());
                    let _ = CLAIMED.try_with(|claimed| {
                        if let Ok(mut claimed) = claimed.try_borrow_mut() {
                            *claimed = Some((key, cpu));
                        }
                    });
                }
                Err(why) => {
                    opentelemetry::trace::Span::set_attribute(
                        span,
                        KeyValue::new(EVIDENCE_MISSING_ATTRIBUTE, why),
                    );
                }
            }
        }
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        let (totals, throttled_at_start) = match take(span.span_context.span_id()) {
            Taken::Evidence(totals, throttled) => (totals, throttled),
            Taken::NotFollowed => {
                span.attributes
                    .push(KeyValue::new(EVIDENCE_MISSING_ATTRIBUTE, "not_followed"));
                return self.inner.on_end(span);
            }
            Taken::Nothing => return self.inner.on_end(span),
        };
        {
            let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            let attributes = &mut span.attributes;
            attributes.push(KeyValue::new(CPU_SAMPLES_ATTRIBUTE, int(totals.samples)));
            attributes.push(KeyValue::new(CPU_TIME_ATTRIBUTE, int(totals.cpu_ns())));
            attributes.push(KeyValue::new(
                WALL_ACTIVE_ATTRIBUTE,
                int(crate::clock::ticks_to_ns(totals.active_ticks)),
            ));
            if let Some(queued) = totals.queued_ns {
                span.attributes
                    .push(KeyValue::new(WALL_QUEUED_ATTRIBUTE, int(queued)));
            }
            // Read at the end of every long stretch; a root with none had below 1 ms a
            // stretch (see `span_context::active`); unknown when a reading failed, and
            // then left out, never 0.
            let runqueue = match totals.runqueue {
                RunDelay::Read(ns) => Some(ns),
                RunDelay::NoLongStretch => Some(0),
                RunDelay::Unknown => None,
            };
            if let Some(runqueue) = runqueue {
                span.attributes
                    .push(KeyValue::new(WALL_RUNQUEUE_ATTRIBUTE, int(runqueue)));
            }
            if crate::allocations::sampling() {
                span.attributes.push(KeyValue::new(
                    ALLOC_BYTES_ATTRIBUTE,
                    int(totals.alloc_bytes),
                ));
                span.attributes.push(KeyValue::new(
                    ALLOC_COUNT_ATTRIBUTE,
                    int(totals.alloc_objects),
                ));
            }
            // Only when the count was kept at both ends (a watchdog ran, the files could
            // be read): otherwise "unknown", not 0.
            let throttled = throttled_at_start
                .zip(crate::sampler::cgroup::throttled_ns())
                .map(|(start, end)| end.saturating_sub(start));
            if let Some(throttled) = throttled {
                span.attributes
                    .push(KeyValue::new(CGROUP_THROTTLED_ATTRIBUTE, int(throttled)));
                if let Some(limit) = crate::sampler::cgroup::cpu_limit().filter(|_| throttled > 0) {
                    span.attributes
                        .push(KeyValue::new(CGROUP_CPU_LIMIT_ATTRIBUTE, limit));
                }
            }
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

mod entries;

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::sampler::{Sampler, SamplerConfig};
    use crate::{current_local_root, ProfilingLayer};

    /// A provider whose spans go through the evidence processor to `exported`.
    fn with_processor(exported: &InMemorySpanExporter) -> SdkTracerProvider {
        SdkTracerProvider::builder()
            .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(
                exported.clone(),
            )))
            .build()
    }

    /// The OpenTelemetry layer on `provider`'s tracer and the profiling layer.
    fn subscriber(provider: &SdkTracerProvider) -> impl tracing::Subscriber {
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(ProfilingLayer::default())
    }

    /// The counters of the root entered under `provider`'s tracer, as its label carries
    /// them (0: none).
    fn counters_under(provider: &SdkTracerProvider) -> u128 {
        tracing::subscriber::with_default(subscriber(provider), || {
            let root = tracing::info_span!("GET /evidence");
            let _entered = root.enter();
            current_local_root().expect("inside a root").cpu_raw()
        })
    }

    /// The sweep frees an entry only once nothing holds its counters and it is old enough:
    /// two minutes for a root that was followed, an hour for one still waiting to be.
    #[test]
    fn orphans_are_entries_nothing_holds_past_their_age() {
        let entry = Entry::for_test;
        let minutes = |m: u64| m * 60 * 1_000_000_000;
        let now = minutes(600);
        assert!(!entry(true, now - minutes(1)).is_orphan(now), "young");
        assert!(
            entry(true, now - minutes(3)).is_orphan(now),
            "followed, gone"
        );
        let held = entry(true, now - minutes(3));
        let _span = held.cpu.clone();
        assert!(!held.is_orphan(now), "a span still holds it");
        assert!(
            !entry(false, now - minutes(3)).is_orphan(now),
            "waiting for its first poll"
        );
        assert!(
            entry(false, now - minutes(61)).is_orphan(now),
            "never followed"
        );
        assert!(
            !entry(true, 0).is_orphan(now),
            "no sweep saw it yet: its age has not started"
        );
    }

    /// A sweep starts the age of the entries it sees for the first time and frees, at a
    /// later one, those old enough that nothing holds.
    #[test]
    fn a_sweep_starts_new_entries_ages_and_frees_old_orphans() {
        let minutes = |m: u64| m * 60 * 1_000_000_000;
        let mut shard = Shard::default();
        let (new, old) = (1_u64 << 6, 2_u64 << 6);
        shard.entries.insert(new, Entry::for_test(true, 0));
        shard.entries.insert(old, Entry::for_test(true, minutes(1)));
        let mut gone = Vec::new();
        shard.sweep(minutes(5), &mut gone);
        assert_eq!(gone.len(), 1, "the old orphan");
        assert!(!shard.entries.contains_key(old));
        assert_eq!(shard.entries.get(new).map(|e| e.since), Some(minutes(5)));
        shard.sweep(minutes(6), &mut gone);
        assert!(
            shard.entries.contains_key(new),
            "a minute since a sweep saw it"
        );
        shard.sweep(minutes(7), &mut gone);
        assert!(!shard.entries.contains_key(new), "two minutes since");
        assert_eq!(gone.len(), 2);
    }

    /// A followed root's counters own its label slot: the handles share the counters'
    /// allocation, and the slot lives until the last of them and the table's entry goes.
    #[test]
    fn the_counters_own_the_label_slot_until_their_last_holder() {
        use crate::label::{LocalRoot, RootLabel};
        let cpu = Arc::new(RootCounters {
            index: AtomicU32::new(0),
            generation: AtomicU64::new(0),
            followed: AtomicBool::new(true),
            label: AtomicU64::new(0),
        });
        let value = RootLabel::new(
            SpanId::from(71),
            opentelemetry::trace::TraceId::from(72),
            None,
        );
        let root = LocalRoot::claim(value, Some(cpu.clone() as Arc<dyn LabelOwner>));
        let word = root.word().expect("a slot");
        assert_eq!(cpu.label.load(Ordering::Relaxed), word.word(), "adopted");
        assert_eq!(
            Arc::strong_count(&cpu),
            2,
            "the handle holds the counters themselves"
        );
        // Two threads resolving the root at once claim two slots: the second has its own
        // owner, which keeps the counters alive with it.
        let second = LocalRoot::claim(value, Some(cpu.clone() as Arc<dyn LabelOwner>));
        let second_word = second.word().expect("a slot");
        assert_ne!(second_word, word);
        assert_eq!(Arc::strong_count(&cpu), 3);
        drop(second);
        assert_eq!(second_word.read(), None, "released with its own handle");
        assert_eq!(Arc::strong_count(&cpu), 2);
        let clone = root.clone();
        drop(root);
        assert_eq!(word.read(), Some(value), "a clone holds it");
        drop(clone);
        assert_eq!(
            word.read(),
            Some(value),
            "the table's entry (here `cpu`) holds it"
        );
        drop(cpu);
        assert_eq!(word.read(), None, "released with the last holder");
    }

    /// The last handle of a root releases its label slot and leaves the counters'
    /// allocation to its thread's next root, reset; a handle that is not the last leaves
    /// both alone.
    #[test]
    fn the_last_handle_releases_the_slot_and_keeps_the_allocation_for_the_next_root() {
        use crate::label::{LocalRoot, RootLabel};
        let handle = |n: u128| CpuHandle::from_raw((n + 1) << 64 | 1).expect("a handle");
        let value = |n: u64| {
            RootLabel::new(
                SpanId::from(n),
                opentelemetry::trace::TraceId::from(u128::from(n)),
                None,
            )
        };
        let spares = || SPARE.with(|spare| spare.borrow().len());
        // Another test's spares on this thread would be taken first.
        SPARE.with(|spare| spare.borrow_mut().clear());

        // The table's entry (`cpu_a`) outlives the handle: the handle is not the last.
        let cpu_a = counters_for(handle(1));
        let root_a = LocalRoot::claim(value(81), Some(cpu_a.clone() as Arc<dyn LabelOwner>));
        let word_a = root_a.word().expect("a slot");
        drop(root_a);
        assert_eq!(word_a.read(), Some(value(81)), "the entry holds the slot");
        assert_eq!(spares(), 0);
        drop(cpu_a);
        assert_eq!(
            word_a.read(),
            None,
            "released with the entry, the last holder"
        );
        assert_eq!(spares(), 0, "an entry's drop frees the allocation");

        // The usual order: the entry goes at the span's end, the handle as it closes.
        let cpu_b = counters_for(handle(2));
        cpu_b.followed.store(true, Ordering::Relaxed);
        let at = Arc::as_ptr(&cpu_b);
        let root_b = LocalRoot::claim(value(82), Some(cpu_b.clone() as Arc<dyn LabelOwner>));
        let word_b = root_b.word().expect("a slot");
        drop(cpu_b);
        assert_eq!(word_b.read(), Some(value(82)), "the handle holds the slot");
        drop(root_b);
        assert_eq!(
            word_b.read(),
            None,
            "released with the handle, the last holder"
        );
        assert_eq!(spares(), 1, "its allocation kept");
        let next = counters_for(handle(3));
        assert_eq!(Arc::as_ptr(&next), at, "and reused by the next root");
        assert_eq!(next.handle(), handle(3));
        assert!(!next.followed.load(Ordering::Relaxed), "reset");
        assert_eq!(next.label.load(Ordering::Relaxed), 0, "reset");
        assert_eq!(spares(), 0);
    }

    /// A root polled once: its one stretch (counted with the counters the thread kept as
    /// it resolved the root, see `active::keep_counters`) is its whole active time.
    #[test]
    fn a_root_entered_once_has_that_stretch_as_its_active_time() {
        let _turn = crate::sampler::test_turn();
        let _sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
        let exported = InMemorySpanExporter::default();
        let provider = with_processor(&exported);
        let stretch = Duration::from_millis(30);
        tracing::subscriber::with_default(subscriber(&provider), || {
            let root = tracing::info_span!("one poll");
            let _entered = root.enter();
            let start = std::time::Instant::now();
            while start.elapsed() < stretch {
                std::hint::spin_loop();
            }
        });
        let spans = exported.get_finished_spans().expect("spans");
        let span = spans
            .iter()
            .find(|s| s.name == "one poll")
            .expect("exported");
        let active = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == WALL_ACTIVE_ATTRIBUTE)
            .map(|kv| kv.value.to_string().parse::<u64>().expect("a number"))
            .expect("active time");
        assert!(
            active >= stretch.as_nanos() as u64 * 95 / 100,
            "active {active} ns for a {stretch:?} poll"
        );
    }

    /// A shard keeps a few free slots; the rest go to the pool, from which a shard with
    /// none takes one before a fresh one: the table then holds the peak of all roots at
    /// once, not the sum of every shard's own peak (which creeps for as long as the
    /// service runs).
    #[test]
    fn spare_slots_past_a_shards_few_go_to_the_pool_and_serve_empty_shards() {
        let _turn = crate::sampler::test_turn();
        let mut busy = SlotLists::default();
        let handles: Vec<_> = (0..SPARES_KEPT + 3)
            .map(|_| busy.claim().expect("a slot"))
            .collect();
        let pooled = || SPARE_POOL.lock().len();
        let before = pooled();
        for handle in handles {
            busy.release(handle);
            give_spares(&mut busy);
        }
        assert_eq!(
            pooled(),
            before + 3,
            "all but {SPARES_KEPT} went to the pool"
        );
        // A shard with nothing free takes one of them.
        let mut empty = SlotLists::default();
        assert!(empty.needs_fresh());
        take_spare(&mut empty);
        assert!(!empty.needs_fresh(), "a spare came from the pool");
        assert_eq!(pooled(), before + 2);
    }

    /// Two providers in one process, one with the evidence processor: only its roots get
    /// counters. Before the processor claimed them, any live processor made every
    /// provider's roots claim counters that nothing would ever report.
    #[test]
    fn only_roots_of_a_provider_with_the_processor_are_counted() {
        let _turn = crate::sampler::test_turn();
        let _sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
        let exported = InMemorySpanExporter::default();
        let with = with_processor(&exported);
        let without = SdkTracerProvider::builder()
            .with_span_processor(SimpleSpanProcessor::new(InMemorySpanExporter::default()))
            .build();

        assert_eq!(counters_under(&without), 0, "no processor, no counters");
        assert_ne!(counters_under(&with), 0, "the processor's root is counted");
        // A root that no layer or wrapper followed ends with no evidence (not with zeros
        // that would read as "never ran"), and its counters are released all the same.
        let span = opentelemetry::trace::Tracer::start(&with.tracer("test"), "never followed");
        let key = u64::from_be_bytes(
            opentelemetry::trace::Span::span_context(&span)
                .span_id()
                .to_bytes(),
        );
        let in_table = || shard(key).entries.contains_key(key);
        assert!(in_table(), "claimed as it started");
        drop(span);
        assert!(!in_table(), "released as it ended");
        let spans = exported.get_finished_spans().expect("spans");
        let evidence = |name: &str| {
            let span = spans.iter().find(|s| s.name == name).expect("exported");
            span.attributes
                .iter()
                .any(|kv| kv.key.as_str() == CPU_SAMPLES_ATTRIBUTE)
        };
        assert!(
            evidence("GET /evidence"),
            "the followed root has its evidence"
        );
        assert!(!evidence("never followed"), "the other has none");
        // ...and says why, where the followed one says nothing of the kind.
        let missing = |name: &str| {
            let span = spans.iter().find(|s| s.name == name).expect("exported");
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == EVIDENCE_MISSING_ATTRIBUTE)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(missing("never followed").as_deref(), Some("not_followed"));
        assert_eq!(missing("GET /evidence"), None);
    }

    /// A root that starts while no sampler runs says so; its children say nothing.
    #[test]
    fn a_root_started_without_a_sampler_says_so() {
        let _turn = crate::sampler::test_turn();
        assert!(!crate::sampler::is_running(), "no sampler in this turn");
        let exported = InMemorySpanExporter::default();
        let provider = with_processor(&exported);
        tracing::subscriber::with_default(subscriber(&provider), || {
            let root = tracing::info_span!("unsampled root");
            let _entered = root.enter();
            let _child = tracing::info_span!("child").entered();
        });
        let spans = exported.get_finished_spans().expect("spans");
        let missing = |name: &str| {
            let span = spans.iter().find(|s| s.name == name).expect("exported");
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == EVIDENCE_MISSING_ATTRIBUTE)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(missing("unsampled root").as_deref(), Some("no_sampler"));
        assert_eq!(missing("child"), None, "only local roots carry it");
    }
}
