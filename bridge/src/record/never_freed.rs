//! A table of slots allocated in chunks on demand and never freed: any index below the
//! allocated count names valid memory for the life of the process, and any other index
//! names nothing. This is what lets a signal handler follow an index (plus a generation it
//! checks itself) that it was handed through a timer or a `Copy` label, where an address
//! could already be freed. The sampler's thread slots and the root CPU counters use it.
//!
//! Reading ([`NeverFreed::get`]) is two atomic loads and a bounds check: async-signal-safe.
//! Allocating ([`NeverFreed::fresh`]) may allocate a chunk: never from a handler.

use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// `CHUNKS` chunks of `CHUNK` slots of `T`, allocated on first use, never freed.
pub(crate) struct NeverFreed<T: 'static, const CHUNK: usize, const CHUNKS: usize> {
    chunks: [AtomicPtr<[T; CHUNK]>; CHUNKS],
    /// Slots handed out by `fresh` so far.
    fresh: AtomicUsize,
}

// SAFETY: the table hands out only shared references to `T` (which is `Sync`), and its
// own fields are atomics.
unsafe impl<T: Sync + 'static, const CHUNK: usize, const CHUNKS: usize> Sync
    for NeverFreed<T, CHUNK, CHUNKS>
{
}

impl<T: 'static, const CHUNK: usize, const CHUNKS: usize> NeverFreed<T, CHUNK, CHUNKS> {
    /// Slots the table can hold.
    pub(crate) const CAPACITY: usize = CHUNK * CHUNKS;

    /// An empty table (for a `static`).
    pub(crate) const fn new() -> Self {
        NeverFreed {
            chunks: [const { AtomicPtr::new(null_mut()) }; CHUNKS],
            fresh: AtomicUsize::new(0),
        }
    }

    /// The slot at `index`, if its chunk exists. Async-signal-safe.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&'static T> {
        let index = index as usize;
        let chunk = self.chunks.get(index / CHUNK)?.load(Ordering::Acquire);
        // SAFETY: chunks are published once, fully initialised (release store), and
        // never freed, so the reference is valid for the rest of the process.
        let chunk: &'static [T; CHUNK] = unsafe { chunk.as_ref() }?;
        chunk.get(index % CHUNK)
    }

    /// A slot never handed out before, with its index; its chunk is allocated (each slot
    /// built by `init(index)`) if this is the chunk's first. `None` when the table is full.
    pub(crate) fn fresh(&self, init: impl Fn(u32) -> T) -> Option<(u32, &'static T)> {
        // SeqCst, as the load in `iter`: the sampler's stop stores its stop (SeqCst) and
        // then walks the slots; a registration takes a slot, then publishes its timer and
        // looks for the stop (both SeqCst). In the single order of SeqCst operations, either
        // the registration looks after the stop (and deletes its own timer) or the slot was
        // taken before the stop's walk begins (and the walk sees it); with an Acquire load
        // here the walk could read a count from before the slot was taken.
        let index = self.fresh.fetch_add(1, Ordering::SeqCst);
        if index >= Self::CAPACITY {
            self.fresh.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let slot = self.at(index as u32, init)?;
        Some((index as u32, slot))
    }

    /// The slot at `index`, its chunk allocated (each slot built by `init(index)`) if it is
    /// not yet: what `fresh` does for the index it takes, and what a table indexed like
    /// another one uses (the OTEP records of the label slots), whose slots exist only once
    /// something needs them (such a table never calls `fresh`, so `iter` sees none of
    /// them). `None` past the capacity. Never from a handler.
    pub(crate) fn at(&self, index: u32, init: impl Fn(u32) -> T) -> Option<&'static T> {
        match self.get(index) {
            Some(slot) => Some(slot),
            None => self.allocate(index, init),
        }
    }

    /// The chunk's first user: builds it, publishes it unless another first user did.
    /// Out of line, and built in place on the heap: a chunk built as an array value would
    /// give every caller a stack frame the size of a chunk (64 KiB for the label slots),
    /// whose pages the stack probe touches on every call, the usual path included.
    #[cold]
    #[inline(never)]
    fn allocate(&self, index: u32, init: impl Fn(u32) -> T) -> Option<&'static T> {
        let cell = self.chunks.get(index as usize / CHUNK)?;
        let base = (index as usize / CHUNK * CHUNK) as u32;
        let slots: Box<[T]> = (0..CHUNK).map(|i| init(base + i as u32)).collect();
        let chunk: Box<[T; CHUNK]> = slots.try_into().ok()?;
        let chunk = Box::into_raw(chunk);
        if cell
            .compare_exchange(null_mut(), chunk, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: ours, never published.
            drop(unsafe { Box::from_raw(chunk) });
        }
        self.get(index)
    }

    /// Every slot handed out so far (in index order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &'static T> + '_ {
        self.indexed().map(|(_, slot)| slot)
    }

    /// Every slot handed out so far, with its index (in index order).
    pub(crate) fn indexed(&self) -> impl Iterator<Item = (u32, &'static T)> + '_ {
        // SeqCst: see `fresh`.
        let n = self.fresh.load(Ordering::SeqCst).min(Self::CAPACITY);
        (0..n as u32).filter_map(|i| self.get(i).map(|slot| (i, slot)))
    }

    /// Slots handed out by `fresh` so far (the table's high-water mark: none is freed).
    pub(crate) fn len(&self) -> usize {
        self.fresh.load(Ordering::Relaxed).min(Self::CAPACITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_name_slots_only_once_allocated_and_forever() {
        static TABLE: NeverFreed<u64, 4, 3> = NeverFreed::new();
        assert!(TABLE.get(0).is_none());
        let slots: Vec<(u32, &u64)> = (0..12)
            .map(|_| TABLE.fresh(|i| u64::from(i) * 10).expect("room"))
            .collect();
        for (i, (index, slot)) in slots.iter().enumerate() {
            assert_eq!(*index as usize, i);
            assert_eq!(**slot, i as u64 * 10, "built with its own index");
            assert!(std::ptr::eq(TABLE.get(*index).expect("slot"), *slot));
        }
        assert!(TABLE.fresh(|_| 0).is_none(), "full");
        assert!(TABLE.get(12).is_none() && TABLE.get(u32::MAX).is_none());
        assert_eq!(TABLE.iter().count(), 12);
    }

    #[test]
    fn at_allocates_the_chunk_of_any_index_once() {
        static TABLE: NeverFreed<u64, 4, 3> = NeverFreed::new();
        assert!(TABLE.get(9).is_none(), "not allocated yet");
        let slot = TABLE.at(9, |i| u64::from(i) * 10).expect("in range");
        assert_eq!(*slot, 90, "built with its own index");
        assert!(std::ptr::eq(TABLE.at(9, |_| 0).expect("in range"), slot));
        assert_eq!(TABLE.get(8).copied(), Some(80), "the whole chunk");
        assert!(TABLE.get(4).is_none(), "other chunks untouched");
        assert!(TABLE.at(12, |_| 0).is_none(), "past the capacity");
        assert_eq!(
            TABLE.iter().count(),
            0,
            "`iter` lists what `fresh` handed out"
        );
    }

    #[test]
    fn racing_first_users_of_a_chunk_share_one() {
        static TABLE: NeverFreed<AtomicUsize, 64, 8> = NeverFreed::new();
        let indexes: Vec<u32> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..100)
                            .map(|_| {
                                let (i, slot) = TABLE.fresh(|_| AtomicUsize::new(0)).expect("room");
                                slot.fetch_add(1, Ordering::Relaxed);
                                i
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("thread"))
                .collect()
        });
        assert_eq!(indexes.len(), 400);
        // Every slot was handed to exactly one user, in the chunk every reader sees.
        assert!(TABLE.iter().all(|slot| slot.load(Ordering::Relaxed) == 1));
        assert_eq!(TABLE.iter().count(), 400);
    }
}
