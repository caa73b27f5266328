//! Where the allocation samples of threads without a registration go: one buffer shared
//! by all of them, and a few stack-copy buffers their walks borrow.
//!
//! A thread that never registered with the sampler (no span entered, no runtime hook: a
//! `spawn_blocking` closure run without the request span, a thread pool of the user's)
//! has no slot the hook can find without a lookup, and no stack bounds to walk with
//! (`pthread_getattr_np` allocates and locks). So its samples go to a pool of records any
//! thread may claim, and its walk runs over a copy of its stack, made with
//! `process_vm_readv`, which fails instead of faulting where the stack ends:
//!
//! ```text
//!  hook, thread T (unregistered)                collector (each drain)
//!  claim a stack-copy buffer (CAS; none: drop)
//!  claim a FREE record (CAS → WRITING)          READY → READING (CAS), copy out,
//!  copy [sp − budget, sp + 64 KiB) of T            → FREE
//!    (the part below sp proves the walk's
//!    stack room: a guard page fails the copy)
//!  walk the copy into the record → READY
//! ```
//!
//! Sampled allocations are rare (a few hundred a second at the default mean), so the
//! claims' compare-exchanges never contend for long, and a thread that finds every record
//! or buffer taken drops the sample from the profile, counted; the roots' totals have it
//! already. The memory is allocated once, by the setup (never by the hook), and kept.

use crate::sync::{AtomicBool, AtomicU8, AtomicUsize, Ordering, UnsafeCell};

/// A record no thread holds.
const FREE: u8 = 0;
/// A record its producer is filling.
const WRITING: u8 = 1;
/// A record filled and published.
const READY: u8 = 2;
/// A record a drain is copying out.
const READING: u8 = 3;

/// A fixed set of records that any thread may fill and one drain (or several) empties:
/// each record's state is its own lock-free hand-over (FREE → WRITING → READY → READING →
/// FREE), so producers never wait for each other or for the drain.
pub(crate) struct Pool<T> {
    records: Box<[Entry<T>]>,
    /// Where the next producer starts looking (spreads producers over the records).
    next: AtomicUsize,
}

struct Entry<T> {
    state: AtomicU8,
    record: UnsafeCell<T>,
}

// SAFETY: a record is accessed only by the one thread whose compare-exchange moved its
// state to WRITING (the producer) or READING (a drain), and the state's acquire/release
// pairs order each access after the previous holder's.
unsafe impl<T: Send> Sync for Pool<T> {}
// SAFETY: as above; the records are plain data moved with the pool.
unsafe impl<T: Send> Send for Pool<T> {}

impl<T: Copy> Pool<T> {
    /// A pool of `capacity` records, each starting as `empty`.
    pub(crate) fn new(capacity: usize, empty: T) -> Pool<T> {
        Pool {
            records: (0..capacity.max(1))
                .map(|_| Entry {
                    state: AtomicU8::new(FREE),
                    record: UnsafeCell::new(empty),
                })
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Claims a free record, lets `fill` write it and publishes it. `false`: every record
    /// was taken (nothing written). No allocation, no lock.
    pub(crate) fn push_with(&self, fill: impl FnOnce(&mut T)) -> bool {
        let n = self.records.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let entry = &self.records[start.wrapping_add(i) % n];
            // Acquire: the last drain's read of this record happens before our write.
            if entry.state.load(Ordering::Relaxed) == FREE
                && entry
                    .state
                    .compare_exchange(FREE, WRITING, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: WRITING is ours alone until we store READY.
                entry
                    .record
                    .with_mut(|record| fill(unsafe { &mut *record }));
                entry.state.store(READY, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Hands every published record to `f` and frees it; returns how many. Records being
    /// written are left for the next drain.
    pub(crate) fn drain(&self, mut f: impl FnMut(&T)) -> usize {
        let mut drained = 0;
        for entry in self.records.iter() {
            // Acquire: the producer's write happens before our read.
            if entry
                .state
                .compare_exchange(READY, READING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: READING is ours alone until we store FREE.
                entry.record.with(|record| f(unsafe { &*record }));
                entry.state.store(FREE, Ordering::Release);
                drained += 1;
            }
        }
        drained
    }

    /// In a forked child: every record free (one a parent thread was writing would stay
    /// WRITING forever). Only atomics.
    pub(crate) fn reset_in_child(&self) {
        for entry in self.records.iter() {
            entry.state.store(FREE, Ordering::Relaxed);
        }
    }

    /// The bytes the records take.
    pub(crate) fn bytes(&self) -> usize {
        self.records.len() * std::mem::size_of::<Entry<T>>()
    }
}

/// A buffer a walk copies a thread's stack into, and a stack the walk runs on, lent to
/// one thread at a time.
pub(crate) struct CopyBuffer {
    busy: AtomicBool,
    bytes: UnsafeCell<Box<[u8]>>,
    /// The walk's own stack (the thread's may have no guard page below it, so running
    /// the walk there could overrun it unseen): written only as a stack, by the holder.
    walk_stack: UnsafeCell<Box<[u8]>>,
    /// Its length (0: none).
    walk_stack_len: usize,
    len: usize,
}

// SAFETY: `bytes` and `walk_stack` are touched only by the thread holding `busy` (a
// `Lent`), whose acquire/release pairs order it after the previous holder's use.
unsafe impl Sync for CopyBuffer {}

impl CopyBuffer {
    pub(crate) fn new(len: usize, walk_stack: usize) -> CopyBuffer {
        CopyBuffer {
            busy: AtomicBool::new(false),
            bytes: UnsafeCell::new(vec![0; len].into_boxed_slice()),
            walk_stack: UnsafeCell::new(vec![0; walk_stack].into_boxed_slice()),
            walk_stack_len: walk_stack,
            len: len + walk_stack,
        }
    }

    /// The buffer, if no thread holds it.
    pub(crate) fn lend(&self) -> Option<Lent<'_>> {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Built only on success: a `Lent` dropped gives the buffer back.
            .then(|| Lent { buffer: self })
    }

    /// In a forked child: free again (the thread holding it is not there).
    pub(crate) fn reset_in_child(&self) {
        self.busy.store(false, Ordering::Relaxed);
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// A [`CopyBuffer`] held by the calling thread; given back when dropped.
pub(crate) struct Lent<'a> {
    buffer: &'a CopyBuffer,
}

impl Lent<'_> {
    /// The buffer's bytes, and the 16-byte aligned top of its walk stack (0 if it has
    /// none).
    pub(crate) fn with_bytes<R>(&mut self, f: impl FnOnce(&mut [u8], u64) -> R) -> R {
        let buffer = self.buffer;
        let top = if buffer.walk_stack_len == 0 {
            0
        } else {
            // SAFETY: `busy` is ours while `self` lives: no one else touches the stack.
            let base = buffer
                .walk_stack
                .with_mut(|stack| unsafe { (*stack).as_mut_ptr() }) as u64;
            (base + buffer.walk_stack_len as u64) & !15
        };
        // SAFETY: `busy` is ours while `self` lives, and `&mut self` lends it once.
        buffer
            .bytes
            .with_mut(|bytes| f(unsafe { &mut *bytes }, top))
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.buffer.busy.store(false, Ordering::Release);
    }
}

/// The records and copy buffers of every unregistered thread.
pub(crate) struct Shared<T> {
    pub(crate) samples: Pool<T>,
    copies: Box<[CopyBuffer]>,
}

impl<T: Copy> Shared<T> {
    pub(crate) fn new(
        records: usize,
        empty: T,
        copies: usize,
        copy_len: usize,
        walk_stack: usize,
    ) -> Shared<T> {
        Shared {
            samples: Pool::new(records, empty),
            copies: (0..copies)
                .map(|_| CopyBuffer::new(copy_len, walk_stack))
                .collect(),
        }
    }

    /// A copy buffer no other thread holds, if there is one.
    pub(crate) fn lend_copy(&self) -> Option<Lent<'_>> {
        self.copies.iter().find_map(CopyBuffer::lend)
    }

    pub(crate) fn reset_in_child(&self) {
        self.samples.reset_in_child();
        for copy in self.copies.iter() {
            copy.reset_in_child();
        }
    }

    /// The bytes the records and buffers take.
    pub(crate) fn bytes(&self) -> usize {
        self.samples.bytes() + self.copies.iter().map(CopyBuffer::len).sum::<usize>()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn records_are_drained_once_and_a_full_pool_refuses() {
        let pool = Pool::new(3, 0u64);
        assert!(pool.push_with(|r| *r = 1));
        assert!(pool.push_with(|r| *r = 2));
        assert!(pool.push_with(|r| *r = 3));
        assert!(!pool.push_with(|r| *r = 4), "full");
        let mut seen = Vec::new();
        assert_eq!(pool.drain(|r| seen.push(*r)), 3);
        seen.sort_unstable();
        assert_eq!(seen, [1, 2, 3]);
        assert_eq!(pool.drain(|r| seen.push(*r)), 0, "drained once");
        assert!(pool.push_with(|r| *r = 5), "freed by the drain");
        assert_eq!(pool.drain(|_| {}), 1);
    }

    #[test]
    fn many_threads_push_while_one_drains_and_nothing_is_lost_or_doubled() {
        let pool = std::sync::Arc::new(Pool::new(16, 0u64));
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    let mut refused = 0u64;
                    for i in 0..5_000u64 {
                        let value = t << 32 | i;
                        while !pool.push_with(|r| *r = value) {
                            refused += 1;
                            std::thread::yield_now();
                        }
                    }
                    refused
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut duplicates = 0;
        while producers.iter().any(|p| !p.is_finished()) {
            pool.drain(|r| duplicates += usize::from(!seen.insert(*r)));
        }
        for p in producers {
            p.join().expect("producer");
        }
        pool.drain(|r| duplicates += usize::from(!seen.insert(*r)));
        assert_eq!(duplicates, 0);
        assert_eq!(seen.len(), 20_000, "every record pushed, drained once");
    }

    #[test]
    fn a_copy_buffer_is_lent_to_one_holder_at_a_time() {
        let shared = Shared::new(1, 0u8, 2, 64, 256);
        let a = shared.lend_copy().expect("first");
        let mut b = shared.lend_copy().expect("second");
        assert!(shared.lend_copy().is_none(), "both lent");
        let (len, top) = b.with_bytes(|bytes, top| (bytes.len(), top));
        assert_eq!(len, 64);
        assert_eq!(top % 16, 0, "the walk stack's top is aligned");
        let base = b
            .buffer
            .walk_stack
            .with_mut(|stack| unsafe { (*stack).as_mut_ptr() }) as u64;
        let range = base..base + 256;
        assert!(
            range.contains(&(top - 1)) && top - range.start >= 240,
            "near its end"
        );
        drop(a);
        assert!(shared.lend_copy().is_some(), "given back");
        assert_eq!(shared.bytes(), shared.samples.bytes() + 2 * (64 + 256));
    }

    #[test]
    fn a_forked_child_frees_what_parent_threads_held() {
        let shared = Shared::new(2, 0u8, 1, 8, 0);
        let held = shared.lend_copy().expect("lent");
        std::mem::forget(held);
        // A record stuck WRITING, as a parent thread's would be in the child.
        shared.samples.records[0]
            .state
            .store(WRITING, Ordering::Relaxed);
        shared.reset_in_child();
        assert!(shared.lend_copy().is_some());
        assert!(shared.samples.push_with(|r| *r = 1));
        assert!(shared.samples.push_with(|r| *r = 2));
        assert_eq!(shared.samples.drain(|_| {}), 2);
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! loom model of the pool: two producers racing for records while a drain runs;
    //! every record pushed is drained exactly once, a push is refused only when every
    //! record was taken, and no record is read while written (loom's cell checks).

    use loom::sync::Arc;
    use loom::thread;

    use super::Pool;

    #[test]
    fn loom_pool_two_producers_and_a_drain() {
        loom::model(|| {
            let pool = Arc::new(Pool::new(2, 0u64));
            let producers: Vec<_> = [1u64, 2]
                .into_iter()
                .map(|value| {
                    let pool = pool.clone();
                    thread::spawn(move || pool.push_with(|r| *r = value).then_some(value))
                })
                .collect();
            let mut seen = Vec::new();
            pool.drain(|r| seen.push(*r));
            let pushed: Vec<u64> = producers
                .into_iter()
                .filter_map(|p| p.join().expect("producer"))
                .collect();
            pool.drain(|r| seen.push(*r));
            seen.sort_unstable();
            assert_eq!(seen, pushed, "each pushed record drained once");
            assert_eq!(pushed.len(), 2, "two records: neither push is refused");
        });
    }

    /// One record, filled, drained and filled again while the drain may still be reading
    /// it: the drain's release of the record must order its read before the rewrite.
    fn reuse(pool: Arc<Pool<u64>>) {
        let producer = {
            let pool = pool.clone();
            thread::spawn(move || {
                [1u64, 2]
                    .into_iter()
                    .filter(|&value| pool.push_with(|r| *r = value))
                    .collect::<Vec<_>>()
            })
        };
        let mut seen = Vec::new();
        pool.drain(|r| seen.push(*r));
        pool.drain(|r| seen.push(*r));
        let pushed = producer.join().expect("producer");
        pool.drain(|r| seen.push(*r));
        seen.sort_unstable();
        assert_eq!(seen, pushed, "each pushed record drained once, as written");
        assert_eq!(pushed.first(), Some(&1), "an empty pool refused a record");
    }

    #[test]
    fn loom_pool_record_reused_after_a_drain() {
        crate::sync::check("pool, reuse", 3, || {
            let pool = Arc::new(Pool::new(1, 0u64));
            pool.records[0].state.stores_as_swaps_for_model();
            reuse(pool);
        });
    }

    /// The broken variant: with the record's state relaxed, a producer rewrites the record
    /// the drain is reading, or the drain reads one not yet written: loom reports it.
    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_pool_with_a_relaxed_state_races_on_the_record() {
        crate::sync::check("pool, broken", 3, || {
            let pool = Arc::new(Pool::new(1, 0u64));
            pool.records[0].state.stores_as_swaps_for_model();
            pool.records[0].state.relax_for_model();
            reuse(pool);
        });
    }

    #[test]
    fn loom_pool_refuses_only_when_full() {
        loom::model(|| {
            let pool = Arc::new(Pool::new(1, 0u64));
            let other = {
                let pool = pool.clone();
                thread::spawn(move || pool.push_with(|r| *r = 2).then_some(2u64))
            };
            let mine = pool.push_with(|r| *r = 1).then_some(1u64);
            let theirs = other.join().expect("producer");
            let mut seen = Vec::new();
            pool.drain(|r| seen.push(*r));
            assert_eq!(seen.len(), 1, "one record, one push taken");
            assert!(mine.is_some() != theirs.is_some(), "exactly one refused");
            assert_eq!(Some(seen[0]), mine.or(theirs));
        });
    }
}
