//! The label of each recently entered span, kept on the thread, so that entering a span
//! again (the next poll of its future) costs no registry lookup.
//!
//! Without it every enter finds the span in the `tracing` registry (a slab lookup and a
//! reference count taken and dropped) and reads its extensions (a lock taken and dropped),
//! about 200 instructions, to learn a value that never changes once the span's local root
//! is resolved.
//!
//! **Why ids alone cannot be the key.** A `tracing` span id names a registry slot, and a
//! slot's id comes back once its generation counter wraps, which a busy service reaches
//! within seconds for its hottest slots. A cached label must therefore be dropped when its
//! span closes, and spans close on any thread.
//!
//! **Close generations.** A process-wide table of [`BUCKETS`] counters, indexed by a hash
//! of (layer, span id). Closing a span increments its bucket (`on_close`, before the
//! registry can hand the id out again). An entry records the bucket's value from before
//! the lookup that filled it, and is used only while the bucket still holds that value:
//!
//! * the span it was filled for has not closed, since closing it would have moved the
//!   bucket, so the id still names that span (live spans have distinct ids);
//! * a close of another span in the same bucket only costs a miss.
//!
//! Ordering: the increment (release) happens before the registry frees the slot, which
//! happens before any new span with the id exists and before any thread can enter one;
//! the check loads with acquire. Entries are plain per-thread values (no `unsafe`, no
//! address kept), so a stale entry can at worst be refused, never followed.
//!
//! The thread's cache is a `const` thread-local array with no destructor, direct-mapped
//! by the same hash: a hit is a few loads and compares.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::label::Label;

/// Close-generation counters (128 KiB): with 100,000 spans closing per second, an entry
/// is refused by a neighbour's close with probability ~0.6 % per millisecond between two
/// enters of its span.
const BUCKETS: usize = 1 << 14;

// A bucket's counter is a `u64` moved by 1 per close: a close is at least one atomic
// read-modify-write on the bucket's line, so a bucket sees at most 10⁹ closes a second and
// its counter comes back to a value only after 584 years (10 years: 3.2·10¹⁷ < 2⁵⁹). An
// entry therefore never matches a later value of the same counter.
/// Entries per thread (~4.5 KiB): direct-mapped, a thread polling more spans than this
/// in turn misses more.
const ENTRIES: usize = 64;

static CLOSED: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];

#[derive(Clone, Copy)]
struct Entry {
    /// The layer (`Owner`) the span id belongs to; 0 (the guards' owner) marks an empty
    /// entry, since no layer uses it.
    owner: u64,
    span: u64,
    generation: u64,
    label: Option<Label>,
}

const EMPTY: Entry = Entry {
    owner: 0,
    span: 0,
    generation: 0,
    label: None,
};

thread_local! {
    static CACHE: [Cell<Entry>; ENTRIES] = const { [const { Cell::new(EMPTY) }; ENTRIES] };
}

/// Where (layer `owner`, `span`) lives: its bucket and its entry on every thread.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    bucket: usize,
    entry: usize,
    owner: u64,
    span: u64,
}

impl Slot {
    #[inline]
    pub(super) fn of(owner: u64, span: u64) -> Slot {
        let hash = (span ^ owner.rotate_left(40)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Slot {
            bucket: (hash >> (64 - BUCKETS.trailing_zeros())) as usize,
            entry: (hash >> 20) as usize % ENTRIES,
            owner,
            span,
        }
    }

    /// Starts loading the bucket's line (a new span's: its first enter reads it, and with
    /// the registry's id generations its bucket is anyone's of the 128 KiB). A hint only:
    /// no load, never a fault, nothing on targets other than x86-64.
    #[inline]
    pub(super) fn prefetch(self) {
        crate::sync::prefetch(CLOSED.as_ptr().wrapping_add(self.bucket));
    }

    /// The label cached on this thread, if the span has not closed since it was cached.
    #[inline]
    pub(super) fn get(self) -> Option<Option<Label>> {
        let entry = CACHE.try_with(|c| c[self.entry].get()).ok()?;
        (entry.owner == self.owner
            && entry.span == self.span
            && entry.generation == self.generation())
        .then_some(entry.label)
    }

    /// The bucket's close generation, read before looking the span up to [`fill`](Self::fill).
    #[inline]
    pub(super) fn generation(self) -> u64 {
        CLOSED[self.bucket].load(Ordering::Acquire)
    }

    /// Caches `label`, looked up after the bucket read `generation`.
    #[inline]
    pub(super) fn fill(self, generation: u64, label: Option<Label>) {
        let _ = CACHE.try_with(|c| {
            c[self.entry].set(Entry {
                owner: self.owner,
                span: self.span,
                generation,
                label,
            })
        });
    }

    /// The span closed: every thread's entry for it stops being used.
    #[inline]
    pub(super) fn closed(self) {
        // fetch_add wraps (never panics).
        CLOSED[self.bucket].fetch_add(1, Ordering::Release);
    }

    /// Sets the bucket's close generation (tests: next to its wrap).
    #[cfg(test)]
    fn set_generation(self, generation: u64) {
        CLOSED[self.bucket].store(generation, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A distinct word per `n` (the cache only stores and compares words).
    fn label(n: u64) -> Option<Label> {
        Label::from_raw(n * 2 + 1)
    }

    #[test]
    fn a_filled_entry_is_used_until_its_span_closes() {
        let slot = Slot::of(1_000_001, 42);
        assert_eq!(slot.get(), None);
        slot.fill(slot.generation(), label(42));
        assert_eq!(slot.get(), Some(label(42)));
        // The same id in another layer is another span.
        assert_eq!(Slot::of(1_000_002, 42).get(), None);
        slot.closed();
        assert_eq!(slot.get(), None, "a closed span's label is never reused");
    }

    #[test]
    fn a_fill_racing_a_close_is_refused() {
        let slot = Slot::of(1_000_003, 7);
        let before = slot.generation();
        // The span closed between the generation read and the fill (and its id went to a
        // new span): what was looked up belongs to the old one.
        slot.closed();
        slot.fill(before, label(7));
        assert_eq!(slot.get(), None);
    }

    /// The close generation at its wrap (`u64::MAX` → 0): an entry filled before the
    /// wrap is refused after the close that wraps it, and the bucket goes on working.
    #[test]
    fn a_close_that_wraps_the_generation_refuses_the_entry() {
        // An owner no other test uses: its bucket is this test's alone (a shared one only
        // costs a neighbour a miss).
        let slot = Slot::of(1_000_006, 13);
        slot.set_generation(u64::MAX);
        slot.fill(slot.generation(), label(13));
        assert_eq!(slot.get(), Some(label(13)));
        slot.closed();
        assert!(slot.generation() < 8, "wrapped to 0 (or just past it)");
        assert_eq!(slot.get(), None, "filled before the wrap: refused");
        let before_wrap = u64::MAX;
        slot.fill(before_wrap, label(13));
        assert_eq!(slot.get(), None, "a fill read before the wrap: refused");
        slot.fill(slot.generation(), label(14));
        assert_eq!(slot.get(), Some(label(14)));
    }

    #[test]
    fn entries_are_per_thread() {
        let slot = Slot::of(1_000_004, 9);
        // Other tests close spans meanwhile: one in this slot's bucket (1 in 16,384 a
        // close) rightly refuses the entry, so that round is tried again.
        for _ in 0..10 {
            let generation = slot.generation();
            slot.fill(generation, label(9));
            std::thread::spawn(move || assert_eq!(slot.get(), None))
                .join()
                .expect("thread");
            let got = slot.get();
            if slot.generation() == generation {
                assert_eq!(got, Some(label(9)));
                return;
            }
        }
        panic!("the bucket moved in every round");
    }

    #[test]
    fn a_recycled_id_misses_after_a_close_seen_on_another_thread() {
        let slot = Slot::of(1_000_005, 11);
        slot.fill(slot.generation(), label(11));
        std::thread::spawn(move || slot.closed())
            .join()
            .expect("thread");
        assert_eq!(slot.get(), None);
        slot.fill(slot.generation(), label(12));
        assert_eq!(slot.get(), Some(label(12)));
    }
}
