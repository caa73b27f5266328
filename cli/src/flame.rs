//! Flame graphs (SVG, drawn by `inferno`) of the CPU samples of one span or one span name.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;
use std::path::PathBuf;

use crate::error::ReportError;
use crate::functions::NO_STACK;
use crate::ids::SpanId;
use crate::input::{version_label, Input, Sample, Span};
use crate::verdict::NoSamples;

/// Which samples to draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlameSelection {
    /// The samples of one local root span, by its span id (16 hex digits).
    SpanId(String),
    /// Every sample labelled with this span name or with the id of a span of this name,
    /// in every `service.version` (the subtitle names them when there are several).
    SpanName(String),
    /// The samples labelled with the ids of the local roots of this name in one
    /// `service.version` (`(none)` for spans of a resource without one).
    SpanNameInVersion {
        /// The span name (or `{method} {route}`).
        name: String,
        /// The `service.version`.
        version: String,
    },
}

/// The folded stacks of a selection, ready to draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlameGraph {
    /// What was selected, as the graph's title says.
    pub title: String,
    /// Spans, samples and CPU time drawn.
    pub subtitle: String,
    /// Folded stacks, `outer;...;inner <CPU ns>`, sorted.
    pub folded: Vec<String>,
    /// Samples drawn.
    pub samples: u64,
    /// CPU time drawn, nanoseconds.
    pub cpu_ns: u64,
    /// The frames (as folded) that are the user's code (see [`crate::ownership`]; the
    /// input's `--crate` names count): drawn in blue, the rest in the usual warm colours.
    pub user_frames: BTreeSet<String>,
}

impl FlameGraph {
    /// Reads `dirs` and selects the samples.
    ///
    /// Fails with [`ReportError::InvalidSpanId`] for an id that is not 16 hex digits,
    /// [`ReportError::UnknownSpanId`] / [`ReportError::UnknownSpanName`] for a selection
    /// found nowhere, and [`ReportError::NoSamples`] (with the reason) for one that exists
    /// but has no CPU samples.
    pub fn from_dirs(
        dirs: &[PathBuf],
        selection: &FlameSelection,
    ) -> Result<FlameGraph, ReportError> {
        FlameGraph::from_input(&Input::load(dirs)?, selection)
    }

    /// Selects the samples from what was read.
    pub fn from_input(
        input: &Input,
        selection: &FlameSelection,
    ) -> Result<FlameGraph, ReportError> {
        let (title, spans, samples) = match selection {
            FlameSelection::SpanId(id) => select_span_id(input, id)?,
            FlameSelection::SpanName(name) => select_span_name(input, name, None)?,
            FlameSelection::SpanNameInVersion { name, version } => {
                select_span_name(input, name, Some(version))?
            }
        };
        let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
        let (mut count, mut cpu_ns) = (0, 0);
        for sample in &samples {
            *stacks.entry(fold(sample)).or_default() += sample.cpu_ns;
            count += sample.count;
            cpu_ns += sample.cpu_ns;
        }
        let mut span_count = if spans.count == 1 {
            "1 span".to_owned()
        } else {
            format!("{} spans", spans.count)
        };
        if !spans.merged_versions.is_empty() {
            span_count += &format!(
                " of versions {} merged (--service-version draws one)",
                spans.merged_versions.join(", ")
            );
        }
        Ok(FlameGraph {
            subtitle: format!(
                "{span_count}, {count} samples, {:.1} ms CPU",
                cpu_ns as f64 / 1e6
            ),
            title,
            folded: stacks
                .into_iter()
                .map(|(stack, ns)| format!("{stack} {ns}"))
                .collect(),
            samples: count,
            cpu_ns,
            user_frames: user_frames(input, &samples),
        })
    }

    /// What the service's threads did while the selected spans ran — **not their profile**:
    /// the samples of other work in the profile windows overlapping them (see
    /// [`crate::concurrent`]). For spans with no samples of their own (unsampled, shorter
    /// than the period, run elsewhere), the pattern's fallback; the title says what it is.
    ///
    /// Fails like [`FlameGraph::from_input`] for a selection found nowhere, and with
    /// [`ReportError::NoSamples`] when no timed profile window overlaps the spans.
    pub fn concurrent_from_input(
        input: &Input,
        selection: &FlameSelection,
    ) -> Result<FlameGraph, ReportError> {
        let (what, spans) = selected_spans(input, selection)?;
        let (windows, samples) = crate::concurrent::select(&spans, &input.samples);
        if windows.is_empty() {
            return Err(ReportError::NoSamples {
                selection: what,
                reason: "no profile read has a time window overlapping it".to_owned(),
            });
        }
        let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
        let (mut count, mut cpu_ns) = (0, 0);
        for sample in &samples {
            *stacks.entry(fold(sample)).or_default() += sample.cpu_ns;
            count += sample.count;
            cpu_ns += sample.cpu_ns;
        }
        let window_ns: u64 = windows.iter().map(|(s, e)| e - s).sum();
        Ok(FlameGraph {
            title: format!(
                "Concurrent workload activity during {what} — {}",
                crate::concurrent::CAVEAT
            ),
            subtitle: format!(
                "other work in the {} profile window(s) around it ({:.1} s): {count} samples, \
                 {:.1} ms CPU",
                windows.len(),
                window_ns as f64 / 1e9,
                cpu_ns as f64 / 1e6
            ),
            folded: stacks
                .into_iter()
                .map(|(stack, ns)| format!("{stack} {ns}"))
                .collect(),
            samples: count,
            cpu_ns,
            user_frames: user_frames(input, &samples),
        })
    }

    /// Draws the SVG into `out`.
    pub fn write_svg(&self, out: impl Write) -> Result<(), ReportError> {
        let mut colours = inferno::flamegraph::color::PaletteMap::default();
        for frame in &self.user_frames {
            colours.insert(frame, user_colour(frame));
        }
        let mut options = inferno::flamegraph::Options::default();
        options.palette_map = Some(&mut colours);
        options.title = self.title.clone();
        options.subtitle = Some(self.subtitle.clone());
        options.count_name = "ns CPU".to_owned();
        // Same colours for the same functions from one run to the next.
        options.deterministic = true;
        inferno::flamegraph::from_lines(&mut options, self.folded.iter().map(String::as_str), out)
            .map_err(ReportError::Flamegraph)
    }

    /// The SVG as a string.
    pub fn to_svg(&self) -> Result<String, ReportError> {
        let mut out = Vec::new();
        self.write_svg(&mut out)?;
        String::from_utf8(out).map_err(|e| {
            ReportError::Flamegraph(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
    }
}

/// The frames of `samples` that are the user's code, as [`fold`] writes them.
fn user_frames(input: &Input, samples: &[&Sample]) -> BTreeSet<String> {
    let owners = input.ownership();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut user = BTreeSet::new();
    for frame in samples.iter().flat_map(|s| s.frames.iter()) {
        if seen.insert(frame) && owners.is_user(frame) {
            user.insert(frame.replace(';', ","));
        }
    }
    user
}

/// A blue for the user's frame `name`, its shade from the name (stable across runs), so
/// that neighbouring frames stay apart.
fn user_colour(name: &str) -> inferno::flamegraph::color::Color {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let shade = (hash % 60) as u8;
    inferno::flamegraph::color::Color {
        r: 60 + shade / 2,
        g: 120 + shade,
        b: 220,
    }
}

/// `outer;...;inner` for a sample; `;` inside names (array types) becomes `,`.
fn fold(sample: &Sample) -> String {
    if sample.frames.is_empty() {
        return NO_STACK.to_owned();
    }
    sample
        .frames
        .iter()
        .rev()
        .map(|f| f.replace(';', ","))
        .collect::<Vec<_>>()
        .join(";")
}

/// The selection's title, how many spans it covers (and, merged, in which versions), and
/// its samples.
type Selected<'a> = (String, Spans, Vec<&'a Sample>);

/// The spans a graph covers: how many, and their versions when more than one is merged.
struct Spans {
    count: usize,
    merged_versions: Vec<String>,
}

impl Spans {
    fn one() -> Spans {
        Spans {
            count: 1,
            merged_versions: Vec::new(),
        }
    }

    fn of(roots: &[&Span]) -> Spans {
        let versions: std::collections::BTreeSet<&str> = roots
            .iter()
            .map(|s| version_label(s.service_version.as_deref()))
            .collect();
        Spans {
            count: roots.len(),
            merged_versions: if versions.len() > 1 {
                versions.into_iter().map(str::to_owned).collect()
            } else {
                Vec::new()
            },
        }
    }
}

/// The spans a selection names, with how to call them; errors as the selections' own.
fn selected_spans<'a>(
    input: &'a Input,
    selection: &FlameSelection,
) -> Result<(String, Vec<&'a Span>), ReportError> {
    match selection {
        FlameSelection::SpanId(id) => {
            let id = parse_span_id(id)?;
            match input.spans.iter().find(|s| s.span_id == id) {
                Some(span) => Ok((format!("span {id} ({})", span.report_name()), vec![span])),
                None => Err(ReportError::UnknownSpanId { id: id.to_string() }),
            }
        }
        FlameSelection::SpanName(name) => {
            let roots = roots_named(input, name, None)?;
            Ok((format!("spans named {name}"), roots))
        }
        FlameSelection::SpanNameInVersion { name, version } => {
            let roots = roots_named(input, name, Some(version))?;
            Ok((format!("spans named {name} [{version}]"), roots))
        }
    }
}

/// The local roots answering to `name` (in `version`, when given); errors naming what
/// exists when there are none.
fn roots_named<'a>(
    input: &'a Input,
    name: &str,
    version: Option<&str>,
) -> Result<Vec<&'a Span>, ReportError> {
    let named: Vec<&Span> = input
        .local_roots()
        .into_iter()
        .filter(|s| s.answers_to(name))
        .collect();
    if named.is_empty() {
        return Err(ReportError::UnknownSpanName {
            name: name.to_owned(),
            place: input.dirs.first().cloned().unwrap_or_default(),
            known: input.span_names(),
        });
    }
    let Some(version) = version else {
        return Ok(named);
    };
    let in_version: Vec<&Span> = named
        .iter()
        .copied()
        .filter(|s| version_label(s.service_version.as_deref()) == version)
        .collect();
    if in_version.is_empty() {
        let available: std::collections::BTreeSet<String> = named
            .iter()
            .map(|s| version_label(s.service_version.as_deref()).to_owned())
            .collect();
        return Err(ReportError::UnknownVersion {
            span_name: name.to_owned(),
            version: version.to_owned(),
            available: available.into_iter().collect(),
        });
    }
    Ok(in_version)
}

/// Appended to "no samples" explanations: where to look instead.
const CONCURRENT_HINT: &str =
    " (`flame --concurrent` draws what the service's threads did meanwhile, labelled as such)";

/// A span id given on the command line.
fn parse_span_id(id: &str) -> Result<SpanId, ReportError> {
    id.parse()
        .map_err(|_| ReportError::InvalidSpanId { id: id.to_owned() })
}

fn select_span_id<'a>(input: &'a Input, id: &str) -> Result<Selected<'a>, ReportError> {
    let id = parse_span_id(id)?;
    let samples: Vec<&Sample> = input
        .samples
        .iter()
        .filter(|s| s.span_id == Some(id))
        .collect();
    let span = input.spans.iter().find(|s| s.span_id == id);
    let name = span.map(|s| s.report_name().into_owned()).or_else(|| {
        samples
            .iter()
            .find_map(|s| s.span_name.as_deref().map(str::to_owned))
    });
    let title = match (&name, span) {
        (Some(name), Some(span)) => format!(
            "CPU of span {id}: {name} [{}]",
            version_label(span.service_version.as_deref())
        ),
        (Some(name), None) => format!("CPU of span {id}: {name}"),
        (None, _) => format!("CPU of span {id}"),
    };
    if !samples.is_empty() {
        return Ok((title, Spans::one(), samples));
    }
    let Some(span) = span else {
        return Err(ReportError::UnknownSpanId { id: id.to_string() });
    };
    let reason = match local_root_of(input, span) {
        Some(root) if root.span_id != span.span_id => format!(
            "it is not a local root span: CPU samples are labelled with its local root's id, \
             {} ({}); draw that one",
            root.span_id, root.name
        ),
        _ => {
            NoSamples::classify(&[span], input.sampling(), &input.evidence())
                .explain(input.sampling())
                + CONCURRENT_HINT
        }
    };
    Err(ReportError::NoSamples {
        selection: format!("span {id} ({})", span.name),
        reason,
    })
}

/// The local root above `span` (itself if it is one), following parents within the spans
/// read; `None` if the chain leaves them before reaching a local root.
fn local_root_of<'a>(input: &'a Input, span: &'a Span) -> Option<&'a Span> {
    let roots: HashSet<SpanId> = input.local_roots().iter().map(|s| s.span_id).collect();
    let mut current = span;
    for _ in 0..input.spans.len() + 1 {
        if roots.contains(&current.span_id) {
            return Some(current);
        }
        let parent = current.parent_span_id?;
        current = input
            .spans
            .iter()
            .find(|s| s.trace_id == current.trace_id && s.span_id == parent)?;
    }
    None
}

fn select_span_name<'a>(
    input: &'a Input,
    name: &str,
    version: Option<&str>,
) -> Result<Selected<'a>, ReportError> {
    let roots = roots_named(input, name, version)?;
    let ids: HashSet<SpanId> = roots.iter().map(|s| s.span_id).collect();
    let samples: Vec<&Sample> = input
        .samples
        .iter()
        .filter(|s| {
            // A sample labelled with the name only carries no version: kept only when
            // every version is drawn.
            (version.is_none() && s.span_name.as_deref() == Some(name))
                || s.span_id.is_some_and(|id| ids.contains(&id))
        })
        .collect();
    let title = match version {
        Some(version) => format!("CPU of spans named {name} [{version}]"),
        None => format!("CPU of spans named {name}"),
    };
    if !samples.is_empty() {
        return Ok((title, Spans::of(&roots), samples));
    }
    let sampling = input.sampling();
    let selection = match version {
        Some(version) => format!("spans named {name} [{version}]"),
        None => format!("spans named {name}"),
    };
    Err(ReportError::NoSamples {
        selection,
        reason: NoSamples::classify(&roots, sampling, &input.evidence()).explain(sampling)
            + CONCURRENT_HINT,
    })
}
