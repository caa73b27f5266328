//! Tempo's trace-by-id and search APIs.

use std::collections::BTreeMap;

use serde_json::Value;

use std::time::Duration;

use crate::http::Backend;
use crate::ids::id_to_hex;
use crate::{Auth, QueryError};

/// A span as read back from Tempo, with its resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSpan {
    /// 32 lowercase hex.
    pub trace_id: String,
    /// 16 lowercase hex.
    pub span_id: String,
    /// 16 lowercase hex, `None` for a root span.
    pub parent_span_id: Option<String>,
    /// Span name.
    pub name: String,
    /// Start, ns since the Unix epoch.
    pub start_unix_nano: u64,
    /// End, ns since the Unix epoch.
    pub end_unix_nano: u64,
    /// Span attributes, values rendered as strings.
    pub attributes: BTreeMap<String, String>,
    /// Resource attributes, values rendered as strings.
    pub resource: BTreeMap<String, String>,
}

impl TraceSpan {
    /// Wall-clock duration in ms.
    pub fn wall_ms(&self) -> f64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano) as f64 / 1e6
    }
}

/// A trace as Tempo returned it: its spans, and the answer normalized to OTLP/JSON
/// (`{"resourceSpans": [...]}`, ids in hex) for readers of OTLP JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Every span, in the answer's order.
    pub spans: Vec<TraceSpan>,
    /// The answer as an OTLP/JSON `ExportTraceServiceRequest`, ids in lowercase hex.
    pub otlp_json: Value,
}

impl Trace {
    /// The span with id `span_id` (16 hex, any case).
    pub fn span(&self, span_id: &str) -> Option<&TraceSpan> {
        let id = span_id.to_ascii_lowercase();
        self.spans.iter().find(|s| s.span_id == id)
    }

    /// The local roots: spans without a parent, whose parent is not in the trace, or whose
    /// parent ran in another process (another resource).
    pub fn local_roots(&self) -> Vec<&TraceSpan> {
        self.spans
            .iter()
            .filter(|s| match &s.parent_span_id {
                None => true,
                Some(p) => self
                    .span(p)
                    .is_none_or(|parent| parent.resource != s.resource),
            })
            .collect()
    }

    /// The local root with the longest wall time (the first of equals).
    pub fn slowest_local_root(&self) -> Option<&TraceSpan> {
        self.local_roots()
            .into_iter()
            .rev()
            .max_by_key(|s| s.end_unix_nano.saturating_sub(s.start_unix_nano))
    }

    /// The spans below `span` in the same process (its descendants with its resource).
    pub fn local_descendants(&self, span: &TraceSpan) -> Vec<&TraceSpan> {
        let mut out: Vec<&TraceSpan> = Vec::new();
        let mut frontier = vec![span.span_id.as_str()];
        while let Some(id) = frontier.pop() {
            for child in self
                .spans
                .iter()
                .filter(|c| c.parent_span_id.as_deref() == Some(id) && c.resource == span.resource)
            {
                if !out.iter().any(|o| o.span_id == child.span_id) {
                    out.push(child);
                    frontier.push(&child.span_id);
                }
            }
        }
        out
    }
}

/// A TraceQL search (`GET /api/search`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchQuery {
    /// The TraceQL query, e.g. `{ resource.service.name = "api" && name = "GET /report" }`.
    pub traceql: String,
    /// Start, seconds since the Unix epoch.
    pub start_s: u64,
    /// End, seconds since the Unix epoch.
    pub end_s: u64,
    /// Most traces to return (Tempo's default is 20).
    pub limit: u32,
    /// Most matching spans per trace (Tempo's `spss`, default 3, at most 100 in v3.0.3).
    pub spans_per_set: u32,
}

/// The most spans per span set Tempo v3.0.3 returns (`spss` above it is refused).
pub const MAX_SPANS_PER_SET: u32 = 100;

/// A span a search matched: what Tempo's search answer carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoundSpan {
    /// 32 lowercase hex (Tempo drops leading zeros; they are restored).
    pub trace_id: String,
    /// 16 lowercase hex.
    pub span_id: String,
    /// Span name.
    pub name: String,
    /// Start, ns since the Unix epoch.
    pub start_unix_nano: u64,
    /// Duration, ns.
    pub duration_ns: u64,
    /// The attributes the query named or selected, by their bare name.
    pub attributes: BTreeMap<String, String>,
    /// How many spans of its trace the query matched (the span set's `matched`): more
    /// than the search returned for the trace when `spans_per_set` cut them.
    pub set_matched: u32,
}

/// Client of Tempo's HTTP API (`http://host:3200`).
#[derive(Debug, Clone)]
pub struct TempoClient {
    backend: Backend,
}

impl TempoClient {
    /// A client for the Tempo API at `base` (e.g. `http://localhost:3200`).
    ///
    /// # Errors
    /// `base` is not an http(s) URL ([`QueryError::Setting`] naming `TEMPO_URL`).
    pub fn new(base: &str) -> Result<TempoClient, QueryError> {
        Ok(TempoClient {
            backend: Backend::new(base, "TEMPO_URL")?,
        })
    }

    /// Sends `auth` with every request.
    pub fn with_auth(mut self, auth: Auth) -> TempoClient {
        self.backend.set_auth(auth);
        self
    }

    /// Bounds every request by `timeout` (default 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Result<TempoClient, QueryError> {
        self.backend.set_timeout(timeout)?;
        Ok(self)
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        self.backend.base()
    }

    /// `GET /api/traces/<trace id>` (else `/api/v2/traces/<trace id>`): the trace,
    /// `Ok(None)` when Tempo does not know it (yet).
    pub fn get_trace(&self, trace_id: &str) -> Result<Option<Trace>, QueryError> {
        // The v1 path (`{"batches": ...}`), then v2 (`{"trace": ...}`), which some
        // deployments serve alone.
        let mut path = format!("api/traces/{}", trace_id.trim());
        let json = match self.backend.get_json(&path, &[])? {
            Some(json) => json,
            None => {
                path = format!("api/v2/traces/{}", trace_id.trim());
                match self.backend.get_json(&path, &[])? {
                    Some(json) => json,
                    None => return Ok(None),
                }
            }
        };
        let request = format!("GET {}/{path}", self.base());
        let spans = parse_trace(&json).map_err(|message| QueryError::Decode {
            request: request.clone(),
            message,
        })?;
        if spans.is_empty() {
            return Ok(None);
        }
        Ok(Some(Trace {
            otlp_json: normalized(&json),
            spans,
        }))
    }

    /// `GET /api/metrics/query_range`: a TraceQL metrics query's series.
    pub fn metrics_query_range(&self, query: &MetricsQuery) -> Result<MetricsResult, QueryError> {
        let params = [
            ("q", query.traceql.clone()),
            ("start", query.start_s.to_string()),
            ("end", query.end_s.max(query.start_s + 1).to_string()),
            ("step", format!("{}s", query.step_s.max(1))),
        ];
        let json = self
            .backend
            .get_json("api/metrics/query_range", &params)?
            .ok_or_else(|| QueryError::Status {
                request: format!("GET {}/api/metrics/query_range", self.base()),
                status: 404,
                body: "no TraceQL metrics here".into(),
            })?;
        parse_metrics(&json).map_err(|message| QueryError::Decode {
            request: format!("GET {}/api/metrics/query_range", self.base()),
            message,
        })
    }

    /// `GET /api/search`: the spans `query` matched, most recent traces first as Tempo
    /// orders them.
    pub fn search(&self, query: &SearchQuery) -> Result<Vec<FoundSpan>, QueryError> {
        let params = [
            ("q", query.traceql.clone()),
            ("start", query.start_s.to_string()),
            ("end", query.end_s.max(query.start_s + 1).to_string()),
            ("limit", query.limit.to_string()),
            (
                "spss",
                query.spans_per_set.min(MAX_SPANS_PER_SET).to_string(),
            ),
        ];
        let json = self
            .backend
            .get_json("api/search", &params)?
            .unwrap_or_default();
        parse_search(&json).map_err(|message| QueryError::Decode {
            request: format!("GET {}/api/search", self.base()),
            message,
        })
    }
}

/// A TraceQL metrics query (`GET /api/metrics/query_range`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsQuery {
    /// e.g. `{ name = "GET /x" } | quantile_over_time(duration, .5, .95) by (resource.service.version)`.
    pub traceql: String,
    /// Start, seconds since the Unix epoch.
    pub start_s: u64,
    /// End, seconds since the Unix epoch.
    pub end_s: u64,
    /// Step, seconds.
    pub step_s: u64,
}

/// One series of a metrics answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSeries {
    /// Its labels, values rendered as strings (`p` = `0.5` for a quantile series).
    pub labels: BTreeMap<String, String>,
    /// (timestamp ms, value) pairs; durations in seconds.
    pub samples: Vec<(i64, f64)>,
}

/// A metrics answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsResult {
    /// Every series.
    pub series: Vec<MetricsSeries>,
}

impl MetricsResult {
    /// The latest value (by timestamp: Tempo does not order the samples) of the quantile
    /// `q` (e.g. `"0.95"`) series whose `resource.service.version` is `version`, in
    /// seconds. Tempo's values are estimates from log2 duration buckets, not exact
    /// quantiles.
    pub fn quantile(&self, version: &str, q: &str) -> Option<f64> {
        let wanted: f64 = q.parse().ok()?;
        self.series
            .iter()
            .filter(|s| {
                let v = s
                    .labels
                    .get("resource.service.version")
                    .or_else(|| s.labels.get("service.version"));
                v.map(String::as_str) == Some(version)
                    && s.labels
                        .get("p")
                        .and_then(|p| p.parse::<f64>().ok())
                        .is_some_and(|p| (p - wanted).abs() < 1e-9)
            })
            .filter_map(|s| {
                s.samples
                    .iter()
                    .filter(|(_, v)| v.is_finite())
                    .max_by_key(|(t, _)| *t)
                    .map(|(_, v)| *v)
            })
            .next()
    }
}

/// Parses a `query_range` answer: `series[{labels: [{key, value}], samples:
/// [{timestampMs, value}]}]`.
pub fn parse_metrics(json: &Value) -> Result<MetricsResult, String> {
    let mut out = MetricsResult::default();
    for series in json
        .get("series")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let labels = attributes(series.get("labels"));
        let samples = series
            .get("samples")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let t = match s.get("timestampMs")? {
                    Value::String(t) => t.parse().ok()?,
                    Value::Number(n) => n.as_i64()?,
                    _ => return None,
                };
                let v = match s.get("value")? {
                    Value::Number(n) => n.as_f64()?,
                    Value::String(v) => v.parse().ok()?,
                    _ => return None,
                };
                Some((t, v))
            })
            .collect();
        out.series.push(MetricsSeries { labels, samples });
    }
    Ok(out)
}

/// Parses a search answer: `traces[].spanSets[].spans[]` (or the older single `spanSet`).
pub fn parse_search(json: &Value) -> Result<Vec<FoundSpan>, String> {
    let mut out: Vec<FoundSpan> = Vec::new();
    for trace in json
        .get("traces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let trace_id = trace
            .get("traceID")
            .and_then(Value::as_str)
            .and_then(|t| crate::ids::pad_hex(t, 16))
            .ok_or("a search result without a valid traceID")?;
        let sets: Vec<&Value> = match trace.get("spanSets").and_then(Value::as_array) {
            Some(sets) => sets.iter().collect(),
            None => trace.get("spanSet").into_iter().collect(),
        };
        let set_matched = sets
            .iter()
            .filter_map(|set| set.get("matched").and_then(Value::as_u64))
            .max()
            .map_or(0, |m| u32::try_from(m).unwrap_or(u32::MAX));
        for span in sets
            .into_iter()
            .filter_map(|set| set.get("spans").and_then(Value::as_array))
            .flatten()
        {
            let span_id = span
                .get("spanID")
                .and_then(Value::as_str)
                .and_then(|s| crate::ids::pad_hex(s, 8))
                .ok_or("a search result span without a valid spanID")?;
            if out
                .iter()
                .any(|f| f.trace_id == trace_id && f.span_id == span_id)
            {
                continue;
            }
            out.push(FoundSpan {
                trace_id: trace_id.clone(),
                span_id,
                name: span
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                start_unix_nano: json_u64(span.get("startTimeUnixNano")),
                duration_ns: json_u64(span.get("durationNanos")),
                attributes: attributes(span.get("attributes")),
                set_matched,
            });
        }
    }
    Ok(out)
}

/// Tempo's answer as OTLP/JSON with hex ids (`batches` → `resourceSpans`).
fn normalized(json: &Value) -> Value {
    let batches = json
        .get("batches")
        .or_else(|| json.get("trace").and_then(|t| t.get("resourceSpans")))
        .or_else(|| json.get("resourceSpans"))
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    let mut batches = batches;
    for batch in batches.as_array_mut().into_iter().flatten() {
        if let Some(old) = batch.get("instrumentationLibrarySpans").cloned() {
            batch["scopeSpans"] = old;
        }
        for scope in batch
            .get_mut("scopeSpans")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            for span in scope
                .get_mut("spans")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                for (key, len) in [("traceId", 16), ("spanId", 8), ("parentSpanId", 8)] {
                    let hex = span
                        .get(key)
                        .and_then(Value::as_str)
                        .and_then(|s| id_to_hex(s, len));
                    if let Some(hex) = hex {
                        span[key] = Value::String(hex);
                    }
                }
            }
        }
    }
    serde_json::json!({ "resourceSpans": batches })
}

/// Parses Tempo's v1 (`{"batches": [...]}`) or v2 (`{"trace": {"resourceSpans": [...]}}`)
/// answer, or plain OTLP JSON (`{"resourceSpans": [...]}`).
pub fn parse_trace(json: &Value) -> Result<Vec<TraceSpan>, String> {
    let batches = json
        .get("batches")
        .or_else(|| json.get("trace").and_then(|t| t.get("resourceSpans")))
        .or_else(|| json.get("resourceSpans"))
        .and_then(Value::as_array)
        .ok_or("trace JSON without batches/resourceSpans")?;
    let mut spans = Vec::new();
    for batch in batches {
        let resource = attributes(batch.get("resource").and_then(|r| r.get("attributes")));
        let scopes = batch
            .get("scopeSpans")
            .or_else(|| batch.get("instrumentationLibrarySpans"))
            .and_then(Value::as_array);
        for scope in scopes.into_iter().flatten() {
            for span in scope
                .get("spans")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let id = |key: &str, len: usize| {
                    span.get(key)
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                        .and_then(|s| id_to_hex(s, len))
                };
                let trace_id = id("traceId", 16).ok_or("span without a valid traceId")?;
                let span_id = id("spanId", 8).ok_or("span without a valid spanId")?;
                spans.push(TraceSpan {
                    trace_id,
                    span_id,
                    parent_span_id: id("parentSpanId", 8),
                    name: span
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    start_unix_nano: json_u64(span.get("startTimeUnixNano")),
                    end_unix_nano: json_u64(span.get("endTimeUnixNano")),
                    attributes: attributes(span.get("attributes")),
                    resource: resource.clone(),
                });
            }
        }
    }
    Ok(spans)
}

fn json_u64(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn attributes(v: Option<&Value>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kv in v.and_then(Value::as_array).into_iter().flatten() {
        let Some(key) = kv.get("key").and_then(Value::as_str) else {
            continue;
        };
        let value = kv.get("value").map(any_value).unwrap_or_default();
        out.insert(key.to_string(), value);
    }
    out
}

fn any_value(v: &Value) -> String {
    for key in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        if let Some(x) = v.get(key) {
            return match x {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// An answer a real Tempo 3.0.3 gave (`tests/data/tempo-3.0.3/`, its README says how
    /// each was captured).
    fn captured(name: &str) -> Value {
        let path = format!(
            "{}/tests/data/tempo-3.0.3/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn real_tempos_search_answers_parse() {
        let found = parse_search(&captured("search-select.json")).unwrap();
        assert_eq!(
            found.len(),
            3,
            "one span per trace, spanSet and spanSets alike"
        );
        // 31 hex characters on the wire: the leading zero restored.
        assert_eq!(found[0].trace_id, "08b2ea3e5bf00aa94ebedcc9715b8530");
        assert_eq!(found[0].span_id, "1718a1f250da1139");
        assert_eq!(found[0].name, "GET /report");
        assert_eq!(found[0].start_unix_nano, 1_796_529_490_647_507_122);
        assert_eq!(
            found[0].duration_ns, 687_607_017,
            "durationNanos is a string"
        );
        assert_eq!(found[0].attributes["service.version"], "1.5.0");
        assert_eq!(found[0].set_matched, 1);
        let control = parse_search(&captured("search-control.json")).unwrap();
        assert_eq!(control.len(), 3);
        assert!(control
            .iter()
            .all(|f| f.trace_id.len() == 32 && f.attributes["service.version"] == "1.4.0"));
        assert_eq!(control[0].trace_id, "00084962dc40d7eca4d3dfebff18b3a0");
    }

    #[test]
    fn real_tempos_traces_parse_from_both_paths() {
        let v1 = parse_trace(&captured("trace-v1.json")).unwrap();
        let v2 = parse_trace(&captured("trace-v2.json")).unwrap();
        assert_eq!(
            v1, v2,
            "/api/traces and /api/v2/traces carry the same spans"
        );
        let root = &v1[0];
        assert_eq!(root.trace_id, "08b2ea3e5bf00aa94ebedcc9715b8530");
        assert_eq!(root.span_id, "1718a1f250da1139");
        assert_eq!(root.parent_span_id, None);
        assert_eq!(root.resource["service.version"], "1.5.0");
        assert_eq!(
            root.attributes["code.module.name"],
            "otel_profiling_examples::service"
        );
        assert_eq!(root.attributes["pyroscope.profile.id"], root.span_id);
    }

    /// Values in seconds; steps without spans carry no value; samples are not in time
    /// order; the latest valued step is the answer.
    #[test]
    fn real_tempos_quantiles_parse() {
        let m = parse_metrics(&captured("query-range-quantiles.json")).unwrap();
        assert_eq!(m.series.len(), 4);
        assert!(m.series.iter().all(|s| s.labels.contains_key("p")));
        assert_eq!(m.quantile("1.4.0", "0.5"), Some(0.102281743831112));
        assert_eq!(m.quantile("1.4.0", "0.95"), Some(0.221553046348394));
        assert_eq!(m.quantile("1.5.0", "0.5"), Some(0.7977871092357451));
        assert_eq!(m.quantile("1.5.0", "0.95"), Some(1.80581130141917));
        assert_eq!(m.quantile("9.9.9", "0.5"), None);
    }

    #[test]
    fn search_answers_restore_leading_zeros_and_keep_each_span_once() {
        let found = parse_search(&json!({"traces": [{
            "traceID": "abc",
            "spanSets": [
                {"spans": [{"spanID": "1", "name": "GET /x", "startTimeUnixNano": "5",
                    "durationNanos": "7",
                    "attributes": [{"key": "service.version", "value": {"stringValue": "1.4.0"}}]}]},
                {"spans": [{"spanID": "0000000000000001", "name": "GET /x"}]}
            ]
        }]}))
        .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].trace_id, format!("{:0>32}", "abc"));
        assert_eq!(found[0].span_id, "0000000000000001");
        assert_eq!(found[0].duration_ns, 7);
        assert_eq!(found[0].attributes["service.version"], "1.4.0");
        assert!(parse_search(&json!({"traces": [{"traceID": "xyz"}]})).is_err());
    }

    /// A server answering each connection's request with `answer(path)`.
    fn serve(answer: fn(&str) -> (u16, String)) -> String {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).map_or(true, |n| n <= 2) {
                        break;
                    }
                }
                let (status, body) = answer(&path);
                let _ = write!(
                    &stream,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        url
    }

    #[test]
    fn a_trace_only_the_v2_path_serves_is_read_from_it() {
        let url = serve(|path| {
            if path.starts_with("/api/v2/traces/") {
                let span = json!({"traceId": "AAAAAAAAAAAAAAAAAAAAAQ==", "spanId": "AAAAAAAAAAE=",
                                  "name": "GET /x"});
                let body = json!({"trace": {"resourceSpans": [
                    {"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}});
                (200, body.to_string())
            } else {
                (404, "trace not found".into())
            }
        });
        let tempo = TempoClient::new(&url).unwrap();
        let trace = tempo.get_trace("1").unwrap().expect("found on the v2 path");
        assert_eq!(trace.spans[0].span_id, "0000000000000001");
        // Unknown on both paths: none, not an error.
        let none = TempoClient::new(&serve(|_| (404, String::new()))).unwrap();
        assert_eq!(none.get_trace("2").unwrap(), None);
        // Another status names the request and the answer.
        let bad = TempoClient::new(&serve(|_| (503, "ingester down".into()))).unwrap();
        let e = bad.get_trace("3").unwrap_err().to_string();
        assert!(e.contains("/api/traces/3: HTTP 503: ingester down"), "{e}");
    }

    #[test]
    fn quantile_series_are_found_by_version_and_p() {
        let m = parse_metrics(&json!({"series": [
            {"labels": [{"key": "resource.service.version", "value": {"stringValue": "1.5.0"}},
                        {"key": "p", "value": {"doubleValue": 0.95}}],
             "samples": [{"timestampMs": "1000", "value": 1.25}]},
            {"labels": [{"key": "resource.service.version", "value": {"stringValue": "1.5.0"}},
                        {"key": "p", "value": {"doubleValue": 0.5}}],
             "samples": [{"timestampMs": "1000", "value": 1.0}]}
        ]}))
        .unwrap();
        assert_eq!(m.quantile("1.5.0", "0.95"), Some(1.25));
        assert_eq!(m.quantile("1.5.0", "0.5"), Some(1.0));
        assert_eq!(m.quantile("1.4.0", "0.5"), None);
    }

    #[test]
    fn a_trace_names_its_local_roots_and_their_descendants() {
        let batch = |service: &str, spans: Vec<Value>| {
            json!({"resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": service}}]},
                "scopeSpans": [{"spans": spans}]})
        };
        let span = |id: &str, parent: &str, start: u64, end: u64| {
            json!({"traceId": "AAAAAAAAAAAAAAAAAAAAAQ==", "spanId": id, "parentSpanId": parent,
                   "name": id, "startTimeUnixNano": start.to_string(),
                   "endTimeUnixNano": end.to_string()})
        };
        let answer = json!({"batches": [
            batch("front", vec![span("0000000000000001", "", 0, 100)]),
            batch("back", vec![
                span("0000000000000002", "0000000000000001", 10, 90),
                span("0000000000000003", "0000000000000002", 20, 30),
            ]),
        ]});
        let spans = parse_trace(&answer).unwrap();
        let trace = Trace {
            otlp_json: normalized(&answer),
            spans,
        };
        let roots: Vec<&str> = trace
            .local_roots()
            .iter()
            .map(|s| s.span_id.as_str())
            .collect();
        assert_eq!(roots, ["0000000000000001", "0000000000000002"]);
        assert_eq!(
            trace.slowest_local_root().unwrap().span_id,
            "0000000000000001"
        );
        let back = trace.span("0000000000000002").unwrap();
        let below: Vec<&str> = trace
            .local_descendants(back)
            .iter()
            .map(|s| s.span_id.as_str())
            .collect();
        assert_eq!(below, ["0000000000000003"]);
        assert_eq!(
            trace.otlp_json["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"],
            "00000000000000000000000000000001"
        );
    }
}
