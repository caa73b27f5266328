//! Following spans of the plain OpenTelemetry API (no `tracing`): a future wrapper and a
//! closure helper that set the thread's span context on every poll / call.
//!
//! A [`ProfilingContext`] is an OpenTelemetry [`Context`] plus the local root its span
//! belongs to. The root is recorded as a value inside the context, so contexts derived
//! from it (`cx.with_span(child)`, or `Context::current()` inside a scope it attached)
//! inherit the root without any shared table.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;

use crate::local_root::{ResolvedRoot, UnsampledTraces};
use crate::span_context::{LocalRoot, SpanContextGuard};
use crate::span_name::SpanName;

mod wake_stamp;
use wake_stamp::WakeStamp;

/// An OpenTelemetry [`Context`] together with the local root span its samples are
/// labelled with.
///
/// The local root is, in order: the root already recorded in `cx` by this crate (when `cx`
/// derives from a `ProfilingContext`'s context and is in the same trace), else the span
/// active in `cx` itself. A context with no local span (none, or only a remote parent)
/// labels nothing.
///
/// ```
/// use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
/// use opentelemetry::Context;
/// use opentelemetry_sdk::trace::SdkTracerProvider;
/// use otel_profiling::{current_local_root, ProfilingContext};
///
/// let provider = SdkTracerProvider::builder().build();
/// let tracer = provider.tracer("doc");
/// let root_span = tracer.start("GET /report");
/// let root_id = root_span.span_context().span_id();
/// let pcx = ProfilingContext::new(Context::current_with_span(root_span), "GET /report");
///
/// pcx.in_scope(|| {
///     assert_eq!(current_local_root().unwrap().span_id(), Some(root_id));
///     // A child started inside the scope inherits the root.
///     let child = ProfilingContext::inherit(Context::current_with_span(tracer.start("db")));
///     child.in_scope(|| assert_eq!(current_local_root().unwrap().span_id(), Some(root_id)));
/// });
/// assert_eq!(current_local_root(), None);
/// ```
#[derive(Clone, Debug)]
pub struct ProfilingContext {
    cx: Context,
    label: Option<LocalRoot>,
}

impl ProfilingContext {
    /// Wraps `cx`; if its span is a local root, `root_name` is its `span_name` label.
    pub fn new(cx: Context, root_name: &str) -> ProfilingContext {
        ProfilingContext::with_options(cx, Some(root_name), UnsampledTraces::default())
    }

    /// Wraps `cx`, whose root was already recorded by an enclosing `ProfilingContext`
    /// (the usual case for child spans). If none was, the span of `cx` is the root, with no
    /// name.
    pub fn inherit(cx: Context) -> ProfilingContext {
        ProfilingContext::with_options(cx, None, UnsampledTraces::default())
    }

    /// Wraps `cx`, choosing what unsampled traces are labelled with.
    pub fn with_options(
        cx: Context,
        root_name: Option<&str>,
        unsampled: UnsampledTraces,
    ) -> ProfilingContext {
        let root = {
            let span = cx.span();
            let span_context = span.span_context();
            if !span_context.is_valid() || span_context.is_remote() {
                None
            } else {
                Some(ResolvedRoot::from_context(&cx).unwrap_or_else(|| {
                    ResolvedRoot::root(span_context, root_name.map(SpanName::intern), unsampled)
                }))
            }
        };
        match root {
            None => ProfilingContext { cx, label: None },
            Some(root) => {
                let label = root.label().cloned();
                let cx = if cx.get::<ResolvedRoot>() == Some(&root) {
                    cx
                } else {
                    cx.with_value(root)
                };
                ProfilingContext { cx, label }
            }
        }
    }

    /// The OpenTelemetry context (with the root recorded in it).
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// The label samples taken in this context carry.
    pub fn local_root(&self) -> Option<LocalRoot> {
        self.label.clone()
    }

    /// Runs `f` with this context current: both the OpenTelemetry context
    /// (`Context::current()`) and the thread's span context, restored afterwards.
    pub fn in_scope<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::sampler::on_span_enter();
        let _otel = self.cx.clone().attach();
        let _profiling = SpanContextGuard::enter(self.label.as_ref());
        f()
    }

    /// Wraps `future` so that every poll runs in this context.
    pub fn instrument<F: Future>(self, future: F) -> ProfiledFuture<F> {
        ProfiledFuture {
            inner: future,
            scope: self,
            wake: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// A future that runs every poll in a [`ProfilingContext`]: the OpenTelemetry context
    /// is attached and the thread's span context set for the poll, then both are restored,
    /// so the labels follow the task across worker threads and interleavings.
    ///
    /// Use it in place of `opentelemetry::trace::FutureExt::with_context`.
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct ProfiledFuture<F> {
        #[pin]
        inner: F,
        scope: ProfilingContext,
        // Measures the future's queued time (woken, not yet polled) when its root has
        // counters; made on the first such poll, once per future.
        wake: Option<Arc<WakeStamp>>,
    }
}

impl<F: Future> Future for ProfiledFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, task: &mut TaskContext<'_>) -> Poll<F::Output> {
        let this = self.project();
        let (inner, scope, wake) = (this.inner, &*this.scope, this.wake);
        let cpu = scope.label.as_ref().map_or(0, |root| root.cpu_raw());
        // Queued time is the root's: measured by the outermost wrapper of the root only (a
        // nested one is polled inside it, and its wakes are the same wakes).
        if cpu == 0
            || crate::span_context::current_word() == scope.label.as_ref().and_then(LocalRoot::word)
        {
            return scope.in_scope(|| inner.poll(task));
        }
        let stamp = wake.get_or_insert_with(|| WakeStamp::new(cpu));
        let waker = stamp.before_poll(cpu, task.waker());
        let mut own = TaskContext::from_waker(&waker);
        scope.in_scope(|| inner.poll(&mut own))
    }
}

/// Wrapping futures in a [`ProfilingContext`].
pub trait ProfilingFutureExt: Future + Sized {
    /// Runs every poll of this future in `cx`.
    fn with_profiling_context(self, cx: ProfilingContext) -> ProfiledFuture<Self> {
        cx.instrument(self)
    }
}

impl<F: Future> ProfilingFutureExt for F {}
