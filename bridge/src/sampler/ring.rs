//! A single-producer single-consumer ring of sample records, allocated once per thread.
//!
//! The producer is the thread's own signal handler; the consumer is the collector thread.
//! Pushing is a bounds check, a copy into a preallocated slot and one release store: no
//! allocation, no lock. A full ring refuses the record and the caller counts the drop.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::span_context::LocalRoot;

/// Deepest stack a record keeps; deeper stacks keep their innermost frames and are marked
/// truncated.
pub const MAX_FRAMES: usize = 128;

/// One sample: the span context and the stack at the moment the timer fired.
#[derive(Clone, Copy)]
pub struct SampleRecord {
    /// The thread's local root when the sample was taken (`None`: outside any span, or the
    /// read raced a write).
    pub root: Option<LocalRoot>,
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

pub(crate) struct Ring {
    slots: Box<[UnsafeCell<SampleRecord>]>,
    /// Next slot the producer writes (only the producer stores it).
    head: AtomicUsize,
    /// Next slot the consumer reads (only the consumer stores it).
    tail: AtomicUsize,
}

// SAFETY: a slot is written only by the producer while it is outside [tail, head) and read
// only by the consumer while it is inside; the head/tail release-acquire pairs order them.
unsafe impl Sync for Ring {}

impl Ring {
    pub(crate) fn new(capacity: usize) -> Ring {
        let capacity = capacity.max(1);
        Ring {
            slots: (0..capacity)
                .map(|_| UnsafeCell::new(SampleRecord::EMPTY))
                .collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
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

    /// Empties the ring.
    ///
    /// # Safety
    /// Neither a producer nor a consumer may use the ring meanwhile (a slot being
    /// recycled, or a forked child's copy).
    pub(crate) unsafe fn reset(&self) {
        self.tail.store(0, Ordering::Relaxed);
        self.head.store(0, Ordering::Release);
    }

    /// Producer side: fills the next free slot with `fill`, or returns `false` when full.
    /// Async-signal-safe.
    ///
    /// # Safety
    /// Only one producer may call this at a time (the owning thread's signal handler).
    #[inline]
    pub(crate) unsafe fn push_with(&self, fill: impl FnOnce(&mut SampleRecord)) -> bool {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) >= self.slots.len() {
            return false;
        }
        let slot = &self.slots[head % self.slots.len()];
        // SAFETY: the slot is outside [tail, head): the consumer does not read it, and the
        // caller guarantees a single producer.
        fill(unsafe { &mut *slot.get() });
        self.head.store(head.wrapping_add(1), Ordering::Release);
        true
    }

    /// Consumer side: passes every ready record to `f`, oldest first, and frees its slot.
    ///
    /// # Safety
    /// Only one consumer may call this at a time (the collector holds the registry lock).
    pub(crate) unsafe fn drain(&self, mut f: impl FnMut(&SampleRecord)) -> usize {
        let head = self.head.load(Ordering::Acquire);
        let mut tail = self.tail.load(Ordering::Relaxed);
        let mut n = 0;
        while tail != head {
            let slot = &self.slots[tail % self.slots.len()];
            // SAFETY: the slot is inside [tail, head): the producer finished it (acquire on
            // head) and will not touch it until tail moves past it.
            f(unsafe { &*slot.get() });
            tail = tail.wrapping_add(1);
            self.tail.store(tail, Ordering::Release);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_ring_refuses_and_drain_frees() {
        let ring = Ring::new(3);
        for i in 0..3u16 {
            // SAFETY: single producer in this test.
            assert!(unsafe { ring.push_with(|r| r.depth = i) });
        }
        // SAFETY: single producer in this test.
        assert!(!unsafe { ring.push_with(|r| r.depth = 9) });
        let mut seen = Vec::new();
        // SAFETY: single consumer in this test.
        assert_eq!(unsafe { ring.drain(|r| seen.push(r.depth)) }, 3);
        assert_eq!(seen, [0, 1, 2]);
        // SAFETY: as above.
        assert!(unsafe { ring.push_with(|r| r.depth = 7) });
        seen.clear();
        // SAFETY: as above.
        unsafe { ring.drain(|r| seen.push(r.depth)) };
        assert_eq!(seen, [7]);
    }

    #[test]
    fn concurrent_producer_and_consumer_lose_nothing() {
        let ring = std::sync::Arc::new(Ring::new(8));
        let producer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                let mut dropped = 0u64;
                for i in 0..100_000u64 {
                    // SAFETY: this thread is the only producer.
                    if !unsafe { ring.push_with(|r| r.frames[0] = i) } {
                        dropped += 1;
                    }
                }
                dropped
            })
        };
        let mut got = 0u64;
        let mut last = None;
        while !producer.is_finished() || got == 0 {
            // SAFETY: this thread is the only consumer.
            got += unsafe {
                ring.drain(|r| {
                    assert!(last.is_none_or(|l| r.frames[0] > l), "out of order");
                    last = Some(r.frames[0]);
                })
            } as u64;
        }
        let dropped = producer.join().expect("producer");
        // SAFETY: as above.
        got += unsafe { ring.drain(|_| {}) } as u64;
        assert_eq!(got + dropped, 100_000);
    }
}
