//! The per-thread span context: which local root span is running on this thread right now.
//!
//! Every thread has one [`SpanContextCell`], a fixed record of atomics in a `const`
//! thread-local (no lazy initialisation, no destructor). Span hooks write it; the CPU
//! sampler's signal handler reads it on the same thread at the moment a sample is taken.
//!
//! The record is a sequence lock. A write is: bump the sequence to odd, store the fields,
//! bump it to even. A read that finds an odd sequence, or a sequence that changed while it
//! read, reports "no span": a read racing a write never returns a mix of two spans. On the
//! owning thread a signal can only interrupt the writer, never run beside it, so the odd
//! check alone is exact there; the second check makes reads from other threads safe too.
//! The sequence is a `u64`: a write costs well over a nanosecond, so at most 10⁹ writes a
//! second (2·10⁹ sequence steps), and it comes back to a value only after 292 years — a
//! reader from another thread (the watchdog) preempted in the middle of its read, or
//! comparing two reads a tick apart, can never see an old sequence return.
//! Writes are eight relaxed stores and two fences that compile to nothing on x86-64: no
//! allocation, no lock, no syscall.

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

use opentelemetry::trace::{SpanId, TraceFlags, TraceId};

use crate::root_cpu::CpuHandle;
use crate::span_name::SpanName;

/// The local root span a thread is working for, as the profiler labels its samples.
///
/// For a sampled trace it carries the root's span id, trace id and W3C trace flags; for an
/// unsampled trace (see [`UnsampledTraces`](crate::UnsampledTraces)) only the root's name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct LocalRoot {
    span_id: u64,
    trace_id: u128,
    name: Option<SpanName>,
    /// The root span's W3C trace flags byte (sampled 0x01, random 0x02, …), as the
    /// OpenTelemetry thread context publishes it.
    flags: u8,
    /// The root's CPU counters, as a packed [`CpuHandle`] (0: none): a slot index and
    /// 64-bit generation the signal handler checks, never an address, so a copy that
    /// outlives its span can do no harm (see `root_cpu`).
    cpu: u128,
}

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

impl LocalRoot {
    /// A root with ids (a sampled trace), with the trace flags [`TraceFlags::SAMPLED`]
    /// (`01`); give it its span's own flags with [`with_trace_flags`](Self::with_trace_flags).
    /// Invalid (all-zero) ids count as absent.
    pub fn new(span_id: SpanId, trace_id: TraceId, name: Option<SpanName>) -> LocalRoot {
        note_span_seen();
        LocalRoot {
            span_id: u64::from_be_bytes(span_id.to_bytes()),
            trace_id: u128::from_be_bytes(trace_id.to_bytes()),
            name,
            flags: TraceFlags::SAMPLED.to_u8(),
            cpu: 0,
        }
    }

    /// The same root with the W3C trace flags of its span context (`span_context.
    /// trace_flags()`: sampled, and the random-trace-id bit `02` when the context has it).
    /// The crate's own roots carry them; the OpenTelemetry thread context publishes them.
    ///
    /// ```
    /// use opentelemetry::trace::{SpanId, TraceFlags, TraceId};
    /// use otel_profiling::LocalRoot;
    ///
    /// let root = LocalRoot::new(SpanId::from(7), TraceId::from(9), None)
    ///     .with_trace_flags(TraceFlags::new(0x03));
    /// assert_eq!(root.trace_flags(), TraceFlags::new(0x03));
    /// ```
    pub fn with_trace_flags(mut self, flags: TraceFlags) -> LocalRoot {
        self.flags = flags.to_u8();
        self
    }

    /// The root span's W3C trace flags (`00` for a root known only by name).
    pub fn trace_flags(&self) -> TraceFlags {
        TraceFlags::new(self.flags)
    }

    /// The same root, with samples under it counted into `cpu`.
    pub(crate) fn with_cpu(mut self, cpu: CpuHandle) -> LocalRoot {
        self.cpu = cpu.to_raw();
        self
    }

    /// The root's counters as the signal handler passes them to `root_cpu::record`.
    #[inline]
    pub(crate) fn cpu_raw(&self) -> u128 {
        self.cpu
    }

    /// A root known only by name (an unsampled trace).
    pub fn name_only(name: SpanName) -> LocalRoot {
        note_span_seen();
        LocalRoot {
            span_id: 0,
            trace_id: 0,
            name: Some(name),
            flags: 0,
            cpu: 0,
        }
    }

    /// The root span's id, if the trace was sampled.
    pub fn span_id(&self) -> Option<SpanId> {
        (self.span_id != 0).then(|| SpanId::from_bytes(self.span_id.to_be_bytes()))
    }

    /// The trace id, if the trace was sampled.
    pub fn trace_id(&self) -> Option<TraceId> {
        (self.trace_id != 0).then(|| TraceId::from_bytes(self.trace_id.to_be_bytes()))
    }

    /// The root span's interned name, if known.
    pub fn name(&self) -> Option<SpanName> {
        self.name
    }

    /// The span id as a number (0 when absent): the form the sampler copies into samples.
    pub fn span_id_u64(&self) -> u64 {
        self.span_id
    }

    /// The trace id as a number (0 when absent).
    pub fn trace_id_u128(&self) -> u128 {
        self.trace_id
    }

    fn is_empty(&self) -> bool {
        self.span_id == 0 && self.trace_id == 0 && self.name.is_none()
    }
}

/// One thread's span context record: a sequence lock (one writer, the owning thread;
/// readers see a whole value or "no span", never a mix), read by the sampler's handler.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct SpanContextCell {
    seq: AtomicU64,
    name: AtomicU32,
    /// The W3C trace flags byte.
    flags: AtomicU32,
    span_id: AtomicU64,
    trace_hi: AtomicU64,
    trace_lo: AtomicU64,
    /// The packed [`CpuHandle`]'s high half (index + 1) and low half (generation).
    cpu_hi: AtomicU64,
    cpu_lo: AtomicU64,
}

impl SpanContextCell {
    crate::sync::const_fn! {
        /// An empty record ("no span").
        pub(crate) fn new() -> SpanContextCell {
            SpanContextCell {
                seq: AtomicU64::new(0),
                name: AtomicU32::new(0),
                flags: AtomicU32::new(0),
                span_id: AtomicU64::new(0),
                trace_hi: AtomicU64::new(0),
                trace_lo: AtomicU64::new(0),
                cpu_hi: AtomicU64::new(0),
                cpu_lo: AtomicU64::new(0),
            }
        }
    }

    /// Reads the record. Async-signal-safe: loads only, no allocation, no lock.
    ///
    /// Returns `None` for "no span", and also when the read raced a write.
    #[inline]
    pub(crate) fn read(&self) -> Option<LocalRoot> {
        self.snapshot().and_then(|(_, root)| root)
    }

    /// Reads the record with its sequence number, from any thread: `None` when the read
    /// raced a write. The sequence changes (by two) at every write, so two reads with the
    /// same sequence saw no root transition in between: what the blocked-thread watchdog
    /// uses to tell "still inside the same poll". Loads only.
    #[inline]
    pub(crate) fn snapshot(&self) -> Option<(u64, Option<LocalRoot>)> {
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let name = self.name.load(Ordering::Relaxed);
        let flags = self.flags.load(Ordering::Relaxed);
        let span_id = self.span_id.load(Ordering::Relaxed);
        let hi = self.trace_hi.load(Ordering::Relaxed);
        let lo = self.trace_lo.load(Ordering::Relaxed);
        let cpu_hi = self.cpu_hi.load(Ordering::Relaxed);
        let cpu_lo = self.cpu_lo.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != before {
            return None;
        }
        let root = LocalRoot {
            span_id,
            trace_id: (u128::from(hi) << 64) | u128::from(lo),
            name: SpanName::from_raw(name),
            flags: flags as u8,
            cpu: (u128::from(cpu_hi) << 64) | u128::from(cpu_lo),
        };
        Some((before, (!root.is_empty()).then_some(root)))
    }

    /// Writes the record. Only the owning thread may call this (single writer).
    #[inline]
    fn write(&self, root: Option<LocalRoot>) {
        let root = root.unwrap_or(LocalRoot {
            span_id: 0,
            trace_id: 0,
            name: None,
            flags: 0,
            cpu: 0,
        });
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.name
            .store(root.name.map_or(0, SpanName::to_raw), Ordering::Relaxed);
        self.flags.store(u32::from(root.flags), Ordering::Relaxed);
        self.span_id.store(root.span_id, Ordering::Relaxed);
        self.trace_hi
            .store((root.trace_id >> 64) as u64, Ordering::Relaxed);
        self.trace_lo.store(root.trace_id as u64, Ordering::Relaxed);
        self.cpu_hi
            .store((root.cpu >> 64) as u64, Ordering::Relaxed);
        self.cpu_lo.store(root.cpu as u64, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// [`SpanContextCell::write`], for the models of other modules' protocols (the
    /// watchdog's handshake with a slot's release).
    #[cfg(all(test, loom))]
    pub(crate) fn write_for_model(&self, root: Option<LocalRoot>) {
        self.write(root);
    }

    /// Sets the sequence (tests: next to its wrap, 2⁶³ writes being out of reach).
    #[cfg(test)]
    pub(crate) fn set_sequence(&self, seq: u64) {
        self.seq.store(seq, Ordering::Relaxed);
    }

    /// The value last written, read by the writer itself (no race possible).
    #[inline]
    fn own_value(&self) -> Option<LocalRoot> {
        let root = LocalRoot {
            span_id: self.span_id.load(Ordering::Relaxed),
            trace_id: (u128::from(self.trace_hi.load(Ordering::Relaxed)) << 64)
                | u128::from(self.trace_lo.load(Ordering::Relaxed)),
            name: SpanName::from_raw(self.name.load(Ordering::Relaxed)),
            flags: self.flags.load(Ordering::Relaxed) as u8,
            cpu: (u128::from(self.cpu_hi.load(Ordering::Relaxed)) << 64)
                | u128::from(self.cpu_lo.load(Ordering::Relaxed)),
        };
        (!root.is_empty()).then_some(root)
    }
}

impl Default for SpanContextCell {
    fn default() -> Self {
        SpanContextCell::new()
    }
}

thread_local! {
    // `const` initialisation and no `Drop`: access is a plain TLS offset, never a lazy-init
    // call, so the signal handler may touch it, and the memory lives as long as the thread.
    #[cfg(not(loom))]
    static CELL: SpanContextCell = const { SpanContextCell::new() };
    // loom's atomics are built at run time (and no model reaches this thread-local).
    #[cfg(loom)]
    static CELL: SpanContextCell = SpanContextCell::new();
}

/// The local root span running on the calling thread, as a sample taken now would see it.
///
/// ```
/// assert_eq!(otel_profiling::current_local_root(), None);
/// ```
pub fn current_local_root() -> Option<LocalRoot> {
    CELL.with(SpanContextCell::read)
}

/// The calling thread's record, for the sampler to read from its signal handler. The
/// pointer is valid until the thread exits.
pub(crate) fn thread_cell() -> *const SpanContextCell {
    CELL.with(|cell| cell as *const SpanContextCell)
}

/// Sets the calling thread's context and returns what was there before.
#[inline]
pub(crate) fn replace(root: Option<LocalRoot>) -> Option<LocalRoot> {
    CELL.with(|cell| {
        let previous = cell.own_value();
        if previous != root {
            active::transition(previous.map_or(0, |r| r.cpu), root.map_or(0, |r| r.cpu));
            cell.write(root);
            crate::thread_ctx::publish(root);
        }
        previous
    })
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
///     let _guard = SpanContextGuard::enter(Some(root));
///     assert_eq!(current_local_root(), Some(root));
/// }
/// assert_eq!(current_local_root(), None);
///
/// // Out of order: `a` ends while `b` runs above it.
/// let other = LocalRoot::new(SpanId::from(8), TraceId::from(9), None);
/// let a = SpanContextGuard::enter(Some(root));
/// let b = SpanContextGuard::enter(Some(other));
/// drop(a);
/// assert_eq!(current_local_root(), Some(other));
/// drop(b);
/// assert_eq!(current_local_root(), None);
/// ```
#[derive(Debug)]
#[must_use = "the context is restored when the guard is dropped"]
pub struct SpanContextGuard {
    key: scopes::Key,
    // The scope is on the stack of the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl SpanContextGuard {
    /// Sets `root` as the calling thread's context until the guard is dropped.
    #[inline]
    pub fn enter(root: Option<LocalRoot>) -> SpanContextGuard {
        let key = scopes::Key::next_guard();
        scopes::enter(key, root);
        SpanContextGuard {
            key,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for SpanContextGuard {
    #[inline]
    fn drop(&mut self) {
        scopes::exit(self.key);
    }
}

pub(crate) mod active;
#[cfg(all(test, loom))]
mod loom_model;
pub(crate) mod scopes;
#[cfg(test)]
mod tests;
