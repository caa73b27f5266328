//! # otel-profiling
//!
//! Ties OpenTelemetry spans to continuous CPU profiles, so that a slow span in Grafana
//! links to the CPU samples taken while it ran, and to nothing else.
//!
//! Two halves meet in one per-thread record:
//!
//! ```text
//!  span hooks (every enter/exit, every poll)         CPU sampler (signal, same thread)
//!  ─────────────────────────────────────────         ─────────────────────────────────
//!  ProfilingLayer (tracing)        ─┐                 reads SpanContextCell::read()
//!  ProfilingContext (plain OTel)   ─┼─► SpanContextCell ──► span_id / trace_id / span_name
//!  SpanContextGuard (by hand)      ─┘   (one word, TLS)     labels on that sample
//!
//!  ProfileIdSpanProcessor (opentelemetry_sdk): local root spans get
//!  `pyroscope.profile.id` = their span id, which Grafana uses to find those samples.
//! ```
//!
//! * [`ProfileIdSpanProcessor`] marks local root spans (parent absent or remote) with
//!   [`PROFILE_ID_ATTRIBUTE`]; [`ProfileIdScope`] chooses none / local roots / all spans.
//! * [`ProfilingLayer`] follows `tracing` spans, beside `tracing-opentelemetry`, in either
//!   registration order.
//! * [`ProfilingContext`] and [`ProfilingFutureExt`] follow spans of the plain
//!   OpenTelemetry API on every poll or call.
//! * [`current_local_root`] tells what a sample taken now on this thread would carry.
//!
//! Cargo features, all default-on: `pyroscope` (push profiles), `otlp-http` and `otlp-grpc`
//! (export spans), `tls` (`https://` for the HTTP ones). Without them profiles and spans go
//! to local files only ([`local_sink`]); see docs/features.md.
//!
//! Labels are always the thread's *local root* span: the span whose id Grafana's link
//! queries. Unsampled traces keep only the root's name by default ([`UnsampledTraces`]).
#![warn(missing_docs, unreachable_pub)]

/// The README's Rust blocks that are not marked `ignore` are compiled as doc tests (e.g.
/// composing `guard.layer()` with an existing subscriber).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The one-call setup's complete service and composed subscriber (`docs/setup.md`), compiled
/// as doc tests like the README's blocks.
#[cfg(doctest)]
#[doc = include_str!("../../docs/setup.md")]
pub struct SetupDoctests;

// The data path, one folder per stage (see the layout table in docs/developing.md):
//
//   hooks (span start/enter/exit/end) ─► record (per-thread span record) ◄─ sampler
//   (signal handler) ─► collector (symbolize, aggregate) ─► pprof ─► export (Pyroscope,
//   OTLP, local files); setup wires them together.
pub mod allocations;
pub mod collector;
pub mod export;
mod fork;
mod hooks;
pub mod pprof;
mod record;
pub mod sampler;
mod setup;
// The protocols' atomics: `std`'s, or loom's under `--cfg loom` (the models).
mod sync;

// Public paths from before the folders, and short crate-internal ones.
pub use allocations::ProfilingAllocator;
pub(crate) use collector::symbolize;
pub use export::local_sink;
#[cfg(feature = "axum")]
pub use hooks::axum;
pub(crate) use hooks::{evidence, layer, local_root, otel_scope, processor};
pub use record::thread_ctx;
pub(crate) use record::{clock, label, never_freed, root_cpu, span_context, span_name};
pub use setup::config;
pub(crate) use setup::profiler;

pub use evidence::{
    CpuEvidenceProcessor, ALLOC_BYTES_ATTRIBUTE, ALLOC_COUNT_ATTRIBUTE, CGROUP_CPU_LIMIT_ATTRIBUTE,
    CGROUP_THROTTLED_ATTRIBUTE, CPU_SAMPLES_ATTRIBUTE, CPU_TIME_ATTRIBUTE,
    EVIDENCE_MISSING_ATTRIBUTE, ORPHAN_AGE, WALL_ACTIVE_ATTRIBUTE, WALL_QUEUED_ATTRIBUTE,
    WALL_RUNQUEUE_ATTRIBUTE,
};
pub use layer::ProfilingLayer;
pub use local_root::UnsampledTraces;
pub use otel_scope::{ProfiledFuture, ProfilingContext, ProfilingFutureExt};
pub use processor::{ProfileIdScope, ProfileIdSpanProcessor, PROFILE_ID_ATTRIBUTE};
pub use profiler::{Profiler, ProfilerBuilder, ProfilerError, ProfilerStats};
pub use record::stats::{record_stats, set_max_live_roots, RecordStats, DEFAULT_MAX_LIVE_ROOTS};
pub use setup::{
    resource_series_labels, HealthStats, SetupError, Telemetry, TelemetryGuard,
    RESOURCE_SERIES_LABELS,
};
pub use span_context::{current_local_root, LocalRoot, RootLabel, SpanContextGuard};
pub use span_name::{span_names_overflowed, SpanName, MAX_SPAN_NAMES};

/// Not part of the API (no semver guarantee, hidden from the docs): what the workspace's
/// own tests share with the crate so that each protocol has one implementation. Only with
/// the `test-support` feature, which the bridge's tests and the integration tests enable.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod test_support {
    /// Sets the length from which a stretch inside a root reads the thread's clocks
    /// (250 µs; `record/span_context/active.rs`): the instruction benchmarks raise it,
    /// since under valgrind every poll would otherwise last that long.
    pub fn set_long_stretch_ns(ns: u64) {
        crate::span_context::active::set_long_ns(ns);
    }

    /// One reading of the calling thread's CPU clock and run delay, as a long stretch's
    /// end makes it (`record/span_context/own_clocks.rs`): true if both were read.
    pub fn read_own_clocks() -> bool {
        crate::span_context::own_clocks::read().is_some_and(|r| r.delay_ns.is_some())
    }

    /// Pyroscope's `push.v1` messages, the exporter's own (`export/pyroscope/proto.rs`).
    #[cfg(feature = "pyroscope")]
    pub mod push_v1 {
        pub use crate::export::pyroscope::proto::{
            LabelPair, PushRequest, RawProfileSeries, RawSample,
        };
    }
}
