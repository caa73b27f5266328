//! loom models of the per-slot CPU ledger (`docs/signal-path.md`, "Proof").
//!
//! **Racing chargers.** The owner's handler charges at two signals (its clock read 110,
//! then 130) while the watchdog charges from its `schedstat` read (120, on another
//! thread), all on a ledger reset at 100. Property: what they were given adds up to
//! exactly the 30 ns the clock moved (no nanosecond given twice, none lost), and the
//! ledger ends at the largest reading (it never moved back).
//!
//! **A new owner.** The watchdog charges a slot's ledger from the old owner's clock
//! (`advance_while`, checking the slot's generation as `run_delay::note` does) while the
//! old owner lets go of the slot and a new owner claims it (the real `SlotTable::release`
//! and `claim`, whose `reset` starts the ledger at the new thread's clock) and its handler
//! charges. Property: the old owner's reading never moves the new owner's ledger: the new
//! owner's charges are exactly its own clock's advance, and the watchdog is given the old
//! owner's time or nothing. The reset is a plain store racing the watchdog's
//! compare-and-swap, a case loom 0.7.3 gets wrong (tokio-rs/loom#254: it let the new
//! owner's handler read the watchdog's 300 over the reset that followed it): the model
//! runs the ledger's stores as swaps (`crate::sync`, `Stores`), which loom orders right.

use loom::sync::Arc;
use loom::thread;

use super::CpuLedger;
use crate::sampler::slots::loom_model::{owner_at, spawn, table};
use crate::sampler::slots::SlotTable;

fn handler_and_watchdog() {
    let ledger = Arc::new(CpuLedger::default());
    ledger.reset(100);
    let watchdog = {
        let ledger = ledger.clone();
        thread::spawn(move || ledger.advance_while(120, || true))
    };
    let handler = ledger.advance(110) + ledger.advance(130);
    let watchdog = watchdog.join().expect("watchdog");
    assert_eq!(
        handler + watchdog,
        30,
        "the chargers were given {handler} + {watchdog} ns of a 30 ns advance"
    );
    assert_eq!(ledger.advance(140), 10, "the ledger did not end at 130");
}

#[test]
fn loom_cpu_ledger_gives_each_nanosecond_once() {
    crate::sync::check("cpu ledger", 8, handler_and_watchdog);
}

fn watchdog_and_new_owner() {
    watchdog_and_new_owner_in(table());
}

fn watchdog_and_new_owner_in(table: Arc<SlotTable>) {
    // The old owner registered at its clock's 100, and a signal charged it up to 150.
    let (slot, old) = {
        let table = table.clone();
        spawn(move || {
            let slot = table.claim(owner_at(100)).expect("a slot");
            assert_eq!(slot.cpu.advance(150), 50);
            (slot, slot.generation())
        })
        .join()
        .expect("old owner")
    };
    // loom 0.7.3 could otherwise slip the claim's reset into the watchdog's compare-and-swap
    // (see `crate::sync`'s `Stores`). As a swap, the reset also continues the release
    // sequence of the value it overwrites, the old owner's charge (ordered before this
    // thread by the join anyway) or the watchdog's own: no edge the property rests on,
    // which is the release's generation bump before the reset, on this thread.
    slot.cpu.given_ns.stores_as_swaps_for_model();
    // The watchdog read the old owner's clock at 300 while the slot was its.
    let watchdog = spawn(move || slot.cpu.advance_while(300, || slot.generation() == old));
    table.release(slot);
    // A new thread, its clock at 20, gets the slot; its handler charges at 70.
    let new = table.claim(owner_at(20)).expect("a slot");
    assert!(std::ptr::eq(new, slot), "the slot was not reused");
    let handler = new.cpu.advance(70);
    let watchdog = watchdog.join().expect("watchdog");
    assert_eq!(
        handler, 50,
        "the old owner's clock moved the new owner's ledger: its handler was given {handler} ns"
    );
    // More than the old owner's 150: the watchdog moved the ledger from the new owner's.
    assert!(
        watchdog == 0 || watchdog == 150,
        "the old owner's clock moved the new owner's ledger: the watchdog was given {watchdog} ns"
    );
    assert_eq!(
        new.cpu.advance(100),
        30,
        "the new owner's ledger is not at its handler's 70"
    );
}

#[test]
fn loom_cpu_ledger_is_never_moved_by_a_previous_owners_clock() {
    crate::sync::check("cpu ledger, new owner", 8, watchdog_and_new_owner);
}

/// The broken variant: with the ledger's word relaxed (the reset's release store and the
/// chargers' acquire loads), the watchdog can read the new owner's reset and still see the
/// old generation: its compare-and-swap then moves the new owner's ledger.
#[test]
#[should_panic(expected = "moved the new owner's ledger")]
fn loom_cpu_ledger_relaxed_is_moved_by_a_previous_owners_clock() {
    crate::sync::check("cpu ledger, new owner, broken", 3, || {
        let table = table();
        let slot = table.iter().next().expect("the model's slot");
        slot.cpu.given_ns.relax_for_model();
        watchdog_and_new_owner_in(table);
    });
}
