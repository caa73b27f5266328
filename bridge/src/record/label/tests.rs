use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceId};

use super::table::{
    generation_of, index_of, LabelTable, BATCH_ENTRIES, GENERATION_BITS, RECLAIM_BATCH,
};
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
    barrier_chosen(&table);
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
    assert_eq!(
        (table.in_limbo(), table.stats().parked),
        (0, 1),
        "parked in the mirror"
    );
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
    barrier_chosen(&table);
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

/// Waits until the barrier's form is chosen: once per process, by the first thread to
/// publish (registering `membarrier` takes milliseconds, longer with other tests running,
/// and reclaims free nothing meanwhile), as a service's first span does before its churn.
fn barrier_chosen(table: &LabelTable) {
    while !table.naming().barrier_ready() {
        std::thread::yield_now();
    }
}

/// More released slots stay named than a reclaim pops (more idle threads than a batch,
/// each naming the last root it ran): they are parked in their mirrors, out of the
/// limbo, so later reclaims free the slots behind them instead of popping the same named
/// ones again, and the table stays at the roots alive plus O(threads).
#[test]
fn named_slots_beyond_a_batch_never_starve_the_limbo() {
    let table = LabelTable::new();
    barrier_chosen(&table);
    let idle = 3 * RECLAIM_BATCH as u64;
    let named: Vec<_> = (0..idle)
        .map(|n| {
            let label = table.claim(&value(n + 1)).expect("room");
            let mirror = table.naming().lease().expect("a mirror");
            crate::thread_ctx::to_name(&table, mirror, label).expect("alive");
            table.release(label);
            mirror
        })
        .collect();
    // One busy thread: each root published, then released while its mirror moves on.
    let worker = table.naming().lease().expect("a mirror");
    for n in 0..20_000u64 {
        let label = table.claim(&value(1_000 + n)).expect("room");
        crate::thread_ctx::to_name(&table, worker, label).expect("alive");
        table.release(label);
    }
    let stats = table.stats();
    let bound = idle + 1 + 2 * BATCH_ENTRIES as u64 + RECLAIM_BATCH as u64;
    assert!(
        stats.slots <= bound,
        "{} slots for {idle} named ones and one busy thread (bound {bound}): {stats:?}",
        stats.slots
    );
    assert!(stats.parked > 0, "named slots are parked: {stats:?}");
    for mirror in named {
        mirror.give_back();
    }
    worker.give_back();
    while table.reclaim_for_test() {}
    let stats = table.stats();
    assert_eq!(
        (stats.in_limbo, stats.parked),
        (0, 0),
        "all freed once no thread names them: {stats:?}"
    );
    assert_eq!(table.free_len(), stats.slots, "nothing lost: {stats:?}");
}

/// Threads churning published roots at once: a claim that finds the free list empty
/// while others reclaim reclaims a batch of its own, it does not take a fresh slot, so
/// the table stays at the roots alive plus a batch per thread (the old one-reclaimer
/// table grew by a fresh slot per such claim: +22.8 MB in 30 s at 4 threads).
#[test]
fn concurrent_reclaims_keep_the_table_at_the_roots_alive_plus_a_batch_per_thread() {
    let table: &'static LabelTable = Box::leak(Box::new(LabelTable::new()));
    let threads = 4u64;
    barrier_chosen(table);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mirror = table.naming().lease().expect("a mirror");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) || n < 50_000 {
                    let label = table.claim(&value((t << 40) | (n + 1))).expect("room");
                    crate::thread_ctx::to_name(table, mirror, label).expect("alive");
                    table.release(label);
                    n += 1;
                }
                mirror.give_back();
                n
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let roots: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    let stats = table.stats();
    // Alive: one per thread; in limbo: under a batch; held: a batch per thread; named or
    // parked: one per mirror. A fresh slot per contended claim would be thousands.
    let bound = threads * (1 + 1 + BATCH_ENTRIES as u64) + 2 * RECLAIM_BATCH as u64;
    assert!(
        stats.slots <= bound,
        "{} slots after {roots} roots on {threads} threads (bound {bound}): {stats:?}",
        stats.slots
    );
    assert!(stats.reclaims > 0, "{stats:?}");
    while table.reclaim_for_test() {}
    let stats = table.stats();
    assert_eq!(
        table.free_len(),
        stats.slots,
        "every slot free again: {stats:?}"
    );
}

/// With a cap, a claim past it reclaims whatever the limbo holds, and a root that still
/// finds no slot gets no label, counted.
#[test]
fn the_cap_bounds_the_table_and_counts_what_it_refuses() {
    let table = LabelTable::new();
    barrier_chosen(&table);
    table.set_cap(4);
    let live: Vec<_> = (0..4)
        .map(|n| table.claim(&value(n + 1)).expect("under the cap"))
        .collect();
    assert_eq!(table.claim(&value(9)), None, "at the cap, none free");
    assert_eq!(table.stats().capped, 1);
    // Published and released: in limbo, under a batch; the capped claim reclaims it.
    let mirror = table.naming().lease().expect("a mirror");
    crate::thread_ctx::to_name(&table, mirror, live[0]).expect("alive");
    let other = table.naming().lease().expect("a mirror");
    crate::thread_ctx::to_name(&table, other, live[1]).expect("alive");
    table.release(live[0]);
    assert_eq!(table.in_limbo(), 1);
    assert_eq!(
        table.claim(&value(10)),
        None,
        "still named: parked, not reused"
    );
    crate::thread_ctx::to_name(&table, mirror, live[1]).expect("alive");
    let again = table
        .claim(&value(11))
        .expect("named by none now: reclaimed");
    assert_eq!(index_of(again), index_of(live[0]));
    let stats = table.stats();
    assert_eq!((stats.slots, stats.capped), (4, 2), "{stats:?}");
    mirror.give_back();
    other.give_back();
}

/// A process forked while another thread holds a reclaim's batch (popped from the limbo,
/// not yet freed or parked) gets the batch back in the child's limbo, with the counts
/// taken again from the lists: nothing held by a thread the child does not have is lost.
#[test]
fn a_fork_inside_a_reclaim_returns_its_batch_to_the_childs_limbo() {
    let table: &'static LabelTable = Box::leak(Box::new(LabelTable::new()));
    let mirror = table.naming().lease().expect("a mirror");
    for n in 0..10 {
        let label = table.claim(&value(n + 1)).expect("room");
        crate::thread_ctx::to_name(table, mirror, label).expect("alive");
        table.release(label);
    }
    mirror.give_back();
    assert_eq!(table.in_limbo(), 10);
    // A reclaimer stopped inside its batch on another thread: six popped and held.
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let reclaimer = std::thread::spawn(move || {
        table.hold_batch_for_test(6, || {
            held_tx.send(()).expect("main");
            done_rx.recv().expect("main");
        })
    });
    held_rx.recv().expect("reclaimer");
    assert_eq!(table.limbo_len(), 4, "six held by the reclaimer");
    // SAFETY: the child runs this test's own code only and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // As the crate's fork handler does (a direct `fork` runs no handler).
        table.naming().after_fork_in_child(None);
        table.after_fork_in_child();
        let ok = table.limbo_len() == 10 && table.in_limbo() == 10 && {
            while table.reclaim_for_test() {}
            table.in_limbo() == 0 && table.free_len() == 10
        };
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's limbo did not get the batch back: status {status:#x}"
    );
    done_tx.send(()).expect("reclaimer");
    reclaimer.join().expect("reclaimer");
    assert_eq!(table.limbo_len(), 10, "the parent's batch went back too");
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
