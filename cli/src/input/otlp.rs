//! `*_spans.jsonl` files: one OTLP JSON `ExportTraceServiceRequest` per line.
//!
//! Only the fields the report needs are read; everything else is ignored. Integers are
//! accepted as JSON strings (what OTLP JSON writes for 64-bit values) or numbers, ids as
//! hex in either case.

use std::borrow::Cow;
use std::path::Path;

use otel_profiling::{
    ALLOC_BYTES_ATTRIBUTE, ALLOC_COUNT_ATTRIBUTE, CGROUP_CPU_LIMIT_ATTRIBUTE,
    CGROUP_THROTTLED_ATTRIBUTE, CPU_SAMPLES_ATTRIBUTE, CPU_TIME_ATTRIBUTE,
    EVIDENCE_MISSING_ATTRIBUTE, PROFILE_ID_ATTRIBUTE, WALL_ACTIVE_ATTRIBUTE, WALL_QUEUED_ATTRIBUTE,
    WALL_RUNQUEUE_ATTRIBUTE,
};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ReportError;
use crate::ids::{SpanId, TraceId};

/// The resource attribute holding the service version.
pub const SERVICE_VERSION_ATTRIBUTE: &str = "service.version";

/// The span attribute holding an HTTP server span's route template (`/items/{id}`).
pub const HTTP_ROUTE_ATTRIBUTE: &str = "http.route";
/// The HTTP method of the current semantic conventions, then of the older ones.
pub const HTTP_METHOD_ATTRIBUTES: [&str; 2] = ["http.request.method", "http.method"];
/// Nanoseconds the span was entered (polled), as `tracing-opentelemetry` writes it on every
/// span it exports; per span only, on whichever thread entered it.
pub const BUSY_NS_ATTRIBUTE: &str = "busy_ns";

/// The module a span was made in: the current convention's key, then the older one.
pub const CODE_MODULE_ATTRIBUTES: [&str; 2] = ["code.module.name", "code.namespace"];

/// `SpanFlags`: the `parent_is_remote` bit is set meaningfully.
const FLAG_HAS_IS_REMOTE: u64 = 0x100;
/// `SpanFlags`: the parent span context was received from another process.
const FLAG_IS_REMOTE: u64 = 0x200;

/// A span as the report needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Trace id.
    pub trace_id: TraceId,
    /// Span id.
    pub span_id: SpanId,
    /// Parent span id, `None` for a trace root.
    pub parent_span_id: Option<SpanId>,
    /// The span's flags say its parent is in another process.
    pub parent_is_remote: bool,
    /// Span name.
    pub name: String,
    /// Start time, nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// End time, nanoseconds since the Unix epoch.
    pub end_unix_nano: u64,
    /// The resource's `service.version`, when it has one.
    pub service_version: Option<String>,
    /// `pyroscope.profile.id` (lowercase), set on profiled local roots.
    pub profile_id: Option<String>,
    /// `profiling.cpu.samples`, when the span carries CPU evidence.
    pub cpu_samples: Option<u64>,
    /// `profiling.cpu.time_ns`, when the span carries CPU evidence.
    pub cpu_time_ns: Option<u64>,
    /// `http.route`, when the span carries one.
    pub http_route: Option<String>,
    /// `http.request.method` (or the older `http.method`), when the span carries one.
    pub http_method: Option<String>,
    /// `profiling.wall.active_ns` (the bridge's wall time of threads inside the local root,
    /// over all its threads), when the span carries it.
    pub wall_active_ns: Option<u64>,
    /// `profiling.wall.queued_ns` (time the root's futures were woken but not yet polled,
    /// where a wrapper measured it), when the span carries it.
    pub wall_queued_ns: Option<u64>,
    /// [`WALL_RUNQUEUE_ATTRIBUTE`]: runnable but not running inside the root, when the span
    /// carries it.
    pub wall_runqueue_ns: Option<u64>,
    /// `profiling.cgroup.throttled_ns`: the container's CPU-quota throttling while the root
    /// ran, when the span carries it.
    pub cgroup_throttled_ns: Option<u64>,
    /// `profiling.cgroup.cpu_limit`: the container's CPU limit, in thousandths of a CPU,
    /// when the span carries it.
    pub cgroup_cpu_limit_millicpus: Option<u64>,
    /// [`BUSY_NS_ATTRIBUTE`], when the span carries it.
    pub busy_ns: Option<u64>,
    /// The module the span was made in: `code.module.name` (or the older
    /// `code.namespace`), which `tracing-opentelemetry` sets from the callsite's module
    /// path (`svc::catalog`), when the span carries it.
    pub code_module: Option<String>,
    /// Why the bridge kept no evidence for this root, when it says
    /// (`profiling.evidence.missing`: `not_followed`, `no_sampler`, `root_cap`).
    pub evidence_missing: Option<String>,
    /// `profiling.alloc.bytes` (estimated bytes allocated under the root), when the bridge
    /// sampled allocations.
    pub alloc_bytes: Option<u64>,
    /// `profiling.alloc.count` (estimated allocations), likewise.
    pub alloc_count: Option<u64>,
}

impl Span {
    /// Wall time: end − start (0 if the end is before the start).
    pub fn wall_ns(&self) -> u64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano)
    }

    /// The name the report groups by: `{method} {route}` for a span with `http.route` and
    /// a method (so servers whose spans are all named e.g. `request` get one row per
    /// endpoint), else the span name (a span with a route but no method attribute is
    /// usually named `{method} {route}` by hand already).
    pub fn report_name(&self) -> Cow<'_, str> {
        let Some(route) = self.http_route.as_deref() else {
            return Cow::Borrowed(&self.name);
        };
        match self.http_method.as_deref() {
            // The conventions' placeholder for a non-standard method, named `HTTP`.
            Some("_OTHER") => Cow::Owned(format!("HTTP {route}")),
            Some(method) => Cow::Owned(format!("{method} {route}")),
            None => Cow::Borrowed(&self.name),
        }
    }

    /// Whether `name` selects this span: its [`report_name`](Self::report_name) or its
    /// span name.
    pub fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.report_name() == name
    }
}

/// A local root span for unit tests: span and trace id `id`, no version, a profile id,
/// no attributes but its times.
#[cfg(test)]
impl Span {
    pub(crate) fn test_root(id: u64, start_unix_nano: u64, end_unix_nano: u64) -> Span {
        Span {
            trace_id: TraceId::from(u128::from(id)),
            span_id: SpanId::from(id),
            parent_span_id: None,
            parent_is_remote: false,
            name: "GET /x".into(),
            start_unix_nano,
            end_unix_nano,
            service_version: None,
            profile_id: Some(format!("{id:016x}")),
            cpu_samples: None,
            cpu_time_ns: None,
            wall_active_ns: None,
            wall_queued_ns: None,
            wall_runqueue_ns: None,
            cgroup_throttled_ns: None,
            cgroup_cpu_limit_millicpus: None,
            busy_ns: None,
            http_route: None,
            http_method: None,
            code_module: None,
            evidence_missing: None,
            alloc_bytes: None,
            alloc_count: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    #[serde(default)]
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceSpans {
    #[serde(default)]
    resource: Option<Resource>,
    #[serde(default)]
    scope_spans: Vec<ScopeSpans>,
}

#[derive(Deserialize)]
struct Resource {
    #[serde(default)]
    attributes: Vec<KeyValue>,
}

#[derive(Deserialize)]
struct ScopeSpans {
    #[serde(default)]
    spans: Vec<JsonSpan>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonSpan {
    #[serde(default)]
    trace_id: String,
    #[serde(default)]
    span_id: String,
    #[serde(default)]
    parent_span_id: String,
    #[serde(default)]
    flags: Value,
    #[serde(default)]
    name: String,
    #[serde(default)]
    start_time_unix_nano: Value,
    #[serde(default)]
    end_time_unix_nano: Value,
    #[serde(default)]
    attributes: Vec<KeyValue>,
}

#[derive(Deserialize)]
struct KeyValue {
    key: String,
    #[serde(default)]
    value: Value,
}

impl KeyValue {
    /// `stringValue`, or the text of a scalar value of another type.
    fn text(&self) -> Option<String> {
        let v = self.value.as_object()?;
        if let Some(s) = v.get("stringValue").and_then(Value::as_str) {
            return Some(s.to_owned());
        }
        ["intValue", "doubleValue", "boolValue"]
            .iter()
            .find_map(|k| v.get(*k))
            .map(|x| match x {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
    }

    /// `intValue` (string or number) as a non-negative integer.
    fn unsigned(&self) -> Result<u64, String> {
        self.value
            .get("intValue")
            .and_then(json_u64)
            .ok_or_else(|| {
                format!(
                    "attribute {:?} is not a non-negative intValue: {}",
                    self.key, self.value
                )
            })
    }
}

/// A JSON string or number holding a non-negative integer.
fn json_u64(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// Reads every span of one `*_spans.jsonl` file; blank lines are skipped.
pub fn read_spans(path: &Path) -> Result<Vec<Span>, ReportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut spans = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        parse_line(line, &mut spans).map_err(|message| ReportError::MalformedSpanLine {
            path: path.to_path_buf(),
            line: index + 1,
            message,
        })?;
    }
    Ok(spans)
}

/// The spans of one OTLP/JSON `ExportTraceServiceRequest` (ids in hex), e.g. a trace
/// Tempo returned, normalized; the error says what is wrong.
pub fn spans_from_json(request: &Value) -> Result<Vec<Span>, String> {
    let request = Request::deserialize(request).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    push_request(request, &mut out)?;
    Ok(out)
}

/// Appends the spans of one JSON line to `out`; the error says what is wrong.
fn parse_line(line: &str, out: &mut Vec<Span>) -> Result<(), String> {
    let request: Request = serde_json::from_str(line).map_err(|e| e.to_string())?;
    push_request(request, out)
}

fn push_request(request: Request, out: &mut Vec<Span>) -> Result<(), String> {
    for resource_spans in request.resource_spans {
        let service_version = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == SERVICE_VERSION_ATTRIBUTE)
            .and_then(KeyValue::text);
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            out.push(convert(span, service_version.clone())?);
        }
    }
    Ok(())
}

fn convert(span: JsonSpan, service_version: Option<String>) -> Result<Span, String> {
    let id_error = |e: crate::ids::IdError| e.to_string();
    let span_id = SpanId::parse(&span.span_id, "spanId").map_err(id_error)?;
    let trace_id = TraceId::parse(&span.trace_id, "traceId").map_err(id_error)?;
    let parent_span_id = if span.parent_span_id.is_empty() {
        None
    } else {
        Some(SpanId::parse(&span.parent_span_id, "parentSpanId").map_err(id_error)?)
    };
    let time = |v: &Value, field: &str| -> Result<u64, String> {
        match v {
            Value::Null => Ok(0),
            v => json_u64(v).ok_or_else(|| {
                format!("span {span_id}: {field} is not a non-negative integer: {v}")
            }),
        }
    };
    let start_unix_nano = time(&span.start_time_unix_nano, "startTimeUnixNano")?;
    let end_unix_nano = time(&span.end_time_unix_nano, "endTimeUnixNano")?;
    let flags = json_u64(&span.flags).unwrap_or(0);
    let mut out = Span {
        parent_is_remote: flags & (FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE)
            == FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE,
        trace_id,
        span_id,
        parent_span_id,
        name: span.name,
        start_unix_nano,
        end_unix_nano,
        service_version,
        profile_id: None,
        cpu_samples: None,
        cpu_time_ns: None,
        http_route: None,
        http_method: None,
        wall_active_ns: None,
        wall_queued_ns: None,
        wall_runqueue_ns: None,
        cgroup_throttled_ns: None,
        cgroup_cpu_limit_millicpus: None,
        busy_ns: None,
        code_module: None,
        evidence_missing: None,
        alloc_bytes: None,
        alloc_count: None,
    };
    let id = out.span_id;
    let in_span = |e: String| format!("span {id}: {e}");
    for attribute in &span.attributes {
        match attribute.key.as_str() {
            PROFILE_ID_ATTRIBUTE => {
                out.profile_id = attribute.text().map(|s| s.to_ascii_lowercase());
            }
            CPU_SAMPLES_ATTRIBUTE => out.cpu_samples = Some(attribute.unsigned().map_err(in_span)?),
            CPU_TIME_ATTRIBUTE => out.cpu_time_ns = Some(attribute.unsigned().map_err(in_span)?),
            HTTP_ROUTE_ATTRIBUTE => out.http_route = attribute.text(),
            // The current convention's key wins whichever comes first.
            key if key == HTTP_METHOD_ATTRIBUTES[0] => out.http_method = attribute.text(),
            key if key == HTTP_METHOD_ATTRIBUTES[1] && out.http_method.is_none() => {
                out.http_method = attribute.text();
            }
            WALL_ACTIVE_ATTRIBUTE => {
                out.wall_active_ns = Some(attribute.unsigned().map_err(in_span)?);
            }
            WALL_QUEUED_ATTRIBUTE => {
                out.wall_queued_ns = Some(attribute.unsigned().map_err(in_span)?);
            }
            WALL_RUNQUEUE_ATTRIBUTE => {
                out.wall_runqueue_ns = Some(attribute.unsigned().map_err(in_span)?);
            }
            CGROUP_THROTTLED_ATTRIBUTE => {
                out.cgroup_throttled_ns = Some(attribute.unsigned().map_err(in_span)?);
            }
            CGROUP_CPU_LIMIT_ATTRIBUTE => {
                out.cgroup_cpu_limit_millicpus = attribute
                    .value
                    .get("doubleValue")
                    .and_then(Value::as_f64)
                    .filter(|cpus| cpus.is_finite() && *cpus > 0.0)
                    .map(|cpus| (cpus * 1000.0).round() as u64);
            }
            // Written by another library: a malformed value is ignored, not fatal.
            BUSY_NS_ATTRIBUTE => out.busy_ns = attribute.unsigned().ok(),
            EVIDENCE_MISSING_ATTRIBUTE => out.evidence_missing = attribute.text(),
            ALLOC_BYTES_ATTRIBUTE => out.alloc_bytes = Some(attribute.unsigned().map_err(in_span)?),
            ALLOC_COUNT_ATTRIBUTE => out.alloc_count = Some(attribute.unsigned().map_err(in_span)?),
            key if key == CODE_MODULE_ATTRIBUTES[0] => out.code_module = attribute.text(),
            key if key == CODE_MODULE_ATTRIBUTES[1] && out.code_module.is_none() => {
                out.code_module = attribute.text();
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_route_groups_with_its_method_or_else_by_the_span_name() {
        let mut span = Span {
            name: "GET /report".into(),
            profile_id: None,
            http_route: Some("/report".into()),
            ..Span::test_root(0x0102_0304_0506_0708, 0, 0)
        };
        // Named by hand with the method, routed without one: the name, not "/report".
        assert_eq!(span.report_name(), "GET /report");
        span.name = "request".into();
        span.http_method = Some("POST".into());
        assert_eq!(span.report_name(), "POST /report");
        assert!(span.answers_to("request") && span.answers_to("POST /report"));
    }

    use super::*;

    fn parse(line: &str) -> Result<Vec<Span>, String> {
        let mut out = Vec::new();
        parse_line(line, &mut out)?;
        Ok(out)
    }

    #[test]
    fn reads_numbers_as_strings_or_numbers_and_ids_in_either_case() {
        let spans = parse(
            r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.version","value":{"stringValue":"3.1"}}]},
              "scopeSpans":[{"spans":[{"traceId":"0102030405060708090A0B0C0D0E0F10","spanId":"00000000000000AB",
              "parentSpanId":"00000000000000cd","flags":769,"name":"GET /x","startTimeUnixNano":1000,
              "endTimeUnixNano":"3500","attributes":[
                {"key":"pyroscope.profile.id","value":{"stringValue":"00000000000000AB"}},
                {"key":"profiling.cpu.samples","value":{"intValue":2}},
                {"key":"profiling.cpu.time_ns","value":{"intValue":"20000000"}},
                {"key":"busy_ns","value":{"intValue":"1500"}},
                {"key":"code.namespace","value":{"stringValue":"old::key"}},
                {"key":"code.module.name","value":{"stringValue":"svc::catalog"}},
                {"key":"profiling.evidence.missing","value":{"stringValue":"not_followed"}},
                {"key":"idle_ns","value":{"intValue":"1000"}}]}]}]}]}"#,
        )
        .expect("parse");
        assert_eq!(
            spans,
            [Span {
                trace_id: TraceId::from(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
                span_id: SpanId::from(0xab),
                parent_span_id: Some(SpanId::from(0xcd)),
                parent_is_remote: true,
                name: "GET /x".into(),
                start_unix_nano: 1000,
                end_unix_nano: 3500,
                service_version: Some("3.1".into()),
                profile_id: Some("00000000000000ab".into()),
                cpu_samples: Some(2),
                cpu_time_ns: Some(20_000_000),
                http_route: None,
                http_method: None,
                wall_active_ns: None,
                wall_queued_ns: None,
                wall_runqueue_ns: None,
                cgroup_throttled_ns: None,
                cgroup_cpu_limit_millicpus: None,
                busy_ns: Some(1500),
                code_module: Some("svc::catalog".into()),
                evidence_missing: Some("not_followed".into()),
                alloc_bytes: None,
                alloc_count: None,
            }]
        );
        assert_eq!(spans[0].wall_ns(), 2500);
    }

    #[test]
    fn omitted_fields_take_their_defaults() {
        // OTLP JSON may omit empty and zero fields: no parent, no flags, no resource.
        let spans = parse(
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0000000000000001"}]}]}]}"#,
        )
        .expect("parse");
        assert_eq!(spans[0].parent_span_id, None);
        assert!(!spans[0].parent_is_remote);
        assert_eq!(spans[0].service_version, None);
        assert_eq!(spans[0].wall_ns(), 0);
        assert!(parse("{}").expect("empty request").is_empty());
    }

    #[test]
    fn says_what_is_wrong() {
        let err = parse(r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"01","spanId":"0000000000000001"}]}]}]}"#)
            .expect_err("short trace id");
        assert!(err.contains("traceId \"01\" is not 32 hex digits"), "{err}");
        let err = parse(
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0000000000000001","startTimeUnixNano":"soon"}]}]}]}"#,
        )
        .expect_err("bad time");
        assert!(err.contains("startTimeUnixNano"), "{err}");
        assert!(parse("[1,2]").is_err());
    }
}
