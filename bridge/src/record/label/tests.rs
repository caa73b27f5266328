use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceId};

use super::table::{generation_of, index_of, LabelTable, GENERATION_BITS};
use super::*;

/// A value whose every field is derived from `n`, so a read mixing two values shows.
fn value(n: u64) -> RootLabel {
    RootLabel {
        span_id: n,
        trace_id: u128::from(n) << 64 | u128::from(!n),
        name: SpanName::from_raw((n % 1000) as u32 + 1),
        flags: n as u8,
        cpu: u128::from(n + 7) << 64 | u128::from(n + 9),
    }
}

/// Whether `v` is one whole `value(n)`.
fn whole(v: &RootLabel) -> bool {
    *v == value(v.span_id)
}

#[test]
fn a_claimed_label_reads_back_until_released_and_its_word_never_again() {
    let table = LabelTable::new();
    let a = table.claim(&value(1)).expect("room");
    assert_eq!(table.read(a), Some(value(1)));
    assert!(a.has_cpu(), "value(1) has counters: the word says so");
    assert_eq!(generation_of(a) & 1, 1, "odd while owned");
    table.release(a);
    assert_eq!(table.read(a), None, "released");
    // LIFO: the same slot, another generation.
    let b = table.claim(&value(2)).expect("room");
    assert_eq!(index_of(b), index_of(a));
    assert_eq!(generation_of(b), generation_of(a) + 2);
    assert_eq!(
        table.read(a),
        None,
        "the old word never reads the new owner"
    );
    assert_eq!(table.read(b), Some(value(2)));
    // A second release of the old word (a bug elsewhere) does not free b's slot.
    table.release(a);
    assert_eq!(table.read(b), Some(value(2)));
    let no_cpu = table
        .claim(&RootLabel::new(SpanId::from(3), TraceId::from(4), None))
        .expect("room");
    assert!(!no_cpu.has_cpu());
    assert_ne!(index_of(no_cpu), index_of(b));
}

/// A slot at the last generation a root may have retires when released: never listed
/// again, so no generation is ever handed out twice, the all-ones generation never at all
/// (the record's "being filled" word, and a release mark would carry into the index), and
/// the next claim gets another slot.
#[test]
fn a_slot_at_the_last_generation_retires() {
    let table = LabelTable::new();
    let a = table.claim(&value(1)).expect("room");
    let index = index_of(a);
    table.release(a);
    // Free, one claim before the last generation a root may have.
    table.set_generation(index, (1 << GENERATION_BITS) - 4);
    let last = table.claim(&value(2)).expect("room");
    assert_eq!(index_of(last), index);
    assert_eq!(generation_of(last), (1 << GENERATION_BITS) - 3);
    assert_eq!(
        slot_index(last.word() + 1),
        index,
        "the release mark stays in the slot's own word"
    );
    assert_eq!(table.read(last), Some(value(2)));
    table.release(last);
    assert_eq!(table.retired(), 1);
    assert_eq!(table.read(last), None);
    let next = table.claim(&value(3)).expect("room");
    assert_ne!(
        index_of(next),
        index,
        "a retired slot is never claimed again"
    );
    assert_eq!(table.read(last), None);
}

/// Readers on other threads, racing an owner that claims and releases labels as fast as
/// it can (each claim reusing the slot just released), see whole values or nothing: never
/// fields of two owners under one generation. Then threads claiming and releasing at once
/// never get the same live slot (the free list's tag at work).
#[test]
fn racing_claims_releases_and_reads_never_tear_or_share_a_slot() {
    crate::sync::lazy_static_value! {
        static TABLE: LabelTable = LabelTable::new();
    }
    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let owner = {
        let (published, stop) = (published.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 1;
            while !stop.load(Ordering::Relaxed) {
                let label = TABLE.claim(&value(n)).expect("room");
                published.store(label.word(), Ordering::Relaxed);
                TABLE.release(label);
                n += 1;
            }
            n
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let published = published.clone();
            std::thread::spawn(move || {
                // The owner's first label first: on a loaded machine the readers could
                // otherwise spend their whole loop before the owner thread ever ran.
                while published.load(Ordering::Relaxed) == 0 {
                    std::thread::yield_now();
                }
                let (mut whole_reads, mut none) = (0u64, 0u64);
                for _ in 0..300_000 {
                    let Some(label) = Label::from_raw(published.load(Ordering::Relaxed)) else {
                        continue;
                    };
                    match TABLE.read(label) {
                        Some(v) => {
                            assert!(whole(&v), "torn label {v:?}");
                            whole_reads += 1;
                        }
                        None => none += 1,
                    }
                }
                (whole_reads, none)
            })
        })
        .collect();
    let reads: Vec<_> = readers
        .into_iter()
        .map(|r| r.join().expect("reader"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let claims = owner.join().expect("owner");
    assert!(claims > 1, "{claims} claims");
    assert!(reads.iter().all(|&(w, n)| w + n > 0), "{reads:?}");

    // Four threads claiming and releasing at once: every live label reads as its own.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..20_000u64 {
                    let n = t << 32 | i;
                    live.push((n, TABLE.claim(&value(n)).expect("room")));
                    if live.len() > 8 {
                        let (n, label) = live.remove((i % 8) as usize);
                        assert_eq!(TABLE.read(label), Some(value(n)), "shared a slot");
                        TABLE.release(label);
                    }
                }
                for (n, label) in &live {
                    assert_eq!(TABLE.read(*label), Some(value(*n)), "shared a slot");
                }
                live.into_iter()
                    .map(|(_, l)| index_of(l))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut indexes: Vec<u32> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("thread"))
        .collect();
    let live = indexes.len();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), live, "two live labels in one slot");
}

#[test]
fn name_only_roots_share_one_slot_per_name_for_good() {
    let name = SpanName::intern("label-test/name-only");
    let a = LocalRoot::name_only(name);
    let b = LocalRoot::name_only(name);
    assert_eq!(a.word(), b.word());
    assert!(a.word().is_some());
    drop(a);
    assert_eq!(
        b.word().and_then(Label::read),
        Some(RootLabel::name_only(name)),
        "not released by a handle"
    );
    let other = LocalRoot::name_only(SpanName::intern("label-test/other-name"));
    assert_ne!(other.word(), b.word());
}

#[test]
fn the_last_clone_releases_the_slot() {
    let root = LocalRoot::new(SpanId::from(21), TraceId::from(22), None);
    let word = root.word().expect("slot");
    let clone = root.clone();
    drop(root);
    assert_eq!(word.read(), Some(*clone), "a clone keeps it");
    drop(clone);
    assert_eq!(word.read(), None, "released with the last");
}

/// A released root whose OTEP 4947 record no thread ever filled goes straight back to
/// the free list; one whose record was published waits in limbo while a thread's mirror
/// names it, and a reclaim frees it once none does.
#[test]
fn released_slots_wait_in_limbo_only_while_a_thread_may_name_them() {
    let table = LabelTable::new();
    let a = table.claim(&value(1)).expect("room");
    table.release(a);
    assert_eq!(table.in_limbo(), 0, "never published: no limbo");
    let b = table.claim(&value(2)).expect("room");
    assert_eq!(index_of(b), index_of(a), "reused at once");

    let mirror = table.naming().lease().expect("a mirror");
    let record = crate::thread_ctx::to_name(&table, mirror, b).expect("b is alive");
    assert!(record.holds(b.word()));
    table.release(b);
    assert!(!record.holds(b.word()), "the release forgets the record");
    assert_eq!(table.in_limbo(), 1, "published: limbo");
    let c = table.claim(&value(3)).expect("room");
    assert_ne!(index_of(c), index_of(b), "not reused while in limbo");
    assert!(!table.reclaim_for_test(), "the mirror still names b's slot");
    assert_eq!(table.in_limbo(), 1);
    mirror.give_back();
    assert!(table.reclaim_for_test(), "named by none: freed");
    assert_eq!(table.in_limbo(), 0);
    let d = table.claim(&value(4)).expect("room");
    assert_eq!(index_of(d), index_of(b), "freed, then reused");
    assert!(
        !record.holds(d.word()),
        "filled afresh by d's first publication"
    );
    let mirror = table.naming().lease().expect("a mirror");
    assert!(crate::thread_ctx::to_name(&table, mirror, d).is_some());
    assert_eq!(
        record.decode().map(|(trace, span, _, _)| (trace, span)),
        Some((value(4).trace_id, 4))
    );
    mirror.give_back();
}

/// Slots that stay named (idle threads' mirrors keep the last root they ran) do not make
/// every later claim pay a barrier: a reclaim waits for a batch more than it kept.
#[test]
fn slots_that_stay_named_cost_one_reclaim_per_batch() {
    let table = LabelTable::new();
    let named: Vec<_> = (0..70)
        .map(|n| {
            let label = table.claim(&value(n + 1)).expect("room");
            let mirror = table.naming().lease().expect("a mirror");
            crate::thread_ctx::to_name(&table, mirror, label).expect("alive");
            (label, mirror)
        })
        .collect();
    for (label, _) in &named {
        table.release(*label);
    }
    assert_eq!(table.in_limbo(), 70);
    // Free list empty, limbo over a batch: the first claim reclaims, keeps all 70.
    let _first = table.claim(&value(100)).expect("room");
    assert_eq!(table.reclaims(), 1);
    // Each of these claims finds the free list empty.
    let held: Vec<_> = (0..500)
        .map(|n| table.claim(&value(200 + n)).expect("room"))
        .collect();
    assert_eq!(
        table.reclaims(),
        1,
        "no barrier per claim for slots still named"
    );
    for label in held {
        table.release(label); // never published: straight to the free list
    }
    for (_, mirror) in &named {
        mirror.give_back();
    }
    assert!(table.reclaim_for_test());
    assert_eq!(table.in_limbo(), 0, "freed once no thread names them");
}

/// Claiming a label (a new chunk of slots, and the usual reuse) needs a small stack: a
/// chunk built as an array value gave `claim` a 64 KiB frame whose pages the stack probe
/// touched on every call (16 cache-missing writes per root). A 64 KiB frame overflows
/// this thread's stack, which aborts the test binary.
#[test]
fn a_claim_fits_in_a_small_stack() {
    let table: &'static LabelTable = Box::leak(Box::new(LabelTable::new()));
    let handle = std::thread::Builder::new()
        .stack_size(48 * 1024)
        .spawn(move || {
            for n in 1..2_000u64 {
                let label = table.claim(&value(n)).expect("room");
                assert_eq!(table.read(label), Some(value(n)));
                if n % 3 != 0 {
                    table.release(label);
                }
            }
        })
        .expect("thread");
    handle.join().expect("claims on a 48 KiB stack");
}
