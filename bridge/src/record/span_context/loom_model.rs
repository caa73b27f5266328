//! loom model of the span record's sequence lock (`docs/signal-path.md`, "Proof").
//!
//! The owner thread writes two roots in turn, through the record's own `write`; a reader
//! on another thread takes two snapshots through `snapshot` (what the watchdog does, and
//! what the handler does: a signal interrupting the writer anywhere is one of the
//! interleavings of a second thread, see the docs). Property: every snapshot is `None` or
//! a whole value that was written, with the sequence number of that write, never a mix of
//! two writes. The record is eight words (sequence, name, flags, span id, two of trace id,
//! two of the CPU handle), each of the root's fields distinct per write, so a mix of any
//! two words of different writes is caught.

use loom::sync::Arc;
use loom::thread;

use super::{LocalRoot, SpanContextCell};
use crate::span_name::SpanName;

/// A root whose every field differs from the other roots' (`n` ≥ 1).
fn root(n: u64) -> LocalRoot {
    LocalRoot {
        span_id: n,
        trace_id: u128::from(n) << 64 | u128::from(n + 100),
        name: SpanName::from_raw(n as u32 + 200),
        flags: n as u8 | 0x80,
        // Both halves of the packed handle, each its own word of the record.
        cpu: u128::from(n + 300) << 64 | u128::from(n + 400),
    }
}

/// What a reader may see at each sequence number: nothing yet, then each write's root.
fn written_at(seq: u64) -> Option<LocalRoot> {
    match seq {
        0 => None,
        2 => Some(root(1)),
        4 => Some(root(2)),
        other => panic!("a snapshot at sequence {other}: odd or never written"),
    }
}

fn writer_and_reader() {
    let cell = Arc::new(SpanContextCell::new());
    let writer = {
        let cell = cell.clone();
        thread::spawn(move || {
            cell.write(Some(root(1)));
            cell.write(Some(root(2)));
        })
    };
    for _ in 0..2 {
        if let Some((seq, seen)) = cell.snapshot() {
            assert_eq!(seen, written_at(seq), "torn record at sequence {seq}");
        }
    }
    writer.join().expect("writer");
    assert_eq!(cell.snapshot(), Some((4, Some(root(2)))), "the last write");
}

#[test]
fn loom_seqlock_never_returns_a_torn_record() {
    crate::sync::check("seqlock", 2, writer_and_reader);
}

/// The broken variant: without the writer's release fence and the reader's acquire fence
/// a reader can accept fields of the next write under the previous sequence number.
#[test]
#[should_panic(expected = "torn record")]
fn loom_seqlock_without_its_fences_returns_torn_records() {
    crate::sync::without_fences(|| crate::sync::check("seqlock, broken", 2, writer_and_reader));
}
