//! loom models of the per-thread ring (`docs/signal-path.md`, "Proof").
//!
//! The producer is the signal handler, a thread of its own here (it only ever runs on its
//! owner thread, but the consumer is another thread, so the ring's correctness is a
//! two-thread property anyway); the consumer is the drain. Properties:
//!
//! * every record pushed is drained exactly once, in push order, and a refused push (a
//!   full ring) is the only way a record is not drained: nothing lost, nothing duplicated;
//! * the consumer never reads a record slot while the producer writes it, nor before the
//!   write is visible (each record slot is a loom `UnsafeCell`: loom fails the model on
//!   any access not ordered after the previous conflicting one).
//!
//! Two drains one after the other are the slots model's (under the drain lock, as in the
//! collector). Two threads racing for one role are not modelled: loom leaves a plain
//! store and another thread's failed swap of the flag unordered, and may then read the
//! swap's `true` last, a role held forever, which no execution of the real program can
//! produce (the swap reads the value before the store, so it is ordered before it).

use loom::sync::Arc;
use loom::thread;

use super::Ring;

/// Weakens the ring's role flags to relaxed (a broken variant of the slots model).
pub(crate) fn relax_roles(ring: &Ring) {
    ring.producing.relax_for_model();
    ring.consuming.relax_for_model();
}

/// Pushes `1..=n` as the producer and returns the ones the ring took.
fn produce(ring: &Ring, n: u64) -> Vec<u64> {
    let mut producer = ring.producer().expect("the handler is the only producer");
    (1..=n)
        .filter(|&i| producer.push_with(|r| r.frames[0] = i))
        .collect()
}

/// Drains into `seen` if the consumer role is free.
fn drain(ring: &Ring, seen: &mut Vec<u64>) {
    if let Some(mut consumer) = ring.consumer() {
        consumer.drain(|r| seen.push(r.frames[0]));
    }
}

/// A handler pushing 3 records into a 2-record ring while the drain runs twice; what is
/// left is drained after both end.
fn handler_and_drain() {
    let ring = Arc::new(Ring::<crate::sampler::SampleRecord>::new(2));
    let handler = {
        let ring = ring.clone();
        thread::spawn(move || produce(&ring, 3))
    };
    let mut seen = Vec::new();
    drain(&ring, &mut seen);
    drain(&ring, &mut seen);
    let pushed = handler.join().expect("handler");
    drain(&ring, &mut seen);
    assert_eq!(seen, pushed, "drained once each, in order");
    assert!(pushed.contains(&1), "an empty ring refused a record");
}

#[test]
fn loom_ring_loses_and_duplicates_nothing() {
    crate::sync::check("ring", 8, handler_and_drain);
}

/// The broken variant: with the producer's publication of `head` (release) and the
/// consumer's load of it (acquire) weakened to relaxed, the consumer reads a record slot
/// whose write it is not ordered after: loom reports the unsynchronised access.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_with_a_relaxed_head_reads_unwritten_records() {
    crate::sync::check("ring, broken", 3, || {
        let ring = Arc::new(Ring::<crate::sampler::SampleRecord>::new(2));
        ring.head.relax_for_model();
        let handler = {
            let ring = ring.clone();
            thread::spawn(move || produce(&ring, 1))
        };
        let mut seen = Vec::new();
        drain(&ring, &mut seen);
        handler.join().expect("handler");
    });
}
