//! The CPU sampler: per-thread CPU-time timers whose `SIGPROF` handler records, at the
//! moment of each sample, the thread's span context and its stack.
//!
//! ```text
//!  thread T (registered)                         collector (any thread)
//!  timer_create(CLOCK_THREAD_CPUTIME_ID,         Sampler::drain()
//!               SIGEV_THREAD_ID → T,               └─ each thread's Ring, oldest first
//!               si_value = slot index + generation)
//!  SIGPROF on T ─► handler: slot check (generation, tid; else foreign += 1)
//!                          SpanContextCell::read()
//!                          + DWARF unwind ─► Ring::push (full: dropped += 1)
//! ```
//!
//! The timer is per thread and counts that thread's CPU time, as Go does, so samples are
//! neither merged across cores nor delivered to an idle thread. The handler finds its
//! thread's state through the timer's `si_value`, which names a slot in a table that is
//! never freed (`slots.rs`): it touches no thread-local, takes no lock and allocates
//! nothing, and a signal it cannot match to the receiving thread's live slot is ignored
//! and counted. Slots are recycled with their buffers, so a new thread's registration is
//! two timer syscalls and a few atomics.
//!
//! **Rates above the kernel tick.** CPU-time timers are checked on the scheduler tick
//! (250 Hz on common kernels). When several periods elapse between two checks, the
//! kernel sends one signal and reports the rest in `si_overrun`; each sample is weighted by
//! `1 + si_overrun` ([`SampleRecord::weight`]), so profile totals stay right at every
//! rate, while stacks are taken at most at the tick rate. The first time a weight above
//! one is seen, the collector says so once on stderr. A root's CPU time is measured, not
//! counted (`cpu_ledger`): under contention signals lag far behind the periods they
//! stand for, and a root that ends first would lose them.
//!
//! Stacks are unwound with the `.eh_frame` call-frame information of every loaded object,
//! so they are complete in ordinary release builds, which keep no frame pointers. The
//! unwind tables are copied from memory and compiled into rules at [`Sampler::start`] and
//! again by [`refresh_modules`] after a `dlopen`/`dlclose`; see `unwind/mod.rs` for how
//! new rules are published to running handlers. On architectures other than x86_64 and aarch64 no
//! stack is recorded.

pub(crate) mod adopt;
mod altstack;
pub(crate) mod cgroup;
pub(crate) mod cpu_ledger;
pub(crate) mod handler;
// The loaded-object walker; the symbolizer uses it on every architecture, the unwinder's
// table copies only where there is an unwinder.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) mod modules;
pub(crate) mod ring;
mod slots;
// Without an unwinder nothing reads the stack or the registers past the pc.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) mod stack;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod unwind;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[path = "unwind/unsupported.rs"]
pub(crate) mod unwind;
pub mod watchdog;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

pub use ring::{SampleRecord, MAX_FRAMES};

use crate::span_context::thread_cell;
use slots::{ForkSafeLock, Owner, Slot, SlotTable};
use stack::StackBounds;
use unwind::Wait;

/// Highest sampling rate accepted. CPU-time timers expire on the kernel tick (250 Hz on
/// common kernels): above it, signals come at the tick rate and each carries the periods
/// it stands for (see the module docs), so totals stay exact and stacks are fewer.
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
    /// `drain_period` zero or longer than a minute.
    #[error("sampler.drain_period must be between 1 ms and 60 s, got {0:?}")]
    InvalidDrainPeriod(Duration),
    /// A sampler is already running in this process.
    #[error(
        "profiling is already set up in this process (a second `Telemetry::build`/`init`, \
         `Profiler::start` or `Sampler::start` while the first still runs): set it up once, \
         at the start of `main`, and keep its guard; drop the first before starting another"
    )]
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
    /// The calling thread blocks `SIGPROF`, so its timer could never sample it.
    #[error(
        "this thread blocks SIGPROF (pthread_sigmask), so it cannot be sampled; unblock \
         SIGPROF before registering it"
    )]
    SigprofBlocked,
    /// Every thread slot is in use.
    #[error(
        "more than {} threads are registered with the sampler",
        slots::MAX_THREADS
    )]
    TooManyThreads,
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
    /// Records buffered per thread between two drains. `None` (default): sized from the
    /// rate and the drain period (see [`SamplerConfig::effective_ring_capacity`]); more
    /// are dropped and counted.
    pub ring_capacity: Option<usize>,
    /// How often the collector drains the buffers (default 100 ms); sizes the buffers.
    pub drain_period: Duration,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            frequency_hz: 100,
            ring_capacity: None,
            drain_period: Duration::from_millis(100),
        }
    }
}

/// Slack the derived buffer size allows beyond two drain periods: a drain can be late by
/// the time the collector spends finishing a profile (symbolizing, encoding).
const DRAIN_SLACK: Duration = Duration::from_millis(250);
/// Smallest derived buffer.
const MIN_RING: usize = 16;

impl SamplerConfig {
    /// Sets the sampling rate.
    pub fn with_frequency_hz(mut self, hz: u32) -> Self {
        self.frequency_hz = hz;
        self
    }

    /// Sets the per-thread buffer size explicitly.
    pub fn with_ring_capacity(mut self, capacity: usize) -> Self {
        self.ring_capacity = Some(capacity);
        self
    }

    /// Sets the drain period the buffers are sized for.
    pub fn with_drain_period(mut self, period: Duration) -> Self {
        self.drain_period = period;
        self
    }

    /// Records per thread buffer: the explicit `ring_capacity`, else enough for two drain
    /// periods plus 250 ms of slack at the sampling rate (at least 16). A thread cannot
    /// produce more records than that between drains: signals come at most at the rate
    /// (above the kernel tick, fewer, each weighted).
    ///
    /// ```
    /// use otel_profiling::sampler::SamplerConfig;
    /// assert_eq!(SamplerConfig::default().effective_ring_capacity(), 45);
    /// assert_eq!(SamplerConfig::default().with_frequency_hz(1000).effective_ring_capacity(), 450);
    /// ```
    pub fn effective_ring_capacity(&self) -> usize {
        self.ring_capacity.unwrap_or_else(|| {
            let window = self.drain_period * 2 + DRAIN_SLACK;
            let records =
                (u128::from(self.frequency_hz) * window.as_nanos()).div_ceil(1_000_000_000);
            usize::try_from(records)
                .unwrap_or(65536)
                .clamp(MIN_RING, 65536)
        })
    }

    fn validate(&self) -> Result<(), SamplerError> {
        if self.frequency_hz == 0 || self.frequency_hz > MAX_FREQUENCY_HZ {
            return Err(SamplerError::InvalidFrequency(self.frequency_hz));
        }
        if let Some(capacity) = self.ring_capacity {
            if capacity == 0 || capacity > 65536 {
                return Err(SamplerError::InvalidRingCapacity(capacity));
            }
        }
        if self.drain_period.is_zero() || self.drain_period > Duration::from_secs(60) {
            return Err(SamplerError::InvalidDrainPeriod(self.drain_period));
        }
        Ok(())
    }
}

/// Sample counters. `taken == drained + dropped + buffered` at any quiet moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SamplerStats {
    /// Timer signals handled (samples).
    pub taken: u64,
    /// CPU periods those samples stand for (`Σ weight`): more than `taken` when the kernel
    /// delivered fewer signals than the rate asks (rates above its tick).
    pub periods: u64,
    /// Samples lost because the thread's buffer was full.
    pub dropped: u64,
    /// Samples handed to `drain`.
    pub drained: u64,
    /// Threads registered and sampled now.
    pub threads: usize,
    /// Recorded samples whose stack is incomplete ([`SampleRecord::truncated`]): the
    /// unwinder met an address in no known object (counted in `unknown_pc` too), a
    /// stack word it may not read, unusable call-frame information or more than
    /// [`MAX_FRAMES`] frames, the interrupted stack pointer was not on the thread's
    /// stack, or too little stack was left to walk (`low_stack`). Their innermost frames
    /// are still recorded.
    pub truncated: u64,
    /// Of `truncated`: walks that stopped at an address outside every loaded object
    /// known to the unwinder (JIT code, or a library `dlopen`ed since the last
    /// [`refresh_modules`]).
    pub unknown_pc: u64,
    /// Of `truncated`: samples taken with less than the walk's stack budget left on the
    /// interrupted thread (deep recursion on a small stack); only the pc was kept.
    pub low_stack: u64,
    /// `SIGPROF` signals that were not from this sampler's timers for the receiving
    /// thread (another library's timer, `kill`, a signal queued before its thread let
    /// go of its slot); ignored.
    pub foreign_signals: u64,
    /// Registrations refused because the thread blocks `SIGPROF`.
    pub blocked_threads: u64,
    /// Times the `SIGPROF` handler was found replaced by another component (sampling
    /// stops until the process restarts the sampler).
    pub handler_replaced: u64,
    /// Samples taken under a local root whose span had already ended (a `LocalRoot`
    /// kept past its span); not counted for any span.
    pub stale_roots: u64,
    /// Stretches of wall time spent inside a local root after its span had ended (a
    /// detached task still running under it, or a plain-API span ended inside its own
    /// scope); not counted in any span's `profiling.wall.active_ns`.
    pub stale_active: u64,
    /// Thread slots the sampler holds: never freed, the high-water mark of threads
    /// registered at once (at most 65,536).
    pub thread_slots: u64,
    /// Bytes of the sample rings those slots hold (a free slot keeps its ring for the
    /// next thread: the high-water mark too).
    pub ring_bytes: u64,
    /// Registrations refused because all 65,536 thread slots were taken: those threads
    /// are not sampled.
    pub threads_refused: u64,
    /// Local roots that got no label slot (more alive at once than
    /// [`set_max_live_roots`](crate::set_max_live_roots) allows): samples under them
    /// carry no labels.
    pub unlabelled_roots: u64,
    /// Threads sampled now that never registered: the profiler's scan of
    /// `/proc/self/task` adopted them (their samples carry no span). Not in `threads`.
    pub adopted_threads: usize,
    /// Threads adopted so far (see `adopted_threads`).
    pub adoptions: u64,
    /// Threads the scan left unsampled because they block `SIGPROF` (each counted once).
    pub adoptions_blocked: u64,
    /// Adoptions that failed (every slot taken, no memory for the slot's stacks, a timer
    /// refused): those threads are not sampled.
    pub adoptions_failed: u64,
    /// Threads that declined sampling (OpenTelemetry's suppressed scope, the crate's HTTP
    /// clients) while 64 such threads were alive already: recognised by name only
    /// (`OpenTelemetry*`, `otel-profiling*`), else adopted and sampled, unlabelled.
    pub declined_unrecorded: u64,
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

/// Everything the sampler keeps, in one value: what the signal handler reads (on/off,
/// the period, the thread slots, the foreign-signal count) and the state of start, stop
/// and registration.
///
/// The process has exactly one, [`SamplerState::global`], and it is the one `static` of
/// the sampler: a signal handler gets no `&self`, so the `SIGPROF` handler (and the
/// `pthread_atfork` handlers) reach it through the static, and the kernel names a
/// handler's slot by its index in this state's table. Everything else reaches it through
/// a [`Sampler`] handle (which holds `&'static SamplerState`) or through the public free
/// functions below that serve callers without a handle (tokio's thread hooks, the span
/// hooks, the collector). Tests of what involves no signal build their own.
pub(crate) struct SamplerState {
    // Read by the signal handler.
    /// Whether the handler records anything (false after stop and in a forked child).
    enabled: AtomicBool,
    /// Sampling period in nanoseconds (what one sample stands for).
    period_ns: AtomicU64,
    /// `SIGPROF` signals that were not ours.
    foreign: AtomicU64,
    /// Per-thread state: rings, unwind caches, counters, timers.
    slots: SlotTable,
    // Start, stop, registration.
    /// The running sampler: `run << 1 | running`. Registration and stop read it `SeqCst`
    /// against the timer publication (see [`SamplerState::new_registration`]).
    run_state: AtomicU64,
    /// Bumped in every forked child: registrations and samplers of the parent do nothing
    /// there.
    epoch: AtomicU64,
    frequency_hz: AtomicU32,
    ring_capacity: AtomicUsize,
    drained: AtomicU64,
    blocked: AtomicU64,
    /// Times the collector found another handler installed for `SIGPROF`.
    replaced: AtomicU64,
    /// Whether a handler replacement was already reported.
    replaced_seen: AtomicBool,
    /// Serialises start and stop (never taken by registration or the handler); fork-safe.
    start_stop: ForkSafeLock,
    /// The panic hook that aborts a panic inside the handler is installed once.
    panic_guard: Once,
    /// Holds a registration between arming and publishing its timer (tests of stop racing
    /// registration).
    #[cfg(test)]
    registration_pause: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

crate::sync::lazy_static_value! {
    /// The process's sampler state (see [`SamplerState`]).
    static SAMPLER: SamplerState = SamplerState::new();
}

impl SamplerState {
    crate::sync::const_fn! {
        pub(crate) fn new() -> SamplerState {
            SamplerState {
                enabled: AtomicBool::new(false),
                period_ns: AtomicU64::new(0),
                foreign: AtomicU64::new(0),
                slots: SlotTable::new(),
                run_state: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                frequency_hz: AtomicU32::new(0),
                ring_capacity: AtomicUsize::new(0),
                drained: AtomicU64::new(0),
                blocked: AtomicU64::new(0),
                replaced: AtomicU64::new(0),
                replaced_seen: AtomicBool::new(false),
                start_stop: ForkSafeLock::new(),
                panic_guard: Once::new(),
                #[cfg(test)]
                registration_pause: std::sync::Mutex::new(None),
            }
        }
    }

    /// The process's state: the one the `SIGPROF` handler uses. Async-signal-safe.
    #[inline]
    pub(crate) fn global() -> &'static SamplerState {
        &SAMPLER
    }

    fn is_global(&self) -> bool {
        std::ptr::eq(self, Self::global())
    }

    /// The thread slots (the blocked-thread watchdog reads their span records).
    pub(crate) fn slots(&self) -> &SlotTable {
        &self.slots
    }

    fn running_run(&self) -> Option<u64> {
        let state = self.run_state.load(Ordering::SeqCst);
        (state & 1 == 1).then_some(state >> 1)
    }

    /// Whether a sampler is running on this state.
    pub(crate) fn is_running(&self) -> bool {
        self.running_run().is_some()
    }

    /// Installs the handler and starts a run. Only the process's state can run: the
    /// handler and the timers name slots of its table.
    fn start(&'static self, config: SamplerConfig) -> Result<Sampler, SamplerError> {
        assert!(self.is_global(), "only the process's sampler state runs");
        config.validate()?;
        // Before any root can claim counters: active time is then measured on one clock.
        crate::clock::init_ticks();
        let _serial = self.start_stop.lock();
        if self.is_running() {
            return Err(SamplerError::AlreadyRunning);
        }
        handler::install(self)?;
        // The crate's fork handlers (`crate::fork`): prepare/parent take and release the
        // unwinder's publisher lock; the child's resets only store to atomics.
        crate::fork::install_handlers();
        self.frequency_hz
            .store(config.frequency_hz, Ordering::Relaxed);
        self.period_ns.store(
            1_000_000_000 / u64::from(config.frequency_hz),
            Ordering::Relaxed,
        );
        self.ring_capacity
            .store(config.effective_ring_capacity(), Ordering::Relaxed);
        // Before any thread registers, so its first samples are unwound.
        unwind::refresh(Wait::Upto(Duration::from_millis(100)));
        self.replaced_seen.store(false, Ordering::Relaxed);
        let run = (self.run_state.load(Ordering::SeqCst) >> 1) + 1;
        self.enabled.store(true, Ordering::Release);
        self.run_state.store(run << 1 | 1, Ordering::SeqCst);
        Ok(Sampler {
            state: self,
            run,
            epoch: self.epoch.load(Ordering::Acquire),
        })
    }

    /// Stops `run` if it is still the running one, and not inherited through a fork.
    fn stop(&self, run: u64, epoch: u64) {
        if epoch != self.epoch.load(Ordering::Acquire) {
            // Inherited through fork: the parent's timers are not this process's.
            return;
        }
        let _serial = self.start_stop.lock();
        if self.running_run() != Some(run) {
            return;
        }
        self.enabled.store(false, Ordering::Release);
        // SeqCst, then every slot's timer SeqCst: a registration that published its timer
        // before this store has it deleted here; one after sees the stop and deletes it
        // itself (see `new_registration`).
        self.run_state.store(run << 1, Ordering::SeqCst);
        for slot in self.slots.iter() {
            slot.delete_timer();
        }
        // The handler stays installed (a pending SIGPROF with the default disposition
        // would kill the process); it records nothing while disabled.
    }

    /// The sampling period of the current (or last) run.
    fn period(&self) -> Duration {
        Duration::from_nanos(
            1_000_000_000 / u64::from(self.frequency_hz.load(Ordering::Relaxed).max(1)),
        )
    }

    /// Sample counters, since the process started (across sampler restarts).
    pub(crate) fn stats(&self) -> SamplerStats {
        let adoptions = adopt::stats();
        let mut stats = SamplerStats {
            drained: self.drained.load(Ordering::Relaxed),
            foreign_signals: self.foreign.load(Ordering::Relaxed),
            blocked_threads: self.blocked.load(Ordering::Relaxed),
            handler_replaced: self.replaced.load(Ordering::Relaxed),
            stale_roots: crate::root_cpu::stale_handles(),
            stale_active: crate::root_cpu::stale_active(),
            unlabelled_roots: crate::label::unlabelled_roots(),
            thread_slots: self.slots.len(),
            ring_bytes: self.slots.ring_bytes(),
            threads_refused: self.slots.refused(),
            adoptions: adoptions.adopted,
            adoptions_blocked: adoptions.blocking,
            adoptions_failed: adoptions.failed,
            declined_unrecorded: adoptions.declined_unrecorded,
            ..SamplerStats::default()
        };
        for slot in self.slots.iter() {
            let c = &slot.counters;
            stats.taken += c.taken.load(Ordering::Relaxed);
            stats.periods += c.periods.load(Ordering::Relaxed);
            stats.dropped += c.dropped.load(Ordering::Relaxed);
            stats.truncated += c.truncated.load(Ordering::Relaxed);
            stats.unknown_pc += c.unknown_pc.load(Ordering::Relaxed);
            stats.low_stack += c.low_stack.load(Ordering::Relaxed);
            if slot.is_sampling() {
                if slot.is_adopted() {
                    stats.adopted_threads += 1;
                } else {
                    stats.threads += 1;
                }
            }
        }
        stats
    }

    /// See [`check_handler`].
    pub(crate) fn check_handler(&self) -> bool {
        if !self.is_running() || handler::is_installed() {
            return true;
        }
        if !self.replaced_seen.swap(true, Ordering::Relaxed) {
            self.replaced.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "otel-profiling: another component replaced the SIGPROF handler; CPU \
                 sampling has stopped (only one SIGPROF owner per process)"
            );
        }
        false
    }

    /// Hands every buffered record of every thread to `f` and frees the buffers; the
    /// collector's entry point. Records outlive a stopped sampler until drained. One drain
    /// runs at a time (the slot table's drain lock makes it every ring's one consumer);
    /// registration never waits for it.
    pub(crate) fn drain_into(&self, f: impl FnMut(&SampleRecord)) -> usize {
        // Allocation samples drained by a caller that does not take them are counted as
        // dropped (the collector takes both: `drain_both`).
        self.drain_both(f, crate::allocations::count_dropped)
    }

    /// [`drain_into`](Self::drain_into), with every thread's allocation samples given to
    /// `allocations` in the same pass.
    pub(crate) fn drain_both(
        &self,
        mut f: impl FnMut(&SampleRecord),
        mut allocations: impl FnMut(&crate::allocations::AllocRecord),
    ) -> usize {
        let total = self.slots.drain(&mut f, &mut allocations);
        // The threads without a ring: their allocation samples share one buffer.
        crate::allocations::drain_unregistered(&mut allocations);
        self.drained.fetch_add(total as u64, Ordering::Relaxed);
        total
    }

    /// Starts sampling the calling thread, if a sampler runs (idempotent).
    fn register_current_thread(&'static self) -> Result<(), SamplerError> {
        let run = self.running_run().ok_or(SamplerError::NotRunning)?;
        self.register(run, true)
    }

    fn register(&'static self, run: u64, explicit: bool) -> Result<(), SamplerError> {
        let epoch = self.epoch.load(Ordering::Acquire);
        // A thread whose thread-locals are being destroyed is not registered any more.
        let current = REGISTRATION
            .try_with(|r| {
                r.borrow()
                    .as_ref()
                    .filter(|r| r.is_of(self, run, epoch))
                    .map(|r| r.slot.is_some())
            })
            .map_err(|_| SamplerError::NotRunning)?;
        match current {
            Some(true) => return Ok(()),
            Some(false) if !explicit => return Err(SamplerError::SigprofBlocked),
            _ => {}
        }
        // Let go of an earlier run's slot (or a blocked note) first.
        SETTLED.set(NOT_SETTLED);
        let _ = REGISTRATION.try_with(|r| drop(r.borrow_mut().take()));
        let registration = if handler::blocked_here() {
            self.blocked.fetch_add(1, Ordering::Relaxed);
            Registration {
                state: self,
                slot: None,
                alt: None,
                run,
                epoch,
            }
        } else {
            self.new_registration(run, epoch)?
        };
        let blocked = registration.slot.is_none();
        // If the thread-local is gone meanwhile, the registration drops here (released).
        let _ = REGISTRATION.try_with(|r| *r.borrow_mut() = Some(registration));
        if blocked {
            return Err(SamplerError::SigprofBlocked);
        }
        Ok(())
    }

    /// See [`on_span_enter`].
    #[inline]
    fn on_span_enter(&'static self) {
        if let Err((run, epoch)) = self.enter_is_settled() {
            self.settle(run, epoch);
        }
    }

    /// Ok when a span enter on this thread has nothing to do for the sampler (none runs,
    /// or the thread is settled with this run and epoch); else the run and epoch to
    /// settle with.
    #[inline(always)]
    fn enter_is_settled(&self) -> Result<(), (u64, u64)> {
        // Relaxed: a stale answer only delays registration to the next enter; `register`
        // reads the run again with SeqCst.
        let state = self.run_state.load(Ordering::Relaxed);
        if state & 1 == 0 {
            return Ok(());
        }
        let run = state >> 1;
        let epoch = self.epoch.load(Ordering::Relaxed);
        if SETTLED.get() == [run, epoch] {
            return Ok(());
        }
        Err((run, epoch))
    }

    /// [`Self::on_span_enter`] on a thread not known settled for this run and epoch: looks
    /// at its registration, notes it settled, or registers it.
    #[cold]
    #[inline(never)]
    fn settle(&'static self, run: u64, epoch: u64) {
        let settled = REGISTRATION
            .try_with(|r| match r.try_borrow() {
                Ok(r) => {
                    let settled = r.as_ref().is_some_and(|r| r.is_of(self, run, epoch));
                    if settled {
                        SETTLED.set([run, epoch]);
                    }
                    settled
                }
                // Borrowed: a registration in progress on this very thread.
                Err(_) => true,
            })
            .unwrap_or(true);
        // Threads in OpenTelemetry's suppressed scope (the bridge's own, the SDK's batch
        // processor) are never sampled: their work is the telemetry's, not the
        // application's. Checked only while unregistered, so a registered thread's enter
        // costs nothing more.
        if !settled {
            if opentelemetry::Context::is_current_telemetry_suppressed() {
                // Nor adopted by the collector's scan.
                adopt::decline_current_thread();
            } else {
                let _ = self.register(run, false);
            }
        }
    }

    fn new_registration(&'static self, run: u64, epoch: u64) -> Result<Registration, SamplerError> {
        // The timer's value names a slot of the table the handler reads.
        assert!(
            self.is_global(),
            "only the process's sampler state arms timers"
        );
        let hz = u64::from(self.frequency_hz.load(Ordering::Relaxed).max(1));
        let stack = StackBounds::current().map_err(|source| SamplerError::Os {
            call: "pthread_getattr_np",
            source,
        })?;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // An adoption of this thread by the collector's scan gives way (see `adopt`).
        adopt::take_over_current_thread(self);
        let slot = self
            .slots
            .claim(Owner {
                tid,
                cell: thread_cell(),
                stack,
                ring_capacity: self.ring_capacity.load(Ordering::Relaxed).max(1),
                alloc_capacity: crate::allocations::ring_capacity(),
                cpu_ns: cpu_ledger::thread_cpu_ns().unwrap_or(0),
                adopted: false,
            })
            .ok_or(SamplerError::TooManyThreads)?;
        // From here on the registration owns the slot: an error path drops it (releasing).
        // Before the timer: its first signal already runs on the slot's own stack.
        let alt = altstack::install(slot);
        let mut registration = Registration {
            state: self,
            slot: Some(slot),
            alt,
            run,
            epoch,
        };
        let timer = arm_timer(slot, libc::CLOCK_THREAD_CPUTIME_ID, tid, hz)?;
        #[cfg(test)]
        if let Some(pause) = self
            .registration_pause
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = pause.recv();
        }
        slot.set_timer(timer);
        // Publish, then look (both SeqCst); stop stores, then looks at every slot. One of
        // the two sees the other: a timer armed across a stop is always deleted.
        if self.running_run() != Some(run) {
            slot.delete_timer();
            return Err(SamplerError::NotRunning);
        }
        // An adoption the scan published meanwhile gives way too; if its first signal had
        // installed its alternate stack (so ours was not), ours goes in now.
        if adopt::take_over_current_thread(self) && registration.alt.is_none() {
            registration.alt = altstack::install(slot);
        }
        OWN_SLOT.set((slot as *const Slot, epoch));
        Ok(registration)
    }

    /// In a forked child: the child has no timers and only the forking thread; nothing
    /// from the parent's threads may be used. A new sampler can be started in the child.
    /// Only atomics: runs in the `pthread_atfork` child handler.
    fn after_fork_in_child(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.enabled.store(false, Ordering::Relaxed);
        self.run_state.store(
            self.run_state.load(Ordering::Relaxed) & !1,
            Ordering::Relaxed,
        );
        self.drained.store(0, Ordering::Relaxed);
        self.foreign.store(0, Ordering::Relaxed);
        self.blocked.store(0, Ordering::Relaxed);
        self.start_stop.reset_in_child();
        self.slots.reset_in_child();
    }
}

/// Creates and arms a timer on the CPU clock `clock` that sends `SIGPROF` to thread
/// `tid` every period of `hz`, carrying `slot`'s value; not yet published to the slot.
fn arm_timer(
    slot: &Slot,
    clock: libc::clockid_t,
    tid: libc::pid_t,
    hz: u64,
) -> Result<libc::timer_t, SamplerError> {
    // SAFETY: plain FFI; `sev` is fully initialised and `timer` is an out-parameter.
    let timer = unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_THREAD_ID;
        sev.sigev_signo = libc::SIGPROF;
        sev.sigev_value = libc::sigval {
            sival_ptr: slot.timer_value().to_sival(),
        };
        sev.sigev_notify_thread_id = tid;
        let mut timer: libc::timer_t = std::mem::zeroed();
        if libc::timer_create(clock, &mut sev, &mut timer) != 0 {
            return Err(SamplerError::last_os("timer_create"));
        }
        timer
    };
    let period_ns = 1_000_000_000 / hz.max(1);
    // tv_nsec must stay below one second (1 Hz is a whole second).
    let period = libc::timespec {
        tv_sec: (period_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (period_ns % 1_000_000_000) as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: period,
        it_value: period,
    };
    // Armed before it is published: nothing but the caller can reach the id yet, and an
    // early signal is checked against the slot, not the timer.
    // SAFETY: `timer` is a live timer id owned by the caller.
    if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
        let err = SamplerError::last_os("timer_settime");
        // SAFETY: created above, not published, deleted once.
        unsafe { libc::timer_delete(timer) };
        return Err(err);
    }
    Ok(timer)
}

thread_local! {
    static REGISTRATION: RefCell<Option<Registration>> = const { RefCell::new(None) };
    /// The (run, epoch) the thread's registration is settled for (registered, or known to
    /// block `SIGPROF`), so a span enter checks one `const` thread-local with no destructor
    /// instead of borrowing the registration (14 instructions less an enter). Only the
    /// global sampler state registers threads, so the pair names the registration; it is
    /// forgotten wherever the registration is given up before the thread ends.
    static SETTLED: Cell<[u64; 2]> = const { Cell::new(NOT_SETTLED) };
    /// The thread's registered slot and the epoch it was claimed in (null: none), for the
    /// allocator's hook: a `const` thread-local with no destructor, readable while the
    /// thread's other thread-locals are torn down.
    static OWN_SLOT: Cell<(*const Slot, u64)> = const { Cell::new((std::ptr::null(), 0)) };
}

/// The calling thread's own registered slot (not an adoption), if it has one in this
/// process (a forked child's copy of the parent's is not). Loads only; no allocation.
#[inline]
pub(crate) fn own_slot() -> Option<&'static Slot> {
    let (slot, epoch) = OWN_SLOT.try_with(Cell::get).ok()?;
    if epoch != SamplerState::global().epoch.load(Ordering::Acquire) {
        return None;
    }
    // SAFETY: slots are never freed (`NeverFreed`); the pointer was set by this thread's
    // registration and is cleared before its slot is released.
    unsafe { slot.as_ref() }
}

/// [`SETTLED`] for no registration (runs and epochs count from 0 and never reach it).
const NOT_SETTLED: [u64; 2] = [u64::MAX, u64::MAX];

/// The calling thread's claim on a slot (or the note that it cannot be sampled).
struct Registration {
    state: &'static SamplerState,
    /// `None`: the thread blocks SIGPROF (not retried on every span enter of this run).
    slot: Option<&'static Slot>,
    /// The alternate signal stack the registration installed (see `altstack`).
    alt: Option<altstack::Installed>,
    run: u64,
    epoch: u64,
}

impl Registration {
    fn is_of(&self, state: &SamplerState, run: u64, epoch: u64) -> bool {
        std::ptr::eq(self.state, state) && self.run == run && self.epoch == epoch
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // In a forked child the slot was already reset (and may belong to someone else).
        if self.epoch != self.state.epoch.load(Ordering::Acquire) {
            return;
        }
        if let Some(slot) = self.slot {
            // The allocator's hook stops using the slot before it goes.
            let _ = OWN_SLOT.try_with(|own| {
                if std::ptr::eq(own.get().0, slot) {
                    own.set((std::ptr::null(), 0));
                }
            });
            // On the owner thread (the registration is its thread-local), before the slot
            // (and with it the stack) can go to another thread.
            if let Some(alt) = self.alt.take() {
                altstack::uninstall(alt);
            }
            self.state.slots.release(slot);
        }
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
pub struct Sampler {
    /// The process's state (the one the signal handler reads).
    state: &'static SamplerState,
    run: u64,
    /// The process that started it: in a forked child the handle does nothing.
    epoch: u64,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("run", &self.run)
            .field("epoch", &self.epoch)
            .finish()
    }
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
        SamplerState::global().start(config)
    }

    /// Starts sampling the calling thread (idempotent).
    pub fn register_current_thread(&self) -> Result<(), SamplerError> {
        self.state.register_current_thread()
    }

    /// The sampling period.
    pub fn period(&self) -> Duration {
        self.state.period()
    }

    /// Hands every buffered record to `f`, thread by thread, and frees the buffers.
    /// Threads that exited are recycled after their last records are drained.
    pub fn drain(&self, f: impl FnMut(&SampleRecord)) -> usize {
        self.state.drain_into(f)
    }

    /// Sample counters.
    pub fn stats(&self) -> SamplerStats {
        self.state.stats()
    }

    /// Stops sampling (same as dropping the handle).
    pub fn stop(self) {}
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.state.stop(self.run, self.epoch);
    }
}

// The functions below serve callers that hold no `Sampler`: threads registering from a
// runtime's hooks, the span hooks, the collector, the fork handlers. Each reads the
// process's state.

/// Process-wide sample counters, since the process started (across sampler restarts).
pub fn stats() -> SamplerStats {
    SamplerState::global().stats()
}

/// Whether a sampler is running in this process.
pub fn is_running() -> bool {
    SamplerState::global().is_running()
}

/// Checks that `SIGPROF` still reaches this sampler's handler. Another component that
/// installs its own handler later silently ends sampling: this counts it
/// ([`SamplerStats::handler_replaced`]) and says so on stderr, once per discovery. The
/// collector calls it every drain; returns whether the handler is ours.
pub fn check_handler() -> bool {
    SamplerState::global().check_handler()
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
    if !is_running() {
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
///
/// Fails with [`SamplerError::SigprofBlocked`] (and counts it) when the thread blocks
/// `SIGPROF`: its timer would only queue signals it never takes.
pub fn register_current_thread() -> Result<(), SamplerError> {
    SamplerState::global().register_current_thread()
}

/// Stops sampling the calling thread (also done automatically when it exits).
pub fn unregister_current_thread() {
    SETTLED.set(NOT_SETTLED);
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

/// For `tokio::runtime::Builder::on_thread_park`: marks the worker parked (two clock reads
/// a park and unpark, no system call). With [`tokio_on_thread_unpark`], a root's time off
/// CPU leaves out the worker's parks between polls, which are otherwise charged to its
/// next long stretch as blocked (`docs/elapsed-time.md`).
///
/// ```no_run
/// let runtime = tokio::runtime::Builder::new_multi_thread()
///     .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
///     .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
///     .on_thread_park(otel_profiling::sampler::tokio_on_thread_park())
///     .on_thread_unpark(otel_profiling::sampler::tokio_on_thread_unpark())
///     .build()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn tokio_on_thread_park() -> impl Fn() + Send + Sync + 'static {
    crate::span_context::active::parked
}

/// For `tokio::runtime::Builder::on_thread_unpark`: see [`tokio_on_thread_park`].
pub fn tokio_on_thread_unpark() -> impl Fn() + Send + Sync + 'static {
    crate::span_context::active::unparked
}

/// Registers the calling thread on its first span enter while a sampler runs, unless it
/// is in OpenTelemetry's suppressed scope: one atomic load and one thread-local read when
/// already registered (or known blocked).
#[inline]
pub(crate) fn on_span_enter() {
    SamplerState::global().on_span_enter();
}

/// Whether [`on_span_enter`] would do nothing now (the caller's fast path: it calls
/// `on_span_enter` on its slow path).
#[inline(always)]
pub(crate) fn span_enter_is_settled() -> bool {
    SamplerState::global().enter_is_settled().is_ok()
}

/// Before `fork` (from `crate::fork`'s prepare handler).
pub(crate) fn before_fork() {
    unwind::before_fork();
    modules::before_fork();
}

/// After `fork`, in the parent.
pub(crate) fn after_fork_in_parent() {
    modules::after_fork();
    unwind::after_fork_in_parent();
}

/// After `fork`, in the child.
pub(crate) fn after_fork_in_child() {
    // Only atomics here, and the forking thread's own guards let go of.
    modules::after_fork();
    SamplerState::global().after_fork_in_child();
    altstack::after_fork_in_child();
    crate::root_cpu::after_fork_in_child();
    unwind::after_fork_in_child();
    watchdog::after_fork_in_child();
    adopt::after_fork_in_child();
}

/// The sampler is process-wide: unit tests that start it (its timers, its `SIGPROF`
/// handler, its registrations) take turns. Tests of rings, slot tables or counters build
/// their own and need no turn.
#[cfg(test)]
pub(crate) fn test_turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The calling thread's slot, if it is registered.
#[cfg(test)]
fn current_slot() -> Option<&'static Slot> {
    REGISTRATION.with(|r| r.borrow().as_ref().and_then(|r| r.slot))
}

#[cfg(test)]
mod tests;
