//! Wall time, CPU time and run delay a thread spends inside a local root, measured at the
//! thread's root transitions.
//!
//! The span context record changes only when the thread moves to another local root (or
//! to none): entering a child span of the same root, or polling the same root's future
//! again right after, writes nothing. Those transitions are where the clock is read: one
//! read of the active-time clock (`clock::ticks`: the TSC where the kernel keeps time with
//! it, ~10 ns, else `CLOCK_MONOTONIC` through the vDSO, ~25 ns; never a syscall) closes
//! the stretch being left (a root, or no root) and opens the next. Switches between roots
//! without counters (no sampler, no evidence processor, an unsampled trace) read nothing:
//! for this module such a root is no root.
//!
//! **Stretches, long and short.** A stretch that lasted at least [`LONG_NS`] (250 µs) is
//! read exactly where it ends: the thread's CPU clock and its run delay (`own_clocks`,
//! ~1 µs), against the reading at the end of the last long stretch. A shorter stretch
//! reads nothing: it counts as on CPU for its whole wall time and as no run delay. So:
//!
//! * a stretch that was preempted is long (it waited at least another thread's slice),
//!   so run delay is always read where it happens, on roots of any length;
//! * the reading of a long stretch covers the short stretches since the last reading
//!   too: their wall time (counted as CPU) is taken off the CPU time read, and their run
//!   delay, if any, is counted to the long stretch. The error is below [`LONG_NS`] per
//!   short stretch: what it spent off CPU (given to the short stretch as CPU, taken from
//!   the next long one), and its run delay (given to the next long stretch);
//! * the cost is ~1 ns (a compare and two stores) per short stretch; per long one, the
//!   CPU clock and `getpid` (~1.1 µs of CPU on the project's VM, ≤ 0.45 % of the
//!   shortest long stretch), and only where the stretch was not on CPU all along (run
//!   delay grows only then) one `pread` of the kept schedstat file (~2 µs more, taken
//!   from a stretch that was waiting anyway). 250 µs rather than 1 ms: a poll that blocks for less than the
//!   threshold (a short `fsync`, a briefly contended mutex) counts as CPU, so the
//!   threshold is the error a blocking root can carry per poll; at 1 ms, roots that block
//!   for a few hundred microseconds per poll read 15 % too much CPU against the
//!   reference (the accuracy tests), at 250 µs within 10 %.
//! * no other thread and no signal gives CPU time or run delay to a root: a root's CPU is
//!   its own stretches', never a charge that found the thread holding it.
//!
//! What is measured: from the moment a thread's record names the root until it names
//! something else. That covers running, being preempted, and blocking inside a poll (a
//! `std::thread::sleep`, a contended `std::sync::Mutex`, a synchronous read) — the thread
//! is held by the root the whole time. It does not cover time the root's futures spend
//! suspended, since no thread is inside the root then.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::own_clocks::{self, Reading};
use crate::clock;
use crate::label::{word_of, Label, CPU_BIT};
use crate::root_cpu::ActiveCounter;

/// Stretches at least this long are read exactly (see the module docs).
pub(crate) const LONG_NS: u64 = 250_000;

/// [`LONG_NS`], or what a benchmark set (`set_long_ns`).
static LONG_NS_NOW: AtomicU64 = AtomicU64::new(LONG_NS);
/// A stretch shorter than this many ticks is short whatever the clock: the TSC runs at
/// 0.5 GHz or more, and `CLOCK_MONOTONIC` counts nanoseconds, so it is under the threshold
/// either way; only longer ones convert their ticks to compare (a multiply).
static SURELY_SHORT_TICKS: AtomicU64 = AtomicU64::new(LONG_NS / 2);

/// Sets the threshold of a long stretch (benchmarks: under valgrind a program runs ~50
/// times slower, so at the real threshold every poll would read the clocks).
#[cfg_attr(not(feature = "test-support"), allow(dead_code))]
pub(crate) fn set_long_ns(ns: u64) {
    LONG_NS_NOW.store(ns, Ordering::Relaxed);
    SURELY_SHORT_TICKS.store(ns / 2, Ordering::Relaxed);
}

#[inline(always)]
fn surely_short(wall: u64) -> bool {
    wall < SURELY_SHORT_TICKS.load(Ordering::Relaxed)
}

/// The thread's open stretch, the counters of the root it left last, and the last reading.
struct Stretch {
    /// When the stretch now open began (`clock::ticks`; 0: the thread has made no
    /// transition with counters yet).
    entered_at: Cell<u64>,
    /// The word of the root whose counters `cpu` holds (0: none yet). A root's counters
    /// never change and a word is never handed out twice, so the next stretch of the same
    /// root (the next poll of its future) does not read its label slot or look its
    /// counters up again; counters whose root ended refuse the add by their own
    /// generation.
    word: Cell<u64>,
    cpu: Cell<Option<ActiveCounter>>,
    /// The thread's clocks at the end of the last long stretch (`None`: never read, or
    /// the read failed).
    last: Cell<Option<Reading>>,
    /// Ticks of the short stretches since `last`, counted as on CPU.
    short_since: Cell<u64>,
    /// Ticks the thread spent parked by its runtime since `last` (the runtime's park
    /// hooks, [`parked`] and [`unparked`]): off CPU, in no root.
    parked: Cell<u64>,
    /// When the thread parked (0: not parked).
    parked_at: Cell<u64>,
}

thread_local! {
    // `const`, no destructor: usable from any hook, even during thread teardown.
    static STRETCH: Stretch = const {
        Stretch {
            entered_at: Cell::new(0),
            word: Cell::new(0),
            cpu: Cell::new(None),
            last: Cell::new(None),
            short_since: Cell::new(0),
            parked: Cell::new(0),
            parked_at: Cell::new(0),
        }
    };
}

/// The calling thread's runtime parks it (tokio's `on_thread_park`): until
/// [`unparked`], it is off CPU outside any root. Two clock reads a park, no system call.
pub(crate) fn parked() {
    let _ = STRETCH.try_with(|stretch| stretch.parked_at.set(clock::ticks()));
}

/// The calling thread's runtime unparked it (tokio's `on_thread_unpark`): the time since
/// [`parked`] is counted as off CPU before any long stretch's own (see [`exact`]).
pub(crate) fn unparked() {
    let _ = STRETCH.try_with(|stretch| {
        let at = stretch.parked_at.replace(0);
        if at != 0 {
            let parked = clock::ticks().saturating_sub(at);
            stretch
                .parked
                .set(stretch.parked.get().saturating_add(parked));
        }
    });
}

/// Whether either word names a root with CPU counters (read from the words' bits).
#[inline(always)]
pub(super) fn has_counters(from: Option<Label>, to: Option<Label>) -> bool {
    // One or and one test of the sign bit (the CPU bit is bit 63; `None` is 0).
    (word_of(from) | word_of(to)) & CPU_BIT != 0
}

/// The thread's record goes from the label `from` to the label `to` (two different words).
/// Only the words' CPU bits are looked at unless one of them has counters: a switch
/// between roots without counters reads neither the clock nor a slot.
#[inline]
pub(super) fn transition(from: Option<Label>, to: Option<Label>) {
    let from_cpu = from.filter(|l| l.has_cpu());
    let to_cpu = to.filter(|l| l.has_cpu());
    if from_cpu.is_none() && to_cpu.is_none() {
        return;
    }
    transition_cpu(from_cpu);
}

/// The thread has just resolved the root `label` with the counters `cpu` (a
/// [`CpuHandle::to_raw`](crate::root_cpu::CpuHandle::to_raw)) and is about to enter it:
/// its stretch keeps them now, so that the root's first exit finds them as every later
/// one does, instead of reading the label slot.
#[inline]
pub(crate) fn keep_counters(label: Label, cpu: u128) {
    let counter = ActiveCounter::of(cpu);
    let _ = STRETCH.try_with(|stretch| {
        stretch.word.set(label.word());
        stretch.cpu.set(counter);
    });
}

/// The thread enters a root with counters at `now` from no root, if the stretch of no
/// root it leaves was short: false, having changed nothing, otherwise (the caller then
/// makes the whole [`transition`], which reads the thread's clocks).
#[inline(always)]
pub(super) fn entered_at(now: u64) -> bool {
    STRETCH.with(|stretch| {
        let wall = now.wrapping_sub(stretch.entered_at.get());
        if !surely_short(wall) || reference::on() {
            return false;
        }
        stretch
            .short_since
            .set(stretch.short_since.get().saturating_add(wall));
        stretch.entered_at.set(now);
        true
    })
}

/// The thread leaves `from`, a root with counters, for no root at `now`, if the thread's
/// stretch holds `from`'s counters (the next poll of the same root) and the stretch was
/// short: false, having changed nothing, otherwise (the caller then makes the whole
/// [`transition`]).
#[inline(always)]
pub(super) fn left_at(from: Label, now: u64) -> bool {
    STRETCH.with(|stretch| {
        if stretch.word.get() != from.word() {
            return false;
        }
        let wall = now.wrapping_sub(stretch.entered_at.get());
        if !surely_short(wall) || reference::on() {
            return false;
        }
        if let Some(cpu) = stretch.cpu.get() {
            cpu.add(wall);
        }
        stretch
            .short_since
            .set(stretch.short_since.get().saturating_add(wall));
        stretch.entered_at.set(now);
        true
    })
}

#[inline]
fn transition_cpu(from: Option<Label>) {
    // `try_with`: a thread-local destructor may end a scope after this one is gone.
    let _ = STRETCH.try_with(|stretch| {
        let counter = from.and_then(|from| {
            if stretch.word.get() == from.word() {
                stretch.cpu.get()
            } else {
                // A root whose label was released reads as 0: nothing is added.
                let cpu = ActiveCounter::of(from.cpu_raw());
                stretch.word.set(from.word());
                stretch.cpu.set(cpu);
                cpu
            }
        });
        let opened = stretch.entered_at.get();
        // The reference reads before the clock that ends the stretch, as the long path
        // below does.
        let reference = reference::read(if opened == 0 { None } else { counter });
        let now = clock::ticks();
        if opened == 0 {
            // The thread's first transition with counters: no stretch to close, a
            // reading to start from; the stretch starts before it, as after a long one.
            stretch.last.set(reference.or_else(own_clocks::read));
            stretch.entered_at.set(now);
            return;
        }
        let wall = now.saturating_sub(opened);
        let long =
            !surely_short(wall) && clock::ticks_to_ns(wall) >= LONG_NS_NOW.load(Ordering::Relaxed);
        if !long {
            if let Some(counter) = counter {
                counter.add(wall);
            }
            stretch
                .short_since
                .set(stretch.short_since.get().saturating_add(wall));
            stretch.entered_at.set(now);
            return;
        }
        let last = stretch.last.get();
        let short = stretch.short_since.get();
        let parked = stretch.parked.get();
        // The real timing reads for itself even beside the reference (a few microseconds
        // later, inside the same stretch), so that what is measured is what it does.
        let _ = reference;
        // The stretch ends before the clocks are read, and the next one starts there. A
        // preemption let in by the reading's own system calls lands, on Linux 6.18, at
        // their return, after the run delay was read: with the stretch ending after the
        // reading, its wait was in the wall time and in no run delay (a 1 ms CPU poll
        // beside busy loops read 0.4–10 ms blocked; the fan-out 34–39 % blocked). Now
        // such a wait is in the next stretch's wall and in the next reading's run delay;
        // one that lands before the delay is read is carried to the next reading
        // ([`carry_delay`]).
        let cpu = own_clocks::cpu();
        let pid = own_clocks::pid();
        // Run delay only grows while the thread is off CPU: a stretch that was on
        // CPU all along (within the clocks' jitter) had none, and keeps the last
        // delay reading (~2 µs saved, the pread). Its delay since then, if any,
        // was in short stretches, and goes to the next stretch that reads it.
        let on_cpu_all_along = match (last, cpu) {
            (Some(last), Some(cpu)) if last.pid == pid => {
                let ran = cpu.saturating_sub(last.cpu_ns);
                let wall_ns = clock::ticks_to_ns(wall).saturating_add(clock::ticks_to_ns(short));
                ran.saturating_add(ON_CPU_SLACK_NS + wall_ns / 100) >= wall_ns
            }
            _ => false,
        };
        let delay = match (on_cpu_all_along, last) {
            (true, Some(last)) if last.delay_ns.is_some() => last.delay_ns,
            _ => own_clocks::delay(pid),
        };
        let reading_ticks = clock::ticks().saturating_sub(now);
        let reading = cpu.map(|cpu_ns| Reading {
            cpu_ns,
            delay_ns: delay,
            pid,
        });
        let exact = exact(last, reading, wall, short, parked);
        if let Some(counter) = counter {
            counter.add_long(wall, exact);
        }
        let reading = carry_delay(last, reading, exact, clock::ticks_to_ns(reading_ticks));
        stretch.last.set(reading);
        stretch.short_since.set(0);
        stretch.parked.set(0);
        stretch.entered_at.set(now);
    });
}

/// How far the CPU clock may trail the wall clock over a stretch that was on CPU all
/// along (the two clocks' reads are not at one instant), on top of 1 % of the stretch.
const ON_CPU_SLACK_NS: u64 = 5_000;

/// What a long stretch of `wall` ticks spent off CPU and waiting for one, from the readings
/// at the end of the last long stretch (`last`) and at its own end (`now`), with `short`
/// ticks of short stretches between (counted as on CPU already), `parked` ticks of them
/// parked by the runtime. `None` when either reading is missing or from another process
/// (a `fork` between them); the run delay alone `None` when either reading lacks it.
///
/// Time off CPU since `last` goes first to the runtime's parks, which the park hooks
/// measured: a worker parks between polls, often for less than the threshold (a short,
/// unread stretch), and without the hooks that time is charged to the next long stretch
/// (a pure-CPU root would read its worker's sleeps as blocked). The rest goes to this
/// stretch.
fn exact(
    last: Option<Reading>,
    now: Option<Reading>,
    wall: u64,
    short: u64,
    parked: u64,
) -> Option<(u64, Option<u64>)> {
    let (last, now) = (last?, now?);
    if last.pid != now.pid {
        return None;
    }
    let wall_ns = clock::ticks_to_ns(wall);
    let elapsed = wall_ns.saturating_add(clock::ticks_to_ns(short));
    let off_total = elapsed.saturating_sub(now.cpu_ns.saturating_sub(last.cpu_ns));
    let off_parked = off_total.min(clock::ticks_to_ns(parked));
    let off_cpu = (off_total - off_parked).min(wall_ns);
    let delay = now
        .delay_ns
        .zip(last.delay_ns)
        .map(|(now, last)| now.saturating_sub(last).min(off_cpu));
    Some((off_cpu, delay))
}

/// The reading the next stretch starts from: `now`, less the run delay it holds that
/// this stretch could not (more than its time off CPU) and that may have been waited
/// while the clocks were being read (at most `reading_ns`, the reading's wall time, which
/// belongs to the next stretch). That wait is the next stretch's: it is in its wall time,
/// and now in its reading's run delay too.
fn carry_delay(
    last: Option<Reading>,
    now: Option<Reading>,
    exact: Option<(u64, Option<u64>)>,
    reading_ns: u64,
) -> Option<Reading> {
    let (Some(last), Some(mut now), Some((_, Some(used)))) = (last, now, exact) else {
        return now;
    };
    if let (Some(was), Some(is)) = (last.delay_ns, now.delay_ns) {
        let unused = is.saturating_sub(was).saturating_sub(used);
        now.delay_ns = Some(is - unused.min(reading_ns));
    }
    Some(now)
}

/// The test-only exact timing the real one is measured against: when on, every
/// transition with counters reads the thread's clocks and gives the stretch it closes
/// exactly what it spent (the shadow words of `root_cpu`), and the real timing uses the
/// same readings where it would read.
#[cfg(test)]
pub(crate) mod reference {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::own_clocks::{self, Reading};
    use crate::root_cpu::ActiveCounter;

    static ON: AtomicBool = AtomicBool::new(false);

    thread_local! {
        static LAST: Cell<Option<Reading>> = const { Cell::new(None) };
    }

    /// Turns the reference on or off for every thread.
    pub(crate) fn set(on: bool) {
        ON.store(on, Ordering::SeqCst);
    }

    #[inline(always)]
    pub(super) fn on() -> bool {
        ON.load(Ordering::Relaxed)
    }

    /// When on: reads the clocks, gives `counter` (the stretch being closed) what they
    /// moved since the thread's last transition, and returns the reading.
    pub(super) fn read(counter: Option<ActiveCounter>) -> Option<Reading> {
        if !on() {
            return None;
        }
        let now = own_clocks::read()?;
        let last = LAST.with(|l| l.replace(Some(now)));
        if let (Some(counter), Some(last)) = (counter, last) {
            counter.add_reference(
                now.cpu_ns.saturating_sub(last.cpu_ns),
                now.delay_ns
                    .unwrap_or(0)
                    .saturating_sub(last.delay_ns.unwrap_or(0)),
            );
        }
        Some(now)
    }
}

/// Outside tests, never on.
#[cfg(not(test))]
mod reference {
    use super::own_clocks::Reading;
    use crate::root_cpu::ActiveCounter;

    #[inline(always)]
    pub(super) fn on() -> bool {
        false
    }

    #[inline(always)]
    pub(super) fn read(_: Option<ActiveCounter>) -> Option<Reading> {
        None
    }
}

#[cfg(test)]
mod accuracy;

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{carry_delay, Reading};
    use crate::clock::ticks_to_ns;
    use crate::root_cpu::SlotLists;
    use crate::{LocalRoot, RootLabel, SpanContextGuard, SpanName};

    fn busy(d: Duration) {
        let start = Instant::now();
        while start.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn run_delay_a_stretch_could_not_hold_goes_to_the_next_up_to_the_reading_time() {
        let reading = |delay: u64| Reading {
            cpu_ns: 0,
            delay_ns: Some(delay),
            pid: 1,
        };
        let last = Some(reading(1_000));
        // The new reading holds 5 µs more run delay than the last. Per case: what the
        // stretch used of it (its time off CPU), the reading's wall time, and the delay
        // the next stretch starts from.
        for (used, reading_ns, next, why) in [
            (
                Some((1_000, Some(1_000))),
                3_000,
                3_000,
                "of 4 µs unused, the reading's 3 µs",
            ),
            (Some((1_000, Some(1_000))), 9_000, 2_000, "all 4 µs unused"),
            (Some((5_000, Some(5_000))), 9_000, 6_000, "all of it used"),
            (
                None,
                9_000,
                6_000,
                "nothing known of the stretch (another process)",
            ),
            (
                Some((5_000, None)),
                9_000,
                6_000,
                "no run delay read (no schedstat)",
            ),
        ] {
            let carried = carry_delay(last, Some(reading(6_000)), used, reading_ns);
            assert_eq!(carried.and_then(|r| r.delay_ns), Some(next), "{why}");
        }
    }

    /// Each stretch counts into the root the thread left, with the thread alternating
    /// between two roots (the thread keeps the counters of one), and a root whose counters
    /// were released adds nothing, not even into the next root that reuses them.
    #[test]
    fn each_stretch_counts_into_the_root_it_was_in() {
        let mut lists = SlotLists::default();
        let (a_cpu, b_cpu) = (
            lists.claim().expect("counters"),
            lists.claim().expect("counters"),
        );
        let root = |name: &str, cpu| {
            LocalRoot::claim(
                RootLabel::name_only(SpanName::intern(name)).with_cpu(cpu),
                None,
            )
        };
        let (a, b) = (root("stretch-a", a_cpu), root("stretch-b", b_cpu));
        let start = Instant::now();
        for _ in 0..3 {
            {
                let _a = SpanContextGuard::enter(Some(&a));
                busy(Duration::from_millis(2));
            }
            {
                let _b = SpanContextGuard::enter(Some(&b));
                busy(Duration::from_millis(6));
            }
        }
        let elapsed = start.elapsed().as_nanos() as u64;
        // `b` first: the free list is LIFO, so the next claim takes `a`'s slot back.
        let b_ns = ticks_to_ns(lists.release(b_cpu).active_ticks);
        let a_ns = ticks_to_ns(lists.release(a_cpu).active_ticks);
        let ms = |n: u64| n * 1_000_000;
        assert!(a_ns >= ms(6) && b_ns >= ms(18), "a {a_ns} ns, b {b_ns} ns");
        // 1 % for the two clocks' rates (TSC against the monotonic clock).
        assert!(
            a_ns + b_ns <= elapsed + elapsed / 100,
            "{a_ns} + {b_ns} > {elapsed}"
        );

        // `a`'s counters go to the next root (the slot is quiet); `a` entered again (the
        // thread may still hold its counters) adds nothing to them.
        let next = lists.claim().expect("counters");
        {
            let _a = SpanContextGuard::enter(Some(&a));
            busy(Duration::from_millis(1));
        }
        assert_eq!(lists.release(next).active_ticks, 0, "a stale root added");
    }

    /// Without the schedstat file (no `/proc`) but with the CPU clock, a root's CPU time
    /// stays exact and only its run delay is unknown.
    #[test]
    fn without_schedstat_cpu_stays_exact_and_run_delay_is_unknown() {
        use crate::root_cpu::RunDelay;
        super::own_clocks::tests::NO_SCHEDSTAT.with(|no| no.set(true));
        let mut lists = SlotLists::default();
        let cpu = lists.claim().expect("counters");
        let root = LocalRoot::claim(
            RootLabel::name_only(SpanName::intern("no-schedstat")).with_cpu(cpu),
            None,
        );
        // 2 ms of the thread's own CPU each time (not of wall time: on a loaded machine a
        // wall-clock spin is preempted for part of it).
        let cpu_burn = |d: Duration| {
            let start = super::own_clocks::cpu().unwrap_or(0);
            while super::own_clocks::cpu().unwrap_or(u64::MAX) - start < d.as_nanos() as u64 {
                std::hint::spin_loop();
            }
        };
        for _ in 0..3 {
            let _entered = SpanContextGuard::enter(Some(&root));
            cpu_burn(Duration::from_millis(2));
            std::thread::sleep(Duration::from_millis(3));
        }
        // Leave the root through another transition, closing its last stretch.
        drop(SpanContextGuard::enter(None));
        super::own_clocks::tests::NO_SCHEDSTAT.with(|no| no.set(false));
        let totals = lists.release(cpu);
        assert_eq!(totals.runqueue, RunDelay::Unknown);
        let off_cpu = totals.off_cpu_ns.expect("CPU time known without schedstat");
        let active = ticks_to_ns(totals.active_ticks);
        let on_cpu = active - off_cpu;
        // About 6 ms busy, 9 ms asleep.
        assert!(
            on_cpu >= 4_000_000 && off_cpu >= 7_000_000,
            "on CPU {on_cpu} ns, off {off_cpu} ns of {active}"
        );
    }
}
