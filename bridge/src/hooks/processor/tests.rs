use super::*;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
    TracerProvider as _,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler, SdkTracerProvider};

fn provider(scope: ProfileIdScope, sampler: Sampler) -> (SdkTracerProvider, InMemorySpanExporter) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_span_processor(ProfileIdSpanProcessor::new(scope))
        .with_simple_exporter(exporter.clone())
        .build();
    (provider, exporter)
}

fn profile_id(span: &SpanData) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == PROFILE_ID_ATTRIBUTE)
        .map(|kv| kv.value.to_string())
}

fn by_name<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("span {name} not exported"))
}

fn run_root_child_grandchild(provider: &SdkTracerProvider) {
    let tracer = provider.tracer("test");
    tracer.in_span("root", |_| {
        tracer.in_span("child", |_| tracer.in_span("grandchild", |_| {}));
    });
}

#[test]
fn local_roots_get_their_own_id_children_get_nothing() {
    let (provider, exporter) = provider(ProfileIdScope::default(), Sampler::AlwaysOn);
    run_root_child_grandchild(&provider);
    let spans = exporter.get_finished_spans().expect("spans");
    let root = by_name(&spans, "root");
    let id = profile_id(root).expect("root carries the attribute");
    assert_eq!(id.len(), 16);
    assert!(id
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(
        id,
        format!(
            "{:016x}",
            u64::from_be_bytes(root.span_context.span_id().to_bytes())
        )
    );
    assert_eq!(profile_id(by_name(&spans, "child")), None);
    assert_eq!(profile_id(by_name(&spans, "grandchild")), None);
}

#[test]
fn span_with_remote_parent_is_a_local_root() {
    let (provider, exporter) = provider(ProfileIdScope::LocalRoots, Sampler::AlwaysOn);
    let remote = SpanContext::new(
        TraceId::from(0x1234_u128),
        SpanId::from(0x99_u64),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let parent = opentelemetry::Context::new().with_remote_span_context(remote);
    let tracer = provider.tracer("test");
    let span = tracer.start_with_context("server", &parent);
    let cx = parent.with_span(span);
    tracer.start_with_context("inner", &cx);
    drop(cx);
    let spans = exporter.get_finished_spans().expect("spans");
    let server = by_name(&spans, "server");
    assert_eq!(server.parent_span_id, SpanId::from(0x99_u64));
    assert_eq!(
        profile_id(server),
        Some(server.span_context.span_id().to_string())
    );
    assert_eq!(profile_id(by_name(&spans, "inner")), None);
}

#[test]
fn all_spans_scope_marks_every_span_with_its_own_id() {
    let (provider, exporter) = provider(ProfileIdScope::AllSpans, Sampler::AlwaysOn);
    run_root_child_grandchild(&provider);
    let spans = exporter.get_finished_spans().expect("spans");
    assert_eq!(spans.len(), 3);
    for span in &spans {
        assert_eq!(
            profile_id(span),
            Some(span.span_context.span_id().to_string())
        );
    }
}

#[test]
fn none_scope_marks_nothing() {
    let (provider, exporter) = provider(ProfileIdScope::None, Sampler::AlwaysOn);
    run_root_child_grandchild(&provider);
    let spans = exporter.get_finished_spans().expect("spans");
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(|s| profile_id(s).is_none()));
}

/// Records, from inside the pipeline, whether any span reached processors carrying the
/// attribute, so non-recording spans can be checked even though nothing exports them.
#[derive(Debug, Default, Clone)]
struct Probe(std::sync::Arc<std::sync::Mutex<Vec<Seen>>>);

/// (recording, profile id attribute) of one span as it started.
type Seen = (bool, Option<String>);

impl SpanProcessor for Probe {
    fn on_start(&self, span: &mut Span, _cx: &Context) {
        let data = span.exported_data();
        let id = data.as_ref().and_then(profile_id);
        self.0
            .lock()
            .expect("probe")
            .push((span.is_recording(), id));
    }
    fn on_end(&self, _span: SpanData) {}
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

#[test]
fn non_recording_spans_carry_nothing() {
    let exporter = InMemorySpanExporter::default();
    let probe = Probe::default();
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_span_processor(ProfileIdSpanProcessor::new(ProfileIdScope::AllSpans))
        .with_span_processor(probe.clone())
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("test");
    // A remote parent that was not sampled makes the local span non-recording.
    let remote = SpanContext::new(
        TraceId::from(7_u128),
        SpanId::from(8_u64),
        TraceFlags::default(),
        true,
        TraceState::default(),
    );
    let parent = opentelemetry::Context::new().with_remote_span_context(remote);
    let span = tracer.start_with_context("unsampled", &parent);
    assert!(!opentelemetry::trace::Span::is_recording(&span));
    drop(span);
    // A sampled one in the same pipeline is marked, proving the probe sees the attribute.
    tracer.in_span("sampled", |_| {});
    let seen = probe.0.lock().expect("probe").clone();
    assert_eq!(
        seen.len(),
        1,
        "only the recording span reaches processors: {seen:?}"
    );
    assert!(seen[0].0 && seen[0].1.is_some());
    let spans = exporter.get_finished_spans().expect("spans");
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].name, "sampled");
}

#[test]
fn lower_hex_is_span_id_display() {
    for id in [
        0_u64,
        1,
        0x00ab_cdef_0123_4567,
        u64::MAX,
        0x8000_0000_0000_000f,
    ] {
        let span_id = SpanId::from(id);
        assert_eq!(super::lower_hex(span_id.to_bytes()), span_id.to_string());
    }
}

/// The evidence processor marks spans itself only when asked, exactly as this processor
/// would: once per local root, never on children.
#[test]
fn evidence_processor_marks_local_roots_once_when_asked() {
    use crate::CpuEvidenceProcessor;
    use opentelemetry_sdk::trace::SimpleSpanProcessor;
    for (scope, expect_root) in [(None, false), (Some(ProfileIdScope::LocalRoots), true)] {
        let exporter = InMemorySpanExporter::default();
        let evidence = CpuEvidenceProcessor::new(SimpleSpanProcessor::new(exporter.clone()));
        let evidence = match scope {
            Some(scope) => evidence.with_profile_id(scope),
            None => evidence,
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(evidence)
            .build();
        let tracer = provider.tracer("test");
        tracer.in_span("root", |_| tracer.in_span("child", |_| {}));
        for span in exporter.get_finished_spans().expect("spans") {
            let ids: Vec<_> = span
                .attributes
                .iter()
                .filter(|kv| kv.key.as_str() == PROFILE_ID_ATTRIBUTE)
                .map(|kv| kv.value.to_string())
                .collect();
            let expected = if span.name == "root" && expect_root {
                vec![span.span_context.span_id().to_string()]
            } else {
                vec![]
            };
            assert_eq!(ids, expected, "{} with {scope:?}", span.name);
        }
    }
}
