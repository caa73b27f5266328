//! The calling thread's Thread Local Context Record (OTEP 4947), written in place.
//!
//! One record per thread, in a `const` thread-local (no lazy initialisation, no
//! destructor). The first write on a thread stores the record's address in the thread's
//! `otel_thread_ctx_v1` slot (the C variable of `tls.c`); from then on the slot never
//! changes and updates follow the OTEP's in-place protocol on the `valid` byte:
//! `valid = 0`, compiler fence, fields, compiler fence, `valid = 1`. Readers read a thread
//! only while it is stopped or interrupted (the OTEP's concurrency model), so a reader
//! that stops the thread in the middle of an update sees `valid == 0` and skips it: no
//! CPU fence is needed, and the compiler fences compile to nothing.
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
//! is interned ([`register_name`]) and copied into the record only when the name differs
//! from the one already there, so a switch allocates nothing and takes no lock.

use std::cell::{Cell, UnsafeCell};
use std::ptr;
use std::sync::atomic::{compiler_fence, AtomicPtr, AtomicU16, AtomicU64, AtomicU8, Ordering};

use crate::label::Label;
use crate::span_context::RootLabel;
use crate::span_name::{SpanName, MAX_SPAN_NAMES};

/// Longest attribute value the record format can carry (its length is one byte).
pub(crate) const MAX_VALUE_LEN: usize = 255;

/// Room for one attribute entry: key index, length, value.
const ATTRS_CAPACITY: usize = 2 + MAX_VALUE_LEN;

/// Offset of `attrs-data`, the fixed header a reader reads first.
pub(crate) const HEADER_LEN: usize = 28;

/// One thread's record. The first [`HEADER_LEN`] + `attrs-data-size` bytes are the OTEP
/// record; the two fields after `attrs_data` are this writer's own bookkeeping, which no
/// reader looks at (readers stop at `attrs-data-size`).
#[repr(C, align(8))]
pub(crate) struct Record {
    trace_id: [AtomicU64; 2],
    span_id: AtomicU64,
    valid: AtomicU8,
    trace_flags: AtomicU8,
    attrs_data_size: AtomicU16,
    attrs_data: UnsafeCell<[u8; ATTRS_CAPACITY]>,
    /// Whether this thread's `otel_thread_ctx_v1` points here yet.
    attached: Cell<bool>,
    /// The raw [`SpanName`] whose entry `attrs_data` holds (0: none).
    name: Cell<u32>,
    /// The label word whose value the fields hold (0: none). Words never repeat, so the
    /// same word is the same label: entering it again (the next poll of the same root)
    /// only sets `valid` again, after checking the root still owns its slot.
    word: Cell<u64>,
}

const _: () = {
    assert!(std::mem::offset_of!(Record, trace_id) == 0);
    assert!(std::mem::offset_of!(Record, span_id) == 16);
    assert!(std::mem::offset_of!(Record, valid) == 24);
    assert!(std::mem::offset_of!(Record, trace_flags) == 25);
    assert!(std::mem::offset_of!(Record, attrs_data_size) == 26);
    assert!(std::mem::offset_of!(Record, attrs_data) == HEADER_LEN);
    // The OTEP recommends at most 640 bytes for the whole record.
    assert!(HEADER_LEN + ATTRS_CAPACITY <= 640);
};

impl Record {
    const fn new() -> Record {
        Record {
            trace_id: [AtomicU64::new(0), AtomicU64::new(0)],
            span_id: AtomicU64::new(0),
            valid: AtomicU8::new(0),
            trace_flags: AtomicU8::new(0),
            attrs_data_size: AtomicU16::new(0),
            attrs_data: UnsafeCell::new([0; ATTRS_CAPACITY]),
            attached: Cell::new(false),
            name: Cell::new(0),
            word: Cell::new(0),
        }
    }

    /// Publishes `root` (or "no span" for `None`). Owning thread only; a few stores, no
    /// allocation, no lock, no system call (the first call on a thread also stores the
    /// record's address in the thread's `otel_thread_ctx_v1`).
    #[inline]
    fn write(&self, root: Option<RootLabel>) {
        if !self.attached.get() {
            self.attach();
        }
        self.valid.store(0, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        let Some(root) = root.filter(is_published) else {
            // Detached: the record stays invalid until the next root.
            return;
        };
        let trace = root.trace_id_u128();
        let span = root.span_id_u64();
        // Stored so that memory holds the W3C (big-endian) byte order.
        self.trace_id[0].store(((trace >> 64) as u64).to_be(), Ordering::Relaxed);
        self.trace_id[1].store((trace as u64).to_be(), Ordering::Relaxed);
        self.span_id.store(span.to_be(), Ordering::Relaxed);
        // The root span's own W3C flags (sampled, random, …); none without ids.
        let flags = if span != 0 || trace != 0 {
            root.trace_flags().to_u8()
        } else {
            0
        };
        self.trace_flags.store(flags, Ordering::Relaxed);
        let name = root.name().map_or(0, SpanName::to_raw);
        if name != self.name.get() {
            self.set_name(name);
        }
        compiler_fence(Ordering::SeqCst);
        self.valid.store(1, Ordering::Relaxed);
    }

    /// Publishes the root `label` names (`None`, or a label whose root ended: no span).
    #[inline]
    fn publish(&self, label: Option<Label>) {
        if let Some(label) = label {
            if label.word() == self.word.get() && self.attached.get() && label.is_live() {
                // The fields already hold this label: only valid again.
                compiler_fence(Ordering::SeqCst);
                self.valid.store(1, Ordering::Relaxed);
                return;
            }
        }
        let value = label.and_then(Label::read).filter(is_published);
        self.write(value);
        // "No span" leaves the fields as they were (only `valid` changed): they still hold
        // the label `word` names.
        if value.is_some() {
            self.word.set(crate::label::word_of(label));
        }
    }

    /// Copies the pre-encoded entry of `name` into `attrs-data` (nothing for 0, or for a
    /// name not registered).
    #[inline]
    fn set_name(&self, name: u32) {
        let entry = NAMES
            .get(name as usize)
            .map_or(ptr::null_mut(), |slot| slot.load(Ordering::Acquire));
        if name == 0 || entry.is_null() {
            self.attrs_data_size.store(0, Ordering::Relaxed);
            self.name.set(0);
            return;
        }
        // SAFETY: a registered entry is a leaked, never-freed buffer of `2 + entry[1]`
        // bytes (at most ATTRS_CAPACITY); `attrs_data` is written by this thread only.
        unsafe {
            let len = 2 + usize::from(*entry.add(1));
            ptr::copy_nonoverlapping(entry, self.attrs_data.get().cast::<u8>(), len);
            self.attrs_data_size.store(len as u16, Ordering::Relaxed);
        }
        self.name.set(name);
    }

    /// Points this thread's `otel_thread_ctx_v1` at the record (once per thread).
    #[cold]
    #[inline(never)]
    fn attach(&self) {
        self.attached.set(true);
        let Some(slot) = tls_slot() else {
            return;
        };
        // SAFETY: the slot is this thread's own 8-byte, pointer-aligned TLS variable, and
        // the record lives as long as the thread (both are freed when it exits).
        let slot = unsafe { AtomicPtr::<Record>::from_ptr(slot.cast()) };
        compiler_fence(Ordering::SeqCst);
        slot.store(self as *const Record as *mut Record, Ordering::Relaxed);
    }

    /// Marks the record invalid, if it was ever attached.
    #[inline]
    fn invalidate(&self) {
        if self.attached.get() {
            self.valid.store(0, Ordering::Relaxed);
        }
    }

    /// This thread's record as a reader would decode it: `None` when invalid, else
    /// (trace id, span id, trace flags, attrs-data). For tests on the owning thread.
    #[cfg(test)]
    pub(crate) fn decode(&self) -> Option<(u128, u64, u8, Vec<u8>)> {
        if self.valid.load(Ordering::Relaxed) != 1 {
            return None;
        }
        let hi = u64::from_be(self.trace_id[0].load(Ordering::Relaxed));
        let lo = u64::from_be(self.trace_id[1].load(Ordering::Relaxed));
        let size = usize::from(self.attrs_data_size.load(Ordering::Relaxed));
        // SAFETY: owning thread, no concurrent writer.
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
fn is_published(root: &RootLabel) -> bool {
    root.span_id_u64() != 0 || root.trace_id_u128() != 0 || root.name().is_some()
}

thread_local! {
    // `const` and no `Drop`: a plain TLS offset, valid until the thread exits, as long
    // as the thread's `otel_thread_ctx_v1` that points at it.
    pub(crate) static RECORD: Record = const { Record::new() };
}

/// Publishes `label` in the calling thread's record.
#[inline]
pub(crate) fn publish(label: Option<Label>) {
    // The address through a closure small enough that `LocalKey::with` inlines to one TLS
    // offset (with the write inside, it stays a call through the key's accessor).
    let record = RECORD.with(|record| record as *const Record);
    // SAFETY: `with` returned, so the thread-local is alive; it has no destructor (it is
    // freed with the thread), and the reference does not leave this call, on this thread.
    unsafe { &*record }.publish(label);
}

/// Marks the calling thread's record invalid (if it has one).
#[inline]
pub(crate) fn invalidate() {
    let _ = RECORD.try_with(Record::invalidate);
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

/// The address of the calling thread's `otel_thread_ctx_v1`.
#[cfg(otel_thread_ctx)]
fn tls_slot() -> Option<*mut *mut std::ffi::c_void> {
    extern "C" {
        fn otel_profiling_thread_ctx_slot() -> *mut *mut std::ffi::c_void;
    }
    // SAFETY: the C accessor only computes the address of its thread-local variable.
    Some(unsafe { otel_profiling_thread_ctx_slot() })
}

/// No `otel_thread_ctx_v1` on this platform.
#[cfg(not(otel_thread_ctx))]
fn tls_slot() -> Option<*mut *mut std::ffi::c_void> {
    None
}

/// The calling thread's `otel_thread_ctx_v1` value (for tests).
#[cfg(all(test, otel_thread_ctx))]
pub(crate) fn slot_value() -> *mut std::ffi::c_void {
    // SAFETY: reading this thread's own variable.
    tls_slot().map_or(ptr::null_mut(), |slot| unsafe { *slot })
}
