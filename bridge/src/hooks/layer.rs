//! The `tracing` layer that keeps each thread's span context equal to the local root of the
//! span it is running.
//!
//! On every enter (every poll of an instrumented future) the layer writes the entered span's
//! local root into the thread's span context record (`SpanContextCell`) and pushes the
//! span onto the thread's scope stack with what was there; on exit it ends that scope.
//! Exits in non-LIFO order are handled by splicing the stack, so a child ending never
//! clears its parent's context. A span is named on the stack by (this layer, span id):
//! ids are only unique within one subscriber.
//!
//! The local root of a span is worked out once, on its first enter, and kept in the span's
//! extensions; its label is also cached on the entering thread (`label_cache`), so the
//! next enter of the span there (the next poll) skips the registry lookup.

use std::sync::OnceLock;

use opentelemetry::trace::TraceContextExt;
use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::subscriber::Interest;
use tracing_core::{Dispatch, Event, Metadata, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::Layer;

use crate::label::Label;
use crate::local_root::{ResolvedRoot, UnsampledTraces};
use crate::span_context::scopes::{self, Owner};
use crate::span_name::SpanName;
use tokio_tasks::{TaskWake, TokioTasks};

/// A [`tracing_subscriber::Layer`] that labels the running thread with the local root span
/// of the entered span, for the CPU sampler.
///
/// It works beside [`tracing_opentelemetry::OpenTelemetryLayer`] in either registration
/// order: it asks that layer for the span's OpenTelemetry context directly instead of
/// relying on what it has made current. Without an OpenTelemetry layer it still labels
/// samples with the root span's name.
///
/// ```
/// use opentelemetry::trace::TracerProvider as _;
/// use opentelemetry_sdk::trace::SdkTracerProvider;
/// use otel_profiling::{current_local_root, ProfileIdSpanProcessor, ProfilingLayer};
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let provider = SdkTracerProvider::builder()
///     .with_span_processor(ProfileIdSpanProcessor::default())
///     .build();
/// let subscriber = tracing_subscriber::registry()
///     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("doc")))
///     .with(ProfilingLayer::default());
///
/// tracing::subscriber::with_default(subscriber, || {
///     let root = tracing::info_span!("GET /report");
///     let _entered = root.enter();
///     let here = current_local_root().expect("inside a span");
///     assert_eq!(&*here.name().unwrap().resolve(), "GET /report");
///     tracing::info_span!("serialize").in_scope(|| {
///         // A child keeps its local root's labels.
///         assert_eq!(current_local_root(), Some(here));
///     });
/// });
/// assert_eq!(current_local_root(), None);
/// ```
#[derive(Debug)]
pub struct ProfilingLayer {
    unsampled: UnsampledTraces,
    dispatch: OnceLock<tracing_core::dispatcher::WeakDispatch>,
    /// Names this layer's spans on the thread's scope stack: span ids are only unique
    /// within one subscriber.
    owner: Owner,
    /// Queued time of tokio tasks, when tokio's own instrumentation is compiled in.
    tokio: TokioTasks,
}

impl Default for ProfilingLayer {
    fn default() -> ProfilingLayer {
        ProfilingLayer {
            unsampled: UnsampledTraces::default(),
            dispatch: OnceLock::new(),
            owner: Owner::unique(),
            tokio: TokioTasks::default(),
        }
    }
}

impl ProfilingLayer {
    /// A layer with the default options.
    pub fn new() -> ProfilingLayer {
        ProfilingLayer::default()
    }

    /// What to label under traces that were not sampled (default: the root's name only).
    pub fn with_unsampled(mut self, unsampled: UnsampledTraces) -> ProfilingLayer {
        self.unsampled = unsampled;
        self
    }

    /// The local root of `span`, worked out on first use and cached in its extensions.
    fn root_of<S>(&self, span: &SpanRef<'_, S>) -> ResolvedRoot
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.with_root(span, ResolvedRoot::clone)
    }

    /// The label of `span`'s local root: the per-enter path, no reference counting.
    fn label_of<S>(&self, span: &SpanRef<'_, S>) -> Option<Label>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.with_root(span, ResolvedRoot::word)
    }

    /// `f` of `span`'s local root, resolved and stored on first use. `f` sees the stored
    /// root, so a caller that only needs its label clones nothing (each clone of a root's
    /// handle is a locked increment, and its drop a locked decrement).
    fn with_root<S, R>(&self, span: &SpanRef<'_, S>, f: impl FnOnce(&ResolvedRoot) -> R) -> R
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        if let Some(RootExt(root)) = span.extensions().get::<RootExt>() {
            return f(root);
        }
        let root = self.resolve(span);
        let mut extensions = span.extensions_mut();
        // Threads entering a new span at once (fan-out) all resolve it: the first stored
        // wins, so they label the same root, and no `insert` of a present value can panic
        // (a panic here would poison the registry slot's extensions lock for good).
        if let Some(RootExt(first)) = extensions.get_mut::<RootExt>() {
            return f(first);
        }
        let out = f(&root);
        extensions.insert(RootExt(root));
        out
    }

    fn resolve<S>(&self, span: &SpanRef<'_, S>) -> ResolvedRoot
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let parent = span.parent().map(|parent| self.root_of(&parent));
        let name = || {
            // Only a span whose callsite has the field can carry an `otel.name` (see
            // `on_new_span` and `on_record`): the others skip the extensions' lock.
            span.metadata()
                .fields()
                .field(OTEL_NAME_FIELD)
                .and_then(|_| span.extensions().get::<OtelName>().map(|n| n.0))
                .unwrap_or_else(|| SpanName::intern_static(span.name()))
        };
        let Some(otel) = self.otel_context(&span.id()) else {
            // No OpenTelemetry layer: only names are known.
            return parent.unwrap_or_else(|| ResolvedRoot::name_only(name()));
        };
        let otel_span = otel.span();
        let span_context = otel_span.span_context();
        if !span_context.is_valid() {
            return parent.unwrap_or_else(|| ResolvedRoot::name_only(name()));
        }
        // The parent's root only if the span stayed in the parent's trace: a span given a
        // remote parent with `set_parent` starts a new local root.
        if let Some(parent) = parent.filter(|p| p.covers(span_context.trace_id())) {
            return parent;
        }
        // A tracing root span opened under a plain-API span wrapped by this crate.
        if let Some(root) = ResolvedRoot::from_context(&otel) {
            return root;
        }
        ResolvedRoot::root(span_context, Some(name()), self.unsampled)
    }

    /// The span's OpenTelemetry context, started if it was not yet, straight from the
    /// OpenTelemetry layer (so registration order does not matter).
    fn otel_context(&self, id: &Id) -> Option<opentelemetry::Context> {
        let dispatch = self.dispatch.get()?.upgrade()?;
        tracing_opentelemetry::get_otel_context(id, &dispatch)
    }
}

/// The cached local root of a span.
struct RootExt(ResolvedRoot);

/// The span's `otel.name` field, which names the OpenTelemetry span instead of the
/// `tracing` span name.
#[derive(Clone, Copy)]
struct OtelName(SpanName);

const OTEL_NAME_FIELD: &str = "otel.name";

struct OtelNameVisitor(Option<SpanName>);

impl Visit for OtelNameVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == OTEL_NAME_FIELD {
            self.0 = Some(SpanName::intern(value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == OTEL_NAME_FIELD {
            self.0 = Some(SpanName::intern(&format!("{value:?}")));
        }
    }
}

impl<S> Layer<S> for ProfilingLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.is_span() {
            crate::span_context::note_span_callsite();
        }
        self.tokio.register(metadata);
        Interest::always()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        crate::span_context::note_span_seen();
        // Its first enter reads the span's close generation: the miss overlaps the rest
        // of the span's making (the other layers' `on_new_span`).
        label_cache::Slot::of(self.owner.raw(), id.into_u64()).prefetch();
        if let Some(wake) = self.tokio.spawned(attrs.metadata()) {
            if let Some(span) = ctx.span(id) {
                // `replace`: a second `ProfilingLayer` in the subscriber must not panic.
                span.extensions_mut().replace(wake);
            }
            return;
        }
        if attrs.metadata().fields().field(OTEL_NAME_FIELD).is_none() {
            return;
        }
        let mut visitor = OtelNameVisitor(None);
        attrs.record(&mut visitor);
        if let (Some(name), Some(span)) = (visitor.0, ctx.span(id)) {
            span.extensions_mut().replace(OtelName(name));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(field) = span.metadata().fields().field(OTEL_NAME_FIELD) else {
            return;
        };
        if !values.contains(&field) {
            return;
        }
        let mut visitor = OtelNameVisitor(None);
        values.record(&mut visitor);
        let Some(name) = visitor.0 else { return };
        let mut extensions = span.extensions_mut();
        // Renaming only matters until the root is resolved (the label is then fixed).
        if extensions.get_mut::<RootExt>().is_none() {
            extensions.replace(OtelName(name));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !self.tokio.events() {
            return;
        }
        let Some(task) = self.tokio.woken_task(event) else {
            return;
        };
        if let Some(span) = ctx.span(&task) {
            if let Some(wake) = span.extensions().get::<TaskWake>() {
                self.tokio.woken(wake);
            }
        }
    }

    // The per-poll path: a thread settled with the sampler, no tokio hand-off, the label
    // in the thread's cache. Everything else is `enter_slow`, which does the whole enter,
    // so this path's only call is the switch, its last instruction (nothing kept across a
    // call: no register to save).
    #[inline]
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if crate::sampler::span_enter_is_settled() && !self.tokio.active() {
            let cached = label_cache::Slot::of(self.owner.raw(), id.into_u64());
            if let Some(root) = cached.get() {
                scopes::enter(self.owner.key(id.into_u64()), root);
                return;
            }
        }
        self.enter_slow(id, ctx);
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        label_cache::Slot::of(self.owner.raw(), id.into_u64()).closed();
    }

    // As `on_enter`: the tokio hand-off is out of line, and the usual exit's only call is
    // the switch.
    #[inline]
    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if self.tokio.active() {
            return self.exit_tokio(id, ctx);
        }
        scopes::exit(self.owner.key(id.into_u64()));
    }
}

impl ProfilingLayer {
    /// [`Layer::on_enter`] off its usual path: registers the thread with the sampler if it
    /// must, resolves the span's root on a cache miss, hands tokio's queued time over.
    #[inline(never)]
    fn enter_slow<S>(&self, id: &Id, ctx: Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        crate::sampler::on_span_enter();
        let owner = self.owner.raw();
        let key = self.owner.key(id.into_u64());
        let cached = label_cache::Slot::of(owner, id.into_u64());
        let tokio = self.tokio.active();
        let root = match cached.get() {
            Some(root) => root,
            None => {
                let generation = cached.generation();
                let Some(span) = ctx.span(id) else { return };
                let root = self.label_of(&span);
                if tokio {
                    if let Some(wake) = span.extensions().get::<TaskWake>() {
                        // A task span's enter opens a poll (and reads its wake stamp):
                        // never served from the cache, never handed queued time itself.
                        self.tokio.task_entered(owner, id, wake);
                        scopes::enter(key, root);
                        return;
                    }
                }
                cached.fill(generation, root);
                root
            }
        };
        if let (true, Some(root)) = (tokio, &root) {
            self.tokio.root_entered(owner, root.cpu_raw());
        }
        scopes::enter(key, root);
    }

    /// [`Layer::on_exit`] while tokio's instrumentation is compiled in.
    #[inline(never)]
    fn exit_tokio<S>(&self, id: &Id, ctx: Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        self.tokio.exited(self.owner.raw(), id, || {
            ctx.span(id)
                .is_some_and(|span| span.extensions().get::<TaskWake>().is_some())
        });
        scopes::exit(self.owner.key(id.into_u64()));
    }
}

mod label_cache;
#[cfg(test)]
mod tests;
mod tokio_tasks;
