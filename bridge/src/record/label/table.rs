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
//! any generation. Such a slot waits in a second stack, the limbo, until a claim that
//! finds the free list empty reclaims it: one heavy barrier and a scan of the threads'
//! mirrors per batch of [`RECLAIM_BATCH`] (see `thread_ctx/naming.rs`). Slots still
//! named stay (an idle thread's mirror keeps the last root it ran, at most one slot per
//! thread); the next reclaim waits for a batch more than that. A slot whose record was
//! never filled (a root claimed while the thread context was off, and never published)
//! goes straight back to the free list; while the context is on, a claim fills the
//! record of every root with ids or a name, so those releases go through limbo.

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
    /// emptied in batches by [`LabelTable::reclaim`].
    limbo: AtomicU64,
    /// Slots in `limbo` (about: pushes and takes race).
    in_limbo: AtomicU64,
    /// Slots the last reclaim kept in limbo (still named: an idle thread's mirror names
    /// the last root it ran until it runs another). The next reclaim waits for a batch
    /// more, so slots that stay named never cost a barrier per claim.
    kept: AtomicU64,
    /// Reclaims run (each one heavy barrier).
    reclaims: AtomicU64,
    /// Whether a claim is reclaiming (one at a time).
    reclaiming: AtomicBool,
    /// The slots' OTEP 4947 records and the threads that name them.
    naming: Naming,
}

/// Released slots waiting in limbo before a claim reclaims them: one heavy barrier and a
/// scan of the threads' mirrors per this many.
const RECLAIM_BATCH: u64 = if cfg!(loom) { 1 } else { 64 };

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
                kept: AtomicU64::new(0),
                reclaims: AtomicU64::new(0),
                reclaiming: AtomicBool::new(false),
                naming: Naming::new(),
            }
        }
    }

    /// Writes `value` into a free slot and returns its word; `None` when all 2²³ slots
    /// are taken (counted). While the OpenTelemetry thread context is on, the slot's
    /// OTEP 4947 record is filled too (else by the root's first publication, if any).
    #[inline]
    pub(crate) fn claim(&self, value: &RootLabel) -> Option<Label> {
        self.claim_with(value, crate::thread_ctx::is_enabled())
    }

    /// [`Self::claim`], filling the slot's record if `fill_record`.
    pub(crate) fn claim_with(&self, value: &RootLabel, fill_record: bool) -> Option<Label> {
        let Some((index, slot)) = self
            .pop(&self.free)
            .or_else(|| self.reclaim().then(|| self.pop(&self.free)).flatten())
            .or_else(|| self.slots.fresh(|_| Slot::new()))
        else {
            self.exhausted.fetch_add(1, Ordering::Relaxed);
            return None;
        };
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
            self.push(&self.limbo, index, slot);
            self.in_limbo.fetch_add(1, Ordering::Relaxed);
        } else {
            self.push(&self.free, index, slot);
        }
    }

    /// Frees the slots in limbo that no thread's `otel_thread_ctx_v1` names any more
    /// (`naming.rs`), when [`RECLAIM_BATCH`] more are there than the last reclaim kept
    /// and no other claim is at it. True when it freed any.
    fn reclaim(&self) -> bool {
        if self.in_limbo.load(Ordering::Relaxed) < self.kept.load(Ordering::Relaxed) + RECLAIM_BATCH
            || self.reclaiming.swap(true, Ordering::Acquire)
        {
            return false;
        }
        let freed = self.reclaim_now();
        self.reclaiming.store(false, Ordering::Release);
        freed
    }

    /// [`Self::reclaim`]'s work: take the limbo, one heavy barrier, a scan, then each slot
    /// to the free list or back to limbo.
    fn reclaim_now(&self) -> bool {
        // Take the whole stack, keeping the tag counting.
        let mut head = self.limbo.load(Ordering::Acquire);
        loop {
            if head & HEAD_INDEX_MASK == 0 {
                return false;
            }
            let tag = (head >> HEAD_INDEX_BITS).wrapping_add(1);
            match self.limbo.compare_exchange_weak(
                head,
                tag << HEAD_INDEX_BITS,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        self.reclaims.fetch_add(1, Ordering::Relaxed);
        let named = self.naming.named();
        let mut top = (head & HEAD_INDEX_MASK) as u32;
        let (mut freed, mut kept) = (0u64, 0u64);
        while let Some(index) = top.checked_sub(1) {
            let Some(slot) = self.slots.get(index) else {
                break;
            };
            // Ours alone now: read the link before a push rewrites it.
            top = slot.next_free.load(Ordering::Relaxed);
            match &named {
                Some(named) if named.binary_search(&index).is_err() => {
                    self.push(&self.free, index, slot);
                    freed += 1;
                }
                _ => {
                    self.push(&self.limbo, index, slot);
                    kept += 1;
                }
            }
        }
        self.in_limbo.fetch_sub(freed, Ordering::Relaxed);
        self.kept.store(kept, Ordering::Relaxed);
        freed > 0
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

    /// In a forked child: a reclaim the parent's other thread was running is gone (the
    /// slots it had taken stay out of use).
    pub(crate) fn after_fork_in_child(&self) {
        self.reclaiming.store(false, Ordering::Relaxed);
    }

    /// Runs a reclaim now, whatever the limbo holds (tests).
    #[cfg(test)]
    pub(crate) fn reclaim_for_test(&self) -> bool {
        while self.reclaiming.swap(true, Ordering::Acquire) {
            crate::sync::yield_now();
        }
        let freed = self.reclaim_now();
        self.reclaiming.store(false, Ordering::Release);
        freed
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

    /// Slots retired so far.
    #[cfg(test)]
    pub(crate) fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Labels refused because the table was full.
    pub(crate) fn exhausted(&self) -> u64 {
        self.exhausted.load(Ordering::Relaxed)
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
