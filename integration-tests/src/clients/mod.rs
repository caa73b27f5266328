//! Clients for the real APIs — the same code runs against the stand-in and a real stack.
//!
//! The query clients are the published `otel-profiling-query` crate's, re-exported:
//! * [`TempoClient`]: `GET /api/traces/<id>` (OTLP JSON, v1 `batches` or v2 `trace` shape,
//!   ids in base64 as Tempo writes them or in hex) and TraceQL search;
//! * [`PyroscopeClient`]: `SelectMergeSpanProfile`, `SelectMergeStacktraces`,
//!   `LabelValues` (Connect JSON).
//!
//! The ingest clients are the tests' own:
//! * [`PushClient`]: Pyroscope's Connect push;
//! * [`OtlpClient`]: OTLP/HTTP protobuf `POST /v1/traces`.

mod otlp;
mod push;

pub use otel_profiling_query::ids::{from_hex, id_to_hex, to_hex};
pub use otel_profiling_query::{
    grafana_label_selector, Auth, FlameGraph, FlameNode, PyroscopeClient, QueryError,
    SpanProfileQuery, TempoClient, Trace, TraceSpan,
};
pub use otlp::OtlpClient;
pub use push::{PushClient, PushError};

use std::time::Duration;

/// The HTTP client the ingest clients share: bounded timeouts, no proxies.
fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("building a plain HTTP client cannot fail")
}
