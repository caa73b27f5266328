//! The CPU sampler: per-thread CPU-time timers whose `SIGPROF` handler records, at the
//! moment of each sample, the thread's span context and its stack.
//!
//! ```text
//!  thread T (registered)                         collector (any thread)
//!  timer_create(CLOCK_THREAD_CPUTIME_ID,         Sampler::drain()
//!               SIGEV_THREAD_ID → T,               └─ each thread's Ring, oldest first
//!               si_value = &ThreadState)
//!  SIGPROF on T ─► handler: SpanContextCell::read()
//!                          + DWARF unwind ─► Ring::push (full: dropped += 1)
//! ```
//!
//! The timer is per thread and counts that thread's CPU time, as Go does, so samples are
//! neither merged across cores nor delivered to an idle thread. The handler finds its
//! thread's state through the timer's `si_value`: it touches no thread-local, takes no
//! lock and allocates nothing. Everything it needs is allocated at registration.
//!
//! Stacks are unwound with the `.eh_frame` call-frame information of every loaded object
//! (framehop), so they are complete in ordinary release builds, which keep no frame
//! pointers. The unwind tables are copied from memory at [`Sampler::start`] and again by
//! [`refresh_modules`] after a `dlopen`/`dlclose`; see `unwind.rs` for how a new unwinder
//! is published to running handlers. On architectures other than x86_64 and aarch64 no
//! stack is recorded.

// The loaded-object walker; the symbolizer uses it on every architecture, the unwinder's
// table copies only where there is an unwinder.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) mod modules;
mod ring;
// Without an unwinder nothing reads the stack or the registers past the pc.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
mod stack;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod unwind;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[path = "unwind_unsupported.rs"]
mod unwind;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Once, PoisonError};
use std::time::Duration;

pub use ring::{SampleRecord, MAX_FRAMES};

use crate::span_context::{thread_cell, SpanContextCell};
use ring::Ring;
use stack::{Registers, StackBounds};
use unwind::{UnwindCache, Wait, WalkEnd};

/// Highest sampling rate accepted. CPU-time timers expire on the kernel tick (250 Hz on
/// common kernels), so rates above that are delivered at the tick rate anyway.
pub const MAX_FREQUENCY_HZ: u32 = 1000;

/// Errors starting the sampler or registering a thread.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SamplerError {
    /// `frequency_hz` outside `1..=MAX_FREQUENCY_HZ`.
    #[error(
        "sampler.frequency_hz must be between 1 and {MAX_FREQUENCY_HZ} samples per second, got {0}"
    )]
    InvalidFrequency(u32),
    /// `ring_capacity` outside `1..=65536`.
    #[error("sampler.ring_capacity must be between 1 and 65536 samples per thread, got {0}")]
    InvalidRingCapacity(usize),
    /// A sampler is already running in this process.
    #[error("a CPU sampler is already running in this process; stop it before starting another")]
    AlreadyRunning,
    /// Another profiler owns `SIGPROF`.
    #[error(
        "SIGPROF already has a handler installed by another profiler (for example pprof-rs or \
         the pyroscope crate's pprof backend); a process can have only one SIGPROF owner"
    )]
    SigprofTaken,
    /// The sampler is not running (nothing to register with).
    #[error("the CPU sampler is not running")]
    NotRunning,
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call that failed.
        call: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl SamplerError {
    fn last_os(call: &'static str) -> SamplerError {
        SamplerError::Os {
            call,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Sampler settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SamplerConfig {
    /// Samples per second of each thread's CPU time (default 100).
    pub frequency_hz: u32,
    /// Records buffered per thread between two drains (default 256); more are dropped
    /// and counted.
    pub ring_capacity: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            frequency_hz: 100,
            ring_capacity: 256,
        }
    }
}

impl SamplerConfig {
    /// Sets the sampling rate.
    pub fn with_frequency_hz(mut self, hz: u32) -> Self {
        self.frequency_hz = hz;
        self
    }

    /// Sets the per-thread buffer size.
    pub fn with_ring_capacity(mut self, capacity: usize) -> Self {
        self.ring_capacity = capacity;
        self
    }

    fn validate(&self) -> Result<(), SamplerError> {
        if self.frequency_hz == 0 || self.frequency_hz > MAX_FREQUENCY_HZ {
            return Err(SamplerError::InvalidFrequency(self.frequency_hz));
        }
        if self.ring_capacity == 0 || self.ring_capacity > 65536 {
            return Err(SamplerError::InvalidRingCapacity(self.ring_capacity));
        }
        Ok(())
    }
}

/// Sample counters. `taken == drained + dropped + buffered` at any quiet moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SamplerStats {
    /// Timer signals handled.
    pub taken: u64,
    /// Samples lost because the thread's buffer was full.
    pub dropped: u64,
    /// Samples handed to `drain`.
    pub drained: u64,
    /// Threads registered now.
    pub threads: usize,
    /// Recorded samples whose stack is incomplete ([`SampleRecord::truncated`]): the
    /// unwinder met an address in no known object (counted in `unknown_pc` too), a
    /// stack word it may not read, unusable call-frame information or more than
    /// [`MAX_FRAMES`] frames, or the interrupted stack pointer was not on the thread's
    /// stack. Their innermost frames are still recorded.
    pub truncated: u64,
    /// Of `truncated`: walks that stopped at an address outside every loaded object
    /// known to the unwinder (JIT code, or a library `dlopen`ed since the last
    /// [`refresh_modules`]).
    pub unknown_pc: u64,
}

/// The unwinder's view of the loaded objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModuleStats {
    /// Loaded objects (executable, vDSO, shared libraries) whose unwind tables are known.
    pub objects: usize,
    /// Bytes of `.eh_frame` and `.eh_frame_hdr` copied for them.
    pub table_bytes: usize,
    /// Unwinders published since the process started (one at the first start, one per
    /// change in the set of loaded objects seen by [`refresh_modules`]).
    pub published: u64,
}

/// What the signal handler needs for one thread, allocated at registration.
struct ThreadState {
    magic: u64,
    cell: *const SpanContextCell,
    /// The thread's stack, the only memory the unwinder reads besides its tables.
    stack: StackBounds,
    /// framehop's cache, used only by this thread's handler.
    cache: UnwindCache,
    ring: Ring,
    taken: AtomicU64,
    dropped: AtomicU64,
    truncated: AtomicU64,
    unknown_pc: AtomicU64,
    timer: Mutex<Option<Timer>>,
}

const MAGIC: u64 = 0x6f74_656c_7072_6f66; // "otelprof"

// SAFETY: `cell` points at the owning thread's span context record, which is only read
// through atomics; `cache` is used only by the owning thread's signal handler, which
// does not nest; the rest is atomics, a mutex and the SPSC ring.
unsafe impl Send for ThreadState {}
// SAFETY: as above.
unsafe impl Sync for ThreadState {}

impl ThreadState {
    /// Takes one sample. Runs in the signal handler of the owning thread.
    #[inline]
    fn sample(&self, ucontext: *const libc::c_void) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `cell` is the owning thread's live record (this runs on that thread).
        let root = unsafe { (*self.cell).read() };
        if let Some(root) = &root {
            // SAFETY: the root is this thread's current context, so its counters are alive.
            if let Some(cpu) = unsafe { root.cpu() } {
                cpu.record(PERIOD_NS.load(Ordering::Relaxed));
            }
        }
        // SAFETY: `ucontext` is the kernel's handler argument.
        let regs = unsafe { Registers::from_ucontext(ucontext) };
        let mut end = WalkEnd::Truncated;
        // SAFETY: only this thread's handler produces into its ring; SIGPROF is blocked
        // while the handler runs, so it never nests.
        let stored = unsafe {
            self.ring.push_with(|record| {
                record.root = root;
                match regs {
                    // SAFETY: this is the owning thread's handler (the timer signals only
                    // this thread), the sole user of `cache`, and it does not nest.
                    Some(regs) => end = unwind::walk(&regs, self.stack, &self.cache, record),
                    None => {
                        record.depth = 0;
                        record.truncated = true;
                    }
                }
            })
        };
        if !stored {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if end != WalkEnd::Complete {
            self.truncated.fetch_add(1, Ordering::Relaxed);
            if end == WalkEnd::UnknownPc {
                self.unknown_pc.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn delete_timer(&self) {
        let timer = self
            .timer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(timer) = timer {
            // SAFETY: the id came from timer_create and is deleted once (taken above).
            unsafe { libc::timer_delete(timer.0) };
        }
    }
}

struct Timer(libc::timer_t);
// SAFETY: a timer id is a process-wide handle; any thread may delete it.
unsafe impl Send for Timer {}

/// Process-wide sampler state, touched at start/stop, registration and drain only.
struct Registry {
    threads: Vec<Arc<ThreadState>>,
    /// Counters of threads that exited and were drained for the last time.
    retired_taken: u64,
    retired_dropped: u64,
    retired_truncated: u64,
    retired_unknown_pc: u64,
    drained: u64,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        threads: Vec::new(),
        retired_taken: 0,
        retired_dropped: 0,
        retired_truncated: 0,
        retired_unknown_pc: 0,
        drained: 0,
    })
});
static RUNNING: AtomicBool = AtomicBool::new(false);
/// Whether the handler records anything (false after stop and in a forked child).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Bumped at every start, so a registration from an earlier run is redone.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static FREQUENCY_HZ: AtomicU32 = AtomicU32::new(0);
/// Sampling period in nanoseconds (what one sample stands for).
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);
static RING_CAPACITY: AtomicUsize = AtomicUsize::new(0);
static AT_FORK: Once = Once::new();

thread_local! {
    static REGISTRATION: RefCell<Option<Registration>> = const { RefCell::new(None) };
}

/// Ends the thread's sampling when the thread exits.
struct Registration {
    state: Arc<ThreadState>,
    generation: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state.delete_timer();
    }
}

/// A running CPU sampler. Dropping it stops sampling on every thread.
///
/// ```no_run
/// use otel_profiling::sampler::{Sampler, SamplerConfig};
/// let sampler = Sampler::start(SamplerConfig::default())?;
/// sampler.register_current_thread()?;
/// // ... work ...
/// sampler.drain(|record| println!("{} frames, span {:?}", record.frames().len(), record.root));
/// # Ok::<(), otel_profiling::sampler::SamplerError>(())
/// ```
#[derive(Debug)]
pub struct Sampler {
    _not_clone: (),
}

impl Sampler {
    /// Installs the `SIGPROF` handler and starts sampling threads as they register.
    ///
    /// Copies the unwind tables of every loaded object from memory (0.3–0.7 ms and about
    /// 300 KB for a small release binary with libc; a restart only checks whether objects
    /// were loaded since).
    ///
    /// Fails if a sampler already runs, if another profiler owns `SIGPROF`, or if the
    /// config is invalid (the error names the field).
    pub fn start(config: SamplerConfig) -> Result<Sampler, SamplerError> {
        config.validate()?;
        if RUNNING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(SamplerError::AlreadyRunning);
        }
        if let Err(err) = install_handler() {
            RUNNING.store(false, Ordering::Release);
            return Err(err);
        }
        AT_FORK.call_once(|| {
            // SAFETY: registering a child handler that only stores to atomics.
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        });
        FREQUENCY_HZ.store(config.frequency_hz, Ordering::Relaxed);
        PERIOD_NS.store(
            1_000_000_000 / u64::from(config.frequency_hz),
            Ordering::Relaxed,
        );
        RING_CAPACITY.store(config.ring_capacity, Ordering::Relaxed);
        // Before any thread registers, so its first samples are unwound.
        unwind::refresh(Wait::Upto(Duration::from_millis(100)));
        GENERATION.fetch_add(1, Ordering::AcqRel);
        ENABLED.store(true, Ordering::Release);
        Ok(Sampler { _not_clone: () })
    }

    /// Starts sampling the calling thread (idempotent).
    pub fn register_current_thread(&self) -> Result<(), SamplerError> {
        register_current_thread()
    }

    /// The sampling period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(1_000_000_000 / u64::from(FREQUENCY_HZ.load(Ordering::Relaxed).max(1)))
    }

    /// Hands every buffered record to `f`, thread by thread, and frees the buffers.
    /// Threads that exited are dropped after their last records are drained.
    pub fn drain(&self, f: impl FnMut(&SampleRecord)) -> usize {
        drain_into(f)
    }

    /// Sample counters.
    pub fn stats(&self) -> SamplerStats {
        stats()
    }

    /// Stops sampling (same as dropping the handle).
    pub fn stop(self) {}
}

/// Process-wide sample counters, since the process started (across sampler restarts).
pub fn stats() -> SamplerStats {
    {
        let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stats = SamplerStats {
            taken: registry.retired_taken,
            dropped: registry.retired_dropped,
            drained: registry.drained,
            threads: 0,
            truncated: registry.retired_truncated,
            unknown_pc: registry.retired_unknown_pc,
        };
        for state in &registry.threads {
            stats.taken += state.taken.load(Ordering::Relaxed);
            stats.dropped += state.dropped.load(Ordering::Relaxed);
            stats.truncated += state.truncated.load(Ordering::Relaxed);
            stats.unknown_pc += state.unknown_pc.load(Ordering::Relaxed);
            if state.timer.lock().map(|t| t.is_some()).unwrap_or(false) {
                stats.threads += 1;
            }
        }
        stats
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        ENABLED.store(false, Ordering::Release);
        let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        for state in &registry.threads {
            state.delete_timer();
        }
        drop(registry);
        // The handler stays installed (a pending SIGPROF with the default disposition
        // would kill the process); it records nothing while disabled.
        RUNNING.store(false, Ordering::Release);
    }
}

/// Whether a sampler is running in this process.
pub fn is_running() -> bool {
    RUNNING.load(Ordering::Acquire)
}

/// Updates the unwinder after shared objects were loaded or unloaded (`dlopen`,
/// `dlclose`). The collector thread calls it periodically; it costs one
/// `dl_iterate_phdr` step (tens of nanoseconds) when nothing changed, and copies only the
/// new objects' unwind tables otherwise. Until then, samples in a newly loaded object
/// are truncated at its first frame and counted in [`SamplerStats::unknown_pc`].
///
/// Returns whether a new unwinder was published. Does nothing while no sampler runs.
/// Not for signal handlers.
pub fn refresh_modules() -> bool {
    if !RUNNING.load(Ordering::Acquire) {
        return false;
    }
    unwind::refresh(Wait::Upto(Duration::from_millis(100)))
}

/// The loaded objects the unwinder knows and the memory their copied tables take.
pub fn module_stats() -> ModuleStats {
    let (objects, table_bytes, published) = unwind::published_stats();
    ModuleStats {
        objects,
        table_bytes,
        published,
    }
}

/// Starts sampling the calling thread, if a sampler runs (idempotent).
pub fn register_current_thread() -> Result<(), SamplerError> {
    if !RUNNING.load(Ordering::Acquire) {
        return Err(SamplerError::NotRunning);
    }
    let generation = GENERATION.load(Ordering::Acquire);
    let current = REGISTRATION.with(|r| r.borrow().as_ref().map(|r| r.generation));
    if current == Some(generation) {
        return Ok(());
    }
    // A thread may start with libraries loaded since the last refresh; skipped if
    // another thread is refreshing.
    unwind::refresh(Wait::No);
    let registration = new_registration(generation)?;
    REGISTRATION.with(|r| *r.borrow_mut() = Some(registration));
    Ok(())
}

/// Stops sampling the calling thread (also done automatically when it exits).
pub fn unregister_current_thread() {
    let _ = REGISTRATION.try_with(|r| r.borrow_mut().take());
}

/// For `tokio::runtime::Builder::on_thread_start`: registers each runtime thread.
///
/// ```no_run
/// let runtime = tokio::runtime::Builder::new_multi_thread()
///     .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
///     .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
///     .build()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn tokio_on_thread_start() -> impl Fn() + Send + Sync + 'static {
    || {
        let _ = register_current_thread();
    }
}

/// For `tokio::runtime::Builder::on_thread_stop`: unregisters each runtime thread.
pub fn tokio_on_thread_stop() -> impl Fn() + Send + Sync + 'static {
    unregister_current_thread
}

/// Registers the calling thread on its first span enter while a sampler runs: one
/// thread-local read and one atomic load when already registered.
#[inline]
pub(crate) fn on_span_enter() {
    if !RUNNING.load(Ordering::Relaxed) {
        return;
    }
    let generation = GENERATION.load(Ordering::Relaxed);
    let registered = REGISTRATION
        .try_with(|r| {
            r.try_borrow()
                .map(|r| r.as_ref().map(|r| r.generation) == Some(generation))
                .unwrap_or(true)
        })
        .unwrap_or(true);
    if !registered {
        let _ = register_current_thread();
    }
}

fn new_registration(generation: u64) -> Result<Registration, SamplerError> {
    let capacity = RING_CAPACITY.load(Ordering::Relaxed).max(1);
    let hz = u64::from(FREQUENCY_HZ.load(Ordering::Relaxed).max(1));
    let stack = StackBounds::current().map_err(|source| SamplerError::Os {
        call: "pthread_getattr_np",
        source,
    })?;
    let state = Arc::new(ThreadState {
        magic: MAGIC,
        cell: thread_cell(),
        stack,
        cache: UnwindCache::new(),
        ring: Ring::new(capacity),
        taken: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        truncated: AtomicU64::new(0),
        unknown_pc: AtomicU64::new(0),
        timer: Mutex::new(None),
    });
    // SAFETY: plain FFI; `sev` is fully initialised and `timer` is an out-parameter.
    let timer = unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = libc::SIGPROF;
        sev.sigev_value = libc::sigval {
            sival_ptr: Arc::as_ptr(&state) as *mut libc::c_void,
        };
        sev.sigev_notify_thread_id = libc::gettid();
        let mut timer: libc::timer_t = std::mem::zeroed();
        if libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut sev, &mut timer) != 0 {
            return Err(SamplerError::last_os("timer_create"));
        }
        timer
    };
    // The registry holds the state before the timer can fire, so the pointer in the timer
    // always refers to live memory.
    *state.timer.lock().unwrap_or_else(PoisonError::into_inner) = Some(Timer(timer));
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .threads
        .push(state.clone());
    let period_ns = (1_000_000_000 / hz) as libc::c_long;
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: period_ns,
        },
        it_value: libc::timespec {
            tv_sec: 0,
            tv_nsec: period_ns,
        },
    };
    // SAFETY: `timer` is a live timer id owned by this registration.
    if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
        let err = SamplerError::last_os("timer_settime");
        state.delete_timer();
        return Err(err);
    }
    Ok(Registration { state, generation })
}

/// Hands every buffered record of every thread to `f` and frees the buffers; the
/// collector's entry point. Records outlive a stopped sampler until drained.
pub fn drain_into(mut f: impl FnMut(&SampleRecord)) -> usize {
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    let mut total = 0;
    let mut retired = (0, 0, 0, 0);
    registry.threads.retain(|state| {
        // Read liveness before draining: a state whose timer was already gone gets no
        // more samples, so this drain is its last and it can be retired. (The thread's
        // registration, if it lives, keeps its own reference.)
        let live = state.timer.lock().map(|t| t.is_some()).unwrap_or(false);
        // SAFETY: the registry lock makes this the only consumer.
        total += unsafe { state.ring.drain(&mut f) };
        if !live {
            retired.0 += state.taken.load(Ordering::Relaxed);
            retired.1 += state.dropped.load(Ordering::Relaxed);
            retired.2 += state.truncated.load(Ordering::Relaxed);
            retired.3 += state.unknown_pc.load(Ordering::Relaxed);
        }
        live
    });
    registry.drained += total as u64;
    registry.retired_taken += retired.0;
    registry.retired_dropped += retired.1;
    registry.retired_truncated += retired.2;
    registry.retired_unknown_pc += retired.3;
    total
}

extern "C" fn after_fork_in_child() {
    // The child has no timers and only the forking thread; nothing from the parent's
    // registry may be used. A new sampler can be started in the child.
    ENABLED.store(false, Ordering::Relaxed);
    RUNNING.store(false, Ordering::Relaxed);
    unwind::after_fork_in_child();
}

fn install_handler() -> Result<(), SamplerError> {
    // SAFETY: reading and installing a signal disposition; the handler is signal-safe.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut old) != 0 {
            return Err(SamplerError::last_os("sigaction"));
        }
        let ours = on_sigprof as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as usize;
        if old.sa_sigaction == ours {
            return Ok(());
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            return Err(SamplerError::SigprofTaken);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ours;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGPROF, &action, std::ptr::null_mut()) != 0 {
            return Err(SamplerError::last_os("sigaction"));
        }
    }
    Ok(())
}

/// The `SIGPROF` handler. Async-signal-safe: atomics, a DWARF unwind with preallocated
/// state and validated stack reads, and a copy into a preallocated ring; `errno` is
/// preserved.
extern "C" fn on_sigprof(_: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
    // SAFETY: __errno_location is async-signal-safe and returns this thread's errno.
    let errno_slot = unsafe { libc::__errno_location() };
    // SAFETY: valid pointer to this thread's errno.
    let saved_errno = unsafe { *errno_slot };
    if ENABLED.load(Ordering::Relaxed) && !info.is_null() {
        // SAFETY: the kernel passes a valid siginfo; only timer signals carry our pointer.
        let state = unsafe {
            if (*info).si_code == libc::SI_TIMER {
                (*info).si_value().sival_ptr as *const ThreadState
            } else {
                std::ptr::null()
            }
        };
        // SAFETY: a SI_TIMER SIGPROF comes from one of our timers (we own SIGPROF), whose
        // value is a ThreadState kept alive by the registry until its timer is deleted.
        if let Some(state) = unsafe { state.as_ref() } {
            if state.magic == MAGIC {
                state.sample(ucontext);
            }
        }
    }
    // SAFETY: as above.
    unsafe { *errno_slot = saved_errno };
}
