//! Narrowing a regression: the same span name in two versions (from one directory, by
//! `service.version`) or in two directories, per request: where each side's wall time
//! went (CPU, blocked in poll, queued, awaiting — the report's [`TimeSplit`] and verdict,
//! built by [`SpanGroup::of_spans`]), which part grew, and the functions whose CPU per
//! request grew most.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::dependencies::Dependencies;
use crate::error::ReportError;
use crate::format::{ms, ms_delta, ms_f, Table};
use crate::functions::{is_address, FunctionCpu, FunctionTotals};
use crate::input::{version_label, Input, Span};
use crate::report::{worth_instrumenting, GroupAllocations, SpanGroup};
use crate::split::{Part, Percent, TimeSplit, PART_ORDER};
use crate::stats::percentile;
use crate::verdict::Verdict;

/// How many grown functions the diff names.
pub const TOP_GROWN: usize = 10;

/// Share of the new side's CPU per request a new function must hold to be named (below
/// it, a function seen in a sample or two is sampling noise).
pub const NEW_FUNCTION_SHARE: f64 = 0.05;

/// A part of the split whose time per request moved less than this is left out of the
/// one-line statement of what changed (it would print as ±0.00 ms).
pub const NOTICEABLE_NS: f64 = 5_000.0;

/// One span name compared between two versions or two directories, per request.
#[derive(Clone, Debug)]
pub struct VersionDiff {
    /// The span name compared.
    pub span_name: String,
    /// The old side.
    pub before: DiffSide,
    /// The new side.
    pub after: DiffSide,
    /// Up to [`TOP_GROWN`] functions whose CPU per request grew: by growth of self CPU
    /// (where the time is spent), then of total CPU (the callers on the way there).
    pub grown: Vec<FunctionDelta>,
    /// The regression's cause in the user's code: the deepest function of the user's
    /// code (not a runtime or library frame, never a bare address) whose total CPU per
    /// request grew by at least half of the whole CPU growth per request — among those
    /// the old side never ran, when there are any (new code is the change; what it calls
    /// grew because of it). `None` when
    /// the CPU did not grow or no such function exists. The headline names it: not the
    /// leaf whose self time grew most (often a library's), nor the outermost frame.
    pub cause: Option<FunctionDelta>,
    /// Functions on the new side's stacks that the old side never ran, holding at least
    /// [`NEW_FUNCTION_SHARE`] of the new side's CPU, by total CPU per request, most first
    /// (up to [`TOP_GROWN`]): new code paths, often the regression itself.
    pub new_functions: Vec<FunctionDelta>,
    /// The cause of the allocations' growth in the user's code, chosen as
    /// [`VersionDiff::cause`] is for CPU (the deepest user function whose allocated bytes
    /// per request, anywhere on the stack, grew by at least half the whole growth; new
    /// code first), when the allocation profiles' bytes per request grew by at least
    /// [`NOTICEABLE_ALLOC_SHARE`].
    pub allocation_growth: Option<AllocationDelta>,
    /// The parts of the wall time per request on both sides, on the finest basis both
    /// sides' splits support (see [`VersionDiff::split_basis`]), the one that grew most
    /// first.
    pub parts: Vec<PartDelta>,
}

/// One part of the wall time (CPU, blocked in poll, ...) per request on both sides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartDelta {
    /// The part.
    pub part: Part,
    /// Mean nanoseconds per request before.
    pub before_ns: f64,
    /// Mean nanoseconds per request after.
    pub after_ns: f64,
}

impl PartDelta {
    /// Growth per request, nanoseconds.
    pub fn delta_ns(&self) -> f64 {
        self.after_ns - self.before_ns
    }
}

/// A function's allocated bytes per request on both sides, anywhere on the stack
/// (allocation profiles' estimates).
#[derive(Clone, Debug, PartialEq)]
pub struct AllocationDelta {
    /// Function name.
    pub function: String,
    /// Bytes per request before.
    pub before_bytes: f64,
    /// Bytes per request after.
    pub after_bytes: f64,
}

/// Growth of allocations per request, as a share of the old side's, below which the
/// diff names no function: estimates of a few samples move that much by chance.
pub const NOTICEABLE_ALLOC_SHARE: f64 = 0.1;

/// One side of a diff.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffSide {
    /// The version, or the directory.
    pub label: String,
    /// Local root spans (requests) of the span name on this side.
    pub requests: usize,
    /// Median wall time (nearest rank), nanoseconds.
    pub wall_p50_ns: u64,
    /// Profile CPU per request, nanoseconds.
    pub cpu_per_request_ns: f64,
    /// `profiling.cpu.time_ns` per request, over the spans that carry it.
    pub attribute_cpu_per_request_ns: Option<f64>,
    /// Where this side's wall time went, summed over its requests (as the report splits it).
    pub split: TimeSplit,
    /// The report's verdict on this side.
    pub verdict: Verdict,
    /// Why.
    pub reason: String,
    /// The child spans under this side's requests.
    pub dependencies: Dependencies,
    /// Where this side blocked inside a poll (its blocked-in-poll profile), most first.
    pub blocking: Vec<FunctionCpu>,
    /// What this side allocated (the report's figures), when allocations were sampled.
    pub allocations: Option<GroupAllocations>,
}

impl DiffSide {
    /// The split's parts (this side's own, as [`TimeSplit::parts`]) as mean nanoseconds
    /// per request.
    pub fn parts_per_request(&self) -> Vec<(Part, f64)> {
        self.split
            .parts()
            .into_iter()
            .map(|(part, ns)| (part, self.per_request(ns)))
            .collect()
    }

    /// Mean wall time per request, nanoseconds.
    pub fn wall_mean_ns(&self) -> f64 {
        self.per_request(self.split.wall_ns)
    }

    /// `ns` (summed over this side's requests) as a mean per request.
    pub fn per_request(&self, ns: u64) -> f64 {
        ns as f64 / self.requests.max(1) as f64
    }
}

/// A function's CPU per request on both sides.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDelta {
    /// Function name.
    pub function: String,
    /// Self CPU per request before, nanoseconds.
    pub before_ns: f64,
    /// Self CPU per request after, nanoseconds.
    pub after_ns: f64,
    /// Total CPU (anywhere on the stack) per request before, nanoseconds.
    pub total_before_ns: f64,
    /// Total CPU per request after, nanoseconds.
    pub total_after_ns: f64,
}

impl FunctionDelta {
    /// Growth of self CPU per request, nanoseconds.
    pub fn delta_ns(&self) -> f64 {
        self.after_ns - self.before_ns
    }

    /// Growth of total CPU per request, nanoseconds.
    pub fn total_delta_ns(&self) -> f64 {
        self.total_after_ns - self.total_before_ns
    }
}

impl VersionDiff {
    /// Compares the `span_name` spans of `service.version` `from` with those of `to`, both
    /// read from `dir`. A version that has no such spans fails with
    /// [`ReportError::UnknownVersion`], listing the versions that do (`(none)` stands for
    /// spans without `service.version`).
    pub fn between_versions(
        dir: &Path,
        span_name: &str,
        from: &str,
        to: &str,
    ) -> Result<VersionDiff, ReportError> {
        VersionDiff::between_versions_in(&Input::load(&[dir.to_path_buf()])?, span_name, from, to)
    }

    /// [`between_versions`](Self::between_versions) over what was read into `input` (with
    /// its [`Input::user_crates`], say).
    pub fn between_versions_in(
        input: &Input,
        span_name: &str,
        from: &str,
        to: &str,
    ) -> Result<VersionDiff, ReportError> {
        let spans = spans_named(input, span_name)?;
        let versions: BTreeSet<&str> = spans
            .iter()
            .map(|s| version_label(s.service_version.as_deref()))
            .collect();
        let of_version = |version: &str| -> Result<Vec<&Span>, ReportError> {
            let chosen: Vec<&Span> = spans
                .iter()
                .copied()
                .filter(|s| version_label(s.service_version.as_deref()) == version)
                .collect();
            if chosen.is_empty() {
                return Err(ReportError::UnknownVersion {
                    span_name: span_name.to_owned(),
                    version: version.to_owned(),
                    available: versions.iter().map(|v| (*v).to_owned()).collect(),
                });
            }
            Ok(chosen)
        };
        let before = side(from.to_owned(), input, span_name, &of_version(from)?);
        let after = side(to.to_owned(), input, span_name, &of_version(to)?);
        Ok(VersionDiff::new(span_name, before, after))
    }

    /// Compares two sets of `span_name` spans read into `input` (one report group each,
    /// say), labelled `before.0` and `after.0`.
    pub fn between_spans(
        input: &Input,
        span_name: &str,
        before: (&str, &[&Span]),
        after: (&str, &[&Span]),
    ) -> VersionDiff {
        VersionDiff::new(
            span_name,
            side(before.0.to_owned(), input, span_name, before.1),
            side(after.0.to_owned(), input, span_name, after.1),
        )
    }

    /// Compares the `span_name` spans of directory `before` with those of `after`.
    pub fn between_dirs(
        before: &Path,
        after: &Path,
        span_name: &str,
    ) -> Result<VersionDiff, ReportError> {
        VersionDiff::between_inputs(
            &Input::load(&[before.to_path_buf()])?,
            &Input::load(&[after.to_path_buf()])?,
            span_name,
        )
    }

    /// [`between_dirs`](Self::between_dirs) over what was read into `before` and `after`
    /// (each side labelled with its first directory).
    pub fn between_inputs(
        before: &Input,
        after: &Input,
        span_name: &str,
    ) -> Result<VersionDiff, ReportError> {
        let side_of = |input: &Input| -> Result<SideTotals, ReportError> {
            let spans = spans_named(input, span_name)?;
            let label = input
                .dirs
                .first()
                .map_or_else(String::new, |d| d.display().to_string());
            Ok(side(label, input, span_name, &spans))
        };
        Ok(VersionDiff::new(
            span_name,
            side_of(before)?,
            side_of(after)?,
        ))
    }

    fn new(span_name: &str, before: SideTotals, after: SideTotals) -> VersionDiff {
        let (before, old, old_allocations) = before;
        let (after, new, new_allocations) = after;
        let functions: BTreeSet<&str> = old
            .functions()
            .chain(new.functions())
            .map(|f| &**f)
            .collect();
        let per_request = |ns: u64, side: &DiffSide| ns as f64 / side.requests.max(1) as f64;
        let mut grown: Vec<FunctionDelta> = functions
            .into_iter()
            .map(|f| FunctionDelta {
                function: f.to_owned(),
                before_ns: per_request(old.self_ns(f), &before),
                after_ns: per_request(new.self_ns(f), &after),
                total_before_ns: per_request(old.total_ns(f), &before),
                total_after_ns: per_request(new.total_ns(f), &after),
            })
            .filter(|d| d.delta_ns() > 0.0 || d.total_delta_ns() > 0.0)
            .collect();
        let mut new_functions: Vec<FunctionDelta> = grown
            .iter()
            .filter(|d| {
                d.total_before_ns == 0.0
                    && d.total_after_ns >= NEW_FUNCTION_SHARE * after.cpu_per_request_ns
            })
            .cloned()
            .collect();
        new_functions.sort_by(|a, b| {
            b.total_after_ns
                .total_cmp(&a.total_after_ns)
                .then(a.function.cmp(&b.function))
        });
        new_functions.truncate(TOP_GROWN);
        let growth = after.cpu_per_request_ns - before.cpu_per_request_ns;
        let cause = deepest_holder((&old, before.requests), (&new, after.requests), growth);
        grown.sort_by(|a, b| {
            b.delta_ns()
                .total_cmp(&a.delta_ns())
                .then(b.total_delta_ns().total_cmp(&a.total_delta_ns()))
                .then(a.function.cmp(&b.function))
        });
        grown.truncate(TOP_GROWN);
        let parts = part_deltas(&before, &after);
        let allocation_growth =
            allocation_growth((&before, &old_allocations), (&after, &new_allocations));
        VersionDiff {
            span_name: span_name.to_owned(),
            before,
            after,
            grown,
            cause,
            new_functions,
            allocation_growth,
            parts,
        }
    }

    /// What [`VersionDiff::parts`] compares: CPU, blocked in poll, queued and awaiting
    /// when both sides have them; queued inside awaiting when one side did not measure
    /// it; CPU against not on CPU when one side has no active time.
    pub fn split_basis(&self) -> &'static str {
        let (b, a) = (&self.before.split, &self.after.split);
        match basis(b, a) {
            Basis::Queued => "CPU, blocked in poll, queued, awaiting",
            Basis::Active => "CPU, blocked in poll, awaiting (queued inside awaiting: not measured on both sides)",
            Basis::OffCpu => "CPU against not on CPU (blocked and awaiting need the active time on both sides)",
        }
    }

    /// Whether [`VersionDiff::parts`] compares less than one side's own split shows
    /// (the other side lacks its active or queued time).
    pub fn basis_is_coarser(&self) -> bool {
        let (b, a) = (&self.before.split, &self.after.split);
        let queued = |s: &TimeSplit| s.active.is_some() && s.queued_measured;
        match basis(b, a) {
            Basis::Queued => false,
            Basis::Active => queued(b) || queued(a),
            Basis::OffCpu => b.active.is_some() || a.active.is_some(),
        }
    }

    /// What changed, in one line: the wall time's growth, then each part of the split
    /// that moved, the one that grew most first, with what explains it (the function
    /// whose CPU grew, the child spans awaited, where it blocks), then the verdicts.
    pub fn what_changed(&self) -> String {
        let (b, a) = (&self.before, &self.after);
        let moved: Vec<String> = self
            .parts
            .iter()
            .filter(|p| p.delta_ns().abs() >= NOTICEABLE_NS)
            .map(|p| {
                format!(
                    "{} {}{}",
                    p.part.label(),
                    ms_delta(p.delta_ns()),
                    self.explain(p)
                )
            })
            .collect();
        let moved = if moved.is_empty() {
            "no part of the split moved".to_owned()
        } else {
            moved.join(", ")
        };
        let verdict = if b.verdict == a.verdict {
            format!("verdict {} on both", a.verdict)
        } else {
            format!("verdict {} → {}", b.verdict, a.verdict)
        };
        format!(
            "wall p50 {} (mean {} per request): {moved}; {verdict}",
            ms_delta(a.wall_p50_ns as f64 - b.wall_p50_ns as f64),
            ms_delta(a.wall_mean_ns() - b.wall_mean_ns()),
        )
    }

    /// Why a part grew, in parentheses, from what the new side's figures name.
    fn explain(&self, p: &PartDelta) -> String {
        if p.delta_ns() <= 0.0 {
            return String::new();
        }
        let (b, a) = (&self.before, &self.after);
        match p.part {
            Part::Cpu => match &self.cause {
                Some(cause) => format!(
                    " (in {}: its total CPU per request {})",
                    cause.function,
                    ms_delta(cause.total_delta_ns())
                ),
                None => self.grown.first().map_or_else(String::new, |f| {
                    format!(" (most in {} {})", f.function, ms_delta(f.delta_ns()))
                }),
            },
            Part::Blocked => a
                .blocking
                .first()
                .map_or_else(String::new, |f| format!(" (now blocks in {})", f.function)),
            Part::Queued => " (woken but not polled: waiting for a worker)".to_owned(),
            Part::Runqueue => match a.split.throttled_ns {
                0 => " (runnable, but other work held the CPUs)".to_owned(),
                ns => format!(
                    " (runnable; the container was throttled {:.0} ms for its CPU quota)",
                    ns as f64 / 1e6
                ),
            },
            Part::Unknown => " (spans without the figures the others carry)".to_owned(),
            Part::Awaiting | Part::OffCpu => {
                if a.dependencies.children.is_empty() {
                    // Advice only for growth worth finding a call for: a fraction of a
                    // millisecond has none to instrument.
                    let share = Percent::of(p.after_ns as u64, a.wall_mean_ns() as u64);
                    return if worth_instrumenting(p.delta_ns(), share) {
                        " (no child span covers it: instrument the dependency call)".to_owned()
                    } else {
                        " (no child span covers it)".to_owned()
                    };
                }
                let now = a.dependencies.describe(3);
                let was = b.dependencies.describe(3);
                if b.dependencies.children.is_empty() {
                    format!(" (now waiting on {now}; no child spans before)")
                } else if was == now {
                    format!(" (waiting on {now}, as before)")
                } else {
                    format!(" (now waiting on {now}; was {was})")
                }
            }
        }
    }
}

/// The finest split both sides support.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Basis {
    /// Both have active and queued time.
    Queued,
    /// Both have active time.
    Active,
    /// CPU against not on CPU.
    OffCpu,
}

fn basis(b: &TimeSplit, a: &TimeSplit) -> Basis {
    match (
        b.active.is_some() && a.active.is_some(),
        b.queued_measured && a.queued_measured,
    ) {
        (true, true) => Basis::Queued,
        (true, false) => Basis::Active,
        (false, _) => Basis::OffCpu,
    }
}

/// Both sides' parts per request on their common basis, the one that grew most first.
fn part_deltas(before: &DiffSide, after: &DiffSide) -> Vec<PartDelta> {
    let basis = basis(&before.split, &after.split);
    // Run delay is its own part only when both sides measured it; else it stays in blocked.
    let runqueue = before.split.runqueue_measured && after.split.runqueue_measured;
    let parts_of = |side: &DiffSide| -> Vec<(Part, f64)> {
        let s = &side.split;
        let mut ns: Vec<(Part, u64)> = vec![(Part::Cpu, s.cpu_in_wall_ns)];
        match basis {
            Basis::OffCpu => ns.push((Part::OffCpu, s.wall_ns.saturating_sub(s.cpu_in_wall_ns))),
            Basis::Queued | Basis::Active => {
                if runqueue {
                    ns.push((Part::Runqueue, s.runqueue_ns));
                    ns.push((Part::Blocked, s.blocked_ns));
                } else {
                    ns.push((Part::Blocked, s.blocked_ns + s.runqueue_ns));
                }
                if basis == Basis::Queued {
                    ns.push((Part::Queued, s.queued_ns));
                    ns.push((Part::Awaiting, s.awaiting_ns));
                } else {
                    ns.push((Part::Awaiting, s.awaiting_ns + s.queued_ns));
                }
                // Spans of either side that lack what the others carry: compared as such,
                // never folded into blocked or awaiting.
                if before.split.ns(Part::Unknown).is_some()
                    || after.split.ns(Part::Unknown).is_some()
                {
                    ns.push((Part::Unknown, s.unknown_ns));
                }
            }
        }
        ns.into_iter()
            .map(|(part, ns)| (part, side.per_request(ns)))
            .collect()
    };
    let mut deltas: Vec<PartDelta> = parts_of(before)
        .into_iter()
        .zip(parts_of(after))
        .map(|((part, before_ns), (_, after_ns))| PartDelta {
            part,
            before_ns,
            after_ns,
        })
        .collect();
    // Stable: equal growth keeps the drawing order.
    deltas.sort_by(|x, y| y.delta_ns().total_cmp(&x.delta_ns()));
    deltas
}

/// The local root spans named `name` (or whose route makes that name), or the error listing the names there are.
fn spans_named<'a>(input: &'a Input, name: &str) -> Result<Vec<&'a Span>, ReportError> {
    let roots = input.local_roots();
    let spans: Vec<&Span> = roots
        .iter()
        .copied()
        .filter(|s| s.answers_to(name))
        .collect();
    if spans.is_empty() {
        let mut known: Vec<String> = roots.iter().map(|s| s.report_name().into_owned()).collect();
        known.sort();
        known.dedup();
        return Err(ReportError::UnknownSpanName {
            name: name.to_owned(),
            place: input.dirs.first().cloned().unwrap_or_else(PathBuf::new),
            known,
        });
    }
    Ok(spans)
}

/// A side, its per-function CPU and its per-function allocated bytes.
type SideTotals = (DiffSide, FunctionTotals, FunctionTotals);

/// The deepest function of the user's code (never a bare address) whose total per
/// request grew by at least half of `growth` (the whole growth per request), among those
/// the old side never ran when there are any: the change itself, not what it calls more.
fn deepest_holder(
    (old, old_requests): (&FunctionTotals, usize),
    (new, new_requests): (&FunctionTotals, usize),
    growth: f64,
) -> Option<FunctionDelta> {
    if growth <= 0.0 {
        return None;
    }
    let per_request = |v: u64, requests: usize| v as f64 / requests.max(1) as f64;
    let holders: Vec<FunctionDelta> = old
        .functions()
        .chain(new.functions())
        .map(|f| &**f)
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .filter(|f| new.is_user(f) && !is_address(f))
        .map(|f| FunctionDelta {
            function: f.to_owned(),
            before_ns: per_request(old.self_ns(f), old_requests),
            after_ns: per_request(new.self_ns(f), new_requests),
            total_before_ns: per_request(old.total_ns(f), old_requests),
            total_after_ns: per_request(new.total_ns(f), new_requests),
        })
        .filter(|d| d.total_delta_ns() >= growth / 2.0)
        .collect();
    let new_holders: Vec<&FunctionDelta> = holders
        .iter()
        .filter(|d| d.total_before_ns == 0.0)
        .collect();
    let candidates = if new_holders.is_empty() {
        holders.iter().collect()
    } else {
        new_holders
    };
    candidates
        .into_iter()
        .max_by(|a, b| {
            new.depth(&a.function)
                .cmp(&new.depth(&b.function))
                .then(a.total_delta_ns().total_cmp(&b.total_delta_ns()))
                .then(b.function.cmp(&a.function))
        })
        .cloned()
}

/// The cause of the allocations' growth per request (see
/// [`VersionDiff::allocation_growth`]), from the allocation profiles' bytes.
fn allocation_growth(
    (before, old): (&DiffSide, &FunctionTotals),
    (after, new): (&DiffSide, &FunctionTotals),
) -> Option<AllocationDelta> {
    let (b, a) = (before.allocations.as_ref()?, after.allocations.as_ref()?);
    let per_request = |bytes: u64, side: &DiffSide| bytes as f64 / side.requests.max(1) as f64;
    let (b_total, a_total) = (
        per_request(b.profile_bytes, before),
        per_request(a.profile_bytes, after),
    );
    let growth = a_total - b_total;
    if growth <= 0.0 || growth < NOTICEABLE_ALLOC_SHARE * b_total {
        return None;
    }
    deepest_holder((old, before.requests), (new, after.requests), growth).map(|d| AllocationDelta {
        function: d.function,
        before_bytes: d.total_before_ns,
        after_bytes: d.total_after_ns,
    })
}

/// One side's figures and per-function CPU.
fn side(label: String, input: &Input, span_name: &str, spans: &[&Span]) -> SideTotals {
    let by_id = input.samples_by_span_id();
    let mut functions = FunctionTotals::with_owners(input.ownership());
    let mut cpu_ns = 0u64;
    for sample in spans.iter().filter_map(|s| by_id.get(&s.span_id)).flatten() {
        cpu_ns += sample.cpu_ns;
        functions.add(sample);
    }
    let mut walls: Vec<u64> = spans.iter().map(|s| s.wall_ns()).collect();
    walls.sort_unstable();
    let with_attribute: Vec<u64> = spans.iter().filter_map(|s| s.cpu_time_ns).collect();
    let requests = spans.len();
    // The report's own group of these spans: the diff shows the split and verdict the
    // report shows for each version, never a second computation of them.
    let version = spans.first().and_then(|s| s.service_version.as_deref());
    let group = SpanGroup::of_spans(input, span_name, version, spans);
    let allocated = input.allocated_by_span_id();
    let mut allocating = FunctionTotals::with_owners(input.ownership());
    for sample in spans
        .iter()
        .filter_map(|s| allocated.get(&s.span_id))
        .flatten()
    {
        allocating.add(sample);
    }

    let side = DiffSide {
        label,
        requests,
        wall_p50_ns: percentile(&walls, 50.0),
        cpu_per_request_ns: cpu_ns as f64 / requests.max(1) as f64,
        attribute_cpu_per_request_ns: (!with_attribute.is_empty())
            .then(|| with_attribute.iter().sum::<u64>() as f64 / with_attribute.len() as f64),
        split: group.split,
        verdict: group.verdict,
        reason: group.reason,
        dependencies: group.dependencies,
        blocking: group.blocking,
        allocations: group.allocations,
    };
    (side, functions, allocating)
}

impl fmt::Display for VersionDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, a) = (&self.before, &self.after);
        writeln!(
            f,
            "{}: {} → {}, per request",
            self.span_name, b.label, a.label
        )?;
        let mut table = Table::new(&[
            "",
            "REQUESTS",
            "WALL P50",
            "CPU/REQUEST (PROFILE)",
            "CPU/REQUEST (ATTRS)",
        ])
        .indent(2);
        for side in [b, a] {
            table.row(vec![
                side.label.clone(),
                side.requests.to_string(),
                ms(side.wall_p50_ns),
                ms_f(side.cpu_per_request_ns),
                side.attribute_cpu_per_request_ns
                    .map_or_else(|| "-".to_owned(), ms_f),
            ]);
        }
        write!(f, "{table}")?;
        let growth = if b.cpu_per_request_ns > 0.0 {
            format!(
                " ({:+.1}%)",
                (a.cpu_per_request_ns / b.cpu_per_request_ns - 1.0) * 100.0
            )
        } else {
            String::new()
        };
        writeln!(
            f,
            "  CPU per request {}{growth}; wall p50 {}",
            ms_delta(a.cpu_per_request_ns - b.cpu_per_request_ns),
            ms_delta(a.wall_p50_ns as f64 - b.wall_p50_ns as f64),
        )?;
        if let Some(line) = self.allocation_line() {
            writeln!(f, "  {line}")?;
        }
        self.write_split(f)?;
        if !self.new_functions.is_empty() {
            writeln!(
                f,
                "\nNew in {} (never on a stack in {}), by total CPU per request:",
                a.label, b.label
            )?;
            let mut table = Table::new(&["FUNCTION", "TOTAL", "SELF"]).indent(2);
            for d in &self.new_functions {
                table.row(vec![
                    d.function.clone(),
                    ms_f(d.total_after_ns),
                    ms_f(d.after_ns),
                ]);
            }
            write!(f, "{table}")?;
        }
        if self.grown.is_empty() {
            return writeln!(f, "\nNo function's CPU per request grew.");
        }
        writeln!(
            f,
            "\nFunctions whose CPU per request grew most (self: innermost frame; total: anywhere on the stack):"
        )?;
        let mut table = Table::new(&[
            "FUNCTION",
            "SELF BEFORE",
            "SELF AFTER",
            "SELF DELTA",
            "TOTAL DELTA",
        ])
        .indent(2);
        for d in &self.grown {
            table.row(vec![
                d.function.clone(),
                ms_f(d.before_ns),
                ms_f(d.after_ns),
                ms_delta(d.delta_ns()),
                ms_delta(d.total_delta_ns()),
            ]);
        }
        write!(f, "{table}")
    }
}

impl VersionDiff {
    /// Allocations per request on both sides and the function whose allocations grew
    /// most; `None` when neither side has allocation figures.
    pub fn allocation_line(&self) -> Option<String> {
        let (b, a) = (&self.before, &self.after);
        if b.allocations.is_none() && a.allocations.is_none() {
            return None;
        }
        let per_request = |side: &DiffSide| {
            side.allocations
                .as_ref()
                .map(|x| x.bytes_per_span(side.requests))
        };
        let shown = |bytes: Option<u64>| bytes.map_or_else(|| "-".to_owned(), crate::format::bytes);
        let (before, after) = (per_request(b), per_request(a));
        let mut line = format!(
            "allocations per request {} → {}",
            shown(before),
            shown(after)
        );
        if let (Some(before), Some(after)) = (before, after) {
            if before > 0 {
                line.push_str(&format!(
                    " ({:+.1}%)",
                    (after as f64 / before as f64 - 1.0) * 100.0
                ));
            }
        }
        if let Some(d) = &self.allocation_growth {
            line.push_str(&format!(
                "; grew most in {} ({} → {} a request)",
                d.function,
                crate::format::bytes(d.before_bytes as u64),
                crate::format::bytes(d.after_bytes as u64)
            ));
        }
        line.push_str(" (estimated from allocation samples)");
        Some(line)
    }

    /// Each side's split per request with the CPU samples beside it, its verdict, and the
    /// line saying what changed.
    fn write_split(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sides = [&self.before, &self.after];
        let columns: Vec<Part> = PART_ORDER
            .into_iter()
            .filter(|part| {
                sides
                    .iter()
                    .any(|s| s.split.parts().iter().any(|(p, _)| p == part))
            })
            .collect();
        writeln!(
            f,
            "\nWhere the wall time went, per request (mean; CPU SAMPLES: the side's total, each \
             one sampling period of CPU):"
        )?;
        let mut header = vec!["", "WALL", "CPU SAMPLES"];
        header.extend(columns.iter().map(|&p| column(p)));
        header.push("VERDICT");
        let mut table = Table::new(&header).left_align(header.len() - 1).indent(2);
        for side in sides {
            let parts = side.parts_per_request();
            let mut row = vec![
                side.label.clone(),
                ms_f(side.wall_mean_ns()),
                side.split.cpu_samples.to_string(),
            ];
            for column in &columns {
                // The share as the report prints it, of the side's summed times (the same
                // ratio as of the means).
                row.push(parts.iter().find(|(p, _)| p == column).map_or_else(
                    || "-".to_owned(),
                    |(part, ns)| {
                        let share = side
                            .split
                            .share(*part)
                            .map_or_else(|| "-".to_owned(), |p| p.to_string());
                        format!("{} ({share})", ms_f(*ns))
                    },
                ));
            }
            row.push(side.verdict.to_string());
            table.row(row);
        }
        write!(f, "{table}")?;
        for side in sides {
            writeln!(f, "  {}: {} — {}", side.label, side.verdict, side.reason)?;
        }
        let (b, a) = (&self.before.split, &self.after.split);
        if b.source() == a.source() {
            writeln!(f, "  split: {}", b.source())?;
        } else {
            for side in sides {
                writeln!(f, "  split of {}: {}", side.label, side.split.source())?;
            }
        }
        if self.basis_is_coarser() {
            writeln!(f, "  compared as {}", self.split_basis())?;
        }
        writeln!(f, "What changed: {}", self.what_changed())
    }
}

/// The split table's header for `part`.
fn column(part: Part) -> &'static str {
    match part {
        Part::Cpu => "CPU",
        Part::Blocked => "BLOCKED IN POLL",
        Part::Queued => "QUEUED",
        Part::Runqueue => "WAITING FOR A CPU",
        Part::Awaiting => "AWAITING",
        Part::OffCpu => "NOT ON CPU",
        Part::Unknown => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::ids::SpanId;
    use crate::input::Sample;

    const MS: u64 = 1_000_000;

    fn span(id: u64, version: &str, wall_ms: u64, active_ms: Option<u64>) -> Span {
        Span {
            service_version: Some(version.into()),
            wall_active_ns: active_ms.map(|a| a * MS),
            ..Span::test_root(id, id * 1_000 * MS, id * 1_000 * MS + wall_ms * MS)
        }
    }

    fn sample(id: u64, samples: u64) -> Sample {
        Sample {
            frames: vec![Arc::from("work")],
            cpu_ns: samples * 10 * MS,
            count: samples,
            span_id: Some(SpanId::from(id)),
            trace_id: None,
            span_name: None,
            window: None,
        }
    }

    fn diff(input: &Input) -> VersionDiff {
        let (old, new) = input.spans.split_at(1);
        let old: Vec<&Span> = old.iter().collect();
        let new: Vec<&Span> = new.iter().collect();
        VersionDiff::between_spans(input, "GET /x", ("1", &old), ("2", &new))
    }

    fn allocated(id: u64, function: &str, bytes: u64) -> Sample {
        Sample {
            frames: vec![Arc::from(function), Arc::from("handle")],
            cpu_ns: bytes,
            count: 1,
            ..sample(id, 1)
        }
    }

    #[test]
    fn the_function_whose_allocations_grew_is_named() {
        // 1 allocates 1 MB a request in render; 2 allocates the same there and 3 MB more
        // in validate (the attributes say 1 MB → 4 MB).
        let with_alloc = |id: u64, version: &str, bytes: u64| Span {
            alloc_bytes: Some(bytes),
            alloc_count: Some(bytes / 1_000),
            ..span(id, version, 100, Some(50))
        };
        let input = Input {
            spans: vec![
                with_alloc(1, "1", 1_000_000),
                with_alloc(2, "2", 4_000_000),
                with_alloc(3, "2", 4_000_000),
            ],
            samples: vec![sample(1, 2), sample(2, 2), sample(3, 2)],
            allocated: vec![
                allocated(1, "render", 1_000_000),
                allocated(2, "render", 1_000_000),
                allocated(2, "validate", 3_000_000),
                allocated(3, "render", 1_000_000),
                allocated(3, "validate", 3_000_000),
            ],
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            ..Input::default()
        };
        let d = diff(&input);
        let growth = d.allocation_growth.as_ref().expect("allocations grew");
        assert_eq!(growth.function, "validate");
        assert_eq!(
            (growth.before_bytes, growth.after_bytes),
            (0.0, 3_000_000.0)
        );
        let line = d.allocation_line().expect("a line");
        assert_eq!(
            line,
            "allocations per request 1.00 MB → 4.00 MB (+300.0%); grew most in validate \
             (0 B → 3.00 MB a request) (estimated from allocation samples)"
        );
        assert!(d.to_string().contains(&line), "{d}");
        // Without allocation figures on either side: no line.
        let plain = Input {
            allocated: vec![],
            spans: input
                .spans
                .iter()
                .map(|s| Span {
                    alloc_bytes: None,
                    alloc_count: None,
                    ..s.clone()
                })
                .collect(),
            ..input
        };
        let d = diff(&plain);
        assert!(d.allocation_line().is_none() && d.allocation_growth.is_none());
        assert!(!d.to_string().contains("allocations"), "{d}");
    }

    #[test]
    fn without_active_time_on_one_side_the_parts_compared_are_cpu_and_not_on_cpu() {
        // 1: 100 ms, 20 ms CPU, no active time. 2: 150 ms, 20 ms CPU, 140 ms active (so
        // 120 ms blocked): blocked cannot be told from awaiting in 1, so the growth is
        // "not on CPU", not "blocked in poll".
        let input = Input {
            spans: vec![span(1, "1", 100, None), span(2, "2", 150, Some(140))],
            samples: vec![sample(1, 2), sample(2, 2)],
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            ..Input::default()
        };
        let diff = diff(&input);
        assert_eq!(
            diff.parts,
            [
                PartDelta {
                    part: Part::OffCpu,
                    before_ns: 80.0 * MS as f64,
                    after_ns: 130.0 * MS as f64
                },
                PartDelta {
                    part: Part::Cpu,
                    before_ns: 20.0 * MS as f64,
                    after_ns: 20.0 * MS as f64
                },
            ]
        );
        assert!(diff.basis_is_coarser());
        // Each side's own split is still shown whole.
        assert_eq!(
            diff.after.parts_per_request(),
            [
                (Part::Cpu, 20.0 * MS as f64),
                (Part::Blocked, 120.0 * MS as f64),
                (Part::Awaiting, 10.0 * MS as f64)
            ]
        );
        assert_eq!(diff.after.verdict, Verdict::BlockedInPoll);
        let text = diff.to_string();
        assert!(
            text.contains(
                "What changed: wall p50 +50.00 ms (mean +50.00 ms per request): not on CPU \
                 +50.00 ms (no child span covers it: instrument the dependency call); verdict \
                 mixed → blocked in poll"
            ),
            "{text}"
        );
        assert!(
            text.contains("compared as CPU against not on CPU"),
            "{text}"
        );
        // The columns are both sides' parts: a side without one shows "-".
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("1 ") && l.contains("mixed"))
            .expect("row of 1");
        assert!(
            row.contains("80.00 ms (80%)") && row.contains(" - "),
            "{row}"
        );
    }

    /// The headline names the deepest function of the user's code holding at least half
    /// of the CPU growth: not the library leaf whose self time grew most, not the
    /// outermost frames every sample passes through, never a bare address.
    #[test]
    fn the_headline_names_the_deepest_user_function_holding_half_the_growth() {
        let stack = |id: u64, samples: u64, frames: &[&str]| Sample {
            frames: frames.iter().rev().map(|f| Arc::from(*f)).collect(),
            ..sample(id, samples)
        };
        let outer = ["app::main", "app::handle_report"];
        let with = |tail: &[&'static str]| -> Vec<&'static str> {
            outer.iter().copied().chain(tail.iter().copied()).collect()
        };
        let input = Input {
            spans: vec![span(1, "1", 100, Some(100)), span(2, "2", 200, Some(200))],
            samples: vec![
                stack(1, 4, &with(&["app::render_rows"])),
                stack(2, 4, &with(&["app::render_rows"])),
                // 2.0 pages the report: 6 samples (60 ms) more under paginate_report, most
                // of it in a map insert, a little in an unnamed address.
                stack(
                    2,
                    5,
                    &with(&[
                        "app::paginate_report",
                        "hashbrown::map::HashMap<K,V>::insert",
                    ]),
                ),
                stack(2, 1, &with(&["app::paginate_report", "libc.so.6+0x96565"])),
            ],
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            ..Input::default()
        };
        let diff = diff(&input);
        let cause = diff.cause.as_ref().expect("a cause");
        assert_eq!(cause.function, "app::paginate_report");
        assert_eq!(cause.total_delta_ns(), 60.0 * MS as f64);
        // The largest self growth is the library's leaf; the outer frames grew as much.
        assert_eq!(
            diff.grown[0].function,
            "hashbrown::map::HashMap<K,V>::insert"
        );
        assert!(
            diff.what_changed().contains(
                "CPU +60.00 ms (in app::paginate_report: its total CPU per request +60.00 ms)"
            ),
            "{}",
            diff.what_changed()
        );
        // No user function holds half: no cause, the largest self growth instead.
        let spread = Input {
            samples: vec![
                stack(1, 4, &["app::a"]),
                stack(2, 4, &["app::a"]),
                stack(2, 2, &["app::b"]),
                stack(2, 2, &["app::c"]),
                stack(2, 2, &["app::d"]),
            ],
            ..input.clone()
        };
        assert_eq!(super::tests::diff(&spread).cause, None);
        // A function new in 2 holding the growth is the cause, though a function it calls
        // (deeper, run by both) grew by more than half too.
        let paged = Input {
            samples: vec![
                stack(1, 4, &with(&["app::serialize"])),
                stack(2, 10, &with(&["app::paged", "app::serialize"])),
            ],
            ..input.clone()
        };
        let paged = super::tests::diff(&paged);
        assert_eq!(
            paged.cause.as_ref().map(|c| c.function.as_str()),
            Some("app::paged")
        );
    }

    #[test]
    fn queued_time_is_compared_when_both_sides_measured_it() {
        let mut old = span(1, "1", 100, Some(10));
        old.wall_queued_ns = Some(10 * MS);
        let mut new = span(2, "2", 160, Some(10));
        new.wall_queued_ns = Some(70 * MS);
        let input = Input {
            spans: vec![old, new],
            profile_files: 1,
            span_files: 1,
            ..Input::default()
        };
        let diff = diff(&input);
        let first = diff.parts[0];
        assert_eq!(first.part, Part::Queued);
        assert_eq!(first.delta_ns(), 60.0 * MS as f64);
        assert!(!diff.basis_is_coarser());
        assert!(
            diff.what_changed()
                .contains("queued +60.00 ms (woken but not polled: waiting for a worker)"),
            "{}",
            diff.what_changed()
        );
    }

    proptest! {
        /// Issue 41, item 1: each side's sentence names the shares its row of the split
        /// table shows, over random pairs of groups.
        #[test]
        fn each_sides_sentence_names_the_shares_of_its_row(
            (old, old_samples) in crate::split::arbitrary::group("1", 1),
            (new, new_samples) in crate::split::arbitrary::group("2", 100),
        ) {
            let (n_old, n_new) = (old.len(), new.len());
            let input = Input {
                spans: old.into_iter().chain(new).collect(),
                samples: old_samples.into_iter().chain(new_samples).collect(),
                profile_files: 1,
                span_files: 1,
                period_ns: Some(10 * MS),
                ..Input::default()
            };
            let (old, new) = input.spans.split_at(n_old);
            prop_assert_eq!(new.len(), n_new);
            let old: Vec<&Span> = old.iter().collect();
            let new: Vec<&Span> = new.iter().collect();
            let text =
                VersionDiff::between_spans(&input, "job", ("1", &old), ("2", &new)).to_string();
            let cells = |line: &str| -> Vec<String> {
                line.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect()
            };
            let lines: Vec<&str> = text.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains("CPU SAMPLES") && l.contains("VERDICT"))
                .expect("header");
            let header = cells(lines[at]);
            for label in ["1", "2"] {
                let row = cells(
                    lines[at..]
                        .iter()
                        .find(|l| l.starts_with(&format!("  {label} ")))
                        .expect("row"),
                );
                prop_assert_eq!(header.len() + 1, row.len(), "{}", text);
                let share = |part: Part| -> Option<u64> {
                    let at = header.iter().position(|h| h == column(part))?;
                    let cell = &row[at + 1];
                    let (_, pct) = cell.split_once(" (")?;
                    pct.strip_suffix("%)").map(|n| n.parse().expect("a share"))
                };
                let sentence = lines
                    .iter()
                    .find_map(|l| l.strip_prefix(&format!("  {label}: ")))
                    .expect("the side's sentence");
                let (verdict, reason) = sentence.split_once(" — ").expect("verdict — reason");
                prop_assert_eq!(verdict, row.last().expect("verdict").as_str());
                let named = crate::split::arbitrary::shares_named(reason)
                    .map_err(TestCaseError::fail)?;
                for (part, n) in named {
                    prop_assert_eq!(Some(n), share(part), "{} in {}\n{}", part.label(), reason, text);
                }
            }
        }
    }
}
