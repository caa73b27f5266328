//! The Tempo half of the stand-in: OTLP/HTTP ingest, the v1 trace-by-id API and TraceQL
//! search (`GET /api/search`, the subset of [`super::traceql`]).

use std::collections::HashMap;

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};

use super::traceql::{parse_traceql, TraceQuery};

/// One stored span with the resource and scope it arrived with.
#[derive(Clone, Debug)]
struct StoredSpan {
    resource: Option<Resource>,
    scope: Option<InstrumentationScope>,
    span: Span,
}

/// Spans by trace id.
#[derive(Debug, Default)]
pub struct TempoStore {
    traces: HashMap<Vec<u8>, Vec<StoredSpan>>,
}

impl TempoStore {
    /// Total spans stored.
    pub fn span_count(&self) -> usize {
        self.traces.values().map(Vec::len).sum()
    }

    /// Decodes a protobuf `ExportTraceServiceRequest` and stores its spans.
    pub fn ingest_protobuf(&mut self, raw: &[u8]) -> Result<(), String> {
        let request = ExportTraceServiceRequest::decode(raw)
            .map_err(|e| format!("bad ExportTraceServiceRequest: {e}"))?;
        for rs in request.resource_spans {
            for ss in rs.scope_spans {
                for span in ss.spans {
                    if span.trace_id.len() != 16 || span.span_id.len() != 8 {
                        return Err("span with an invalid trace or span id".into());
                    }
                    self.traces
                        .entry(span.trace_id.clone())
                        .or_default()
                        .push(StoredSpan {
                            resource: rs.resource.clone(),
                            scope: ss.scope.clone(),
                            span,
                        });
                }
            }
        }
        Ok(())
    }

    /// Tempo's `GET /api/traces/<id>` answer: `Ok(None)` when unknown, `Err` for a
    /// malformed id. Tempo accepts ids shorter than 32 hex digits (left-padded with zeros).
    pub fn trace_json(&self, id: &str) -> Result<Option<Value>, String> {
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "invalid trace id {id:?}: expected up to 32 hex digits"
            ));
        }
        let padded = format!("{id:0>32}");
        let bytes: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&padded[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        let Some(spans) = self.traces.get(&bytes) else {
            return Ok(None);
        };
        // One batch per (resource, scope) as received, spans in arrival order.
        let mut batches: Vec<Value> = Vec::new();
        for stored in spans {
            batches.push(json!({
                "resource": resource_json(stored.resource.as_ref()),
                "scopeSpans": [{
                    "scope": scope_json(stored.scope.as_ref()),
                    "spans": [span_json(&stored.span)],
                }],
            }));
        }
        Ok(Some(json!({ "batches": batches })))
    }
}

/// Tempo's default number of traces a search returns.
pub const DEFAULT_SEARCH_LIMIT: usize = 20;

/// The largest search `limit` the stand-in accepts.
pub const MAX_SEARCH_LIMIT: usize = 262_144;

/// Tempo's default number of spans per span set (`spss`).
pub const DEFAULT_SPANS_PER_SET: usize = 3;

/// The largest `spss` Tempo v3 accepts (`max_spans_per_span_set`).
pub const MAX_SPANS_PER_SET: usize = 100;

/// A parsed `GET /api/search` request.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchRequest {
    /// The TraceQL query (`q`; absent: `{}`).
    pub query: TraceQuery,
    /// `start`, seconds since the Unix epoch: spans starting earlier are left out.
    pub start_s: Option<u64>,
    /// `end`, seconds since the Unix epoch: spans starting later are left out.
    pub end_s: Option<u64>,
    /// Most traces to return (`limit`).
    pub limit: usize,
    /// Most spans per span set (`spss`).
    pub spans_per_set: usize,
}

impl SearchRequest {
    /// Parses the URL query string of a search (percent-encoded, `+` for a space). `Err`
    /// is the text of the 400 answer. `limit` and `spss` of 0 or absent take Tempo's
    /// defaults; `tags`, `minDuration` and `maxDuration` (Tempo's pre-TraceQL search) are
    /// refused rather than ignored, since ignoring them would answer a different search.
    pub fn from_query_string(raw: &str) -> Result<SearchRequest, String> {
        let mut request = SearchRequest {
            query: TraceQuery::default(),
            start_s: None,
            end_s: None,
            limit: DEFAULT_SEARCH_LIMIT,
            spans_per_set: DEFAULT_SPANS_PER_SET,
        };
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key)?;
            let value = percent_decode(value)?;
            let number = |what: &str| {
                value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("invalid {what}: {value:?} is not a non-negative integer"))
            };
            match key.as_str() {
                "q" => request.query = parse_traceql(&value)?,
                "start" => request.start_s = Some(number("start")?),
                "end" => request.end_s = Some(number("end")?),
                "limit" => {
                    request.limit = match usize::try_from(number("limit")?).unwrap_or(usize::MAX) {
                        0 => DEFAULT_SEARCH_LIMIT,
                        n if n > MAX_SEARCH_LIMIT => {
                            return Err(format!(
                                "limit {n} exceeds the maximum of {MAX_SEARCH_LIMIT}"
                            ))
                        }
                        n => n,
                    }
                }
                "spss" => {
                    request.spans_per_set =
                        match usize::try_from(number("spss")?).unwrap_or(usize::MAX) {
                            0 => DEFAULT_SPANS_PER_SET,
                            n if n > MAX_SPANS_PER_SET => {
                                return Err(format!(
                                    "spans per span set exceeds {MAX_SPANS_PER_SET}. received: {n}"
                                ))
                            }
                            n => n,
                        }
                }
                "tags" | "minDuration" | "maxDuration" => {
                    return Err(format!(
                        "the stand-in supports only q, start, end, limit and spss: {key} is not \
                         supported (write the condition in q)"
                    ))
                }
                // Tempo ignores parameters it does not know.
                _ => {}
            }
        }
        if let (Some(start), Some(end)) = (request.start_s, request.end_s) {
            if end < start {
                return Err(format!(
                    "http parameter start must be before end: start {start}, end {end}"
                ));
            }
        }
        Ok(request)
    }
}

/// Percent-decodes one URL query component (`+` is a space).
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid URL escape in {s:?}"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `service.name` string attribute of `resource`.
fn service_name(resource: Option<&Resource>) -> Option<&str> {
    resource?
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValueKind::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

impl TempoStore {
    /// Tempo v3's `GET /api/search` answer: the traces with spans that start within the
    /// window and pass the filter, most recent trace start first, at most
    /// `request.limit`; each with one span set of its first `spans_per_set` matching
    /// spans by start time (`matched`: how many matched in all) and, in each span, the
    /// attributes the query names (bare names, as Tempo returns them). `inspectedTraces`
    /// counts the traces with a span in the window.
    pub fn search(&self, request: &SearchRequest) -> Value {
        let from = request.start_s.map(|s| s.saturating_mul(1_000_000_000));
        let to = request.end_s.map(|s| s.saturating_mul(1_000_000_000));
        let in_window = |span: &Span| {
            from.is_none_or(|t| span.start_time_unix_nano >= t)
                && to.is_none_or(|t| span.start_time_unix_nano <= t)
        };
        let returned = request.query.returned_attributes();
        let mut inspected = 0u64;
        let mut found: Vec<(u64, &[u8], Value)> = Vec::new();
        for (trace_id, spans) in &self.traces {
            let window: Vec<&StoredSpan> = spans.iter().filter(|s| in_window(&s.span)).collect();
            if window.is_empty() {
                continue;
            }
            inspected += 1;
            let mut matched: Vec<&StoredSpan> = window
                .into_iter()
                .filter(|s| request.query.matches(s.resource.as_ref(), &s.span))
                .collect();
            if matched.is_empty() {
                continue;
            }
            matched.sort_by(|a, b| {
                (a.span.start_time_unix_nano, &a.span.span_id)
                    .cmp(&(b.span.start_time_unix_nano, &b.span.span_id))
            });
            // The trace's own extent and root, over all its spans, as Tempo reports them.
            let start = spans
                .iter()
                .map(|s| s.span.start_time_unix_nano)
                .min()
                .unwrap_or(0);
            let end = spans
                .iter()
                .map(|s| s.span.end_time_unix_nano)
                .max()
                .unwrap_or(0);
            let root = spans.iter().find(|s| s.span.parent_span_id.is_empty());
            let span_set = json!({
                "spans": matched
                    .iter()
                    .take(request.spans_per_set)
                    .map(|s| search_span_json(s, &returned))
                    .collect::<Vec<_>>(),
                "matched": matched.len(),
            });
            let mut trace = json!({
                "traceID": hex(trace_id),
                // Tempo's placeholder while the root span is missing.
                "rootServiceName": root
                    .map(|r| service_name(r.resource.as_ref()).unwrap_or_default())
                    .unwrap_or("<root span not yet received>"),
                "startTimeUnixNano": start.to_string(),
                "durationMs": end.saturating_sub(start) / 1_000_000,
                "spanSets": [span_set.clone()],
                "spanSet": span_set,
            });
            if let Some(root) = root {
                trace["rootTraceName"] = json!(root.span.name);
            }
            found.push((start, trace_id, trace));
        }
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        found.truncate(request.limit);
        json!({
            "traces": found.into_iter().map(|(_, _, t)| t).collect::<Vec<_>>(),
            "metrics": { "inspectedTraces": inspected },
        })
    }
}

/// One span of a search answer: ids in hex, times as strings, the `returned` attributes
/// the span (or, for `resource.`/`.` ones, its resource) has, absent ones left out.
fn search_span_json(stored: &StoredSpan, returned: &[&super::traceql::Attribute]) -> Value {
    let span = &stored.span;
    let mut v = json!({
        "spanID": hex(&span.span_id),
        "name": span.name,
        "startTimeUnixNano": span.start_time_unix_nano.to_string(),
        "durationNanos": span
            .end_time_unix_nano
            .saturating_sub(span.start_time_unix_nano)
            .to_string(),
    });
    let attributes: Vec<Value> = returned
        .iter()
        .filter_map(|a| {
            let value = a.lookup(stored.resource.as_ref(), span)?;
            Some(json!({ "key": a.key()?, "value": any_value_json(Some(value)) }))
        })
        .collect();
    // protobuf JSON leaves an empty list out.
    if !attributes.is_empty() {
        v["attributes"] = Value::Array(attributes);
    }
    v
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn resource_json(resource: Option<&Resource>) -> Value {
    match resource {
        Some(r) => json!({ "attributes": attributes_json(&r.attributes) }),
        None => json!({}),
    }
}

fn scope_json(scope: Option<&InstrumentationScope>) -> Value {
    match scope {
        Some(s) => json!({ "name": s.name, "version": s.version }),
        None => json!({}),
    }
}

fn attributes_json(attributes: &[KeyValue]) -> Value {
    Value::Array(
        attributes
            .iter()
            .map(|kv| json!({ "key": kv.key, "value": any_value_json(kv.value.as_ref()) }))
            .collect(),
    )
}

fn any_value_json(value: Option<&AnyValue>) -> Value {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValueKind::StringValue(s)) => json!({ "stringValue": s }),
        Some(AnyValueKind::BoolValue(b)) => json!({ "boolValue": b }),
        // protobuf JSON writes int64 as a string.
        Some(AnyValueKind::IntValue(i)) => json!({ "intValue": i.to_string() }),
        Some(AnyValueKind::DoubleValue(d)) => json!({ "doubleValue": d }),
        Some(AnyValueKind::BytesValue(b)) => json!({ "bytesValue": b64(b) }),
        Some(AnyValueKind::ArrayValue(a)) => json!({ "arrayValue": {
            "values": a.values.iter().map(|v| any_value_json(Some(v))).collect::<Vec<_>>()
        }}),
        Some(AnyValueKind::KvlistValue(kv)) => {
            json!({ "kvlistValue": { "values": attributes_json(&kv.values) } })
        }
        _ => json!({}),
    }
}

fn span_json(span: &Span) -> Value {
    let mut v = json!({
        "traceId": b64(&span.trace_id),
        "spanId": b64(&span.span_id),
        "name": span.name,
        "kind": span_kind(span.kind),
        "startTimeUnixNano": span.start_time_unix_nano.to_string(),
        "endTimeUnixNano": span.end_time_unix_nano.to_string(),
        "attributes": attributes_json(&span.attributes),
        "status": {},
    });
    if !span.parent_span_id.is_empty() {
        v["parentSpanId"] = json!(b64(&span.parent_span_id));
    }
    v
}

fn span_kind(kind: i32) -> &'static str {
    match kind {
        1 => "SPAN_KIND_INTERNAL",
        2 => "SPAN_KIND_SERVER",
        3 => "SPAN_KIND_CLIENT",
        4 => "SPAN_KIND_PRODUCER",
        5 => "SPAN_KIND_CONSUMER",
        _ => "SPAN_KIND_UNSPECIFIED",
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    use super::*;

    const S: u64 = 1_000_000_000;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(AnyValueKind::StringValue(value.into())),
            }),
            ..KeyValue::default()
        }
    }

    /// A span of trace `trace` (its last id byte), span `span`, starting at `start_s` and
    /// lasting `ms`; a root when `parent` is 0.
    fn span(trace: u8, span: u8, parent: u8, name: &str, start_s: u64, ms: u64) -> Span {
        let mut trace_id = vec![0u8; 16];
        trace_id[0] = 0x0a;
        trace_id[15] = trace;
        Span {
            trace_id,
            span_id: vec![0, 0, 0, 0, 0, 0, 1, span],
            parent_span_id: if parent == 0 {
                Vec::new()
            } else {
                vec![0, 0, 0, 0, 0, 0, 1, parent]
            },
            name: name.into(),
            start_time_unix_nano: start_s * S,
            end_time_unix_nano: start_s * S + ms * 1_000_000,
            ..Span::default()
        }
    }

    fn store(service: &str, spans: Vec<Span>) -> TempoStore {
        let mut store = TempoStore::default();
        ingest(&mut store, service, spans);
        store
    }

    fn ingest(store: &mut TempoStore, service: &str, spans: Vec<Span>) {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", service), kv("service.version", "1.5.0")],
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        store.ingest_protobuf(&request.encode_to_vec()).unwrap();
    }

    fn search(store: &TempoStore, query: &str) -> Value {
        store.search(&SearchRequest::from_query_string(query).unwrap())
    }

    fn trace_ids(answer: &Value) -> Vec<String> {
        answer["traces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["traceID"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn the_query_string_is_parsed_with_tempos_defaults_and_limits() {
        let r = SearchRequest::from_query_string("").unwrap();
        assert_eq!(
            (r.limit, r.spans_per_set, r.start_s, r.end_s),
            (20, 3, None, None)
        );
        assert_eq!(r.query, TraceQuery::default());
        let r = SearchRequest::from_query_string(
            "q=%7B+name+%3D+%22GET+%2Fa%22+%7D&start=10&end=20&limit=0&spss=100&other=x",
        )
        .unwrap();
        assert_eq!(r.query.conditions.len(), 1);
        assert_eq!(
            (r.limit, r.spans_per_set, r.start_s, r.end_s),
            (20, 100, Some(10), Some(20))
        );
        assert_eq!(
            SearchRequest::from_query_string("limit=262144")
                .unwrap()
                .limit,
            MAX_SEARCH_LIMIT
        );
        for (bad, says) in [
            ("limit=262145", "limit 262145"),
            ("spss=101", "spans per span set exceeds 100"),
            ("start=x", "invalid start"),
            ("end=-1", "invalid end"),
            ("start=20&end=10", "start must be before end"),
            ("q=%7Bname%3D%22a%22%7D%7C%7C", "the stand-in supports only"),
            ("q={ name =~ \"a\" }", "the stand-in supports only"),
            (
                "tags=service.name%3Dapi",
                "the stand-in supports only q, start",
            ),
            ("q=%ZZ", "invalid URL escape"),
        ] {
            let e = SearchRequest::from_query_string(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn limit_keeps_the_most_recent_traces() {
        let mut s = TempoStore::default();
        for t in 1..=5u8 {
            ingest(
                &mut s,
                "api",
                vec![span(t, 1, 0, "GET /", 100 * u64::from(t), 10)],
            );
        }
        let answer = search(&s, "q={}&limit=2");
        let id = |t: u8| format!("0a{:028x}{t:02x}", 0);
        assert_eq!(trace_ids(&answer), [id(5), id(4)]);
        assert_eq!(answer["metrics"]["inspectedTraces"], 5);
        assert_eq!(trace_ids(&search(&s, "")).len(), 5);
        let first = &answer["traces"][0];
        assert_eq!(first["traceID"].as_str().map(str::len), Some(32));
        assert_eq!(first["rootServiceName"], "api");
        assert_eq!(first["rootTraceName"], "GET /");
        assert_eq!(first["startTimeUnixNano"], (500 * S).to_string());
        assert_eq!(first["durationMs"], 10);
        assert_eq!(first["spanSet"], first["spanSets"][0]);
    }

    #[test]
    fn spss_bounds_the_spans_shown_not_the_count_matched() {
        // Five matching children arriving out of order, and a root that does not match.
        let mut spans: Vec<Span> = (2..=6u8)
            .rev()
            .map(|i| span(1, i, 1, "work", 100 + u64::from(i), 5))
            .collect();
        spans.push(span(1, 1, 0, "GET /", 100, 10_000));
        let s = store("api", spans);
        let answer = search(&s, "q=%7B+name+%3D+%22work%22+%7D&spss=2");
        let set = &answer["traces"][0]["spanSets"][0];
        assert_eq!(set["matched"], 5);
        let shown: Vec<&str> = set["spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["spanID"].as_str().unwrap())
            .collect();
        assert_eq!(shown, ["0000000000000102", "0000000000000103"]);
        assert_eq!(set["spans"][0]["startTimeUnixNano"], (102 * S).to_string());
        assert_eq!(set["spans"][0]["durationNanos"], "5000000");
        // The trace's extent is its root's, though the root did not match.
        assert_eq!(answer["traces"][0]["durationMs"], 10_000);
        assert_eq!(
            answer["traces"][0]["startTimeUnixNano"],
            (100 * S).to_string()
        );
        // Default: 3.
        let answer = search(&s, "q=%7B+name+%3D+%22work%22+%7D");
        assert_eq!(
            answer["traces"][0]["spanSet"]["spans"]
                .as_array()
                .map(Vec::len),
            Some(3)
        );
    }

    #[test]
    fn the_window_is_on_span_start_in_seconds() {
        let s = store(
            "api",
            vec![
                span(1, 1, 0, "early", 100, 10),
                span(1, 2, 1, "inside", 150, 10),
                span(2, 1, 0, "late", 201, 10),
            ],
        );
        let answer = search(&s, "start=150&end=200");
        assert_eq!(answer["traces"].as_array().map(Vec::len), Some(1));
        let set = &answer["traces"][0]["spanSet"];
        assert_eq!(set["matched"], 1);
        assert_eq!(set["spans"][0]["name"], "inside");
        assert_eq!(answer["metrics"]["inspectedTraces"], 1);
        // Bounds are inclusive; a missing root is reported as Tempo does.
        let answer = search(&s, "start=201&end=201");
        assert_eq!(answer["traces"][0]["spanSet"]["spans"][0]["name"], "late");
        let answer = search(&s, "start=150&end=150");
        assert_eq!(answer["traces"][0]["rootTraceName"], "early");
        let mut orphan = TempoStore::default();
        ingest(&mut orphan, "api", vec![span(3, 2, 1, "child", 10, 1)]);
        let answer = search(&orphan, "");
        assert_eq!(
            answer["traces"][0]["rootServiceName"],
            "<root span not yet received>"
        );
        assert!(answer["traces"][0].get("rootTraceName").is_none());
    }

    #[test]
    fn the_attributes_the_query_names_are_returned_by_bare_name() {
        let mut with_thread = span(1, 1, 0, "GET /", 100, 10);
        with_thread.attributes = vec![
            kv("thread.name", "worker-1"),
            KeyValue {
                key: "http.status_code".into(),
                value: Some(AnyValue {
                    value: Some(AnyValueKind::IntValue(200)),
                }),
                ..KeyValue::default()
            },
            kv("unasked", "x"),
        ];
        let s = store("api", vec![with_thread, span(1, 2, 1, "GET /", 101, 10)]);
        let q = "{ resource.service.name = \"api\" && span.http.status_code = 200 } \
                 | select(span.thread.name, .service.version)";
        let answer = s.search(&SearchRequest {
            query: parse_traceql(q).unwrap(),
            ..SearchRequest::from_query_string("").unwrap()
        });
        let spans = &answer["traces"][0]["spanSet"]["spans"];
        assert_eq!(spans.as_array().map(Vec::len), Some(1));
        assert_eq!(
            spans[0]["attributes"],
            json!([
                {"key": "service.name", "value": {"stringValue": "api"}},
                {"key": "http.status_code", "value": {"intValue": "200"}},
                {"key": "thread.name", "value": {"stringValue": "worker-1"}},
                {"key": "service.version", "value": {"stringValue": "1.5.0"}},
            ])
        );
        // Nothing named: no attributes at all; nothing matching: no traces.
        let answer = search(&s, "q=%7B%7D");
        assert!(answer["traces"][0]["spanSet"]["spans"][0]
            .get("attributes")
            .is_none());
        let answer = search(&s, "q=%7Bname%3D%22nope%22%7D");
        assert_eq!(answer["traces"], json!([]));
        assert_eq!(answer["metrics"]["inspectedTraces"], 1);
    }
}
