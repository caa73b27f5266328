//! loom model of the label slots' read-versus-reuse protocol (`docs/signal-path.md`,
//! "Proof"), which replaces the models of the old per-thread sequence lock.
//!
//! Root A's label is claimed. An owner thread releases A and claims B, which takes A's
//! slot (the free list is LIFO and nothing else claims: B reuses A's slot in every
//! execution, so the property is never vacuous). Meanwhile a reader on another thread —
//! the watchdog, or the signal handler, which a second thread's interleavings cover —
//! reads A's word twice. Property: each read is "no label" or A's whole value, never B's
//! fields (or a mix) under A's word; after the owner is done A's word reads nothing and
//! B's reads B. Every field of A's value differs from B's, so a mix of any two is caught.

use loom::sync::Arc;
use loom::thread;

use super::super::{Label, RootLabel};
use super::{index_of, LabelTable};
use crate::span_name::SpanName;

/// A value whose every field differs from the other values' (`n` ≥ 1).
fn value(n: u64) -> RootLabel {
    RootLabel {
        span_id: n,
        trace_id: u128::from(n) << 64 | u128::from(n + 100),
        name: SpanName::from_raw(n as u32 + 200),
        flags: n as u8 | 0x80,
        cpu: u128::from(n + 300) << 64 | u128::from(n + 400),
    }
}

fn reader_and_reuse() {
    let table = Arc::new(LabelTable::new());
    let a = table.claim(&value(1)).expect("slot for A");
    let owner = {
        let table = table.clone();
        thread::spawn(move || {
            table.release(a);
            table.claim(&value(2)).expect("slot for B")
        })
    };
    for _ in 0..2 {
        if let Some(seen) = table.read(a) {
            assert_eq!(seen, value(1), "torn label under A's word");
        }
    }
    let b: Label = owner.join().expect("owner");
    assert_eq!(index_of(b), index_of(a), "B reuses A's slot");
    assert_eq!(table.read(a), None, "A's word after the reuse");
    assert_eq!(table.read(b), Some(value(2)), "B's word");
}

#[test]
fn loom_label_reads_never_mix_a_reused_slot() {
    crate::sync::check("label slot reuse", 2, reader_and_reuse);
}

/// The broken variant: without the claim's release fence and the reader's acquire fence,
/// a reader can take B's fields under A's generation.
#[test]
#[should_panic(expected = "torn label")]
fn loom_label_reads_without_their_fences_mix_a_reused_slot() {
    crate::sync::without_fences(|| {
        crate::sync::check("label slot reuse, broken", 2, reader_and_reuse)
    });
}
