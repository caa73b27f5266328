//! Narrowing a regression: the same span name in two versions (from one directory, by
//! `service.version`) or in two directories, per request, and the functions whose CPU
//! per request grew most.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::ReportError;
use crate::format::{ms, ms_delta, ms_f, Table};
use crate::functions::FunctionTotals;
use crate::input::{version_label, Input, Span};
use crate::stats::percentile;

/// How many grown functions the diff names.
pub const TOP_GROWN: usize = 10;

/// Share of the new side's CPU per request a new function must hold to be named (below
/// it, a function seen in a sample or two is sampling noise).
pub const NEW_FUNCTION_SHARE: f64 = 0.05;

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
    /// Functions on the new side's stacks that the old side never ran, holding at least
    /// [`NEW_FUNCTION_SHARE`] of the new side's CPU, by total CPU per request, most first
    /// (up to [`TOP_GROWN`]): new code paths, often the regression itself.
    pub new_functions: Vec<FunctionDelta>,
}

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
        let input = Input::load(&[dir.to_path_buf()])?;
        let spans = spans_named(&input, span_name)?;
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
        let before = side(from.to_owned(), &input, &of_version(from)?);
        let after = side(to.to_owned(), &input, &of_version(to)?);
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
            side(before.0.to_owned(), input, before.1),
            side(after.0.to_owned(), input, after.1),
        )
    }

    /// Compares the `span_name` spans of directory `before` with those of `after`.
    pub fn between_dirs(
        before: &Path,
        after: &Path,
        span_name: &str,
    ) -> Result<VersionDiff, ReportError> {
        let side_of = |dir: &Path| -> Result<(DiffSide, FunctionTotals), ReportError> {
            let input = Input::load(&[dir.to_path_buf()])?;
            let spans = spans_named(&input, span_name)?;
            Ok(side(dir.display().to_string(), &input, &spans))
        };
        Ok(VersionDiff::new(
            span_name,
            side_of(before)?,
            side_of(after)?,
        ))
    }

    fn new(
        span_name: &str,
        (before, old): (DiffSide, FunctionTotals),
        (after, new): (DiffSide, FunctionTotals),
    ) -> VersionDiff {
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
        grown.sort_by(|a, b| {
            b.delta_ns()
                .total_cmp(&a.delta_ns())
                .then(b.total_delta_ns().total_cmp(&a.total_delta_ns()))
                .then(a.function.cmp(&b.function))
        });
        grown.truncate(TOP_GROWN);
        VersionDiff {
            span_name: span_name.to_owned(),
            before,
            after,
            grown,
            new_functions,
        }
    }
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

/// One side's figures and per-function CPU.
fn side(label: String, input: &Input, spans: &[&Span]) -> (DiffSide, FunctionTotals) {
    let by_id = input.samples_by_span_id();
    let mut functions = FunctionTotals::default();
    let mut cpu_ns = 0u64;
    for sample in spans
        .iter()
        .filter_map(|s| by_id.get(s.span_id.as_str()))
        .flatten()
    {
        cpu_ns += sample.cpu_ns;
        functions.add(sample);
    }
    let mut walls: Vec<u64> = spans.iter().map(|s| s.wall_ns()).collect();
    walls.sort_unstable();
    let with_attribute: Vec<u64> = spans.iter().filter_map(|s| s.cpu_time_ns).collect();
    let requests = spans.len();
    let side = DiffSide {
        label,
        requests,
        wall_p50_ns: percentile(&walls, 50.0),
        cpu_per_request_ns: cpu_ns as f64 / requests.max(1) as f64,
        attribute_cpu_per_request_ns: (!with_attribute.is_empty())
            .then(|| with_attribute.iter().sum::<u64>() as f64 / with_attribute.len() as f64),
    };
    (side, functions)
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
