//! The label slots: every live root's label (ids, name, flags, CPU counters) written once
//! into a never-freed, generation-checked slot, named by one 64-bit [`Label`] word.
//!
//! ```text
//!  claim (root resolved)              reader (handler, watchdog, any thread)   release (last handle)
//!  pop a free slot (or a fresh one)   g = generation (Acquire)                 generation += 1 (even)
//!  fence(Release)                     g == word's? else "no label"             push on the free list
//!  write the fields                   load the fields                          (or retire, see below)
//!  generation += 1 (odd) (Release)    fence(Acquire)
//!  word = cpu bit | index | gen       generation == g still? else "no label"
//! ```
//!
//! **The word.** Bit 63: the label has CPU counters (so a root transition knows whether to
//! read the clock without touching the slot); bits 40..63: the slot index (2²³ slots,
//! 8,388,608 labels alive at once); bits 0..40: the generation, odd while a root owns the
//! slot, so no valid word is 0 and `Option<Label>` is one word.
//!
//! **Generations never come back.** A reader accepts fields only when the generation it
//! reads before and after them is the word's, so a generation must never be handed out
//! twice. It moves by 2 per reuse; the release after which the next claim would take it to
//! 2⁴⁰ − 1 retires the slot instead of listing it. That value, all ones, is never handed
//! out: with the CPU bit and the last index it is the whole word `u64::MAX` (the OTEP
//! record's "being filled" mark), and a record's release mark (the word + 1) would carry
//! into the index bits. So a root's generation is at most 2⁴⁰ − 3. A reuse is a claim and
//! a release (two compare-and-swaps on the free list's line, an `Arc` allocated and freed,
//! well over 100 ns), so a slot lasts 2³⁹ reuses: 15 hours at 10⁷ roots a second all on one
//! slot, 64 days at 10⁵. Retiring costs that slot's 64 bytes, once per that much time.
//!
//! **Reading is loads only** (a signal handler may do it): two loads of the generation,
//! six of fields, an acquire fence (no instruction on x86-64). A torn read — the slot
//! released and claimed again between the two generation loads — reports "no label", as a
//! stale word does.
//!
//! **The free list** is a lock-free stack (Treiber) of slot indexes, its head tagged with
//! a 40-bit count of pushes and pops, so a head that was popped and pushed back between a
//! reader's load and its compare-and-swap is told apart. Slots are never freed, so reading
//! the link of a slot another thread just popped is harmless. No lock: a root can be
//! claimed from any hook, and a process forked in the middle of a claim finds the list
//! whole.
//!
//! **Limbo.** A released slot whose OTEP 4947 record was published may still be named by
//! a thread's `otel_thread_ctx_v1`, which out-of-process readers follow without checking
//! any generation. Such a slot waits in a second stack, the limbo. A claim that finds the
//! free list empty, and the limbo holding at least [`RECLAIM_BATCH`] slots, reclaims:
//! it pops at most a batch (plus the slots parked in a few mirrors, below), runs one
//! heavy barrier and a scan of the threads' mirrors (see `thread_ctx/naming.rs`), keeps
//! one unnamed slot for itself and frees the other unnamed ones. Any number of claims
//! reclaim at once, each on its own batch; none waits for another, and none takes a
//! fresh slot because another is reclaiming: it reclaims too. A slot still named is
//! parked in the mirror that names it (an idle thread's mirror keeps the last root it
//! ran), out of the limbo, so the next reclaim does not pop it again; a later reclaim
//! collects it (each takes the parked slots of [`PARKED_WINDOW`] mirrors, in turn). A
//! slot whose record was never filled (a root claimed while the thread context was off,
//! and never published) goes straight back to the free list; while the context is on, a
//! claim fills the record of every root with ids or a name, so those releases go
//! through limbo.
//!
//! **The bound.** A fresh slot is taken only when the free list is empty and the
//! claim's own reclaim freed nothing: the limbo then held fewer than a batch, or its
//! slots were in other reclaims' batches (at most a batch each, one per thread
//! reclaiming) or named. So the table holds at most the roots alive, plus
//! [`RECLAIM_BATCH`] in limbo, plus a batch per thread reclaiming at that moment, plus
//! one parked slot per mirror (per thread that publishes): the roots alive plus
//! O(threads), at any thread count and any preemption. [`LabelTable::set_cap`] bounds
//! it outright: past the cap a claim reclaims whatever the limbo holds, and a root that
//! still finds no slot gets no label (counted in `capped`).
//!
//! **Fork.** A reclaim's batch is published in a [`Batch`] it leases, not held in its
//! locals: a process forked while another thread reclaims gets the batch back in the
//! child's limbo. A batch entry is cleared before its slot is pushed (cleared after, a
//! child would list it twice), so a fork landing between those two stores loses that one
//! slot in the child, and so does one landing between a pop and its entry's store.

use crate::sync::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use crate::thread_ctx::Naming;

use super::{Label, RootLabel};
use crate::never_freed::NeverFreed;
use crate::span_name::SpanName;

/// Slots per chunk (a model's table needs a few).
const CHUNK: usize = if cfg!(loom) { 4 } else { 1024 };
/// Chunks at most: the word's 23 index bits.
const MAX_CHUNKS: usize = if cfg!(loom) {
    4
} else {
    (1 << INDEX_BITS) / 1024
};

/// Bits of the word holding the generation.
pub(crate) const GENERATION_BITS: u32 = 40;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
/// Bits of the word holding the slot index.
const INDEX_BITS: u32 = 23;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// The word's "has CPU counters" bit.
pub(crate) const CPU_BIT: u64 = 1 << 63;

/// Bits of the free list's head holding index + 1 (0: empty).
const HEAD_INDEX_BITS: u32 = 24;
const HEAD_INDEX_MASK: u64 = (1 << HEAD_INDEX_BITS) - 1;

/// One label. 64 bytes: one cache line, read by the handler of every sample under it.
#[repr(C, align(64))]
struct Slot {
    /// Odd while a root owns the slot; never handed out twice (see the module docs).
    generation: AtomicU64,
    span_id: AtomicU64,
    trace_hi: AtomicU64,
    trace_lo: AtomicU64,
    cpu_hi: AtomicU64,
    cpu_lo: AtomicU64,
    name: AtomicU32,
    /// The W3C trace flags byte; the only field written after the claim (one store,
    /// [`LabelTable::set_flags`]), so a reader sees the old or the new byte, either of
    /// them the root's.
    flags: AtomicU32,
    /// Free list link: index + 1 of the next free slot (0: none).
    next_free: AtomicU32,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            generation: AtomicU64::new(0),
            span_id: AtomicU64::new(0),
            trace_hi: AtomicU64::new(0),
            trace_lo: AtomicU64::new(0),
            cpu_hi: AtomicU64::new(0),
            cpu_lo: AtomicU64::new(0),
            name: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            next_free: AtomicU32::new(0),
        }
    }
}

/// The slots and their free list: the process has one ([`LABELS`]), a model builds its own.
pub(crate) struct LabelTable {
    slots: NeverFreed<Slot, CHUNK, MAX_CHUNKS>,
    /// Tag (40 bits, counts pushes and pops) << 24 | index + 1 of the top free slot.
    free: AtomicU64,
    /// Slots retired because their generation reached the word's last value.
    retired: AtomicU64,
    /// Labels that could not be claimed: the table was full.
    exhausted: AtomicU64,
    /// Released slots a thread's OTEP 4947 pointer may still name: a stack like `free`,
    /// emptied a batch at a time by [`LabelTable::reclaim`].
    limbo: AtomicU64,
    /// Slots in `limbo` (about: a push or pop and its count are two steps).
    in_limbo: AtomicU64,
    /// Slots parked in the mirrors that named them at a reclaim's scan.
    parked: AtomicU64,
    /// Reclaims run (each one heavy barrier).
    reclaims: AtomicU64,
    /// Slots taken fresh (never used before) because no free one could be had.
    fresh: AtomicU64,
    /// The most slots the table may hold (see [`LabelTable::set_cap`]).
    cap: AtomicU64,
    /// Labels refused because the table held `cap` slots, none of them free.
    capped: AtomicU64,
    /// The batches reclaims hold, published for a forked child (see the module docs).
    batches: NeverFreed<Batch, BATCH_CHUNK, BATCH_CHUNKS>,
    /// The slots' OTEP 4947 records and the threads that name them.
    naming: Naming,
}

/// A claim reclaims when the limbo holds this many, and pops at most this many: one
/// heavy barrier and a scan of the threads' mirrors per batch.
pub(crate) const RECLAIM_BATCH: usize = if cfg!(loom) { 1 } else { 64 };
/// Mirrors whose parked slot a reclaim collects, besides its batch.
const PARKED_WINDOW: usize = if cfg!(loom) { 2 } else { 8 };
/// Entries of a [`Batch`]: the popped slots and the collected parked ones.
pub(crate) const BATCH_ENTRIES: usize = RECLAIM_BATCH + PARKED_WINDOW;
/// Batches per chunk, and chunks: one batch per thread reclaiming at once.
const BATCH_CHUNK: usize = if cfg!(loom) { 2 } else { 16 };
const BATCH_CHUNKS: usize = if cfg!(loom) { 2 } else { 4096 };

/// The default [`LabelTable::set_cap`]: 262,144 slots (16 MiB of slots, and 80 MiB of
/// OTEP records if the thread context is on), far above the roots a service keeps alive.
pub(crate) const DEFAULT_MAX_LABEL_SLOTS: u64 = 1 << 18;
/// The most slots the word can index.
pub(crate) const MAX_LABEL_SLOTS: u64 = 1 << INDEX_BITS;

/// The slots one reclaim holds between its pops and its pushes, where a forked child
/// finds them (index + 1 per entry, 0: none).
struct Batch {
    owned: AtomicBool,
    entries: [AtomicU32; BATCH_ENTRIES],
}

impl Batch {
    /// Built owned, by the one thread `fresh` hands it to (as a mirror, see
    /// `Mirror::new`).
    fn new() -> Batch {
        Batch {
            owned: AtomicBool::new(true),
            entries: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

crate::sync::lazy_static_value! {
    /// The process's labels.
    pub(crate) static LABELS: LabelTable = LabelTable::new();
}

impl LabelTable {
    crate::sync::const_fn! {
        pub(crate) fn new() -> LabelTable {
            LabelTable {
                slots: NeverFreed::new(),
                free: AtomicU64::new(0),
                retired: AtomicU64::new(0),
                exhausted: AtomicU64::new(0),
                limbo: AtomicU64::new(0),
                in_limbo: AtomicU64::new(0),
                parked: AtomicU64::new(0),
                reclaims: AtomicU64::new(0),
                fresh: AtomicU64::new(0),
                cap: AtomicU64::new(DEFAULT_MAX_LABEL_SLOTS),
                capped: AtomicU64::new(0),
                batches: NeverFreed::new(),
                naming: Naming::new(),
            }
        }
    }

    /// Writes `value` into a free slot and returns its word; `None` when every slot the
    /// cap allows is taken (counted). While the OpenTelemetry thread context is on, the slot's
    /// OTEP 4947 record is filled too (else by the root's first publication, if any).
    #[inline]
    pub(crate) fn claim(&self, value: &RootLabel) -> Option<Label> {
        self.claim_with(value, crate::thread_ctx::is_enabled())
    }

    /// [`Self::claim`], filling the slot's record if `fill_record`.
    pub(crate) fn claim_with(&self, value: &RootLabel, fill_record: bool) -> Option<Label> {
        let (index, slot) = self.pop(&self.free).or_else(|| self.refill())?;
        // Even: free (a fresh slot's 0, or its last release's).
        let generation = slot.generation.load(Ordering::Relaxed) + 1;
        // A reader that loads one of the stores below, then its acquire fence, then the
        // generation, sees at least the release that freed the slot (ordered before this
        // fence through the free list): it never takes these fields for the old owner's.
        fence(Ordering::Release);
        slot.span_id.store(value.span_id, Ordering::Relaxed);
        slot.trace_hi
            .store((value.trace_id >> 64) as u64, Ordering::Relaxed);
        slot.trace_lo
            .store(value.trace_id as u64, Ordering::Relaxed);
        slot.cpu_hi
            .store((value.cpu >> 64) as u64, Ordering::Relaxed);
        slot.cpu_lo.store(value.cpu as u64, Ordering::Relaxed);
        slot.name
            .store(value.name.map_or(0, SpanName::to_raw), Ordering::Relaxed);
        slot.flags.store(u32::from(value.flags), Ordering::Relaxed);
        slot.generation.store(generation, Ordering::Release);
        let cpu = if value.cpu != 0 { CPU_BIT } else { 0 };
        let word = cpu | u64::from(index) << GENERATION_BITS | generation;
        if fill_record {
            self.naming.fill_claimed(index, word, value);
        }
        Some(Label::from_word(word))
    }

    /// The label `label` names, if its root still owns the slot. Loads only:
    /// async-signal-safe, from any thread.
    #[inline]
    pub(crate) fn read(&self, label: Label) -> Option<RootLabel> {
        let word = label.word();
        let generation = word & GENERATION_MASK;
        let slot = self
            .slots
            .get(((word >> GENERATION_BITS) & INDEX_MASK) as u32)?;
        if slot.generation.load(Ordering::Acquire) != generation {
            return None;
        }
        let span_id = slot.span_id.load(Ordering::Relaxed);
        let hi = slot.trace_hi.load(Ordering::Relaxed);
        let lo = slot.trace_lo.load(Ordering::Relaxed);
        let cpu_hi = slot.cpu_hi.load(Ordering::Relaxed);
        let cpu_lo = slot.cpu_lo.load(Ordering::Relaxed);
        let name = slot.name.load(Ordering::Relaxed);
        let flags = slot.flags.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.generation.load(Ordering::Relaxed) != generation {
            return None;
        }
        Some(RootLabel {
            span_id,
            trace_id: u128::from(hi) << 64 | u128::from(lo),
            name: SpanName::from_raw(name),
            flags: flags as u8,
            cpu: u128::from(cpu_hi) << 64 | u128::from(cpu_lo),
        })
    }

    /// Sets the trace flags of `label`'s slot (its owner only, before or while it is
    /// entered: one store, readers see either byte).
    pub(crate) fn set_flags(&self, label: Label, flags: u8) {
        let word = label.word();
        if let Some(slot) = self
            .slots
            .get(((word >> GENERATION_BITS) & INDEX_MASK) as u32)
        {
            if slot.generation.load(Ordering::Relaxed) == word & GENERATION_MASK {
                slot.flags.store(u32::from(flags), Ordering::Relaxed);
                self.naming.set_flags(slot_index(word), word, flags);
            }
        }
    }

    /// Ends `label`'s ownership of its slot: from now on every read of it reports "no
    /// label", and the slot goes back on the free list (or is retired, see the module
    /// docs). Its last handle only.
    pub(crate) fn release(&self, label: Label) {
        let word = label.word();
        let index = ((word >> GENERATION_BITS) & INDEX_MASK) as u32;
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let released = (word & GENERATION_MASK) + 1;
        if slot
            .generation
            .compare_exchange(
                word & GENERATION_MASK,
                released,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        let named = self.naming.release(word);
        // The next claim would hand out the all-ones generation (see the module docs).
        if released + 1 >= GENERATION_MASK {
            self.retired.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if named {
            self.to_limbo(index, slot);
        } else {
            self.push(&self.free, index, slot);
        }
    }

    /// A slot for a claim that found the free list empty: reclaimed from the limbo, or
    /// fresh within the cap, or, at the cap, reclaimed from whatever the limbo holds.
    #[cold]
    #[inline(never)]
    fn refill(&self) -> Option<(u32, &'static Slot)> {
        if self.in_limbo.load(Ordering::Relaxed) >= RECLAIM_BATCH as u64 {
            // A reclaim that found the limbo taken by others' batches: their frees may
            // be on the free list by now (a second look, no wait).
            if let Some(slot) = self
                .reclaim(RECLAIM_BATCH, Some(PARKED_WINDOW))
                .or_else(|| self.pop(&self.free))
            {
                return Some(slot);
            }
        }
        if (self.slots.len() as u64) < self.cap.load(Ordering::Relaxed) {
            if let Some(slot) = self.slots.fresh(|_| Slot::new()) {
                self.fresh.fetch_add(1, Ordering::Relaxed);
                return Some(slot);
            }
            // All 2²³ indexes handed out.
            self.exhausted.fetch_add(1, Ordering::Relaxed);
        }
        // At the cap: one more try at the limbo (any size) and every parked slot, then
        // the free list a concurrent reclaim may have filled meanwhile.
        if let Some(slot) = self
            .reclaim(RECLAIM_BATCH, None)
            .or_else(|| self.pop(&self.free))
        {
            return Some(slot);
        }
        self.capped.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Pushes the released slot `index` on the limbo.
    fn to_limbo(&self, index: u32, slot: &Slot) {
        self.push(&self.limbo, index, slot);
        self.in_limbo.fetch_add(1, Ordering::Relaxed);
    }

    /// Pops at most `batch` slots from the limbo and takes the slots parked in `window`
    /// mirrors (all of them: `None`), into a published [`Batch`]; then one heavy barrier
    /// and a scan of the mirrors; then each slot no mirror names is freed (the first one
    /// returned to the caller, who claims it), each named one parked in a mirror naming
    /// it. `None` when it freed none. Work per call: the batch and the mirrors, never
    /// the table.
    fn reclaim(&self, batch: usize, window: Option<usize>) -> Option<(u32, &'static Slot)> {
        // While another thread registers `membarrier` (once per process, milliseconds)
        // nothing can be freed: leave the limbo as it is.
        if !self.naming.barrier_ready() {
            return None;
        }
        let held = self.lease_batch()?;
        let mut n = 0;
        while n < batch {
            let Some((index, _)) = self.pop(&self.limbo) else {
                break;
            };
            held.entries[n].store(index + 1, Ordering::Relaxed);
            self.in_limbo.fetch_sub(1, Ordering::Relaxed);
            n += 1;
        }
        self.naming.collect_parked(window, |index| {
            if n < BATCH_ENTRIES {
                held.entries[n].store(index + 1, Ordering::Relaxed);
                n += 1;
                self.parked.fetch_sub(1, Ordering::Relaxed);
            } else {
                // More parked slots than the batch has room for (every mirror's, at the
                // cap): back to the limbo, for the next reclaim.
                if let Some(slot) = self.slots.get(index) {
                    self.parked.fetch_sub(1, Ordering::Relaxed);
                    self.to_limbo(index, slot);
                }
            }
        });
        if n == 0 {
            held.owned.store(false, Ordering::Release);
            return None;
        }
        self.reclaims.fetch_add(1, Ordering::Relaxed);
        let named = self.naming.named();
        let mut kept = None;
        for entry in &held.entries[..n] {
            // Cleared before the push: a fork in between loses this slot in the child;
            // cleared after, the child would list it twice.
            let Some(index) = entry.swap(0, Ordering::Relaxed).checked_sub(1) else {
                continue;
            };
            let Some(slot) = self.slots.get(index) else {
                continue;
            };
            let at = named.as_ref().map(|named| {
                named
                    .binary_search_by_key(&index, |&(slot, _)| slot)
                    .map(|found| named[found].1)
            });
            match at {
                // No barrier could be had: nothing is known, all goes back.
                None => self.to_limbo(index, slot),
                // Parked: one more parked, unless another goes back to the limbo for it.
                Some(Ok(mirror)) => match self.naming.park(mirror, index) {
                    Some(back) => {
                        if let Some(back_slot) = self.slots.get(back) {
                            self.to_limbo(back, back_slot);
                        }
                    }
                    None => {
                        self.parked.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Some(Err(_)) if kept.is_none() => kept = Some((index, slot)),
                Some(Err(_)) => self.push(&self.free, index, slot),
            }
        }
        held.owned.store(false, Ordering::Release);
        kept
    }

    /// A batch no other reclaim holds (a fresh one if all are held; `None` past their
    /// capacity, 65,536 reclaims at once).
    fn lease_batch(&self) -> Option<&'static Batch> {
        let free = self.batches.iter().find(|batch| {
            !batch.owned.load(Ordering::Relaxed)
                && batch
                    .owned
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        });
        free.or_else(|| self.batches.fresh(|_| Batch::new()).map(|(_, batch)| batch))
    }

    /// Caps the slots the table holds at `max` (at most [`MAX_LABEL_SLOTS`]). A root
    /// that finds no slot within it gets no label (counted in `capped`).
    pub(crate) fn set_cap(&self, max: u64) {
        self.cap.store(max.min(MAX_LABEL_SLOTS), Ordering::Relaxed);
    }

    /// Pops the top slot of `stack`.
    fn pop(&self, stack: &AtomicU64) -> Option<(u32, &'static Slot)> {
        let mut head = stack.load(Ordering::Acquire);
        loop {
            let top = (head & HEAD_INDEX_MASK) as u32;
            let index = top.checked_sub(1)?;
            let slot = self.slots.get(index)?;
            let next = slot.next_free.load(Ordering::Relaxed);
            let tag = (head >> HEAD_INDEX_BITS).wrapping_add(1);
            let new = tag << HEAD_INDEX_BITS | u64::from(next);
            match stack.compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some((index, slot)),
                Err(now) => head = now,
            }
        }
    }

    /// Pushes `slot` (at `index`) on `stack`.
    fn push(&self, stack: &AtomicU64, index: u32, slot: &Slot) {
        let mut head = stack.load(Ordering::Relaxed);
        loop {
            slot.next_free
                .store((head & HEAD_INDEX_MASK) as u32, Ordering::Relaxed);
            let tag = (head >> HEAD_INDEX_BITS).wrapping_add(1);
            let new = tag << HEAD_INDEX_BITS | (u64::from(index) + 1);
            match stack.compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// The slots' OTEP 4947 records and the threads' mirrors.
    #[inline]
    pub(crate) fn naming(&self) -> &Naming {
        &self.naming
    }

    /// In a forked child (one thread): the batches the parent's other threads were
    /// reclaiming go back to the limbo, and the counts are taken again from the lists
    /// (a thread caught between a pop and its count left them off by one).
    pub(crate) fn after_fork_in_child(&self) {
        for batch in self.batches.iter() {
            if !batch.owned.load(Ordering::Relaxed) {
                continue;
            }
            for entry in &batch.entries {
                if let Some(index) = entry.swap(0, Ordering::Relaxed).checked_sub(1) {
                    if let Some(slot) = self.slots.get(index) {
                        self.push(&self.limbo, index, slot);
                    }
                }
            }
            batch.owned.store(false, Ordering::Relaxed);
        }
        self.in_limbo
            .store(self.len(&self.limbo), Ordering::Relaxed);
        self.parked.store(self.naming.parked(), Ordering::Relaxed);
    }

    /// Slots on `stack` (one thread: a forked child, or tests). A slot listed twice
    /// would make a cycle: the count stops past the table's size.
    fn len(&self, stack: &AtomicU64) -> u64 {
        let mut top = (stack.load(Ordering::Acquire) & HEAD_INDEX_MASK) as u32;
        let mut n = 0;
        let most = self.slots.len() as u64 + 1;
        while let Some(index) = top.checked_sub(1) {
            if n == most {
                break;
            }
            let Some(slot) = self.slots.get(index) else {
                break;
            };
            n += 1;
            top = slot.next_free.load(Ordering::Relaxed);
        }
        n
    }

    /// Runs a reclaim now of at most a batch, whatever the limbo holds, collecting every
    /// mirror's parked slot; a slot it freed goes to the free list (tests). True when it
    /// freed any.
    #[cfg(test)]
    pub(crate) fn reclaim_for_test(&self) -> bool {
        match self.reclaim(RECLAIM_BATCH, None) {
            Some((index, slot)) => {
                self.push(&self.free, index, slot);
                true
            }
            None => false,
        }
    }

    /// Makes `n` batches now (a model's threads then only lease them: a batch made on
    /// one thread reaches another through the never-freed table's `std` atomics, which
    /// loom cannot see).
    #[cfg(all(test, loom))]
    pub(crate) fn make_batches_for_test(&self, n: usize) {
        let made: Vec<&Batch> = (0..n).filter_map(|_| self.lease_batch()).collect();
        for batch in made {
            batch.owned.store(false, Ordering::Release);
        }
    }

    /// Pops `n` slots from the limbo into a batch and calls `inside` while holding it,
    /// as a reclaim preempted before its barrier would; then puts them back (tests).
    #[cfg(test)]
    pub(crate) fn hold_batch_for_test(&self, n: usize, inside: impl FnOnce()) {
        let held = self.lease_batch().expect("a batch");
        for entry in &held.entries[..n] {
            let (index, _) = self.pop(&self.limbo).expect("in limbo");
            entry.store(index + 1, Ordering::Relaxed);
            self.in_limbo.fetch_sub(1, Ordering::Relaxed);
        }
        inside();
        for entry in &held.entries[..n] {
            if let Some(index) = entry.swap(0, Ordering::Relaxed).checked_sub(1) {
                self.to_limbo(index, self.slots.get(index).expect("allocated"));
            }
        }
        held.owned.store(false, Ordering::Release);
    }

    /// The table's counters.
    pub(crate) fn stats(&self) -> LabelTableStats {
        LabelTableStats {
            slots: self.slots.len() as u64,
            cap: self.cap.load(Ordering::Relaxed),
            in_limbo: self.in_limbo.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            reclaims: self.reclaims.load(Ordering::Relaxed),
            fresh: self.fresh.load(Ordering::Relaxed),
            capped: self.capped.load(Ordering::Relaxed),
            exhausted: self.exhausted.load(Ordering::Relaxed),
            retired: self.retired.load(Ordering::Relaxed),
            mirrors: self.naming.mirrors(),
        }
    }

    /// Reclaims run so far (tests).
    #[cfg(test)]
    pub(crate) fn reclaims(&self) -> u64 {
        self.reclaims.load(Ordering::Relaxed)
    }

    /// Slots in limbo (tests).
    #[cfg(test)]
    pub(crate) fn in_limbo(&self) -> u64 {
        self.in_limbo.load(Ordering::Relaxed)
    }

    /// Slots in limbo, counted on the list (tests).
    #[cfg(test)]
    pub(crate) fn limbo_len(&self) -> u64 {
        self.len(&self.limbo)
    }

    /// Slots on the free list, counted (tests).
    #[cfg(test)]
    pub(crate) fn free_len(&self) -> u64 {
        self.len(&self.free)
    }

    /// Slots retired so far.
    #[cfg(test)]
    pub(crate) fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Labels refused: the table held every slot its cap (or the word) allows.
    pub(crate) fn exhausted(&self) -> u64 {
        self.capped.load(Ordering::Relaxed)
    }

    /// Sets the generation of the free slot `index` (tests: next to the word's last value,
    /// 2³⁹ reuses being out of a test's reach).
    #[cfg(test)]
    pub(crate) fn set_generation(&self, index: u32, generation: u64) {
        assert_eq!(generation & 1, 0, "a free slot's generation is even");
        self.slots
            .get(index)
            .expect("allocated")
            .generation
            .store(generation, Ordering::SeqCst);
    }
}

/// A label table's counters: its size, where its slots are, and what it refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelTableStats {
    /// Slots the table holds (its high-water mark: slots are never freed).
    pub(crate) slots: u64,
    /// The most slots it may hold.
    pub(crate) cap: u64,
    /// Released slots waiting in the limbo for a reclaim.
    pub(crate) in_limbo: u64,
    /// Released slots parked in the mirror of a thread that still names them.
    pub(crate) parked: u64,
    /// Reclaims run (one heavy barrier each).
    pub(crate) reclaims: u64,
    /// Slots taken fresh.
    pub(crate) fresh: u64,
    /// Labels refused at the cap.
    pub(crate) capped: u64,
    /// Fresh slots refused because all 2²³ indexes were handed out (the cap was set
    /// above them; they are refused at the cap too).
    pub(crate) exhausted: u64,
    /// Slots retired at their last generation.
    pub(crate) retired: u64,
    /// The thread context's mirrors (one per thread publishing at once).
    pub(crate) mirrors: u64,
}

/// The generation a word carries.
#[inline]
pub(crate) fn generation(word: u64) -> u64 {
    word & GENERATION_MASK
}

/// The slot index a word names.
#[inline]
pub(crate) fn slot_index(word: u64) -> u32 {
    ((word >> GENERATION_BITS) & INDEX_MASK) as u32
}

/// The slot index a word names (tests).
#[cfg(test)]
pub(crate) fn index_of(label: Label) -> u32 {
    slot_index(label.word())
}

/// The generation a word names (tests).
#[cfg(test)]
pub(crate) fn generation_of(label: Label) -> u64 {
    label.word() & GENERATION_MASK
}

#[cfg(all(test, loom))]
mod loom_model;
