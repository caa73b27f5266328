//! OTLP/HTTP protobuf trace export (`POST /v1/traces`).

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use super::http_client;

/// Sends hand-built OTLP requests (for tests that need spans the SDK would not produce).
#[derive(Debug, Clone)]
pub struct OtlpClient {
    url: String,
    http: reqwest::blocking::Client,
}

impl OtlpClient {
    /// A client for the OTLP/HTTP endpoint `base` (`/v1/traces` is appended).
    pub fn new(base: &str) -> OtlpClient {
        OtlpClient {
            url: format!("{}/v1/traces", base.trim_end_matches('/')),
            http: http_client(),
        }
    }

    /// Exports `request`.
    pub fn export(&self, request: &ExportTraceServiceRequest) -> Result<(), String> {
        let response = self
            .http
            .post(&self.url)
            .header("Content-Type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .map_err(|e| format!("POST {}: {e}", self.url))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!(
                "POST {}: HTTP {}: {}",
                self.url,
                status.as_u16(),
                response.text().unwrap_or_default()
            ))
        }
    }
}
