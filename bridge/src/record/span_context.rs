//! The per-thread span context: which local root span is running on this thread right now.
//!
//! Every thread has one [`SpanContextCell`], two atomics in a `const` thread-local (no lazy
//! initialisation, no destructor). Span hooks write it; the CPU sampler's signal handler
//! reads it on the same thread at the moment a sample is taken, the blocked-in-poll
//! watchdog from its own thread.
//!
//! The record holds one [`Label`] word: the slot of the running root's label, written once
//! when the root was resolved (`label::table`). A transition stores the word between two
//! stores of a sequence number (odd while the word changes). The handler, on the owning
//! thread, needs only the word: a signal interrupts the writer between two instructions,
//! and either word is a whole one. The sequence is for the watchdog, which reads from
//! another thread and tells "still inside the same poll" by the same sequence on two
//! ticks (a root left and entered again in between changed it by 4). It is a `u64`: at
//! most 10⁹ transitions a second, it comes back to a value only after 292 years.
//! A write is three relaxed stores and two fences that compile to nothing on x86-64: no
//! allocation, no lock, no syscall.

use crate::sync::{fence, AtomicU64, Ordering};

use crate::label::{word_of, Label};
pub use crate::label::{LocalRoot, RootLabel};

/// Whether any span reached the crate's hooks (the layer's `on_new_span`, or a root built
/// for the plain OpenTelemetry API). The collector warns once when samples
/// arrive and none did: a filter in front of the layer drops every span.
static SPAN_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes that a span reached the hooks: one relaxed load once set (called where a span
/// or root is resolved, not on every switch).
#[inline]
pub(crate) fn note_span_seen() {
    use std::sync::atomic::Ordering::Relaxed;
    if !SPAN_SEEN.load(Relaxed) {
        SPAN_SEEN.store(true, Relaxed);
    }
}

/// Whether the layer was asked about a span callsite (it is, before any filter decides).
static SPAN_CALLSITE_SEEN: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Notes that code created (or tried to create) a span: the layer's `register_callsite`,
/// once per callsite.
pub(crate) fn note_span_callsite() {
    SPAN_CALLSITE_SEEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`note_span_callsite`] was ever called in this process.
pub(crate) fn span_callsite_seen() -> bool {
    SPAN_CALLSITE_SEEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether [`note_span_seen`] was ever called in this process.
pub(crate) fn span_seen() -> bool {
    SPAN_SEEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// One thread's span context record: the running root's [`Label`] word under a sequence
/// number (one writer, the owning thread), read by the sampler's handler and watchdog.
#[repr(C, align(16))]
#[derive(Debug)]
pub(crate) struct SpanContextCell {
    seq: AtomicU64,
    word: AtomicU64,
}

impl SpanContextCell {
    crate::sync::const_fn! {
        /// An empty record ("no span").
        pub(crate) fn new() -> SpanContextCell {
            SpanContextCell {
                seq: AtomicU64::new(0),
                word: AtomicU64::new(0),
            }
        }
    }

    /// Reads the record on its own thread (the signal handler): the running root's label,
    /// if its root still owns the slot. Async-signal-safe: loads only.
    #[inline]
    pub(crate) fn read(&self) -> Option<RootLabel> {
        Label::from_raw(self.word.load(Ordering::Relaxed)).and_then(Label::read)
    }

    /// [`SpanContextCell::snapshot_word`] with the word's label read (tests).
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> Option<(u64, Option<RootLabel>)> {
        let (seq, label) = self.snapshot_word()?;
        Some((seq, label.and_then(Label::read)))
    }

    /// Reads the record with its sequence number, from any thread: `None` when the read
    /// raced a write. The sequence changes (by two) at every write, so two reads with the
    /// same sequence saw no root transition in between: what the blocked-thread watchdog
    /// uses to tell "still inside the same poll". Loads only.
    #[inline]
    pub(crate) fn snapshot_word(&self) -> Option<(u64, Option<Label>)> {
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let word = self.word.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != before {
            return None;
        }
        Some((before, Label::from_raw(word)))
    }

    /// Writes the record. Only the owning thread may call this (single writer).
    #[inline]
    fn write(&self, label: Option<Label>) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.word.store(word_of(label), Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// [`SpanContextCell::write`], for the models of other modules' protocols (the
    /// watchdog's handshake with a slot's release).
    #[cfg(all(test, loom))]
    pub(crate) fn write_for_model(&self, label: Option<Label>) {
        self.write(label);
    }

    /// Sets the sequence (tests: next to its wrap, 2⁶³ writes being out of reach).
    #[cfg(test)]
    pub(crate) fn set_sequence(&self, seq: u64) {
        self.seq.store(seq, Ordering::Relaxed);
    }

    /// The word last written, read by the writer itself (no race possible).
    #[inline]
    pub(super) fn own_word(&self) -> Option<Label> {
        Label::from_raw(self.word.load(Ordering::Relaxed))
    }
}

impl Default for SpanContextCell {
    fn default() -> Self {
        SpanContextCell::new()
    }
}

/// Everything a span switch touches on its thread, in one thread-local so that a switch
/// is one TLS access: the record the handler reads and the scope stack.
pub(super) struct PerThread {
    pub(super) cell: SpanContextCell,
    pub(super) scopes: scopes::Stack,
}

// The signal handler and the allocator's hook read `THREAD` while a thread's other
// thread-locals are torn down: a destructor would make `with` panic there. This fails the
// build if the record ever gets one.
#[cfg(not(loom))]
const _: () = assert!(!std::mem::needs_drop::<PerThread>());

thread_local! {
    // `const` initialisation and no `Drop`: access is a plain TLS offset, never a lazy-init
    // call, so the signal handler may touch the cell, and the memory lives as long as the
    // thread.
    #[cfg(not(loom))]
    pub(super) static THREAD: PerThread = const {
        PerThread { cell: SpanContextCell::new(), scopes: scopes::Stack::new() }
    };
    // loom's atomics are built at run time (and no model reaches this thread-local).
    #[cfg(loom)]
    pub(super) static THREAD: PerThread =
        PerThread { cell: SpanContextCell::new(), scopes: scopes::Stack::new() };
}

/// Runs `f` on the calling thread's [`PerThread`]. The thread-local's address is taken
/// with a closure small enough that `LocalKey::with` always inlines to one TLS offset
/// (with the switch's body inside it, it stayed a call through the key's accessor
/// pointer: two calls per enter).
#[inline(always)]
pub(super) fn with_thread<R>(f: impl FnOnce(&PerThread) -> R) -> R {
    let this = THREAD.with(|t| t as *const PerThread);
    // SAFETY: `with` returned, so the thread-local is alive; it has no destructor (it is
    // freed with the thread), and the reference does not leave `f`, which runs on this
    // thread: it cannot outlive the storage.
    f(unsafe { &*this })
}

/// Forgets the calling thread's scopes and context (tests that leave guards behind on
/// purpose).
#[cfg(test)]
pub(crate) fn forget_scopes_for_test() {
    with_thread(|t| {
        t.scopes.clear_for_test();
        t.cell.write(None);
    });
}

/// The label of the local root running on the calling thread, as a sample taken now
/// would see it.
///
/// ```
/// assert_eq!(otel_profiling::current_local_root(), None);
/// ```
pub fn current_local_root() -> Option<RootLabel> {
    THREAD.with(|t| t.cell.read())
}

/// The word of the calling thread's record (`None`: no span).
#[inline]
pub(crate) fn current_word() -> Option<Label> {
    THREAD.with(|t| t.cell.own_word())
}

/// The calling thread's record, for the sampler to read from its signal handler. The
/// pointer is valid until the thread exits.
pub(crate) fn thread_cell() -> *const SpanContextCell {
    THREAD.with(|t| &t.cell as *const SpanContextCell)
}

impl SpanContextCell {
    /// Moves the record from `previous` (its word now) to `label`, a different word: the
    /// active-time stretch (only if one of them has CPU counters), the record, the OTEP
    /// 4947 thread context. Without counters and a thread context ever enabled (no
    /// sampler, a hand-built root) this is the record's write inline, with no call; with
    /// them, one call that does all three.
    #[inline]
    pub(super) fn switch(&self, previous: Option<Label>, label: Option<Label>) {
        if active::has_counters(previous, label) || crate::thread_ctx::was_ever_enabled() {
            match (previous, label) {
                (None, Some(to)) => self.enter_with_hooks(to),
                (Some(from), None) => self.exit_with_hooks(from),
                _ => self.switch_with_hooks(previous, label),
            }
        } else {
            self.write(label);
        }
    }

    /// [`Self::switch_with_hooks`] from no root to `to` (a poll starts). Its usual path
    /// (the TSC, the thread context's usual cases) makes no call that is not its last
    /// instruction, so it keeps nothing across one.
    #[inline(never)]
    fn enter_with_hooks(&self, to: Label) {
        if to.has_cpu() {
            let Some(now) = crate::clock::tsc_ticks() else {
                return self.switch_with_hooks(None, Some(to));
            };
            if !active::entered_at(now) {
                return self.switch_with_hooks(None, Some(to));
            }
        }
        self.write(Some(to));
        crate::thread_ctx::publish(Some(to));
    }

    /// [`Self::switch_with_hooks`] from `from` to no root (a poll ends), as
    /// [`Self::enter_with_hooks`]; the root's counters not in the thread's stretch take
    /// the general path.
    #[inline(never)]
    fn exit_with_hooks(&self, from: Label) {
        if from.has_cpu() {
            let Some(now) = crate::clock::tsc_ticks() else {
                return self.switch_with_hooks(Some(from), None);
            };
            if !active::left_at(from, now) {
                return self.switch_with_hooks(Some(from), None);
            }
        }
        self.write(None);
        crate::thread_ctx::publish(None);
    }

    /// [`Self::switch`] with the active-time stretch and the thread context.
    #[inline(never)]
    fn switch_with_hooks(&self, previous: Option<Label>, label: Option<Label>) {
        active::transition(previous, label);
        self.write(label);
        crate::thread_ctx::publish(label);
    }
}

/// Sets the calling thread's span context for as long as the guard lives.
///
/// This is the primitive the OpenTelemetry wrappers are built on; use it directly to follow
/// a span through code the other integrations do not see. A guard is a scope on the same
/// per-thread stack as the `tracing` layer's entered spans, so guards and spans may end in
/// any order: dropping the innermost scope restores the context from before it, and
/// dropping one that a later scope still runs above changes nothing now, the later scope
/// restoring, when it ends, what was there before both.
///
/// ```
/// use opentelemetry::trace::{SpanId, TraceId};
/// use otel_profiling::{current_local_root, LocalRoot, SpanContextGuard};
///
/// let root = LocalRoot::new(SpanId::from(7), TraceId::from(9), None);
/// {
///     let _guard = SpanContextGuard::enter(Some(&root));
///     assert_eq!(current_local_root(), Some(root.label()));
/// }
/// assert_eq!(current_local_root(), None);
///
/// // Out of order: `a` ends while `b` runs above it.
/// let other = LocalRoot::new(SpanId::from(8), TraceId::from(9), None);
/// let a = SpanContextGuard::enter(Some(&root));
/// let b = SpanContextGuard::enter(Some(&other));
/// drop(a);
/// assert_eq!(current_local_root(), Some(other.label()));
/// drop(b);
/// assert_eq!(current_local_root(), None);
/// ```
#[derive(Debug)]
#[must_use = "the context is restored when the guard is dropped"]
pub struct SpanContextGuard<'root> {
    key: scopes::Key,
    // The scope is on the stack of the thread that entered it, and labels samples only
    // while the root's handle (its slot) lives: the borrow makes a temporary root a
    // compile error instead of a scope that labels nothing.
    _not_send: std::marker::PhantomData<(*const (), &'root LocalRoot)>,
}

impl<'root> SpanContextGuard<'root> {
    /// Sets `root` as the calling thread's context until the guard is dropped: one word
    /// (the root's label slot) pushed and published. The root must outlive the guard for
    /// samples to carry its label; once its last handle is dropped they carry none.
    #[inline]
    pub fn enter(root: Option<&'root LocalRoot>) -> SpanContextGuard<'root> {
        let key = scopes::enter_guard(root.and_then(LocalRoot::word));
        SpanContextGuard {
            key,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for SpanContextGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        scopes::exit(self.key);
    }
}

pub(crate) mod active;
#[cfg(all(test, loom))]
mod loom_model;
pub(crate) mod own_clocks;
pub(crate) mod scopes;
#[cfg(test)]
mod tests;
