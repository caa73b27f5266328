//! CPU counters of local root spans, in a table the signal handler can never fault on.
//!
//! The sampler's signal handler adds every sample to the counters of the local root the
//! thread is running, at the moment the sample is taken. A [`LocalRoot`](crate::LocalRoot)
//! is public and `Copy`, so a copy can outlive its span (kept in a variable, entered again
//! through `SpanContextGuard`, left behind by a forgotten guard). It therefore carries no
//! address, only a [`CpuHandle`]: a slot index and the slot's generation.
//!
//! ```text
//!  claim (root span starts)          handler (any thread, any time)        release (root ends)
//!  pop a free slot                   IN_FLIGHT += 1                        generation += 1 (even)
//!  zero counters                     slot = table[index] (never freed)     read the totals
//!  generation += 1 (odd) ─► handle   generation == handle's? add           slot → limbo
//!                                    IN_FLIGHT -= 1
//!  limbo → free once IN_FLIGHT == 0 is seen after the release
//! ```
//!
//! **Never freed.** Slots live in a [`NeverFreed`] table: any index below the allocated
//! count names valid memory; an index beyond it is refused.
//!
//! **Generations.** A slot's generation is odd while a root owns it. The handler adds only
//! when the generation it reads equals the handle's; a stale handle (its root ended) is
//! counted in [`stale_handles`] and adds nothing.
//!
//! **Reuse.** A released slot is reused only after `IN_FLIGHT == 0` was observed after its
//! release (all four operations `SeqCst`, and a `fence(SeqCst)` between the store and the
//! load on each side, the form loom checks): a handler that read the old generation before
//! the release has finished by then, so it can never add into the next root's counters.
//! Free and limbo lists live in the caller's shards (the evidence table), under locks it
//! already holds; nothing here locks.

use crate::sync::{fence, spin_loop, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::never_freed::NeverFreed;

/// Slots per chunk (a model's table needs a few: loom's cost grows with its atomics).
const CHUNK: usize = if cfg!(loom) { 4 } else { 256 };
/// Chunks at most: 4,194,304 local roots alive at once (a chunk is 8 KiB).
const MAX_CHUNKS: usize = if cfg!(loom) { 4 } else { 16_384 };

/// One root's counters.
struct Slot {
    /// Odd while a root owns the slot.
    generation: AtomicU32,
    samples: AtomicU64,
    time_ns: AtomicU64,
    /// Wall time threads spent inside the root: the low 16 bits of the owning generation
    /// in the top 16 bits, `clock::ticks` in the low 48 (78 hours of nanoseconds, or 26
    /// hours of a 3 GHz time-stamp counter). Added to by span hooks on
    /// any thread, not by the handler, so it does not take part in the `IN_FLIGHT`
    /// quiescence; the generation inside the word makes an add from a thread that left
    /// the root after it ended fail instead of landing in the next owner's total.
    active: AtomicU64,
    /// Wall time the root's futures spent woken but not yet polled (queued for a worker),
    /// as measured by the plain-API future wrapper; same layout as `active`, with bit 47
    /// set once anything measured it (so "not measured" is not reported as 0).
    queued: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            generation: AtomicU32::new(0),
            samples: AtomicU64::new(0),
            time_ns: AtomicU64::new(0),
            active: AtomicU64::new(0),
            queued: AtomicU64::new(0),
        }
    }
}

/// Spins `release` waits at most for a handler in flight (a model explores both outcomes,
/// the wait ending and running out, in fewer).
const RELEASE_SPINS: usize = if cfg!(loom) { 3 } else { 1000 };

/// Bits of [`Slot::active`] holding nanoseconds.
const ACTIVE_NS_BITS: u32 = 48;
const ACTIVE_NS_MASK: u64 = (1 << ACTIVE_NS_BITS) - 1;
/// In [`Slot::queued`]: something measured it.
const QUEUED_MEASURED: u64 = 1 << (ACTIVE_NS_BITS - 1);
const QUEUED_NS_MASK: u64 = QUEUED_MEASURED - 1;

/// The generation tag [`Slot::active`] carries for `generation`.
fn active_tag(generation: u32) -> u64 {
    u64::from(generation & 0xffff) << ACTIVE_NS_BITS
}

/// The counters and what handlers and releases share: the process has one ([`ROOTS`],
/// which the functions of this module use), a model builds its own.
pub(crate) struct RootTable {
    slots: NeverFreed<Slot, CHUNK, MAX_CHUNKS>,
    /// Handlers between their generation check and their last counter update.
    in_flight: AtomicUsize,
    /// Samples whose root had already ended.
    stale: AtomicU64,
    /// Active-time adds whose root had already ended.
    stale_active: AtomicU64,
}

impl RootTable {
    crate::sync::const_fn! {
        pub(crate) fn new() -> RootTable {
            RootTable {
                slots: NeverFreed::new(),
                in_flight: AtomicUsize::new(0),
                stale: AtomicU64::new(0),
                stale_active: AtomicU64::new(0),
            }
        }
    }

    fn slot(&self, index: u32) -> Option<&'static Slot> {
        self.slots.get(index)
    }
}

crate::sync::lazy_static_value! {
    /// The process's counters.
    static ROOTS: RootTable = RootTable::new();
}

/// Names one root's counters: slot index and generation. `Copy`, no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CpuHandle {
    index: u32,
    generation: u32,
}

impl CpuHandle {
    /// The packed form kept in the span context record (0 = no counters).
    pub(crate) fn to_raw(self) -> u64 {
        (u64::from(self.index) + 1) << 32 | u64::from(self.generation)
    }

    /// Unpacks [`CpuHandle::to_raw`]; 0 is "none".
    pub(crate) fn from_raw(raw: u64) -> Option<CpuHandle> {
        let index = (raw >> 32) as u32;
        (index != 0).then(|| CpuHandle {
            index: index - 1,
            generation: raw as u32,
        })
    }
}

/// Why a slot could not be had.
#[derive(Debug)]
pub(crate) struct TableFull;

/// The per-shard lists of reusable and released slots. The owner serialises access.
#[derive(Debug, Default)]
pub(crate) struct SlotLists {
    free: Vec<u32>,
    limbo: Vec<u32>,
}

impl SlotLists {
    /// Claims a slot with zeroed counters for a new root.
    pub(crate) fn claim(&mut self) -> Result<CpuHandle, TableFull> {
        self.claim_in(&ROOTS)
    }

    /// [`SlotLists::claim`] from `roots`.
    fn claim_in(&mut self, roots: &RootTable) -> Result<CpuHandle, TableFull> {
        if self.free.is_empty()
            && !self.limbo.is_empty()
            && roots.in_flight.load(Ordering::SeqCst) == 0
        {
            // Every slot in limbo was released before this load: no handler still
            // holds its old generation.
            self.free.append(&mut self.limbo);
        }
        let index = match self.free.pop() {
            Some(index) => index,
            None => roots.slots.fresh(|_| Slot::new()).ok_or(TableFull)?.0,
        };
        let slot = roots.slot(index).ok_or(TableFull)?;
        slot.samples.store(0, Ordering::Relaxed);
        slot.time_ns.store(0, Ordering::Relaxed);
        let next = slot.generation.load(Ordering::Relaxed).wrapping_add(1);
        slot.active.store(active_tag(next), Ordering::Relaxed);
        slot.queued.store(active_tag(next), Ordering::Relaxed);
        // Even (free) → odd (owned); the release orders the zeroing before it.
        let generation = slot
            .generation
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        Ok(CpuHandle { index, generation })
    }

    /// Ends `handle`'s ownership and returns its totals. Later samples and active time
    /// under the same handle are not counted.
    pub(crate) fn release(&mut self, handle: CpuHandle) -> RootTotals {
        self.release_in(&ROOTS, handle)
    }

    /// [`SlotLists::release`] into `roots`.
    fn release_in(&mut self, roots: &RootTable, handle: CpuHandle) -> RootTotals {
        let Some(slot) = roots.slot(handle.index) else {
            return RootTotals::default();
        };
        if slot
            .generation
            .compare_exchange(
                handle.generation,
                handle.generation.wrapping_add(1),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_err()
        {
            return RootTotals::default();
        }
        // The store-load order of the reuse rule, stated as fences (loom checks them; it
        // takes SeqCst accesses for AcqRel), paired with the one in `record`: a handler
        // that read the old generation is counted in flight for every later load.
        fence(Ordering::SeqCst);
        // Closes the active word to adds under the old tag, and takes its total.
        let closed = active_tag(handle.generation.wrapping_add(1));
        let active = slot.active.swap(closed, Ordering::SeqCst);
        let queued = slot.queued.swap(closed, Ordering::SeqCst);
        // A handler that passed the generation check just before the release may still be
        // adding: wait for it a little (handlers are short), without ever blocking long.
        for _ in 0..RELEASE_SPINS {
            if roots.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            spin_loop();
        }
        let totals = RootTotals {
            samples: slot.samples.load(Ordering::Relaxed),
            cpu_ns: slot.time_ns.load(Ordering::Relaxed),
            active_ticks: active & ACTIVE_NS_MASK,
            queued_ns: (queued & QUEUED_MEASURED != 0).then_some(queued & QUEUED_NS_MASK),
        };
        self.limbo.push(handle.index);
        totals
    }
}

/// What one root's counters add up to when it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RootTotals {
    /// CPU samples taken under the root.
    pub(crate) samples: u64,
    /// The CPU time they stand for.
    pub(crate) cpu_ns: u64,
    /// Wall time threads spent inside the root, in `clock::ticks` (see [`add_active`]).
    pub(crate) active_ticks: u64,
    /// Wall time its futures spent woken but not polled, when a wrapper measured it (see
    /// [`add_queued`]).
    pub(crate) queued_ns: Option<u64>,
}

/// Adds `ns` (`clock::ticks`) of wall time spent inside the root `raw` (a
/// [`CpuHandle::to_raw`]) by the calling thread. Saturates at 2⁴⁸; returns false (and
/// adds nothing) when the root has ended. Lock-free: one compare-and-swap on the root's
/// own slot, so threads of different roots never touch the same cache line.
#[inline]
pub(crate) fn add_active(raw: u64, ns: u64) -> bool {
    add_tagged(&ROOTS, raw, ns, |slot| &slot.active, ACTIVE_NS_MASK, 0)
}

/// Adds `ns` of wall time one of the root's futures spent woken but not yet polled, and
/// marks the root's queued time as measured. Same rules as [`add_active`].
#[inline]
pub(crate) fn add_queued(raw: u64, ns: u64) -> bool {
    add_tagged(
        &ROOTS,
        raw,
        ns,
        |slot| &slot.queued,
        QUEUED_NS_MASK,
        QUEUED_MEASURED,
    )
}

/// Adds `ns` into the tagged word `word(slot)` of the root `raw`: the tag (the owning
/// generation) must match, the nanoseconds saturate at `mask`, `flags` are set.
#[inline]
fn add_tagged(
    roots: &RootTable,
    raw: u64,
    ns: u64,
    word: impl Fn(&Slot) -> &AtomicU64,
    mask: u64,
    flags: u64,
) -> bool {
    let Some(handle) = CpuHandle::from_raw(raw) else {
        return false;
    };
    let Some(slot) = roots.slot(handle.index) else {
        return false;
    };
    let word = word(slot);
    let tag = active_tag(handle.generation);
    let mut current = word.load(Ordering::Relaxed);
    loop {
        if current & !ACTIVE_NS_MASK != tag {
            roots.stale_active.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let total = (current & mask).saturating_add(ns).min(mask);
        let next = tag | (current & ACTIVE_NS_MASK & !mask) | flags | total;
        match word.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(seen) => current = seen,
        }
    }
}

/// Active-time adds refused because their root had already ended (work that went on
/// under a root after its span closed, such as a detached task).
pub(crate) fn stale_active() -> u64 {
    ROOTS.stale_active.load(Ordering::Relaxed)
}

/// Counts one sample standing for `time_ns` of CPU under `raw` (a [`CpuHandle::to_raw`]).
/// Async-signal-safe: atomics only, and every memory access is to a never-freed slot.
#[inline]
pub(crate) fn record(raw: u64, time_ns: u64) {
    record_in(&ROOTS, raw, time_ns);
}

/// [`record`] into `roots`.
#[inline]
fn record_in(roots: &RootTable, raw: u64, time_ns: u64) {
    let Some(handle) = CpuHandle::from_raw(raw) else {
        return;
    };
    roots.in_flight.fetch_add(1, Ordering::SeqCst);
    // Paired with the fence in `release`: a release that this handler's generation load
    // misses sees the handler in flight.
    fence(Ordering::SeqCst);
    match roots.slot(handle.index) {
        Some(slot) if slot.generation.load(Ordering::SeqCst) == handle.generation => {
            slot.samples.fetch_add(1, Ordering::Relaxed);
            slot.time_ns.fetch_add(time_ns, Ordering::Relaxed);
        }
        _ => {
            roots.stale.fetch_add(1, Ordering::Relaxed);
        }
    }
    roots.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// Samples taken under a root that had already ended (a kept or leaked `LocalRoot`);
/// they were not counted for any span.
pub(crate) fn stale_handles() -> u64 {
    ROOTS.stale.load(Ordering::Relaxed)
}

/// In a forked child only the forking thread exists, and it is not in a handler.
pub(crate) fn after_fork_in_child() {
    ROOTS.in_flight.store(0, Ordering::Relaxed);
}

#[cfg(all(test, loom))]
mod loom_model;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_handle_counts_nothing_and_its_slot_is_reused_cleanly() {
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        record(a.to_raw(), 10);
        record(a.to_raw(), 10);
        assert!(add_active(a.to_raw(), 100));
        assert_eq!(
            lists.release(a),
            RootTotals {
                samples: 2,
                cpu_ns: 20,
                active_ticks: 100,
                queued_ns: None
            }
        );
        assert!(!add_active(a.to_raw(), 5), "ended root refuses active time");
        let stale_before = stale_handles();
        record(a.to_raw(), 10);
        assert_eq!(stale_handles(), stale_before + 1, "stale handle refused");
        // The slot comes back (no handler in flight here) with zeroed counters and a new
        // generation: the old handle still adds nothing to the new root.
        let b = lists.claim().expect("slot");
        assert_eq!(b.index, a.index);
        assert_ne!(b.generation, a.generation);
        record(a.to_raw(), 10);
        record(b.to_raw(), 7);
        assert!(
            !add_active(a.to_raw(), 1_000),
            "old handle adds nothing to the new root"
        );
        assert!(add_active(b.to_raw(), 3));
        assert_eq!(
            lists.release(b),
            RootTotals {
                samples: 1,
                cpu_ns: 7,
                active_ticks: 3,
                queued_ns: None
            }
        );
        // Releasing twice is harmless.
        assert_eq!(lists.release(b), RootTotals::default());
    }

    #[test]
    fn garbage_handles_are_refused_not_followed() {
        let before = stale_handles();
        for raw in [
            u64::MAX,
            (u64::from(u32::MAX)) << 32,
            (NeverFreed::<Slot, CHUNK, MAX_CHUNKS>::CAPACITY as u64 + 1) << 32 | 1,
            0x1234_5678_9abc_def1,
        ] {
            record(raw, 1);
        }
        assert_eq!(stale_handles(), before + 4);
        record(0, 1);
        assert_eq!(stale_handles(), before + 4, "0 is no handle");
        assert_eq!(CpuHandle::from_raw(0), None);
    }

    #[test]
    fn active_time_saturates_and_survives_racing_threads() {
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        let raw = a.to_raw();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(move || {
                    for _ in 0..10_000 {
                        add_active(raw, 3);
                    }
                });
            }
        });
        add_active(raw, 0);
        assert_eq!(lists.release(a).active_ticks, 4 * 10_000 * 3, "no add lost");
        let b = lists.claim().expect("slot");
        assert!(add_active(b.to_raw(), u64::MAX));
        assert!(add_active(b.to_raw(), 1));
        assert_eq!(lists.release(b).active_ticks, ACTIVE_NS_MASK);
    }

    #[test]
    fn queued_time_is_none_until_measured_and_then_counts_even_zero() {
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        assert!(add_active(a.to_raw(), 9));
        assert_eq!(lists.release(a).queued_ns, None, "never measured");
        let b = lists.claim().expect("slot");
        assert!(add_queued(b.to_raw(), 0));
        assert!(add_queued(b.to_raw(), 5));
        assert!(add_active(b.to_raw(), 7), "the two words are independent");
        let totals = lists.release(b);
        assert_eq!((totals.queued_ns, totals.active_ticks), (Some(5), 7));
        assert!(!add_queued(b.to_raw(), 1), "ended root refuses queued time");
        let c = lists.claim().expect("slot");
        assert!(add_queued(c.to_raw(), u64::MAX));
        assert_eq!(
            lists.release(c).queued_ns,
            Some(QUEUED_NS_MASK),
            "saturates"
        );
    }

    #[test]
    fn raw_round_trip() {
        let h = CpuHandle {
            index: 7,
            generation: 9,
        };
        assert_eq!(CpuHandle::from_raw(h.to_raw()), Some(h));
        let h = CpuHandle {
            index: u32::MAX - 1,
            generation: u32::MAX,
        };
        assert_eq!(CpuHandle::from_raw(h.to_raw()), Some(h));
    }
}
