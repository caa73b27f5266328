//! Wall time a thread spends inside a local root, measured at the thread's root
//! transitions.
//!
//! The span context record changes only when the thread moves to another local root (or
//! to none): entering a child span of the same root, or polling the same root's future
//! again right after, writes nothing. Those transitions are where the clock is read: one
//! read of the active-time clock (`clock::ticks`: the TSC where the kernel keeps time with
//! it, ~10 ns, else `CLOCK_MONOTONIC` through the vDSO, ~25 ns; never a syscall) closes
//! the stretch of the root being left (added to its counters, `root_cpu::add_active`) and
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
use crate::label::Label;
use crate::root_cpu;

thread_local! {
    // When the thread entered the root its record names now (`clock::ticks`); meaningful
    // only while that root has counters. `const`, no destructor: usable from any hook,
    // even during thread teardown.
    static ENTERED_AT: Cell<u64> = const { Cell::new(0) };
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

#[inline(never)]
fn transition_cpu(from: Option<Label>, to: Option<Label>) {
    let now = clock::ticks();
    // `try_with`: a thread-local destructor may end a scope after this one is gone.
    let _ = ENTERED_AT.try_with(|entered| {
        if let Some(from) = from {
            // A root that ended meanwhile reads as 0: nothing is added.
            let cpu = from.cpu_raw();
            if cpu != 0 {
                root_cpu::add_active(cpu, now.saturating_sub(entered.get()));
            }
        }
        if to.is_some() {
            entered.set(now);
        }
    });
}
