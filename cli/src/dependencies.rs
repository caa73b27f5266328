//! Which child spans cover the time a local root spent off CPU: the pattern's "revisit
//! dependency spans if the operation is mostly waiting".
//!
//! For each root, its descendants in the span files read (same trace, reached through
//! parent ids) are clipped to the root's interval. Per child name: how many there were
//! and how much of the root's wall time they cover (their union, so overlapping calls are
//! not counted twice); over all descendants: the union they cover together. A root that
//! waits while its children cover the waiting waits on those dependencies; a root whose
//! waiting no child covers calls something uninstrumented.

use std::collections::HashMap;

use crate::ids::{SpanId, TraceId};
use crate::input::Span;

/// One child span name under a group's roots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildCoverage {
    /// The child spans' name.
    pub name: String,
    /// How many there were, over all roots.
    pub count: usize,
    /// Wall time of the roots they cover (union per root, summed over roots), ns.
    pub covered_ns: u64,
}

/// The child spans of a group of roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dependencies {
    /// Roots looked at.
    pub roots: usize,
    /// Per child name, most covered first.
    pub children: Vec<ChildCoverage>,
    /// Wall time of the roots covered by any descendant (union per root, summed), ns.
    pub covered_ns: u64,
}

/// Spans by (trace id, parent span id), to find descendants.
#[derive(Debug, Default)]
pub struct ChildIndex<'a> {
    by_parent: HashMap<(TraceId, SpanId), Vec<&'a Span>>,
}

impl<'a> ChildIndex<'a> {
    /// Indexes every span that has a local parent.
    pub fn new(spans: &'a [Span]) -> ChildIndex<'a> {
        let mut by_parent: HashMap<(TraceId, SpanId), Vec<&Span>> = HashMap::new();
        for span in spans {
            if let (Some(parent), false) = (&span.parent_span_id, span.parent_is_remote) {
                by_parent
                    .entry((span.trace_id, *parent))
                    .or_default()
                    .push(span);
            }
        }
        ChildIndex { by_parent }
    }

    /// Every descendant of `root` (children, their children, ...).
    fn descendants(&self, root: &Span) -> Vec<&'a Span> {
        let mut out = Vec::new();
        let mut queue = vec![root.span_id];
        while let Some(id) = queue.pop() {
            // Corrupt input with a parent cycle would loop: stop at a bound no real trace
            // reaches.
            if out.len() > 100_000 {
                break;
            }
            for child in self
                .by_parent
                .get(&(root.trace_id, id))
                .into_iter()
                .flatten()
            {
                out.push(*child);
                queue.push(child.span_id);
            }
        }
        out
    }
}

impl Dependencies {
    /// The child spans of `roots`.
    pub fn of_roots(roots: &[&Span], index: &ChildIndex<'_>) -> Dependencies {
        let mut per_name: HashMap<&str, (usize, u64)> = HashMap::new();
        let mut covered_ns = 0;
        for root in roots {
            let (start, end) = (
                root.start_unix_nano,
                root.end_unix_nano.max(root.start_unix_nano),
            );
            let mut all = Vec::new();
            let mut by_name: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
            for child in index.descendants(root) {
                let clipped = (
                    child.start_unix_nano.clamp(start, end),
                    child.end_unix_nano.clamp(start, end),
                );
                all.push(clipped);
                by_name
                    .entry(child.name.as_str())
                    .or_default()
                    .push(clipped);
                per_name.entry(child.name.as_str()).or_default().0 += 1;
            }
            covered_ns += union_ns(&mut all);
            for (name, mut intervals) in by_name {
                per_name.entry(name).or_default().1 += union_ns(&mut intervals);
            }
        }
        let mut children: Vec<ChildCoverage> = per_name
            .into_iter()
            .map(|(name, (count, covered_ns))| ChildCoverage {
                name: name.to_owned(),
                count,
                covered_ns,
            })
            .collect();
        children.sort_by(|a, b| {
            b.covered_ns
                .cmp(&a.covered_ns)
                .then_with(|| a.name.cmp(&b.name))
        });
        Dependencies {
            roots: roots.len(),
            children,
            covered_ns,
        }
    }

    /// The children, as "3 × inventory.lookup" per root with their covered time per root,
    /// most covered first, at most `limit` of them.
    pub fn describe(&self, limit: usize) -> String {
        let per_root = self.roots.max(1) as f64;
        self.children
            .iter()
            .take(limit)
            .map(|c| {
                format!(
                    "{} × {} ({:.1} ms)",
                    trim_count(c.count as f64 / per_root),
                    c.name,
                    c.covered_ns as f64 / per_root / 1e6
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `3` for 3.0, `2.5` for 2.5: counts per root read naturally.
fn trim_count(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0}", v.round())
    } else {
        format!("{v:.1}")
    }
}

/// Total length of the union of `intervals` (sorted in place).
fn union_ns(intervals: &mut [(u64, u64)]) -> u64 {
    intervals.sort_unstable();
    let mut total = 0;
    let mut current: Option<(u64, u64)> = None;
    for &(s, e) in intervals.iter() {
        match current {
            Some((cs, ce)) if s <= ce => current = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                current = Some((s, e));
            }
            None => current = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = current {
        total += ce - cs;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::test_span_id;

    const MS: u64 = 1_000_000;

    fn span(id: &str, parent: Option<&str>, name: &str, start_ms: u64, end_ms: u64) -> Span {
        Span {
            trace_id: TraceId::from(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            span_id: test_span_id(id),
            parent_span_id: parent.map(test_span_id),
            name: name.into(),
            profile_id: None,
            ..Span::test_root(0, start_ms * MS, end_ms * MS)
        }
    }

    #[test]
    fn overlapping_and_nested_children_count_once_and_are_clipped_to_the_root() {
        let spans = vec![
            span("r", None, "GET /orders", 0, 100),
            // Two concurrent lookups (10–40 and 30–60): 50 ms together, not 60.
            span("a", Some("r"), "inventory.lookup", 10, 40),
            span("b", Some("r"), "inventory.lookup", 30, 60),
            // A grandchild inside a child adds nothing to the union.
            span("c", Some("a"), "tcp.connect", 12, 15),
            // Runs past the root's end (a detached task): clipped at 100.
            span("d", Some("r"), "audit.write", 90, 150),
        ];
        let index = ChildIndex::new(&spans);
        let root = &spans[0];
        let deps = Dependencies::of_roots(&[root], &index);
        assert_eq!(deps.covered_ns, 60 * MS);
        assert_eq!(
            deps.children,
            [
                ChildCoverage {
                    name: "inventory.lookup".into(),
                    count: 2,
                    covered_ns: 50 * MS
                },
                ChildCoverage {
                    name: "audit.write".into(),
                    count: 1,
                    covered_ns: 10 * MS
                },
                ChildCoverage {
                    name: "tcp.connect".into(),
                    count: 1,
                    covered_ns: 3 * MS
                },
            ]
        );
        assert_eq!(
            deps.describe(2),
            "2 × inventory.lookup (50.0 ms), 1 × audit.write (10.0 ms)"
        );
    }

    #[test]
    fn spans_of_other_traces_and_remote_children_are_not_descendants() {
        let mut other = span("x", Some("r"), "elsewhere", 0, 50);
        other.trace_id = TraceId::from(u128::MAX);
        let mut remote = span("y", Some("r"), "another.process", 0, 50);
        remote.parent_is_remote = true;
        let spans = vec![span("r", None, "GET /x", 0, 100), other, remote];
        let index = ChildIndex::new(&spans);
        let deps = Dependencies::of_roots(&[&spans[0]], &index);
        assert_eq!(
            deps,
            Dependencies {
                roots: 1,
                ..Dependencies::default()
            }
        );
    }
}
