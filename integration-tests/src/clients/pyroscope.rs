//! Pyroscope's span profile query and push API.

use std::collections::BTreeMap;
use std::io::Write;

use otel_profiling::export::pyroscope::PROFILE_TYPE_ID;
use otel_profiling::test_support::push_v1::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use otel_profiling::RESOURCE_SERIES_LABELS;
use prost::Message;
use serde_json::{json, Value};

use super::{http_client, FlameGraph, TraceSpan};

/// Errors of the clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// Transport failure.
    Http(String),
    /// Non-success status.
    Status {
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
    /// The answer could not be decoded.
    Decode(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Http(e) => write!(f, "{e}"),
            ClientError::Status { status, body } => write!(f, "HTTP {status}: {body}"),
            ClientError::Decode(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// A rejected push: HTTP status and the Connect error code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushError {
    /// HTTP status (0 for a transport failure).
    pub status: u16,
    /// Connect code, e.g. `invalid_argument`.
    pub code: String,
    /// Connect message.
    pub message: String,
}

/// `SelectMergeSpanProfileRequest`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanProfileQuery {
    /// e.g. `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
    pub profile_type_id: String,
    /// Prometheus-style label selector.
    pub label_selector: String,
    /// Span ids (16 hex).
    pub span_selector: Vec<String>,
    /// Start, ms since the Unix epoch.
    pub start_ms: i64,
    /// End, ms since the Unix epoch.
    pub end_ms: i64,
}

/// The label selector Grafana builds for "Profiles for this span": the span's resource
/// attributes mapped to series labels per [`RESOURCE_SERIES_LABELS`] (the provisioned
/// `tracesToProfiles.tags`), in that order, `=` matchers.
pub fn grafana_label_selector(resource: &BTreeMap<String, String>) -> String {
    let mut labels: Vec<(&str, &str)> = Vec::new();
    for (key, label) in RESOURCE_SERIES_LABELS {
        if let Some(value) = resource.get(*key) {
            labels.retain(|(l, _)| l != label);
            labels.push((label, value));
        }
    }
    let terms: Vec<String> = labels
        .iter()
        .map(|(l, v)| format!("{l}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", terms.join(","))
}

impl SpanProfileQuery {
    /// The query Grafana runs for a span: label selector from its resource, profile type
    /// [`PROFILE_TYPE_ID`], span selector = its span id, time range = the span ±60 s.
    pub fn for_span(span: &TraceSpan) -> SpanProfileQuery {
        let start_ms = (span.start_unix_nano / 1_000_000) as i64 - 60_000;
        let end_ms = span.end_unix_nano.div_ceil(1_000_000) as i64 + 60_000;
        SpanProfileQuery {
            profile_type_id: PROFILE_TYPE_ID.to_string(),
            label_selector: grafana_label_selector(&span.resource),
            span_selector: vec![span.span_id.clone()],
            start_ms,
            end_ms,
        }
    }
}

/// Client of Pyroscope's HTTP API (`http://host:4040`).
#[derive(Debug, Clone)]
pub struct PyroscopeClient {
    base: String,
    http: reqwest::blocking::Client,
}

impl PyroscopeClient {
    /// A client for Pyroscope at `base`.
    pub fn new(base: &str) -> PyroscopeClient {
        PyroscopeClient {
            base: base.trim_end_matches('/').to_string(),
            http: http_client(),
        }
    }

    /// `POST /querier.v1.QuerierService/SelectMergeSpanProfile` (Connect JSON).
    pub fn select_merge_span_profile(
        &self,
        query: &SpanProfileQuery,
    ) -> Result<FlameGraph, ClientError> {
        let url = format!(
            "{}/querier.v1.QuerierService/SelectMergeSpanProfile",
            self.base
        );
        let body = json!({
            "profileTypeID": query.profile_type_id,
            "labelSelector": query.label_selector,
            "spanSelector": query.span_selector,
            "start": query.start_ms.to_string(),
            "end": query.end_ms.to_string(),
        });
        let response = self
            .http
            .post(&url)
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .body(body.to_string())
            .send()
            .map_err(|e| ClientError::Http(format!("POST {url}: {e}")))?;
        let status = response.status();
        let text = response
            .text()
            .map_err(|e| ClientError::Http(format!("POST {url}: {e}")))?;
        if !status.is_success() {
            return Err(ClientError::Status {
                status: status.as_u16(),
                body: text,
            });
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ClientError::Decode(format!("POST {url}: {e}")))?;
        FlameGraph::from_json(v.get("flamegraph").unwrap_or(&Value::Null))
    }

    /// `POST /push.v1.PusherService/Push`: one series with `labels` and one raw profile
    /// (pprof, plain or gzipped); the body is protobuf, gzip-encoded.
    pub fn push(&self, labels: &[(&str, &str)], raw_profile: &[u8]) -> Result<(), PushError> {
        let url = format!("{}/push.v1.PusherService/Push", self.base);
        let request = PushRequest {
            series: vec![RawProfileSeries {
                labels: labels
                    .iter()
                    .map(|(n, v)| LabelPair {
                        name: n.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                samples: vec![RawSample {
                    raw_profile: raw_profile.to_vec(),
                    id: format!("{:032x}", nanos_now()),
                }],
            }],
        };
        let transport = |e: String| PushError {
            status: 0,
            code: "unavailable".into(),
            message: e,
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&request.encode_to_vec())
            .map_err(|e| transport(e.to_string()))?;
        let body = gz.finish().map_err(|e| transport(e.to_string()))?;
        let response = self
            .http
            .post(&url)
            .header("Content-Type", "application/proto")
            .header("Content-Encoding", "gzip")
            .header("Connect-Protocol-Version", "1")
            .body(body)
            .send()
            .map_err(|e| transport(format!("POST {url}: {e}")))?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(());
        }
        let text = response.text().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        Err(PushError {
            status,
            code: v
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or(text),
        })
    }
}

fn nanos_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
