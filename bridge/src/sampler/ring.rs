//! A single-producer single-consumer ring of sample records, allocated once per thread.
//!
//! The producer is the thread's own signal handler (CPU samples) or the thread itself in
//! the allocator's hook (allocation samples, a ring of their own); the consumer is the
//! collector thread.
//! Each role is a type ([`Producer`], [`Consumer`]) that only one holder can have at a
//! time, so neither side calls an `unsafe fn`. Pushing is a bounds check, a copy into a
//! preallocated slot and one release store: no allocation, no lock. A full ring refuses
//! the record and the caller counts the drop.

use crate::sync::{AtomicBool, AtomicUsize, Ordering, UnsafeCell};

use crate::span_context::RootLabel;

/// Deepest stack a record keeps; deeper stacks keep their innermost frames and are marked
/// truncated.
pub const MAX_FRAMES: usize = 128;

/// One sample: the span context and the stack at the moment the timer fired.
#[derive(Clone, Copy)]
pub struct SampleRecord {
    /// The thread's local root when the sample was taken (`None`: outside any span, or the
    /// read raced a write).
    pub root: Option<RootLabel>,
    /// CPU periods this sample stands for: 1, plus the timer expirations the kernel folded
    /// into this signal (`si_overrun`) when it could not deliver one signal per period
    /// (rates above the kernel tick). Profile values and span CPU time are weighted by it.
    pub weight: u32,
    /// Number of valid entries in `frames`.
    pub depth: u16,
    /// Whether the stack is incomplete: the unwinder stopped before the outermost frame
    /// (see [`SamplerStats::truncated`](super::SamplerStats::truncated) for the causes).
    /// The frames it did find are kept.
    pub truncated: bool,
    /// Instruction addresses, innermost first, as runtime (load-biased) addresses.
    ///
    /// Entry 0 is the interrupted instruction itself. Every later entry is a return
    /// address exactly as read from the stack: it points *after* its call instruction,
    /// possibly already into the next function or line when the call was the last
    /// instruction of a function. A symbolizer must look up `entry - 1` for entries 1 and
    /// beyond (and entry 0 as is).
    pub frames: [u64; MAX_FRAMES],
}

/// What a [`Ring`] holds: plain data with an empty value its slots start as.
pub(crate) trait RingRecord: Copy {
    /// The value of a slot nothing was written to.
    const EMPTY: Self;
}

impl RingRecord for SampleRecord {
    const EMPTY: SampleRecord = SampleRecord::EMPTY;
}

impl SampleRecord {
    pub(crate) const EMPTY: SampleRecord = SampleRecord {
        root: None,
        weight: 1,
        depth: 0,
        truncated: false,
        frames: [0; MAX_FRAMES],
    };

    /// The captured frames.
    pub fn frames(&self) -> &[u64] {
        &self.frames[..usize::from(self.depth).min(MAX_FRAMES)]
    }
}

/// The ring: records, the producer's `head`, the consumer's `tail`, and one flag per
/// role. A role is taken by constructing its handle ([`Ring::producer`],
/// [`Ring::consumer`]), which fails while another handle of that role lives, so at most one
/// producer and one consumer use the ring at any time whatever the callers do: the ring's
/// `unsafe` relies on its own flags, not on its callers' discipline.
pub(crate) struct Ring<T: RingRecord = SampleRecord> {
    slots: Box<[UnsafeCell<T>]>,
    /// Next slot the producer writes (only the producer stores it).
    head: AtomicUsize,
    /// Next slot the consumer reads (only the consumer stores it).
    tail: AtomicUsize,
    /// Set while a [`Producer`] exists.
    producing: AtomicBool,
    /// Set while a [`Consumer`] exists.
    consuming: AtomicBool,
}

// SAFETY: a slot is written only through the one `Producer` (the `producing` flag) while it
// is outside [tail, head), and read only through the one `Consumer` (the `consuming` flag)
// while it is inside; the head/tail release-acquire pairs order the two, and the flags'
// acquire/release order one holder of a role before the next.
unsafe impl<T: RingRecord + Send> Sync for Ring<T> {}

impl<T: RingRecord> Ring<T> {
    pub(crate) fn new(capacity: usize) -> Ring<T> {
        let capacity = capacity.max(1);
        Ring {
            slots: (0..capacity).map(|_| UnsafeCell::new(T::EMPTY)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            producing: AtomicBool::new(false),
            consuming: AtomicBool::new(false),
        }
    }

    /// Records the ring holds.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Whether no record is waiting (exact when neither side is running).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) == self.tail.load(Ordering::Acquire)
    }

    /// Takes the producer role, or `None` while a [`Producer`] of this ring exists.
    /// Async-signal-safe: one atomic swap, no lock (it never waits), no allocation.
    ///
    /// The sampler's owner discipline (only the owner thread's `SIGPROF` handler, which
    /// does not nest, produces into its slot's ring) means it never fails there; the
    /// flag makes that discipline checked rather than assumed.
    #[inline]
    pub(crate) fn producer(&self) -> Option<Producer<'_, T>> {
        // Acquire: a previous producer's writes (released by its drop) happen before ours.
        // (A handle is built only on success: dropping one clears the flag.)
        if self.producing.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(Producer { ring: self })
    }

    /// Takes the consumer role, or `None` while a [`Consumer`] of this ring exists.
    pub(crate) fn consumer(&self) -> Option<Consumer<'_, T>> {
        if self.consuming.swap(true, Ordering::Acquire) {
            return None;
        }
        Some(Consumer { ring: self })
    }

    /// Empties the ring, holding both roles for it; `false` (and nothing changes) while
    /// either is held elsewhere (a forked child's copy of a ring that a parent thread was
    /// using at the fork stays held forever: the caller replaces such a ring). Only
    /// atomics: usable in a `pthread_atfork` child handler.
    pub(crate) fn reset(&self) -> bool {
        let Some(_producer) = self.producer() else {
            return false;
        };
        let Some(_consumer) = self.consumer() else {
            return false;
        };
        // Both roles are ours: nobody reads or writes either index meanwhile.
        self.tail.store(0, Ordering::Relaxed);
        self.head.store(0, Ordering::Relaxed);
        true
    }
}

/// The producer role of a [`Ring`]: only one exists per ring at a time. The sampler's
/// signal handler holds it while it takes a sample on the ring's owner thread.
pub(crate) struct Producer<'a, T: RingRecord = SampleRecord> {
    ring: &'a Ring<T>,
}

impl<T: RingRecord> Producer<'_, T> {
    /// Fills the next free slot with `fill`, or returns `false` when full.
    /// Async-signal-safe: a bounds check, `fill`, one release store; no allocation, no lock.
    /// Panic-free (the signal handler's path): the slot is found with checked operations.
    #[inline]
    pub(crate) fn push_with(&mut self, fill: impl FnOnce(&mut T)) -> bool {
        let ring = self.ring;
        let head = ring.head.load(Ordering::Relaxed);
        let tail = ring.tail.load(Ordering::Acquire);
        let capacity = ring.slots.len();
        if head.wrapping_sub(tail) >= capacity {
            return false;
        }
        // `capacity` is at least 1 (`Ring::new`); `checked_rem` and `get` only say so
        // without a panic path.
        let Some(slot) = head.checked_rem(capacity).and_then(|i| ring.slots.get(i)) else {
            return false;
        };
        // SAFETY: the slot is outside [tail, head), so the consumer does not read it
        // (acquire on tail: it finished reading it before it moved tail past it); `self` is
        // the ring's only producer (the `producing` flag) and `&mut self` keeps this
        // reference unique while `fill` runs.
        slot.with_mut(|record| fill(unsafe { &mut *record }));
        ring.head.store(head.wrapping_add(1), Ordering::Release);
        true
    }
}

impl<T: RingRecord> Drop for Producer<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: this producer's writes happen before the next producer's.
        self.ring.producing.store(false, Ordering::Release);
    }
}

/// The consumer role of a [`Ring`]: only one exists per ring at a time (the collector's
/// drain, under the slot table's drain lock).
pub(crate) struct Consumer<'a, T: RingRecord = SampleRecord> {
    ring: &'a Ring<T>,
}

impl<T: RingRecord> Consumer<'_, T> {
    /// Passes every ready record to `f`, oldest first, and frees its slot.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&T)) -> usize {
        let ring = self.ring;
        let head = ring.head.load(Ordering::Acquire);
        let mut tail = ring.tail.load(Ordering::Relaxed);
        let mut n = 0;
        while tail != head {
            let slot = &ring.slots[tail % ring.slots.len()];
            // SAFETY: the slot is inside [tail, head): the producer finished it (acquire on
            // head) and will not touch it until tail moves past it; `self` is the ring's
            // only consumer (the `consuming` flag), so nobody moves tail meanwhile.
            slot.with(|record| f(unsafe { &*record }));
            tail = tail.wrapping_add(1);
            ring.tail.store(tail, Ordering::Release);
            n += 1;
        }
        n
    }
}

impl<T: RingRecord> Drop for Consumer<'_, T> {
    fn drop(&mut self) {
        self.ring.consuming.store(false, Ordering::Release);
    }
}

#[cfg(all(test, loom))]
pub(super) mod loom_model;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_ring_refuses_and_drain_frees() {
        let ring: Ring = Ring::new(3);
        let mut producer = ring.producer().expect("producer");
        let mut consumer = ring.consumer().expect("consumer");
        for i in 0..3u16 {
            assert!(producer.push_with(|r| r.depth = i));
        }
        assert!(!producer.push_with(|r| r.depth = 9));
        let mut seen = Vec::new();
        assert_eq!(consumer.drain(|r| seen.push(r.depth)), 3);
        assert_eq!(seen, [0, 1, 2]);
        assert!(producer.push_with(|r| r.depth = 7));
        seen.clear();
        consumer.drain(|r| seen.push(r.depth));
        assert_eq!(seen, [7]);
    }

    #[test]
    fn each_role_has_one_holder_at_a_time() {
        let ring: Ring = Ring::new(2);
        let producer = ring.producer().expect("producer");
        assert!(ring.producer().is_none(), "a second producer");
        let consumer = ring.consumer().expect("consumer");
        assert!(ring.consumer().is_none(), "a second consumer");
        assert!(!ring.reset(), "reset needs both roles");
        drop(producer);
        assert!(!ring.reset(), "reset needs both roles");
        drop(consumer);
        let mut producer = ring.producer().expect("producer again");
        assert!(producer.push_with(|r| r.depth = 1));
        drop(producer);
        assert!(!ring.is_empty());
        assert!(ring.reset());
        assert!(ring.is_empty());
        assert!(ring.producer().is_some() && ring.consumer().is_some());
    }

    #[test]
    fn concurrent_producer_and_consumer_lose_nothing() {
        let ring: std::sync::Arc<Ring> = std::sync::Arc::new(Ring::new(8));
        let producer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                let mut producer = ring.producer().expect("the only producer");
                let mut dropped = 0u64;
                for i in 0..100_000u64 {
                    if !producer.push_with(|r| r.frames[0] = i) {
                        dropped += 1;
                    }
                }
                dropped
            })
        };
        let mut consumer = ring.consumer().expect("the only consumer");
        let mut got = 0u64;
        let mut last = None;
        while !producer.is_finished() || got == 0 {
            got += consumer.drain(|r| {
                assert!(last.is_none_or(|l| r.frames[0] > l), "out of order");
                last = Some(r.frames[0]);
            }) as u64;
        }
        let dropped = producer.join().expect("producer");
        got += consumer.drain(|_| {}) as u64;
        assert_eq!(got + dropped, 100_000);
    }
}
