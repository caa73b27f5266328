//! Shipping profiles and traces to the real backends.

pub mod otlp;
pub mod pyroscope;
