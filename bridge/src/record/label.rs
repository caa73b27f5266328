//! What a sample is labelled with, and the handle that keeps it readable.
//!
//! * [`RootLabel`]: the label's value — the local root's span id, trace id, name, W3C
//!   flags and CPU counters. `Copy`; what samples and blocked-in-poll records carry, and
//!   what [`current_local_root`](crate::current_local_root) returns.
//! * [`Label`] (crate-internal): one 64-bit word naming the slot where a live root's
//!   value was written once, when the root was resolved ([`table`]). A span switch
//!   publishes the word and nothing else; the signal handler, the watchdog and the OTEP
//!   4947 writer follow it to the slot and check its generation.
//! * [`LocalRoot`]: the public handle. It owns its slot (a clone shares it; the last drop
//!   releases it), carries a copy of the value for its accessors, and is what
//!   [`SpanContextGuard::enter`](crate::SpanContextGuard::enter) takes.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;
use std::ops::Deref;
use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceFlags, TraceId};

use crate::root_cpu::CpuHandle;
use crate::span_name::{SpanName, MAX_SPAN_NAMES};

pub(crate) mod table;

pub(crate) use table::CPU_BIT;
pub(crate) use table::{generation, slot_index, LABELS};

/// The local root span a sample is labelled with: what the profiler reads at the moment
/// a sample is taken.
///
/// For a sampled trace it carries the root's span id, trace id and W3C trace flags; for an
/// unsampled trace (see [`UnsampledTraces`](crate::UnsampledTraces)) only the root's name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RootLabel {
    pub(crate) span_id: u64,
    pub(crate) trace_id: u128,
    pub(crate) name: Option<SpanName>,
    /// The root span's W3C trace flags byte (sampled 0x01, random 0x02, …), as the
    /// OpenTelemetry thread context publishes it.
    pub(crate) flags: u8,
    /// The root's CPU counters, as a packed [`CpuHandle`] (0: none): a slot index and
    /// 64-bit generation the signal handler checks, never an address (see `root_cpu`).
    pub(crate) cpu: u128,
}

impl RootLabel {
    /// A label with ids (a sampled trace), with the trace flags [`TraceFlags::SAMPLED`].
    /// Invalid (all-zero) ids count as absent.
    pub fn new(span_id: SpanId, trace_id: TraceId, name: Option<SpanName>) -> RootLabel {
        RootLabel {
            span_id: u64::from_be_bytes(span_id.to_bytes()),
            trace_id: u128::from_be_bytes(trace_id.to_bytes()),
            name,
            flags: TraceFlags::SAMPLED.to_u8(),
            cpu: 0,
        }
    }

    /// A label known only by name (an unsampled trace).
    pub fn name_only(name: SpanName) -> RootLabel {
        RootLabel {
            span_id: 0,
            trace_id: 0,
            name: Some(name),
            flags: 0,
            cpu: 0,
        }
    }

    /// The same label with the W3C trace flags of its span context.
    pub fn with_trace_flags(mut self, flags: TraceFlags) -> RootLabel {
        self.flags = flags.to_u8();
        self
    }

    /// The same label, with samples under it counted into `cpu`.
    pub(crate) fn with_cpu(mut self, cpu: CpuHandle) -> RootLabel {
        self.cpu = cpu.to_raw();
        self
    }

    /// The root's counters as the signal handler passes them to `root_cpu::record`.
    #[inline]
    pub(crate) fn cpu_raw(&self) -> u128 {
        self.cpu
    }

    /// The root span's W3C trace flags (`00` for a root known only by name).
    pub fn trace_flags(&self) -> TraceFlags {
        TraceFlags::new(self.flags)
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
}

/// One word naming a live root's label slot (see [`table`]): what the per-thread record
/// holds and a span switch writes. `Copy` and never an address: a word that outlives its
/// root reads as "no label".
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Label(NonZeroU64);

impl Label {
    /// The word `word` (0 is "none").
    #[inline]
    pub(crate) fn from_raw(word: u64) -> Option<Label> {
        NonZeroU64::new(word).map(Label)
    }

    /// A word the table built (never 0: the generation is odd).
    #[inline]
    fn from_word(word: u64) -> Label {
        Label(NonZeroU64::new(word).unwrap_or(NonZeroU64::MIN))
    }

    /// The word.
    #[inline]
    pub(crate) fn word(self) -> u64 {
        self.0.get()
    }

    /// Whether the root has CPU counters (read from the word, not the slot).
    #[inline]
    pub(crate) fn has_cpu(self) -> bool {
        self.0.get() & CPU_BIT != 0
    }

    /// The label's value, if its root still owns the slot. Loads only: async-signal-safe.
    #[inline]
    pub(crate) fn read(self) -> Option<RootLabel> {
        LABELS.read(self)
    }

    /// The root's packed CPU counters (0: none, or the root ended).
    #[inline]
    pub(crate) fn cpu_raw(self) -> u128 {
        if !self.has_cpu() {
            return 0;
        }
        self.read().map_or(0, |label| label.cpu)
    }
}

/// The packed word of an optional label (0: none), as the per-thread record stores it.
#[inline]
pub(crate) fn word_of(label: Option<Label>) -> u64 {
    label.map_or(0, Label::word)
}

/// What a root's handles share: it releases the root's label slot when the last of them
/// (and anything else holding it) is dropped.
pub(crate) trait LabelOwner: Send + Sync {
    /// Takes `label` to release when dropped. False if it already holds one (a root
    /// resolved by two threads at once claims two slots): the caller then wraps it.
    fn adopt(&self, label: Label) -> bool;

    /// A root's handle lets go of its owner (`self` may be the last reference, or not):
    /// an owner may keep its allocation for a later root instead of freeing it. The
    /// default drops it.
    fn let_go(self: Arc<Self>) {}
}

/// Releases `label`'s slot (for a [`LabelOwner`] that adopted it, as it is dropped).
pub(crate) fn release_slot(label: Label) {
    LABELS.release(label);
}

/// Releases the slot when the last handle of a root that owns one is dropped, for roots
/// without an owner of their own (built by hand, or a second slot for one root).
struct SlotOwner {
    label: Label,
    /// Whatever else must live exactly as long as the label.
    _keep: Option<Arc<dyn LabelOwner>>,
}

impl LabelOwner for SlotOwner {
    fn adopt(&self, _: Label) -> bool {
        false
    }
}

impl Drop for SlotOwner {
    fn drop(&mut self) {
        LABELS.release(self.label);
    }
}

/// A local root span, as the profiler labels the samples taken while it runs: a handle to
/// its label, written once into a slot that the signal handler reads at sample time.
///
/// Clones share the slot; the last one dropped releases it, after which entering a
/// [`SpanContextGuard`](crate::SpanContextGuard) with a word of it still on a thread's
/// scope stack labels nothing (never another root's label). A root known only by name
/// ([`LocalRoot::name_only`]) uses one slot per name for the life of the process.
///
/// It dereferences to its [`RootLabel`] value (ids, name, flags).
///
/// ```
/// use opentelemetry::trace::{SpanId, TraceId};
/// use otel_profiling::{current_local_root, LocalRoot, SpanContextGuard};
///
/// let root = LocalRoot::new(SpanId::from(7), TraceId::from(9), None);
/// assert_eq!(root.span_id(), Some(SpanId::from(7)));
/// {
///     let _guard = SpanContextGuard::enter(Some(&root));
///     assert_eq!(current_local_root(), Some(*root));
/// }
/// assert_eq!(current_local_root(), None);
/// ```
#[derive(Clone)]
pub struct LocalRoot {
    value: RootLabel,
    label: Option<Label>,
    _owner: Option<Arc<dyn LabelOwner>>,
}

impl LocalRoot {
    /// A root with ids (a sampled trace), with the trace flags [`TraceFlags::SAMPLED`]
    /// (`01`); give it its span's own flags with [`with_trace_flags`](Self::with_trace_flags).
    /// Invalid (all-zero) ids count as absent. Claims a label slot, released with the
    /// last clone.
    pub fn new(span_id: SpanId, trace_id: TraceId, name: Option<SpanName>) -> LocalRoot {
        crate::span_context::note_span_seen();
        LocalRoot::claim(RootLabel::new(span_id, trace_id, name), None)
    }

    /// A root known only by name (an unsampled trace). Every root of one name shares one
    /// slot, claimed the first time and kept for the life of the process (names are
    /// interned and bounded by [`MAX_SPAN_NAMES`]).
    pub fn name_only(name: SpanName) -> LocalRoot {
        crate::span_context::note_span_seen();
        use std::sync::atomic::{AtomicU64, Ordering::AcqRel, Ordering::Acquire};
        // The word of each name's slot (0: not claimed yet).
        static BY_NAME: [AtomicU64; MAX_SPAN_NAMES + 2] =
            [const { AtomicU64::new(0) }; MAX_SPAN_NAMES + 2];
        let value = RootLabel::name_only(name);
        let Some(cell) = BY_NAME.get(name.to_raw() as usize) else {
            return LocalRoot::claim(value, None);
        };
        let mut word = cell.load(Acquire);
        if word == 0 {
            let Some(claimed) = LABELS.claim(&value) else {
                return LocalRoot {
                    value,
                    label: None,
                    _owner: None,
                };
            };
            word = match cell.compare_exchange(0, claimed.word(), AcqRel, Acquire) {
                Ok(_) => claimed.word(),
                Err(theirs) => {
                    LABELS.release(claimed);
                    theirs
                }
            };
        }
        LocalRoot {
            value,
            label: Label::from_raw(word),
            _owner: None,
        }
    }

    /// Claims a slot for `value`. `keep` lives as long as the root's handles: when it
    /// adopts the slot (the root's CPU counters do, see `hooks::evidence`), it is the
    /// handles' one shared allocation; otherwise a [`SlotOwner`] holds both.
    pub(crate) fn claim(value: RootLabel, keep: Option<Arc<dyn LabelOwner>>) -> LocalRoot {
        let label = LABELS.claim(&value);
        let owner: Option<Arc<dyn LabelOwner>> = match (label, keep) {
            (None, _) => None,
            (Some(label), Some(keep)) if keep.adopt(label) => Some(keep),
            (Some(label), keep) => Some(Arc::new(SlotOwner { label, _keep: keep })),
        };
        LocalRoot {
            value,
            label,
            _owner: owner,
        }
    }

    /// The same root with the W3C trace flags of its span context (`span_context.
    /// trace_flags()`: sampled, and the random-trace-id bit `02` when the context has it).
    /// The crate's own roots carry them; the OpenTelemetry thread context publishes them.
    /// Set them before entering the root: clones share the slot, and a thread whose OTEP
    /// 4947 record already holds the root keeps the old byte until it enters another one.
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
        self.value.flags = flags.to_u8();
        // A name-only root's slot is shared by every root of its name (whose flags are
        // not published without ids): only an owned slot is written.
        if let (Some(label), Some(_)) = (self.label, &self._owner) {
            LABELS.set_flags(label, self.value.flags);
        }
        self
    }

    /// The label's value (what samples under the root carry).
    pub fn label(&self) -> RootLabel {
        self.value
    }

    /// The word the per-thread record holds while this root runs (`None`: no slot could
    /// be had, samples under it are unlabelled).
    #[inline]
    pub(crate) fn word(&self) -> Option<Label> {
        self.label
    }
}

impl Drop for LocalRoot {
    fn drop(&mut self) {
        if let Some(owner) = self._owner.take() {
            owner.let_go();
        }
    }
}

impl Deref for LocalRoot {
    type Target = RootLabel;

    fn deref(&self) -> &RootLabel {
        &self.value
    }
}

impl PartialEq for LocalRoot {
    /// Same label value (two roots built from the same ids are equal, whatever their slots).
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Eq for LocalRoot {}

impl Hash for LocalRoot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl fmt::Debug for LocalRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalRoot")
            .field("span_id", &self.value.span_id())
            .field("trace_id", &self.value.trace_id())
            .field("name", &self.value.name())
            .field("trace_flags", &self.value.trace_flags())
            .finish()
    }
}

/// Roots that got no label slot (the table at its cap): their samples carry no labels.
pub(crate) fn unlabelled_roots() -> u64 {
    LABELS.exhausted()
}

#[cfg(test)]
mod tests;
