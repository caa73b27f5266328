//! loom model of the root counters' reuse rule (`docs/signal-path.md`, "Proof").
//!
//! A handler (a thread of its own: it runs on whichever thread worked for the root, not on
//! the thread that ends it) records one sample under root A's handle, while the span
//! processor ends A, starts root B (on A's slot when the in-flight count allows it) and
//! ends B. Properties:
//!
//! * a slot is never reused while a handler that read the old generation is in flight: the
//!   sample never lands in B's counters;
//! * the sample is counted at most once: for A, or as stale (or for nobody, when the
//!   release's short wait for handlers in flight ran out before it landed in A's counters).
//!
//! The model checks that B does reuse A's slot in some executions, so the first property
//! is not vacuous.
//!
//! A second model does the same for active time and the slot's count of adds in progress
//! (in the word it shares with the generation): an adder
//! (a span hook on another thread) adds under A's handle while the span processor ends A
//! and starts B, with B's generation 65,536 past A's (the 16-bit tag of the tagged words
//! then repeats, as after 32,767 reuses; the active word has none), so only that count
//! keeps A's time out of B. A third does it for a long stretch's add, which writes three words
//! under one count (`ActiveCounter::add_long`: active time, time off CPU, and run delay
//! with the word's "measured" flag): none of A's, nor the flag, ever lands in B. A fourth takes a slot to
//! its last generation (2⁴² − 1): its release retires it, the next root gets another
//! slot, and neither the last handle nor one with the wrapped generation adds anything.

use std::cell::Cell;

use loom::sync::Arc;
use loom::thread;

use super::{add_active_in, record_in, ActiveCounter, CpuHandle, RootTable, RunDelay, SlotLists};
use crate::sync::Ordering;

thread_local! {
    /// Executions in which B got A's slot (loom runs a model on its test's thread).
    static REUSED: Cell<usize> = const { Cell::new(0) };
    /// Executions of the adders model in which B got A's slot.
    static REUSED_BY_ADD: Cell<usize> = const { Cell::new(0) };
    /// Executions of the long-stretch model in which B got A's slot.
    static REUSED_BY_LONG: Cell<usize> = const { Cell::new(0) };
}

/// Sets the generation of the free (or limbo) slot `index` (the unit tests' shortcut
/// past many reuses).
fn set_generation(roots: &RootTable, index: u32, generation: u64) {
    roots
        .slot(index)
        .expect("allocated")
        .set_generation(generation);
}

fn adder_and_span_processor() {
    let roots = Arc::new(RootTable::new());
    let mut lists = SlotLists::default();
    let a = lists.claim_in(&roots).expect("slot for A");
    let adder = {
        let roots = roots.clone();
        thread::spawn(move || add_active_in(&roots, a.to_raw(), 5))
    };
    let totals_a = lists.release_in(&roots, a);
    // 32,767 reuses later: B's generation is A's + 65,536, its word's tag A's.
    set_generation(&roots, a.index, a.generation + 65_535);
    let b = lists.claim_in(&roots).expect("slot for B");
    if b.index == a.index {
        REUSED_BY_ADD.with(|n| n.set(n.get() + 1));
    }
    let added = adder.join().expect("adder");
    let totals_b = lists.release_in(&roots, b);
    assert_eq!(
        totals_b.active_ticks, 0,
        "A's active time landed in B, which reused A's slot while the add was in progress"
    );
    // A refused add may still be in A's total (it raced the release and cannot tell),
    // never anywhere else; one that reported success is in it.
    assert!(
        totals_a.active_ticks == 5 || (!added && totals_a.active_ticks == 0),
        "an add that reported success is missing from A's total"
    );
}

fn long_stretch_and_span_processor() {
    let roots = Arc::new(RootTable::new());
    let mut lists = SlotLists::default();
    let a = lists.claim_in(&roots).expect("slot for A");
    let hook = {
        let roots = roots.clone();
        // A span hook closing a long stretch of A: 5 ticks, 2 ns of them off CPU, 3 ns of
        // run delay.
        thread::spawn(move || {
            ActiveCounter::of_in(&roots, a.to_raw())
                .is_some_and(|counter| counter.add_long_in(&roots, 5, Some((2, Some(3)))))
        })
    };
    let totals_a = lists.release_in(&roots, a);
    // As in the adders model: B's run-delay word gets A's tag.
    set_generation(&roots, a.index, a.generation + 65_535);
    let b = lists.claim_in(&roots).expect("slot for B");
    if b.index == a.index {
        REUSED_BY_LONG.with(|n| n.set(n.get() + 1));
    }
    let added = hook.join().expect("hook");
    let totals_b = lists.release_in(&roots, b);
    assert_eq!(
        (
            totals_b.active_ticks,
            totals_b.off_cpu_ns,
            totals_b.runqueue
        ),
        (0, Some(0), RunDelay::NoLongStretch),
        "A's stretch landed in B, which reused A's slot under the add"
    );
    // An add that reported success is in A's totals whole; one refused (it raced the
    // release and cannot tell) may be in them in part, never anywhere else.
    if added {
        assert_eq!(
            (
                totals_a.active_ticks,
                totals_a.off_cpu_ns,
                totals_a.runqueue
            ),
            (5, Some(2), RunDelay::Read(3)),
            "an add that reported success is missing from A's totals"
        );
    }
}

fn wrap_and_retire() {
    let roots = Arc::new(RootTable::new());
    let mut lists = SlotLists::default();
    let first = lists.claim_in(&roots).expect("slot");
    lists.release_in(&roots, first);
    // 2⁴¹ − 1 reuses later: the next owner has the last generation.
    set_generation(&roots, first.index, super::GENERATION_LIMIT - 2);
    let last = lists.claim_in(&roots).expect("slot");
    assert_eq!(
        (last.index, last.generation),
        (first.index, super::GENERATION_LIMIT - 1)
    );
    let worker = {
        let roots = roots.clone();
        thread::spawn(move || {
            record_in(&roots, last.to_raw(), 10);
            add_active_in(&roots, last.to_raw(), 4)
        })
    };
    let totals = lists.release_in(&roots, last);
    assert_eq!(
        roots.retired.load(Ordering::Relaxed),
        1,
        "retired at the wrap"
    );
    let next = lists.claim_in(&roots).expect("slot");
    assert_ne!(
        next.index, first.index,
        "a retired slot is handed out again"
    );
    worker.join().expect("worker");
    let wrapped = CpuHandle {
        index: first.index,
        generation: 1,
    };
    for stale in [last, first, wrapped] {
        record_in(&roots, stale.to_raw(), 10);
        assert!(
            !add_active_in(&roots, stale.to_raw(), 1),
            "a stale add counted"
        );
    }
    assert!(totals.samples <= 1 && totals.active_ticks <= 4);
    assert_eq!(
        lists.release_in(&roots, next),
        super::RootTotals {
            off_cpu_ns: Some(0),
            ..super::RootTotals::default()
        },
        "the next root got another's counts"
    );
}

fn handler_and_span_processor() {
    let roots = Arc::new(RootTable::new());
    let mut lists = SlotLists::default();
    let a = lists.claim_in(&roots).expect("slot for A");
    let handler = {
        let roots = roots.clone();
        thread::spawn(move || record_in(&roots, a.to_raw(), 10))
    };
    let totals_a = lists.release_in(&roots, a);
    let b = lists.claim_in(&roots).expect("slot for B");
    if b.index == a.index {
        REUSED.with(|n| n.set(n.get() + 1));
    }
    handler.join().expect("handler");
    let totals_b = lists.release_in(&roots, b);
    assert_eq!(
        (totals_b.samples, totals_b.sampled_cpu_ns),
        (0, 0),
        "A's sample landed in B, which reused A's slot while the handler was in flight"
    );
    let stale = roots.stale.load(Ordering::Relaxed);
    assert!(
        totals_a.samples + stale <= 1,
        "the sample was counted twice"
    );
}

#[test]
fn loom_root_slot_is_never_reused_under_a_handler_in_flight() {
    crate::sync::check("root counters", 8, handler_and_span_processor);
    assert!(
        REUSED.with(Cell::get) > 0,
        "no execution reused the slot: the model proves nothing"
    );
}

/// The broken variant: without the two `fence(SeqCst)` the handler's generation load and
/// the release's in-flight load can both miss the other side's write (loom, like the
/// hardware, lets the store-load pair reorder), and B's counters get A's sample.
#[test]
#[should_panic(expected = "A's sample landed in B")]
fn loom_root_slot_without_the_fences_is_reused_under_a_handler() {
    crate::sync::without_fences(|| {
        crate::sync::check("root counters, broken", 3, handler_and_span_processor)
    });
}

#[test]
fn loom_root_slot_is_never_reused_under_an_add_in_progress() {
    crate::sync::check("root counters, adders", 8, adder_and_span_processor);
    assert!(
        REUSED_BY_ADD.with(Cell::get) > 0,
        "no execution reused the slot: the model proves nothing"
    );
}

thread_local! {
    /// Set by [`loom_root_slot_is_reused_under_an_uncounted_add`]: adds check the
    /// generation without counting themselves in (`ActiveCounter::add_in`).
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Whether adds skip the count (the broken variant below).
pub(super) fn uncounted() -> bool {
    UNCOUNTED.with(Cell::get)
}

/// The broken variant: an add that checks the generation but does not count itself in
/// (the count shares the generation's word, so its read-modify-write is the check) can
/// pass the check just before the release, the release and the recycle see no add in
/// progress, and B, whose word the claim zeroed before the add landed, gets A's active
/// time. No fence is involved on this path: the count is what keeps the slot.
#[test]
#[should_panic(expected = "A's active time landed in B")]
fn loom_root_slot_is_reused_under_an_uncounted_add() {
    UNCOUNTED.with(|u| u.set(true));
    crate::sync::check("root counters, adders, broken", 3, adder_and_span_processor);
}

#[test]
fn loom_root_slot_is_never_reused_under_a_long_stretchs_add() {
    crate::sync::check(
        "root counters, long stretch",
        6,
        long_stretch_and_span_processor,
    );
    assert!(
        REUSED_BY_LONG.with(Cell::get) > 0,
        "no execution reused the slot: the model proves nothing"
    );
}

/// The broken variant: a long stretch's add that checks the generation without counting
/// itself in, as [`loom_root_slot_is_reused_under_an_uncounted_add`].
#[test]
#[should_panic(expected = "landed in B")]
fn loom_root_slot_is_reused_under_an_uncounted_long_stretch() {
    UNCOUNTED.with(|u| u.set(true));
    crate::sync::check(
        "root counters, long stretch, broken",
        3,
        long_stretch_and_span_processor,
    );
}

#[test]
fn loom_root_slot_retires_at_its_wrap() {
    crate::sync::check("root counters, wrap", 8, wrap_and_retire);
}
