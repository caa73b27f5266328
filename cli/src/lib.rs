//! The local span report: what otel-profiling's local sink wrote, read back per span.
//!
//! The local sink writes `<UTC stamp>_cpu.pb.gz` (pprof CPU profiles whose samples carry
//! `span_id`, `trace_id` and `span_name` labels) and `<UTC stamp>_spans.jsonl` (OTLP JSON
//! spans, local roots with `pyroscope.profile.id` and `profiling.cpu.*`). This crate
//! reads one or more such directories and answers, per span:
//!
//! * [`report::SpanReport`]: per (span name, `service.version`), wall time p50/p95 against
//!   the CPU time the profile and the span attributes record, a verdict (CPU-bound,
//!   mixed, waiting) with its reason, and the top functions by self and total CPU, the
//!   user's own crates first ([`functions::library_group`]);
//! * [`flame::FlameGraph`]: an SVG flame graph of one span id or one span name;
//! * [`diff::VersionDiff`]: one span name in two versions or two directories, per
//!   request: each side's split and verdict (as the report's), which part of the wall
//!   time grew, and the functions whose CPU grew most;
//! * [`html::HtmlReport`]: all of it as one self-contained HTML page, with where the wall
//!   time went ([`split::TimeSplit`]: CPU, blocked in a poll, awaiting) drawn as bars.
//!
//! ```no_run
//! # fn main() -> Result<(), otel_profiling_cli::ReportError> {
//! use std::path::PathBuf;
//! use otel_profiling_cli::report::SpanReport;
//!
//! let report = SpanReport::from_dirs(&[PathBuf::from("target/otel-profiling")])?;
//! println!("{report}");
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod concurrent;
pub mod dependencies;
pub mod diff;
pub mod error;
pub mod flame;
mod format;
pub mod functions;
pub mod html;
pub mod ids;
pub mod input;
#[cfg(feature = "backends")]
pub mod investigate;
pub mod ownership;
pub mod report;
pub mod split;
pub mod stats;
pub mod verdict;

pub use error::ReportError;
