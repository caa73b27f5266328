//! Shipping profiles and traces to the real backends.

pub mod pyroscope;
