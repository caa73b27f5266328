//! The seed's verification checklist as functions returning structured results with the
//! evidence (trace id, span id, CPU ms vs wall ms, top function, pass/fail and why).
//!
//! Every check reads the backends through [`crate::clients`] only, polling with a bounded
//! timeout because real backends ingest asynchronously.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use otel_profiling::export::pyroscope::PROFILE_TYPE_ID;
use otel_profiling::{CPU_TIME_ATTRIBUTE, PROFILE_ID_ATTRIBUTE, WALL_ACTIVE_ATTRIBUTE};
use otel_profiling_cli::investigate::{
    self, Backends as InvestigateBackends, Baseline, Investigation, OperationQuery,
};
use otel_profiling_cli::report::SpanGroup;
use otel_profiling_cli::verdict::Verdict as ReportVerdict;

use crate::clients::{
    Auth, FlameGraph, PyroscopeClient, QueryError, SpanProfileQuery, TempoClient, TraceSpan,
};
use crate::recorder::RecordedOp;

/// Where the checks read and where recordings send.
#[derive(Debug, Clone)]
pub struct Backends {
    /// Tempo API base URL.
    pub tempo_url: String,
    /// Pyroscope base URL.
    pub pyroscope_url: String,
    /// OTLP/HTTP base endpoint (`/v1/traces` is appended).
    pub otlp_endpoint: String,
    /// How long to wait for data to show up.
    pub timeout: Duration,
    /// Tempo client.
    pub tempo: TempoClient,
    /// Pyroscope client.
    pub pyroscope: PyroscopeClient,
    /// Recordings ship their profiles as OTLP profiles to Pyroscope's
    /// `/v1development/profiles` instead of its push API (the checks are the same).
    pub profiles_over_otlp: bool,
}

impl Backends {
    /// Backends at the given URLs.
    ///
    /// # Errors
    /// A URL that is not http(s), naming its variable.
    pub fn new(
        tempo: &str,
        pyroscope: &str,
        otlp: &str,
        timeout: Duration,
    ) -> Result<Backends, QueryError> {
        Ok(Backends {
            tempo_url: tempo.to_string(),
            pyroscope_url: pyroscope.to_string(),
            otlp_endpoint: otlp.to_string(),
            timeout,
            tempo: TempoClient::new(tempo)?,
            pyroscope: PyroscopeClient::new(pyroscope)?,
            profiles_over_otlp: false,
        })
    }

    /// The same backends, reading with `tempo` and `pyroscope` credentials.
    pub fn with_auth(mut self, tempo: Auth, pyroscope: Auth) -> Backends {
        self.tempo = self.tempo.with_auth(tempo);
        self.pyroscope = self.pyroscope.with_auth(pyroscope);
        self
    }

    /// The same backends, with profiles shipped over OTLP (`true`) or the push API.
    pub fn with_profiles_over_otlp(mut self, on: bool) -> Backends {
        self.profiles_over_otlp = on;
        self
    }

    /// From `TEMPO_URL`, `PYROSCOPE_URL` and `OTEL_EXPORTER_OTLP_ENDPOINT` (all three, or
    /// `None`); `CHECKLIST_TIMEOUT_SECS` overrides the 60 s wait;
    /// `CHECKLIST_PROFILES_OVER_OTLP=1` ships profiles as OTLP profiles. Reads with the
    /// credentials of `TEMPO_AUTH_TOKEN`, `TEMPO_BASIC_AUTH_USER`/`_PASSWORD`,
    /// `TEMPO_TENANT_ID` and their `PYROSCOPE_*` twins ([`Auth::from_env`]).
    pub fn from_env() -> Option<Result<Backends, QueryError>> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let timeout = get("CHECKLIST_TIMEOUT_SECS")
            .and_then(|s| s.parse().ok())
            .unwrap_or(60);
        let over_otlp = get("CHECKLIST_PROFILES_OVER_OTLP").is_some_and(|v| v.trim() == "1");
        let (tempo, pyroscope, otlp) = (
            get("TEMPO_URL")?,
            get("PYROSCOPE_URL")?,
            get("OTEL_EXPORTER_OTLP_ENDPOINT")?,
        );
        let backends = || -> Result<Backends, QueryError> {
            Ok(
                Backends::new(&tempo, &pyroscope, &otlp, Duration::from_secs(timeout))?
                    .with_auth(Auth::from_env("TEMPO")?, Auth::from_env("PYROSCOPE")?)
                    .with_profiles_over_otlp(over_otlp),
            )
        };
        Some(backends())
    }
}

/// What a check saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence {
    /// Trace id (32 hex).
    pub trace_id: String,
    /// Span id (16 hex).
    pub span_id: String,
    /// CPU time from the span profile query, ms.
    pub cpu_ms: Option<f64>,
    /// Span duration from the trace backend, ms.
    pub wall_ms: Option<f64>,
    /// Top function (by total among the workload's functions, else by self).
    pub top_function: Option<String>,
    /// Anything else worth printing.
    pub notes: Vec<String>,
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    /// Checklist item number (1–6).
    pub number: u8,
    /// What it checks.
    pub title: &'static str,
    /// Pass or fail.
    pub passed: bool,
    /// Why (the failing condition, or what passed).
    pub reason: String,
    /// Evidence, one entry per operation looked at.
    pub evidence: Vec<Evidence>,
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {}. {} — {}",
            if self.passed { "PASS" } else { "FAIL" },
            self.number,
            self.title,
            self.reason
        )?;
        for e in &self.evidence {
            writeln!(
                f,
                "       trace {} span {} cpu {} wall {} top {}",
                e.trace_id,
                e.span_id,
                e.cpu_ms.map_or("-".into(), |v| format!("{v:.0} ms")),
                e.wall_ms.map_or("-".into(), |v| format!("{v:.0} ms")),
                e.top_function.as_deref().unwrap_or("-"),
            )?;
            for n in &e.notes {
                writeln!(f, "         {n}")?;
            }
        }
        Ok(())
    }
}

/// The backends and query `investigate` reads recorded span `op` with (no control).
fn investigation_of(b: &Backends, op: &RecordedOp) -> (InvestigateBackends, OperationQuery) {
    let backends = InvestigateBackends {
        tempo: b.tempo.clone(),
        pyroscope: b.pyroscope.clone(),
    };
    let mut query = OperationQuery::of_trace(&op.trace_id);
    query.span_id = Some(op.span_id.clone());
    query.baseline = Baseline::Off;
    query.upload_interval = crate::workload::UPLOAD_INTERVAL;
    (backends, query)
}

/// The span report's verdict for one recorded span, read back from the backends as
/// `otel-profiling investigate` reads it (the trace from Tempo, the span's profile from
/// Pyroscope): the same split, verdict and sentence `report`, `diff` and the HTML page give
/// (`cli/src/verdict.rs`), so the checklist cannot disagree with the tools users read.
pub fn report_verdict(b: &Backends, op: &RecordedOp) -> Result<SpanGroup, String> {
    let (backends, query) = investigation_of(b, op);
    let inv = Investigation::run(&backends, &query).map_err(|e| format!("investigate: {e}"))?;
    inv.group()
        .cloned()
        .ok_or_else(|| format!("investigate read no span group for {}", op.span_id))
}

/// Whether a CPU-heavy span's verdict says so: CPU-bound, or — on a machine whose CPUs
/// other processes held — waiting for a CPU with CPU and run delay together at least
/// 80 % of its wall time (computing whenever it had a CPU).
pub fn reads_cpu_heavy(group: &SpanGroup) -> bool {
    match group.verdict {
        ReportVerdict::CpuBound => true,
        ReportVerdict::WaitingForCpu => {
            let split = &group.split;
            (split.cpu_in_wall_ns + split.runqueue_ns) * 10 >= group.wall_total_ns * 8
        }
        _ => false,
    }
}

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

/// Polls Tempo until the trace holds `span_id`.
pub fn wait_for_span(b: &Backends, trace_id: &str, span_id: &str) -> Result<TraceSpan, String> {
    let deadline = Instant::now() + b.timeout;
    loop {
        let last = match b.tempo.get_trace(trace_id) {
            Ok(Some(spans)) => {
                if let Some(s) = spans.spans.into_iter().find(|s| s.span_id == span_id) {
                    return Ok(s);
                }
                format!("trace {trace_id} found without span {span_id}")
            }
            Ok(None) => format!("trace {trace_id} not found"),
            Err(e) => format!("trace {trace_id}: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(format!("{last} after {:?}", b.timeout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls the span profile query until it is non-empty (or the timeout; the last answer,
/// possibly empty, is returned).
pub fn wait_for_profile(b: &Backends, query: &SpanProfileQuery) -> Result<FlameGraph, String> {
    let deadline = Instant::now() + b.timeout;
    loop {
        let graph = b
            .pyroscope
            .select_merge_span_profile(query)
            .map_err(|e| format!("SelectMergeSpanProfile: {e}"))?;
        if !graph.is_empty() || Instant::now() >= deadline {
            return Ok(graph);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn top(graph: &FlameGraph, known: &[&str]) -> Option<String> {
    graph
        .top_function_matching(known)
        .or_else(|| graph.top_function())
        .map(|(n, _)| n)
}

fn evidence(
    op: &RecordedOp,
    span: Option<&TraceSpan>,
    graph: Option<&FlameGraph>,
    known: &[&str],
) -> Evidence {
    Evidence {
        trace_id: op.trace_id.clone(),
        span_id: op.span_id.clone(),
        cpu_ms: graph.map(|g| ms(g.total)),
        wall_ms: span.map(TraceSpan::wall_ms),
        top_function: graph.and_then(|g| top(g, known)),
        notes: Vec::new(),
    }
}

fn fail(number: u8, title: &'static str, reason: String, evidence: Vec<Evidence>) -> CheckResult {
    CheckResult {
        number,
        title,
        passed: false,
        reason,
        evidence,
    }
}

/// (1) The operation's trace is in the trace backend and its profile in the profile
/// backend (found by the Grafana-style span query) and holds `known_function`.
pub fn check_recorded(b: &Backends, op: &RecordedOp, known_function: &str) -> CheckResult {
    const TITLE: &str = "trace and profile of a known operation are available";
    let mut ev = evidence(op, None, None, &[]);
    let span = match wait_for_span(b, &op.trace_id, &op.span_id) {
        Ok(s) => s,
        Err(e) => return fail(1, TITLE, format!("trace backend: {e}"), vec![ev]),
    };
    let query = SpanProfileQuery::for_span(&span);
    let graph = match wait_for_profile(b, &query) {
        Ok(g) => g,
        Err(e) => return fail(1, TITLE, e, vec![ev]),
    };
    ev = evidence(op, Some(&span), Some(&graph), &[known_function]);
    ev.notes.push(format!("query {}", query.label_selector));
    if graph.is_empty() {
        return fail(
            1,
            TITLE,
            format!(
                "profile backend has no samples for span {} after {:?}",
                op.span_id, b.timeout
            ),
            vec![ev],
        );
    }
    let known = graph.function_total(known_function);
    if known == 0 {
        return fail(
            1,
            TITLE,
            format!("the span's profile does not contain {known_function}"),
            vec![ev],
        );
    }
    CheckResult {
        number: 1,
        title: TITLE,
        passed: true,
        reason: format!(
            "trace has span {:?}; profile holds {:.0} ms CPU, {:.0} ms in {known_function}",
            span.name,
            ms(graph.total),
            ms(known)
        ),
        evidence: vec![ev],
    }
}

/// (2) `pyroscope.profile.id` on the local root equals its span id, and the Grafana-style
/// query selects this operation's profile and not another's: the same query with another
/// `service_version` or `service_name` returns nothing for the span.
pub fn check_profile_link(b: &Backends, op: &RecordedOp, known_function: &str) -> CheckResult {
    const TITLE: &str =
        "span carries pyroscope.profile.id and the Grafana query selects its profile";
    let mut ev = evidence(op, None, None, &[]);
    let span = match wait_for_span(b, &op.trace_id, &op.span_id) {
        Ok(s) => s,
        Err(e) => return fail(2, TITLE, format!("trace backend: {e}"), vec![ev]),
    };
    ev.wall_ms = Some(span.wall_ms());
    if span.parent_span_id.is_some() {
        ev.notes
            .push("span has a parent in the trace (local root with remote parent?)".into());
    }
    match span.attributes.get(PROFILE_ID_ATTRIBUTE) {
        None => {
            return fail(
                2,
                TITLE,
                format!(
                    "span {} has no {PROFILE_ID_ATTRIBUTE} attribute",
                    op.span_id
                ),
                vec![ev],
            )
        }
        Some(v) if v != &span.span_id => {
            return fail(
                2,
                TITLE,
                format!(
                    "{PROFILE_ID_ATTRIBUTE} = {v}, but the span id is {}",
                    span.span_id
                ),
                vec![ev],
            )
        }
        Some(_) => {}
    }
    let query = SpanProfileQuery::for_span(&span);
    let graph = match wait_for_profile(b, &query) {
        Ok(g) => g,
        Err(e) => return fail(2, TITLE, e, vec![ev]),
    };
    ev = evidence(op, Some(&span), Some(&graph), &[known_function]);
    ev.notes.push(format!(
        "query {} span {}",
        query.label_selector, op.span_id
    ));
    if graph.is_empty() {
        return fail(
            2,
            TITLE,
            format!(
                "the Grafana-style query returned no samples for span {}",
                op.span_id
            ),
            vec![ev],
        );
    }
    if graph.function_total(known_function) == 0 {
        return fail(
            2,
            TITLE,
            format!("the profile selected for the span lacks its function {known_function}"),
            vec![ev],
        );
    }
    for (key, label) in [
        ("service.version", "service_version"),
        ("service.name", "service_name"),
    ] {
        let mut other = span.clone();
        let value = other.resource.get(key).cloned().unwrap_or_default();
        other
            .resource
            .insert(key.to_string(), format!("{value}-other"));
        let q = SpanProfileQuery::for_span(&other);
        match b.pyroscope.select_merge_span_profile(&q) {
            Ok(g) if g.is_empty() => ev
                .notes
                .push(format!("another {label}: nothing (as it must)")),
            Ok(g) => {
                return fail(
                    2,
                    TITLE,
                    format!(
                        "the query with another {label} still returned {:.0} ms for the span",
                        ms(g.total)
                    ),
                    vec![ev],
                )
            }
            Err(e) => return fail(2, TITLE, format!("SelectMergeSpanProfile: {e}"), vec![ev]),
        }
    }
    CheckResult {
        number: 2,
        title: TITLE,
        passed: true,
        reason: format!(
            "{PROFILE_ID_ATTRIBUTE} = span id; query selects {:.0} ms of this span only",
            ms(graph.total)
        ),
        evidence: vec![ev],
    }
}

/// (3) The CPU-heavy span reads CPU-bound in the span report (or waiting for a CPU while
/// computing whenever it had one) and its profile holds its known function; the I/O-bound
/// span is slow but off CPU: waiting, or blocked (a synchronous call holding its thread).
/// The verdicts are the report's own ([`report_verdict`]).
pub fn check_cpu_vs_io(
    b: &Backends,
    cpu_op: &RecordedOp,
    io_op: &RecordedOp,
    known_function: &str,
) -> CheckResult {
    const TITLE: &str = "CPU-heavy span vs I/O-bound span";
    let mut evs = Vec::new();
    let mut spans = Vec::new();
    for op in [cpu_op, io_op] {
        match wait_for_span(b, &op.trace_id, &op.span_id) {
            Ok(s) => spans.push(s),
            Err(e) => {
                evs.push(evidence(op, None, None, &[]));
                return fail(3, TITLE, format!("trace backend: {e}"), evs);
            }
        }
    }
    // The CPU-heavy span's profile first (its upload carries the I/O span's samples too).
    let cpu_graph = match wait_for_profile(b, &SpanProfileQuery::for_span(&spans[0])) {
        Ok(g) => g,
        Err(e) => return fail(3, TITLE, e, evs),
    };
    let io_graph = match b
        .pyroscope
        .select_merge_span_profile(&SpanProfileQuery::for_span(&spans[1]))
    {
        Ok(g) => g,
        Err(e) => return fail(3, TITLE, format!("SelectMergeSpanProfile: {e}"), evs),
    };
    let (cpu_group, io_group) = match (report_verdict(b, cpu_op), report_verdict(b, io_op)) {
        (Ok(c), Ok(i)) => (c, i),
        (Err(e), _) | (_, Err(e)) => return fail(3, TITLE, e, evs),
    };
    let (cpu_wall, cpu_cpu) = (spans[0].wall_ms(), ms(cpu_graph.total));
    let (io_wall, io_cpu) = (spans[1].wall_ms(), ms(io_graph.total));
    let mut cpu_ev = evidence(cpu_op, Some(&spans[0]), Some(&cpu_graph), &[known_function]);
    cpu_ev.notes.push(format!(
        "{}: {} — {}",
        spans[0].name, cpu_group.verdict, cpu_group.reason
    ));
    let mut io_ev = evidence(io_op, Some(&spans[1]), Some(&io_graph), &[known_function]);
    io_ev.notes.push(format!(
        "{}: {} — {}",
        spans[1].name, io_group.verdict, io_group.reason
    ));
    let evs = vec![cpu_ev, io_ev];
    let mut problems = Vec::new();
    if !reads_cpu_heavy(&cpu_group) {
        problems.push(format!(
            "CPU-heavy span: {} — {}, expected CPU-bound",
            cpu_group.verdict, cpu_group.reason
        ));
    }
    if cpu_graph.function_total(known_function) == 0 {
        problems.push(format!("CPU-heavy span's profile lacks {known_function}"));
    }
    // Off CPU either way: awaiting, or (a synchronous call, as this one sleeps) a thread
    // held inside the span off CPU, which the report calls blocked in poll.
    if !matches!(
        io_group.verdict,
        ReportVerdict::Waiting | ReportVerdict::BlockedInPoll
    ) {
        problems.push(format!(
            "I/O-bound span: {} — {}, expected off CPU (waiting, or blocked in poll)",
            io_group.verdict, io_group.reason
        ));
    }
    if problems.is_empty() {
        CheckResult {
            number: 3,
            title: TITLE,
            passed: true,
            reason: format!(
                "CPU-heavy {cpu_cpu:.0}/{cpu_wall:.0} ms {}; I/O-bound {io_cpu:.0}/{io_wall:.0} ms {}",
                cpu_group.verdict, io_group.verdict
            ),
            evidence: evs,
        }
    } else {
        fail(3, TITLE, problems.join("; "), evs)
    }
}

/// (4) The seed's control: the same endpoint and response size in the older version shows
/// the regression's function with far less CPU (≤ 1/3 of the newer version's).
pub fn check_control(
    b: &Backends,
    old: &RecordedOp,
    new: &RecordedOp,
    function: &str,
) -> CheckResult {
    const TITLE: &str =
        "control: the older version spends far less CPU in the regression's function";
    let mut evs = Vec::new();
    let mut found = Vec::new();
    for op in [old, new] {
        let span = match wait_for_span(b, &op.trace_id, &op.span_id) {
            Ok(s) => s,
            Err(e) => {
                evs.push(evidence(op, None, None, &[]));
                return fail(4, TITLE, format!("trace backend: {e}"), evs);
            }
        };
        let graph = match wait_for_profile(b, &SpanProfileQuery::for_span(&span)) {
            Ok(g) => g,
            Err(e) => return fail(4, TITLE, e, evs),
        };
        let mut ev = evidence(op, Some(&span), Some(&graph), &[function]);
        ev.notes.push(format!(
            "{} {} {}: {function} {:.0} ms, response {} bytes",
            span.resource
                .get("service.version")
                .map(String::as_str)
                .unwrap_or("?"),
            span.name,
            span.span_id,
            ms(graph.function_total(function)),
            span.attributes
                .get("report.bytes")
                .map(String::as_str)
                .unwrap_or("?"),
        ));
        evs.push(ev);
        found.push((span, graph));
    }
    let (old_span, old_graph) = &found[0];
    let (new_span, new_graph) = &found[1];
    let version = |s: &TraceSpan| s.resource.get("service.version").cloned();
    let mut problems = Vec::new();
    if old_span.name != new_span.name {
        problems.push(format!(
            "different endpoints: {:?} vs {:?}",
            old_span.name, new_span.name
        ));
    }
    if version(old_span) == version(new_span) {
        problems.push("both operations come from the same version".to_string());
    }
    let bytes = |s: &TraceSpan| s.attributes.get("report.bytes").cloned();
    if bytes(old_span) != bytes(new_span) {
        problems.push(format!(
            "different response sizes: {:?} vs {:?}",
            bytes(old_span),
            bytes(new_span)
        ));
    }
    let (old_fn, new_fn) = (
        old_graph.function_total(function),
        new_graph.function_total(function),
    );
    if new_fn == 0 {
        problems.push(format!("the newer version's profile lacks {function}"));
    } else if old_fn.saturating_mul(3) > new_fn {
        problems.push(format!(
            "{function}: {:.0} ms (older) vs {:.0} ms (newer): not far less",
            ms(old_fn),
            ms(new_fn)
        ));
    }
    if problems.is_empty() {
        CheckResult {
            number: 4,
            title: TITLE,
            passed: true,
            reason: format!(
                "{function}: {:.0} ms in {} vs {:.0} ms in {}, same endpoint and response size",
                ms(old_fn),
                version(old_span).unwrap_or_default(),
                ms(new_fn),
                version(new_span).unwrap_or_default()
            ),
            evidence: evs,
        }
    } else {
        fail(4, TITLE, problems.join("; "), evs)
    }
}

/// (5) A span whose task blocks its worker inside a poll is called blocked in poll — not
/// waiting on a dependency, not CPU-bound — while a span awaiting a timer for as long is
/// called awaiting (so the check tells the two apart rather than naming everything
/// blocked).
pub fn check_blocked_in_poll(
    b: &Backends,
    blocking_op: &RecordedOp,
    awaiting_op: &RecordedOp,
) -> CheckResult {
    const TITLE: &str = "a span that blocks its worker is blocked in poll, not waiting";
    let mut evs = Vec::new();
    let mut spans = Vec::new();
    for op in [blocking_op, awaiting_op] {
        match wait_for_span(b, &op.trace_id, &op.span_id) {
            Ok(s) => spans.push(s),
            Err(e) => {
                evs.push(evidence(op, None, None, &[]));
                return fail(5, TITLE, format!("trace backend: {e}"), evs);
            }
        }
    }
    let mut problems = Vec::new();
    let mut verdicts = Vec::new();
    for (op, span) in [blocking_op, awaiting_op].into_iter().zip(&spans) {
        let mut ev = evidence(op, Some(span), None, &[]);
        if !span.attributes.contains_key(CPU_TIME_ATTRIBUTE)
            || !span.attributes.contains_key(WALL_ACTIVE_ATTRIBUTE)
        {
            problems.push(format!(
                "{} lacks {CPU_TIME_ATTRIBUTE} or {WALL_ACTIVE_ATTRIBUTE}",
                span.name
            ));
        }
        match report_verdict(b, op) {
            Ok(group) => {
                ev.notes.push(format!(
                    "{}: {} — {}",
                    span.name, group.verdict, group.reason
                ));
                verdicts.push(Some(group));
            }
            Err(e) => {
                problems.push(e);
                verdicts.push(None);
            }
        }
        evs.push(ev);
    }
    if let Some(group) = &verdicts[0] {
        if group.verdict != ReportVerdict::BlockedInPoll {
            problems.push(format!(
                "blocking span: {} — {}, expected blocked in poll",
                group.verdict, group.reason
            ));
        }
    }
    if let Some(group) = &verdicts[1] {
        if group.verdict != ReportVerdict::Waiting {
            problems.push(format!(
                "awaiting span: {} — {}, expected waiting",
                group.verdict, group.reason
            ));
        }
    }
    if problems.is_empty() {
        CheckResult {
            number: 5,
            title: TITLE,
            passed: true,
            reason: "the blocking span is blocked in poll, the awaiting span is awaiting"
                .to_string(),
            evidence: evs,
        }
    } else {
        fail(5, TITLE, problems.join("; "), evs)
    }
}

/// Title of check 6 (the `checklist` binary prints it with the result).
pub const INVESTIGATE_TITLE: &str =
    "otel-profiling investigate selects the profile Grafana's \"Profiles for this span\" selects";

/// What `otel-profiling investigate` selected for a span: the part of an [`Investigation`]
/// check 6 compares with Grafana's query.
#[derive(Clone, Debug, PartialEq)]
pub struct InvestigateSelection {
    /// The span investigated (16 hex).
    pub span_id: String,
    /// The label selector it reports.
    pub label_selector: String,
    /// The CPU span profile query it ran.
    pub span_query: SpanProfileQuery,
    /// Where its figures come from.
    pub evidence: investigate::Evidence,
    /// Its span group's CPU from the profile, ns (`None`: no group).
    pub profile_cpu_ns: Option<u64>,
}

impl InvestigateSelection {
    /// The selection of `inv`.
    pub fn of(inv: &Investigation) -> InvestigateSelection {
        InvestigateSelection {
            span_id: inv.span.span_id.clone(),
            label_selector: inv.label_selector.clone(),
            span_query: inv.span_query.clone(),
            evidence: inv.evidence,
            profile_cpu_ns: inv.group().map(|g| g.profile_cpu_ns),
        }
    }
}

/// What Grafana's "Profiles for this span" selects for the same span, for check 6.
#[derive(Clone, Debug, PartialEq)]
pub struct GrafanaSelection {
    /// Grafana's query ([`SpanProfileQuery::for_span`]: the span ±60 s).
    pub query: SpanProfileQuery,
    /// Its flame graph's total over its own window, ns.
    pub total: i64,
    /// The same query over the investigation's (wider) interval: its total, ns.
    pub total_over_investigation: i64,
    /// Every profile holding the span's samples is stamped inside Grafana's window (a
    /// profile is stamped at its interval's start, so at most one upload interval before
    /// the span, and the recordings' upload interval is within Grafana's margin): then
    /// Grafana's own window must select exactly what the wider interval selects.
    pub samples_within_window: bool,
}

/// How `investigate`'s selection for span `span_id` differs from Grafana's, one line
/// each; empty when both select the same profile (same series, span, profile type, an
/// interval containing Grafana's, the span's own evidence, and the same CPU total).
pub fn selection_differences(
    span_id: &str,
    grafana: &GrafanaSelection,
    inv: &InvestigateSelection,
) -> Vec<String> {
    let g = &grafana.query;
    let q = &inv.span_query;
    let mut out = Vec::new();
    if inv.span_id != span_id {
        out.push(format!(
            "investigate looked at span {}, not {span_id}",
            inv.span_id
        ));
    }
    if inv.label_selector != g.label_selector {
        out.push(format!(
            "label selector: investigate reports {}, Grafana queries {}",
            inv.label_selector, g.label_selector
        ));
    }
    if q.label_selector != g.label_selector {
        out.push(format!(
            "label selector: investigate's span profile query has {}, Grafana's {}",
            q.label_selector, g.label_selector
        ));
    }
    if q.span_selector != [span_id] {
        out.push(format!(
            "span selector: investigate's is {:?}, Grafana's [{span_id:?}]",
            q.span_selector
        ));
    }
    if q.profile_type_id != PROFILE_TYPE_ID {
        out.push(format!(
            "profile type: investigate's is {}, Grafana's {PROFILE_TYPE_ID}",
            q.profile_type_id
        ));
    }
    if q.start_ms > g.start_ms || q.end_ms < g.end_ms {
        out.push(format!(
            "interval: investigate's {}–{} ms does not contain Grafana's {}–{} ms",
            q.start_ms, q.end_ms, g.start_ms, g.end_ms
        ));
    }
    if inv.evidence != investigate::Evidence::Span {
        out.push(format!(
            "evidence: investigate's is {:?}, not the span's own samples",
            inv.evidence
        ));
    }
    if grafana.total_over_investigation <= 0 {
        out.push(
            "Grafana's query selects no samples over investigate's interval: nothing to compare"
                .to_string(),
        );
    }
    match inv.profile_cpu_ns {
        None => out.push("investigate's report has no group for the span".to_string()),
        Some(cpu) if i64::try_from(cpu).ok() != Some(grafana.total_over_investigation) => out
            .push(format!(
                "CPU: investigate's group has {cpu} ns, Grafana's query over the same interval {} ns",
                grafana.total_over_investigation
            )),
        Some(_) => {}
    }
    if grafana.total > grafana.total_over_investigation {
        out.push(format!(
            "Grafana's window selects {} ns, more than the {} ns of the interval containing it",
            grafana.total, grafana.total_over_investigation
        ));
    } else if grafana.samples_within_window && grafana.total != grafana.total_over_investigation {
        out.push(format!(
            "Grafana's ±60 s window selects {} ns, investigate's interval {} ns, though every \
             profile of the span lies in Grafana's window",
            grafana.total, grafana.total_over_investigation
        ));
    }
    out
}

/// (6) `otel-profiling investigate` on the operation's trace and span selects the profile
/// Grafana's "Profiles for this span" selects: the same label selector, span selector and
/// CPU profile type, over an interval containing Grafana's, from the span's own samples,
/// and its span group's CPU equals Grafana's flame graph total (Grafana's query run over
/// the investigation's interval, and over its own ±60 s window too, which holds every
/// profile of the span).
pub fn check_investigate_matches_grafana(
    b: &Backends,
    op: &RecordedOp,
    known_function: &str,
) -> CheckResult {
    const N: u8 = 6;
    let mut ev = evidence(op, None, None, &[]);
    let span = match wait_for_span(b, &op.trace_id, &op.span_id) {
        Ok(s) => s,
        Err(e) => {
            return fail(
                N,
                INVESTIGATE_TITLE,
                format!("trace backend: {e}"),
                vec![ev],
            )
        }
    };
    let grafana = SpanProfileQuery::for_span(&span);
    let graph = match wait_for_profile(b, &grafana) {
        Ok(g) => g,
        Err(e) => return fail(N, INVESTIGATE_TITLE, e, vec![ev]),
    };
    ev = evidence(op, Some(&span), Some(&graph), &[known_function]);
    if graph.is_empty() {
        return fail(
            N,
            INVESTIGATE_TITLE,
            format!(
                "Grafana's query returned no samples for span {} after {:?}",
                op.span_id, b.timeout
            ),
            vec![ev],
        );
    }
    let (backends, query) = investigation_of(b, op);
    let grafana_margin_ms = (span.start_unix_nano / 1_000_000) as i64 - grafana.start_ms;
    let samples_within_window =
        i64::try_from(query.upload_interval.as_millis()).unwrap_or(i64::MAX) <= grafana_margin_ms;
    let total = |q: &SpanProfileQuery| {
        b.pyroscope
            .select_merge_span_profile(q)
            .map(|g| g.total)
            .map_err(|e| format!("SelectMergeSpanProfile: {e}"))
    };
    // One observation: the investigation, then Grafana's query over both intervals. Two
    // equal observations in a row: the backend's data did not change in between (real
    // backends ingest asynchronously), so the comparison is of the same samples.
    let deadline = Instant::now() + b.timeout;
    let mut previous: Option<(InvestigateSelection, GrafanaSelection)> = None;
    let (selection, observed) = loop {
        let inv = match Investigation::run(&backends, &query) {
            Ok(inv) => InvestigateSelection::of(&inv),
            Err(e) => return fail(N, INVESTIGATE_TITLE, format!("investigate: {e}"), vec![ev]),
        };
        let wide = grafana
            .clone()
            .with_interval(inv.span_query.start_ms, inv.span_query.end_ms);
        let observed = match (total(&grafana), total(&wide)) {
            (Ok(total), Ok(total_over_investigation)) => GrafanaSelection {
                query: grafana.clone(),
                total,
                total_over_investigation,
                samples_within_window,
            },
            (Err(e), _) | (_, Err(e)) => return fail(N, INVESTIGATE_TITLE, e, vec![ev]),
        };
        let now = (inv, observed);
        if previous.as_ref() == Some(&now) {
            break now;
        }
        if Instant::now() >= deadline {
            ev.notes
                .push("the backends' answers still changed between observations".into());
            break now;
        }
        previous = Some(now);
        std::thread::sleep(Duration::from_millis(100));
    };
    let q = &selection.span_query;
    ev.notes.push(format!(
        "Grafana: {} span {} {}–{} ms: {} ns",
        grafana.label_selector, op.span_id, grafana.start_ms, grafana.end_ms, observed.total
    ));
    ev.notes.push(format!(
        "investigate: {} span {:?} {} {}–{} ms, evidence {:?}, group CPU {} ns",
        q.label_selector,
        q.span_selector,
        q.profile_type_id,
        q.start_ms,
        q.end_ms,
        selection.evidence,
        selection
            .profile_cpu_ns
            .map_or("-".to_string(), |n| n.to_string())
    ));
    ev.notes.push(format!(
        "Grafana's query over investigate's interval: {} ns",
        observed.total_over_investigation
    ));
    let problems = selection_differences(&op.span_id, &observed, &selection);
    if problems.is_empty() {
        CheckResult {
            number: N,
            title: INVESTIGATE_TITLE,
            passed: true,
            reason: format!(
                "same series, span {} and profile type as Grafana's, over {}–{} ms ⊇ its \
                 window: {:.0} ms CPU in both",
                op.span_id,
                q.start_ms,
                q.end_ms,
                ms(observed.total)
            ),
            evidence: vec![ev],
        }
    } else {
        fail(N, INVESTIGATE_TITLE, problems.join("; "), vec![ev])
    }
}

/// The recorded operations the six checks need.
#[derive(Clone, Debug)]
pub struct Recordings {
    /// CPU-heavy root span.
    pub cpu: RecordedOp,
    /// I/O-bound root span.
    pub io: RecordedOp,
    /// `GET /report`, older version.
    pub report_old: RecordedOp,
    /// `GET /report`, newer version.
    pub report_new: RecordedOp,
    /// A task blocking its worker inside a poll.
    pub blocking: RecordedOp,
    /// A task awaiting a timer.
    pub awaiting: RecordedOp,
}

/// Runs the six checks.
pub fn run_all(b: &Backends, r: &Recordings) -> Vec<CheckResult> {
    use crate::workload::{CPU_FUNCTION, SERIALIZE_FUNCTION};
    vec![
        check_recorded(b, &r.cpu, CPU_FUNCTION),
        check_profile_link(b, &r.cpu, CPU_FUNCTION),
        check_cpu_vs_io(b, &r.cpu, &r.io, CPU_FUNCTION),
        check_control(b, &r.report_old, &r.report_new, SERIALIZE_FUNCTION),
        check_blocked_in_poll(b, &r.blocking, &r.awaiting),
        check_investigate_matches_grafana(b, &r.cpu, CPU_FUNCTION),
    ]
}

/// Records everything the checks need, each scenario in a child process of `exe`
/// (`exe record ...`), one after the other (so they do not compete for CPU).
pub fn record_all(exe: &std::path::Path, b: &Backends) -> Result<Recordings, String> {
    use crate::recorder::{record_in_child, unique_service_name};
    use crate::workload::{RecordSpec, Scenario, AWAITING_SPAN, BLOCKING_SPAN, CPU_SPAN, IO_SPAN};
    let service = unique_service_name("app");
    let spec = |scenario, version: &str| RecordSpec {
        otlp_endpoint: b.otlp_endpoint.clone(),
        pyroscope_url: b.pyroscope_url.clone(),
        service_name: service.clone(),
        service_version: version.to_string(),
        scenario,
        profile_id: true,
        profiles_over_otlp: b.profiles_over_otlp,
    };
    let ops = record_in_child(exe, &spec(Scenario::CpuAndIo, "1.5.0"))?;
    let by_name: BTreeMap<&str, &RecordedOp> = ops.iter().map(|o| (o.name.as_str(), o)).collect();
    let cpu = (*by_name.get(CPU_SPAN).ok_or("no CPU-heavy span recorded")?).clone();
    let io = (*by_name.get(IO_SPAN).ok_or("no I/O-bound span recorded")?).clone();
    let report_old = record_in_child(exe, &spec(Scenario::ReportOld, "1.4.0"))?.remove(0);
    let report_new = record_in_child(exe, &spec(Scenario::ReportNew, "1.5.0"))?.remove(0);
    let ops = record_in_child(exe, &spec(Scenario::BlockingAndAwaiting, "1.5.0"))?;
    let find = |name: &str| {
        ops.iter()
            .find(|o| o.name == name)
            .cloned()
            .ok_or(format!("no {name} span recorded"))
    };
    Ok(Recordings {
        cpu,
        io,
        report_old,
        report_new,
        blocking: find(BLOCKING_SPAN)?,
        awaiting: find(AWAITING_SPAN)?,
    })
}
