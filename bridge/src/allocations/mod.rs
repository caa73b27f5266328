//! Allocation profiles by span: a `#[global_allocator]` wrapper that samples allocations
//! by bytes and labels each sample with the local root running on its thread, read at
//! the moment of the allocation.
//!
//! ```text
//!  alloc(size), any thread                       collector (every drain period)
//!  countdown -= size  (one const thread-local)   drains each thread's allocation ring
//!  countdown > 0: done                           aggregates (stack, span labels) →
//!  else (cold): sampler on and armed?              (objects, bytes), weighted
//!    weights: size / p, 1 / p                    encodes alloc_objects / alloc_space
//!    root: the thread's span context record        (Pyroscope `memory`, local
//!    stack: the sampler's unwinder, from here      `<start>_alloc.pb.gz`, OTLP)
//!    push into the thread's allocation ring
//!    next countdown ~ Exp(mean)
//! ```
//!
//! **Where samples go.** Each registered thread's slot has an allocation ring next to its
//! CPU ring (`sampler/slots.rs`); the thread itself is its one producer, in the hook. Not
//! the CPU ring: the signal handler takes that one's producer role, and an allocation
//! push it interrupted would make its claim fail. A full ring drops the sample, counted
//! with its estimated bytes in [`AllocationStats`]. Threads that never registered (no
//! span entered, no hook run) have no ring the hook can find without a lookup: their
//! samples go to one buffer they share, their stacks walked over a copy
//! (`unregistered.rs`); the crate's own threads and the OpenTelemetry SDK's are left out.
//!
//! **What the hook may do.** It runs inside the program's allocator: it never allocates,
//! locks, panics or recurses. Its state is two `const` thread-locals without destructors
//! (readable while a thread's other thread-locals are torn down), a busy flag keeps a
//! nested call out, and stack bounds come from the thread's registration
//! (`pthread_getattr_np` allocates). A `#[global_allocator]` sees Rust's allocations only:
//! C libraries calling `malloc` themselves (SQLite, OpenSSL) are not seen.

mod allocator;
mod hook;
pub(crate) mod inuse;
mod unregistered;

pub(crate) use hook::exclude_current_thread;
pub(crate) mod sampling;

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

pub use allocator::ProfilingAllocator;

use crate::sampler::SampleRecord;

/// The mean bytes between two allocation samples by default (512 KiB, Go's and
/// tcmalloc's rate): an allocation-heavy service samples a few hundred times a second.
pub const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;

/// The largest mean the setting takes (1 TiB): a countdown, at most about 37 means,
/// stays far inside an `i64`.
pub const MAX_SAMPLE_BYTES: u64 = 1 << 40;

/// Allocation samples each registered thread buffers between two drains (1,136 bytes
/// each, 71 KiB a thread; the collector drains every 100 ms): at the default mean a
/// thread allocating up to ~330 MB/s fits, one allocating more drops samples from the
/// profile (counted; its roots' totals still get them).
pub const ALLOC_RING_CAPACITY: usize = 64;

/// Allocation samples buffered between two drains for all the threads that never
/// registered together (~143 KiB): at the default mean, ~640 MB/s of allocation spread
/// over such threads.
pub const UNREGISTERED_CAPACITY: usize = 128;

/// Stack-copy buffers the walks of unregistered threads borrow (a walk finding all lent
/// drops its sample, counted): 64 KiB of copy and the walk's own stack each.
const UNREGISTERED_COPIES: usize = 4;

/// The records and copy buffers of the threads that never registered (null until a
/// profiler starts allocation sampling with our allocator installed; then kept).
static SHARED: AtomicPtr<unregistered::Shared<AllocRecord>> = AtomicPtr::new(std::ptr::null_mut());

/// The mean in effect (0: allocations are not profiled; the hook passes through).
static MEAN: AtomicU64 = AtomicU64::new(0);
/// The mean last started with (kept after a stop: the last profile's period).
static LAST_MEAN: AtomicU64 = AtomicU64::new(0);
/// Set by the hook's first cold call: a [`ProfilingAllocator`] is the global allocator.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Ring capacity new registrations get (0 while allocations are not profiled).
static RING_CAPACITY: AtomicUsize = AtomicUsize::new(0);

static SAMPLES: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static DROPPED_BYTES: AtomicU64 = AtomicU64::new(0);
static UNREGISTERED: AtomicU64 = AtomicU64::new(0);
static UNREGISTERED_BYTES: AtomicU64 = AtomicU64::new(0);
static LOW_STACK: AtomicU64 = AtomicU64::new(0);
static TRUNCATED: AtomicU64 = AtomicU64::new(0);

/// One allocation sample: the stack and root (in a [`SampleRecord`], whose `weight` is
/// unused) and what the sample stands for.
#[derive(Clone, Copy)]
pub(crate) struct AllocRecord {
    pub(crate) stack: SampleRecord,
    /// Estimated bytes allocated (`size / p`).
    pub(crate) bytes: f64,
    /// Estimated allocations (`1 / p`).
    pub(crate) objects: f64,
    /// The object, when it is tracked for in-use memory.
    pub(crate) tracked: Option<inuse::Tracked>,
}

impl crate::sampler::ring::RingRecord for AllocRecord {
    const EMPTY: AllocRecord = AllocRecord {
        stack: SampleRecord::EMPTY,
        bytes: 0.0,
        objects: 0.0,
        tracked: None,
    };
}

/// Allocation sampling counters, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocationStats {
    /// Whether a [`ProfilingAllocator`] is the global allocator (seen by its first
    /// allocation).
    pub installed: bool,
    /// The mean bytes between samples in effect (0: not profiling allocations).
    pub sample_bytes: u64,
    /// Allocations sampled (every thread).
    pub samples: u64,
    /// Samples dropped because their thread's ring was full (or a drain discarded them).
    pub dropped: u64,
    /// The bytes the dropped samples stood for (estimated).
    pub dropped_bytes: u64,
    /// Samples on threads that never registered with the sampler (profiled through the
    /// buffer they share; the ones it could not take are in `dropped` too).
    pub unregistered: u64,
    /// The bytes they stood for (estimated).
    pub unregistered_bytes: u64,
    /// Samples whose stack was left out: too little of the thread's stack was left for
    /// the walk (the sample keeps its pc).
    pub low_stack: u64,
    /// Samples whose stack walk stopped before the outermost frame.
    pub truncated: u64,
    /// Bytes of the allocation rings allocated now, and of the buffer (and stack copies)
    /// shared by the threads that never registered.
    pub ring_bytes: u64,
    /// Whether new samples are tracked for in-use memory
    /// ([`ProfilerBuilder::allocation_inuse`](crate::ProfilerBuilder::allocation_inuse)).
    pub inuse: bool,
    /// Sampled objects tracked as alive now (arena cells and large slots).
    pub inuse_tracked: u64,
    /// Samples that could not be tracked (their size class and the two above it full,
    /// the large slots full, or an alignment above 4 KiB): in the allocation profile,
    /// missing from in-use.
    pub inuse_untracked: u64,
    /// Bytes of address space the in-use arena reserves (0 until tracking first starts;
    /// pages are backed only where tracked objects are or were).
    pub inuse_arena_bytes: u64,
}

/// The process's allocation sampling counters.
///
/// ```
/// let stats = otel_profiling::allocations::stats();
/// assert_eq!(stats.samples, 0, "no ProfilingAllocator in this doctest");
/// ```
pub fn stats() -> AllocationStats {
    let inuse_stats = inuse::stats();
    AllocationStats {
        installed: INSTALLED.load(Ordering::Relaxed),
        sample_bytes: MEAN.load(Ordering::Relaxed),
        samples: SAMPLES.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        dropped_bytes: DROPPED_BYTES.load(Ordering::Relaxed),
        unregistered: UNREGISTERED.load(Ordering::Relaxed),
        unregistered_bytes: UNREGISTERED_BYTES.load(Ordering::Relaxed),
        low_stack: LOW_STACK.load(Ordering::Relaxed),
        truncated: TRUNCATED.load(Ordering::Relaxed),
        ring_bytes: crate::sampler::SamplerState::global()
            .slots()
            .alloc_ring_bytes()
            + shared().map_or(0, |shared| shared.bytes() as u64),
        inuse: inuse::tracking(),
        inuse_tracked: inuse_stats.tracked,
        inuse_untracked: inuse_stats.untracked,
        inuse_arena_bytes: inuse_stats.arena_bytes,
    }
}

/// Starts sampling allocations every `mean` bytes on average (0: off), for threads that
/// register from now on (each gets an allocation ring), tracking sampled objects until
/// they are freed if `inuse`. Called by the profiler's setup; `Err`: the in-use arena
/// could not be mapped.
pub(crate) fn start(mean: u64, inuse: bool) -> std::io::Result<()> {
    set_inuse(inuse)?;
    if mean > 0 {
        allocate_shared();
    }
    RING_CAPACITY.store(
        if mean > 0 { ALLOC_RING_CAPACITY } else { 0 },
        Ordering::Relaxed,
    );
    MEAN.store(mean, Ordering::Relaxed);
    if mean > 0 {
        LAST_MEAN.store(mean, Ordering::Relaxed);
    }
    Ok(())
}

/// Whether allocations are being sampled now: a [`ProfilingAllocator`] is the global
/// allocator and a profiler set a mean (roots then get `profiling.alloc.*`).
pub(crate) fn sampling() -> bool {
    INSTALLED.load(Ordering::Relaxed) && MEAN.load(Ordering::Relaxed) > 0
}

/// The mean the last samples were drawn with (the allocation profiles' period).
pub(crate) fn last_mean() -> u64 {
    LAST_MEAN.load(Ordering::Relaxed)
}

/// Changes the mean while a profiler runs (0 pauses sampling; rings stay as they are).
pub(crate) fn set_mean(mean: u64) {
    if mean > 0 {
        allocate_shared();
        RING_CAPACITY.store(ALLOC_RING_CAPACITY, Ordering::Relaxed);
        LAST_MEAN.store(mean, Ordering::Relaxed);
    }
    MEAN.store(mean, Ordering::Relaxed);
}

/// Starts or stops tracking sampled objects until they are freed (in-use memory).
/// `Err`: the arena could not be mapped (tracking stays off).
pub(crate) fn set_inuse(on: bool) -> std::io::Result<()> {
    // Only with our allocator installed: another allocator's frees never reach the arena
    // (and the arena is never mapped in a process that cannot use it).
    inuse::set_tracking(on && INSTALLED.load(Ordering::Relaxed))
}

/// Stops sampling: the hook passes through again.
pub(crate) fn stop() {
    let _ = inuse::set_tracking(false);
    MEAN.store(0, Ordering::Relaxed);
    RING_CAPACITY.store(0, Ordering::Relaxed);
}

/// In a forked child: pass-through until a profiler is set up there. Only atomics.
pub(crate) fn after_fork_in_child() {
    stop();
    if let Some(shared) = shared() {
        shared.reset_in_child();
    }
}

/// Allocates the unregistered threads' buffer, once, if our allocator is installed (a
/// process whose allocator is not ours never pays for it). Never called by the hook.
fn allocate_shared() {
    if !INSTALLED.load(Ordering::Relaxed) || !SHARED.load(Ordering::Acquire).is_null() {
        return;
    }
    let shared = Box::into_raw(Box::new(unregistered::Shared::new(
        UNREGISTERED_CAPACITY,
        <AllocRecord as crate::sampler::ring::RingRecord>::EMPTY,
        UNREGISTERED_COPIES,
        hook::UNREGISTERED_COPY_BYTES,
        hook::UNREGISTERED_WALK_STACK_BYTES,
    )));
    if SHARED
        .compare_exchange(
            std::ptr::null_mut(),
            shared,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another setup's won.
        // SAFETY: ours, never published.
        drop(unsafe { Box::from_raw(shared) });
    }
}

/// The unregistered threads' buffer, once allocated (kept for the process's life).
fn shared() -> Option<&'static unregistered::Shared<AllocRecord>> {
    // SAFETY: published once and never freed.
    unsafe { SHARED.load(Ordering::Acquire).as_ref() }
}

/// Hands the unregistered threads' published samples to `f` (the drain's, beside the
/// threads' rings).
pub(crate) fn drain_unregistered(f: &mut dyn FnMut(&AllocRecord)) -> usize {
    shared().map_or(0, |shared| shared.samples.drain(f))
}

/// Records of the allocation ring a thread registering now gets (0: none).
pub(crate) fn ring_capacity() -> usize {
    // No ring memory for a process whose allocator is not ours (its first allocation,
    // long before any registration, would have said so).
    if INSTALLED.load(Ordering::Relaxed) {
        RING_CAPACITY.load(Ordering::Relaxed)
    } else {
        0
    }
}

/// Counts `samples` drained and aggregated, standing for `bytes`, that were not kept (the
/// encoder gone).
pub(crate) fn count_dropped_totals(samples: u64, bytes: f64) {
    DROPPED.fetch_add(samples, Ordering::Relaxed);
    DROPPED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts a sample that was drained and not kept.
pub(crate) fn count_dropped(record: &AllocRecord) {
    DROPPED.fetch_add(1, Ordering::Relaxed);
    DROPPED_BYTES.fetch_add(record.bytes as u64, Ordering::Relaxed);
}

#[cfg(all(test, not(loom)))]
mod tests {
    /// The record's size, as `docs/bounds.md` and [`ALLOC_RING_CAPACITY`] state it (a
    /// ring is 64 of them: 71 KiB).
    #[test]
    fn a_record_is_1136_bytes() {
        assert_eq!(std::mem::size_of::<super::AllocRecord>(), 1_136);
    }
}
