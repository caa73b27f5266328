//! The span report: per (span name — or `{method} {route}` for HTTP server spans with an
//! `http.route` — and service version), wall time against the CPU time the
//! profiles and the span attributes record, a verdict, and the functions that used the CPU.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;

use crate::concurrent::Concurrent;
use crate::dependencies::{ChildIndex, Dependencies};
use crate::error::ReportError;
use crate::format::{ms, percent, Table};
use crate::functions::{FunctionCpu, FunctionTotals};
use crate::ids::{SpanId, TraceId};
use crate::input::Sampling;
use crate::input::{version_label, Input, Span};
use crate::split::{Part, Percent, TimeSplit, PART_ORDER};
use crate::stats::percentile;
use crate::verdict::{has_evidence, EvidenceContext, NoSamples, Verdict};

/// How many functions each top list holds.
pub const TOP_FUNCTIONS: usize = 5;

/// A line of the report's list of spans without samples: name, version, reason's kind.
type GroupKey<'a> = (&'a str, Option<&'a str>, NoSamples);

/// Spans without samples shown per group and reason in the text report.
const EXAMPLES_SHOWN: usize = 3;

/// The report over one or more directories.
#[derive(Clone, Debug)]
pub struct SpanReport {
    /// The directories read.
    pub dirs: Vec<PathBuf>,
    /// Profile files read.
    pub profile_files: usize,
    /// Span files read.
    pub span_files: usize,
    /// The sampling the profiles were taken with.
    pub sampling: Sampling,
    /// One entry per (span name or route, service version) of the local root spans, sorted.
    pub groups: Vec<SpanGroup>,
    /// Every local root span without CPU samples, with the reason.
    pub without_samples: Vec<SpanWithoutSamples>,
    /// CPU samples not tied to any local root span read.
    pub outside_spans: OutsideSpans,
    /// Executables without debug info (`debug = 0`, stripped): the report says once
    /// that their inlined functions count in their callers.
    pub without_debug_info: Vec<String>,
    /// Whether the text form lists every frame (`--all-frames`) rather than the user's
    /// own code first with the runtime and libraries grouped.
    pub all_frames: bool,
}

/// The local root spans of one name and one `service.version`.
#[derive(Clone, Debug)]
pub struct SpanGroup {
    /// Span name, or `{method} {route}` for spans carrying `http.route`.
    pub name: String,
    /// The resource's `service.version` (`None` when absent).
    pub version: Option<String>,
    /// Number of spans.
    pub count: usize,
    /// Their span ids.
    pub span_ids: Vec<SpanId>,
    /// Median wall time (nearest rank), nanoseconds.
    pub wall_p50_ns: u64,
    /// 95th percentile wall time (nearest rank), nanoseconds.
    pub wall_p95_ns: u64,
    /// Sum of the wall times, nanoseconds.
    pub wall_total_ns: u64,
    /// CPU time of the profile samples labelled with these span ids, nanoseconds.
    pub profile_cpu_ns: u64,
    /// Number of those samples.
    pub profile_samples: u64,
    /// Sum of `profiling.cpu.time_ns` (`None` when no span carries it).
    pub attribute_cpu_ns: Option<u64>,
    /// Sum of `profiling.cpu.samples` (`None` when no span carries it).
    pub attribute_samples: Option<u64>,
    /// Profile CPU / total wall time (0 when the wall time is 0).
    pub cpu_ratio: f64,
    /// Where the wall time went: CPU, blocked inside a poll, awaiting (see [`TimeSplit`]).
    pub split: TimeSplit,
    /// The child spans under these roots and the wall time they cover.
    pub dependencies: Dependencies,
    /// Where the spans blocked inside a poll, from the blocked-in-poll profile: the user's
    /// functions holding the blocked wall time (in `cpu_ns`), most first.
    pub blocking: Vec<FunctionCpu>,
    /// Total blocked wall time in that profile for these spans, ns.
    pub blocked_profile_ns: u64,
    /// What these spans allocated, when the bridge sampled allocations (its
    /// `ProfilingAllocator` installed): `None` when neither the spans' attributes nor an
    /// allocation profile say anything.
    pub allocations: Option<GroupAllocations>,
    /// For a group that is not CPU-bound: what the service's threads did meanwhile (never
    /// the spans' own profile; `None` for CPU-bound groups or without timed profiles).
    pub concurrent: Option<Concurrent>,
    /// Computing, blocked in poll, waiting or mixed.
    pub verdict: Verdict,
    /// Why.
    pub reason: String,
    /// Why there are no CPU samples, when there are none.
    pub no_samples: Option<NoSamples>,
    /// The functions with the most self CPU (innermost frame), most first.
    pub top_self: Vec<FunctionCpu>,
    /// The functions with the most total CPU (anywhere on the stack), most first.
    pub top_total: Vec<FunctionCpu>,
    /// The functions of the user's code with the most CPU in them or in the library code
    /// they called (innermost frame of the user's code), most first.
    pub user_self: Vec<FunctionCpu>,
    /// The functions of the user's code with the most total CPU, most first.
    pub user_total: Vec<FunctionCpu>,
    /// CPU whose innermost frame is runtime or library code, per group (`tokio`, `std`,
    /// `libc`…; `function` is the group), most first.
    pub grouped: Vec<FunctionCpu>,
    /// HTTP server spans with a method and no `http.route`: requests no route matched
    /// (404s, paths outside the router). Not an endpoint of the service: the report lists
    /// these groups in one line at its end, without advice.
    pub unmatched_route: bool,
    /// Spans that all carry tower-http's default name `request` and no route: every
    /// endpoint falls into this one group.
    pub unnamed_requests: bool,
}

/// What a group's spans allocated: estimates, from allocation samples weighted by the
/// inverse of their probability (see the bridge's `docs/allocations.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupAllocations {
    /// Spans carrying `profiling.alloc.bytes`.
    pub spans: usize,
    /// Sum of their `profiling.alloc.bytes`.
    pub attribute_bytes: u64,
    /// Sum of their `profiling.alloc.count`.
    pub attribute_count: u64,
    /// Bytes of the allocation profiles' samples labelled with these span ids.
    pub profile_bytes: u64,
    /// Those samples.
    pub profile_samples: u64,
    /// The user's functions allocating most (innermost frame of the user's code; bytes in
    /// `cpu_ns`), most first; the innermost frames when the user's code is not known.
    pub top: Vec<FunctionCpu>,
    /// Bytes these spans' sampled allocations still held at the end of the newest
    /// allocation profile with in-use tracking (0: none held, or not tracked).
    pub held_bytes: u64,
    /// The user's functions whose allocations are held most, most first.
    pub held_top: Vec<FunctionCpu>,
}

impl GroupAllocations {
    /// Estimated bytes a span: the attributes' when the spans carry them (every
    /// sample's weight, even one a full buffer dropped from the profile), else the
    /// profile's.
    pub fn bytes_per_span(&self, count: usize) -> u64 {
        if self.spans > 0 {
            self.attribute_bytes / self.spans as u64
        } else {
            self.profile_bytes / count.max(1) as u64
        }
    }
}

/// A local root span that has no CPU sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanWithoutSamples {
    /// Span name, or `{method} {route}` (as its group's).
    pub name: String,
    /// The resource's `service.version`.
    pub version: Option<String>,
    /// Span id.
    pub span_id: SpanId,
    /// Trace id.
    pub trace_id: TraceId,
    /// Wall time, nanoseconds.
    pub wall_ns: u64,
    /// Why it has no sample.
    pub reason: NoSamples,
}

/// CPU samples that no local root span read accounts for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutsideSpans {
    /// CPU of samples labelled with a span name but no span id (unsampled traces keep
    /// their root's name), per name, sorted by name.
    pub name_only: Vec<(String, u64)>,
    /// CPU of samples whose span id is not a local root span of the span files read
    /// (span still open when the files were read, or its span file elsewhere).
    pub unknown_span_ns: u64,
    /// CPU of samples taken outside any span.
    pub no_span_ns: u64,
}

impl SpanReport {
    /// Reads `dirs` (see [`Input::load`]) and builds the report.
    pub fn from_dirs(dirs: &[PathBuf]) -> Result<SpanReport, ReportError> {
        Ok(SpanReport::from_input(&Input::load(dirs)?))
    }

    /// Builds the report from what was read.
    pub fn from_input(input: &Input) -> SpanReport {
        let sampling = input.sampling();
        let by_id = input.samples_by_span_id();
        let blocked_by_id = input.blocked_by_span_id();
        let allocated_by_id = input.allocated_by_span_id();
        let held_by_id = input.held_by_span_id();
        let roots = input.local_roots();
        let children = ChildIndex::new(&input.spans);
        let owners = input.ownership();
        let evidence = input.evidence();
        // By route when the span has one (see `Span::report_name`).
        let mut grouped: BTreeMap<(Cow<'_, str>, Option<&str>), Vec<&Span>> = BTreeMap::new();
        for span in &roots {
            grouped
                .entry((span.report_name(), span.service_version.as_deref()))
                .or_default()
                .push(span);
        }
        let mut without_samples = Vec::new();
        let mut groups: Vec<SpanGroup> = grouped
            .into_iter()
            .map(|((name, version), spans)| {
                let name = name.as_ref();
                // Requests no route matched are no endpoint: not listed span by span.
                let listed = if unmatched_route(&spans) {
                    &[][..]
                } else {
                    &spans[..]
                };
                for span in listed {
                    if !by_id.contains_key(&span.span_id) {
                        without_samples.push(SpanWithoutSamples {
                            name: name.to_owned(),
                            version: version.map(str::to_owned),
                            span_id: span.span_id,
                            trace_id: span.trace_id,
                            wall_ns: span.wall_ns(),
                            reason: NoSamples::classify(&[span], sampling, &evidence),
                        });
                    }
                }
                let sources = GroupSources {
                    by_id: &by_id,
                    blocked_by_id: &blocked_by_id,
                    allocated_by_id: &allocated_by_id,
                    held_by_id: &held_by_id,
                    sampling,
                    children: &children,
                    samples: &input.samples,
                    owners: owners.clone(),
                    evidence: &evidence,
                };
                build_group(name, version, &spans, &sources)
            })
            .collect();
        // Endpoints first; requests no route matched last (stable: by name within).
        groups.sort_by_key(|g| g.unmatched_route);
        SpanReport {
            dirs: input.dirs.clone(),
            profile_files: input.profile_files,
            span_files: input.span_files,
            sampling,
            groups,
            without_samples,
            outside_spans: outside_spans(input, &roots),
            without_debug_info: input.without_debug_info.iter().cloned().collect(),
            all_frames: false,
        }
    }

    /// The group of `name` and `version` (`None`: spans without `service.version`).
    pub fn group(&self, name: &str, version: Option<&str>) -> Option<&SpanGroup> {
        self.groups
            .iter()
            .find(|g| g.name == name && g.version.as_deref() == version)
    }
}

impl SpanGroup {
    /// The group of `spans` (local roots read into `input`) as the report builds it: the
    /// same split, verdict and reason. The diff builds each of its sides with it, so the
    /// two commands never disagree about a version.
    pub fn of_spans(
        input: &Input,
        name: &str,
        version: Option<&str>,
        spans: &[&Span],
    ) -> SpanGroup {
        let by_id = input.samples_by_span_id();
        let blocked_by_id = input.blocked_by_span_id();
        let allocated_by_id = input.allocated_by_span_id();
        let held_by_id = input.held_by_span_id();
        let children = ChildIndex::new(&input.spans);
        let sources = GroupSources {
            by_id: &by_id,
            blocked_by_id: &blocked_by_id,
            allocated_by_id: &allocated_by_id,
            held_by_id: &held_by_id,
            sampling: input.sampling(),
            children: &children,
            samples: &input.samples,
            owners: input.ownership(),
            evidence: &input.evidence(),
        };
        build_group(name, version, spans, &sources)
    }
}

/// What a group's figures are read from.
struct GroupSources<'a> {
    /// CPU samples by span id.
    by_id: &'a HashMap<SpanId, Vec<&'a crate::input::Sample>>,
    /// Blocked-in-poll samples by span id.
    blocked_by_id: &'a HashMap<SpanId, Vec<&'a crate::input::Sample>>,
    /// Allocation samples by span id.
    allocated_by_id: &'a HashMap<SpanId, Vec<&'a crate::input::Sample>>,
    /// In-use samples of the newest allocation profile by span id.
    held_by_id: &'a HashMap<SpanId, Vec<&'a crate::input::Sample>>,
    sampling: Sampling,
    children: &'a ChildIndex<'a>,
    /// Every CPU sample (for the concurrent activity).
    samples: &'a [crate::input::Sample],
    /// Whose code each frame is.
    owners: std::sync::Arc<crate::ownership::Ownership>,
    /// What the input says about the bridge's evidence.
    evidence: &'a EvidenceContext,
}

fn build_group(
    name: &str,
    version: Option<&str>,
    spans: &[&Span],
    sources: &GroupSources<'_>,
) -> SpanGroup {
    let (by_id, sampling, children, samples) = (
        sources.by_id,
        sources.sampling,
        sources.children,
        sources.samples,
    );
    let mut walls: Vec<u64> = spans.iter().map(|s| s.wall_ns()).collect();
    walls.sort_unstable();
    let wall_total_ns = walls.iter().sum::<u64>();
    let mut functions = FunctionTotals::with_owners(sources.owners.clone());
    let (mut profile_cpu_ns, mut profile_samples) = (0u64, 0u64);
    for sample in spans.iter().filter_map(|s| by_id.get(&s.span_id)).flatten() {
        profile_cpu_ns += sample.cpu_ns;
        profile_samples += sample.count;
        functions.add(sample);
    }
    let sum_of = |field: fn(&Span) -> Option<u64>| -> Option<u64> {
        spans
            .iter()
            .filter_map(|s| field(s))
            .fold(None, |acc: Option<u64>, v| Some(acc.unwrap_or(0) + v))
    };
    let attribute_cpu_ns = sum_of(|s| s.cpu_time_ns);
    let attribute_samples = sum_of(|s| s.cpu_samples);
    let cpu_ratio = if wall_total_ns == 0 {
        0.0
    } else {
        profile_cpu_ns as f64 / wall_total_ns as f64
    };
    // One split: the verdict compares its shares and the reason prints them, as the
    // table, the bars and the diff do.
    let split = TimeSplit::of_spans(spans, by_id);
    let mut verdict = Verdict::of_split(&split);
    let mut reason = verdict.reason(&split);
    let no_samples =
        (profile_cpu_ns == 0).then(|| NoSamples::classify(spans, sampling, sources.evidence));
    match no_samples {
        None => {}
        // The split's CPU is the attributes' here; the reason says why.
        Some(why @ (NoSamples::ProfileNotRead | NoSamples::CpuUnderSampling { .. })) => {
            reason = format!("{reason}; {}", why.explain(sampling));
        }
        // No samples, no active time, no evidence attribute: nothing says where the time
        // went, and no sample is no evidence of waiting.
        Some(why)
            if why.is_no_evidence()
                && split.active.is_none()
                && !spans.iter().any(|s| has_evidence(s)) =>
        {
            verdict = Verdict::NoEvidence;
            reason = why.explain(sampling);
        }
        Some(why) if split.active.is_none() => {
            reason = why.explain(sampling);
        }
        // No samples, yet a thread sat inside the span: blocked, not awaiting.
        Some(NoSamples::BlockedInPoll) if verdict == Verdict::BlockedInPoll => {
            reason =
                format!("{reason} (no CPU sample: it ran on no CPU long enough to be sampled)");
        }
        // Said only beside the verdict it explains (a queued span is not "waiting").
        Some(why @ NoSamples::Waiting) if verdict == Verdict::Waiting => {
            reason = format!("{reason}; {}", why.explain(sampling));
        }
        Some(NoSamples::Waiting | NoSamples::BlockedInPoll) => {}
        Some(why) => {
            reason = format!("{reason}; {}", why.explain(sampling));
        }
    }
    // Where it blocks: the watchdog's blocked stacks of these spans.
    let mut blocked_functions = FunctionTotals::with_owners(sources.owners.clone());
    let mut blocked_profile_ns = 0;
    for sample in spans
        .iter()
        .filter_map(|s| sources.blocked_by_id.get(&s.span_id))
        .flatten()
    {
        blocked_profile_ns += sample.cpu_ns;
        blocked_functions.add(sample);
    }
    let blocking = blocked_functions.top_user_self(TOP_FUNCTIONS);
    let reason = match (verdict, blocking.first()) {
        (Verdict::BlockedInPoll, Some(top)) => format!(
            "{reason}; {}",
            where_it_blocks(
                &top.function,
                top.cpu_ns,
                blocked_profile_ns,
                split.ns(Part::Blocked).unwrap_or(0)
            )
        ),
        _ => reason,
    };
    let allocations = group_allocations(spans, sources);
    let dependencies = Dependencies::of_roots(spans, children);
    let concurrent = (verdict != Verdict::CpuBound)
        .then(|| Concurrent::during(spans, samples, &sources.owners))
        .flatten();
    let unmatched_route = unmatched_route(spans);
    let unnamed_requests = spans
        .iter()
        .all(|s| s.name == "request" && s.http_route.is_none());
    let reason = if unmatched_route {
        "requests no route matched (no http.route: 404s, paths outside the router)".to_owned()
    } else if verdict == Verdict::Waiting {
        match waiting_on(&split, &dependencies) {
            Some(on) => format!("{reason}; {on}"),
            None => reason,
        }
    } else {
        reason
    };
    SpanGroup {
        name: name.to_owned(),
        version: version.map(str::to_owned),
        count: spans.len(),
        span_ids: spans.iter().map(|s| s.span_id).collect(),
        wall_p50_ns: percentile(&walls, 50.0),
        wall_p95_ns: percentile(&walls, 95.0),
        wall_total_ns,
        profile_cpu_ns,
        profile_samples,
        attribute_cpu_ns,
        attribute_samples,
        cpu_ratio,
        split,
        dependencies,
        blocking,
        blocked_profile_ns,
        allocations,
        concurrent,
        verdict,
        reason,
        no_samples,
        top_self: functions.top_self(TOP_FUNCTIONS),
        top_total: functions.top_total(TOP_FUNCTIONS),
        user_self: functions.top_user_self(TOP_FUNCTIONS),
        user_total: functions.top_user_total(TOP_FUNCTIONS),
        grouped: functions.grouped(),
        unmatched_route,
        unnamed_requests,
    }
}

/// What `spans` allocated, from their `profiling.alloc.*` attributes and the allocation
/// profiles' samples labelled with their ids.
fn group_allocations(spans: &[&Span], sources: &GroupSources<'_>) -> Option<GroupAllocations> {
    let mut out = GroupAllocations::default();
    for span in spans {
        if let Some(bytes) = span.alloc_bytes {
            out.spans += 1;
            out.attribute_bytes += bytes;
            out.attribute_count += span.alloc_count.unwrap_or(0);
        }
    }
    let mut functions = FunctionTotals::with_owners(sources.owners.clone());
    for sample in spans
        .iter()
        .filter_map(|s| sources.allocated_by_id.get(&s.span_id))
        .flatten()
    {
        out.profile_bytes += sample.cpu_ns;
        out.profile_samples += sample.count;
        functions.add(sample);
    }
    out.top = functions.top_user_self(TOP_FUNCTIONS);
    if out.top.is_empty() {
        out.top = functions.top_self(TOP_FUNCTIONS);
    }
    let mut held = FunctionTotals::with_owners(sources.owners.clone());
    for sample in spans
        .iter()
        .filter_map(|s| sources.held_by_id.get(&s.span_id))
        .flatten()
    {
        out.held_bytes += sample.cpu_ns;
        held.add(sample);
    }
    out.held_top = held.top_user_self(TOP_HELD_FUNCTIONS);
    if out.held_top.is_empty() {
        out.held_top = held.top_self(TOP_HELD_FUNCTIONS);
    }
    (out.spans > 0 || out.profile_samples > 0 || out.held_bytes > 0).then_some(out)
}

/// Functions named for the memory a group's allocations still hold.
const TOP_HELD_FUNCTIONS: usize = 3;

/// One line: what a group allocated a span, and where (and what it still holds, with
/// in-use tracking).
pub(crate) fn describe_allocations(a: &GroupAllocations, count: usize) -> String {
    let per_span = a.bytes_per_span(count);
    let mut line = if a.spans > 0 {
        format!(
            "allocations: {} a span, {} allocation(s) (profiling.alloc.*, estimated over {} span(s))",
            crate::format::bytes(per_span),
            a.attribute_count / a.spans as u64,
            a.spans
        )
    } else {
        format!(
            "allocations: {} a span (the allocation profile's {} sample(s), estimated)",
            crate::format::bytes(per_span),
            a.profile_samples
        )
    };
    if !a.top.is_empty() && a.profile_bytes > 0 {
        let functions: Vec<String> = a
            .top
            .iter()
            .map(|t| {
                format!(
                    "{} {} ({})",
                    t.function,
                    crate::format::bytes(t.cpu_ns),
                    percent(t.cpu_ns, a.profile_bytes)
                )
            })
            .collect();
        line.push_str(&format!(
            "; where (allocation profile, {} in all): {}",
            crate::format::bytes(a.profile_bytes),
            functions.join(", ")
        ));
    }
    if a.held_bytes > 0 {
        let functions: Vec<String> = a
            .held_top
            .iter()
            .map(|t| format!("{} {}", t.function, crate::format::bytes(t.cpu_ns)))
            .collect();
        line.push_str(&format!(
            "; still held at the end of the newest profile (inuse_space): {} in all ({})",
            crate::format::bytes(a.held_bytes),
            functions.join(", ")
        ));
    }
    line
}

/// HTTP server spans that name a method and no route: requests no route matched.
/// Where a blocked group blocks, with how much of its blocked time the watchdog's
/// stacks cover: it takes one only for a block of 10 ms or more inside one poll, so a
/// group blocked in many short calls may be covered for a sliver of its blocked time,
/// and the share of the top function is of what was seen, not of the blocked time.
fn where_it_blocks(function: &str, top_ns: u64, seen_ns: u64, blocked_ns: u64) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let of_seen = 100.0 * top_ns as f64 / seen_ns.max(1) as f64;
    if blocked_ns == 0 {
        return format!(
            "it blocks in {function} ({of_seen:.0}% of the blocked time the watchdog saw)"
        );
    }
    let coverage = (100.0 * seen_ns as f64 / blocked_ns as f64).min(100.0);
    format!(
        "it blocks in {function} ({of_seen:.0}% of the blocked time the watchdog saw, which \
         is {:.1} of the {:.1} ms blocked, {coverage:.1}%: it takes a stack only for a block of \
         10 ms or more inside one poll)",
        ms(seen_ns),
        ms(blocked_ns),
    )
}

fn unmatched_route(spans: &[&Span]) -> bool {
    spans
        .iter()
        .all(|s| s.http_method.is_some() && s.http_route.is_none())
}

fn outside_spans(input: &Input, roots: &[&Span]) -> OutsideSpans {
    let root_ids: std::collections::HashSet<SpanId> = roots.iter().map(|s| s.span_id).collect();
    let mut out = OutsideSpans::default();
    let mut name_only: BTreeMap<&str, u64> = BTreeMap::new();
    for sample in &input.samples {
        match (&sample.span_id, &sample.span_name) {
            (Some(id), _) if root_ids.contains(id) => {}
            (Some(_), _) => out.unknown_span_ns += sample.cpu_ns,
            (None, Some(name)) => *name_only.entry(name).or_default() += sample.cpu_ns,
            (None, None) => out.no_span_ns += sample.cpu_ns,
        }
    }
    out.name_only = name_only
        .into_iter()
        .map(|(name, ns)| (name.to_owned(), ns))
        .collect();
    out
}

impl fmt::Display for SpanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period_ms = self.sampling.period_ns as f64 / 1e6;
        writeln!(
            f,
            "Span report: {} local root span(s) in {} group(s); {} profile file(s) ({period_ms:.0} ms sampling period), {} span file(s)",
            self.groups.iter().map(|g| g.count).sum::<usize>(),
            self.groups.len(),
            self.profile_files,
            self.span_files,
        )?;
        for dir in &self.dirs {
            writeln!(f, "  {}", dir.display())?;
        }
        if self.groups.is_empty() {
            return writeln!(f, "\nNo local root spans in the span files read.");
        }
        self.write_body(f)
    }
}

impl SpanReport {
    /// The report below its header: the table, each group, and the notes.
    pub(crate) fn write_body(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f)?;
        let listed = || self.groups.iter().filter(|g| !g.unmatched_route);
        // A column per part some group's split has, each cell that part's share as the
        // sentences print it ("-" where the group's split has no such part).
        let parts: Vec<Part> = PART_ORDER
            .into_iter()
            .filter(|&part| listed().any(|g| g.split.ns(part).is_some()))
            .collect();
        let mut header = vec![
            "SPAN",
            "VERSION",
            "COUNT",
            "WALL P50",
            "WALL P95",
            "CPU (PROFILE)",
            "CPU (ATTRS)",
        ];
        header.extend(parts.iter().map(|p| p.column()));
        header.push("VERDICT");
        let mut table = Table::new(&header)
            .left_align(1)
            .left_align(header.len() - 1);
        for g in listed() {
            let mut row = vec![
                g.name.clone(),
                version_label(g.version.as_deref()).to_owned(),
                g.count.to_string(),
                ms(g.wall_p50_ns),
                ms(g.wall_p95_ns),
                ms(g.profile_cpu_ns),
                g.attribute_cpu_ns.map_or_else(|| "-".to_owned(), ms),
            ];
            row.extend(parts.iter().map(|&part| share_cell(&g.split, part)));
            row.push(g.verdict.to_string());
            table.row(row);
        }
        write!(f, "{table}")?;
        for g in self.groups.iter().filter(|g| !g.unmatched_route) {
            write_group(f, g, self.all_frames)?;
        }
        self.write_unmatched(f)?;
        self.write_without_samples(f)?;
        self.write_outside_spans(f)?;
        self.write_without_debug_info(f)
    }
}

/// What a waiting group waits on: the child spans covering its time off CPU, or the
/// advice to instrument the call nothing covers when that time is worth it; `None` when
/// there is nothing to say (no child span, and too little uncovered to instrument).
fn waiting_on(split: &TimeSplit, deps: &Dependencies) -> Option<String> {
    // Awaiting when the active time splits it off; else all the time not on CPU.
    let (waiting_ns, part) = if split.active.is_some() {
        (split.awaiting_ns, Part::Awaiting)
    } else {
        (split.off_cpu_ns, Part::OffCpu)
    };
    describe_waiting(waiting_ns, part, split.wall_ns, deps)
}

/// Below this share of the waiting covered by child spans, they explain next to nothing
/// and the advice is to instrument the call that takes the rest; at or above it, the
/// report names the children and says how much no child covers, without advice (the rest
/// may be time between the calls).
const COVERED_ENOUGH_TO_NAME: f64 = 0.1;

/// Awaiting that no child span covers is worth instrumenting only from this much per span
/// (a 0.1 ms health check has no dependency call to find)…
pub const INSTRUMENT_FLOOR_NS: f64 = 5_000_000.0;
/// …and from this share of the wall time (a few ms beside a long computation are not
/// where the time went).
pub const INSTRUMENT_SHARE: Percent = Percent(20);

/// Whether `uncovered_ns_per_span` of time awaiting, `share` of the wall time, with no
/// child span over it, is worth "instrument the dependency call".
pub(crate) fn worth_instrumenting(uncovered_ns_per_span: f64, share: Option<Percent>) -> bool {
    uncovered_ns_per_span >= INSTRUMENT_FLOOR_NS && share.is_some_and(|s| s >= INSTRUMENT_SHARE)
}

fn describe_waiting(
    waiting_ns: u64,
    part: Part,
    wall_ns: u64,
    deps: &Dependencies,
) -> Option<String> {
    let roots = deps.roots.max(1) as f64;
    let per_root = |ns: u64| ns as f64 / roots / 1e6;
    let covered = deps.covered_ns.min(waiting_ns);
    let uncovered = waiting_ns - covered;
    let worth = worth_instrumenting(uncovered as f64 / roots, Percent::of(uncovered, wall_ns));
    let label = part.label();
    if deps.children.is_empty() {
        return worth.then(|| {
            format!(
                "no child span covers its {:.1} ms per span {label}: instrument the \
                 dependency call",
                per_root(waiting_ns)
            )
        });
    }
    Some(if 2 * covered >= waiting_ns {
        format!(
            "waiting on a dependency: {}, covering {:.1} of its {:.1} ms per span {label}",
            deps.describe(3),
            per_root(covered),
            per_root(waiting_ns)
        )
    } else if covered as f64 >= COVERED_ENOUGH_TO_NAME * waiting_ns as f64 {
        format!(
            "waiting on a dependency: {}, covering {:.1} of its {:.1} ms per span {label}; \
             the other {:.1} ms are in no child span",
            deps.describe(3),
            per_root(covered),
            per_root(waiting_ns),
            per_root(uncovered)
        )
    } else {
        let advice = if worth {
            ": instrument the dependency call that takes the rest"
        } else {
            ""
        };
        format!(
            "its child spans ({}) cover only {:.1} of its {:.1} ms per span {label}{advice}",
            deps.describe(3),
            per_root(covered),
            per_root(waiting_ns)
        )
    })
}

/// `part`'s share of the group's wall time as every view prints it, or `-` when the
/// group's split has no such part.
fn share_cell(split: &TimeSplit, part: Part) -> String {
    split
        .share(part)
        .map_or_else(|| "-".to_owned(), |share| share.to_string())
}

/// What to do about server spans all named `request` (tower-http's default).
pub const UNNAMED_REQUESTS_HINT: &str = "every span is named `request` with no http.route \
     (tower-http's `TraceLayer::new_for_http()`), so all endpoints share this one row: \
     `otel_profiling::axum::trace_layer()` names server spans `{method} {route}`, one row \
     per endpoint";

/// One group's section of the report: verdict, figures, split, child spans, top functions.
pub(crate) fn write_group(
    f: &mut fmt::Formatter<'_>,
    g: &SpanGroup,
    all_frames: bool,
) -> fmt::Result {
    writeln!(
        f,
        "\n{}, {}: {} — {}",
        g.name,
        version_phrase(g.version.as_deref()),
        g.verdict,
        g.reason
    )?;
    if g.unnamed_requests {
        writeln!(f, "  hint: {UNNAMED_REQUESTS_HINT}")?;
    }
    let attrs = match (g.attribute_cpu_ns, g.attribute_samples) {
        (Some(ns), samples) => format!(
            "{} in {} sample(s)",
            ms(ns),
            samples.map_or_else(|| "?".to_owned(), |n| n.to_string())
        ),
        (None, _) => "not recorded".to_owned(),
    };
    writeln!(
        f,
        "  {} span(s), wall total {}; CPU from the profile {} in {} sample(s), from the span attributes {attrs}",
        g.count,
        ms(g.wall_total_ns),
        ms(g.profile_cpu_ns),
        g.profile_samples,
    )?;
    let parts: Vec<String> = g
        .split
        .parts()
        .into_iter()
        .map(|(part, ns)| {
            format!(
                "{} {} ({})",
                part.label(),
                ms(ns),
                share_cell(&g.split, part)
            )
        })
        .collect();
    writeln!(
        f,
        "  where the wall time went: {} ({}; CPU sampled: {} sample(s), about one sampling \
         period each)",
        parts.join(", "),
        g.split.source(),
        g.split.cpu_samples
    )?;
    if !g.dependencies.children.is_empty() {
        writeln!(
            f,
            "  child spans per span: {}; together they cover {}",
            g.dependencies.describe(5),
            ms(g.dependencies.covered_ns / g.dependencies.roots.max(1) as u64)
        )?;
    }
    if !g.blocking.is_empty() {
        let functions: Vec<String> = g
            .blocking
            .iter()
            .map(|b| format!("{} {}", b.function, ms(b.cpu_ns)))
            .collect();
        writeln!(
            f,
            "  where it blocks (blocked-in-poll profile, {} blocked in all): {}",
            ms(g.blocked_profile_ns),
            functions.join(", ")
        )?;
    }
    if let Some(allocations) = &g.allocations {
        writeln!(f, "  {}", describe_allocations(allocations, g.count))?;
    }
    if let Some(concurrent) = &g.concurrent {
        writeln!(f, "  {}", concurrent.describe())?;
    }
    // Stacks of async services are mostly runtime frames, which hold 100 % of the total
    // and hide the user's functions; those come first unless every frame was asked for.
    let lists = if all_frames {
        [
            ("top functions by self CPU (innermost frame):", &g.top_self),
            (
                "top functions by total CPU (anywhere on the stack):",
                &g.top_total,
            ),
        ]
    } else {
        [
            (
                "top functions of your code by self CPU (its own code and the library calls it makes):",
                &g.user_self,
            ),
            (
                "top functions of your code by total CPU (anywhere on the stack):",
                &g.user_total,
            ),
        ]
    };
    for (title, list) in lists {
        if list.is_empty() {
            continue;
        }
        writeln!(f, "  {title}")?;
        let mut table = Table::new(&["CPU", "SHARE", "FUNCTION"])
            .left_align(2)
            .indent(4);
        for function in list {
            table.row(vec![
                ms(function.cpu_ns),
                percent(function.cpu_ns, g.profile_cpu_ns),
                function.function.clone(),
            ]);
        }
        write!(f, "{table}")?;
    }
    if !all_frames && !g.grouped.is_empty() {
        let groups: Vec<String> = g
            .grouped
            .iter()
            .map(|group| {
                format!(
                    "{} {}",
                    group.function,
                    percent(group.cpu_ns, g.profile_cpu_ns).trim()
                )
            })
            .collect();
        writeln!(
            f,
            "  in runtime and libraries (innermost frame; --all-frames lists them): {}",
            groups.join(", ")
        )?;
    }
    Ok(())
}

impl SpanReport {
    /// Once, when a profiled executable has no debug info.
    fn write_without_debug_info(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.without_debug_info.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "\nNo inline information: {} has no debug info (`debug = 0` or stripped), so \
             functions inlined into others count as those others here, and your code is \
             the crate of `main` (name others with `--crate`). Build with \
             `[profile.release] debug = \"line-tables-only\"` to see them \
             (docs/build-settings.md).",
            self.without_debug_info.join(", ")
        )
    }

    /// The groups of requests no route matched, in one line.
    fn write_unmatched(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unmatched: Vec<String> = self
            .groups
            .iter()
            .filter(|g| g.unmatched_route)
            .map(|g| {
                format!(
                    "{}, {} ({} span(s), wall p50 {})",
                    g.name,
                    version_phrase(g.version.as_deref()),
                    g.count,
                    ms(g.wall_p50_ns)
                )
            })
            .collect();
        if unmatched.is_empty() {
            return Ok(());
        }
        writeln!(
            f,
            "\nUnmatched routes (no http.route: 404s and other requests no route matched, not \
             endpoints): {}",
            unmatched.join(", ")
        )
    }

    fn write_without_samples(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.without_samples.is_empty() {
            return Ok(());
        }
        writeln!(f, "\nSpans without CPU samples:")?;
        // Grouped by the reason's kind: one whose figure differs per span (the CPU a
        // span's attribute records) would otherwise make a line of every span.
        let mut by_group: BTreeMap<GroupKey<'_>, (NoSamples, Vec<&SpanWithoutSamples>)> =
            BTreeMap::new();
        for span in &self.without_samples {
            let key = (
                span.name.as_str(),
                span.version.as_deref(),
                span.reason.kind(),
            );
            match by_group.get_mut(&key) {
                Some((reason, spans)) => {
                    *reason = reason.merged(span.reason);
                    spans.push(span);
                }
                None => {
                    by_group.insert(key, (span.reason, vec![span]));
                }
            }
        }
        let mut reasons: Vec<NoSamples> = Vec::new();
        for ((name, version, _), (reason, spans)) in &by_group {
            let examples: Vec<String> = spans
                .iter()
                .take(EXAMPLES_SHOWN)
                .map(|s| format!("{} ({})", s.span_id, ms(s.wall_ns)))
                .collect();
            let more = spans.len().saturating_sub(EXAMPLES_SHOWN);
            writeln!(
                f,
                "  {name}, {}: {} span(s), {}: {}{}",
                version_phrase(*version),
                spans.len(),
                *reason,
                examples.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            )?;
            match reasons.iter_mut().find(|r| r.kind() == reason.kind()) {
                Some(known) => *known = known.merged(*reason),
                None => reasons.push(*reason),
            }
        }
        writeln!(f, "  why:")?;
        for reason in reasons {
            writeln!(f, "  - {}", reason.explain(self.sampling))?;
        }
        Ok(())
    }

    fn write_outside_spans(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.outside_spans;
        if o.name_only.is_empty() && o.unknown_span_ns == 0 && o.no_span_ns == 0 {
            return Ok(());
        }
        writeln!(f, "\nCPU not tied to a local root span read here:")?;
        for (name, ns) in &o.name_only {
            writeln!(
                f,
                "  {}  span name {name:?} only (unsampled traces)",
                ms(*ns)
            )?;
        }
        if o.unknown_span_ns > 0 {
            writeln!(
                f,
                "  {}  span ids in no span file read (spans still open, or their span file is elsewhere)",
                ms(o.unknown_span_ns)
            )?;
        }
        if o.no_span_ns > 0 {
            writeln!(f, "  {}  outside any span", ms(o.no_span_ns))?;
        }
        Ok(())
    }
}

/// `version 1.4.0`, or `no service.version`.
fn version_phrase(version: Option<&str>) -> String {
    version.map_or_else(
        || "no service.version".to_owned(),
        |v| format!("version {v}"),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::dependencies::ChildCoverage;
    use crate::split::arbitrary;

    /// The cells of a text table's line: columns are two spaces apart or more, and no
    /// cell holds two spaces running.
    fn cells(line: &str) -> Vec<&str> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }

    proptest! {
        /// Issue 41, item 1: over random splits (any mix of CPU from samples or
        /// attributes, active time, run delay, queued time, spans without them), every
        /// share the verdict's sentence names is the one its column shows, the figures
        /// line says the same, the verdict is the table's, and CPU-bound means the CPU
        /// column is at least half.
        #[test]
        fn every_share_a_sentence_names_is_the_one_its_column_shows(
            (spans, samples) in arbitrary::group("1", 1)
        ) {
            let count = spans.len();
            let input = Input {
                spans,
                samples,
                profile_files: 1,
                span_files: 1,
                period_ns: Some(10_000_000),
                ..Input::default()
            };
            let report = SpanReport::from_input(&input);
            let text = report.to_string();
            let lines: Vec<&str> = text.lines().collect();
            let header = cells(lines.iter().find(|l| l.starts_with("SPAN ")).expect("header"));
            let row = cells(lines.iter().find(|l| l.starts_with("job ")).expect("row"));
            prop_assert_eq!(header.len(), row.len());
            let column = |part: Part| -> Option<u64> {
                let at = header.iter().position(|h| *h == part.column())?;
                row[at].strip_suffix('%').map(|n| n.parse().expect("a share"))
            };
            let sentence = lines
                .iter()
                .find_map(|l| l.strip_prefix("job, version 1: "))
                .expect("the group's sentence");
            let (verdict, reason) = sentence.split_once(" — ").expect("verdict — reason");
            prop_assert_eq!(verdict, *row.last().expect("verdict cell"));
            let named = arbitrary::shares_named(reason).map_err(TestCaseError::fail)?;
            for (part, share) in named {
                prop_assert_eq!(Some(share), column(part), "{} in {}\n{}", part.label(), reason, text);
            }
            let cpu = column(Part::Cpu).expect("a CPU column");
            prop_assert_eq!(verdict == "CPU-bound", cpu >= 50, "{}", text);
            // The figures line names each part with the table's share.
            let figures = lines
                .iter()
                .find(|l| l.starts_with("  where the wall time went: "))
                .expect("figures line");
            let g = &report.groups[0];
            for (part, ns) in g.split.parts() {
                let share = column(part).map_or("-".to_owned(), |s| format!("{s}%"));
                let expected = format!("{} {} ({share})", part.label(), ms(ns));
                prop_assert!(figures.contains(&expected), "{} not in {}", expected, figures);
            }
            // "its X ms per span awaiting" is the figures line's awaiting over the spans.
            for part in [Part::Awaiting, Part::OffCpu] {
                let per_span = format!(" ms per span {}", part.label());
                let Some(at) = reason.find(&per_span) else { continue };
                let x: f64 = reason[..at].rsplit(' ').next().expect("n").parse().expect("ms");
                let total = figures
                    .split(&format!("{} ", part.label()))
                    .nth(1)
                    .and_then(|rest| rest.split(" ms").next())
                    .and_then(|n| n.parse::<f64>().ok())
                    .expect("the part's ms");
                prop_assert!(
                    (x - total / count as f64).abs() <= 0.05 + 0.05 / count as f64,
                    "{} per span against {} in all over {} spans", x, total, count
                );
            }
        }
    }

    /// A child span covering part of the waiting is named with what it leaves uncovered,
    /// and no advice; only children that cover next to nothing (under 10 %) get "instrument
    /// the dependency call that takes the rest", and only when the rest is worth it.
    #[test]
    fn a_child_covering_part_of_a_wait_is_named_without_advice() {
        const MS: u64 = 1_000_000;
        let deps = |covered_ms: u64| Dependencies {
            roots: 1,
            children: vec![ChildCoverage {
                name: "db.query".into(),
                count: 1,
                covered_ns: covered_ms * MS,
            }],
            covered_ns: covered_ms * MS,
        };
        let waiting = |ns, deps: &Dependencies| {
            describe_waiting(ns, Part::Awaiting, 250 * MS, deps).unwrap_or_default()
        };
        assert_eq!(
            waiting(238 * MS, &deps(122)),
            "waiting on a dependency: 1 × db.query (122.0 ms), covering 122.0 of its 238.0 ms \
             per span awaiting"
        );
        let part = waiting(238 * MS, &deps(60));
        assert_eq!(
            part,
            "waiting on a dependency: 1 × db.query (60.0 ms), covering 60.0 of its 238.0 ms \
             per span awaiting; the other 178.0 ms are in no child span"
        );
        assert!(!part.contains("instrument"));
        let little = waiting(238 * MS, &deps(10));
        assert!(
            little.ends_with("instrument the dependency call that takes the rest"),
            "{little}"
        );
        let none = waiting(238 * MS, &Dependencies::default());
        assert!(none.ends_with("instrument the dependency call"), "{none}");
    }

    /// "Instrument the dependency call" needs awaiting worth finding a call for: at least
    /// the floor per span and the share of the wall time, with no child span over it.
    #[test]
    fn instrument_the_dependency_call_only_when_the_awaiting_is_material() {
        const MS: u64 = 1_000_000;
        let none = Dependencies::default();
        // A 0.1 ms health check, all of it awaiting: nothing to instrument, nothing said.
        assert_eq!(
            describe_waiting(100_000, Part::Awaiting, 100_000, &none),
            None
        );
        // 6 ms awaiting per span, but beside 100 ms of wall: under the share.
        assert_eq!(
            describe_waiting(6 * MS, Part::Awaiting, 100 * MS, &none),
            None
        );
        // 30 ms of 100: worth it.
        assert_eq!(
            describe_waiting(30 * MS, Part::Awaiting, 100 * MS, &none).as_deref(),
            Some("no child span covers its 30.0 ms per span awaiting: instrument the dependency call")
        );
        // Children covering next to nothing of a small wait: named, no advice.
        let child = Dependencies {
            roots: 1,
            children: vec![ChildCoverage {
                name: "cache.get".into(),
                count: 1,
                covered_ns: 10_000,
            }],
            covered_ns: 10_000,
        };
        assert_eq!(
            describe_waiting(2 * MS, Part::Awaiting, 3 * MS, &child).as_deref(),
            Some("its child spans (1 × cache.get (0.0 ms)) cover only 0.0 of its 2.0 ms per span awaiting")
        );
        assert!(worth_instrumenting(5.0 * MS as f64, Some(Percent(20))));
        assert!(!worth_instrumenting(4.9 * MS as f64, Some(Percent(90))));
        assert!(!worth_instrumenting(50.0 * MS as f64, Some(Percent(19))));
        assert!(!worth_instrumenting(50.0 * MS as f64, None));
    }

    /// Issue 41, item 2: a 5 ms job started with the plain `FutureExt::with_context`
    /// carries a profile id and nothing else, beside roots the bridge followed. It reads
    /// "no evidence — not followed", with what to use instead; never "waiting", "too
    /// short" or "instrument the dependency call".
    #[test]
    fn a_root_the_crate_never_followed_is_no_evidence_and_says_why() {
        const MS: u64 = 1_000_000;
        let job = Span {
            name: "job".into(),
            ..Span::test_root(1, 1_000 * MS, 1_005 * MS)
        };
        let followed = Span {
            name: "GET /report".into(),
            cpu_time_ns: Some(0),
            cpu_samples: Some(0),
            wall_active_ns: Some(MS),
            ..Span::test_root(2, 1_100 * MS, 1_200 * MS)
        };
        let input = Input {
            spans: vec![job, followed],
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            profile_windows: vec![(0, 10_000 * MS)],
            ..Input::default()
        };
        let report = SpanReport::from_input(&input);
        let job = report.group("job", None).expect("job");
        assert_eq!(job.verdict, Verdict::NoEvidence);
        assert_eq!(
            job.no_samples,
            Some(NoSamples::NoEvidence(
                crate::verdict::NoEvidence::NotFollowed
            ))
        );
        assert!(
            job.reason.starts_with("not followed by otel-profiling")
                && job.reason.contains("with_profiling_context"),
            "{}",
            job.reason
        );
        let text = report.to_string();
        assert!(
            text.contains("job, no service.version: no evidence — not followed"),
            "{text}"
        );
        assert!(
            text.contains("  job, no service.version: 1 span(s), not followed: "),
            "{text}"
        );
        let section = text.split("\njob, ").nth(1).expect("the job's section");
        let section = section.split("\n\n").next().unwrap_or_default();
        assert!(
            !section.contains("instrument") && !section.contains("too short"),
            "{text}"
        );
        // Started before any profile's window: no sampler ran at its start.
        let input = Input {
            profile_windows: vec![(1_050 * MS, 10_000 * MS)],
            ..input
        };
        let report = SpanReport::from_input(&input);
        let job = report.group("job", None).expect("job");
        assert_eq!(job.verdict, Verdict::NoEvidence);
        assert!(
            job.reason
                .starts_with("no sampler was running when it started"),
            "{}",
            job.reason
        );
    }

    /// "Your code" comes from the binary: the profiles' source paths make `sha2` (a
    /// registry crate) a dependency and `svc` (a file of the user's) the user's code, also
    /// for frames without a file of their own; `--crate` adds a crate.
    #[test]
    fn your_code_is_decided_from_the_source_paths_and_crate_flags() {
        use crate::ids::SpanId;
        use crate::input::Sample;
        use std::sync::Arc;
        const MS: u64 = 1_000_000;
        let span = Span {
            name: "GET /hash".into(),
            service_version: Some("1".into()),
            wall_active_ns: Some(100 * MS),
            ..Span::test_root(1, 1_000 * MS, 1_100 * MS)
        };
        let sample = |frames: &[&str], n: u64| Sample {
            frames: frames.iter().rev().map(|f| Arc::from(*f)).collect(),
            cpu_ns: n * 10 * MS,
            count: n,
            span_id: Some(SpanId::from(1u64)),
            trace_id: None,
            span_name: None,
            window: None,
        };
        let registry = "/u/.cargo/registry/src/index.crates.io-1/sha2-0.10.8/src/sha256.rs";
        let mut input = Input {
            spans: vec![span],
            samples: vec![
                sample(&["svc::main", "svc::hash_catalog", "sha2::compress256"], 6),
                // Inlined without a file of its own: its crate decides.
                sample(&["svc::main", "svc::hash_catalog", "sha2::schedule"], 2),
                sample(&["svc::main", "vendored::fast_path"], 2),
            ],
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            sources: [
                ("svc::main", "/work/svc/src/main.rs"),
                ("svc::hash_catalog", "/work/svc/src/catalog.rs"),
                ("sha2::compress256", registry),
            ]
            .into_iter()
            .map(|(f, p)| (Arc::from(f), Arc::from(p)))
            .collect(),
            ..Input::default()
        };
        let names = |list: &[FunctionCpu]| -> Vec<(String, u64)> {
            list.iter()
                .map(|f| (f.function.clone(), f.cpu_ns / MS))
                .collect()
        };
        let report = SpanReport::from_input(&input);
        let group = &report.groups[0];
        // sha2 (a registry crate; it was "yours" by the built-in list) is grouped.
        assert_eq!(
            names(&group.user_self),
            [
                ("svc::hash_catalog".to_owned(), 80),
                ("vendored::fast_path".to_owned(), 20)
            ]
        );
        assert!(group
            .grouped
            .iter()
            .any(|g| g.function == "sha2" && g.cpu_ns == 80 * MS));
        // --crate sha2 counts it as the user's.
        input.user_crates = vec!["sha2".into()];
        let report = SpanReport::from_input(&input);
        assert_eq!(
            names(&report.groups[0].user_self)[0],
            ("sha2::compress256".to_owned(), 60)
        );
    }

    /// The line names the watchdog's coverage: its stacks may stand for a sliver of the
    /// blocked time (seen on a service: 9.5 ms of 9,562.9 ms), and "100 % of what it saw"
    /// alone read as if it explained all of it.
    #[test]
    fn where_it_blocks_states_the_watchdogs_coverage() {
        let line = super::where_it_blocks("fdatasync", 9_500_000, 9_500_000, 9_562_900_000);
        assert!(
            line.contains(
                "100% of the blocked time the watchdog saw, which is 9.5 of the \
                           9562.9 ms blocked, 0.1%"
            ),
            "{line}"
        );
        let line = super::where_it_blocks("fdatasync", 50, 100, 0);
        assert!(
            line.ends_with("(50% of the blocked time the watchdog saw)"),
            "{line}"
        );
    }
}

#[cfg(test)]
mod without_samples_tests {
    use super::*;

    /// Spans whose reason carries a figure of their own (the CPU their attribute records)
    /// are listed as one group, with one "why" for them all: the demo's report had a
    /// line for each of ~1,800 such spans.
    #[test]
    fn spans_under_sampling_are_one_line_per_group() {
        const MS: u64 = 1_000_000;
        let spans: Vec<Span> = (1..=5u64)
            .map(|id| Span {
                service_version: Some("1".into()),
                cpu_time_ns: Some(id * MS),
                cpu_samples: Some(0),
                wall_active_ns: Some(20 * MS),
                ..Span::test_root(id, id * 1_000 * MS, id * 1_000 * MS + 30 * MS)
            })
            .collect();
        let input = Input {
            spans,
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            ..Input::default()
        };
        let text = SpanReport::from_input(&input).to_string();
        let listed: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("CPU under sampling:"))
            .collect();
        assert_eq!(listed.len(), 1, "{text}");
        assert!(
            listed[0].contains("5 span(s)") && listed[0].ends_with("and 2 more"),
            "{text}"
        );
        let why: Vec<&str> = text.lines().filter(|l| l.starts_with("  - ")).collect();
        assert_eq!(why.len(), 1, "{text}");
        // The group's CPU: 1 + 2 + 3 + 4 + 5 ms.
        assert!(why[0].contains("records 15.0 ms of CPU"), "{text}");
    }
}
