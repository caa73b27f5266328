//! Deciding which span is the local root of a span, and what of it to label.
//!
//! A local root is a span whose parent is absent or remote: the entry point of this process
//! into a trace. All samples taken under it (and under its local children) carry its ids,
//! which is what Grafana's "Profiles for this span" link selects.

use opentelemetry::trace::{SpanContext, TraceContextExt, TraceId};
use opentelemetry::Context;

use std::sync::Arc;

use crate::evidence;
use crate::label::{Label, LabelOwner, LocalRoot, RootLabel};
use crate::span_context::note_span_seen;
use crate::span_name::SpanName;

/// What to label for spans of traces that were not sampled.
///
/// An unsampled span is never exported, so its id would point at nothing. Dropping its
/// samples entirely would bias per-endpoint CPU by the sampling rate (at 1 % trace sampling,
/// 99 % of the CPU would lose its endpoint). The default therefore keeps the root span's
/// name (the `span_name` label) and leaves out its span and trace ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnsampledTraces {
    /// Label samples with the root span's name only (default).
    #[default]
    KeepName,
    /// Label nothing: samples under unsampled traces look like samples outside any span.
    Ignore,
}

/// The local root a span belongs to: the trace it is in and the label its samples get.
/// The label's handle owns its slot and (for sampled roots, while a sampler and an
/// evidence processor run) the root's CPU counters: both live as long as any span or
/// context of the root does (the label names the counters by slot and generation, not by
/// address).
#[derive(Clone, Debug)]
pub(crate) struct ResolvedRoot {
    trace_id: TraceId,
    label: Option<LocalRoot>,
}

impl PartialEq for ResolvedRoot {
    fn eq(&self, other: &Self) -> bool {
        self.trace_id == other.trace_id && self.label == other.label
    }
}

impl ResolvedRoot {
    /// `span` (with `name`) is a local root.
    pub(crate) fn root(
        span: &SpanContext,
        name: Option<SpanName>,
        unsampled: UnsampledTraces,
    ) -> ResolvedRoot {
        let label = if span.is_sampled() {
            note_span_seen();
            let label = RootLabel::new(span.span_id(), span.trace_id(), name)
                .with_trace_flags(span.trace_flags());
            Some(match evidence::counters_of(span.span_id()) {
                Some(cpu) => {
                    let handle = cpu.handle();
                    let root =
                        LocalRoot::claim(label.with_cpu(handle), Some(cpu as Arc<dyn LabelOwner>));
                    // Resolved on its first enter, here: the thread's stretch keeps the
                    // counters for that poll's exit.
                    if let Some(word) = root.word() {
                        crate::span_context::active::keep_counters(word, handle.to_raw());
                    }
                    root
                }
                None => LocalRoot::claim(label, None),
            })
        } else {
            match (unsampled, name) {
                (UnsampledTraces::KeepName, Some(name)) => Some(LocalRoot::name_only(name)),
                _ => None,
            }
        };
        ResolvedRoot {
            trace_id: span.trace_id(),
            label,
        }
    }

    /// A root known only by name, for spans with no OpenTelemetry data at all.
    pub(crate) fn name_only(name: SpanName) -> ResolvedRoot {
        ResolvedRoot {
            trace_id: TraceId::INVALID,
            label: Some(LocalRoot::name_only(name)),
        }
    }

    /// Whether a span in `trace_id` can belong to this root (same trace).
    pub(crate) fn covers(&self, trace_id: TraceId) -> bool {
        self.trace_id == trace_id
    }

    /// What samples under this root are labelled with.
    pub(crate) fn label(&self) -> Option<&LocalRoot> {
        self.label.as_ref()
    }

    /// The word a thread's record holds while this root runs.
    pub(crate) fn word(&self) -> Option<Label> {
        self.label.as_ref().and_then(LocalRoot::word)
    }

    /// The root recorded in `cx` by this crate, if it belongs to the span active in `cx`.
    pub(crate) fn from_context(cx: &Context) -> Option<ResolvedRoot> {
        let marker = cx.get::<ResolvedRoot>()?;
        let span = cx.span();
        let trace_id = span.span_context().trace_id();
        marker.covers(trace_id).then(|| marker.clone())
    }
}

/// Whether a span whose parent context is `parent` is a local root (the rule every
/// OpenTelemetry profiling bridge uses: parent absent or remote).
pub(crate) fn is_local_root(parent: &Context) -> bool {
    let span = parent.span();
    let parent = span.span_context();
    !parent.is_valid() || parent.is_remote()
}
