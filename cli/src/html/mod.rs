//! The span report as one self-contained HTML page: the per-endpoint table with where the
//! wall time went drawn as bars, the verdicts with their reasons, a flame graph per
//! endpoint and version, and the version diffs.
//!
//! Everything is inline (CSS, script, SVG) and the page's content security policy forbids
//! every fetch, so it opens from disk with no server and no network. Every text that comes
//! from the files read (span names, versions, function names, directories) is escaped.

mod flame;

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use crate::diff::VersionDiff;
use crate::error::ReportError;
use crate::format::{ms, ms_delta, ms_f, percent};
use crate::ids::SpanId;
use crate::input::{version_label, Input, Span};
use crate::report::{SpanGroup, SpanReport};
use crate::split::{Part, Percent, TimeSplit, PART_ORDER};
use crate::verdict::{Verdict, CPU_BOUND_PERCENT, WAITING_PERCENT};

use flame::FlameTree;

/// The page's script: error capture, flame graph zoom and hover, the "ready" marker.
const SCRIPT: &str = include_str!("page.js");
/// The page's style sheet.
const STYLE: &str = include_str!("page.css");
/// Runs first: errors of any later script (or a blocked load) are written into the page.
const ERROR_CAPTURE: &str = include_str!("errors.js");

/// No fetch of any kind; inline style and script only.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'";

/// The HTML report over one or more directories (one run).
#[derive(Debug)]
pub struct HtmlReport {
    report: SpanReport,
    views: Vec<GroupView>,
    diffs: Vec<VersionDiff>,
}

/// One version of a span name: when it first ran, its group and its spans.
type Version<'a> = (u64, &'a SpanGroup, Vec<&'a Span>);

/// What the page draws for one report group.
#[derive(Debug)]
struct GroupView {
    split: TimeSplit,
    flame: FlameTree,
    /// The group's allocation samples (bytes allocated, estimated), when the bridge
    /// sampled allocations.
    alloc_flame: FlameTree,
}

impl HtmlReport {
    /// Reads `dirs` (see [`Input::load`]) and builds the page's content.
    pub fn from_dirs(dirs: &[PathBuf]) -> Result<HtmlReport, ReportError> {
        Ok(HtmlReport::from_input(&Input::load(dirs)?))
    }

    /// Builds the page's content from what was read.
    pub fn from_input(input: &Input) -> HtmlReport {
        let report = SpanReport::from_input(input);
        let by_id = input.samples_by_span_id();
        let allocated_by_id = input.allocated_by_span_id();
        let roots: HashMap<SpanId, &Span> = input
            .local_roots()
            .into_iter()
            .map(|s| (s.span_id, s))
            .collect();
        let spans_of = |group: &SpanGroup| -> Vec<&Span> {
            group
                .span_ids
                .iter()
                .filter_map(|id| roots.get(id).copied())
                .collect()
        };
        let views = report
            .groups
            .iter()
            .map(|group| {
                let spans = spans_of(group);
                GroupView {
                    // The report's own split: one per group, never computed twice.
                    split: group.split.clone(),
                    flame: FlameTree::of_samples(
                        spans
                            .iter()
                            .filter_map(|s| by_id.get(&s.span_id))
                            .flatten()
                            .copied(),
                    ),
                    alloc_flame: FlameTree::of_allocations(
                        spans
                            .iter()
                            .filter_map(|s| allocated_by_id.get(&s.span_id))
                            .flatten()
                            .copied(),
                    ),
                }
            })
            .collect();
        // Versions of one name in the order they first ran, each diffed with the next.
        let mut by_name: BTreeMap<&str, Vec<Version>> = BTreeMap::new();
        for group in &report.groups {
            let spans = spans_of(group);
            let first = spans.iter().map(|s| s.start_unix_nano).min().unwrap_or(0);
            by_name
                .entry(group.name.as_str())
                .or_default()
                .push((first, group, spans));
        }
        let mut diffs = Vec::new();
        for (name, mut versions) in by_name {
            versions.sort_by_key(|(first, group, _)| (*first, group.version.clone()));
            for pair in versions.windows(2) {
                let [(_, old, old_spans), (_, new, new_spans)] = pair else {
                    continue;
                };
                diffs.push(VersionDiff::between_spans(
                    input,
                    name,
                    (version_label(old.version.as_deref()), old_spans),
                    (version_label(new.version.as_deref()), new_spans),
                ));
            }
        }
        HtmlReport {
            report,
            views,
            diffs,
        }
    }

    /// The report the page shows.
    pub fn report(&self) -> &SpanReport {
        &self.report
    }

    /// The version diffs the page shows: each span name's versions in the order they first
    /// ran, each compared with the next.
    pub fn diffs(&self) -> &[VersionDiff] {
        &self.diffs
    }

    /// Writes the page to `path`.
    pub fn write_file(&self, path: &Path) -> Result<(), ReportError> {
        let io = |source| ReportError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        write!(out, "{self}").map_err(io)?;
        out.flush().map_err(io)
    }
}

/// Text escaped for HTML element content and double- or single-quoted attribute values.
pub(crate) struct Esc<'a>(pub(crate) &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

impl fmt::Display for HtmlReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut page = String::new();
        self.write_page(&mut page)?;
        f.write_str(&page)
    }
}

impl HtmlReport {
    fn write_page(&self, out: &mut String) -> fmt::Result {
        let r = &self.report;
        let spans: usize = r.groups.iter().map(|g| g.count).sum();
        let period_ms = r.sampling.period_ns as f64 / 1e6;
        let hz = 1e9 / r.sampling.period_ns.max(1) as f64;
        write!(
            out,
            r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Span report — otel-profiling</title>
<script>{ERROR_CAPTURE}</script>
<style>{STYLE}</style>
</head>
<body>
<pre id="page-errors" hidden></pre>
<header>
<h1>Span report</h1>
<p>{spans} local root span(s) in {groups} group(s); {profiles} profile file(s) ({period_ms:.0} ms sampling period, {hz:.0} Hz), {span_files} span file(s), from:</p>
<ul class="dirs">
"#,
            groups = r.groups.len(),
            profiles = r.profile_files,
            span_files = r.span_files,
        )?;
        for dir in &r.dirs {
            writeln!(
                out,
                "<li><code>{}</code></li>",
                Esc(&dir.display().to_string())
            )?;
        }
        writeln!(
            out,
            r##"</ul>
<nav><a href="#endpoints">Endpoints</a> · <a href="#details">Verdicts and flame graphs</a> · <a href="#diffs">Version diff</a> · <a href="#notes">How to read this</a></nav>
</header>"##
        )?;
        self.write_overview(out)?;
        self.write_details(out)?;
        self.write_diffs(out)?;
        self.write_unattributed(out)?;
        write_notes(out, period_ms)?;
        write!(out, "<script>{SCRIPT}</script>\n</body>\n</html>\n")
    }

    fn write_overview(&self, out: &mut String) -> fmt::Result {
        writeln!(out, r#"<section id="endpoints"><h2>Endpoints</h2>"#)?;
        if self.report.groups.is_empty() {
            return writeln!(
                out,
                "<p>No local root spans in the span files read.</p></section>"
            );
        }
        write_legend(out)?;
        writeln!(
            out,
            r#"<table class="overview"><thead><tr><th>Endpoint</th><th>Version</th><th class="num">Spans</th><th class="num">Wall p50</th><th class="num">Wall p95</th><th class="split-col">Where the wall time went</th><th class="num">CPU</th><th>Active time from</th><th>Verdict</th></tr></thead><tbody>"#
        )?;
        for (index, (g, view)) in self.report.groups.iter().zip(&self.views).enumerate() {
            let s = &view.split;
            writeln!(
                out,
                r##"<tr><td class="endpoint"><a href="#g{index}">{name}</a></td><td>{version}</td><td class="num">{count}</td><td class="num">{p50}</td><td class="num">{p95}</td><td>"##,
                name = Esc(&g.name),
                version = Esc(version_label(g.version.as_deref())),
                count = g.count,
                p50 = ms(g.wall_p50_ns),
                p95 = ms(g.wall_p95_ns),
            )?;
            write_bar(out, s)?;
            writeln!(
                out,
                r#"</td><td class="num">{cpu}<br><small>{samples} samples</small></td><td class="source" title="{source}">{tag}<br><small>{kind}</small></td><td><span class="verdict {class}">{verdict}</span></td></tr>"#,
                cpu = ms(s.cpu_ns),
                samples = s.cpu_samples,
                source = Esc(&s.source()),
                tag = Esc(&source_tag(s)),
                kind = if s.active.is_some() {
                    "CPU / blocked / awaiting"
                } else {
                    "CPU vs not on CPU"
                },
                class = verdict_class(g.verdict),
                verdict = g.verdict,
            )?;
        }
        writeln!(out, "</tbody></table></section>")
    }

    fn write_details(&self, out: &mut String) -> fmt::Result {
        writeln!(
            out,
            r#"<section id="details"><h2>Verdicts and flame graphs</h2>"#
        )?;
        let mut current: Option<&str> = None;
        for (index, (g, view)) in self.report.groups.iter().zip(&self.views).enumerate() {
            if current != Some(g.name.as_str()) {
                if current.is_some() {
                    writeln!(out, "</section>")?;
                }
                writeln!(
                    out,
                    r#"<section class="endpoint"><h3>{}</h3>"#,
                    Esc(&g.name)
                )?;
                current = Some(&g.name);
            }
            write_group(out, index, g, view)?;
        }
        if current.is_some() {
            writeln!(out, "</section>")?;
        }
        writeln!(out, "</section>")
    }

    fn write_diffs(&self, out: &mut String) -> fmt::Result {
        writeln!(out, r#"<section id="diffs"><h2>Version diff</h2>"#)?;
        if self.diffs.is_empty() {
            writeln!(
                out,
                "<p>No span name ran in more than one service.version here.</p>"
            )?;
        }
        for diff in &self.diffs {
            write_diff(out, diff)?;
        }
        writeln!(out, "</section>")
    }

    fn write_unattributed(&self, out: &mut String) -> fmt::Result {
        let r = &self.report;
        let o = &r.outside_spans;
        if r.without_samples.is_empty()
            && o.name_only.is_empty()
            && o.unknown_span_ns == 0
            && o.no_span_ns == 0
        {
            return Ok(());
        }
        writeln!(
            out,
            r#"<section id="unattributed"><h2>Not in the flame graphs</h2>"#
        )?;
        if !r.without_samples.is_empty() {
            let mut counts: BTreeMap<(&str, &str, String), usize> = BTreeMap::new();
            for span in &r.without_samples {
                *counts
                    .entry((
                        span.name.as_str(),
                        version_label(span.version.as_deref()),
                        span.reason.to_string(),
                    ))
                    .or_default() += 1;
            }
            writeln!(out, "<p>Spans without CPU samples:</p><ul>")?;
            for ((name, version, reason), n) in counts {
                writeln!(
                    out,
                    "<li>{}, {}: {n} span(s), {}</li>",
                    Esc(name),
                    Esc(version),
                    Esc(&reason)
                )?;
            }
            writeln!(out, "</ul>")?;
        }
        let mut outside = Vec::new();
        for (name, ns) in &o.name_only {
            outside.push(format!(
                "{} with the span name {:?} only (unsampled traces)",
                ms(*ns),
                name
            ));
        }
        if o.unknown_span_ns > 0 {
            outside.push(format!(
                "{} of span ids in no span file read (spans still open, or their span file is elsewhere)",
                ms(o.unknown_span_ns)
            ));
        }
        if o.no_span_ns > 0 {
            outside.push(format!("{} outside any span", ms(o.no_span_ns)));
        }
        if !outside.is_empty() {
            writeln!(
                out,
                "<p>CPU not tied to a local root span read here:</p><ul>"
            )?;
            for line in outside {
                writeln!(out, "<li>{}</li>", Esc(&line))?;
            }
            writeln!(out, "</ul>")?;
        }
        writeln!(out, "</section>")
    }
}

fn write_legend(out: &mut String) -> fmt::Result {
    writeln!(out, r#"<p class="legend">"#)?;
    for part in PART_ORDER {
        writeln!(
            out,
            r#"<span><i class="seg {}"></i>{}</span>"#,
            part_class(part),
            part.label()
        )?;
    }
    writeln!(
        out,
        "<span class=\"hint\">Blocked and awaiting need the spans' active time (profiling.wall.active_ns, or busy_ns from tracing-opentelemetry); without it the bar is CPU against not on CPU.</span></p>"
    )
}

/// A horizontal bar of the split's parts, widths in percent of the wall time, and each
/// part's share as the report's sentences and table print it.
fn write_bar(out: &mut String, split: &TimeSplit) -> fmt::Result {
    write!(out, r#"<div class="bar">"#)?;
    let wall = split.wall_ns.max(1);
    let share = |part: Part| {
        split
            .share(part)
            .map_or_else(|| "-".to_owned(), |p: Percent| p.to_string())
    };
    for (part, ns) in split.parts() {
        if ns == 0 {
            continue;
        }
        // The width is exact; the figure is the one every view prints.
        let width = ns as f64 * 100.0 / wall as f64;
        write!(
            out,
            r#"<span class="seg {}" style="width:{width:.2}%" title="{}: {} ({})"></span>"#,
            part_class(part),
            part.label(),
            ms(ns),
            share(part),
        )?;
    }
    write!(out, "</div><small>")?;
    let figures: Vec<String> = split
        .parts()
        .into_iter()
        .map(|(part, _)| format!("{} {}", part.label(), share(part)))
        .collect();
    write!(out, "{}</small>", figures.join(" · "))
}

fn part_class(part: Part) -> &'static str {
    match part {
        Part::Cpu => "cpu",
        Part::Blocked => "blocked",
        Part::Queued => "queued",
        Part::Runqueue => "runqueue",
        Part::Awaiting => "awaiting",
        Part::OffCpu => "offcpu",
        Part::Unknown => "unknown",
    }
}

fn source_tag(split: &TimeSplit) -> String {
    match (split.active, split.partial) {
        (Some(source), None) => source.attribute().to_owned(),
        (_, Some((source, n))) => format!("{} on {n}/{} spans", source.attribute(), split.spans),
        (None, None) => "none".to_owned(),
    }
}

fn verdict_class(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::CpuBound => "cpu-bound",
        Verdict::BlockedInPoll => "blocked",
        Verdict::Queued => "queued",
        Verdict::WaitingForCpu => "waiting-cpu",
        Verdict::Mixed => "mixed",
        Verdict::Waiting => "waiting",
        Verdict::NoEvidence => "no-evidence",
    }
}

fn write_group(out: &mut String, index: usize, g: &SpanGroup, view: &GroupView) -> fmt::Result {
    let s = &view.split;
    let version = version_label(g.version.as_deref());
    writeln!(
        out,
        r#"<article class="group" id="g{index}"><h4>{name} <span class="version">{version}</span></h4>
<p class="verdict-line"><span class="verdict {class}">{verdict}</span> {reason}</p>"#,
        name = Esc(&g.name),
        version = Esc(version),
        class = verdict_class(g.verdict),
        verdict = g.verdict,
        reason = Esc(&g.reason),
    )?;
    write_bar(out, s)?;
    // The other parts as the bar has them (a part not measured is not named).
    let rest: Vec<String> = s
        .parts()
        .into_iter()
        .filter(|&(part, _)| part != Part::Cpu)
        .map(|(part, ns)| format!("{} {}", part.label(), ms(ns)))
        .collect();
    let active = if s.active.is_some() {
        format!("; active {}: {}", ms(s.active_ns), rest.join(", "))
    } else {
        format!("; {}", rest.join(", "))
    };
    writeln!(
        out,
        r#"<p class="figures">{count} span(s), wall total {wall} (p50 {p50}, p95 {p95}); CPU {cpu} in {samples} sample(s){active}.<br><small>{source}</small></p>"#,
        count = g.count,
        wall = ms(s.wall_ns),
        p50 = ms(g.wall_p50_ns),
        p95 = ms(g.wall_p95_ns),
        cpu = ms(s.cpu_ns),
        samples = s.cpu_samples,
        source = Esc(&s.source()),
    )?;
    let (title, list) = if g.user_self.is_empty() {
        ("Top functions by self CPU", &g.top_self)
    } else {
        (
            "Top functions of your code (their own CPU and the library calls they make)",
            &g.user_self,
        )
    };
    if !list.is_empty() {
        writeln!(
            out,
            r#"<table class="functions"><caption>{title}</caption><thead><tr><th class="num">CPU</th><th class="share-col">Share</th><th>Function</th></tr></thead><tbody>"#
        )?;
        for function in list {
            let share = function.cpu_ns as f64 * 100.0 / g.profile_cpu_ns.max(1) as f64;
            writeln!(
                out,
                r#"<tr><td class="num">{cpu}</td><td><div class="share"><span style="width:{share:.1}%"></span></div>{share:.1}%</td><td><code>{name}</code></td></tr>"#,
                cpu = ms(function.cpu_ns),
                name = Esc(&function.function),
            )?;
        }
        writeln!(out, "</tbody></table>")?;
    }
    if !g.grouped.is_empty() {
        let groups: Vec<String> = g
            .grouped
            .iter()
            .map(|lib| format!("{} {}", lib.function, percent(lib.cpu_ns, g.profile_cpu_ns)))
            .collect();
        writeln!(
            out,
            "<p class=\"grouped\">In runtime and libraries (innermost frame): {}</p>",
            Esc(&groups.join(", "))
        )?;
    }
    if let Some(allocations) = &g.allocations {
        writeln!(
            out,
            "<p class=\"allocations\">{}</p>",
            Esc(&crate::report::describe_allocations(allocations, g.count))
        )?;
    }
    if view.flame.cpu_ns() > 0 {
        let label = format!("CPU flame graph of {}, {}", g.name, version);
        let caption = format!(
            "{} in {} sample(s). Wider is more CPU; callers below callees; warm colours are \
             your code, grey-blue the runtime and libraries.",
            ms(view.flame.cpu_ns()),
            s.cpu_samples
        );
        write_flame_figure(out, &view.flame, &label, &caption)?;
    } else {
        let why = g
            .no_samples
            .map(|_| g.reason.as_str())
            .unwrap_or("no CPU samples");
        writeln!(
            out,
            r#"<p class="no-flame">No flame graph: {}</p>"#,
            Esc(why)
        )?;
    }
    if view.alloc_flame.cpu_ns() > 0 {
        let label = format!("Allocation flame graph of {}, {}", g.name, version);
        let caption = format!(
            "{} allocated (estimated) in {} allocation sample(s). Wider is more bytes \
             allocated; callers below callees; the innermost frame is the allocator's.",
            crate::format::bytes(view.alloc_flame.cpu_ns()),
            view.alloc_flame.samples()
        );
        write_flame_figure(out, &view.alloc_flame, &label, &caption)?;
    }
    writeln!(out, "</article>")
}

/// One flame graph with its caption (`label: caption`) and the line the page's script
/// fills with the frame under the pointer.
fn write_flame_figure(
    out: &mut String,
    flame: &FlameTree,
    label: &str,
    caption: &str,
) -> fmt::Result {
    writeln!(
        out,
        r#"<figure class="flame-figure"><figcaption>{}: {} Click a frame to zoom, the bottom bar to reset.</figcaption><div class="flame-scroll">"#,
        Esc(label),
        Esc(caption),
    )?;
    flame.write_svg(out, label)?;
    writeln!(out, r#"</div><p class="flame-details">&#160;</p></figure>"#)
}

fn write_diff(out: &mut String, diff: &VersionDiff) -> fmt::Result {
    let (b, a) = (&diff.before, &diff.after);
    writeln!(
        out,
        r#"<article class="diff"><h3>{name}: {from} → {to}, per request</h3>
<table><thead><tr><th></th><th class="num">Requests</th><th class="num">Wall p50</th><th class="num">CPU/request (profile)</th><th class="num">CPU/request (attributes)</th></tr></thead><tbody>"#,
        name = Esc(&diff.span_name),
        from = Esc(&b.label),
        to = Esc(&a.label),
    )?;
    for side in [b, a] {
        writeln!(
            out,
            r#"<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
            Esc(&side.label),
            side.requests,
            ms(side.wall_p50_ns),
            ms_f(side.cpu_per_request_ns),
            side.attribute_cpu_per_request_ns
                .map_or_else(|| "-".to_owned(), ms_f),
        )?;
    }
    let growth = if b.cpu_per_request_ns > 0.0 {
        format!(
            " ({:+.1}%)",
            (a.cpu_per_request_ns / b.cpu_per_request_ns - 1.0) * 100.0
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "</tbody></table><p>CPU per request {}{growth}; wall p50 {}.</p>",
        ms_delta(a.cpu_per_request_ns - b.cpu_per_request_ns),
        ms_delta(a.wall_p50_ns as f64 - b.wall_p50_ns as f64),
    )?;
    write_diff_split(out, diff)?;
    // When CPU per request did not grow, what grew is mostly sampling noise: folded away so
    // the regressions stand out.
    let folded = a.cpu_per_request_ns <= b.cpu_per_request_ns
        && (!diff.new_functions.is_empty() || !diff.grown.is_empty());
    if folded {
        writeln!(
            out,
            "<details><summary>CPU per request did not grow: the functions that grew anyway (mostly sampling noise at this size)</summary>"
        )?;
    }
    if !diff.new_functions.is_empty() {
        writeln!(
            out,
            r#"<table class="functions"><caption>New in {} (never on a stack in {}), by total CPU per request</caption><thead><tr><th>Function</th><th class="num">Total</th><th class="num">Self</th></tr></thead><tbody>"#,
            Esc(&a.label),
            Esc(&b.label)
        )?;
        for d in &diff.new_functions {
            writeln!(
                out,
                r#"<tr><td><code>{}</code></td><td class="num">{}</td><td class="num">{}</td></tr>"#,
                Esc(&d.function),
                ms_f(d.total_after_ns),
                ms_f(d.after_ns)
            )?;
        }
        writeln!(out, "</tbody></table>")?;
    }
    let close = if folded { "</details>" } else { "" };
    if diff.grown.is_empty() {
        return writeln!(
            out,
            "<p>No function's CPU per request grew.</p>{close}</article>"
        );
    }
    let largest = diff
        .grown
        .iter()
        .map(|d| d.delta_ns().max(d.total_delta_ns()))
        .fold(1.0, f64::max);
    writeln!(
        out,
        r#"<table class="functions"><caption>Functions whose CPU per request grew most (self: innermost frame; total: anywhere on the stack)</caption><thead><tr><th>Function</th><th class="num">Self before</th><th class="num">Self after</th><th class="share-col">Self delta</th><th class="num">Total delta</th></tr></thead><tbody>"#
    )?;
    for d in &diff.grown {
        let width = d.delta_ns().max(0.0) * 100.0 / largest;
        writeln!(
            out,
            r#"<tr><td><code>{}</code></td><td class="num">{}</td><td class="num">{}</td><td class="nowrap"><div class="share grow"><span style="width:{width:.1}%"></span></div>{}</td><td class="num">{}</td></tr>"#,
            Esc(&d.function),
            ms_f(d.before_ns),
            ms_f(d.after_ns),
            ms_delta(d.delta_ns()),
            ms_delta(d.total_delta_ns()),
        )?;
    }
    writeln!(out, "</tbody></table>{close}</article>")
}

/// Each side's split as a bar with its figures per request, its verdict and the line
/// saying what changed (the same text as the `diff` command's).
fn write_diff_split(out: &mut String, diff: &VersionDiff) -> fmt::Result {
    writeln!(
        out,
        r#"<table class="diff-split"><thead><tr><th></th><th class="split-col">Where the wall time went, per request</th><th class="num">CPU/request</th><th>Verdict</th></tr></thead><tbody>"#
    )?;
    for side in [&diff.before, &diff.after] {
        let s = &side.split;
        write!(out, r#"<tr><td>{}</td><td>"#, Esc(&side.label))?;
        write_bar(out, s)?;
        let figures: Vec<String> = side
            .parts_per_request()
            .into_iter()
            .map(|(part, ns)| format!("{} {}", part.label(), ms_f(ns)))
            .collect();
        writeln!(
            out,
            r#"<br><small>{figures} (wall {wall})</small></td><td class="num">{cpu}<br><small>{samples} samples</small></td><td><span class="verdict {class}">{verdict}</span> <small>{reason}</small></td></tr>"#,
            figures = figures.join(" · "),
            wall = ms_f(side.wall_mean_ns()),
            cpu = ms_f(side.per_request(s.cpu_ns)),
            samples = s.cpu_samples,
            class = verdict_class(side.verdict),
            verdict = side.verdict,
            reason = Esc(&side.reason),
        )?;
    }
    let basis = if diff.basis_is_coarser() {
        format!(" <small>(compared as {})</small>", diff.split_basis())
    } else {
        String::new()
    };
    writeln!(
        out,
        r#"</tbody></table><p class="what-changed"><strong>What changed:</strong> {}{basis}</p>"#,
        Esc(&diff.what_changed())
    )
}

fn write_notes(out: &mut String, period_ms: f64) -> fmt::Result {
    writeln!(
        out,
        r#"<section id="notes"><h2>How to read this</h2><ul>
<li>CPU is sampled: each sample stands for one {period_ms:.0} ms period of CPU, so a CPU figure from n samples is good to about ±√n periods; the sample count is shown beside it.</li>
<li>Blocked in poll ≈ active time − CPU: the span kept its thread busy but off the CPU — a blocking call inside async code (which stalls every other task on that worker), or the thread waiting for a CPU the machine gave to other work. Awaiting ≈ wall − active time: the span was not being polled (waiting on I/O, a timer, a lock, another task, or queued behind other work).</li>
<li>Active time comes from span attributes: <code>profiling.wall.active_ns</code> (written by otel-profiling: all threads of the local root) or else <code>busy_ns</code> (written by tracing-opentelemetry: the root span's own entered time). Spans of a row without it, where others carry it, are its unknown part (hatched): never counted as blocked or awaiting. Without either on any span, only CPU against not on CPU is known.</li>
<li>Verdicts compare the shares the bars print: CPU-bound at {bound} % of CPU or more, waiting under {waiting} %, mixed between (blocked in poll, waiting for a CPU or queued when that part holds half the wall time); a slow span with no samples is never called fast, and a root the bridge kept no evidence for reads "no evidence", with why.</li>
</ul><p class="generated">Written by otel-profiling-cli {version}; no server, no network.</p></section>"#,
        version = env!("CARGO_PKG_VERSION"),
        bound = CPU_BOUND_PERCENT,
        waiting = WAITING_PERCENT,
    )
}

#[cfg(test)]
mod tests;
