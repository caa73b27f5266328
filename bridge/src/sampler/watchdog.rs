//! The blocked-in-poll watchdog: finds threads held inside one poll of a local root while
//! off-CPU in a system call, and takes their stacks without interrupting them.
//!
//! ```text
//!  watchdog thread, every threshold / 2              thread T (registered, never touched)
//!  for each owned slot:                              inside root R, blocked in read(2),
//!    record (seq, R) ── seq unchanged since ≥ 1 tick?   nanosleep, futex, …
//!    CPU clock of T ── unchanged since last tick?
//!    stack already taken for this block? ─► record: that stack, delay since last look
//!    else, in R ≥ threshold? /proc/self/task/T/syscall ─► "nr args sp pc"
//!      process_vm_readv(stack [sp, top))
//!      re-read syscall, seq, CPU clock: all the same? else discard
//!      unwind the copy from (pc, sp)
//!      record: stack, R's labels, delay since the CPU clock was first seen still
//! ```
//!
//! **Nothing on the hot path.** The span context record's sequence number changes at
//! every root transition, so the watchdog tells "still inside the same poll" by seeing the
//! same sequence on two ticks: the span hooks write nothing new. A thread's record is a
//! thread-local; the watchdog reads it directly under the slot handshake
//! (`Slot::read_cell_if_owned` in `slots.rs`), a few loads per thread per tick.
//!
//! **Off-CPU, in a system call.** Only threads whose record is unchanged since the last
//! tick cost system calls: a `clock_gettime` on the thread's CPU clock and, when the
//! thread ran less than a quarter of the wall time since the last look, a read of
//! `/proc/self/task/<tid>/syscall`, which for a thread blocked in a system call gives its
//! user stack pointer and program counter (and `running` for any runnable thread, so a
//! preempted CPU-bound thread is never taken for a blocked one). The quarter, rather
//! than "no CPU at all", lets a loop of short blocking calls count. A thread awaiting in a
//! future has no root on its record and costs nothing.
//!
//! **The stack is copied, never dereferenced.** `process_vm_readv` on our own pid copies
//! `[sp, stack top)` (at most [`WatchdogConfig::max_stack_bytes`]); it fails with `EFAULT`
//! rather than faulting if the thread exited and its stack was unmapped. The copy is
//! unwound with the sampler's CFI unwinder. Right after the copy, before the unwind, the
//! syscall line, the record's sequence and the CPU clock are read again: if any changed,
//! the thread woke while we read, the copy may be torn, and the observation is discarded
//! (counted). The unwind reads only the copy, so it is left out of that window: a thread
//! blocking in many short calls wakes inside it far less often.
//!
//! **One stack per block.** A thread whose CPU clock has not advanced has not run an
//! instruction, so while the clock stands still (and the record names the same poll) its
//! stack is the one already taken: later looks at the block cost one `clock_gettime`, not
//! another `/proc` read, copy and unwind.
//!
//! **Cost bound.** Every tick reads every registered thread's record (loads only, about
//! 0.1 µs a thread); at most [`WatchdogConfig::max_threads_per_tick`] threads per tick get
//! system calls, the pass resuming where the last one hit the cap. Figures:
//! `docs/benchmarks.md`.
//!
//! **Weight.** A blocked look is worth the wall time since the previous look at the
//! thread minus the CPU time it used meanwhile. So a 300 ms block seen every 5 ms adds up
//! to about 300 ms (minus up to two ticks at its start, before it could be seen), not
//! 300 ms per look. A run of blocked looks counts once in `contentions`.
//!
//! **Frame pointer.** The syscall line has no frame-pointer register. Frames whose CFI
//! finds their caller through `rbp` (code built with frame pointers, like the standard
//! library) need it; on x86_64 it is guessed as the lowest frame record on the copied stack
//! (a word pointing higher up the stack followed by a return address into known code,
//! whose chain holds for a few links). When the guess is wrong the stack stops early and is
//! marked truncated; the innermost frames (the system call wrapper and its callers up to
//! the first frame-pointer frame) are exact either way.

use std::cell::UnsafeCell;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::fork::ProcessBound;
use std::time::{Duration, Instant};

use super::ring::SampleRecord;
use super::slots::{ForkSafeLock, Slot};
use super::stack::Registers;
use super::unwind::{self, WalkEnd};
use crate::span_context::RootLabel;

/// Default time a thread must spend inside one poll, off-CPU, before its stack is taken.
pub const DEFAULT_THRESHOLD: Duration = Duration::from_millis(10);
/// Default cap on the threads examined with system calls in one tick: 16 × 200 ticks/s
/// bounds the CPU clock reads at 3,200 a second (see `docs/benchmarks.md`).
pub const DEFAULT_MAX_THREADS_PER_TICK: usize = 16;
/// Default most bytes of a blocked thread's stack copied (from its stack pointer up).
pub const DEFAULT_MAX_STACK_BYTES: usize = 256 * 1024;
/// A look counts the thread as blocked when it ran less than 1/4 of the wall time since
/// the previous look.
const OFF_CPU_RATIO: u64 = 4;
/// Blocked records kept between two collector drains; more are dropped and counted.
const MAX_PENDING: usize = 4096;

/// Watchdog settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WatchdogConfig {
    /// How long a thread must be inside one poll of a root, with its CPU clock standing
    /// still, before it counts as blocked (default 10 ms). The watchdog ticks every half
    /// of it.
    pub threshold: Duration,
    /// Most threads examined with system calls per tick (default 16); the rest wait for a
    /// later tick and are counted in [`WatchdogStats::skipped`].
    pub max_threads_per_tick: usize,
    /// Most bytes of stack copied per blocked thread (default 256 KiB); deeper stacks
    /// are cut (marked truncated).
    pub max_stack_bytes: usize,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            threshold: DEFAULT_THRESHOLD,
            max_threads_per_tick: DEFAULT_MAX_THREADS_PER_TICK,
            max_stack_bytes: DEFAULT_MAX_STACK_BYTES,
        }
    }
}

impl WatchdogConfig {
    /// Sets the threshold.
    pub fn with_threshold(mut self, threshold: Duration) -> Self {
        self.threshold = threshold;
        self
    }

    /// Sets the per-tick cap.
    pub fn with_max_threads_per_tick(mut self, threads: usize) -> Self {
        self.max_threads_per_tick = threads;
        self
    }

    /// Sets the most stack bytes copied per look.
    pub fn with_max_stack_bytes(mut self, bytes: usize) -> Self {
        self.max_stack_bytes = bytes;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), WatchdogError> {
        if self.threshold < Duration::from_millis(1) || self.threshold > Duration::from_secs(60) {
            return Err(WatchdogError::InvalidThreshold(self.threshold));
        }
        if self.max_threads_per_tick == 0 {
            return Err(WatchdogError::InvalidCap);
        }
        if !(4096..=8 * 1024 * 1024).contains(&self.max_stack_bytes) {
            return Err(WatchdogError::InvalidStackBytes(self.max_stack_bytes));
        }
        Ok(())
    }

    fn tick(&self) -> Duration {
        self.threshold / 2
    }
}

/// Errors starting the watchdog.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WatchdogError {
    /// `threshold` outside 1 ms ..= 60 s.
    #[error("blocked.threshold must be between 1 ms and 60 s, got {0:?}")]
    InvalidThreshold(Duration),
    /// `max_threads_per_tick` is zero.
    #[error("blocked.max_threads_per_tick must be at least 1")]
    InvalidCap,
    /// `max_stack_bytes` outside 4 KiB ..= 8 MiB.
    #[error("blocked.max_stack_bytes must be between 4096 and 8388608, got {0}")]
    InvalidStackBytes(usize),
    /// The thread could not be started.
    #[error("starting the watchdog thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// One blocked look: a thread's stack while it was off-CPU in a system call inside a root.
#[derive(Clone, Debug)]
pub struct BlockedRecord {
    /// The root the thread was inside.
    pub root: Option<RootLabel>,
    /// Wall time this look stands for, in nanoseconds.
    pub delay_ns: u64,
    /// Whether this is the first accepted look at this block (counted as a contention).
    pub first_look: bool,
    /// The system call number the thread was blocked in.
    pub syscall: i64,
    /// Instruction addresses, innermost first, as in [`SampleRecord::frames`] (shared by
    /// every look at the same block).
    pub frames: Arc<[u64]>,
    /// Whether the stack is incomplete.
    pub truncated: bool,
}

/// Watchdog counters, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchdogStats {
    /// Ticks run.
    pub ticks: u64,
    /// Threads examined with system calls (record unchanged since the previous tick).
    pub examined: u64,
    /// Threads not examined because a tick's cap was reached.
    pub skipped: u64,
    /// Stacks taken (copied and unwound): one per block seen; later looks at the same
    /// block reuse it.
    pub captures: u64,
    /// Blocked looks recorded (each with the time since the previous look).
    pub samples: u64,
    /// Blocked nanoseconds recorded (Σ delay).
    pub delay_ns: u64,
    /// Looks discarded because the thread woke (or changed root) while its stack was read.
    pub discarded_woke: u64,
    /// Off-CPU threads inside a root that were not in a system call (a page fault, say),
    /// or whose stack pointer was off their stack: nothing to copy without a signal.
    pub not_in_syscall: u64,
    /// Failed reads (CPU clock, `/proc`, `process_vm_readv`): the thread exited, or the
    /// system refuses them (seccomp, no `/proc`).
    pub read_failed: u64,
    /// Records dropped because the collector did not drain them in time.
    pub dropped: u64,
    /// Nanoseconds of watchdog-thread CPU time, all ticks together.
    pub cpu_ns: u64,
    /// Blocked nanoseconds seen (off-CPU inside a root, past the threshold) in runs of
    /// blocked looks that no stack could be taken for: in no profile, counted here.
    pub unattributed_ns: u64,
}

struct Counters {
    ticks: AtomicU64,
    examined: AtomicU64,
    skipped: AtomicU64,
    captures: AtomicU64,
    samples: AtomicU64,
    delay_ns: AtomicU64,
    discarded_woke: AtomicU64,
    not_in_syscall: AtomicU64,
    read_failed: AtomicU64,
    dropped: AtomicU64,
    cpu_ns: AtomicU64,
    unattributed_ns: AtomicU64,
}

static COUNTERS: Counters = Counters {
    ticks: AtomicU64::new(0),
    examined: AtomicU64::new(0),
    skipped: AtomicU64::new(0),
    captures: AtomicU64::new(0),
    samples: AtomicU64::new(0),
    delay_ns: AtomicU64::new(0),
    discarded_woke: AtomicU64::new(0),
    not_in_syscall: AtomicU64::new(0),
    read_failed: AtomicU64::new(0),
    dropped: AtomicU64::new(0),
    cpu_ns: AtomicU64::new(0),
    unattributed_ns: AtomicU64::new(0),
};

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The watchdog's counters.
pub fn stats() -> WatchdogStats {
    let c = &COUNTERS;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    WatchdogStats {
        ticks: get(&c.ticks),
        examined: get(&c.examined),
        skipped: get(&c.skipped),
        captures: get(&c.captures),
        samples: get(&c.samples),
        delay_ns: get(&c.delay_ns),
        discarded_woke: get(&c.discarded_woke),
        not_in_syscall: get(&c.not_in_syscall),
        read_failed: get(&c.read_failed),
        dropped: get(&c.dropped),
        cpu_ns: get(&c.cpu_ns),
        unattributed_ns: get(&c.unattributed_ns),
    }
}

/// Recorded looks not yet taken by the collector, behind a lock a forked child can
/// reset (a `std::sync::Mutex` held by the parent's watchdog at `fork` would stay locked
/// in the child, and its collector would wait on it forever).
struct Pending {
    lock: ForkSafeLock,
    records: UnsafeCell<Vec<BlockedRecord>>,
}

// SAFETY: `records` is only reached while `lock` is held (or in a forked child's one
// thread, see `after_fork_in_child`).
unsafe impl Sync for Pending {}

crate::sync::lazy_static_value! {
    static PENDING: Pending = Pending {
        lock: ForkSafeLock::new(),
        records: UnsafeCell::new(Vec::new()),
    };
}

impl Pending {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<BlockedRecord>) -> R) -> R {
        let _held = self.lock.lock();
        // SAFETY: the lock is held: no other reference to `records` exists.
        f(unsafe { &mut *self.records.get() })
    }
}

fn push(record: BlockedRecord) {
    let delay = record.delay_ns;
    let stored = PENDING.with(|pending| {
        if pending.len() >= MAX_PENDING {
            return false;
        }
        pending.push(record);
        true
    });
    if stored {
        COUNTERS.delay_ns.fetch_add(delay, Ordering::Relaxed);
        bump(&COUNTERS.samples);
    } else {
        bump(&COUNTERS.dropped);
    }
}

/// Hands every recorded blocked look to `f` (the collector's entry point).
pub fn drain_blocked(mut f: impl FnMut(&BlockedRecord)) -> usize {
    let taken = PENDING.with(std::mem::take);
    taken.iter().for_each(&mut f);
    taken.len()
}

/// In a forked child: no watchdog thread exists there (a new profiler may start one),
/// and the parent's pending looks are forgotten. Only stores: runs in the `pthread_atfork`
/// child handler; the old vector is leaked, not freed (the parent may have been changing
/// it at the fork).
pub(crate) fn after_fork_in_child() {
    RUNNING.store(false, Ordering::Relaxed);
    PENDING.lock.reset_in_child();
    // SAFETY: the child has one thread, which is in this handler.
    unsafe { std::ptr::write(PENDING.records.get(), Vec::new()) };
}

/// Only one watchdog runs at a time.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// A running watchdog thread (`otel-profiling-watchdog`). Dropping it stops the thread.
#[derive(Debug)]
pub struct Watchdog {
    /// The process that started it owns it: a forked child has no watchdog thread to
    /// stop or join. Held for its drop.
    _running: ProcessBound<Running>,
}

#[derive(Debug)]
struct Running {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Watchdog {
    /// Starts the watchdog. Returns `Ok(None)` when one already runs (it serves the whole
    /// process).
    pub fn start(config: WatchdogConfig) -> Result<Option<Watchdog>, WatchdogError> {
        config.validate()?;
        if RUNNING.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("otel-profiling-watchdog".into())
            .spawn(move || {
                // For the thread's life (see `collector.rs`): no spans, never sampled.
                let _suppressed = opentelemetry::Context::enter_telemetry_suppressed_scope();
                let _own = crate::collector::own_thread();
                let mut scanner = Scanner::new(config.clone());
                let tick = config.tick();
                let mut next = Instant::now() + tick;
                // The cgroup's throttled time, for the roots' evidence (`cgroup`).
                super::cgroup::refresh();
                let mut next_cgroup = Instant::now() + super::cgroup::REFRESH;
                // Until the handle is dropped (disconnected) or sends.
                while let Err(RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(next.saturating_duration_since(Instant::now()))
                {
                    let cpu_before = own_cpu_ns();
                    scanner.tick();
                    if Instant::now() >= next_cgroup {
                        super::cgroup::refresh();
                        next_cgroup = Instant::now() + super::cgroup::REFRESH;
                    }
                    let spent = own_cpu_ns().saturating_sub(cpu_before);
                    COUNTERS.cpu_ns.fetch_add(spent, Ordering::Relaxed);
                    next += tick;
                    let now = Instant::now();
                    if next < now {
                        next = now + tick;
                    }
                }
                super::cgroup::forget();
                RUNNING.store(false, Ordering::Release);
            });
        match spawned {
            Ok(thread) => Ok(Some(Watchdog {
                _running: ProcessBound::new(Running {
                    stop: Some(stop),
                    thread: Some(thread),
                }),
            })),
            Err(e) => {
                RUNNING.store(false, Ordering::Release);
                Err(WatchdogError::Spawn(e))
            }
        }
    }
}

/// What the watchdog remembers of one owned slot between ticks.
struct Tracked {
    generation: u64,
    seq: u64,
    /// The root the record names (the same for the whole sequence).
    root: RootLabel,
    /// When this record (sequence) was first seen: the thread entered the root before.
    first_seen: u64,
    /// The thread's CPU clock at the last look, and when that look was.
    cpu: Option<u64>,
    last_look: u64,
    /// The block whose stack was taken, while the CPU clock has stood still since.
    block: Option<Block>,
    /// The last stack taken in this run of blocked looks; `None` outside a run (a run
    /// begins with its first stack taken, and counts one contention).
    run: Option<Block>,
    /// Blocked time of this run of blocked looks whose stack could not be taken (the
    /// thread woke during the copy, as it does when it blocks in many short calls): added
    /// to the next stack taken in the run, or when the run ends to the last one it took
    /// (see [`Tracked::end_run`]).
    unattributed: u64,
    /// The tick that last saw the slot (others are forgotten).
    seen: u64,
}

impl Tracked {
    /// Ends a run of blocked looks (the thread mostly ran, or the poll ended). Blocked
    /// time the run saw but could not take a stack for goes to the run's last stack: the
    /// same poll, blocked with no running look between, so most likely the same call in a
    /// loop. A run that took no stack at all leaves its time counted in
    /// [`WatchdogStats::unattributed_ns`]: blocked time is never silently lost.
    fn end_run(&mut self) {
        let run = self.run.take();
        let pending = std::mem::take(&mut self.unattributed);
        if pending == 0 {
            return;
        }
        match run {
            Some(block) => push(BlockedRecord {
                root: Some(self.root),
                delay_ns: pending,
                first_look: false,
                syscall: block.syscall,
                frames: block.frames,
                truncated: block.truncated,
            }),
            None => {
                COUNTERS
                    .unattributed_ns
                    .fetch_add(pending, Ordering::Relaxed);
            }
        }
    }
}

/// A block whose stack was taken. A thread whose CPU clock has not advanced has not run a
/// single instruction, so its stack and system call are the ones taken: later looks need
/// only the CPU clock (one system call), not another copy and unwind.
#[derive(Clone)]
struct Block {
    frames: Arc<[u64]>,
    truncated: bool,
    syscall: i64,
}

/// `/proc/<pid>/task/<tid>/syscall`, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SyscallState {
    /// On a CPU (or runnable): no registers given.
    Running,
    /// Off-CPU outside a system call (a page fault, say).
    Blocked { sp: u64, pc: u64 },
    /// Blocked in system call `nr`.
    InSyscall(Syscall),
}

/// A thread blocked in a system call: its number, first argument, user sp and pc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Syscall {
    pub(crate) nr: i64,
    pub(crate) arg0: u64,
    pub(crate) sp: u64,
    pub(crate) pc: u64,
}

/// Parses the kernel's line: `running`, `-1 sp pc`, or `nr a1 a2 a3 a4 a5 a6 sp pc`
/// (arguments, sp and pc in hex with `0x`).
pub(crate) fn parse_syscall(text: &str) -> Option<SyscallState> {
    let text = text.trim();
    if text == "running" {
        return Some(SyscallState::Running);
    }
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let nr: i64 = fields.first()?.parse().ok()?;
    match fields.len() {
        3 if nr == -1 => Some(SyscallState::Blocked {
            sp: hex(fields[1])?,
            pc: hex(fields[2])?,
        }),
        9 if nr >= 0 => Some(SyscallState::InSyscall(Syscall {
            nr,
            arg0: hex(fields[1])?,
            sp: hex(fields[7])?,
            pc: hex(fields[8])?,
        })),
        _ => None,
    }
}

fn read_syscall(tid: libc::pid_t) -> Option<SyscallState> {
    let mut file = std::fs::File::open(format!("/proc/self/task/{tid}/syscall")).ok()?;
    let mut buf = [0u8; 256];
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(_) => return None,
        }
    }
    parse_syscall(std::str::from_utf8(&buf[..len]).ok()?)
}

/// The CPU time of thread `tid` of this process (its per-thread CPU clock).
pub(crate) fn thread_cpu_ns(tid: libc::pid_t) -> Option<u64> {
    // The kernel's clock id for a thread's scheduler CPU clock: !tid << 3 | PERTHREAD (4) |
    // SCHED (2), what `pthread_getcpuclockid` computes from a pthread_t.
    let clock = ((!tid) << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter; an unknown clock id fails with EINVAL.
    if unsafe { libc::clock_gettime(clock as libc::clockid_t, &mut ts) } != 0 {
        return None;
    }
    Some((ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64)
}

fn own_cpu_ns() -> u64 {
    // SAFETY: gettid has no preconditions.
    thread_cpu_ns(unsafe { libc::gettid() }).unwrap_or(0)
}

// The crate's clock (clock_gettime, async-signal-safe), one spelling for every caller.
use crate::clock::monotonic_ns;

use super::stack::copy_own_memory;

/// Frame-pointer candidates to try for a thread stopped at `sp` (x86_64), lowest first,
/// at most `MAX_FP_CANDIDATES`: first the places where the copied stack holds frame
/// records chained at least three deep, then every place holding a word that points into
/// known code just above it (a frame record `[saved fp, return address]` whose saved fp is
/// not a chain pointer, because the caller keeps no frame pointer). The kernel gives only
/// sp and pc of a thread blocked in a system call; the frame pointer matters where a
/// frame's CFI needs it (std's frames are built with frame pointers), and in optimised code
/// that keeps none, stale words can look like a record: so each candidate is tried by
/// unwinding (see `Capture`).
fn frame_pointer_candidates(sp: u64, copy: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    if !cfg!(target_arch = "x86_64") {
        return out;
    }
    let word = |addr: u64| -> Option<u64> {
        let at = usize::try_from(addr.checked_sub(sp)?).ok()?;
        let bytes = copy.get(at..at.checked_add(8)?)?;
        Some(u64::from_ne_bytes(bytes.try_into().ok()?))
    };
    let top = sp + copy.len() as u64;
    // A record at `at`: [saved fp, return address]; the saved fp is the caller's record,
    // higher on the stack (or 0 at the outermost frame).
    let is_record = |at: u64| -> Option<u64> {
        let next = word(at)?;
        let ret = word(at + 8)?;
        let chained = next == 0 || (next > at && next < top && next.is_multiple_of(8));
        (chained && unwind::is_known_code(ret)).then_some(next)
    };
    let mut at = sp;
    while at + 16 <= top && out.len() < MAX_FP_CANDIDATES / 2 {
        let mut link = at;
        let mut good = 0;
        while good < 3 {
            match is_record(link) {
                Some(0) => {
                    good = 3;
                }
                Some(next) => {
                    good += 1;
                    link = next;
                }
                None => break,
            }
        }
        if good == 3 {
            out.push(at);
        }
        at += 8;
    }
    // Unchained records, nearest the stack pointer first (the blocked call's own frames).
    let mut at = sp;
    let near = top.min(sp.saturating_add(UNCHAINED_SCAN_BYTES));
    while at + 16 <= near && out.len() < MAX_FP_CANDIDATES {
        if !out.contains(&at) && word(at + 8).is_some_and(unwind::is_known_code) {
            out.push(at);
        }
        at += 8;
    }
    // Nearest the stack pointer first: the innermost frame that needs the frame pointer
    // (std's sleep, say) has its record just above the blocked call's own frames, while
    // a candidate further up may complete a walk through stale return addresses.
    out.sort_unstable();
    out
}

/// How far above the stack pointer unchained frame records are looked for.
const UNCHAINED_SCAN_BYTES: u64 = 4096;

/// Frame-pointer candidates tried per capture.
const MAX_FP_CANDIDATES: usize = 24;

/// The lowest frame-pointer candidate (tests).
#[cfg(test)]
fn guess_frame_pointer(sp: u64, copy: &[u8]) -> u64 {
    frame_pointer_candidates(sp, copy)
        .first()
        .copied()
        .unwrap_or(0)
}

/// The watchdog's per-tick work, separate from its thread for tests.
pub(crate) struct Scanner {
    config: WatchdogConfig,
    /// By slot index (slots are dense and never freed: a vector, no hashing per slot).
    tracked: Vec<Option<Tracked>>,
    tick: u64,
    /// The slots of this pass (kept to reuse its allocation) and where the next starts.
    slots: Vec<&'static Slot>,
    cursor: usize,
    stack: Vec<u8>,
    record: Box<SampleRecord>,
}

impl Scanner {
    pub(crate) fn new(config: WatchdogConfig) -> Scanner {
        Scanner {
            stack: vec![0; config.max_stack_bytes],
            config,
            tracked: Vec::new(),
            tick: 0,
            slots: Vec::new(),
            cursor: 0,
            record: Box::new(SampleRecord::EMPTY),
        }
    }

    /// One pass over the owned slots. The pass starts where the last one hit the cap,
    /// so with more candidates than the cap every thread gets its turn.
    pub(crate) fn tick(&mut self) {
        self.tick += 1;
        bump(&COUNTERS.ticks);
        let mut examined = 0;
        self.slots.clear();
        self.slots
            .extend(super::SamplerState::global().slots().iter());
        let count = self.slots.len();
        let start = self.cursor.min(count);
        let mut capped_at = None;
        let mut skipped = 0;
        // One clock read for the pass: `first_seen` is a lower bound of the time in the
        // root either way; looks read the clock again for their own weight.
        let pass_start = monotonic_ns();
        for position in (start..count).chain(0..start) {
            let slot = self.slots[position];
            let generation = slot.generation();
            if generation & 1 == 0 {
                continue;
            }
            let index = slot.index() as usize;
            if self.tracked.len() <= index {
                self.tracked.resize_with(index + 1, || None);
            }
            // Let go, raced a write, or outside any root: not inside the same poll.
            let Some((seq, Some(root))) = slot
                .read_cell_if_owned(generation)
                .map(|(seq, word)| (seq, word.and_then(crate::label::Label::read)))
            else {
                if let Some(mut ended) = self.tracked[index].take() {
                    ended.end_run();
                }
                continue;
            };
            let fresh = Tracked {
                generation,
                seq,
                root,
                first_seen: pass_start,
                cpu: None,
                last_look: pass_start,
                block: None,
                run: None,
                unattributed: 0,
                seen: self.tick,
            };
            let Some(tracked) = &mut self.tracked[index] else {
                self.tracked[index] = Some(fresh);
                continue;
            };
            if tracked.generation != generation || tracked.seq != seq {
                // Another root, another poll, or another thread: start over.
                tracked.end_run();
                *tracked = fresh;
                continue;
            }
            tracked.seen = self.tick;
            if examined >= self.config.max_threads_per_tick {
                capped_at.get_or_insert(position);
                skipped += 1;
                continue;
            }
            examined += 1;
            let now = monotonic_ns();
            let config = &self.config;
            let look = Look {
                slot,
                generation,
                seq,
                now,
                threshold: u64::try_from(config.threshold.as_nanos()).unwrap_or(u64::MAX),
            };
            look.examine(tracked, &mut self.stack, &mut self.record);
        }
        if let Some(position) = capped_at {
            self.cursor = position;
        }
        COUNTERS
            .examined
            .fetch_add(examined as u64, Ordering::Relaxed);
        COUNTERS.skipped.fetch_add(skipped, Ordering::Relaxed);
        let tick = self.tick;
        for tracked in &mut self.tracked {
            if let Some(mut ended) = tracked.take_if(|t| t.seen != tick) {
                ended.end_run();
            }
        }
    }
}

/// One examination of one thread whose record has not changed since the last tick.
struct Look<'a> {
    slot: &'a Slot,
    generation: u64,
    seq: u64,
    now: u64,
    threshold: u64,
}

impl Look<'_> {
    fn examine(&self, tracked: &mut Tracked, stack: &mut [u8], record: &mut SampleRecord) {
        let tid = self.slot.owner_tid();
        let Some(cpu) = thread_cpu_ns(tid) else {
            bump(&COUNTERS.read_failed);
            return;
        };
        // The tick read the record before the tid and the clock: the slot may have been
        // let go and claimed by another thread in between (a new generation), and the tid
        // and clock just read be that thread's. Only an unchanged record vouches for them.
        if !self.still_current() {
            return;
        }
        let (last_cpu, last_look) = (tracked.cpu, tracked.last_look);
        tracked.cpu = Some(cpu);
        tracked.last_look = self.now;
        let Some(last_cpu) = last_cpu else {
            return;
        };
        let wall = self.now.saturating_sub(last_look);
        let ran = cpu.saturating_sub(last_cpu);
        if ran != 0 {
            // It ran: whatever stack was taken may be gone.
            tracked.block = None;
        } else if let Some(block) = &tracked.block {
            // No CPU time since the stack was taken: not one instruction ran, so the same
            // block, the same stack, blocked the whole time since the last look.
            push(BlockedRecord {
                root: Some(tracked.root),
                delay_ns: wall,
                first_look: false,
                syscall: block.syscall,
                frames: block.frames.clone(),
                truncated: block.truncated,
            });
            return;
        }
        // Mostly running since the last look (or preempted: then the syscall file says
        // "running" below): not blocked. Short blocks in a row (a loop of small
        // synchronous reads, 1 ms naps) leave the clock nearly still and count.
        if ran.saturating_mul(OFF_CPU_RATIO) > wall {
            tracked.end_run();
            return;
        }
        if self.now.saturating_sub(tracked.first_seen) < self.threshold {
            return;
        }
        let Some(block) = self.capture(tid, cpu, stack, record) else {
            tracked.unattributed = tracked.unattributed.saturating_add(wall - ran);
            return;
        };
        push(BlockedRecord {
            root: Some(tracked.root),
            delay_ns: (wall - ran).saturating_add(std::mem::take(&mut tracked.unattributed)),
            first_look: tracked.run.is_none(),
            syscall: block.syscall,
            frames: block.frames.clone(),
            truncated: block.truncated,
        });
        tracked.run = Some(block.clone());
        tracked.block = Some(block);
    }

    /// Whether the slot's owner and record are still the ones the tick saw.
    fn still_current(&self) -> bool {
        self.slot
            .read_cell_if_owned(self.generation)
            .is_some_and(|(seq, _)| seq == self.seq)
    }

    /// Takes the stack of a thread seen off-CPU inside the root: its syscall line, a copy
    /// of its stack, the checks that it did not wake meanwhile, then an unwind of the copy.
    fn capture(
        &self,
        tid: libc::pid_t,
        cpu: u64,
        stack: &mut [u8],
        record: &mut SampleRecord,
    ) -> Option<Block> {
        let call = match read_syscall(tid) {
            Some(SyscallState::InSyscall(call)) => call,
            Some(SyscallState::Running) => return None,
            Some(SyscallState::Blocked { .. }) => {
                bump(&COUNTERS.not_in_syscall);
                return None;
            }
            None => {
                bump(&COUNTERS.read_failed);
                return None;
            }
        };
        let bounds = self.slot.stack();
        if call.sp < bounds.lo || call.sp >= bounds.hi {
            bump(&COUNTERS.not_in_syscall);
            return None;
        }
        let want = usize::try_from(bounds.hi - call.sp)
            .unwrap_or(usize::MAX)
            .min(stack.len());
        let Some(copied) = copy_own_memory(call.sp, &mut stack[..want]) else {
            bump(&COUNTERS.read_failed);
            return None;
        };
        // Still the same block? The syscall line and the copy are one moment only if the
        // thread ran no instruction from before the line was read until the copy ended.
        // Checked before unwinding (which works on the copy alone and takes far longer
        // than the copy) so that a thread blocking in many short calls is rarely caught
        // waking inside the window.
        let same = read_syscall(tid) == Some(SyscallState::InSyscall(call))
            && thread_cpu_ns(tid) == Some(cpu)
            && self.still_current();
        if !same {
            bump(&COUNTERS.discarded_woke);
            return None;
        }
        let copy = &stack[..copied];
        let mut regs = Registers {
            pc: call.pc,
            sp: call.sp,
            fp: 0,
            #[cfg(target_arch = "aarch64")]
            lr: 0,
        };
        // Each candidate frame pointer is tried (then none): the first whose walk reaches
        // the thread's outermost frame wins, else the deepest walk. A wrong one derails
        // the walk at the first frame that needs it, into stale return addresses.
        let mut best = (0u64, 0usize, WalkEnd::Truncated);
        let mut last_fp = None;
        for fp in frame_pointer_candidates(call.sp, copy)
            .into_iter()
            .chain(std::iter::once(0))
        {
            regs.fp = fp;
            let end = unwind::walk_copy(&regs, copy, record);
            last_fp = Some(fp);
            if end == WalkEnd::Complete {
                best = (fp, usize::from(record.depth), end);
                break;
            }
            if usize::from(record.depth) > best.1 {
                best = (fp, usize::from(record.depth), end);
            }
        }
        let end = if last_fp == Some(best.0) {
            best.2
        } else {
            regs.fp = best.0;
            unwind::walk_copy(&regs, copy, record)
        };
        bump(&COUNTERS.captures);
        Some(Block {
            frames: Arc::from(record.frames()),
            truncated: end != WalkEnd::Complete,
            syscall: call.nr,
        })
    }
}

#[cfg(test)]
mod tests;
