//! loom model of the thread context's naming protocol (`naming.rs`): a released slot's
//! record is rewritten only once no thread's `otel_thread_ctx_v1` names it.
//!
//! Root A's label is claimed. A publisher thread leases a mirror and names A's record
//! (filling it if it is first), reads the record twice as a reader stopping the thread
//! would, then exits (its mirror goes back). Meanwhile the owner releases A, reclaims, and
//! claims B, which may take A's slot (the free list is LIFO): then B's first publication
//! fills the same record. Property: whenever the publisher names A's record, both reads
//! give A's ids, never B's (a rewrite while named). After the publisher exited, a
//! reclaim frees A's slot for good: B or the next root reuses it (the property is not
//! vacuous, and nothing leaks). The barrier is the fence form (`membarrier` is the same
//! order with the publisher's fence moved into the reclaimer's system call).

use loom::sync::Arc;
use loom::thread;

use super::super::record::is_published;
use super::{to_name, Naming};
use crate::label::table::{index_of, LabelTable};
use crate::label::RootLabel;
use crate::sync::{AtomicU64, Ordering};

/// A value whose ids differ from the other values' (`n` ≥ 1).
fn value(n: u64) -> RootLabel {
    RootLabel {
        span_id: n,
        trace_id: u128::from(n) << 64 | u128::from(n + 100),
        name: None,
        flags: 1,
        cpu: 0,
    }
}

/// `prefilled`: A was published before (its record holds A), so the publisher only
/// names it: the asymmetric Dekker alone. Otherwise the publisher fills it, racing the
/// release (a late fill must be taken back, never left for B's slot). `filled_at_claim`:
/// B's claim fills its record itself (the thread context on), with plain stores: the
/// claim's own write must never land in a record the publisher names either.
fn publisher_and_reuse(prefilled: bool, filled_at_claim: bool) {
    let table = Arc::new(LabelTable::new());
    let a = table.claim_with(&value(1), false).expect("slot for A");
    assert!(is_published(&value(1)));
    // The records' chunk and both mirrors exist before the threads start: they are
    // published through plain `std` atomics (never-freed tables), which loom cannot see.
    let naming: &Naming = table.naming();
    let record = naming.record(index_of(a)).expect("A's record");
    if prefilled {
        assert!(record.fill(a.word(), &value(1)));
    }
    let (publisher_mirror, owner_mirror) = (
        naming.lease().expect("a mirror"),
        naming.lease().expect("a mirror"),
    );
    // Stands for the publisher's `otel_thread_ctx_v1`: its stores are where a reader may
    // stop the thread (and where loom may switch threads).
    let pointer = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (table, pointer) = (table.clone(), pointer.clone());
        thread::spawn(move || {
            let mirror = publisher_mirror;
            if let Some(record) = to_name(&table, mirror, a) {
                pointer.store(1, Ordering::Relaxed);
                for _ in 0..2 {
                    let (trace, span, _, _) = record.decode().expect("valid");
                    assert_eq!(
                        (trace, span),
                        (value(1).trace_id, 1),
                        "rewritten while named"
                    );
                    pointer.store(1, Ordering::Relaxed);
                }
                pointer.store(0, Ordering::Relaxed);
            }
            mirror.give_back();
        })
    };
    table.release(a);
    table.reclaim_for_test();
    let b = table
        .claim_with(&value(2), filled_at_claim)
        .expect("slot for B");
    // B's first publication (fills the record if B took A's slot and no one named it, or
    // finds it filled by the claim).
    let _ = to_name(&table, owner_mirror, b);
    publisher.join().expect("publisher");
    // Whatever the race did, B (alive) can be published now, with its own bytes: no
    // late fill of A is left in the record of the slot B took.
    let record = to_name(&table, owner_mirror, b).expect("B publishable");
    let (trace, span, _, _) = record.decode().expect("valid");
    assert_eq!((trace, span), (value(2).trace_id, 2), "B's own record");
    owner_mirror.give_back();
    if index_of(b) != index_of(a) {
        table.reclaim_for_test();
        let c = table
            .claim_with(&value(3), filled_at_claim)
            .expect("slot for C");
        assert_eq!(
            index_of(c),
            index_of(a),
            "A's slot freed once no thread names it"
        );
    }
}

#[test]
fn loom_thread_ctx_record_never_rewritten_while_named() {
    crate::sync::check("thread ctx naming", 4, || publisher_and_reuse(true, false));
}

#[test]
fn loom_thread_ctx_first_fill_racing_the_release() {
    crate::sync::check("thread ctx naming, first fill", 2, || {
        publisher_and_reuse(false, false)
    });
}

#[test]
fn loom_thread_ctx_record_filled_at_claim_never_while_named() {
    crate::sync::check("thread ctx naming, filled at claim", 4, || {
        publisher_and_reuse(true, true)
    });
}

#[test]
fn loom_thread_ctx_filled_at_claim_racing_a_late_first_fill() {
    crate::sync::check("thread ctx naming, filled at claim, late fill", 2, || {
        publisher_and_reuse(false, true)
    });
}

/// The model without the two halves of the barrier: the reclaimer can miss the
/// publisher's mirror while the publisher misses the release, and B's fill (its first
/// publication's, or its claim's plain stores) rewrites the record the publisher names.
fn without_the_barrier(name: &str, filled_at_claim: bool) {
    crate::sync::without_fences(|| {
        crate::sync::check(name, 2, move || publisher_and_reuse(true, filled_at_claim))
    });
}

#[test]
#[should_panic(expected = "rewritten while named")]
fn loom_thread_ctx_without_the_barrier_rewrites_a_named_record() {
    without_the_barrier("thread ctx naming, broken", false);
}

#[test]
#[should_panic(expected = "rewritten while named")]
fn loom_thread_ctx_filled_at_claim_without_the_barrier_rewrites_a_named_record() {
    without_the_barrier("thread ctx naming, filled at claim, broken", true);
}

/// Two reclaims at once, each popping its own batch (one slot in the model), with a
/// publisher naming one of the slots they judge: root A (named by the publisher, released
/// by the owner as it runs) and root D (released before, named by nobody) are in the
/// limbo. The owner releases A, reclaims and claims B, its record filled at the claim;
/// the main thread reclaims at the same time. Properties: a named record is never
/// rewritten (a slot the publisher names is parked, never freed); and once everyone is
/// done, reclaims until none frees anything leave every slot but B's on the free list,
/// none in the limbo or parked (none lost in a batch, none listed twice).
fn two_reclaimers_and_a_publisher() {
    let table = Arc::new(LabelTable::new());
    let a = table.claim_with(&value(1), false).expect("slot for A");
    let naming: &Naming = table.naming();
    let record = naming.record(index_of(a)).expect("A's record");
    assert!(record.fill(a.word(), &value(1)));
    let d = table.claim_with(&value(4), true).expect("slot for D");
    table.release(d);
    let publisher_mirror = naming.lease().expect("a mirror");
    table.make_batches_for_test(2);
    let publisher = {
        let table = table.clone();
        thread::spawn(move || {
            let mirror = publisher_mirror;
            if let Some(record) = to_name(&table, mirror, a) {
                for _ in 0..2 {
                    let (trace, span, _, _) = record.decode().expect("valid");
                    assert_eq!(
                        (trace, span),
                        (value(1).trace_id, 1),
                        "rewritten while named"
                    );
                }
            }
            mirror.give_back();
        })
    };
    let owner = {
        let table = table.clone();
        thread::spawn(move || {
            table.release(a);
            table.reclaim_for_test();
            table.claim_with(&value(2), true).expect("slot for B")
        })
    };
    table.reclaim_for_test();
    publisher.join().expect("publisher");
    let b = owner.join().expect("owner");
    while table.reclaim_for_test() {}
    let stats = table.stats();
    assert_eq!((stats.in_limbo, stats.parked), (0, 0), "{stats:?}");
    assert_eq!(
        table.free_len() + 1,
        stats.slots,
        "every slot but B's free, once: {stats:?}"
    );
    assert!(table.read(b).is_some(), "B alive");
}

#[test]
fn loom_label_two_reclaims_at_once_never_free_a_named_slot_nor_lose_one() {
    crate::sync::check(
        "two reclaims and a publisher",
        2,
        two_reclaimers_and_a_publisher,
    );
}

/// The model without the barrier's two halves: a reclaim misses the publisher's mirror
/// while the publisher misses the release, and B's claim rewrites the named record.
#[test]
#[should_panic(expected = "rewritten while named")]
fn loom_label_two_reclaims_without_the_barrier_rewrite_a_named_record() {
    crate::sync::without_fences(|| {
        crate::sync::check(
            "two reclaims and a publisher, broken",
            2,
            two_reclaimers_and_a_publisher,
        )
    });
}
