//! `investigate`: the report's analysis of one operation where production data lives —
//! its trace in Tempo, its profiles in Pyroscope.
//!
//! The spans and profiles are read from the backends into the same [`Input`] the local
//! files fill, so the verdict, the split, the child spans covering the wait and the top
//! functions are the local report's own ([`SpanReport`]), and the control comparison is
//! the `diff` command's ([`VersionDiff`]):
//!
//! 1. the trace by id from Tempo; the given span, or the trace's slowest local root;
//! 2. its profile from Pyroscope selected as Grafana's "Profiles for this span" selects
//!    it (`SelectMergeSpanProfile`: the span id and the series labels mapped from the
//!    span's resource), for the CPU profile type and the blocked-in-poll one; Pyroscope
//!    returns function names only, so "your code" comes from the qualified names'
//!    crates: `--crate`, else the crates the trace's spans were made in
//!    (`code.module.name`, frameworks' and the profiler's left out); C functions are
//!    never the user's code;
//! 3. no samples for the span (no `pyroscope.profile.id`, too short, unsampled): the
//!    service's profile over the span's interval instead, widened by the upload interval
//!    (a profile is stamped at its interval's start), always titled
//!    "concurrent workload activity, not this span";
//! 4. a control: equivalent requests of another version (or of the same version earlier),
//!    found with TraceQL, merged and compared; what grew is a hypothesis with its
//!    evidence, never a proven cause.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use otel_profiling::export::pyroscope::{ALLOC_SPACE_PROFILE_TYPE_ID, BLOCK_DELAY_PROFILE_TYPE_ID};
use otel_profiling::PROFILE_ID_ATTRIBUTE;
use otel_profiling_query::{
    grafana_label_selector, Auth, FlameGraph, PyroscopeClient, QueryError, SearchQuery,
    SpanProfileQuery, TempoClient, Trace, TraceSpan,
};
use serde_json::{json, Value};

use crate::diff::VersionDiff;
use crate::format::ms;
use crate::ids::SpanId;
use crate::input::{otlp, Input, Sample, Span, DEFAULT_PERIOD_NS};
use crate::report::{write_group, SpanGroup, SpanReport};

mod endpoint;
pub use endpoint::{
    EndpointQuery, EndpointReport, VersionSummary, DEFAULT_SPANS_PER_VERSION, MAX_SEARCH_TRACES,
    SEARCHABLE_AFTER_S, SLOWEST,
};

/// The version of [`Investigation::to_json`]'s schema (`docs/investigate.md`).
pub const JSON_VERSION: u32 = 1;
/// The size attribute compared when the spans carry it and none is named.
pub const DEFAULT_SIZE_ATTRIBUTE: &str = "http.response.body.size";
/// Requests within this share of the operation's size are comparable.
pub const SIZE_TOLERANCE: f64 = 0.25;
/// Most traces fetched for a control side (each is one request to Tempo).
pub const MAX_CONTROL_TRACES: u32 = 20;
/// Said when no `--crate` was given: Pyroscope's span profiles carry no source files.
pub const NAMES_ONLY_HINT: &str = "note: Pyroscope returns function names only, so \"your \
     code\" is told from the names; name your crates with --crate to be exact";
/// The note under a report read from Pyroscope without `--crate`: which crates were taken
/// as the user's, from the spans' `code.module.name` ([`Input::span_module_crates`]), or
/// [`NAMES_ONLY_HINT`] when the spans name none.
pub fn names_only_note(input: &Input) -> String {
    let crates = input.span_module_crates();
    if crates.is_empty() {
        return NAMES_ONLY_HINT.to_owned();
    }
    let crates: Vec<String> = crates.into_iter().collect();
    format!(
        "note: Pyroscope returns function names only, so \"your code\" is the crates your \
         spans were made in (code.module.name): {}; name yours with --crate to be exact",
        crates.join(", ")
    )
}

/// The interval Grafana's "Profiles for this span" adds on each side of the span.
const GRAFANA_MARGIN_MS: i64 = 60_000;

/// Errors of an investigation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvestigateError {
    /// A backend failed or answered something unusable (names the request).
    #[error(transparent)]
    Query(#[from] QueryError),
    /// Tempo does not know the trace.
    #[error("trace {trace_id}: Tempo ({tempo}) does not know it (wrong id, not ingested yet, or past retention)")]
    TraceNotFound {
        /// The trace id asked for.
        trace_id: String,
        /// Tempo's URL.
        tempo: String,
    },
    /// The trace has no such span, or no local root.
    #[error("trace {trace_id}: {message}")]
    Span {
        /// The trace id.
        trace_id: String,
        /// What is missing.
        message: String,
    },
    /// The trace's spans could not be read as the report reads spans.
    #[error("trace {trace_id}: {message}")]
    Spans {
        /// The trace id.
        trace_id: String,
        /// What did not parse.
        message: String,
    },
}

/// The two backends an investigation reads.
#[derive(Clone, Debug)]
pub struct Backends {
    /// Tempo.
    pub tempo: TempoClient,
    /// Pyroscope.
    pub pyroscope: PyroscopeClient,
}

impl Backends {
    /// Clients for Tempo at `tempo` and Pyroscope at `pyroscope`, with the credentials of
    /// `TEMPO_*` and `PYROSCOPE_*` ([`Auth::from_env`]) and `timeout` per request.
    ///
    /// # Errors
    /// A URL that is not http(s), or an inconsistent credential variable, naming it.
    pub fn from_urls(
        tempo: &str,
        pyroscope: &str,
        timeout: Duration,
    ) -> Result<Backends, QueryError> {
        Ok(Backends {
            tempo: TempoClient::new(tempo)?
                .with_auth(Auth::from_env("TEMPO")?)
                .with_timeout(timeout)?,
            pyroscope: PyroscopeClient::new(pyroscope)?
                .with_auth(Auth::from_env("PYROSCOPE")?)
                .with_timeout(timeout)?,
        })
    }
}

/// Which healthy requests to compare the operation with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// The most recent other `service.version` seen for the same span name in the window.
    OtherVersion,
    /// This `service.version`.
    Version(String),
    /// The same span name and version, in a window of the same length ending this long
    /// before the operation.
    Since(Duration),
    /// No control.
    Off,
}

/// What to investigate, and how.
#[derive(Clone, Debug)]
pub struct OperationQuery {
    /// Trace id (hex).
    pub trace_id: String,
    /// The span (hex); `None`: the trace's slowest local root.
    pub span_id: Option<String>,
    /// Crates to count as the user's code (`--crate`).
    pub user_crates: Vec<String>,
    /// The services' profile upload interval (`PYROSCOPE_UPLOAD_INTERVAL`, default 15 s).
    pub upload_interval: Duration,
    /// The control.
    pub baseline: Baseline,
    /// The size attribute requests must match within ±25 % (`None`:
    /// [`DEFAULT_SIZE_ATTRIBUTE`] when the span carries it).
    pub size_attribute: Option<String>,
    /// How far back the control's search looks.
    pub search_window: Duration,
}

impl OperationQuery {
    /// The operation `trace_id`'s slowest local root, other-version control over the last
    /// hour, 15 s upload interval.
    pub fn of_trace(trace_id: &str) -> OperationQuery {
        OperationQuery {
            trace_id: trace_id.trim().to_ascii_lowercase(),
            span_id: None,
            user_crates: Vec::new(),
            upload_interval: Duration::from_secs(15),
            baseline: Baseline::OtherVersion,
            size_attribute: None,
            search_window: Duration::from_secs(3600),
        }
    }
}

/// Where the profile evidence came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The span's own samples (the span selector).
    Span,
    /// None for the span: the workload's profile over its interval, concurrent activity.
    Workload,
    /// No samples at all, the span's nor the workload's.
    None,
}

impl Evidence {
    fn label(self) -> &'static str {
        match self {
            Evidence::Span => "span",
            Evidence::Workload => "workload",
            Evidence::None => "none",
        }
    }
}

/// The comparison with healthy requests.
#[derive(Clone, Debug)]
pub struct Control {
    /// What the baseline is (`service.version 1.4.0`, say).
    pub baseline: String,
    /// The TraceQL query that found it.
    pub traceql: String,
    /// Spans the search returned, and those compared (same name, version rule, size).
    pub found: usize,
    /// The baseline spans compared.
    pub compared: usize,
    /// The diff, baseline → operation; `None` when nothing comparable was found.
    pub diff: Option<VersionDiff>,
    /// Why there is no diff, when there is none.
    pub missing: Option<String>,
}

impl Control {
    /// The conclusion: a candidate with its evidence, never a proven cause.
    pub fn hypothesis(&self) -> Option<String> {
        let diff = self.diff.as_ref()?;
        // The cause in your code when the diff names one, else the largest growth.
        let (function, delta_ns) = match (&diff.cause, diff.grown.first()) {
            (Some(cause), _) => (&cause.function, cause.total_delta_ns()),
            (None, Some(grown)) if grown.delta_ns() > 0.0 => (&grown.function, grown.delta_ns()),
            _ => return None,
        };
        Some(format!(
            "Hypothesis, not a proven cause: candidate `{function}`, {:+.0} ms CPU per request \
             against {} ({} request(s)); test it separately",
            delta_ns / 1e6,
            self.baseline,
            self.compared
        ))
    }
}

/// One operation, investigated.
#[derive(Clone, Debug)]
pub struct Investigation {
    /// The span investigated, as Tempo returned it.
    pub span: TraceSpan,
    /// Its `profiling.*` attributes and `pyroscope.profile.id`.
    pub profiling_attributes: BTreeMap<String, String>,
    /// The profile types Pyroscope has for the workload (`__profile_type__` values).
    pub profile_types: Vec<String>,
    /// The label selector of the span's series (Grafana's link's).
    pub label_selector: String,
    /// The span profile query made (CPU type).
    pub span_query: SpanProfileQuery,
    /// Where the profile figures come from.
    pub evidence: Evidence,
    /// The report of the one span (one group).
    pub report: SpanReport,
    /// What the report was built from: the span, its descendants, its samples (for the
    /// HTML page).
    pub input: Input,
    /// The control, unless turned off.
    pub control: Option<Control>,
    /// The requests made, in order (`POST url`), for a reader checking the selection.
    pub notes: Vec<String>,
}

impl Investigation {
    /// Investigates `query` over `backends`.
    ///
    /// # Errors
    /// The trace or span is unknown, or a backend fails (the error names the request and
    /// the answer).
    pub fn run(
        backends: &Backends,
        query: &OperationQuery,
    ) -> Result<Investigation, InvestigateError> {
        let trace_id = query.trace_id.clone();
        let trace = backends.tempo.get_trace(&trace_id)?.ok_or_else(|| {
            InvestigateError::TraceNotFound {
                trace_id: trace_id.clone(),
                tempo: backends.tempo.base().to_owned(),
            }
        })?;
        let target = pick_span(&trace, query)?.clone();
        let mut notes = Vec::new();
        let label_selector = grafana_label_selector(&target.resource);
        let upload_ms = i64::try_from(query.upload_interval.as_millis()).unwrap_or(i64::MAX);
        let (start_ms, end_ms) = span_ms(&target);
        let widened = (
            start_ms.saturating_sub(upload_ms.max(GRAFANA_MARGIN_MS)),
            end_ms.saturating_add(GRAFANA_MARGIN_MS),
        );
        let profile_types = backends.pyroscope.label_values(
            "__profile_type__",
            &label_selector,
            widened.0,
            widened.1,
        )?;
        notes.push(format!(
            "profile types of {label_selector}: {}",
            profile_types.join(", ")
        ));

        // The span's own evidence, as Grafana selects it (span id + series labels).
        let span_query = SpanProfileQuery::for_span(&target).with_interval(widened.0, widened.1);
        let span_id = parse_span_id(&trace_id, &target.span_id)?;
        let mut input = trace_input(&trace, &target, &query.user_crates)?;
        let cpu = backends.pyroscope.select_merge_span_profile(&span_query)?;
        input
            .samples
            .extend(samples_of(&cpu, Some(span_id), None, DEFAULT_PERIOD_NS));
        if profile_types
            .iter()
            .any(|t| t == BLOCK_DELAY_PROFILE_TYPE_ID)
        {
            let blocked = backends.pyroscope.select_merge_span_profile(
                &span_query
                    .clone()
                    .with_profile_type(BLOCK_DELAY_PROFILE_TYPE_ID),
            )?;
            input
                .blocked
                .extend(samples_of(&blocked, Some(span_id), None, 1));
        }
        // What the span allocated and where, when the service samples allocations (its
        // `ProfilingAllocator`): the same span selector on the allocated bytes.
        if profile_types
            .iter()
            .any(|t| t == ALLOC_SPACE_PROFILE_TYPE_ID)
        {
            let allocated = backends.pyroscope.select_merge_span_profile(
                &span_query
                    .clone()
                    .with_profile_type(ALLOC_SPACE_PROFILE_TYPE_ID),
            )?;
            input
                .allocated
                .extend(samples_of(&allocated, Some(span_id), None, u64::MAX));
        }
        let mut evidence = if cpu.is_empty() {
            Evidence::None
        } else {
            Evidence::Span
        };
        if cpu.is_empty() {
            // The workload over the span's interval; a profile is stamped at its
            // interval's start, so the window starts one upload interval earlier.
            let workload = SpanProfileQuery {
                span_selector: Vec::new(),
                ..span_query.clone()
            }
            .with_interval(start_ms.saturating_sub(upload_ms), end_ms);
            let graph = backends.pyroscope.select_merge_stacktraces(&workload)?;
            if !graph.is_empty() {
                evidence = Evidence::Workload;
                let window = (
                    target
                        .start_unix_nano
                        .saturating_sub(query.upload_interval.as_nanos() as u64),
                    target.end_unix_nano.max(target.start_unix_nano + 1),
                );
                input
                    .samples
                    .extend(samples_of(&graph, None, Some(window), DEFAULT_PERIOD_NS));
            }
        }
        input.profile_files = usize::from(!profile_types.is_empty());
        let report = SpanReport::from_input(&input);
        let control = match &query.baseline {
            Baseline::Off => None,
            baseline => Some(control(
                backends,
                query,
                baseline,
                &target,
                &input,
                &profile_types,
                &mut notes,
            )?),
        };
        Ok(Investigation {
            profiling_attributes: target
                .attributes
                .iter()
                .filter(|(k, _)| k.starts_with("profiling.") || *k == PROFILE_ID_ATTRIBUTE)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            span: target,
            profile_types,
            label_selector,
            span_query,
            evidence,
            report,
            input,
            control,
            notes,
        })
    }

    /// The report's group of the span.
    pub fn group(&self) -> Option<&SpanGroup> {
        self.report.groups.first()
    }

    /// The investigation as JSON (schema in `docs/investigate.md`, [`JSON_VERSION`]).
    pub fn to_json(&self) -> Value {
        let s = &self.span;
        let group = self.group().map(|g| {
            let functions = |list: &[crate::functions::FunctionCpu]| -> Vec<Value> {
                list.iter()
                    .map(|f| json!({"function": f.function, "cpu_ns": f.cpu_ns}))
                    .collect()
            };
            json!({
                "verdict": g.verdict.to_string(),
                "reason": g.reason,
                "wall_ns": g.wall_total_ns,
                "cpu_profile_ns": g.profile_cpu_ns,
                "cpu_samples": g.profile_samples,
                "cpu_attribute_ns": g.attribute_cpu_ns,
                // Each part's share as the reason and the text print it.
                "parts": g.split.parts().into_iter()
                    .map(|(p, ns)| json!({
                        "part": p.label(),
                        "ns": ns,
                        "percent": g.split.share(p).map(|s| s.0),
                    }))
                    .collect::<Vec<_>>(),
                "child_spans": g.dependencies.children.iter()
                    .map(|c| json!({"name": c.name, "count": c.count, "covered_ns": c.covered_ns}))
                    .collect::<Vec<_>>(),
                "children_cover_ns": g.dependencies.covered_ns,
                "blocking": functions(&g.blocking),
                "top_self": functions(&g.user_self),
                "top_total": functions(&g.user_total),
                "concurrent": g.concurrent.as_ref().map(|c| json!({
                    "title": crate::concurrent::CAVEAT,
                    "cpu_ns": c.cpu_ns,
                    "window_ns": c.window_ns,
                    "top_functions": functions(&c.top_functions),
                })),
            })
        });
        let control = self.control.as_ref().map(|c| {
            json!({
                "baseline": c.baseline,
                "traceql": c.traceql,
                "found": c.found,
                "compared": c.compared,
                "missing": c.missing,
                "before": c.diff.as_ref().map(|d| side_json(&d.before)),
                "after": c.diff.as_ref().map(|d| side_json(&d.after)),
                "what_changed": c.diff.as_ref().map(VersionDiff::what_changed),
                "allocations": c.diff.as_ref().and_then(VersionDiff::allocation_line),
                "candidate": c.diff.as_ref().and_then(|d| d.cause.as_ref()).map(|f| json!({
                    "function": f.function,
                    "total_delta_ns_per_request": f.total_delta_ns(),
                })),
                "hypothesis": c.hypothesis(),
            })
        });
        json!({
            "version": JSON_VERSION,
            "trace_id": s.trace_id,
            "span_id": s.span_id,
            "span_name": s.name,
            "service": s.resource.get("service.name"),
            "service_instance_id": s.resource.get("service.instance.id"),
            "deployment_environment": s.resource.get("deployment.environment.name")
                .or_else(|| s.resource.get("deployment.environment")),
            "service_version": s.resource.get("service.version"),
            "start_unix_nano": s.start_unix_nano,
            "end_unix_nano": s.end_unix_nano,
            "profile_types": self.profile_types,
            "label_selector": self.label_selector,
            "span_selector": self.span_query.span_selector,
            "profiling_attributes": self.profiling_attributes,
            "evidence": self.evidence.label(),
            "span": group,
            "control": control,
        })
    }
}

fn side_json(side: &crate::diff::DiffSide) -> Value {
    json!({
        "label": side.label,
        "requests": side.requests,
        "verdict": side.verdict.to_string(),
        "reason": side.reason,
        "cpu_per_request_ns": side.cpu_per_request_ns,
        "wall_mean_ns": side.wall_mean_ns(),
    })
}

impl fmt::Display for Investigation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.span;
        let get = |k: &str| s.resource.get(k).map_or("-", String::as_str);
        writeln!(f, "Operation")?;
        writeln!(f, "  trace id      {}", s.trace_id)?;
        writeln!(f, "  span id       {}", s.span_id)?;
        writeln!(f, "  span name     {}", s.name)?;
        writeln!(f, "  service       {}", get("service.name"))?;
        writeln!(f, "  instance      {}", get("service.instance.id"))?;
        let env = s
            .resource
            .get("deployment.environment.name")
            .or_else(|| s.resource.get("deployment.environment"))
            .map_or("-", String::as_str);
        writeln!(f, "  environment   {env}")?;
        writeln!(f, "  version       {}", get("service.version"))?;
        writeln!(
            f,
            "  interval      {} .. {} ({})",
            s.start_unix_nano,
            s.end_unix_nano,
            ms(s.end_unix_nano.saturating_sub(s.start_unix_nano))
        )?;
        writeln!(
            f,
            "  profile types {}",
            if self.profile_types.is_empty() {
                "none for this workload".to_owned()
            } else {
                self.profile_types.join(", ")
            }
        )?;
        writeln!(
            f,
            "  profile query {} span {} (as Grafana's \"Profiles for this span\")",
            self.label_selector,
            self.span_query.span_selector.join(",")
        )?;
        if self.profiling_attributes.is_empty() {
            writeln!(
                f,
                "  attributes    no profiling.* attributes, no {PROFILE_ID_ATTRIBUTE}"
            )?;
        } else {
            let attrs: Vec<String> = self
                .profiling_attributes
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            writeln!(f, "  attributes    {}", attrs.join(" "))?;
        }
        match self.evidence {
            Evidence::Span => {}
            Evidence::Workload => {
                let why = if self.profiling_attributes.contains_key(PROFILE_ID_ATTRIBUTE) {
                    "it has a profile id, so it was not computing when a sample was taken \
                     (waiting, or shorter than the sampling period)"
                } else {
                    "no profile id: a child span, an unsampled trace, or no \
                     ProfileIdSpanProcessor"
                };
                writeln!(
                    f,
                    "\nNo CPU sample carries this span's id ({why}): below is the service's \
                     profile over the span's interval — concurrent workload activity, not \
                     this span."
                )?
            }
            Evidence::None => writeln!(
                f,
                "\nNo samples for this span, and none for the service over its interval."
            )?,
        }
        if let Some(group) = self.group() {
            write_group(f, group, false)?;
            if self.input.user_crates.is_empty() {
                writeln!(f, "  {}", names_only_note(&self.input))?;
            }
        }
        if let Some(control) = &self.control {
            writeln!(f, "\nControl: {} ({})", control.baseline, control.traceql)?;
            writeln!(
                f,
                "  {} span(s) found, {} compared",
                control.found, control.compared
            )?;
            match (&control.diff, &control.missing) {
                (Some(diff), _) => {
                    write!(f, "{diff}")?;
                    if let Some(h) = control.hypothesis() {
                        writeln!(f, "\n{h}")?;
                    }
                }
                (None, Some(why)) => writeln!(f, "  no comparison: {why}")?,
                (None, None) => {}
            }
        }
        Ok(())
    }
}

/// The given span, or the slowest local root.
fn pick_span<'t>(
    trace: &'t Trace,
    query: &OperationQuery,
) -> Result<&'t TraceSpan, InvestigateError> {
    let err = |message: String| InvestigateError::Span {
        trace_id: query.trace_id.clone(),
        message,
    };
    match &query.span_id {
        Some(id) => trace.span(id.trim()).ok_or_else(|| {
            err(format!(
                "no span {id} in the trace ({} spans)",
                trace.spans.len()
            ))
        }),
        None => trace
            .slowest_local_root()
            .ok_or_else(|| err("no local root span".into())),
    }
}

fn parse_span_id(trace_id: &str, hex: &str) -> Result<SpanId, InvestigateError> {
    SpanId::parse(hex, "spanId").map_err(|e| InvestigateError::Spans {
        trace_id: trace_id.to_owned(),
        message: e.to_string(),
    })
}

/// The span's interval in ms, end rounded up.
fn span_ms(span: &TraceSpan) -> (i64, i64) {
    let ms = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
    (
        ms(span.start_unix_nano / 1_000_000),
        ms(span.end_unix_nano.div_ceil(1_000_000)),
    )
}

/// The report's input for `target`: it and its spans below it in the same process.
fn trace_input(
    trace: &Trace,
    target: &TraceSpan,
    user_crates: &[String],
) -> Result<Input, InvestigateError> {
    let all =
        otlp::spans_from_json(&trace.otlp_json).map_err(|message| InvestigateError::Spans {
            trace_id: target.trace_id.clone(),
            message,
        })?;
    let keep: Vec<String> = std::iter::once(target)
        .chain(trace.local_descendants(target))
        .map(|s| s.span_id.clone())
        .collect();
    let mut spans: Vec<Span> = all
        .into_iter()
        .filter(|s| keep.contains(&s.span_id.to_string()))
        .collect();
    // The investigated span is the local root whatever its parent (a remote caller's
    // span, another service's in the same trace).
    for s in &mut spans {
        if s.span_id.to_string() == target.span_id {
            s.parent_is_remote = true;
        }
    }
    Ok(Input {
        spans,
        span_files: 1,
        user_crates: user_crates.to_vec(),
        names_only: true,
        ..Input::default()
    })
}

/// A Pyroscope flame graph as the report's samples: one per stack, its self value as
/// the sample's value, labelled `span_id` (the whole graph is that span's), or with
/// `window` for the workload's samples.
pub fn samples_of(
    graph: &FlameGraph,
    span_id: Option<SpanId>,
    window: Option<(u64, u64)>,
    period_ns: u64,
) -> Vec<Sample> {
    graph
        .stacks()
        .into_iter()
        .map(|(stack, value)| {
            let value = u64::try_from(value).unwrap_or(0);
            Sample {
                frames: stack.into_iter().rev().map(Arc::from).collect(),
                cpu_ns: value,
                count: (value / period_ns.max(1)).max(1),
                span_id,
                trace_id: None,
                span_name: None,
                window,
            }
        })
        .collect()
}

/// A TraceQL string literal.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Keeps the `candidates` whose size attribute (`named`, else [`DEFAULT_SIZE_ATTRIBUTE`]
/// when `target` carries it) is within ±[`SIZE_TOLERANCE`] of the target's; what was
/// applied, when anything was.
fn keep_comparable_sizes<T>(
    named: Option<&str>,
    target: &TraceSpan,
    candidates: &mut Vec<(TraceSpan, T)>,
) -> Option<String> {
    let key = match named {
        Some(k) => k,
        None if target.attributes.contains_key(DEFAULT_SIZE_ATTRIBUTE) => DEFAULT_SIZE_ATTRIBUTE,
        None => return None,
    };
    let size_of = |s: &TraceSpan| -> Option<f64> { s.attributes.get(key)?.trim().parse().ok() };
    let size = size_of(target)?;
    candidates.retain(|(s, _)| {
        size_of(s).is_some_and(|other| (other - size).abs() <= SIZE_TOLERANCE * size.abs())
    });
    Some(format!("control sizes: {key} within ±25 % of {size}"))
}

/// The control: find equivalent requests, merge their span profiles, diff.
fn control(
    backends: &Backends,
    query: &OperationQuery,
    baseline: &Baseline,
    target: &TraceSpan,
    input: &Input,
    profile_types: &[String],
    notes: &mut Vec<String>,
) -> Result<Control, InvestigateError> {
    let has = |type_id: &str| profile_types.iter().any(|t| t == type_id);
    let (has_blocked, has_allocated) = (
        has(BLOCK_DELAY_PROFILE_TYPE_ID),
        has(ALLOC_SPACE_PROFILE_TYPE_ID),
    );
    let version = target.resource.get("service.version").cloned();
    let service = target
        .resource
        .get("service.name")
        .cloned()
        .unwrap_or_default();
    let end_s = (target.end_unix_nano / 1_000_000_000 + 1).min(now_s().max(1));
    let window_s = query.search_window.as_secs().max(1);
    let mut conditions = vec![
        format!("resource.service.name = {}", quoted(&service)),
        format!("name = {}", quoted(&target.name)),
    ];
    let (start_s, end_s, label) = match baseline {
        Baseline::Version(v) => {
            conditions.push(format!("resource.service.version = {}", quoted(v)));
            (
                end_s.saturating_sub(window_s),
                end_s,
                format!("service.version {v}"),
            )
        }
        Baseline::Since(ago) => {
            if let Some(v) = &version {
                conditions.push(format!("resource.service.version = {}", quoted(v)));
            }
            let end = end_s.saturating_sub(ago.as_secs());
            (
                end.saturating_sub(window_s),
                end,
                format!("the same version {} s earlier", ago.as_secs()),
            )
        }
        Baseline::OtherVersion | Baseline::Off => {
            if let Some(v) = &version {
                conditions.push(format!("resource.service.version != {}", quoted(v)));
            }
            (end_s.saturating_sub(window_s), end_s, String::new())
        }
    };
    let traceql = format!("{{ {} }}", conditions.join(" && "));
    let found = backends.tempo.search(&SearchQuery {
        traceql: traceql.clone(),
        start_s,
        end_s,
        limit: MAX_CONTROL_TRACES,
        spans_per_set: 3,
    })?;
    notes.push(format!("{traceql}: {} span(s)", found.len()));
    let mut candidates: Vec<(TraceSpan, Trace)> = Vec::new();
    let mut traces_seen: Vec<String> = Vec::new();
    if found.len() > 5 {
        eprintln!(
            "investigate: reading {} control trace(s) from {}…",
            found.len().min(MAX_CONTROL_TRACES as usize),
            backends.tempo.base()
        );
    }
    for f in &found {
        if f.trace_id == target.trace_id && f.span_id == target.span_id {
            continue;
        }
        if traces_seen.contains(&f.trace_id) {
            continue;
        }
        traces_seen.push(f.trace_id.clone());
        let Some(t) = backends.tempo.get_trace(&f.trace_id)? else {
            continue;
        };
        for s in t.local_roots() {
            let same_service = s.resource.get("service.name") == Some(&service);
            if same_service && s.name == target.name && s.span_id != target.span_id {
                candidates.push((s.clone(), t.clone()));
            }
        }
    }
    // The most recent other version, unless one was named.
    let chosen_version = match baseline {
        Baseline::OtherVersion | Baseline::Off => candidates
            .iter()
            .filter(|(s, _)| s.resource.get("service.version") != version.as_ref())
            .max_by_key(|(s, _)| s.start_unix_nano)
            .and_then(|(s, _)| s.resource.get("service.version").cloned()),
        Baseline::Version(v) => Some(v.clone()),
        Baseline::Since(_) => version.clone(),
    };
    candidates.retain(|(s, _)| s.resource.get("service.version") == chosen_version.as_ref());
    let label = if label.is_empty() {
        chosen_version.as_ref().map_or_else(
            || "another version".to_owned(),
            |v| format!("service.version {v}"),
        )
    } else {
        label
    };
    // Only requests of a comparable size.
    if let Some(note) =
        keep_comparable_sizes(query.size_attribute.as_deref(), target, &mut candidates)
    {
        notes.push(note);
    }
    let mut out = Control {
        baseline: label,
        traceql,
        found: found.len(),
        compared: candidates.len(),
        diff: None,
        missing: None,
    };
    if candidates.is_empty() {
        out.missing = Some(format!(
            "no comparable request in Tempo's search between {start_s} and {end_s} (unix s)"
        ));
        return Ok(out);
    }
    // Both sides in one input: the operation's spans and samples, the baseline's.
    let mut both = input.clone();
    both.samples.retain(|s| s.span_id.is_some());
    let mut baseline_ids = Vec::new();
    for (span, t) in &candidates {
        let extra = trace_input(t, span, &[])?;
        both.spans.extend(extra.spans);
        baseline_ids.push(span.span_id.clone());
    }
    // One query per baseline span (at most MAX_CONTROL_TRACES × 3): each span's own
    // samples, so each request's split is its own, as the local diff has it.
    let upload_ms = i64::try_from(query.upload_interval.as_millis()).unwrap_or(i64::MAX);
    for (span, _) in &candidates {
        let id = parse_span_id(&target.trace_id, &span.span_id)?;
        let (start, end) = span_ms(span);
        let q = SpanProfileQuery::for_span(span).with_interval(
            start.saturating_sub(upload_ms.max(GRAFANA_MARGIN_MS)),
            end.saturating_add(GRAFANA_MARGIN_MS),
        );
        let cpu = backends.pyroscope.select_merge_span_profile(&q)?;
        both.samples
            .extend(samples_of(&cpu, Some(id), None, DEFAULT_PERIOD_NS));
        if has_blocked {
            let blocked = backends.pyroscope.select_merge_span_profile(
                &q.clone().with_profile_type(BLOCK_DELAY_PROFILE_TYPE_ID),
            )?;
            both.blocked.extend(samples_of(&blocked, Some(id), None, 1));
        }
        if has_allocated {
            let allocated = backends
                .pyroscope
                .select_merge_span_profile(&q.with_profile_type(ALLOC_SPACE_PROFILE_TYPE_ID))?;
            both.allocated
                .extend(samples_of(&allocated, Some(id), None, u64::MAX));
        }
    }
    let ids: Vec<SpanId> = baseline_ids
        .iter()
        .filter_map(|h| SpanId::parse(h, "spanId").ok())
        .collect();
    let target_id = parse_span_id(&target.trace_id, &target.span_id)?;
    let before: Vec<&Span> = both
        .spans
        .iter()
        .filter(|s| ids.contains(&s.span_id))
        .collect();
    let after: Vec<&Span> = both
        .spans
        .iter()
        .filter(|s| s.span_id == target_id)
        .collect();
    let after_label = version.as_ref().map_or_else(
        || "this request".to_owned(),
        |v| format!("service.version {v} (this request)"),
    );
    out.diff = Some(VersionDiff::between_spans(
        &both,
        &target.name,
        (&out.baseline, &before),
        (&after_label, &after),
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_flame_graph_becomes_innermost_first_samples_of_the_span() {
        let graph = FlameGraph::from_json(&json!({
            "names": ["total", "main", "work"],
            "levels": [
                {"values": ["0", "30000000", "0", "0"]},
                {"values": ["0", "30000000", "10000000", "1"]},
                {"values": ["0", "20000000", "20000000", "2"]},
            ],
            "total": "30000000", "maxSelf": "20000000",
        }))
        .expect("a flame graph");
        let id = SpanId::from(7);
        let mut samples = samples_of(&graph, Some(id), None, DEFAULT_PERIOD_NS);
        samples.sort_by_key(|s| s.cpu_ns);
        let frames: Vec<Vec<&str>> = samples
            .iter()
            .map(|s| s.frames.iter().map(|f| f.as_ref()).collect())
            .collect();
        assert_eq!(frames, [vec!["main"], vec!["work", "main"]]);
        assert_eq!(samples[1].cpu_ns, 20_000_000);
        assert_eq!(samples[1].count, 2);
        assert!(samples.iter().all(|s| s.span_id == Some(id)));
    }

    #[test]
    fn only_requests_within_a_quarter_of_the_size_are_compared() {
        let span = |size: Option<&str>| TraceSpan {
            attributes: size
                .map(|v| (DEFAULT_SIZE_ATTRIBUTE.to_owned(), v.to_owned()))
                .into_iter()
                .collect(),
            ..TraceSpan::default()
        };
        let target = span(Some("1000"));
        let mut candidates: Vec<(TraceSpan, ())> = ["749", "750", "1250", "1251", "x"]
            .iter()
            .map(|v| (span(Some(v)), ()))
            .chain([(span(None), ())])
            .collect();
        let note = keep_comparable_sizes(None, &target, &mut candidates);
        assert!(note.is_some_and(|n| n.contains(DEFAULT_SIZE_ATTRIBUTE)));
        let kept: Vec<&str> = candidates
            .iter()
            .map(|(s, _)| s.attributes[DEFAULT_SIZE_ATTRIBUTE].as_str())
            .collect();
        assert_eq!(kept, ["750", "1250"]);
        // No size on the operation: nothing filtered, nothing said.
        let mut all = vec![(span(Some("5")), ())];
        assert_eq!(keep_comparable_sizes(None, &span(None), &mut all), None);
        assert_eq!(all.len(), 1);
        // A named attribute the operation lacks filters nothing either.
        assert_eq!(keep_comparable_sizes(Some("rows"), &target, &mut all), None);
    }

    #[test]
    fn traceql_strings_are_escaped() {
        assert_eq!(quoted(r#"GET "/x"\y"#), r#""GET \"/x\"\\y""#);
    }
}
