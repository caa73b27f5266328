//! Each thread's side of the thread context: the record its `otel_thread_ctx_v1` names,
//! and the mirror that tells reclaimers so (`naming.rs`).
//!
//! A switch to another root stores NULL first (the pointer must never name a slot the
//! mirror has moved off), announces the new slot in the mirror, checks that the slot's
//! record holds the root, and stores the record's address. The record
//! was filled as the root was claimed (or is, by the first thread to publish it). A switch to "no span" stores NULL.
//! Readers read a thread only while it is stopped or interrupted (the OTEP's concurrency
//! model), so they see the pointer and the record in this thread's program order: the
//! compiler fence before each pointer store is all they need.

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{compiler_fence, AtomicPtr, Ordering};

use super::naming::{to_name, Mirror};
use super::record::SlotRecord;
use crate::label::{word_of, Label, LABELS};

/// The calling thread's publisher state.
struct Thread {
    /// The word whose record `otel_thread_ctx_v1` names (0: NULL).
    named: Cell<u64>,
    /// The word the thread last named and its slot's record: the root of every poll
    /// after the first on this thread, found again without the records' table.
    last: Cell<(u64, *const SlotRecord)>,
    /// The thread's mirror (null: none leased yet).
    mirror: Cell<*const Mirror>,
    /// The address of the thread's `otel_thread_ctx_v1` (null: not looked up yet).
    slot: Cell<*mut *mut c_void>,
    /// The thread is exiting and gave its mirror back: it publishes nothing any more.
    gone: Cell<bool>,
}

thread_local! {
    // `const` and no `Drop`: a plain TLS offset, alive until the thread exits (a late
    // thread-local destructor that switches spans still finds it).
    static THREAD: Thread = const {
        Thread {
            named: Cell::new(0),
            last: Cell::new((0, ptr::null())),
            mirror: Cell::new(ptr::null()),
            slot: Cell::new(ptr::null_mut()),
            gone: Cell::new(false),
        }
    };
    // Registered when the thread leases a mirror: gives it back at thread exit.
    static LEASE: Lease = const { Lease };
}

/// Gives the thread's mirror back when the thread exits.
struct Lease;

impl Drop for Lease {
    fn drop(&mut self) {
        with_thread(Thread::give_back);
    }
}

/// Runs `f` on the calling thread's [`Thread`].
#[inline(always)]
fn with_thread<R>(f: impl FnOnce(&Thread) -> R) -> R {
    // The address through a closure small enough that `LocalKey::with` inlines to one TLS
    // offset.
    let this = THREAD.with(|t| t as *const Thread);
    // SAFETY: `with` returned, so the thread-local is alive; it has no destructor (it is
    // freed with the thread), and the reference does not leave `f`, on this thread.
    f(unsafe { &*this })
}

impl Thread {
    /// Publishes the root `label` names (`None`, or a label whose root ended: no span).
    ///
    /// The two common cases stay small enough to need no saved register: "no span"
    /// (one store of NULL), and the root the thread named last (every poll after a
    /// root's first on this thread: its record's word checked, the pointer stored).
    /// Everything else (a new root, the first publication, a record to fill) is
    /// [`Self::name`].
    #[inline(always)]
    fn publish(&self, label: Option<Label>) {
        let word = word_of(label);
        let named = self.named.get();
        if word == named {
            return;
        }
        let Some(label) = label else {
            // `named` is not 0, so the pointer was looked up.
            self.store(self.slot.get(), ptr::null());
            self.named.set(0);
            return;
        };
        let (last, record) = self.last.get();
        // `last` is set with the pointer's slot and the mirror, and only after they were:
        // when it is `word` the mirror named it then. It still names it (only this thread
        // moves it, and `name` sets `last` again when it does), so the pointer is NULL
        // (else the mirror would name `named`) and the mirror's barrier is behind us.
        if named == 0 && last == word {
            // SAFETY: `last` holds a record only beside its word (not 0), and records are
            // never freed.
            let record = unsafe { &*record };
            if record.holds(word) {
                self.store(self.slot.get(), record.record().cast());
                self.named.set(word);
                return;
            }
        }
        self.name(label);
    }

    /// [`Self::publish`] for a new root: NULL first if the pointer names another, then
    /// the mirror, the record (filled if this thread is the first), the pointer.
    #[cold]
    #[inline(never)]
    fn name(&self, label: Label) {
        if self.named.get() != 0 {
            self.point_at(ptr::null());
            self.named.set(0);
        }
        let Some(mirror) = self.mirror() else {
            return;
        };
        let Some(record) = to_name(&LABELS, mirror, label) else {
            // The mirror names the word now, but its record does not hold it.
            self.last.set((0, ptr::null()));
            return;
        };
        self.point_at(record.record().cast());
        self.named.set(label.word());
        if !self.slot.get().is_null() {
            self.last.set((label.word(), record));
        }
    }

    /// The thread's mirror, leased on its first publication.
    #[inline]
    fn mirror(&self) -> Option<&'static Mirror> {
        let mirror = self.mirror.get();
        if mirror.is_null() {
            return self.lease();
        }
        // SAFETY: mirrors are never freed.
        Some(unsafe { &*mirror })
    }

    #[cold]
    #[inline(never)]
    fn lease(&self) -> Option<&'static Mirror> {
        // A thread past its thread-local destructors cannot give a mirror back: it
        // publishes nothing.
        if self.gone.get() || LEASE.try_with(|_| ()).is_err() {
            return None;
        }
        let mirror = LABELS.naming().lease()?;
        self.mirror.set(mirror);
        Some(mirror)
    }

    /// Stores `record` (or NULL) in the thread's `otel_thread_ctx_v1`.
    fn point_at(&self, record: *const c_void) {
        let mut slot = self.slot.get();
        if slot.is_null() {
            match tls_slot() {
                Some(found) => {
                    slot = found;
                    self.slot.set(found);
                }
                None => return,
            }
        }
        self.store(slot, record);
    }

    /// Stores `record` (or NULL) in `slot`, the thread's `otel_thread_ctx_v1`.
    #[inline(always)]
    fn store(&self, slot: *mut *mut c_void, record: *const c_void) {
        // The record's bytes (and the NULL before a mirror moves) come first in this
        // thread's program order, which is the order a reader stopping it sees.
        compiler_fence(Ordering::SeqCst);
        // SAFETY: the slot is this thread's own 8-byte, pointer-aligned TLS variable,
        // alive until the thread exits.
        unsafe { AtomicPtr::from_ptr(slot) }.store(record.cast_mut(), Ordering::Relaxed);
    }

    /// NULL, if the pointer names a record.
    #[inline]
    fn invalidate(&self) {
        if self.named.get() != 0 {
            self.point_at(ptr::null());
            self.named.set(0);
        }
    }

    /// At thread exit: NULL, then the mirror goes back (in that order, see `naming.rs`).
    fn give_back(&self) {
        self.invalidate();
        self.last.set((0, ptr::null()));
        self.gone.set(true);
        let mirror = self.mirror.replace(ptr::null());
        if !mirror.is_null() {
            // SAFETY: mirrors are never freed.
            unsafe { &*mirror }.give_back();
        }
    }
}

/// Publishes `label` for the calling thread.
#[inline]
pub(crate) fn publish(label: Option<Label>) {
    with_thread(|t| t.publish(label));
}

/// The calling thread's `otel_thread_ctx_v1` becomes NULL (if it named a record).
#[inline]
pub(crate) fn invalidate() {
    with_thread(Thread::invalidate);
}

/// In a forked child: the forking thread keeps its mirror, every other is given back.
pub(crate) fn after_fork_in_child() {
    with_thread(|t| {
        t.last.set((0, ptr::null()));
        let mirror = t.mirror.get();
        // SAFETY: mirrors are never freed.
        LABELS
            .naming()
            .after_fork_in_child((!mirror.is_null()).then(|| unsafe { &*mirror }));
    });
    LABELS.after_fork_in_child();
}

/// The address of the calling thread's `otel_thread_ctx_v1`.
#[cfg(otel_thread_ctx)]
fn tls_slot() -> Option<*mut *mut c_void> {
    extern "C" {
        fn otel_profiling_thread_ctx_slot() -> *mut *mut c_void;
    }
    // SAFETY: the C accessor only computes the address of its thread-local variable.
    Some(unsafe { otel_profiling_thread_ctx_slot() })
}

/// No `otel_thread_ctx_v1` on this platform.
#[cfg(not(otel_thread_ctx))]
fn tls_slot() -> Option<*mut *mut c_void> {
    None
}

/// The calling thread's `otel_thread_ctx_v1` value (tests).
#[cfg(test)]
pub(crate) fn slot_value() -> *const super::record::Record {
    // SAFETY: reading this thread's own variable.
    tls_slot().map_or(ptr::null(), |slot| unsafe { *slot }.cast_const().cast())
}

/// The record the calling thread's `otel_thread_ctx_v1` names, as a reader decodes it:
/// `None` for NULL or an invalid record (tests).
#[cfg(test)]
pub(crate) fn decoded() -> Option<(u128, u64, u8, Vec<u8>)> {
    let record = slot_value();
    // SAFETY: a non-NULL pointer names a never-freed record that no one rewrites while
    // this thread names it.
    (!record.is_null())
        .then(|| unsafe { &*record }.decode())
        .flatten()
}
