//! Shipping profiles and traces to the real backends.

#[cfg(feature = "otlp-grpc")]
mod grpc_channel;
pub mod local_budget;
pub mod local_sink;
mod log_limiter;
pub mod otlp;
pub mod otlp_profiles;
pub mod pyroscope;
mod span_json;
pub mod span_stats;
pub mod tls;
