//! loom models of the thread slots (`docs/signal-path.md`, "Proof").
//!
//! **Free list, generations, drain.** Two threads claim a slot, take a sample through
//! their own handler and let the slot go, while the collector (the model's main thread)
//! drains. The handler runs on its owner thread (it must: the slot is accepted only there,
//! and a release bumps the generation on that thread after its handler has finished), so
//! it is modelled where a signal can land, inline in the owner thread: right after the
//! claim (the signal is accepted) and after the release (a signal queued before the
//! release arrives late). Properties:
//!
//! * a slot is never handed out twice: each owner writes its slot's witness cell (a loom
//!   `UnsafeCell`) while it holds the slot, and loom fails the model if two owners'
//!   writes are not ordered one after the other;
//! * a stale generation is never accepted: the late signal finds no slot, whoever owns the
//!   slot by then;
//! * every sample pushed is drained exactly once (nothing is left in a ring that is
//!   reused, nothing is drained twice), and in the end every slot is on the free list
//!   exactly once.
//!
//! **The watchdog's read.** The watchdog reads a thread's span record from another thread
//! while its owner lets go of the slot and then exits (its thread-local record is freed).
//! The model stands for the freeing with one more write of the record, a poison value,
//! after `release` returns: a read that could see it is a read that could touch freed
//! memory. Property: a read the handshake lets through never sees the poison.

use std::cell::Cell;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use super::{Owner, Slot, SlotTable, CHUNK};
use crate::label::Label;
use crate::sampler::ring::Ring;
use crate::sampler::stack::StackBounds;
use crate::span_context::SpanContextCell;

/// loom threads run on generator stacks of 32 KiB by default; the owners' claims, samples
/// and releases get room to spare.
const STACK: usize = 1 << 20;

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn")
}

fn owner(cell: *const SpanContextCell) -> Owner {
    Owner {
        // SAFETY: gettid has no preconditions. (loom's threads share one OS thread: the
        // handler's owner check passes for all of them, so only generations protect here.)
        tid: unsafe { libc::gettid() },
        cell,
        stack: StackBounds { lo: 0, hi: 0 },
        ring_capacity: 1,
        alloc_capacity: 0,
        cpu_ns: 0,
        adopted: false,
    }
}

/// A table whose first chunk (all the slots a model uses) is built by the model's main
/// thread, before any other starts: chunks are published through `NeverFreed`'s own
/// atomics, which this model does not check.
fn table() -> Arc<SlotTable> {
    let table = Arc::new(SlotTable::new());
    let first = table.fresh().expect("a slot");
    table.push_free(first);
    table
}

/// Per slot index: written by the slot's owner while it holds the slot.
struct Witness(Vec<UnsafeCell<u32>>);

// SAFETY: only through loom's checked accesses.
unsafe impl Sync for Witness {}

impl Witness {
    fn new() -> Witness {
        Witness((0..CHUNK).map(|_| UnsafeCell::new(0)).collect())
    }

    fn own(&self, slot: &Slot) {
        // SAFETY: the model's claim: loom fails it if two owners write unordered.
        self.0[slot.index as usize].with_mut(|owners| unsafe { *owners += 1 });
    }
}

thread_local! {
    /// Executions in which the second owner got the first one's slot.
    static REUSED: Cell<usize> = const { Cell::new(0) };
}

/// One thread's registration: claim, one sample, release, and a late signal.
fn registered_thread(table: &SlotTable, witness: &Witness, sample: u64) -> (u32, bool) {
    let slot = table.claim(owner(std::ptr::null())).expect("a slot");
    witness.own(slot);
    let value = slot.timer_value();
    // The signal, on this thread while it owns the slot.
    let accepted = table
        .for_signal(value)
        .expect("the live generation is accepted");
    assert!(std::ptr::eq(accepted, slot));
    let pushed = accepted
        .ring()
        .and_then(Ring::producer)
        .expect("the handler's producer role")
        .push_with(|r| r.frames[0] = sample);
    witness.own(slot);
    table.release(slot);
    // A signal queued before the release, delivered after it.
    assert!(
        table.for_signal(value).is_none(),
        "a stale generation was accepted"
    );
    (slot.index, pushed)
}

fn two_threads_and_a_drain() {
    two_threads_and_a_drain_in(table());
}

fn two_threads_and_a_drain_in(table: Arc<SlotTable>) {
    let witness = Arc::new(Witness::new());
    let threads: Vec<_> = (1..=2u64)
        .map(|sample| {
            let (table, witness) = (table.clone(), witness.clone());
            spawn(move || registered_thread(&table, &witness, sample))
        })
        .collect();
    let mut drained = Vec::new();
    table.drain(&mut |r| drained.push(r.frames[0]), &mut |_| {});
    let results: Vec<(u32, bool)> = threads
        .into_iter()
        .map(|t| t.join().expect("registered thread"))
        .collect();
    if results[0].0 == results[1].0 {
        REUSED.with(|n| n.set(n.get() + 1));
    }
    table.drain(&mut |r| drained.push(r.frames[0]), &mut |_| {});
    drained.sort_unstable();
    let pushed: Vec<u64> = (1..=2u64).filter(|&s| results[s as usize - 1].1).collect();
    assert_eq!(drained, pushed, "a sample lost or drained twice");
    let mut free = Vec::new();
    while let Some(slot) = table.pop_free() {
        free.push(slot.index);
    }
    free.sort_unstable();
    let listed = free.len();
    free.dedup();
    assert_eq!(free.len(), listed, "a slot on the free list twice");
    assert_eq!(
        listed,
        table.iter().count(),
        "a slot missing from the free list"
    );
}

#[test]
fn loom_slots_are_handed_out_once_and_stale_generations_refused() {
    crate::sync::check("slots", 3, two_threads_and_a_drain);
    assert!(
        REUSED.with(Cell::get) > 0,
        "no execution reused a slot: the model proves nothing"
    );
}

/// The broken variant: with the hand-over of a slot from one owner to the next weakened to
/// relaxed (the free list's head and link, the slot's generation and phase, its ring's
/// role flags: each of them alone orders the next owner after the last), the second owner
/// can use the slot without being ordered after the first owner's use of it.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_slots_with_a_relaxed_free_list_hand_a_slot_over_unordered() {
    crate::sync::check("slots, broken", 2, || {
        let table = table();
        // A first registration gives the slot its ring, whose role flags also order one
        // owner after the next.
        let first = table.clone();
        spawn(move || first.release(first.claim(owner(std::ptr::null())).expect("a slot")))
            .join()
            .expect("first registration");
        table.free_head.relax_for_model();
        let slot = table.slot(0).expect("the model's slot");
        slot.next_free.relax_for_model();
        slot.generation.relax_for_model();
        slot.phase.relax_for_model();
        let ring = slot.ring().expect("the slot's ring");
        crate::sampler::ring::loom_model::relax_roles(ring);
        two_threads_and_a_drain_in(table);
    });
}

/// What the owner's record holds while it lives (a label word).
fn root() -> Label {
    Label::from_raw(7).expect("non-zero")
}

/// What a reader of the record after the owner exited would find.
fn poison() -> Label {
    Label::from_raw(0xdead).expect("non-zero")
}

fn watchdog_and_exiting_owner() {
    let table = table();
    let cell = Arc::new(SpanContextCell::new());
    let owner_thread = {
        let (table, cell) = (table.clone(), cell.clone());
        spawn(move || {
            let slot = table.claim(owner(Arc::as_ptr(&cell))).expect("a slot");
            cell.write_for_model(Some(root()));
            table.release(slot);
            // The thread exits: its record is gone. A reader still inside it would see this.
            cell.write_for_model(Some(poison()));
        })
    };
    let slot = table.slot(0).expect("the model's slot");
    let generation = slot.generation();
    if let Some((_, seen)) = slot.read_cell_if_owned(generation) {
        assert_ne!(
            seen,
            Some(poison()),
            "the watchdog read the record after its owner let go of the slot"
        );
    }
    owner_thread.join().expect("owner");
}

#[test]
fn loom_watchdog_never_reads_a_record_after_its_owner_let_go() {
    crate::sync::check("watchdog handshake", 3, watchdog_and_exiting_owner);
}

/// The broken variant: without the handshake's two `fence(SeqCst)` (loom takes the
/// SeqCst accesses for AcqRel) the watchdog's generation check and the owner's wait for
/// readers can both miss the other's write.
#[test]
#[should_panic(expected = "after its owner let go")]
fn loom_watchdog_without_the_fences_reads_a_freed_record() {
    crate::sync::without_fences(|| {
        crate::sync::check("watchdog handshake, broken", 2, watchdog_and_exiting_owner)
    });
}

/// **Adoption.** The collector's scan adopts thread T (claims a slot for it, held, arms a
/// timer, lets go and looks for T's own slot: `adopt::publish_adoption`) while T registers
/// itself (takes back any adoption, claims a slot of its own, arms its timer, takes back
/// again: `adopt::take_back`). Property: T ends with exactly one live slot with a timer,
/// its own, and the adoption's slot, if it still holds the adoption, has none.
fn adoption_racing_registration() {
    let table = Arc::new(SlotTable::new());
    for _ in 0..3 {
        let slot = table.fresh().expect("a slot");
        table.push_free(slot);
    }
    const T: libc::pid_t = 4_242;
    let owner = |adopted| Owner {
        tid: T,
        cell: std::ptr::null(),
        stack: StackBounds { lo: 0, hi: 0 },
        ring_capacity: 1,
        alloc_capacity: 0,
        cpu_ns: 0,
        adopted,
    };
    // Timer ids no timer of this process has (`timer_delete` fails on them, harmlessly).
    let fake = |n: usize| (0x7fff_0000 + n) as libc::timer_t;
    let scanner = {
        let table = table.clone();
        spawn(move || {
            let slot = table.claim(owner(true)).expect("a slot");
            let generation = slot.generation();
            slot.set_timer(fake(1));
            crate::sampler::adopt::publish_adoption(&table, slot, T);
            (slot.index, generation)
        })
    };
    crate::sampler::adopt::take_back(&table, T, |_| true);
    let own = table.claim(owner(false)).expect("a slot");
    own.set_timer(fake(2));
    crate::sampler::adopt::take_back(&table, T, |_| true);
    let (index, generation) = scanner.join().expect("scanner");
    let adoption = table.slot(index).expect("slot");
    assert!(own.has_timer(), "the thread's own timer was deleted");
    if adoption.generation() == generation {
        assert!(
            !adoption.has_timer(),
            "thread T has two timers: its own and an adoption's"
        );
    }
    let timed = table
        .iter()
        .filter(|s| s.is_live() && s.owner_tid() == T && s.has_timer())
        .count();
    assert_eq!(
        timed, 1,
        "thread T has two timers: {timed} live slots with one"
    );
}

#[test]
fn loom_an_adoption_racing_a_registration_leaves_one_timer() {
    crate::sync::check("adoption handshake", 3, adoption_racing_registration);
}

/// The broken variant: without the fences between publishing and looking, the scan and
/// the registering thread can both miss the other, and the thread keeps two timers.
#[test]
#[should_panic(expected = "two timers")]
fn loom_an_adoption_without_the_fences_leaves_two_timers() {
    crate::sync::without_fences(|| {
        crate::sync::check(
            "adoption handshake, broken",
            2,
            adoption_racing_registration,
        )
    });
}
