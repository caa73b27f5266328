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

use std::cell::Cell;

use loom::sync::Arc;
use loom::thread;

use super::{record_in, RootTable, SlotLists};
use crate::sync::Ordering;

thread_local! {
    /// Executions in which B got A's slot (loom runs a model on its test's thread).
    static REUSED: Cell<usize> = const { Cell::new(0) };
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
        (totals_b.samples, totals_b.cpu_ns),
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
