//! Wall time a thread spends inside a local root, measured at the thread's root
//! transitions.
//!
//! The span context record changes only when the thread moves to another local root (or
//! to none): entering a child span of the same root, or polling the same root's future
//! again right after, writes nothing. Those transitions are where the clock is read: one
//! read of the active-time clock (`clock::ticks`: the TSC where the kernel keeps time with
//! it, ~10 ns, else `CLOCK_MONOTONIC` through the vDSO, ~25 ns; never a syscall) closes
//! the stretch of the root being left (added to its counters, `root_cpu::ActiveCounter::add`) and
//! opens the stretch of the root being entered. Roots without counters (no sampler, no evidence processor, an
//! unsampled trace) never read the clock. The thread's CPU clock is never read here: at
//! ~500 ns a read (a syscall) it would cost more than the rest of a poll's hooks.
//!
//! What is measured: from the moment a thread's record names the root until it names
//! something else. That covers running, being preempted, and blocking inside a poll (a
//! `std::thread::sleep`, a contended `std::sync::Mutex`, a synchronous read) — the thread
//! is held by the root the whole time. It does not cover time the root's futures spend
//! suspended, since no thread is inside the root then.

use std::cell::Cell;

use crate::clock;
use crate::label::{word_of, Label, CPU_BIT};
use crate::root_cpu::ActiveCounter;

/// The thread's open stretch, and the counters of the root it left last.
struct Stretch {
    /// When the thread entered the root its record names now (`clock::ticks`);
    /// meaningful only while that root has counters.
    entered_at: Cell<u64>,
    /// The word of the root whose counters `cpu` holds (0: none yet). A root's counters
    /// never change and a word is never handed out twice, so the next stretch of the same
    /// root (the next poll of its future) does not read its label slot or look its
    /// counters up again; counters whose root ended refuse the add by their own
    /// generation.
    word: Cell<u64>,
    cpu: Cell<Option<ActiveCounter>>,
}

thread_local! {
    // `const`, no destructor: usable from any hook, even during thread teardown.
    static STRETCH: Stretch = const {
        Stretch { entered_at: Cell::new(0), word: Cell::new(0), cpu: Cell::new(None) }
    };
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
    transition_cpu(from_cpu, to_cpu);
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

/// The thread enters a root with counters at `now` (from no root).
#[inline(always)]
pub(super) fn entered_at(now: u64) {
    STRETCH.with(|stretch| stretch.entered_at.set(now));
}

/// The thread leaves `from`, a root with counters, for no root at `now`, if the thread's
/// stretch holds `from`'s counters (the next poll of the same root): false, having
/// changed nothing, otherwise (the caller then makes the whole [`transition`]).
#[inline(always)]
pub(super) fn left_at(from: Label, now: u64) -> bool {
    STRETCH.with(|stretch| {
        if stretch.word.get() != from.word() {
            return false;
        }
        if let Some(cpu) = stretch.cpu.get() {
            cpu.add(now.saturating_sub(stretch.entered_at.get()));
        }
        true
    })
}

#[inline]
fn transition_cpu(from: Option<Label>, to: Option<Label>) {
    let now = clock::ticks();
    // `try_with`: a thread-local destructor may end a scope after this one is gone.
    let _ = STRETCH.try_with(|stretch| {
        if let Some(from) = from {
            let cpu = if stretch.word.get() == from.word() {
                stretch.cpu.get()
            } else {
                // A root whose label was released reads as 0: nothing is added.
                let cpu = ActiveCounter::of(from.cpu_raw());
                stretch.word.set(from.word());
                stretch.cpu.set(cpu);
                cpu
            };
            if let Some(cpu) = cpu {
                cpu.add(now.saturating_sub(stretch.entered_at.get()));
            }
        }
        if to.is_some() {
            stretch.entered_at.set(now);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::clock::ticks_to_ns;
    use crate::root_cpu::SlotLists;
    use crate::{LocalRoot, RootLabel, SpanContextGuard, SpanName};

    fn busy(d: Duration) {
        let start = Instant::now();
        while start.elapsed() < d {
            std::hint::spin_loop();
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
}
