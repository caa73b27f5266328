//! The Thread Local Context Records (OTEP 4947): one per label slot, written once per
//! root, named by pointer from every thread that runs the root.
//!
//! A thread's `otel_thread_ctx_v1` points at the record of the root it runs (or is NULL:
//! no span). The record sits beside the root's label slot, at the same index
//! ([`SlotRecord`]), and is filled as the root's label is claimed (or, for a root claimed
//! while the thread context was off, by the first thread that publishes it); every switch
//! to the root, on any thread, stores the pointer and writes nothing else. A record's bytes are written only while no thread names its slot: `naming.rs`
//! says how a released slot waits until every thread has moved off it.
//!
//! Layout (byte-packed, native endianness, OTEP 4947 "Thread-Local Context Record"):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 16 | trace-id (W3C bytes; zero: none) |
//! | 16 | 8 | span-id (W3C bytes) |
//! | 24 | 1 | valid (1: valid, anything else: ignore the record) |
//! | 25 | 1 | trace-flags (the root span's W3C flags byte; 0 without ids) |
//! | 26 | 2 | attrs-data-size |
//! | 28 | n | attrs-data: entries `key index (u8), length (u8), UTF-8 bytes` |
//!
//! This crate publishes one attribute, the local root span's name, under key index 0
//! ([`super::SPAN_NAME_KEY`]). Its entry is encoded once per distinct name when the name
//! is interned ([`register_name`]) and copied into a record when the record is filled,
//! so publishing allocates nothing and takes no lock.

use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{compiler_fence, AtomicPtr, AtomicU16, AtomicU8};

use crate::label::{generation, RootLabel};
use crate::span_name::{SpanName, MAX_SPAN_NAMES};
use crate::sync::{AtomicU64, Ordering};

/// Longest attribute value the record format can carry (its length is one byte).
pub(crate) const MAX_VALUE_LEN: usize = 255;

/// Room for one attribute entry: key index, length, value.
const ATTRS_CAPACITY: usize = 2 + MAX_VALUE_LEN;

/// Offset of `attrs-data`, the fixed header a reader reads first.
const HEADER_LEN: usize = 28;

/// [`SlotRecord::word`] while one thread fills the record: the word of the last
/// generation, which no root ever has (a slot retires before it).
const FILLING: u64 = u64::MAX;

/// [`SlotRecord::name`] while a name's entry is being copied: no interned name's raw
/// value (those are below `MAX_SPAN_NAMES`), and not 0 (no name), so that neither a
/// named nor a nameless root's fill takes the bytes as already there.
const NAME_UNKNOWN: u32 = u32::MAX;

#[cfg(test)]
thread_local! {
    static INTERRUPT_AFTER_COPY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One OTEP record: exactly the bytes a reader reads (the header, then `attrs-data`).
/// Fields are atomics written with relaxed stores: a reader in another process reads them
/// while the thread naming the record is stopped, and this process never reads them but
/// in tests.
#[repr(C, align(8))]
pub(crate) struct Record {
    trace_id: [std::sync::atomic::AtomicU64; 2],
    span_id: std::sync::atomic::AtomicU64,
    valid: AtomicU8,
    trace_flags: AtomicU8,
    attrs_data_size: AtomicU16,
    attrs_data: UnsafeCell<[u8; ATTRS_CAPACITY]>,
}

const _: () = {
    assert!(std::mem::offset_of!(Record, trace_id) == 0);
    assert!(std::mem::offset_of!(Record, span_id) == 16);
    assert!(std::mem::offset_of!(Record, valid) == 24);
    assert!(std::mem::offset_of!(Record, trace_flags) == 25);
    assert!(std::mem::offset_of!(Record, attrs_data_size) == 26);
    assert!(std::mem::offset_of!(Record, attrs_data) == HEADER_LEN);
    // The OTEP recommends at most 640 bytes for the whole record.
    assert!(std::mem::size_of::<Record>() <= 640);
};

/// A label slot's record and the word of the root whose label it holds.
#[repr(C, align(64))]
pub(crate) struct SlotRecord {
    /// The label word whose value the record holds (odd generation); the release mark of
    /// the slot's last root (its word + 1: the generation the release gave the slot,
    /// even), which only a later root of the slot may fill over; 0: never filled;
    /// [`FILLING`]: a thread is filling it.
    word: AtomicU64,
    record: Record,
    /// The raw [`SpanName`] whose entry `attrs-data` holds (0: none; [`NAME_UNKNOWN`]:
    /// being copied): a slot reused by a root of the same name (the free list is LIFO)
    /// fills without copying it again. Written by the filling thread only.
    name: std::sync::atomic::AtomicU32,
}

// SAFETY: `attrs_data` is written only by the one thread that moved `word` to FILLING
// (and read only by tests on the thread that filled it); everything else is atomic.
unsafe impl Sync for SlotRecord {}

impl SlotRecord {
    pub(crate) fn new() -> SlotRecord {
        SlotRecord {
            word: AtomicU64::new(0),
            record: Record {
                trace_id: [
                    std::sync::atomic::AtomicU64::new(0),
                    std::sync::atomic::AtomicU64::new(0),
                ],
                span_id: std::sync::atomic::AtomicU64::new(0),
                valid: AtomicU8::new(0),
                trace_flags: AtomicU8::new(0),
                attrs_data_size: AtomicU16::new(0),
                attrs_data: UnsafeCell::new([0; ATTRS_CAPACITY]),
            },
            name: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Whether the record holds `word`'s label (acquire: its bytes are complete).
    #[inline]
    pub(crate) fn holds(&self, word: u64) -> bool {
        self.word.load(Ordering::Acquire) == word
    }

    /// The record's address, what `otel_thread_ctx_v1` holds while a thread runs the root.
    #[inline]
    pub(crate) fn record(&self) -> *const Record {
        &self.record
    }

    /// Fills the record with `value`, the label of `word`, if no one has: true when it
    /// holds `word` afterwards. The caller has announced the slot (`naming.rs`) and seen
    /// its root alive after that. A fill never starts over the root's own release mark
    /// (a thread that saw the root alive just before its release), so a record that holds
    /// a word holds a root not released yet.
    pub(crate) fn fill(&self, word: u64, value: &RootLabel) -> bool {
        let mut now = self.word.load(Ordering::Acquire);
        loop {
            if now == word {
                return true;
            }
            let older_mark = now == 0 || (now & 1 == 0 && generation(now) < generation(word));
            if !older_mark {
                // Being filled, or the root's release mark (or a later root's word).
                return false;
            }
            match self
                .word
                .compare_exchange(now, FILLING, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        self.write_value(value);
        // A release of the root meanwhile left its mark: this fill is for nobody.
        self.word
            .compare_exchange(FILLING, word, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Fills the record for `word`, a root being claimed, with plain stores: its slot
    /// came off the free list, and no thread names a free slot's record (a released slot
    /// a thread may name waits in limbo until none does, `naming.rs`), nor fills it (a
    /// fill started before its last release made that release send the slot to limbo; one
    /// started after finds the release's mark or this word, and does not start).
    pub(crate) fn fill_claimed(&self, word: u64, value: &RootLabel) {
        if cfg!(debug_assertions) {
            // Never filled, or an older root's release mark: no one names or fills it.
            let old = self.word.load(Ordering::Relaxed);
            debug_assert!(
                old == 0 || (old & 1 == 0 && generation(old) < generation(word)),
                "a claimed slot's record is free"
            );
        }
        self.write_value(value);
        self.word.store(word, Ordering::Release);
    }

    /// Writes `value` into the record, copying its name's entry only if `attrs-data` does
    /// not hold it already. While the entry changes, [`SlotRecord::name`] says
    /// [`NAME_UNKNOWN`]: a `fork` that leaves this half done (the child has no filling
    /// thread) must not leave it vouching for bytes that are another name's, which a
    /// later fill of that name would then skip copying.
    fn write_value(&self, value: &RootLabel) {
        let name = value.name().map_or(0, SpanName::to_raw);
        let same_name = self.name.load(Ordering::Relaxed) == name;
        if !same_name {
            self.name.store(NAME_UNKNOWN, Ordering::Relaxed);
        }
        self.record.fill(value, same_name);
        #[cfg(test)]
        if INTERRUPT_AFTER_COPY.with(std::cell::Cell::get) {
            return; // the filling thread is gone (a fork's child)
        }
        if !same_name {
            self.name.store(name, Ordering::Relaxed);
        }
    }

    /// Runs `f` with every record write on this thread stopping right after the bytes,
    /// as a forked child finds a fill its parent's other thread had begun (tests).
    #[cfg(test)]
    pub(crate) fn interrupted_after_copy<R>(f: impl FnOnce() -> R) -> R {
        INTERRUPT_AFTER_COPY.with(|i| i.set(true));
        let result = f();
        INTERRUPT_AFTER_COPY.with(|i| i.set(false));
        result
    }

    /// At the release of `word`'s root: the record holds no root any more, and carries
    /// the release's mark. True when a thread may still name the slot (the record held
    /// the root, or a thread was filling it): the slot must wait in limbo.
    pub(crate) fn forget(&self, word: u64) -> bool {
        let held = self.word.swap(word + 1, Ordering::AcqRel);
        held == word || held == FILLING
    }

    /// Sets the trace flags byte if the record holds `word` (one store: a reader sees
    /// the old byte or the new one, both the root's).
    pub(crate) fn set_flags(&self, word: u64, flags: u8) {
        if self.holds(word) {
            self.record.trace_flags.store(flags, Ordering::Relaxed);
        }
    }

    /// The record as a reader would decode it (tests).
    #[cfg(test)]
    pub(crate) fn decode(&self) -> Option<(u128, u64, u8, Vec<u8>)> {
        self.record.decode()
    }
}

impl Record {
    /// Writes `value` (`valid` 0 while the fields change, in case a reader names a record
    /// its root left; the compiler fences keep the stores in that order), its name entry
    /// unless `same_name` (`attrs-data` already holds it).
    fn fill(&self, value: &RootLabel, same_name: bool) {
        self.valid.store(0, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        let trace = value.trace_id_u128();
        let span = value.span_id_u64();
        // Stored so that memory holds the W3C (big-endian) byte order.
        self.trace_id[0].store(((trace >> 64) as u64).to_be(), Ordering::Relaxed);
        self.trace_id[1].store((trace as u64).to_be(), Ordering::Relaxed);
        self.span_id.store(span.to_be(), Ordering::Relaxed);
        // The root span's own W3C flags (sampled, random, …); none without ids.
        let flags = if span != 0 || trace != 0 {
            value.trace_flags().to_u8()
        } else {
            0
        };
        self.trace_flags.store(flags, Ordering::Relaxed);
        if !same_name {
            self.set_name(value.name().map_or(0, SpanName::to_raw));
        }
        compiler_fence(Ordering::SeqCst);
        self.valid.store(1, Ordering::Relaxed);
    }

    /// Copies the pre-encoded entry of `name` into `attrs-data` (nothing for 0, or for a
    /// name not registered).
    fn set_name(&self, name: u32) {
        let entry = NAMES
            .get(name as usize)
            .map_or(ptr::null_mut(), |slot| slot.load(Ordering::Acquire));
        if name == 0 || entry.is_null() {
            self.attrs_data_size.store(0, Ordering::Relaxed);
            return;
        }
        // SAFETY: a registered entry is a leaked, never-freed buffer of `2 + entry[1]`
        // bytes (at most ATTRS_CAPACITY); `attrs_data` is written by the filling thread
        // only (see `SlotRecord`'s `Sync`).
        unsafe {
            let len = 2 + usize::from(*entry.add(1));
            ptr::copy_nonoverlapping(entry, self.attrs_data.get().cast::<u8>(), len);
            self.attrs_data_size.store(len as u16, Ordering::Relaxed);
        }
    }

    /// `None` when invalid, else (trace id, span id, trace flags, attrs-data). Tests.
    #[cfg(test)]
    pub(crate) fn decode(&self) -> Option<(u128, u64, u8, Vec<u8>)> {
        if self.valid.load(Ordering::Relaxed) != 1 {
            return None;
        }
        let hi = u64::from_be(self.trace_id[0].load(Ordering::Relaxed));
        let lo = u64::from_be(self.trace_id[1].load(Ordering::Relaxed));
        let size = usize::from(self.attrs_data_size.load(Ordering::Relaxed));
        // SAFETY: the record was filled before it was published (acquire on `word`), and
        // no one writes it while a thread names it.
        let attrs = unsafe { (&(*self.attrs_data.get()))[..size].to_vec() };
        Some((
            (u128::from(hi) << 64) | u128::from(lo),
            u64::from_be(self.span_id.load(Ordering::Relaxed)),
            self.trace_flags.load(Ordering::Relaxed),
            attrs,
        ))
    }
}

/// Whether a label says anything a record carries (ids or a name).
pub(crate) fn is_published(root: &RootLabel) -> bool {
    root.span_id_u64() != 0 || root.trace_id_u128() != 0 || root.name().is_some()
}

/// Pre-encoded `attrs-data` entries by raw [`SpanName`] (index 0 unused): key index
/// [`super::SPAN_NAME_KEY`], length, UTF-8 bytes. Leaked on purpose: at most one small
/// buffer per distinct interned name (the interner is bounded by [`MAX_SPAN_NAMES`]).
static NAMES: [AtomicPtr<u8>; MAX_SPAN_NAMES + 2] =
    [const { AtomicPtr::new(ptr::null_mut()) }; MAX_SPAN_NAMES + 2];

/// Encodes the record entry of a newly interned name (called by the interner, once per
/// distinct name, under its lock). Values longer than 255 bytes are cut at the last
/// character boundary that fits.
pub(crate) fn register_name(raw: u32, name: &str) {
    let Some(slot) = NAMES.get(raw as usize) else {
        return;
    };
    if !slot.load(Ordering::Acquire).is_null() {
        return;
    }
    let mut end = name.len().min(MAX_VALUE_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let mut entry = Vec::with_capacity(2 + end);
    entry.push(super::SPAN_NAME_KEY);
    entry.push(end as u8);
    entry.extend_from_slice(&name.as_bytes()[..end]);
    let entry: &'static mut [u8] = Box::leak(entry.into_boxed_slice());
    slot.store(entry.as_mut_ptr(), Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceId};

    /// The name entry a decoded record carries.
    fn name_of(record: &SlotRecord) -> Vec<u8> {
        record.decode().expect("valid record").3
    }

    /// A fork in the middle of a fill leaves the child a record whose bytes are the new
    /// name's while no thread will finish the fill. A later root of the slot with the
    /// name the record held before must still get its own name's bytes, and a nameless
    /// root none.
    #[test]
    fn a_fill_cut_short_by_fork_never_vouches_for_the_old_name() {
        let a = RootLabel::name_only(SpanName::intern("record-fork-test-a"));
        let b = RootLabel::name_only(SpanName::intern("record-fork-test-bb"));
        let entry = |text: &str| {
            let mut entry = vec![super::super::SPAN_NAME_KEY, text.len() as u8];
            entry.extend_from_slice(text.as_bytes());
            entry
        };
        let record = SlotRecord::new();
        // Words of one slot: odd generations its roots', each release's mark the next even.
        record.fill_claimed(1, &a);
        assert_eq!(name_of(&record), entry("record-fork-test-a"));
        assert!(record.forget(1), "it held the root");

        // The next root, b, is published by a thread that begins the fill and vanishes
        // after the bytes (the word it leaves does not matter: b's release marks it).
        SlotRecord::interrupted_after_copy(|| record.fill(3, &b));
        assert_eq!(name_of(&record), entry("record-fork-test-bb"));
        record.forget(3);

        // A root named as the record was before the cut: its bytes, not b's.
        record.fill_claimed(5, &a);
        assert_eq!(name_of(&record), entry("record-fork-test-a"));
        record.forget(5);

        // Cut short again, then a nameless root: no name at all.
        SlotRecord::interrupted_after_copy(|| record.fill(7, &b));
        record.forget(7);
        let nameless = RootLabel::new(SpanId::from(9), TraceId::from(9), None);
        record.fill_claimed(9, &nameless);
        assert_eq!(name_of(&record), Vec::<u8>::new());
        record.forget(9);

        // And the fill through publication (`fill`) after a cut, too.
        SlotRecord::interrupted_after_copy(|| record.fill(11, &b));
        record.forget(11);
        assert!(record.fill(13, &a));
        assert_eq!(name_of(&record), entry("record-fork-test-a"));
    }
}
