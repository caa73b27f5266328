//! Pyroscope's Connect push, as the tests send hand-built profiles.

use std::io::Write;

use otel_profiling::test_support::push_v1::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use prost::Message;
use serde_json::Value;

use super::http_client;

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

/// Client of Pyroscope's push API (`http://host:4040`).
#[derive(Debug, Clone)]
pub struct PushClient {
    base: String,
    http: reqwest::blocking::Client,
}

impl PushClient {
    /// A client for Pyroscope at `base`.
    pub fn new(base: &str) -> PushClient {
        PushClient {
            base: base.trim_end_matches('/').to_string(),
            http: http_client(),
        }
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
