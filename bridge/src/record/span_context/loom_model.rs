//! loom model of the span record (`docs/signal-path.md`, "Proof"): one label word under
//! a sequence number.
//!
//! The owner thread writes two words in turn, through the record's own `write`; a reader
//! on another thread takes two snapshots through `snapshot_word` (what the watchdog does;
//! the handler reads the word alone, on its own thread). Property: every snapshot is
//! `None` or the word of one write with that write's sequence number, never a sequence
//! paired with another write's word: the watchdog's "same sequence on two ticks, so the
//! same poll" rests on it. What the word names (the label slot) has its own model
//! (`label::table::loom_model`).

use loom::sync::Arc;
use loom::thread;

use super::SpanContextCell;
use crate::label::Label;

fn word(n: u64) -> Option<Label> {
    Label::from_raw(n * 2 + 1)
}

/// What a reader may see at each sequence number: nothing yet, then each write's word.
fn written_at(seq: u64) -> Option<Label> {
    match seq {
        0 => None,
        2 => word(1),
        4 => word(2),
        other => panic!("a snapshot at sequence {other}: odd or never written"),
    }
}

fn writer_and_reader() {
    let cell = Arc::new(SpanContextCell::new());
    let writer = {
        let cell = cell.clone();
        thread::spawn(move || {
            cell.write_for_model(word(1));
            cell.write_for_model(word(2));
        })
    };
    for _ in 0..2 {
        if let Some((seq, seen)) = cell.snapshot_word() {
            assert_eq!(seen, written_at(seq), "torn record at sequence {seq}");
        }
    }
    writer.join().expect("writer");
    assert_eq!(cell.snapshot_word(), Some((4, word(2))), "the last write");
}

#[test]
fn loom_record_never_pairs_a_sequence_with_another_word() {
    crate::sync::check("span record", 3, writer_and_reader);
}

/// The broken variant: without the writer's release fence and the reader's acquire fence
/// a reader can take the next write's word under the previous sequence number.
#[test]
#[should_panic(expected = "torn record")]
fn loom_record_without_its_fences_pairs_them_wrong() {
    crate::sync::without_fences(|| crate::sync::check("span record, broken", 3, writer_and_reader));
}
