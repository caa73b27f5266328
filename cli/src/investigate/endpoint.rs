//! `investigate --service S --span-name N --since D`: one endpoint over time, per version,
//! from the backends — the report's table, and the slowest requests to go on with.
//!
//! Tempo's search returns a sample, not every span (v3.0.3: `limit` 20 traces and 3 spans
//! per trace by default, not ordered by duration), so the limits are raised within stated
//! bounds, and the output says how many spans each figure comes from. Quantiles of the
//! whole population come from TraceQL metrics (`quantile_over_time`) where Tempo answers
//! them; otherwise the sample's are given, marked as such.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use otel_profiling::export::pyroscope::BLOCK_DELAY_PROFILE_TYPE_ID;
use otel_profiling_query::{FoundSpan, MetricsQuery, SearchQuery, SpanProfileQuery, TraceSpan};

use super::{
    now_s, parse_span_id, quoted, samples_of, span_ms, trace_input, Backends, InvestigateError,
    GRAFANA_MARGIN_MS,
};
use crate::format::ms;
use crate::input::{Input, DEFAULT_PERIOD_NS};
use crate::report::SpanReport;

/// The most traces the search may return (a stated bound: each is one span set).
pub const MAX_SEARCH_TRACES: u32 = 2000;
/// The most spans per version read in full (one trace request and one or two profile
/// queries each).
pub const DEFAULT_SPANS_PER_VERSION: usize = 20;
/// Slowest requests listed per version.
pub const SLOWEST: usize = 5;

/// One endpoint, over time.
#[derive(Clone, Debug)]
pub struct EndpointQuery {
    /// `service.name`.
    pub service: String,
    /// Span name (e.g. `GET /report`).
    pub span_name: String,
    /// How far back from now.
    pub since: Duration,
    /// Crates to count as the user's code.
    pub user_crates: Vec<String>,
    /// The services' upload interval (queries start this much earlier).
    pub upload_interval: Duration,
    /// Traces the search may return (at most [`MAX_SEARCH_TRACES`]).
    pub search_limit: u32,
    /// Spans per version read in full for the table (the slowest first).
    pub spans_per_version: usize,
}

impl EndpointQuery {
    /// `span_name` of `service` over the last `since`, default bounds.
    pub fn new(service: &str, span_name: &str, since: Duration) -> EndpointQuery {
        EndpointQuery {
            service: service.to_owned(),
            span_name: span_name.to_owned(),
            since,
            user_crates: Vec::new(),
            upload_interval: Duration::from_secs(15),
            search_limit: 500,
            spans_per_version: DEFAULT_SPANS_PER_VERSION,
        }
    }
}

/// One version's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct VersionSummary {
    /// `service.version` (`(none)` when the spans carry none).
    pub version: String,
    /// Spans of the version in the search's sample.
    pub found: usize,
    /// Of them, read in full into the table.
    pub read: usize,
    /// Wall-time p50 and p95, ns, and where they come from.
    pub p50_ns: f64,
    /// p95, ns.
    pub p95_ns: f64,
    /// Where p50 and p95 come from: every matching span (exact, when the search held
    /// them all), Tempo's TraceQL metrics (estimates from log2 duration buckets, within a
    /// factor of two), or the search's sample.
    pub quantiles_from: String,
    /// p50 and p95 are estimates, not quantiles of every span (printed with `≈`).
    pub approximate: bool,
    /// The slowest spans of the sample: (trace id, span id, duration ns).
    pub slowest: Vec<(String, String, u64)>,
}

/// The endpoint's report.
#[derive(Clone, Debug)]
pub struct EndpointReport {
    /// What was asked.
    pub query: EndpointQuery,
    /// The TraceQL query.
    pub traceql: String,
    /// The window, unix seconds.
    pub window_s: (u64, u64),
    /// Spans the search returned (all versions), and the limit it ran with.
    pub found: usize,
    /// The end of the newest span found, ns since the epoch (0 when none).
    pub newest_end_ns: u64,
    /// Per version, most recent first.
    pub versions: Vec<VersionSummary>,
    /// The report's table and groups over the spans read in full.
    pub report: SpanReport,
    /// What the report was built from (for the HTML page).
    pub input: Input,
}

/// The version attribute as the search returns it (bare name, as Tempo writes it).
fn version_of(span: &FoundSpan) -> String {
    span.attributes
        .get("service.version")
        .or_else(|| span.attributes.get("resource.service.version"))
        .cloned()
        .unwrap_or_else(|| crate::input::NO_VERSION.to_owned())
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

impl EndpointReport {
    /// Searches, reads the slowest spans of each version in full with their profiles, and
    /// builds the report.
    ///
    /// # Errors
    /// A backend fails (the error names the request and the answer).
    pub fn run(
        backends: &Backends,
        query: &EndpointQuery,
    ) -> Result<EndpointReport, InvestigateError> {
        let end_s = now_s() + 1;
        let start_s = end_s.saturating_sub(query.since.as_secs().max(1));
        let filter = format!(
            "{{ resource.service.name = {} && name = {} }}",
            quoted(&query.service),
            quoted(&query.span_name)
        );
        let traceql = format!("{filter} | select(resource.service.version)");
        let limit = query.search_limit.clamp(1, MAX_SEARCH_TRACES);
        let found = backends.tempo.search(&SearchQuery {
            traceql: traceql.clone(),
            start_s,
            end_s,
            limit,
            spans_per_set: 3,
        })?;
        let traces_found = found
            .iter()
            .map(|s| s.trace_id.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let mut by_version: BTreeMap<String, Vec<&FoundSpan>> = BTreeMap::new();
        for span in &found {
            by_version.entry(version_of(span)).or_default().push(span);
        }
        // Quantiles of every matching span, where Tempo computes them.
        let metrics = backends
            .tempo
            .metrics_query_range(&MetricsQuery {
                traceql: format!(
                    "{filter} | quantile_over_time(duration, .5, .95) by (resource.service.version)"
                ),
                start_s,
                end_s,
                step_s: (end_s - start_s).max(1),
            })
            .ok();
        let mut input = Input {
            span_files: 1,
            user_crates: query.user_crates.clone(),
            names_only: true,
            ..Input::default()
        };
        let mut versions = Vec::new();
        let total_reads: usize = by_version
            .values()
            .map(|v| v.len().min(query.spans_per_version))
            .sum();
        let mut done = 0;
        for (version, spans) in &by_version {
            let mut sorted: Vec<&FoundSpan> = spans.clone();
            sorted.sort_by_key(|s| std::cmp::Reverse(s.duration_ns));
            let mut durations: Vec<u64> = sorted.iter().map(|s| s.duration_ns).collect();
            durations.sort_unstable();
            let from_metrics = metrics.as_ref().and_then(|m| {
                let p = |q: &str| m.quantile(version, q);
                Some((p("0.5")?, p("0.95")?))
            });
            // The search holds every matching span when it returned fewer traces than
            // its limit and no trace had more matches than it showed: then its exact
            // quantiles beat Tempo's estimates.
            let complete = traces_found < limit as usize
                && spans.iter().all(|s| {
                    let shown = found.iter().filter(|f| f.trace_id == s.trace_id).count();
                    s.set_matched as usize <= shown
                });
            let (p50_ns, p95_ns, quantiles_from, approximate) = match from_metrics {
                Some(_) if complete => (
                    quantile(&durations, 0.5),
                    quantile(&durations, 0.95),
                    format!("every matching span ({}), exact", durations.len()),
                    false,
                ),
                Some((p50, p95)) => (
                    p50 * 1e9,
                    p95 * 1e9,
                    "TraceQL metrics, estimated from log2 duration buckets".to_owned(),
                    true,
                ),
                None if complete => (
                    quantile(&durations, 0.5),
                    quantile(&durations, 0.95),
                    format!(
                        "every matching span ({}), exact; TraceQL metrics had no value yet",
                        durations.len()
                    ),
                    false,
                ),
                None => (
                    quantile(&durations, 0.5),
                    quantile(&durations, 0.95),
                    format!(
                        "the search's sample of {} span(s); TraceQL metrics had no value",
                        durations.len()
                    ),
                    true,
                ),
            };
            let mut read = 0;
            for found_span in sorted.iter().take(query.spans_per_version) {
                done += 1;
                if done % 10 == 0 {
                    eprintln!("investigate: {done}/{total_reads} span(s) read…");
                }
                let Some(trace) = backends.tempo.get_trace(&found_span.trace_id)? else {
                    continue;
                };
                let Some(span) = trace.span(&found_span.span_id) else {
                    continue;
                };
                let part = trace_input(&trace, span, &query.user_crates)?;
                input.spans.extend(part.spans);
                add_span_profile(backends, query, span, &mut input)?;
                read += 1;
            }
            versions.push(VersionSummary {
                version: version.clone(),
                found: spans.len(),
                read,
                p50_ns,
                p95_ns,
                quantiles_from,
                approximate,
                slowest: sorted
                    .iter()
                    .take(SLOWEST)
                    .map(|s| (s.trace_id.clone(), s.span_id.clone(), s.duration_ns))
                    .collect(),
            });
        }
        // Most recent version first.
        let latest = |v: &VersionSummary| {
            found
                .iter()
                .filter(|s| version_of(s) == v.version)
                .map(|s| s.start_unix_nano)
                .max()
                .unwrap_or(0)
        };
        versions.sort_by_key(|v| std::cmp::Reverse(latest(v)));
        input.profile_files = 1;
        Ok(EndpointReport {
            query: query.clone(),
            traceql,
            window_s: (start_s, end_s),
            found: found.len(),
            newest_end_ns: found
                .iter()
                .map(|s| s.start_unix_nano.saturating_add(s.duration_ns))
                .max()
                .unwrap_or(0),
            versions,
            report: SpanReport::from_input(&input),
            input,
        })
    }
}

/// How long a real Tempo took to list a finished trace in search (seconds after it ended:
/// none of the newest at 5 s, all at 30 s; its TraceQL metrics later still).
pub const SEARCHABLE_AFTER_S: u64 = 30;

impl EndpointReport {
    /// Said when the window ends less than [`SEARCHABLE_AFTER_S`] after the newest span
    /// found (or nothing was found): Tempo lists a trace in search only seconds after it
    /// ends, so the newest requests may be missing from the figures.
    pub fn newest_spans_note(&self) -> Option<String> {
        let newest_end_s = self.newest_end_ns / 1_000_000_000;
        let recent = self.found == 0 || self.window_s.1 < newest_end_s + SEARCHABLE_AFTER_S;
        recent.then(|| {
            format!(
                "note: the window ends now, and Tempo lists a trace in search only seconds \
                 after it ends (its TraceQL metrics later still): requests of the last \
                 ~{SEARCHABLE_AFTER_S} s may be missing; run again later to include them"
            )
        })
    }

    /// The report as JSON (`docs/investigate.md`, the same `version` as
    /// [`super::JSON_VERSION`]).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        json!({
            "version": super::JSON_VERSION,
            "service": self.query.service,
            "span_name": self.query.span_name,
            "traceql": self.traceql,
            "start_s": self.window_s.0,
            "end_s": self.window_s.1,
            "found": self.found,
            "newest_spans_note": self.newest_spans_note(),
            "versions": self.versions.iter().map(|v| {
                let group = self.report.groups.iter().find(|g| {
                    crate::input::version_label(g.version.as_deref()) == v.version
                });
                json!({
                    "version": v.version,
                    "found": v.found,
                    "read": v.read,
                    "p50_ns": v.p50_ns,
                    "p95_ns": v.p95_ns,
                    "quantiles_from": v.quantiles_from,
                    "quantiles_approximate": v.approximate,
                    "slowest": v.slowest.iter().map(|(t, s, ns)| json!({
                        "trace_id": t, "span_id": s, "duration_ns": ns,
                    })).collect::<Vec<_>>(),
                    "verdict": group.map(|g| g.verdict.to_string()),
                    "reason": group.map(|g| g.reason.clone()),
                    "cpu_profile_ns": group.map(|g| g.profile_cpu_ns),
                    "top_self": group.map(|g| g.user_self.iter().map(|f| json!({
                        "function": f.function, "cpu_ns": f.cpu_ns,
                    })).collect::<Vec<_>>()),
                })
            }).collect::<Vec<_>>(),
        })
    }
}

/// The span's own CPU and blocked samples, as Grafana's link selects them.
fn add_span_profile(
    backends: &Backends,
    query: &EndpointQuery,
    span: &TraceSpan,
    input: &mut Input,
) -> Result<(), InvestigateError> {
    let upload_ms = i64::try_from(query.upload_interval.as_millis()).unwrap_or(i64::MAX);
    let (start, end) = span_ms(span);
    let q = SpanProfileQuery::for_span(span).with_interval(
        start.saturating_sub(upload_ms.max(GRAFANA_MARGIN_MS)),
        end.saturating_add(GRAFANA_MARGIN_MS),
    );
    let id = parse_span_id(&span.trace_id, &span.span_id)?;
    let cpu = backends.pyroscope.select_merge_span_profile(&q)?;
    input
        .samples
        .extend(samples_of(&cpu, Some(id), None, DEFAULT_PERIOD_NS));
    let blocked = backends
        .pyroscope
        .select_merge_span_profile(&q.with_profile_type(BLOCK_DELAY_PROFILE_TYPE_ID))?;
    input
        .blocked
        .extend(samples_of(&blocked, Some(id), None, 1));
    Ok(())
}

impl fmt::Display for EndpointReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = &self.query;
        writeln!(
            f,
            "Endpoint {} of {} over the last {} s ({})",
            q.span_name,
            q.service,
            q.since.as_secs(),
            self.traceql
        )?;
        writeln!(
            f,
            "  Tempo's search returned {} span(s) (limit {} traces, 3 spans each: a sample, not \
             every request); per version, the slowest {} read in full with their profiles",
            self.found,
            q.search_limit.clamp(1, MAX_SEARCH_TRACES),
            q.spans_per_version
        )?;
        if let Some(note) = self.newest_spans_note() {
            writeln!(f, "  {note}")?;
        }
        for v in &self.versions {
            let about = if v.approximate { "≈" } else { "" };
            writeln!(
                f,
                "\n  {}: {} span(s) found, {} read; wall p50 {about}{}, p95 {about}{} (from {})",
                v.version,
                v.found,
                v.read,
                ms(v.p50_ns as u64),
                ms(v.p95_ns as u64),
                v.quantiles_from
            )?;
            writeln!(f, "    slowest (investigate --trace-id ID --span-id ID):")?;
            for (trace, span, ns) in &v.slowest {
                writeln!(f, "      {trace} {span} {}", ms(*ns))?;
            }
        }
        if self.report.groups.is_empty() {
            return writeln!(f, "\nNo span could be read in full.");
        }
        writeln!(
            f,
            "\nThe report over the spans read in full (the slowest of each version, so the \
             quantiles below lean slow):"
        )?;
        self.report.write_body(f)?;
        if self.query.user_crates.is_empty() {
            writeln!(f, "\n{}", super::names_only_note(&self.input))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(found: usize, newest_end_s: u64, window_end_s: u64) -> EndpointReport {
        let input = Input::default();
        EndpointReport {
            query: EndpointQuery::new("svc", "GET /x", Duration::from_secs(600)),
            traceql: String::new(),
            window_s: (window_end_s - 600, window_end_s),
            found,
            newest_end_ns: newest_end_s * 1_000_000_000,
            versions: Vec::new(),
            report: SpanReport::from_input(&input),
            input,
        }
    }

    /// Tempo lists a trace only seconds after it ends: a window whose newest span ended
    /// under 30 s before its end, or that found nothing, says the last may be missing.
    #[test]
    fn a_window_ending_at_fresh_spans_says_they_may_be_missing() {
        assert!(report(0, 0, 10_000).newest_spans_note().is_some());
        assert!(report(5, 9_990, 10_000).newest_spans_note().is_some());
        assert!(report(5, 9_900, 10_000).newest_spans_note().is_none());
        let shown = report(5, 9_990, 10_000).to_string();
        assert!(shown.contains("may be missing"), "{shown}");
    }
}
