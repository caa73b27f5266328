//! Blocking clients for the query APIs of **Grafana Tempo** and **Grafana Pyroscope**, as
//! otel-profiling's `investigate` command and its verification checklist read them.
//!
//! * [`TempoClient`]: a trace by id (`GET /api/traces/<id>`, v1 `batches` and v2 `trace`
//!   shapes) and TraceQL search (`GET /api/search`);
//! * [`PyroscopeClient`]: a span's profile exactly as Grafana's "Profiles for this span"
//!   selects it (`SelectMergeSpanProfile` with the span selector and the series labels
//!   mapped from the span's resource, [`SpanProfileQuery::for_span`]), a workload's
//!   profile over an interval (`SelectMergeStacktraces`) and label values
//!   (`LabelValues`, e.g. the profile types a workload has);
//! * [`Auth`]: bearer token, basic auth and the `X-Scope-OrgID` tenant, from the same
//!   environment variables the exporter reads, so the clients work against Grafana Cloud.
//!
//! Every request is bounded by a timeout, and every failure names the request and what
//! the backend answered ([`QueryError`]).
//!
//! ```no_run
//! use otel_profiling_query::{Auth, PyroscopeClient, SpanProfileQuery, TempoClient};
//!
//! # fn main() -> Result<(), otel_profiling_query::QueryError> {
//! let tempo = TempoClient::new("http://localhost:3200")?.with_auth(Auth::from_env("TEMPO")?);
//! let pyroscope = PyroscopeClient::new("http://localhost:4040")?;
//! let trace = tempo
//!     .get_trace("0af7651916cd43dd8448eb211c80319c")?
//!     .expect("Tempo knows the trace");
//! let root = trace.slowest_local_root().expect("a local root");
//! let graph = pyroscope.select_merge_span_profile(&SpanProfileQuery::for_span(root))?;
//! println!("{} ns of CPU in {}", graph.total, root.name);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod auth;
mod error;
mod flamegraph;
mod http;
pub mod ids;
mod pyroscope;
mod tempo;

pub use auth::Auth;
pub use error::QueryError;
pub use flamegraph::{FlameGraph, FlameNode};
pub use pyroscope::{grafana_label_selector, PyroscopeClient, SpanProfileQuery};
pub use tempo::{
    parse_metrics, parse_search, parse_trace, FoundSpan, MetricsQuery, MetricsResult,
    MetricsSeries, SearchQuery, TempoClient, Trace, TraceSpan, MAX_SPANS_PER_SET,
};
