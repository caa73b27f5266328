//! Threads that never register: found by a scan of `/proc/self/task` and given a timer.
//!
//! A thread registers itself when it first enters a span, calls
//! [`register_current_thread`](super::register_current_thread) or runs the runtime hooks. A
//! thread that never does (a `spawn_blocking` closure run without the request span, a
//! thread pool of the user's, a C library's thread) would burn CPU no profile holds. So
//! the collector scans the process's threads every [`SCAN_EVERY`] and adopts each one it
//! has not seen: it claims a slot for it and arms a timer on that thread's CPU clock
//! (`timer_create` takes another thread's clock id and `SIGEV_THREAD_ID` within one
//! process), so its samples are taken by the same handler, unlabelled.
//!
//! ```text
//!  collector, every second                         thread T (never registered)
//!  /proc/self/task: T new, not excluded,
//!    SIGPROF not blocked (SigBlk)
//!  claim slot (adopted), map its stack + copy buffer
//!  timer_create(clock of T, SIGEV_THREAD_ID → T) ──► SIGPROF on T: handler
//!                                                      first signal: no alternate stack?
//!                                                        install the slot's
//!                                                      copy [sp, sp + 64 KiB) (process_vm_readv)
//!                                                      walk the copy on the slot's stack
//!  T gone from /proc (or its start time changed):
//!    take the slot, delete the timer, release it
//! ```
//!
//! **What differs from a registered thread.** The handler does not know the thread's
//! stack bounds (`pthread_getattr_np` answers only for the calling thread), so it copies
//! the stack with `process_vm_readv`, which stops at the end of the mapping instead of
//! faulting, and walks the copy (`handler::walk_adopted`). It cannot give the thread an
//! alternate stack before the first signal: that one puts the kernel's frame on the
//! thread's own stack (or std's small alternate stack), and installs the slot's if the
//! thread has none. A walk that would start on a small stack is moved onto the slot's
//! (x86_64; elsewhere it runs in place only with room, else the sample keeps its pc). The
//! thread has no span context record the handler could read: its samples carry no span,
//! which is true of it (a thread that enters a span registers itself, below).
//!
//! **Never two timers on one thread.** The scan claims an adoption held (`ADOPTING` in
//! `slots.rs`): the thread cannot take it back until its timer is armed with the value of
//! that claim. Then the scan lets go of it, fences and looks for a slot the thread
//! registered meanwhile, deleting the adoption's timer if there is one
//! ([`publish_adoption`]). A thread that registers itself takes its adoptions back before
//! it claims and again after it published its own timer, fenced likewise ([`take_back`]):
//! the timer is deleted, the slot's alternate stack disabled if the handler installed it,
//! and the slot released on the thread itself. Both sides look after publishing, so at
//! least one sees the other; [`Slot::take_adopted`] lets exactly one let the slot go. The
//! scan holds an adoption the same way whenever it changes its timer later (a sampler
//! restarted arms it again; a thread found registered or excluded loses it).
//!
//! **Who releases.** Only the slot's thread may release a slot while it lives: a handler
//! may be running on it. The scan releases an adoption only once its thread is gone: no
//! thread has the tid (`tgkill` with no signal answers `ESRCH`: a listing of
//! `/proc/self/task` can miss a live thread while others exit, so absence from it is
//! never taken as proof), or the tid names a thread with another start time (read every
//! tenth scan; a start time that could not be read proves nothing). A thread that has
//! exited runs no handler. Until then an adoption the scan gives up only loses its timer.
//!
//! **Left out.** The crate's own threads (`collector::own_thread`, and by name,
//! `otel-profiling*`: the OTLP gRPC runtime's workers), the request threads of the
//! crate's HTTP clients ([`declining_client_threads`]), threads that declined sampling
//! because they run in OpenTelemetry's suppressed scope (noted when they enter a span,
//! [`decline_current_thread`], and recognised by name, `OpenTelemetry.*`, when they never
//! do), and threads that block `SIGPROF` (counted once, at the second scan that sees it:
//! a new thread starts with every signal blocked). Threads that live less than a scan
//! period may never be seen.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering as Counter};
use std::time::{Duration, Instant};

use super::altstack;
use super::slots::{Owner, Slot, SlotTable};
use super::stack::StackBounds;
use super::{arm_timer, SamplerState};
use crate::sync::{fence, Ordering};

/// How often the process's threads are listed.
pub(crate) const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Adoptions a scan makes at most (the rest wait for the next scan): bounds a scan's
/// work after a burst of thread creation.
const MAX_ADOPTIONS_PER_SCAN: usize = 256;

/// Scans between two reads of every adopted thread's start time (a tid reused by a new
/// thread within one scan period needs the kernel's pid counter to wrap meanwhile).
const START_TIME_EVERY: u32 = 10;

/// Threads adopted so far.
static ADOPTED: AtomicU64 = AtomicU64::new(0);
/// Adopted threads found gone and released.
static GONE: AtomicU64 = AtomicU64::new(0);
/// Threads left out because they block `SIGPROF`, once per thread a scan saw.
static BLOCKING: AtomicU64 = AtomicU64::new(0);
/// Adoptions that failed (no slot, no memory, a timer refused).
static FAILED: AtomicU64 = AtomicU64::new(0);
/// Threads that declined sampling when [`DECLINED`] was full.
static DECLINED_UNRECORDED: AtomicU64 = AtomicU64::new(0);

/// Tids of live threads that declined sampling (suppressed scope; 0: free).
static DECLINED: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];

/// Adoption counters since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AdoptionStats {
    pub(crate) adopted: u64,
    pub(crate) gone: u64,
    pub(crate) blocking: u64,
    pub(crate) failed: u64,
    pub(crate) declined_unrecorded: u64,
}

pub(crate) fn stats() -> AdoptionStats {
    AdoptionStats {
        adopted: ADOPTED.load(Counter::Relaxed),
        gone: GONE.load(Counter::Relaxed),
        blocking: BLOCKING.load(Counter::Relaxed),
        failed: FAILED.load(Counter::Relaxed),
        declined_unrecorded: DECLINED_UNRECORDED.load(Counter::Relaxed),
    }
}

/// The calling thread runs in OpenTelemetry's suppressed scope: never adopt it. Past 64
/// such threads alive at once, later ones are recognised by name only (and counted in
/// `declined_unrecorded`: one whose name says nothing is adopted, its CPU sampled
/// unlabelled).
pub(crate) fn decline_current_thread() {
    // SAFETY: gettid has no preconditions.
    decline(unsafe { libc::gettid() });
    // Its allocations are the telemetry's too.
    crate::allocations::exclude_current_thread();
}

/// Runs `build`, which starts an HTTP client of the crate's (reqwest's blocking client
/// runs its requests on a thread of its own, `reqwest-internal-sync-runtime`), and
/// declines the threads of that name it started: their CPU is the telemetry's.
#[cfg_attr(
    not(any(feature = "pyroscope", feature = "otlp-http")),
    allow(dead_code)
)]
pub(crate) fn declining_client_threads<T>(build: impl FnOnce() -> T) -> T {
    let before = threads().unwrap_or_default();
    let built = build();
    for tid in threads().unwrap_or_default().difference(&before) {
        let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"));
        if name.is_ok_and(|n| n.starts_with("reqwest-")) {
            decline(*tid);
        }
    }
    built
}

pub(super) fn decline(tid: libc::pid_t) {
    if DECLINED.iter().any(|t| t.load(Counter::Relaxed) == tid) {
        return;
    }
    let recorded = DECLINED.iter().any(|t| {
        t.compare_exchange(0, tid, Counter::AcqRel, Counter::Relaxed)
            .is_ok()
    });
    if !recorded {
        DECLINED_UNRECORDED.fetch_add(1, Counter::Relaxed);
    }
}

pub(super) fn declined(tid: libc::pid_t) -> bool {
    DECLINED.iter().any(|t| t.load(Counter::Acquire) == tid)
}

/// On the thread registering itself: takes back every live adoption of it (see the module
/// docs). Returns whether an alternate stack of an adoption was disabled.
pub(crate) fn take_over_current_thread(state: &SamplerState) -> bool {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut disabled = false;
    take_back(&state.slots, tid, |slot| {
        match altstack::disable_adopted(slot.index()) {
            Some(was) => {
                disabled |= was;
                true
            }
            // Its stack is in use (a handler of the thread's own runs on it): the slot stays
            // the thread's until it is gone, when the scan releases it.
            None => false,
        }
    });
    disabled
}

/// The registering side of the handshake, on thread `tid` after it published its own
/// slot and timer (or before it claims one): every live adoption of `tid` this takes
/// ([`Slot::take_adopted`]) loses its timer and, if `may_release` says so, is released
/// (on the slot's own thread: no handler of it runs now); else it goes back to being an
/// adoption, without a timer, that the scan releases once the thread is gone.
pub(crate) fn take_back(
    table: &SlotTable,
    tid: libc::pid_t,
    mut may_release: impl FnMut(&Slot) -> bool,
) {
    // Publish, then look: pairs with the fence in `publish_adoption`.
    fence(Ordering::SeqCst);
    for slot in table.iter() {
        if slot.is_adoption_of(tid) && slot.take_adopted() {
            slot.delete_timer();
            if may_release(slot) {
                table.release(slot);
            } else {
                slot.untake_adopted();
            }
        }
    }
}

/// The scanning side of the handshake: lets go of the adoption `slot` of `tid` that the
/// scan held while it armed (or deleted) its timer, then, if the thread registered a slot
/// of its own meanwhile, deletes the adoption's timer (the slot stays until the thread is
/// gone). Returns whether it gave way.
pub(crate) fn publish_adoption(table: &SlotTable, slot: &Slot, tid: libc::pid_t) -> bool {
    slot.let_go_of_adoption();
    // Publish, then look: pairs with the fence in `take_back`.
    fence(Ordering::SeqCst);
    let registered = table
        .iter()
        .any(|s| !std::ptr::eq(s, slot) && !s.is_adopted() && s.is_live() && s.owner_tid() == tid);
    if registered {
        slot.delete_timer();
    }
    registered
}

/// Whether no thread `tid` exists in this process now (`tgkill` with no signal: `ESRCH`).
/// A listing of `/proc/self/task` can miss a live thread while others exit (the
/// directory is read by position), so absence from one is never taken as proof.
fn is_gone(tid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the thread exists; nothing is sent.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// In a forked child: the parent's declined threads do not exist there. Only atomics.
pub(crate) fn after_fork_in_child() {
    for slot in &DECLINED {
        slot.store(0, Counter::Relaxed);
    }
}

/// The kernel's clock id for thread `tid`'s CPU clock (`!tid << 3 | PERTHREAD | SCHED`,
/// what `pthread_getcpuclockid` computes).
fn thread_clock(tid: libc::pid_t) -> libc::clockid_t {
    ((!tid) << 3) | 6
}

/// A thread's start time (`/proc/self/task/<tid>/stat`, field 22, clock ticks since boot).
fn start_time(tid: libc::pid_t) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether thread `tid` blocks `SIGPROF` (`SigBlk` in its status).
fn blocks_sigprof(tid: libc::pid_t) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
    let mask = u64::from_str_radix(mask.trim(), 16).ok()?;
    Some(mask & 1 << (libc::SIGPROF - 1) != 0)
}

/// Whether thread `tid` is one the sampler leaves alone: the crate's own, one that
/// declined, or one of the OpenTelemetry SDK's (by name).
fn excluded(tid: libc::pid_t) -> bool {
    crate::collector::is_own_thread(tid)
        || declined(tid)
        || std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .is_ok_and(|name| telemetry_name(name.as_bytes()))
}

/// Whether a thread of this name is telemetry's: the SDK's batch threads, and the
/// crate's own (the OTLP gRPC runtime's workers run in the suppressed scope without
/// entering a span).
fn telemetry_name(name: &[u8]) -> bool {
    name.starts_with(b"OpenTelemetry") || name.starts_with(b"otel-profiling")
}

/// [`excluded`] for the calling thread, without allocating (for the allocator's hook):
/// two system calls (`gettid`, `prctl(PR_GET_NAME)`) and atomics.
pub(crate) fn excluded_here() -> bool {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut name = [0u8; 16];
    crate::collector::is_own_thread(tid)
        || declined(tid)
        // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into `name`.
        || unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr() as libc::c_ulong) } == 0
            && telemetry_name(&name)
}

/// The process's threads now.
pub(crate) fn threads() -> Option<HashSet<libc::pid_t>> {
    let dir = std::fs::read_dir("/proc/self/task").ok()?;
    Some(
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
    )
}

/// What a scan did (tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    pub(crate) adopted: usize,
    pub(crate) released: usize,
    pub(crate) disarmed: usize,
    pub(crate) rearmed: usize,
}

/// The collector's scanner: when to scan next, and the start time of each adoption.
pub(crate) struct Adopter {
    next: Instant,
    scans: u32,
    /// Slot index → (generation, the thread's start time) of each adoption this scanner
    /// knows.
    adoptions: HashMap<u32, (u64, Option<u64>)>,
    /// Threads seen blocking `SIGPROF`, with how many scans saw them so (a thread is
    /// counted once, at the second).
    blocking: HashMap<libc::pid_t, u32>,
}

impl Default for Adopter {
    fn default() -> Self {
        Adopter::new()
    }
}

impl Adopter {
    pub(crate) fn new() -> Adopter {
        Adopter {
            next: Instant::now(),
            scans: 0,
            adoptions: HashMap::new(),
            blocking: HashMap::new(),
        }
    }

    /// Scans if [`SCAN_EVERY`] has passed since the last scan.
    pub(crate) fn scan_if_due(&mut self) {
        let now = Instant::now();
        if now >= self.next {
            self.next = now + SCAN_EVERY;
            self.scan();
        }
    }

    /// Lists the process's threads, adopts the new ones, releases adoptions whose
    /// threads are gone.
    pub(crate) fn scan(&mut self) -> Scan {
        self.scan_listed(threads)
    }

    /// [`scan`](Self::scan) over the listing `list` gives (tests give one that misses a
    /// live thread, as a listing of `/proc/self/task` can while others exit).
    pub(crate) fn scan_listed(
        &mut self,
        list: impl FnOnce() -> Option<HashSet<libc::pid_t>>,
    ) -> Scan {
        let mut scan = Scan::default();
        let state = SamplerState::global();
        let Some(run) = state.running_run() else {
            return scan;
        };
        let Some(tids) = list() else {
            return scan;
        };
        self.scans = self.scans.wrapping_add(1);
        let check_start = self.scans.is_multiple_of(START_TIME_EVERY);
        let hz = u64::from(state.frequency_hz.load(Counter::Relaxed).max(1));
        // Who holds a slot now: threads registered, and adoptions.
        let mut registered = HashSet::new();
        let mut adoptions: Vec<&'static Slot> = Vec::new();
        for slot in state.slots.iter() {
            if !slot.is_live() {
                continue;
            }
            if slot.is_adopted() {
                adoptions.push(slot);
            } else {
                registered.insert(slot.owner_tid());
            }
        }
        let mut held: HashSet<libc::pid_t> = registered.clone();
        for slot in adoptions {
            let tid = slot.owner_tid();
            held.insert(tid);
            let generation = slot.generation();
            let known = self
                .adoptions
                .entry(slot.index())
                .or_insert((generation, None));
            if known.0 != generation {
                *known = (generation, None);
            }
            if known.1.is_none() {
                known.1 = start_time(tid);
            }
            // Gone: no thread has the tid now, or the tid names a thread that started at
            // another time. Never on a listing's word alone, nor on a start time that
            // could not be read (see `is_gone`).
            let reused = check_start
                && known
                    .1
                    .zip(start_time(tid))
                    .is_some_and(|(then, now)| then != now);
            let gone = reused || (!tids.contains(&tid) && is_gone(tid));
            if gone {
                // Its thread has exited: no handler of it can run (see the module docs).
                if slot.take_adopted() {
                    slot.delete_timer();
                    state.slots.release(slot);
                    self.adoptions.remove(&slot.index());
                    GONE.fetch_add(1, Counter::Relaxed);
                    scan.released += 1;
                    held.remove(&tid);
                }
                continue;
            }
            let unwanted = registered.contains(&tid) || excluded(tid);
            if unwanted == slot.has_timer() && slot.hold_adoption() {
                // Held: the thread cannot take it back while its timer changes.
                if unwanted {
                    slot.delete_timer();
                    scan.disarmed += 1;
                } else {
                    // A sampler stopped and started again: the adoption gets a new timer.
                    match arm_timer(slot, thread_clock(tid), tid, hz) {
                        Ok(timer) => {
                            slot.set_timer(timer);
                            if state.running_run() != Some(run) {
                                slot.delete_timer();
                            }
                            scan.rearmed += 1;
                        }
                        Err(_) => {
                            FAILED.fetch_add(1, Counter::Relaxed);
                        }
                    }
                }
                publish_adoption(&state.slots, slot, tid);
            }
        }
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let mut new: Vec<libc::pid_t> = tids
            .iter()
            .copied()
            .filter(|tid| *tid != me && !held.contains(tid))
            .collect();
        new.sort_unstable();
        for tid in new {
            if scan.adopted >= MAX_ADOPTIONS_PER_SCAN {
                break;
            }
            if excluded(tid) {
                continue;
            }
            match blocks_sigprof(tid) {
                Some(false) => {}
                Some(true) => {
                    // Counted at its second sighting: a new thread starts with every
                    // signal blocked until it runs.
                    let seen = self.blocking.entry(tid).or_insert(0);
                    *seen = seen.saturating_add(1);
                    if *seen == 2 {
                        BLOCKING.fetch_add(1, Counter::Relaxed);
                    }
                    continue;
                }
                // Gone meanwhile.
                None => continue,
            }
            if self.adopt(state, run, tid, hz) {
                scan.adopted += 1;
            }
        }
        self.blocking.retain(|tid, _| tids.contains(tid));
        // Forget the declined threads that are gone (their tids may come back).
        for slot in &DECLINED {
            let tid = slot.load(Counter::Acquire);
            if tid != 0 && !tids.contains(&tid) && is_gone(tid) {
                let _ = slot.compare_exchange(tid, 0, Counter::AcqRel, Counter::Relaxed);
            }
        }
        scan
    }

    /// How many scans saw thread `tid` blocking `SIGPROF` (tests).
    #[cfg(test)]
    pub(crate) fn blocking_sightings(&self, tid: libc::pid_t) -> u32 {
        self.blocking.get(&tid).copied().unwrap_or(0)
    }

    /// Claims a slot for thread `tid` and arms its timer.
    fn adopt(&mut self, state: &'static SamplerState, run: u64, tid: libc::pid_t, hz: u64) -> bool {
        let started = start_time(tid);
        // Also tells that the thread (still) exists in this process.
        let Some(cpu_ns) = super::watchdog::thread_cpu_ns(tid) else {
            return false;
        };
        // Claimed held (`ADOPTING`): the thread cannot take it back before its timer is
        // armed, so the timer's value names this claim's generation.
        let Some(slot) = state.slots.claim(Owner {
            tid,
            cell: std::ptr::null(),
            stack: StackBounds { lo: 0, hi: 0 },
            ring_capacity: state.ring_capacity.load(Counter::Relaxed).max(1),
            // The hook runs on the thread and finds only its own registration.
            alloc_capacity: 0,
            cpu_ns,
            adopted: true,
        }) else {
            FAILED.fetch_add(1, Counter::Relaxed);
            return false;
        };
        let armed = altstack::prepare_adopted(slot.index())
            .then(|| arm_timer(slot, thread_clock(tid), tid, hz).ok())
            .flatten();
        let Some(timer) = armed else {
            // No timer was ever armed for it and it is held: no signal names the slot and
            // no thread takes it, so it can go back from here.
            state.slots.release(slot);
            FAILED.fetch_add(1, Counter::Relaxed);
            return false;
        };
        slot.set_timer(timer);
        if state.running_run() != Some(run) {
            slot.delete_timer();
        }
        self.adoptions
            .insert(slot.index(), (slot.generation(), started));
        // A slot the thread registered itself meanwhile wins.
        if publish_adoption(&state.slots, slot, tid) {
            return false;
        }
        ADOPTED.fetch_add(1, Counter::Relaxed);
        true
    }
}
