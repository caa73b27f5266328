//! The Tempo half of the stand-in: OTLP/HTTP ingest, the v1 trace-by-id API, TraceQL
//! search (`GET /api/search`, the subset of [`super::traceql`]) and TraceQL metrics
//! (`GET /api/metrics/query_range`, `quantile_over_time` of `duration` only).

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};

use super::traceql::{parse_metrics_query, parse_traceql, Attribute, MetricsQuery, TraceQuery};

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

/// The most buckets (`(end - start) / step`, rounded up) a metrics query may span.
pub const MAX_METRICS_BUCKETS: u64 = 1_000;

const NANOS_PER_S: u64 = 1_000_000_000;

/// A parsed `GET /api/metrics/query_range` request.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsRequest {
    /// The TraceQL metrics query (`q`, required).
    pub query: MetricsQuery,
    /// `start`, seconds since the Unix epoch: the first bucket starts here.
    pub start_s: u64,
    /// `end`, seconds since the Unix epoch, exclusive.
    pub end_s: u64,
    /// `step`, nanoseconds: the width of a bucket.
    pub step_ns: u64,
}

impl MetricsRequest {
    /// Parses the URL query string of a `query_range`. `Err` is the text of the 400
    /// answer. `q`, `start` and `end` are required (the stand-in does not guess a window)
    /// and `end` must be after `start`; `step` is a duration (`60s`, `1m30s`, `500ms`) or
    /// a number of seconds, absent: `(end - start) / 100` rounded up to whole seconds, at
    /// least 1 s. More than [`MAX_METRICS_BUCKETS`] buckets are refused.
    pub fn from_query_string(raw: &str) -> Result<MetricsRequest, String> {
        let (mut query, mut start_s, mut end_s, mut step_ns) = (None, None, None, None);
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
                "q" => query = Some(parse_metrics_query(&value)?),
                "start" => start_s = Some(number("start")?),
                "end" => end_s = Some(number("end")?),
                "step" => step_ns = Some(step_nanos(&value)?),
                // Tempo ignores parameters it does not know.
                _ => {}
            }
        }
        let query = query.ok_or("q (the TraceQL metrics query) is required")?;
        let (Some(start_s), Some(end_s)) = (start_s, end_s) else {
            return Err(
                "the stand-in supports only query_range with start and end (seconds since the \
                 Unix epoch)"
                    .into(),
            );
        };
        if end_s <= start_s {
            return Err(format!(
                "http parameter start must be before end: start {start_s}, end {end_s}"
            ));
        }
        let window_ns = (end_s - start_s).saturating_mul(NANOS_PER_S);
        let step_ns = step_ns.unwrap_or_else(|| {
            (end_s - start_s)
                .div_ceil(100)
                .max(1)
                .saturating_mul(NANOS_PER_S)
        });
        let buckets = window_ns.div_ceil(step_ns);
        if buckets > MAX_METRICS_BUCKETS {
            return Err(format!(
                "{buckets} buckets of step {step_ns} ns between start and end exceed the \
                 stand-in's limit of {MAX_METRICS_BUCKETS} (raise step)"
            ));
        }
        Ok(MetricsRequest {
            query,
            start_s,
            end_s,
            step_ns,
        })
    }
}

/// A `step`: a number of seconds (`60`, `0.5`) or a duration, one or more
/// `<number><unit>` (`60s`, `1m30s`, `500ms`; units ns us µs ms s m h), in nanoseconds;
/// 0 refused.
fn step_nanos(text: &str) -> Result<u64, String> {
    let invalid = || format!("invalid step {text:?}: a duration such as 60s, or seconds");
    let text = text.trim();
    let seconds = |n: &str| n.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
    let nanos = if let Some(v) = seconds(text) {
        v * 1e9
    } else {
        let mut total = 0.0;
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(invalid)?;
            let unit_len = rest[digits..]
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len() - digits);
            let value = seconds(&rest[..digits]).ok_or_else(invalid)?;
            let per_unit = super::traceql::nanos_per_unit(&rest[digits..digits + unit_len])
                .ok_or_else(invalid)?;
            total += value * per_unit;
            rest = &rest[digits + unit_len..];
        }
        total
    };
    match nanos.round() {
        n if n < 1.0 => Err(format!("invalid step {text:?}: it must be positive")),
        n if n >= u64::MAX as f64 => Err(invalid()),
        n => Ok(n as u64),
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
            // The trace's spans per service (Tempo's `serviceStats`; its `errorCount` is
            // left out at 0, as protobuf JSON leaves out zeros).
            let mut per_service: BTreeMap<&str, u64> = BTreeMap::new();
            for s in spans.iter() {
                *per_service
                    .entry(service_name(s.resource.as_ref()).unwrap_or_default())
                    .or_default() += 1;
            }
            trace["serviceStats"] = per_service
                .into_iter()
                .map(|(service, n)| (service.to_owned(), json!({ "spanCount": n })))
                .collect::<serde_json::Map<String, Value>>()
                .into();
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

/// The `q` quantile of `durations` (ns, not empty) as Tempo's `quantile_over_time`
/// estimates it, in ns: each duration counts in its log2 bucket (the next power of two at
/// or above it; 0 and 1 ns in the 1 ns bucket); the rank is `ceil(q·n)`, at least 1; a
/// rank that ends a bucket answers that bucket's bound, else the value is interpolated
/// exponentially between the previous (non-empty) bucket's bound (half this one's for
/// the first) and this one's, by the share of this bucket's count the rank reaches. So
/// a p50 of 100–1000 ms spans reads 2^29 ns, 536.9 ms: an estimate within a factor of
/// two, never an observed duration.
fn log2_quantile(durations: &[u64], q: f64) -> f64 {
    let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
    for &d in durations {
        *buckets.entry(d.max(1).next_power_of_two()).or_default() += 1;
    }
    let n = durations.len() as u64;
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n.max(1));
    let (mut below, mut previous) = (0u64, None::<u64>);
    for (&bound, &count) in &buckets {
        if below + count < rank {
            below += count;
            previous = Some(bound);
            continue;
        }
        if below + count == rank {
            return bound as f64;
        }
        let share = (rank - below) as f64 / count as f64;
        let high = (bound as f64).log2();
        let low = previous.map_or(high - 1.0, |p| (p as f64).log2());
        return (low + (high - low) * share).exp2();
    }
    buckets.keys().last().map_or(0.0, |&b| b as f64)
}

/// A label value as Prometheus' text form writes it (strings quoted).
fn prom_value(value: &Value) -> String {
    let quote = |s: &str| {
        let escaped: String = s
            .chars()
            .flat_map(|c| match c {
                '\\' => vec!['\\', '\\'],
                '"' => vec!['\\', '"'],
                '\n' => vec!['\\', 'n'],
                c => vec![c],
            })
            .collect();
        format!("\"{escaped}\"")
    };
    match value.as_object().and_then(|o| o.iter().next()) {
        Some((_, Value::String(s))) => quote(s),
        Some((_, other)) => quote(&other.to_string()),
        None => quote(""),
    }
}

impl TempoStore {
    /// Tempo v3's `GET /api/metrics/query_range` answer (its `QueryRangeResponse` as
    /// JSON) for `quantile_over_time(duration, ...) [by (<attr>)]`.
    ///
    /// The spans that pass the filter and start in `[start, end)` fall in bucket `i` when
    /// they start in `[start + i·step, start + (i+1)·step)`; they are grouped by the `by`
    /// attribute's value (`name`: the span name). Spans without that attribute form a
    /// series of their own whose labels lack the `by` key (rather than being left out).
    /// Each (group, quantile) is one series, labelled with the `by` attribute under its
    /// text as written and `p` (the quantile, a double), with one sample per bucket that
    /// has a span: `timestampMs` the bucket's start, `value` the quantile of the bucket's
    /// durations in seconds, estimated as Tempo 3 does from log2 duration buckets
    /// (`log2_quantile`); every other step of the window is a sample without `value`,
    /// as Tempo answers steps without spans. Series are ordered by group, then quantile
    /// as written. `inspectedSpans` counts the spans starting in the window, matching or
    /// not.
    pub fn query_range(&self, request: &MetricsRequest) -> Value {
        let from = request.start_s.saturating_mul(NANOS_PER_S);
        let to = request.end_s.saturating_mul(NANOS_PER_S);
        let query = &request.query;
        let mut inspected = 0u64;
        // Group (its label value as JSON, keyed by that JSON's text) → bucket → durations,
        // and the group's exemplars.
        type Buckets = BTreeMap<u64, Vec<u64>>;
        let mut groups: BTreeMap<Option<String>, (Option<Value>, Buckets)> = BTreeMap::new();
        let mut exemplars: BTreeMap<Option<String>, Vec<Exemplar>> = BTreeMap::new();
        for stored in self.traces.values().flatten() {
            let span = &stored.span;
            let start = span.start_time_unix_nano;
            if start < from || start >= to {
                continue;
            }
            inspected += 1;
            if !query.filter.matches(stored.resource.as_ref(), span) {
                continue;
            }
            let label = query
                .by
                .as_ref()
                .and_then(|(_, attribute)| match attribute {
                    Attribute::Name => Some(json!({ "stringValue": span.name })),
                    a => a
                        .lookup(stored.resource.as_ref(), span)
                        .map(|v| any_value_json(Some(v))),
                });
            let bucket = (start - from) / request.step_ns;
            let key = label.as_ref().map(Value::to_string);
            let duration_ns = span.end_time_unix_nano.saturating_sub(start);
            let group_exemplars = exemplars.entry(key.clone()).or_default();
            if group_exemplars.len() < EXEMPLARS_PER_GROUP {
                let mut labels = vec![
                    json!({"key": "trace:id", "value": {"stringValue":
                        hex(&span.trace_id).trim_start_matches('0')}}),
                    json!({"key": "resource.service.name", "value": {"stringValue":
                        service_name(stored.resource.as_ref()).unwrap_or_default()}}),
                ];
                if let (Some((by, _)), Some(value)) = (&query.by, &label) {
                    if by != "resource.service.name" && by != "name" {
                        labels.push(json!({"key": by, "value": value}));
                    }
                }
                labels.push(json!({"key": "name", "value": {"stringValue": span.name}}));
                labels.push(json!({"key": "duration", "value": {"stringValue":
                    go_duration(duration_ns)}}));
                group_exemplars.push(Exemplar {
                    bucket,
                    duration_ns,
                    json: json!({
                        "labels": labels,
                        "value": duration_ns as f64 / 1e9,
                        "timestampMs": (start / 1_000_000).to_string(),
                    }),
                });
            }
            groups
                .entry(key)
                .or_insert_with(|| (label, BTreeMap::new()))
                .1
                .entry(bucket)
                .or_default()
                .push(duration_ns);
        }
        let mut series = Vec::new();
        for (key, (label, buckets)) in groups {
            // Each exemplar goes to the quantile series whose value in its step is
            // nearest its duration (as Tempo assigns them).
            let mut assigned: Vec<Vec<Value>> = vec![Vec::new(); query.quantiles.len()];
            for exemplar in exemplars.remove(&key).unwrap_or_default() {
                let Some(durations) = buckets.get(&exemplar.bucket) else {
                    continue;
                };
                let nearest = query
                    .quantiles
                    .iter()
                    .map(|&q| (log2_quantile(durations, q) - exemplar.duration_ns as f64).abs())
                    .enumerate()
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(i, _)| i);
                if let Some(i) = nearest {
                    assigned[i].push(exemplar.json);
                }
            }
            for (qi, &q) in query.quantiles.iter().enumerate() {
                let mut labels = Vec::new();
                let mut prom = Vec::new();
                if let (Some((key, _)), Some(value)) = (&query.by, &label) {
                    labels.push(json!({ "key": key, "value": value }));
                    prom.push((key.clone(), prom_value(value)));
                }
                labels.push(json!({ "key": "p", "value": { "doubleValue": q } }));
                prom.push(("p".to_string(), format!("\"{q}\"")));
                prom.sort();
                let steps = to.saturating_sub(from).div_ceil(request.step_ns.max(1));
                let samples: Vec<Value> = (0..steps)
                    .map(|i| {
                        let at_ms = (from + i * request.step_ns) / 1_000_000;
                        match buckets.get(&i) {
                            Some(durations) => json!({
                                "timestampMs": at_ms.to_string(),
                                "value": log2_quantile(durations, q) / 1e9,
                            }),
                            None => json!({ "timestampMs": at_ms.to_string() }),
                        }
                    })
                    .collect();
                let prom_labels = prom
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut one = json!({
                    "labels": labels,
                    "samples": samples,
                    "promLabels": format!("{{{prom_labels}}}"),
                });
                if !assigned[qi].is_empty() {
                    one["exemplars"] = Value::Array(std::mem::take(&mut assigned[qi]));
                }
                series.push(one);
            }
        }
        json!({
            "series": series,
            "metrics": { "inspectedSpans": inspected.to_string() },
        })
    }
}

/// The most exemplar spans a `query_range` answer carries per group.
const EXEMPLARS_PER_GROUP: usize = 20;

/// A span shown with a metrics series, as Tempo 3 shows one: its trace id (hex without
/// leading zeros), service, the `by` attribute, name and duration as labels.
struct Exemplar {
    bucket: u64,
    duration_ns: u64,
    json: Value,
}

/// A duration as Go's `time.Duration` prints it (`715.63262ms`, `1.5s`, `250µs`, `7ns`),
/// which Tempo's exemplar labels use.
fn go_duration(ns: u64) -> String {
    let (value, unit) = match ns {
        0 => return "0s".to_owned(),
        n if n < 1_000 => return format!("{n}ns"),
        n if n < 1_000_000 => (n as f64 / 1e3, "µs"),
        n if n < 1_000_000_000 => (n as f64 / 1e6, "ms"),
        n => (n as f64 / 1e9, "s"),
    };
    let text = format!("{value:.9}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{unit}")
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
    fn the_metrics_query_string_is_checked() {
        let q = "q=%7B%7D+%7C+quantile_over_time(duration%2C+.5)";
        let r =
            MetricsRequest::from_query_string(&format!("{q}&start=100&end=400&step=60s")).unwrap();
        assert_eq!((r.start_s, r.end_s, r.step_ns), (100, 400, 60 * S));
        assert_eq!(r.query.quantiles, [0.5]);
        for (step, ns) in [
            ("30", 30 * S),
            ("0.5", S / 2),
            ("1m30s", 90 * S),
            ("500ms", S / 2),
            ("1h", 3_600 * S),
        ] {
            let r = MetricsRequest::from_query_string(&format!("{q}&start=0&end=100&step={step}"))
                .expect(step);
            assert_eq!(r.step_ns, ns, "{step}");
        }
        // Default step: a hundredth of the window, rounded up to whole seconds, ≥ 1 s.
        for (end, step_s) in [(3_600, 36), (150, 2), (50, 1), (100_000, 1_000)] {
            let r = MetricsRequest::from_query_string(&format!("{q}&start=0&end={end}")).unwrap();
            assert_eq!(r.step_ns, step_s * S, "end {end}");
        }
        assert!(
            MetricsRequest::from_query_string(&format!("{q}&start=0&end=1000&step=1s")).is_ok()
        );
        for (bad, says) in [
            (
                "start=0&end=10",
                "q (the TraceQL metrics query) is required",
            ),
            (&format!("{q}&start=10&end=10"), "start must be before end"),
            (&format!("{q}&start=20&end=10"), "start must be before end"),
            (&format!("{q}&end=10"), "with start and end"),
            (&format!("{q}&start=0&end=1001&step=1s"), "limit of 1000"),
            (&format!("{q}&start=0&end=10&step=0"), "positive"),
            (&format!("{q}&start=0&end=10&step=1d"), "invalid step"),
            (&format!("{q}&start=0&end=10&step=s"), "invalid step"),
            (
                "q=%7B%7D+%7C+rate()&start=0&end=10",
                "the stand-in supports only",
            ),
            ("q=&start=0&end=10", "the stand-in supports only"),
        ] {
            let e = MetricsRequest::from_query_string(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn quantiles_are_per_bucket_group_and_quantile_in_seconds() {
        let with_version = |version: &str, spans: Vec<Span>| {
            let mut store = TempoStore::default();
            ingest(&mut store, "api", spans);
            for stored in store.traces.values_mut().flatten() {
                stored.resource.as_mut().unwrap().attributes[1] = kv("service.version", version);
            }
            store
        };
        // Version 1.5.0: bucket [100, 160) has 100, 200, ..., 1000 ms; [160, 220) is empty;
        // [220, 280) has 7 ms. Version 2.0.0 in [100, 160): 3 s. One span of another name,
        // one starting at end (excluded), one before start.
        let mut spans: Vec<Span> = (1..=10u8)
            .map(|i| span(1, i, 0, "GET /x", 100 + u64::from(i), 100 * u64::from(i)))
            .collect();
        spans.push(span(2, 1, 0, "GET /x", 279, 7));
        spans.push(span(2, 2, 0, "GET /y", 101, 50_000));
        spans.push(span(2, 3, 0, "GET /x", 400, 1));
        spans.push(span(2, 4, 0, "GET /x", 99, 1));
        let mut s = with_version("1.5.0", spans);
        let other = with_version("2.0.0", vec![span(3, 1, 0, "GET /x", 130, 3_000)]);
        s.traces.extend(other.traces);
        // A span lacking the attribute: its own series, without the label.
        let mut bare = span(4, 1, 0, "GET /x", 150, 42);
        bare.trace_id[14] = 4;
        s.traces.insert(
            bare.trace_id.clone(),
            vec![StoredSpan {
                resource: None,
                scope: None,
                span: bare,
            }],
        );
        let q = r#"{ name = "GET /x" } | quantile_over_time(duration, .5, 0.95) by (resource.service.version)"#;
        let answer = s.query_range(&MetricsRequest {
            query: parse_metrics_query(q).unwrap(),
            start_s: 100,
            end_s: 400,
            step_ns: 60 * S,
        });
        // Everything starting in [100, 400): 10 + 2 of trace 2 + 1 + 1.
        assert_eq!(answer["metrics"]["inspectedSpans"], "14");
        let series = answer["series"].as_array().unwrap();
        assert_eq!(series.len(), 6, "{answer:#}");
        let find = |version: Option<&str>, p: f64| {
            series
                .iter()
                .find(|s| {
                    let labels = s["labels"].as_array().unwrap();
                    let v = labels
                        .iter()
                        .find(|l| l["key"] == "resource.service.version")
                        .map(|l| l["value"]["stringValue"].as_str().unwrap());
                    v == version
                        && labels
                            .iter()
                            .any(|l| l["key"] == "p" && l["value"]["doubleValue"] == p)
                })
                .unwrap_or_else(|| panic!("{version:?} {p}: {answer:#}"))
        };
        // Tempo's estimates (see `quantiles_are_tempos_log2_estimates`), every step of the
        // window present, those without spans without a value.
        let median = find(Some("1.5.0"), 0.5);
        assert_eq!(
            median["samples"],
            json!([
                {"timestampMs": "100000", "value": 0.536870912},
                {"timestampMs": "160000"},
                {"timestampMs": "220000", "value": 0.008388608},
                {"timestampMs": "280000"},
                {"timestampMs": "340000"},
            ])
        );
        assert_eq!(
            median["labels"],
            json!([
                {"key": "resource.service.version", "value": {"stringValue": "1.5.0"}},
                {"key": "p", "value": {"doubleValue": 0.5}},
            ])
        );
        assert_eq!(
            median["promLabels"],
            r#"{p="0.5", resource.service.version="1.5.0"}"#
        );
        // The 10th of 10 for .95: the bound of its bucket.
        assert_eq!(
            find(Some("1.5.0"), 0.95)["samples"][0]["value"],
            1.073741824
        );
        assert_eq!(
            find(Some("2.0.0"), 0.95)["samples"][0],
            json!({"timestampMs": "100000", "value": 4.294967296})
        );
        let bare = find(None, 0.5);
        assert_eq!(
            bare["samples"][0],
            json!({"timestampMs": "100000", "value": 0.067108864})
        );
        assert_eq!(bare["promLabels"], r#"{p="0.5"}"#);
        assert_eq!(bare["labels"].as_array().map(Vec::len), Some(1));

        // Exemplars: each span of a group once, on the quantile series nearest it.
        let exemplars = |s: &Value| s["exemplars"].as_array().map_or(0, Vec::len);
        assert_eq!(
            exemplars(find(Some("1.5.0"), 0.5)) + exemplars(find(Some("1.5.0"), 0.95)),
            11
        );
        let slowest = &find(Some("1.5.0"), 0.95)["exemplars"];
        assert!(
            slowest.as_array().unwrap().iter().any(|e| e["value"] == 1.0
                && e["labels"][2]["key"] == "resource.service.version"
                && e["labels"][4] == json!({"key": "duration", "value": {"stringValue": "1s"}})),
            "{slowest:#}"
        );

        // Without by: one series per quantile; by name groups on the span name.
        let mut answer = s.query_range(&MetricsRequest {
            query: parse_metrics_query("{} | quantile_over_time(duration, 0)").unwrap(),
            start_s: 100,
            end_s: 400,
            step_ns: 300 * S,
        });
        let all = answer["series"][0]["exemplars"].take();
        assert_eq!(
            all.as_array().map(Vec::len),
            Some(14),
            "every span, up to 20"
        );
        answer["series"][0]
            .as_object_mut()
            .unwrap()
            .remove("exemplars");
        assert_eq!(
            answer["series"],
            json!([{
                "labels": [{"key": "p", "value": {"doubleValue": 0.0}}],
                "samples": [{"timestampMs": "100000", "value": 0.008388608}],
                "promLabels": r#"{p="0"}"#,
            }])
        );
        let answer = s.query_range(&MetricsRequest {
            query: parse_metrics_query("{} | quantile_over_time(duration, 1) by (name)").unwrap(),
            start_s: 100,
            end_s: 400,
            step_ns: 300 * S,
        });
        let names: Vec<(&str, &Value)> = answer["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["promLabels"].as_str().unwrap(), &s["samples"][0]["value"]))
            .collect();
        assert_eq!(
            names,
            [
                (r#"{name="GET /x", p="1"}"#, &json!(4.294967296)),
                (r#"{name="GET /y", p="1"}"#, &json!(68.719476736)),
            ]
        );
        // Nothing matching: no series.
        let answer = s.query_range(&MetricsRequest {
            query: parse_metrics_query("{ name = \"none\" } | quantile_over_time(duration, .5)")
                .unwrap(),
            start_s: 100,
            end_s: 400,
            step_ns: 60 * S,
        });
        assert_eq!(answer["series"], json!([]));
    }

    #[test]
    fn durations_print_as_go_prints_them() {
        assert_eq!(go_duration(715_632_620), "715.63262ms");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
        assert_eq!(go_duration(250_000), "250µs");
        assert_eq!(go_duration(7), "7ns");
        assert_eq!(go_duration(0), "0s");
    }

    /// Tempo's estimate: a rank that ends a log2 bucket is its bound, else exponential
    /// interpolation from the previous bucket's bound (half this one's for the first).
    #[test]
    fn quantiles_are_tempos_log2_estimates() {
        const MS: u64 = 1_000_000;
        let spans: Vec<u64> = (1..=10).map(|i| i * 100 * MS).collect();
        // Buckets 2^27 {100}, 2^28 {200}, 2^29 {300, 400, 500}, 2^30 {600..=1000}.
        assert_eq!(log2_quantile(&spans, 0.5), (1u64 << 29) as f64);
        assert_eq!(log2_quantile(&spans, 0.95), (1u64 << 30) as f64);
        assert_eq!(log2_quantile(&spans, 0.0), (1u64 << 27) as f64, "rank 1");
        // Rank 4 of 10: two of the three in 2^29, from 2^28: 2^(28 + 2/3).
        let p = log2_quantile(&spans, 0.4);
        assert!((p - (28.0f64 + 2.0 / 3.0).exp2()).abs() < 1.0, "{p}");
        // First bucket: from half its bound.
        assert!((log2_quantile(&[3, 3, 3, 3], 0.5) - 1.5f64.exp2()).abs() < 1e-9);
        assert_eq!(log2_quantile(&[0], 1.0), 1.0);
        assert_eq!(log2_quantile(&[7 * MS], 0.5), (1u64 << 23) as f64);
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
