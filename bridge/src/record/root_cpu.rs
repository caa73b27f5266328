//! CPU counters of local root spans, in a table the signal handler can never fault on.
//!
//! The sampler's signal handler adds every sample to the counters of the local root the
//! thread is running, at the moment the sample is taken. A root's label (its slot in
//! `label::table`) can outlive its span: a [`LocalRoot`](crate::LocalRoot) clone kept in a
//! variable or a `ProfilingContext` a detached task still holds. So the label carries no
//! address of the counters, only a [`CpuHandle`]: a slot index and the slot's 64-bit
//! generation.
//!
//! ```text
//!  claim (root span starts)          handler (any thread, any time)        release (root ends)
//!  pop a free slot                   IN_FLIGHT += 1                        generation += 1 (even)
//!  zero counters                     slot = table[index] (never freed)     read the totals
//!  generation += 1 (odd) ─► handle   generation == handle's? add           slot → free if it saw
//!                                    IN_FLIGHT -= 1                        both counts at 0, else
//!                                                                          limbo (or retired)
//!  limbo → free once IN_FLIGHT == 0 and no add in progress are seen after the release
//! ```
//!
//! **Never freed.** Slots live in a [`NeverFreed`] table: any index below the allocated
//! count names valid memory; an index beyond it is refused.
//!
//! **Generations.** A slot's generation is odd while a root owns it. The handler adds only
//! when the generation it reads equals the handle's; a stale handle (its root ended) is
//! counted in [`stale_handles`] and adds nothing.
//!
//! **Why 42 bits, and retirement.** A stale handle is refused only while its generation
//! differs from the slot's, so the generation must not come back to a value it had. It
//! takes the top 42 bits of [`Slot::state`] and moves by 2 per reuse (claim + release, at
//! least four read-modify-writes on the slot's own cache line plus the caller's shard
//! lock, so at most ~10⁷ reuses of one slot a second): a slot lasts 2⁴¹ reuses, 2.5 days
//! at that rate and years at any a service reaches. The release that would take it to
//! 2⁴² (0 in the word) retires the slot instead of listing it: it is never claimed again
//! (it costs one slot's memory), so no generation is ever handed out twice.
//!
//! **Reuse.** A released slot is reused only after `IN_FLIGHT == 0` was observed after its
//! release (all four operations `SeqCst`, and a `fence(SeqCst)` between the store and the
//! load on each side, the form loom checks): a handler that read the old generation before
//! the release has finished by then, so it can never add into the next root's counters.
//! The release itself loads both counts after its fence, so a slot it finds quiet (the
//! usual case) goes straight to the free list; limbo holds the others.
//! The watchdog's CPU adds ([`add_cpu`]) count themselves in flight as handlers do.
//! Active, queued and run-delay time (added by span hooks on any thread, see
//! [`ActiveCounter::add`], and by the watchdog, [`add_runqueue`]) follow the same rule on
//! the slot's own count of adds in progress, which shares one word with the generation
//! ([`Slot::state`]): an add counts itself in and reads the generation in one
//! read-modify-write, the release moves the generation and reads the count in another,
//! so one of them always sees the other (the word's modification order decides, no
//! fence), and the check of the full generation and the add it allows are never split by
//! a reuse.
//! Free and limbo lists live in the caller's shards (the evidence table), under locks it
//! already holds; nothing here locks.
//!
//! **Fork.** A forked child has only the forking thread, which is in no handler and no
//! add: its fork handler zeroes the in-flight count and every slot's count of adds in
//! progress (keeping the generation), so a slot another parent thread was adding to at
//! the fork is not held in limbo for ever.

use crate::sync::{fence, spin_loop, AtomicU64, AtomicUsize, Ordering};

use crate::never_freed::NeverFreed;

/// Slots per chunk (a model's table needs a few: loom's cost grows with its atomics).
const CHUNK: usize = if cfg!(loom) { 4 } else { 256 };
/// Chunks at most: 4,194,304 local roots alive at once (a chunk is 18 KiB: 256 slots of
/// 72 bytes).
const MAX_CHUNKS: usize = if cfg!(loom) { 4 } else { 16_384 };

/// Bits of [`Slot::state`] counting adds in progress. Linux runs at most 2²² threads
/// (`PID_MAX_LIMIT`) and a thread counts itself in at most once at a time, so the count
/// never carries into the generation.
const ADDERS_BITS: u32 = 22;
const ADDERS_MASK: u64 = (1 << ADDERS_BITS) - 1;
/// One generation in [`Slot::state`].
const GENERATION_ONE: u64 = 1 << ADDERS_BITS;
/// Generations a slot can carry (2⁴²); the release that would reach it retires the slot.
const GENERATION_LIMIT: u64 = 1 << (64 - ADDERS_BITS);

/// The generation in a [`Slot::state`] word.
#[inline]
fn generation_of(state: u64) -> u64 {
    state >> ADDERS_BITS
}

/// One root's counters.
struct Slot {
    /// The generation (odd while a root owns the slot; never handed out twice, see the
    /// module docs) times [`GENERATION_ONE`], plus the adds of active, queued or run-delay
    /// time between their generation check and their last access to the words: the slot
    /// is not reused while any is (see [`add_tagged_at`]).
    state: AtomicU64,
    samples: AtomicU64,
    time_ns: AtomicU64,
    /// Wall time threads spent inside the root, in `clock::ticks` (a `u64`: 194 years of
    /// a 3 GHz time-stamp counter). Added to by span hooks on any thread, not by the
    /// handler: one `fetch_add` per root transition, between the add's count in and out
    /// of `state`, which decide which root it is for (see [`ActiveCounter::add`]). The
    /// next claim zeroes it once no add is in progress.
    active: AtomicU64,
    /// Of `active`, nanoseconds the root's long stretches (see `span_context::active`)
    /// were not on a CPU, as the thread's CPU clock read at their ends says; bit 63 once
    /// a long stretch could not be read (its CPU time is then unknown). Added with
    /// `active`, under the same count.
    off_cpu: AtomicU64,
    /// The reference figures of the test-only exact timing (every stretch read, see
    /// `span_context::active::reference`): CPU and run delay, nanoseconds.
    #[cfg(test)]
    ref_cpu: AtomicU64,
    #[cfg(test)]
    ref_delay: AtomicU64,
    /// Wall time the root's futures spent woken but not yet polled (queued for a worker),
    /// as measured by the plain-API future wrapper: a 16-bit tag of the owning generation
    /// in the top 16 bits, nanoseconds in the low 47, and bit 47 set once anything
    /// measured it (so "not measured" is not reported as 0). The tag only tells the owner
    /// from the same ownership once released: a release that finds an add in progress (in
    /// `state`) swaps in the next generation's tag, so an add that passed the generation
    /// check just before the release fails (and counts as stale) instead of adding to a
    /// total already taken; one that finds none only reads the word, which nothing can
    /// change any more. Which root an add is for is decided by the full generation,
    /// checked as the add counts itself in (16 bits would repeat every 32,768 reuses).
    queued: AtomicU64,
    /// Run delay: time the root's threads were runnable inside it but not running, as
    /// the scheduler counts it, read at the ends of the root's long stretches; same layout
    /// as `queued`, with [`RUNQUEUE_UNKNOWN`] set once a long stretch could not be read.
    runqueue: AtomicU64,
    /// Estimated bytes and allocations the root's threads allocated (the allocation
    /// sampler's weights, see `allocations`), added by the allocating thread itself under
    /// the same count as `active`. Allocations in [`OBJECTS_ONE`]ths: a sample stands for
    /// `1/p` of them, rarely a whole number (rounding each to one undercounts large
    /// allocations, sampled with `p` near 1).
    alloc_bytes: AtomicU64,
    alloc_objects: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            time_ns: AtomicU64::new(0),
            active: AtomicU64::new(0),
            off_cpu: AtomicU64::new(0),
            #[cfg(test)]
            ref_cpu: AtomicU64::new(0),
            #[cfg(test)]
            ref_delay: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            runqueue: AtomicU64::new(0),
            alloc_bytes: AtomicU64::new(0),
            alloc_objects: AtomicU64::new(0),
        }
    }

    /// The slot's generation.
    #[inline]
    fn generation(&self) -> u64 {
        generation_of(self.state.load(Ordering::SeqCst))
    }

    /// Replaces the generation, keeping the count of adds in progress (tests: a model's
    /// adder may be counted in while the test moves the generation on).
    #[cfg(test)]
    fn set_generation(&self, generation: u64) {
        let mut state = self.state.load(Ordering::SeqCst);
        loop {
            let next = generation << ADDERS_BITS | state & ADDERS_MASK;
            match self
                .state
                .compare_exchange(state, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
    }
}

/// One allocation in [`Slot::alloc_objects`] (2⁴⁸ allocations a root at most).
pub(crate) const OBJECTS_ONE: u64 = 1 << 16;

/// Spins `release` waits at most for a handler in flight (a model explores both outcomes,
/// the wait ending and running out, in fewer).
const RELEASE_SPINS: usize = if cfg!(loom) { 3 } else { 1000 };

/// Bits of [`Slot::queued`] below its generation tag.
const TAGGED_BITS: u32 = 48;
const TAGGED_VALUE_MASK: u64 = (1 << TAGGED_BITS) - 1;
/// In [`Slot::queued`]: something measured it.
const QUEUED_MEASURED: u64 = 1 << (TAGGED_BITS - 1);
const QUEUED_NS_MASK: u64 = QUEUED_MEASURED - 1;
/// In [`Slot::runqueue`]: a long stretch's run delay could not be read, so the root's
/// total is unknown (not the sum of the others).
const RUNQUEUE_UNKNOWN: u64 = 1 << (TAGGED_BITS - 2);
/// Nanoseconds in [`Slot::runqueue`] (46 bits: 19 hours a root, saturating).
const RUNQUEUE_NS_MASK: u64 = RUNQUEUE_UNKNOWN - 1;
/// In [`Slot::off_cpu`]: a long stretch's CPU time could not be read.
const OFF_CPU_UNKNOWN: u64 = 1 << 63;

/// The generation tag [`Slot::queued`] and [`Slot::runqueue`] carry for `generation`:
/// tells `generation` from `generation + 1` (its release), which is all it is asked (see
/// [`Slot::queued`]).
fn tag(generation: u64) -> u64 {
    (generation & 0xffff) << TAGGED_BITS
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
    /// Slots retired because their generation would have wrapped.
    retired: AtomicU64,
    /// The most slots the table may hold (`crate::set_max_live_roots`, as the labels).
    cap: AtomicU64,
    /// Claims refused: the table held `cap` slots and the shard had none free.
    refused: AtomicU64,
}

impl RootTable {
    crate::sync::const_fn! {
        pub(crate) fn new() -> RootTable {
            RootTable {
                slots: NeverFreed::new(),
                in_flight: AtomicUsize::new(0),
                stale: AtomicU64::new(0),
                stale_active: AtomicU64::new(0),
                retired: AtomicU64::new(0),
                cap: AtomicU64::new(crate::label::table::DEFAULT_MAX_LABEL_SLOTS),
                refused: AtomicU64::new(0),
            }
        }
    }

    #[inline]
    fn slot(&self, index: u32) -> Option<&'static Slot> {
        self.slots.get(index)
    }

    /// A slot never used, within the cap (counted when refused).
    fn fresh(&self) -> Result<u32, TableFull> {
        if self.slots.len() as u64 >= self.cap.load(Ordering::Relaxed) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(TableFull);
        }
        match self.slots.fresh(|_| Slot::new()) {
            Some((index, _)) => Ok(index),
            None => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(TableFull)
            }
        }
    }
}

/// The counter table's size and refusals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RootCpuStats {
    /// Slots the table holds (never freed: its high-water mark).
    pub(crate) slots: u64,
    /// Claims refused at the cap.
    pub(crate) refused: u64,
}

/// The process's counter table now.
pub(crate) fn stats() -> RootCpuStats {
    RootCpuStats {
        slots: ROOTS.slots.len() as u64,
        refused: ROOTS.refused.load(Ordering::Relaxed),
    }
}

/// Caps the slots the process's counter table holds. A shard's free slots serve only
/// its own roots, so near the cap a root can be refused while another shard has one
/// free; roots spread over the 64 shards by span id, so only within a few percent of it.
pub(crate) fn set_cap(max: u64) {
    ROOTS.cap.store(max, Ordering::Relaxed);
}

crate::sync::lazy_static_value! {
    /// The process's counters.
    static ROOTS: RootTable = RootTable::new();
}

/// Names one root's counters: slot index and generation. `Copy`, no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CpuHandle {
    index: u32,
    generation: u64,
}

impl CpuHandle {
    /// The handle of slot `index` at `generation` (what [`CpuHandle::parts`] gave).
    pub(crate) fn from_parts(index: u32, generation: u64) -> CpuHandle {
        CpuHandle { index, generation }
    }

    /// The slot index and generation, for a holder that keeps them in atomics.
    pub(crate) fn parts(self) -> (u32, u64) {
        (self.index, self.generation)
    }

    /// The packed form kept in labels (0 = no counters): index + 1 in the high 64 bits,
    /// the whole generation in the low 64. It is written once per root into its label
    /// slot, so nothing needs it in one machine word, and the generation is not cut to
    /// make room for the index.
    pub(crate) fn to_raw(self) -> u128 {
        (u128::from(self.index) + 1) << 64 | u128::from(self.generation)
    }

    /// Unpacks [`CpuHandle::to_raw`]; 0 is "none", and so is a high half that names no
    /// `u32` index. No panic on any input (the signal handler calls it).
    #[inline]
    pub(crate) fn from_raw(raw: u128) -> Option<CpuHandle> {
        let high = (raw >> 64) as u64;
        let index = u32::try_from(high.checked_sub(1)?).ok()?;
        Some(CpuHandle {
            index,
            generation: raw as u64,
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
    /// Moves the slots of limbo that nothing can still add to under their old generation
    /// to the free list; true if it moved any.
    #[cfg(test)]
    fn recycle(&mut self) -> bool {
        self.recycle_in(&ROOTS)
    }

    /// [`SlotLists::recycle`] from `roots`.
    fn recycle_in(&mut self, roots: &RootTable) -> bool {
        // Every slot in limbo was released before these loads (all SeqCst): a handler or an
        // adder that counts itself in after them reads the new generation.
        if roots.in_flight.load(Ordering::SeqCst) != 0 {
            return false;
        }
        let before = self.free.len();
        let free = &mut self.free;
        self.limbo.retain(|&index| {
            let quiet = roots
                .slot(index)
                .is_none_or(|s| s.state.load(Ordering::SeqCst) & ADDERS_MASK == 0);
            if quiet {
                free.push(index);
            }
            !quiet
        });
        self.free.len() > before
    }

    /// True when a claim would take a fresh slot: nothing free, even after recycling
    /// the limbo. The caller may then [`adopt`](Self::adopt) a slot from a shared pool.
    pub(crate) fn needs_fresh(&mut self) -> bool {
        if self.free.is_empty() && !self.limbo.is_empty() {
            self.recycle_in(&ROOTS);
        }
        self.free.is_empty()
    }

    /// A free slot past the first `keep` free ones, for a shared pool: lists that had
    /// more roots once keep only a few spares, so that the table holds the peak of all
    /// roots at once, not the sum of every list's own peak.
    pub(crate) fn extra(&mut self, keep: usize) -> Option<u32> {
        if self.free.len() > keep {
            self.free.pop()
        } else {
            None
        }
    }

    /// Takes `index`, a free slot from a shared pool.
    pub(crate) fn adopt(&mut self, index: u32) {
        self.free.push(index);
    }

    /// Claims a slot with zeroed counters for a new root.
    pub(crate) fn claim(&mut self) -> Result<CpuHandle, TableFull> {
        self.claim_in(&ROOTS)
    }

    /// [`SlotLists::claim`] from `roots`.
    fn claim_in(&mut self, roots: &RootTable) -> Result<CpuHandle, TableFull> {
        if self.free.is_empty() && !self.limbo.is_empty() {
            self.recycle_in(roots);
        }
        let index = match self.free.pop() {
            Some(index) => index,
            None => roots.fresh()?,
        };
        let slot = roots.slot(index).ok_or(TableFull)?;
        slot.samples.store(0, Ordering::Relaxed);
        slot.time_ns.store(0, Ordering::Relaxed);
        // Even (free) and below the limit: a slot whose next release would reach it is
        // retired.
        let next = generation_of(slot.state.load(Ordering::Relaxed)) + 1;
        slot.active.store(0, Ordering::Relaxed);
        slot.off_cpu.store(0, Ordering::Relaxed);
        slot.alloc_bytes.store(0, Ordering::Relaxed);
        slot.alloc_objects.store(0, Ordering::Relaxed);
        #[cfg(test)]
        {
            slot.ref_cpu.store(0, Ordering::Relaxed);
            slot.ref_delay.store(0, Ordering::Relaxed);
        }
        slot.queued.store(tag(next), Ordering::Relaxed);
        slot.runqueue.store(tag(next), Ordering::Relaxed);
        // Even (free) → odd (owned); the release orders the zeroing before it.
        let generation = generation_of(slot.state.fetch_add(GENERATION_ONE, Ordering::SeqCst)) + 1;
        Ok(CpuHandle { index, generation })
    }

    /// Ends `handle`'s ownership and returns its totals. Later samples and active time
    /// under the same handle are not counted. A slot whose generation reaches 2⁴² here is
    /// retired: never listed again, so no later root gets a generation seen before.
    pub(crate) fn release(&mut self, handle: CpuHandle) -> RootTotals {
        self.release_in(&ROOTS, handle)
    }

    /// [`SlotLists::release`] into `roots`.
    fn release_in(&mut self, roots: &RootTable, handle: CpuHandle) -> RootTotals {
        let Some(slot) = roots.slot(handle.index) else {
            return RootTotals::default();
        };
        // The generation moves on and the adds in progress are counted in one
        // read-modify-write: an add that counts itself in after it reads the new
        // generation; one before it is in the count read here.
        let mut state = slot.state.load(Ordering::SeqCst);
        loop {
            if generation_of(state) != handle.generation {
                return RootTotals::default();
            }
            match slot.state.compare_exchange_weak(
                state,
                state.wrapping_add(GENERATION_ONE),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        // The store-load order of the reuse rule for handlers, stated as a fence (loom
        // checks it; it takes SeqCst accesses for AcqRel), paired with the ones in
        // `record` and `add_cpu`: a handler or a CPU add that read the old generation is
        // counted in flight for every later load, `recycle`'s included.
        fence(Ordering::SeqCst);
        let adders_quiet = state & ADDERS_MASK == 0;
        let (active, off_cpu, queued, runqueue, allocated) = if adders_quiet {
            // No add in progress as the generation moved on: an adder that counts itself
            // in later reads the new generation and leaves the words alone, and this
            // read-modify-write synchronises with every earlier adder's release of the
            // count. The words are final: read, not swapped (the next claim writes the
            // next owner's).
            (
                slot.active.load(Ordering::Relaxed),
                slot.off_cpu.load(Ordering::Relaxed),
                slot.queued.load(Ordering::Relaxed),
                slot.runqueue.load(Ordering::Relaxed),
                (
                    slot.alloc_bytes.load(Ordering::Relaxed),
                    slot.alloc_objects.load(Ordering::Relaxed),
                ),
            )
        } else {
            // An add that passed the generation check may still land: close the tagged
            // words to the old tag (it then fails, counted stale) and take their totals.
            // An active-time add landing after this read is lost to the root, and its
            // adder, which sees the generation moved as it counts itself out, counts it
            // stale; the slot waits in limbo until it is out, and the next claim zeroes
            // the word.
            let closed = tag(handle.generation.wrapping_add(1));
            (
                slot.active.load(Ordering::SeqCst),
                slot.off_cpu.load(Ordering::SeqCst),
                slot.queued.swap(closed, Ordering::SeqCst),
                slot.runqueue.swap(closed, Ordering::SeqCst),
                (
                    slot.alloc_bytes.load(Ordering::SeqCst),
                    slot.alloc_objects.load(Ordering::SeqCst),
                ),
            )
        };
        // A handler that passed the generation check just before the release may still be
        // adding: wait for it a little (handlers are short), without ever blocking long.
        let mut handlers_quiet = false;
        for _ in 0..RELEASE_SPINS {
            if roots.in_flight.load(Ordering::SeqCst) == 0 {
                handlers_quiet = true;
                break;
            }
            spin_loop();
        }
        let totals = RootTotals {
            samples: slot.samples.load(Ordering::Relaxed),
            sampled_cpu_ns: slot.time_ns.load(Ordering::Relaxed),
            active_ticks: active,
            off_cpu_ns: (off_cpu & OFF_CPU_UNKNOWN == 0).then_some(off_cpu),
            queued_ns: (queued & QUEUED_MEASURED != 0).then_some(queued & QUEUED_NS_MASK),
            runqueue: if runqueue & RUNQUEUE_UNKNOWN != 0 {
                RunDelay::Unknown
            } else if runqueue & QUEUED_MEASURED != 0 {
                RunDelay::Read(runqueue & RUNQUEUE_NS_MASK)
            } else {
                RunDelay::NoLongStretch
            },
            alloc_bytes: allocated.0,
            alloc_objects: (allocated.1 + OBJECTS_ONE / 2) / OBJECTS_ONE,
            #[cfg(test)]
            reference: (
                slot.ref_cpu.load(Ordering::Relaxed),
                slot.ref_delay.load(Ordering::Relaxed),
            ),
        };
        if handle.generation + 1 >= GENERATION_LIMIT {
            roots.retired.fetch_add(1, Ordering::Relaxed);
        } else if adders_quiet && handlers_quiet {
            // `recycle`'s condition, already seen: no add and no handler in flight, each
            // loaded (SeqCst) after the release's fence. The slot is free now; a claim
            // need not scan the limbo for it.
            self.free.push(handle.index);
        } else {
            self.limbo.push(handle.index);
        }
        totals
    }
}

/// Slots retired because their generation would have wrapped (see the module docs).
#[cfg(test)]
pub(crate) fn retired() -> u64 {
    ROOTS.retired.load(Ordering::Relaxed)
}

/// Sets the generation of the slot `index`, which must be free or in limbo (even): tests
/// drive it next to its limit, 2⁴¹ reuses being out of a test's reach.
#[cfg(test)]
fn set_generation(index: u32, generation: u64) {
    assert_eq!(generation & 1, 0, "a free slot's generation is even");
    ROOTS
        .slot(index)
        .expect("allocated")
        .set_generation(generation);
}

/// What one root's counters add up to when it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RootTotals {
    /// CPU samples taken under the root.
    pub(crate) samples: u64,
    /// The CPU time those samples stand for (the sampler's measure, used only where the
    /// stretches' could not be read).
    pub(crate) sampled_cpu_ns: u64,
    /// Wall time threads spent inside the root, in `clock::ticks` (see [`ActiveCounter::add`]).
    pub(crate) active_ticks: u64,
    /// Of the active time, what the root's long stretches spent off CPU; `None` when one
    /// of them could not be read.
    pub(crate) off_cpu_ns: Option<u64>,
    /// Wall time its futures spent woken but not polled, when a wrapper measured it (see
    /// [`add_queued`]).
    pub(crate) queued_ns: Option<u64>,
    /// Run delay of its threads inside it.
    pub(crate) runqueue: RunDelay,
    /// Estimated bytes and allocations made under it (0 unless allocations are sampled).
    pub(crate) alloc_bytes: u64,
    pub(crate) alloc_objects: u64,
    /// The test-only exact timing's CPU and run delay (see `span_context::active`).
    #[cfg(test)]
    pub(crate) reference: (u64, u64),
}

impl RootTotals {
    /// CPU time threads spent inside the root: the active time less what its long
    /// stretches spent off CPU (a short stretch counts as on CPU: see
    /// `span_context::active` for the bound), or, when a long stretch could not be read,
    /// what the samples stand for.
    pub(crate) fn cpu_ns(&self) -> u64 {
        match self.off_cpu_ns {
            Some(off) => crate::clock::ticks_to_ns(self.active_ticks).saturating_sub(off),
            None => self.sampled_cpu_ns,
        }
    }
}

/// A root's run delay, as its stretches measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum RunDelay {
    /// Read at the end of every long stretch: this many nanoseconds.
    Read(u64),
    /// No stretch of the root was long: each counts none (at most the threshold each).
    #[default]
    NoLongStretch,
    /// A long stretch could not be read (no `/proc`, a refused read): unknown.
    Unknown,
}

/// A root's counters found once, for the active-time adds of a thread that keeps running
/// it (each poll of its future): the slot (never freed) and the generation the adds check.
#[derive(Clone, Copy)]
pub(crate) struct ActiveCounter {
    slot: &'static Slot,
    generation: u64,
}

impl ActiveCounter {
    /// The counters `raw` (a [`CpuHandle::to_raw`]) names, if its index names a slot.
    #[inline]
    pub(crate) fn of(raw: u128) -> Option<ActiveCounter> {
        ActiveCounter::of_in(&ROOTS, raw)
    }

    /// [`ActiveCounter::of`] in `roots`.
    #[inline]
    fn of_in(roots: &RootTable, raw: u128) -> Option<ActiveCounter> {
        let handle = CpuHandle::from_raw(raw)?;
        let slot = roots.slot(handle.index)?;
        Some(ActiveCounter {
            slot,
            generation: handle.generation,
        })
    }

    /// Adds `ns` (`clock::ticks`) of wall time spent inside the root by the calling
    /// thread: true if it is in the root's total. Lock-free: three atomics on the root's
    /// own slot, so threads of different roots never write the same counter.
    ///
    /// The add counts itself into [`Slot::state`] and reads the generation in one
    /// `fetch_add`, adds with a plain `fetch_add`, and counts itself out (reading the
    /// generation again). A release orders its generation bump against both counts in the
    /// word's modification order: after the count out, it synchronises with it and its
    /// read of the total sees the add; between the two, the add may miss the total it
    /// read (refused, counted stale: it cannot tell), and the slot is not reused before
    /// the count out (`recycle`), so the next root never gets it; before the count in,
    /// the add sees the new generation and adds nothing.
    #[inline]
    pub(crate) fn add(self, ns: u64) -> bool {
        self.add_in(&ROOTS, ns)
    }

    /// [`ActiveCounter::add`], counting a refused add in `roots`.
    #[inline]
    fn add_in(self, roots: &RootTable, ns: u64) -> bool {
        let slot = self.slot;
        #[cfg(all(test, loom))]
        if loom_model::uncounted() {
            // The models' broken variant: the check without the count.
            let current = generation_of(slot.state.load(Ordering::SeqCst)) == self.generation;
            if current {
                slot.active.fetch_add(ns, Ordering::Relaxed);
            }
            return current;
        }
        let current = generation_of(slot.state.fetch_add(1, Ordering::SeqCst)) == self.generation;
        if current {
            slot.active.fetch_add(ns, Ordering::Relaxed);
        }
        // Release: the add above happens before a release that reads the count back (and
        // before a claim that sees it at zero and zeroes the word for the next owner).
        let after = slot.state.fetch_sub(1, Ordering::Release);
        let added = current && generation_of(after) == self.generation;
        if !added {
            roots.stale_active.fetch_add(1, Ordering::Relaxed);
        }
        added
    }
}

impl ActiveCounter {
    /// Adds an allocation sample's estimated `bytes` and `objects` to the root's totals,
    /// from the allocating thread: true if they are in them. The protocol of
    /// [`ActiveCounter::add`] (a release between the count in and out may miss them; the
    /// slot is not reused before the count out).
    #[inline]
    pub(crate) fn add_alloc(self, bytes: u64, objects: u64) -> bool {
        let slot = self.slot;
        let current = generation_of(slot.state.fetch_add(1, Ordering::SeqCst)) == self.generation;
        if current {
            slot.alloc_bytes.fetch_add(bytes, Ordering::Relaxed);
            slot.alloc_objects.fetch_add(objects, Ordering::Relaxed);
        }
        let after = slot.state.fetch_sub(1, Ordering::Release);
        let added = current && generation_of(after) == self.generation;
        if !added {
            ROOTS.stale_active.fetch_add(1, Ordering::Relaxed);
        }
        added
    }

    /// Adds a long stretch: `ticks` of wall time inside the root, and what reading the
    /// thread's clocks at its ends found (`exact`: nanoseconds of it off CPU, and of run
    /// delay, `None` when the schedstat file could not be read: the root's run delay is
    /// then unknown, its CPU time still exact), or `None` when the CPU clock could not be
    /// read (both unknown). The same protocol as [`ActiveCounter::add`], one count for
    /// all the words.
    #[inline]
    pub(crate) fn add_long(self, ticks: u64, exact: Option<(u64, Option<u64>)>) -> bool {
        self.add_long_in(&ROOTS, ticks, exact)
    }

    /// [`ActiveCounter::add_long`], counting a refused add in `roots`.
    #[inline]
    fn add_long_in(self, roots: &RootTable, ticks: u64, exact: Option<(u64, Option<u64>)>) -> bool {
        let slot = self.slot;
        #[cfg(all(test, loom))]
        if loom_model::uncounted() {
            // The models' broken variant: the check without the count.
            let current = generation_of(slot.state.load(Ordering::SeqCst)) == self.generation;
            if current {
                slot.active.fetch_add(ticks, Ordering::Relaxed);
                if let Some((off_cpu, Some(delay))) = exact {
                    slot.off_cpu.fetch_add(off_cpu, Ordering::Relaxed);
                    add_to(
                        &slot.runqueue,
                        tag(self.generation),
                        delay,
                        RUNQUEUE_NS_MASK,
                        QUEUED_MEASURED,
                    );
                }
            }
            return current;
        }
        let current = generation_of(slot.state.fetch_add(1, Ordering::SeqCst)) == self.generation;
        if current {
            slot.active.fetch_add(ticks, Ordering::Relaxed);
            let tag = tag(self.generation);
            match exact {
                Some((off_cpu, Some(delay))) => {
                    slot.off_cpu.fetch_add(off_cpu, Ordering::Relaxed);
                    add_to(
                        &slot.runqueue,
                        tag,
                        delay,
                        RUNQUEUE_NS_MASK,
                        QUEUED_MEASURED,
                    );
                }
                // The CPU clock read, the schedstat file not: CPU stays exact.
                Some((off_cpu, None)) => {
                    slot.off_cpu.fetch_add(off_cpu, Ordering::Relaxed);
                    add_to(&slot.runqueue, tag, 0, RUNQUEUE_NS_MASK, RUNQUEUE_UNKNOWN);
                }
                None => {
                    slot.off_cpu.fetch_or(OFF_CPU_UNKNOWN, Ordering::Relaxed);
                    add_to(&slot.runqueue, tag, 0, RUNQUEUE_NS_MASK, RUNQUEUE_UNKNOWN);
                }
            }
        }
        let after = slot.state.fetch_sub(1, Ordering::Release);
        let added = current && generation_of(after) == self.generation;
        if !added {
            roots.stale_active.fetch_add(1, Ordering::Relaxed);
        }
        added
    }

    /// The test-only reference: `cpu` and `delay` nanoseconds read at both ends of a
    /// stretch of any length.
    #[cfg(test)]
    pub(crate) fn add_reference(self, cpu: u64, delay: u64) {
        let slot = self.slot;
        if generation_of(slot.state.fetch_add(1, Ordering::SeqCst)) == self.generation {
            slot.ref_cpu.fetch_add(cpu, Ordering::Relaxed);
            slot.ref_delay.fetch_add(delay, Ordering::Relaxed);
        }
        slot.state.fetch_sub(1, Ordering::Release);
    }
}

/// [`ActiveCounter::add`] from the handle `raw` (tests).
#[cfg(test)]
pub(crate) fn add_active(raw: u128, ns: u64) -> bool {
    add_active_in(&ROOTS, raw, ns)
}

/// [`add_active`] into `roots`: the span hooks' path, for the models.
#[cfg(test)]
fn add_active_in(roots: &RootTable, raw: u128, ns: u64) -> bool {
    ActiveCounter::of_in(roots, raw).is_some_and(|counter| counter.add_in(roots, ns))
}

/// Adds `ns` of wall time one of the root's futures spent woken but not yet polled, and
/// marks the root's queued time as measured. Same rules as [`ActiveCounter::add`].
#[inline]
pub(crate) fn add_queued(raw: u128, ns: u64) -> bool {
    add_tagged(
        &ROOTS,
        raw,
        ns,
        |slot| &slot.queued,
        QUEUED_NS_MASK,
        QUEUED_MEASURED,
    )
}

/// Adds `ns` into the tagged word `word(slot)` of the root `raw`: the slot's generation
/// must be the handle's and the word's tag its owner's (not yet released), the
/// nanoseconds saturate at `mask`, `flags` are set.
///
/// The add counts itself into the slot's `adders` before it reads the generation and out
/// after its last access to the word; `recycle` lists a released slot again only once it
/// saw `adders == 0` after the release (all `SeqCst`). So an add that found its generation
/// current finishes before the slot has a next owner, and one that counts itself in later
/// finds the generation moved: the full 64 bits decide, not the word's 16-bit tag.
#[inline]
fn add_tagged(
    roots: &RootTable,
    raw: u128,
    ns: u64,
    word: impl Fn(&Slot) -> &AtomicU64,
    mask: u64,
    flags: u64,
) -> bool {
    ActiveCounter::of_in(roots, raw).is_some_and(|counter| {
        add_tagged_at(
            roots,
            counter.slot,
            counter.generation,
            ns,
            word,
            mask,
            flags,
        )
    })
}

/// [`add_tagged`] into `slot`, already found, for the root of `generation` (the
/// queued and run-delay words; active time has its own add, [`ActiveCounter::add`]).
#[inline]
fn add_tagged_at(
    roots: &RootTable,
    slot: &Slot,
    generation: u64,
    ns: u64,
    word: impl Fn(&Slot) -> &AtomicU64,
    mask: u64,
    flags: u64,
) -> bool {
    // Counts itself in and reads the generation at once: a release ordered after this in
    // the word's modification order sees the count, one ordered before is seen here.
    let state = slot.state.fetch_add(1, Ordering::SeqCst);
    let added =
        generation_of(state) == generation && add_to(word(slot), tag(generation), ns, mask, flags);
    // Release: the add above happens before a claim that sees the count back at zero
    // zeroes the word for the next owner.
    slot.state.fetch_sub(1, Ordering::Release);
    if !added {
        roots.stale_active.fetch_add(1, Ordering::Relaxed);
    }
    added
}

/// Adds `ns` into `word` if it still carries `tag` (its owner has not released it).
#[inline]
fn add_to(word: &AtomicU64, tag: u64, ns: u64, mask: u64, flags: u64) -> bool {
    let mut current = word.load(Ordering::Relaxed);
    loop {
        if current & !TAGGED_VALUE_MASK != tag {
            return false;
        }
        let total = (current & mask).saturating_add(ns).min(mask);
        let next = tag | (current & TAGGED_VALUE_MASK & !mask) | flags | total;
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
pub(crate) fn record(raw: u128, time_ns: u64) {
    record_in(&ROOTS, raw, time_ns);
}

/// [`record`] into `roots`.
#[inline]
fn record_in(roots: &RootTable, raw: u128, time_ns: u64) {
    if raw == 0 {
        return;
    }
    let Some(handle) = CpuHandle::from_raw(raw) else {
        roots.stale.fetch_add(1, Ordering::Relaxed);
        return;
    };
    roots.in_flight.fetch_add(1, Ordering::SeqCst);
    // Paired with the fence in `release`: a release that this handler's generation load
    // misses sees the handler in flight.
    fence(Ordering::SeqCst);
    match roots.slot(handle.index) {
        Some(slot) if slot.generation() == handle.generation => {
            // fetch_add wraps, it never panics.
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

/// In a forked child only the forking thread exists, and it is neither in a handler nor
/// in an add (atomics only: it runs in the child's `pthread_atfork` handler).
pub(crate) fn after_fork_in_child() {
    after_fork_in_child_in(&ROOTS);
}

/// [`after_fork_in_child`] for `roots`.
fn after_fork_in_child_in(roots: &RootTable) {
    roots.in_flight.store(0, Ordering::Relaxed);
    // An add another parent thread had counted in at the fork never counts out here: its
    // slot would stay in limbo for ever. The generation stays (handles name it). Only
    // slots with a count are written, so the child's copy of the rest stays shared.
    for slot in roots.slots.iter() {
        let state = slot.state.load(Ordering::Relaxed);
        if state & ADDERS_MASK != 0 {
            slot.state.store(state & !ADDERS_MASK, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_model;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_handle_counts_nothing_and_its_slot_is_reused_cleanly() {
        let _serial = stale_counter_lock();
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        record(a.to_raw(), 10);
        record(a.to_raw(), 10);
        assert!(add_active(a.to_raw(), 100));
        let counter = ActiveCounter::of(a.to_raw()).expect("slot");
        // An allocation sample standing for 1.5 allocations: kept in fractions, rounded
        // once, at the end.
        assert!(counter.add_alloc(1_000, 3 * OBJECTS_ONE / 2));
        assert_eq!(
            lists.release(a),
            RootTotals {
                samples: 2,
                sampled_cpu_ns: 20,
                active_ticks: 100,
                off_cpu_ns: Some(0),
                queued_ns: None,
                runqueue: RunDelay::NoLongStretch,
                alloc_bytes: 1_000,
                alloc_objects: 2,
                reference: (0, 0),
            }
        );
        assert!(!add_active(a.to_raw(), 5), "ended root refuses active time");
        assert!(
            !counter.add_alloc(1, OBJECTS_ONE),
            "ended root refuses allocations"
        );
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
                sampled_cpu_ns: 7,
                active_ticks: 3,
                off_cpu_ns: Some(0),
                queued_ns: None,
                runqueue: RunDelay::NoLongStretch,
                alloc_bytes: 0,
                alloc_objects: 0,
                reference: (0, 0),
            }
        );
        // Releasing twice is harmless.
        assert_eq!(lists.release(b), RootTotals::default());
    }

    #[test]
    fn garbage_handles_are_refused_not_followed() {
        let _serial = stale_counter_lock();
        let before = stale_handles();
        for raw in [
            u128::MAX,
            u128::from(u32::MAX) << 64,
            (NeverFreed::<Slot, CHUNK, MAX_CHUNKS>::CAPACITY as u128 + 1) << 64 | 1,
            0x1234_5678_9abc_def1_0fed_cba9_8765_4321,
        ] {
            record(raw, 1);
        }
        assert_eq!(stale_handles(), before + 4);
        record(0, 1);
        assert_eq!(stale_handles(), before + 4, "0 is no handle");
        assert_eq!(CpuHandle::from_raw(0), None);
        assert_eq!(CpuHandle::from_raw(u128::from(u32::MAX)), None, "no index");
        assert_eq!(
            CpuHandle::from_raw((u128::from(u32::MAX) + 2) << 64),
            None,
            "index beyond u32"
        );
    }

    #[test]
    fn active_time_survives_racing_threads_and_never_saturates() {
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
        // 2⁴⁸ ticks (26 hours of a 3 GHz TSC) and past: the word holds a root's whole life.
        assert!(add_active(b.to_raw(), 1 << 48));
        assert!(add_active(b.to_raw(), 1 << 50));
        assert_eq!(lists.release(b).active_ticks, (1 << 48) + (1 << 50));
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

    /// The table's cap: past it a claim that finds its shard's free list empty is
    /// refused, counted; a slot released comes back for the next claim.
    #[test]
    fn claims_past_the_cap_are_refused_and_counted() {
        let table: &'static RootTable = Box::leak(Box::new(RootTable::new()));
        table.cap.store(3, Ordering::Relaxed);
        let mut lists = SlotLists::default();
        let held: Vec<_> = (0..3)
            .map(|_| lists.claim_in(table).expect("under the cap"))
            .collect();
        assert!(lists.claim_in(table).is_err(), "at the cap");
        assert_eq!(table.refused.load(Ordering::Relaxed), 1);
        lists.release_in(table, held[1]);
        let again = lists.claim_in(table).expect("a released slot");
        assert_eq!(again.index, held[1].index);
        assert_eq!(table.slots.len(), 3, "the table did not grow");
    }

    /// The tests that count stale handles on the process's table, one at a time (the
    /// counter is shared: another test's stale sample would land in their delta).
    fn stale_counter_lock() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOCK.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[test]
    fn raw_round_trip() {
        let h = CpuHandle {
            index: 7,
            generation: 9,
        };
        assert_eq!(CpuHandle::from_raw(h.to_raw()), Some(h));
        let h = CpuHandle {
            index: u32::MAX,
            generation: u64::MAX,
        };
        assert_eq!(CpuHandle::from_raw(h.to_raw()), Some(h));
    }

    /// Claims the slot released last into `lists` again (a handler of another test in
    /// flight holds limbo back for a moment: `IN_FLIGHT` is process-wide).
    fn reclaim(lists: &mut SlotLists) -> CpuHandle {
        let start = std::time::Instant::now();
        while lists.free.is_empty() && !lists.recycle() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "limbo never recycled"
            );
            std::thread::yield_now();
        }
        lists.claim().expect("slot")
    }

    /// Issue 22: the active and queued words carry 16 bits of the generation, which repeat
    /// every 32,768 reuses of a slot. A root kept from then must still add nothing to the
    /// slot's owner now, whose tag is the same.
    #[test]
    fn a_stale_root_whose_tag_repeats_adds_nothing_to_the_live_one() {
        let _serial = stale_counter_lock();
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        assert!(add_active(a.to_raw(), 5));
        lists.release(a);
        // 32,767 reuses later: the next claim makes generation a + 65,536.
        set_generation(a.index, a.generation + 65_535);
        let b = reclaim(&mut lists);
        assert_eq!(b.index, a.index);
        assert_eq!(b.generation, a.generation + 65_536);
        assert_eq!(tag(b.generation), tag(a.generation), "same tag");
        let stale = stale_active();
        assert!(
            !add_active(a.to_raw(), 3_600_000_000_000),
            "an hour, refused"
        );
        assert!(!add_queued(a.to_raw(), 1_000));
        assert_eq!(stale_active(), stale + 2);
        let samples = stale_handles();
        record(a.to_raw(), 10);
        assert_eq!(stale_handles(), samples + 1);
        assert!(add_active(b.to_raw(), 7));
        assert_eq!(
            lists.release(b),
            RootTotals {
                samples: 0,
                sampled_cpu_ns: 0,
                active_ticks: 7,
                off_cpu_ns: Some(0),
                queued_ns: None,
                runqueue: RunDelay::NoLongStretch,
                alloc_bytes: 0,
                alloc_objects: 0,
                reference: (0, 0),
            }
        );
    }

    /// An add between its generation check and its write holds the slot: a released slot
    /// goes back to the free list only once no add is in progress on it.
    #[test]
    fn a_slot_is_not_reused_while_an_add_is_in_progress() {
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        let s = ROOTS.slot(a.index).expect("allocated");
        // An adder that read the generation just before the release.
        s.state.fetch_add(1, Ordering::SeqCst);
        lists.release(a);
        // A queued-time add's compare-and-swap comes after the release: the word was
        // closed to its tag.
        assert!(
            !add_to(
                &s.queued,
                tag(a.generation),
                5,
                QUEUED_NS_MASK,
                QUEUED_MEASURED
            ),
            "an add in progress landed after the release took the total"
        );
        assert!(!lists.recycle(), "held by the add in progress");
        let b = lists.claim().expect("slot");
        assert_ne!(b.index, a.index, "a fresh slot instead");
        // The adder's active time lands after the release read the total: lost to A (the
        // adder, seeing the generation moved as it counts out, counts it stale).
        s.active.fetch_add(5, Ordering::Relaxed);
        s.state.fetch_sub(1, Ordering::SeqCst);
        lists.release(b);
        let c = reclaim(&mut lists);
        let d = lists.claim().expect("slot");
        let mut reused = [c.index, d.index];
        reused.sort_unstable();
        let mut expected = [a.index, b.index];
        expected.sort_unstable();
        assert_eq!(reused, expected, "both back once the add is done");
        assert_eq!(
            lists.release(c).active_ticks + lists.release(d).active_ticks,
            0,
            "the late add reached the slot's next root"
        );
    }

    /// Issue 42: an add in progress at a fork (another parent thread between its count in
    /// and its count out) never ends in the child; the child's release of that slot must
    /// still list it free, and recycle what was in limbo.
    #[test]
    fn an_add_in_progress_at_a_fork_holds_no_slot_in_the_child() {
        crate::fork::install_handlers();
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        let b = lists.claim().expect("slot");
        let (sa, sb) = (
            ROOTS.slot(a.index).expect("allocated"),
            ROOTS.slot(b.index).expect("allocated"),
        );
        // Adders that counted themselves in (and read the generation) as the fork
        // happens: A's root still runs, B's was released while its add went on.
        sa.state.fetch_add(1, Ordering::SeqCst);
        sb.state.fetch_add(1, Ordering::SeqCst);
        lists.release(b);
        assert_eq!(lists.limbo, [b.index], "held by the add in progress");
        // The child's copy of the lists.
        let mut inherited = SlotLists {
            free: lists.free.clone(),
            limbo: lists.limbo.clone(),
        };
        let code = crate::fork::run_in_child(std::time::Duration::from_secs(10), move || {
            let lists = &mut inherited;
            lists.release(a);
            if !lists.free.contains(&a.index) {
                return 3; // A's release left it in limbo
            }
            if !lists.recycle() {
                return 4; // B never leaves limbo
            }
            // No adder left in either slot, the generations kept (A's moved on by its
            // release in the child).
            let state = |s: &Slot| s.state.load(Ordering::SeqCst);
            if (state(sa), state(sb))
                != (
                    (a.generation + 1) << ADDERS_BITS,
                    (b.generation + 1) << ADDERS_BITS,
                )
            {
                return 2;
            }
            0
        });
        // The parent's adders end.
        sa.state.fetch_sub(1, Ordering::SeqCst);
        sb.state.fetch_sub(1, Ordering::SeqCst);
        lists.release(a);
        assert_eq!(
            code,
            Some(0),
            "3: the released slot went to limbo, 4: limbo stuck, 2: count or generation wrong"
        );
    }

    /// A release that sees no add and no handler in flight lists the slot free at once;
    /// one that sees either leaves it in limbo until `recycle` sees both at zero.
    #[test]
    fn a_quiet_release_frees_the_slot_and_a_busy_one_holds_it() {
        let roots = RootTable::new();
        let mut lists = SlotLists::default();
        let a = lists.claim_in(&roots).expect("slot");
        lists.release_in(&roots, a);
        assert_eq!(
            (lists.free.as_slice(), lists.limbo.len()),
            (&[a.index][..], 0)
        );
        let b = lists.claim_in(&roots).expect("slot");
        assert_eq!(b.index, a.index, "reused without a recycle");
        // A handler in flight (it read B's generation before the release).
        roots.in_flight.fetch_add(1, Ordering::SeqCst);
        lists.release_in(&roots, b);
        assert_eq!(
            (lists.free.len(), lists.limbo.as_slice()),
            (0, &[b.index][..])
        );
        assert!(!lists.recycle_in(&roots), "still in flight");
        roots.in_flight.fetch_sub(1, Ordering::SeqCst);
        // An add in progress holds it the same way.
        assert!(lists.recycle_in(&roots));
        let c = lists.claim_in(&roots).expect("slot");
        assert_eq!(c.index, a.index);
        let slot = roots.slot(c.index).expect("allocated");
        slot.state.fetch_add(1, Ordering::SeqCst);
        lists.release_in(&roots, c);
        assert_eq!(lists.limbo.as_slice(), &[c.index][..], "held by the add");
        slot.state.fetch_sub(1, Ordering::SeqCst);
        assert!(lists.recycle_in(&roots));
    }

    /// The generation at its wrap: the release that would take it from `u64::MAX` to 0
    /// retires the slot. It is never handed out again, so neither the handle from before
    /// the wrap nor one with the generation a first owner after it would get is accepted.
    #[test]
    fn a_slot_whose_generation_would_wrap_is_retired() {
        let _serial = stale_counter_lock();
        let mut lists = SlotLists::default();
        let a = lists.claim().expect("slot");
        lists.release(a);
        set_generation(a.index, GENERATION_LIMIT - 2);
        let last = reclaim(&mut lists);
        assert_eq!(
            (last.index, last.generation),
            (a.index, GENERATION_LIMIT - 1)
        );
        record(last.to_raw(), 10);
        assert!(add_active(last.to_raw(), 4));
        let retired_before = retired();
        assert_eq!(
            lists.release(last),
            RootTotals {
                samples: 1,
                sampled_cpu_ns: 10,
                active_ticks: 4,
                off_cpu_ns: Some(0),
                queued_ns: None,
                runqueue: RunDelay::NoLongStretch,
                alloc_bytes: 0,
                alloc_objects: 0,
                reference: (0, 0),
            },
            "its last root still counts"
        );
        assert_eq!(retired(), retired_before + 1);
        assert!(!lists.recycle(), "nothing in limbo");
        for _ in 0..100 {
            let next = lists.claim().expect("slot");
            assert_ne!(next.index, a.index, "a retired slot is never handed out");
            lists.release(next);
            lists.recycle();
        }
        let after_wrap = CpuHandle {
            index: a.index,
            generation: 1,
        };
        let samples = stale_handles();
        for stale in [last, a, after_wrap] {
            record(stale.to_raw(), 10);
            assert!(!add_active(stale.to_raw(), 1));
            assert!(!add_queued(stale.to_raw(), 1));
        }
        assert_eq!(stale_handles(), samples + 3);
    }
}
