//! The `opentelemetry_sdk` span processor that marks spans with `pyroscope.profile.id`.

use std::time::Duration;

use opentelemetry::trace::Span as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};

use crate::local_root::is_local_root;

/// The span attribute Grafana looks for to offer "Profiles for this span".
pub const PROFILE_ID_ATTRIBUTE: &str = "pyroscope.profile.id";

/// Which spans get the [`PROFILE_ID_ATTRIBUTE`] attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProfileIdScope {
    /// No span: the processor does nothing.
    None,
    /// Local root spans only: spans whose parent is absent or remote (default). Their ids
    /// are the ones samples are labelled with, so these are the spans whose link finds a
    /// profile.
    #[default]
    LocalRoots,
    /// Every recording span. Only local roots have samples labelled with their own id, so
    /// links from other spans show their local root's profile only if the profile query is
    /// customised; use this when a backend or a custom query wants the attribute everywhere.
    AllSpans,
}

/// Sets `pyroscope.profile.id` (the span id, 16 lowercase hex) on spans as they start.
///
/// It composes with any other processor: add it to the tracer provider beside the
/// exporting one. Processors only run for recording spans, so unsampled spans get nothing.
///
/// ```
/// use opentelemetry::trace::{Tracer, TracerProvider as _};
/// use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
/// use otel_profiling::ProfileIdSpanProcessor;
///
/// let exporter = InMemorySpanExporter::default();
/// let provider = SdkTracerProvider::builder()
///     .with_span_processor(ProfileIdSpanProcessor::default())
///     .with_simple_exporter(exporter.clone())
///     .build();
/// provider.tracer("doc").in_span("GET /report", |_cx| {});
/// let span = &exporter.get_finished_spans().unwrap()[0];
/// let id = span.attributes.iter().find(|kv| kv.key.as_str() == "pyroscope.profile.id").unwrap();
/// assert_eq!(id.value.to_string(), span.span_context.span_id().to_string());
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProfileIdSpanProcessor {
    scope: ProfileIdScope,
}

impl ProfileIdSpanProcessor {
    /// A processor marking the spans in `scope`.
    pub fn new(scope: ProfileIdScope) -> ProfileIdSpanProcessor {
        ProfileIdSpanProcessor { scope }
    }

    /// The scope this processor marks.
    pub fn scope(&self) -> ProfileIdScope {
        self.scope
    }
}

impl SpanProcessor for ProfileIdSpanProcessor {
    fn on_start(&self, span: &mut Span, parent: &Context) {
        mark_profile_id(self.scope, span, parent);
    }

    fn on_end(&self, _span: SpanData) {}

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sets [`PROFILE_ID_ATTRIBUTE`] on `span` if `scope` covers it: the work of
/// [`ProfileIdSpanProcessor`], shared with
/// [`CpuEvidenceProcessor::with_profile_id`](crate::CpuEvidenceProcessor::with_profile_id).
#[inline]
pub(crate) fn mark_profile_id(scope: ProfileIdScope, span: &mut Span, parent: &Context) {
    let local_root = scope == ProfileIdScope::LocalRoots && is_local_root(parent);
    mark_profile_id_known(scope, span, local_root);
}

/// [`mark_profile_id`] when the caller already knows whether `span` is a local root.
#[inline]
pub(crate) fn mark_profile_id_known(scope: ProfileIdScope, span: &mut Span, local_root: bool) {
    let marked = match scope {
        ProfileIdScope::None => false,
        ProfileIdScope::LocalRoots => local_root,
        ProfileIdScope::AllSpans => true,
    };
    if !marked || !span.is_recording() {
        return;
    }
    let id = span.span_context().span_id();
    span.set_attribute(KeyValue::new(
        PROFILE_ID_ATTRIBUTE,
        lower_hex(id.to_bytes()),
    ));
}

/// The 16 lowercase hex digits of a span id, as `SpanId`'s `Display` writes them, without
/// going through the formatter or a UTF-8 check (this runs for every local root span).
fn lower_hex(bytes: [u8; 8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(16);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests;
