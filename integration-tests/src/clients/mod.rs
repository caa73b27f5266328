//! Clients for the real APIs — the same code runs against the stand-in and a real stack.
//!
//! * [`TempoClient`]: `GET /api/traces/<id>` (OTLP JSON, v1 `batches` or v2 `trace` shape,
//!   ids in base64 as Tempo writes them or in hex).
//! * [`PyroscopeClient`]: `SelectMergeSpanProfile` (Connect JSON) and the Connect push.
//! * [`OtlpClient`]: OTLP/HTTP protobuf `POST /v1/traces`.

mod flamegraph;
mod otlp;
mod pyroscope;
mod tempo;

pub use flamegraph::{FlameGraph, FlameNode};
pub use otlp::OtlpClient;
pub use pyroscope::{
    grafana_label_selector, ClientError, PushError, PyroscopeClient, SpanProfileQuery,
};
pub use tempo::{TempoClient, TraceSpan};

use std::time::Duration;

/// The HTTP client all clients share: bounded timeouts, no proxies.
fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("building a plain HTTP client cannot fail")
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses hex into bytes (`None` when malformed).
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// An id as Tempo's JSON writes it (base64 of the bytes) or as OTLP/JSON writes it (hex),
/// as lowercase hex of `len` bytes.
pub fn id_to_hex(s: &str, len: usize) -> Option<String> {
    use base64::Engine as _;
    if s.len() == 2 * len {
        if let Some(bytes) = from_hex(s) {
            return Some(to_hex(&bytes));
        }
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    (bytes.len() == len).then(|| to_hex(&bytes))
}
