//! Concurrent workload activity: what the service's threads did while spans ran, for spans
//! that have no CPU samples of their own or are not computing.
//!
//! The pattern's fallback when a span has no linked samples, and its "scoped view of
//! concurrent workload activity": a span that waits may be queued behind CPU work of other
//! requests rather than waiting on anything. This is **never the span's own profile**: it is
//! every sample (other than the span's own) of the profiles whose time window overlaps the
//! span, selected by time within the directories read (one service instance and version per
//! profile file, as the local sink writes them). A sample's time is only known to its
//! profile's window (the upload interval), so the view covers whole windows around the
//! span, and says how long they are.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::functions::{FunctionCpu, FunctionTotals};
use crate::ids::SpanId;
use crate::input::{Sample, Span};

/// The caveat every rendering of [`Concurrent`] carries.
pub const CAVEAT: &str = "concurrent workload activity, not this span";

/// Label for samples taken outside any span.
pub const NO_SPAN: &str = "(no span)";

/// What the service's threads did during some spans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Concurrent {
    /// Distinct profile windows overlapping the spans.
    pub windows: usize,
    /// Their summed length, ns.
    pub window_ns: u64,
    /// CPU of the samples in them, the spans' own excluded, ns.
    pub cpu_ns: u64,
    /// That CPU per root span name (the `span_name` label, else [`NO_SPAN`]), most first.
    pub by_span: Vec<(String, u64)>,
    /// The functions of the user's code with the most of it, most first.
    pub top_functions: Vec<FunctionCpu>,
}

impl Concurrent {
    /// The activity during `spans`, from `samples`; `None` when no profile window with a
    /// time overlaps them.
    pub fn during(
        spans: &[&Span],
        samples: &[Sample],
        owners: &std::sync::Arc<crate::ownership::Ownership>,
    ) -> Option<Concurrent> {
        let (windows, selected) = select(spans, samples);
        if windows.is_empty() {
            return None;
        }
        let mut cpu_ns = 0;
        let mut by_span: HashMap<&str, u64> = HashMap::new();
        let mut functions = FunctionTotals::with_owners(owners.clone());
        for sample in selected {
            cpu_ns += sample.cpu_ns;
            *by_span
                .entry(sample.span_name.as_deref().unwrap_or(NO_SPAN))
                .or_default() += sample.cpu_ns;
            functions.add(sample);
        }
        let mut by_span: Vec<(String, u64)> = by_span
            .into_iter()
            .map(|(name, ns)| (name.to_owned(), ns))
            .collect();
        by_span.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Some(Concurrent {
            windows: windows.len(),
            window_ns: windows.iter().map(|(s, e)| e - s).sum(),
            cpu_ns,
            by_span,
            top_functions: functions.top_user_self(3),
        })
    }

    /// CPU-seconds per second of window: how many threads' worth of CPU ran meanwhile.
    pub fn busy_threads(&self) -> f64 {
        if self.window_ns == 0 {
            0.0
        } else {
            self.cpu_ns as f64 / self.window_ns as f64
        }
    }

    /// One line: the caveat, how busy the threads were, with which spans and functions.
    pub fn describe(&self) -> String {
        let share = |ns: u64| 100.0 * ns as f64 / self.cpu_ns.max(1) as f64;
        let spans: Vec<String> = self
            .by_span
            .iter()
            .take(3)
            .map(|(name, ns)| format!("{name} {:.0}%", share(*ns)))
            .collect();
        let functions: Vec<String> = self
            .top_functions
            .iter()
            .map(|f| format!("{} {:.0}%", f.function, share(f.cpu_ns)))
            .collect();
        let mut line = format!(
            "{CAVEAT}: {:.2} CPU-s per s on the service's threads over the {} profile window(s) \
             around it ({:.1} s; a sample's time is known only to its window)",
            self.busy_threads(),
            self.windows,
            self.window_ns as f64 / 1e9
        );
        if !spans.is_empty() {
            line.push_str(&format!("; by span: {}", spans.join(", ")));
        }
        if !functions.is_empty() {
            line.push_str(&format!("; top functions: {}", functions.join(", ")));
        }
        line
    }
}

/// The profile windows overlapping `spans`, and the samples in them that are not the
/// spans' own.
pub fn select<'a>(
    spans: &[&Span],
    samples: &'a [Sample],
) -> (BTreeSet<(u64, u64)>, Vec<&'a Sample>) {
    let own: HashSet<SpanId> = spans.iter().map(|s| s.span_id).collect();
    let overlaps = |(start, end): (u64, u64)| {
        spans.iter().any(|s| {
            // A zero-length span still lies in the window holding its instant.
            let span_end = s.end_unix_nano.max(s.start_unix_nano.saturating_add(1));
            s.start_unix_nano < end && start < span_end
        })
    };
    let mut windows = BTreeSet::new();
    let mut selected = Vec::new();
    for sample in samples {
        let Some(window) = sample.window.filter(|&w| overlaps(w)) else {
            continue;
        };
        windows.insert(window);
        if !sample.span_id.is_some_and(|id| own.contains(&id)) {
            selected.push(sample);
        }
    }
    (windows, selected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TraceId;
    use std::sync::Arc;

    const S: u64 = 1_000_000_000;

    fn span(id: &str, start_s: u64, end_s: u64) -> Span {
        Span {
            trace_id: TraceId::from(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            span_id: id.parse().unwrap(),
            name: "GET /slow".into(),
            profile_id: Some(id.into()),
            ..Span::test_root(0, start_s * S, end_s * S)
        }
    }

    fn sample(
        span: Option<(&str, &str)>,
        function: &str,
        cpu_s: u64,
        window: (u64, u64),
    ) -> Sample {
        Sample {
            frames: vec![Arc::from(function)],
            cpu_ns: cpu_s * S,
            count: cpu_s * 100,
            span_id: span.map(|(id, _)| id.parse().unwrap()),
            trace_id: None,
            span_name: span.map(|(_, name)| Arc::from(name)),
            window: Some((window.0 * S, window.1 * S)),
        }
    }

    #[test]
    fn counts_other_work_in_the_overlapping_windows_only() {
        let slow = span("000000000000000a", 12, 14);
        let samples = vec![
            // Window 10–20 overlaps the span: the other request's and unlabelled CPU count.
            sample(
                Some(("000000000000000b", "GET /report")),
                "render",
                15,
                (10, 20),
            ),
            sample(None, "gc_sweep", 3, (10, 20)),
            // The span's own samples are not concurrent activity.
            sample(
                Some(("000000000000000a", "GET /slow")),
                "own_work",
                1,
                (10, 20),
            ),
            // Window 20–30 does not overlap.
            sample(
                Some(("000000000000000c", "GET /report")),
                "render",
                9,
                (20, 30),
            ),
        ];
        let c =
            Concurrent::during(&[&slow], &samples, &Default::default()).expect("a window overlaps");
        assert_eq!((c.windows, c.window_ns, c.cpu_ns), (1, 10 * S, 18 * S));
        assert_eq!(
            c.by_span,
            [
                ("GET /report".to_owned(), 15 * S),
                (NO_SPAN.to_owned(), 3 * S)
            ]
        );
        assert!((c.busy_threads() - 1.8).abs() < 1e-9);
        let line = c.describe();
        assert!(line.starts_with(CAVEAT), "{line}");
        assert!(
            line.contains("1.80 CPU-s per s") && line.contains("GET /report 83%"),
            "{line}"
        );
        assert!(line.contains("render 83%"), "{line}");
    }

    #[test]
    fn no_overlapping_window_is_no_view() {
        let slow = span("000000000000000a", 40, 41);
        let samples = vec![sample(None, "f", 1, (10, 20))];
        assert_eq!(
            Concurrent::during(&[&slow], &samples, &Default::default()),
            None
        );
    }
}
