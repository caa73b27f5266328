//! The per-thread span record and what it names: the local root a thread works for now
//! (read by the signal handler at sample time), the interned span names, the roots' CPU
//! and active-time counters, the clock of active time, and the OTEP 4947 thread context
//! that out-of-process profilers read.

pub(crate) mod clock;
pub(crate) mod label;
pub(crate) mod never_freed;
pub(crate) mod root_cpu;
pub(crate) mod span_context;
pub(crate) mod span_name;
pub(crate) mod stats;
pub mod thread_ctx;
