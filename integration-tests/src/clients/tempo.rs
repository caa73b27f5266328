//! Tempo's trace-by-id API.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{http_client, id_to_hex, ClientError};

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

/// Client of Tempo's HTTP API (`http://host:3200`).
#[derive(Debug, Clone)]
pub struct TempoClient {
    base: String,
    http: reqwest::blocking::Client,
}

impl TempoClient {
    /// A client for the Tempo API at `base` (e.g. `http://localhost:3200`).
    pub fn new(base: &str) -> TempoClient {
        TempoClient {
            base: base.trim_end_matches('/').to_string(),
            http: http_client(),
        }
    }

    /// `GET /api/traces/<trace id>`: the trace's spans, `Ok(None)` when Tempo does not know
    /// it (yet).
    pub fn get_trace(&self, trace_id: &str) -> Result<Option<Vec<TraceSpan>>, ClientError> {
        let url = format!("{}/api/traces/{trace_id}", self.base);
        let response = self
            .http
            .get(&url)
            .header("Accept", "application/json")
            .send()
            .map_err(|e| ClientError::Http(format!("GET {url}: {e}")))?;
        let status = response.status();
        let body = response
            .text()
            .map_err(|e| ClientError::Http(format!("GET {url}: {e}")))?;
        if status.as_u16() == 404 {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(ClientError::Status {
                status: status.as_u16(),
                body,
            });
        }
        let json: Value = serde_json::from_str(&body)
            .map_err(|e| ClientError::Decode(format!("GET {url}: {e}")))?;
        let spans = parse_trace(&json)?;
        Ok((!spans.is_empty()).then_some(spans))
    }
}

/// Parses Tempo's v1 (`{"batches": [...]}`) or v2 (`{"trace": {"resourceSpans": [...]}}`)
/// answer, or plain OTLP JSON (`{"resourceSpans": [...]}`).
pub fn parse_trace(json: &Value) -> Result<Vec<TraceSpan>, ClientError> {
    let batches = json
        .get("batches")
        .or_else(|| json.get("trace").and_then(|t| t.get("resourceSpans")))
        .or_else(|| json.get("resourceSpans"))
        .and_then(Value::as_array)
        .ok_or_else(|| ClientError::Decode("trace JSON without batches/resourceSpans".into()))?;
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
                let trace_id = id("traceId", 16)
                    .ok_or_else(|| ClientError::Decode("span without a valid traceId".into()))?;
                let span_id = id("spanId", 8)
                    .ok_or_else(|| ClientError::Decode("span without a valid spanId".into()))?;
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
