//! An inline SVG flame graph for the HTML report.
//!
//! inferno's SVG is a whole document with its own script and fixed element ids, so several
//! of them on one page clash; this one is plain `<g>`/`<rect>`/`<text>` elements that the
//! page's one script zooms (click) and describes (hover).

use std::collections::BTreeMap;
use std::fmt::{self, Write};

use super::Esc;
use crate::format::{bytes, ms};
use crate::functions::{library_group, NO_STACK};
use crate::input::Sample;

/// Width of a graph, CSS pixels.
pub(crate) const WIDTH: f64 = 1200.0;
/// Height of one frame row, CSS pixels.
const ROW: f64 = 17.0;
/// Frames narrower than this many pixels are not drawn (their CPU stays in the parent).
const MIN_WIDTH: f64 = 0.5;
/// Approximate advance of one character of the 11 px monospace label font; the page's
/// script uses the same figure when it relabels after a zoom.
pub(crate) const CHAR_WIDTH: f64 = 6.7;

/// What a tree's widths measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Measure {
    /// CPU time, nanoseconds (CPU profiles).
    #[default]
    Cpu,
    /// Bytes allocated, estimated (allocation profiles: the samples' `cpu_ns` holds them).
    Bytes,
}

impl Measure {
    fn format(self, value: u64) -> String {
        match self {
            Measure::Cpu => ms(value),
            Measure::Bytes => bytes(value),
        }
    }
}

/// A call tree: CPU (or bytes allocated) and samples per path from the outermost frame.
#[derive(Debug, Default)]
pub(crate) struct FlameTree {
    root: Node,
    measure: Measure,
}

/// One path's total and its callees.
#[derive(Debug, Default)]
struct Node {
    cpu_ns: u64,
    samples: u64,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn depth(&self) -> usize {
        1 + self.children.values().map(Node::depth).max().unwrap_or(0)
    }
}

impl FlameTree {
    /// The tree of CPU `samples`.
    pub(crate) fn of_samples<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> FlameTree {
        FlameTree::of(samples, Measure::Cpu)
    }

    /// The tree of allocation `samples`, widths in bytes allocated.
    pub(crate) fn of_allocations<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> FlameTree {
        FlameTree::of(samples, Measure::Bytes)
    }

    fn of<'a>(samples: impl IntoIterator<Item = &'a Sample>, measure: Measure) -> FlameTree {
        let mut root = Node::default();
        for sample in samples {
            root.cpu_ns += sample.cpu_ns;
            root.samples += sample.count;
            let mut node = &mut root;
            let frames: Vec<&str> = if sample.frames.is_empty() {
                vec![NO_STACK]
            } else {
                sample.frames.iter().rev().map(|f| &**f).collect()
            };
            for frame in frames {
                node = node.children.entry(frame.to_owned()).or_default();
                node.cpu_ns += sample.cpu_ns;
                node.samples += sample.count;
            }
        }
        FlameTree { root, measure }
    }

    /// CPU of every sample, nanoseconds (bytes, for an allocation tree).
    pub(crate) fn cpu_ns(&self) -> u64 {
        self.root.cpu_ns
    }

    /// The samples the tree holds.
    pub(crate) fn samples(&self) -> u64 {
        self.root.samples
    }

    fn depth(&self) -> usize {
        self.root.depth()
    }

    /// Writes the graph as an `<svg>` element; `label` names it for screen readers.
    pub(crate) fn write_svg(&self, out: &mut impl Write, label: &str) -> fmt::Result {
        let height = self.depth() as f64 * ROW;
        writeln!(
            out,
            r#"<svg class="flame" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{}">"#,
            Esc(label)
        )?;
        let mut frame = Frame {
            out,
            total: self.root.cpu_ns.max(1),
            height,
            measure: self.measure,
        };
        frame.node("all", &self.root, 0.0, 0)?;
        writeln!(frame.out, "</svg>")
    }
}

struct Frame<'a, W> {
    out: &'a mut W,
    total: u64,
    height: f64,
    measure: Measure,
}

impl<W: Write> Frame<'_, W> {
    /// One frame at `x` (fraction of the width) and `depth` (0: the root, at the bottom),
    /// then its callees above it.
    fn node(&mut self, name: &str, node: &Node, x: f64, depth: usize) -> fmt::Result {
        let w = node.cpu_ns as f64 / self.total as f64;
        let (px, pw) = (x * WIDTH, w * WIDTH);
        let y = self.height - (depth + 1) as f64 * ROW;
        let class = if depth == 0 {
            "root"
        } else if library_group(name).is_some() {
            "lib"
        } else {
            "user"
        };
        writeln!(
            self.out,
            r#"<g class="f {class}" data-x="{x:.6}" data-w="{w:.6}" data-d="{depth}" data-n="{name}"><title>{name} — {cpu}, {share:.1}% ({samples} samples)</title><rect x="{px:.2}" y="{y:.1}" width="{pw:.2}" height="{rh:.1}" fill="{fill}"/><text x="{tx:.2}" y="{ty:.1}">{label}</text></g>"#,
            name = Esc(name),
            cpu = self.measure.format(node.cpu_ns),
            share = w * 100.0,
            samples = node.samples,
            rh = ROW - 1.0,
            fill = colour(name, class),
            tx = px + 3.0,
            ty = y + ROW - 5.0,
            label = Esc(&fit(name, pw)),
        )?;
        let mut child_x = x;
        for (child_name, child) in &node.children {
            if child.cpu_ns as f64 / self.total as f64 * WIDTH >= MIN_WIDTH {
                self.node(child_name, child, child_x, depth + 1)?;
            }
            child_x += child.cpu_ns as f64 / self.total as f64;
        }
        Ok(())
    }
}

/// `name` cut to what fits in `width` pixels (with an ellipsis), or nothing when fewer than
/// three characters would fit.
pub(crate) fn fit(name: &str, width: f64) -> String {
    let fits = ((width - 6.0) / CHAR_WIDTH).floor().max(0.0) as usize;
    let chars = name.chars().count();
    if fits < 3 {
        String::new()
    } else if chars <= fits {
        name.to_owned()
    } else {
        let mut cut: String = name.chars().take(fits - 1).collect();
        cut.push('…');
        cut
    }
}

/// Warm colours for the user's code, cool greys for runtime and libraries, each varied by
/// the name's hash so neighbours differ and one function keeps its colour across graphs.
fn colour(name: &str, class: &str) -> String {
    let hash = name.bytes().fold(2166136261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16777619)
    });
    let v = (hash % 1000) as f64 / 1000.0;
    match class {
        "root" => "hsl(0,0%,72%)".to_owned(),
        "lib" => format!(
            "hsl({:.0},{:.0}%,{:.0}%)",
            200.0 + 30.0 * v,
            12.0 + 14.0 * v,
            70.0 + 8.0 * v
        ),
        _ => format!(
            "hsl({:.0},{:.0}%,{:.0}%)",
            8.0 + 40.0 * v,
            75.0 + 15.0 * v,
            58.0 + 8.0 * v
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn sample(frames: &[&str], cpu_ns: u64) -> Sample {
        Sample {
            frames: frames.iter().map(|f| Arc::from(*f)).collect(),
            cpu_ns,
            count: 1,
            span_id: None,
            trace_id: None,
            span_name: None,
            window: None,
        }
    }

    #[test]
    fn frames_nest_from_the_outermost_and_widths_follow_cpu() {
        // Innermost first, as profiles store them.
        let samples = [
            sample(&["render_rows", "handle_report", "main"], 30),
            sample(&["encode_json", "handle_report", "main"], 10),
        ];
        let tree = FlameTree::of_samples(&samples);
        assert_eq!(tree.cpu_ns(), 40);
        assert_eq!(tree.depth(), 4);
        let mut svg = String::new();
        tree.write_svg(&mut svg, "GET /report").expect("svg");
        assert!(
            svg.contains(r#"data-w="0.750000" data-d="3" data-n="render_rows""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"data-x="0.000000" data-w="0.250000" data-d="3" data-n="encode_json""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"data-x="0.250000" data-w="0.750000" data-d="3" data-n="render_rows""#),
            "{svg}"
        );
    }

    #[test]
    fn labels_fit_their_frame() {
        assert_eq!(fit("render_rows", 1000.0), "render_rows");
        assert_eq!(fit("render_rows", 6.0 + 5.0 * CHAR_WIDTH), "rend…");
        assert_eq!(fit("render_rows", 10.0), "");
    }
}
