//! Where a group's wall time went: on CPU, busy but off CPU (blocked inside a poll), or
//! awaiting (not being polled at all).
//!
//! CPU comes from the profile samples (or `profiling.cpu.time_ns` when no profile read has
//! them). Telling blocked from awaiting needs the time the span was *active* (entered,
//! polled). Two span attributes say it, best first: `profiling.wall.active_ns` (written by
//! the bridge: the whole local root over all its threads) and `busy_ns` (written by
//! `tracing-opentelemetry`: the time the span itself was entered). Then, summed over the
//! spans, blocked ≈ active − CPU and awaiting ≈ wall − active. Spans of a group that lack
//! the active time (or the run delay) the others carry add their unsplit time as an
//! *unknown* part, never to blocked or awaiting. Without active time on any span of a
//! group, the split is CPU against "not on CPU", and says so.
//!
//! Every view prints a part's share as [`TimeSplit::share`] gives it, and the verdicts
//! are decided on those shares: a sentence and the column beside it cannot disagree.

use std::collections::HashMap;
use std::fmt;

use otel_profiling::{WALL_ACTIVE_ATTRIBUTE, WALL_QUEUED_ATTRIBUTE, WALL_RUNQUEUE_ATTRIBUTE};

use crate::ids::SpanId;
use crate::input::otlp::BUSY_NS_ATTRIBUTE;
use crate::input::{Sample, Span};

/// Where the active time of a split came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveSource {
    /// `profiling.wall.active_ns` on every span.
    WallActive,
    /// `busy_ns` (tracing-opentelemetry) on every span.
    BusyNs,
}

impl ActiveSource {
    /// The span attribute read.
    pub fn attribute(self) -> &'static str {
        match self {
            ActiveSource::WallActive => WALL_ACTIVE_ATTRIBUTE,
            ActiveSource::BusyNs => BUSY_NS_ATTRIBUTE,
        }
    }

    /// What the attribute measures, for the reader.
    pub fn describe(self) -> &'static str {
        match self {
            ActiveSource::WallActive => {
                "time threads ran inside the local root or a descendant, over all its threads"
            }
            ActiveSource::BusyNs => {
                "tracing-opentelemetry's time the root span was entered (polled); work on \
                 other threads under other spans is not in it"
            }
        }
    }
}

/// Where the CPU time of a split came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuSource {
    /// The profile samples labelled with the spans' ids.
    Profile,
    /// `profiling.cpu.time_ns` (no profile read has the spans' samples, yet the attribute
    /// records CPU).
    Attributes,
    /// No samples and no CPU recorded in the attributes.
    None,
}

/// One part of the wall time, for drawing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// Running on a CPU.
    Cpu,
    /// Active (being polled) but not on a CPU: blocked inside a poll, or runnable while
    /// the machine's CPUs ran other work (the two cannot be told apart from these figures).
    Blocked,
    /// Woken but not yet polled: queued for a worker (`profiling.wall.queued_ns`).
    Queued,
    /// Active and runnable, but the CPUs ran other work (`profiling.wall.runqueue_ns`):
    /// waiting for a CPU, not blocked.
    Runqueue,
    /// Not being polled: awaiting a wake-up (I/O, timers, other tasks), or queued where
    /// queued time was not measured.
    Awaiting,
    /// Not on CPU, with no active time to tell blocked from awaiting.
    OffCpu,
    /// Not on CPU, and not split because these spans lack a figure the group's other
    /// spans carry (see [`TimeSplit::unknown`]): shown as its own part rather than
    /// counted as blocked or awaiting.
    Unknown,
}

impl Part {
    /// A short label; the sentences name the parts with it.
    pub fn label(self) -> &'static str {
        match self {
            Part::Cpu => "CPU",
            Part::Blocked => "blocked in poll",
            Part::Queued => "queued",
            Part::Runqueue => "waiting for a CPU",
            Part::Awaiting => "awaiting",
            Part::OffCpu => "not on CPU",
            Part::Unknown => "unknown",
        }
    }

    /// The text report's column header for the part.
    pub fn column(self) -> &'static str {
        match self {
            Part::Cpu => "CPU",
            Part::Blocked => "BLOCKED",
            Part::Queued => "QUEUED",
            Part::Runqueue => "CPU WAIT",
            Part::Awaiting => "AWAITING",
            Part::OffCpu => "NOT ON CPU",
            Part::Unknown => "UNKNOWN",
        }
    }
}

/// Every part, in the order the split draws them.
pub const PART_ORDER: [Part; 7] = [
    Part::Cpu,
    Part::Runqueue,
    Part::Blocked,
    Part::Queued,
    Part::Awaiting,
    Part::OffCpu,
    Part::Unknown,
];

/// A share of the wall time in whole percent, rounded half up. Every view (the text
/// table, the sentences, the HTML bars, the diff) prints a part's share with this one
/// figure and the verdicts compare it, so no two places can round one part differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Percent(pub u64);

impl Percent {
    /// `part` of `whole` (`None` when `whole` is 0: no share to speak of).
    pub fn of(part: u64, whole: u64) -> Option<Percent> {
        (whole > 0).then(|| {
            let (part, whole) = (u128::from(part), u128::from(whole));
            Percent(((part * 100 + whole / 2) / whole) as u64)
        })
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format!("{}%", self.0))
    }
}

/// Why a split has an [`Part::Unknown`] part: which spans lack what the others carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unknown {
    /// Spans without the active time the others carry: their time off CPU.
    pub without_active: usize,
    /// Spans with active time but no `profiling.wall.runqueue_ns`, where others carry it:
    /// their active − CPU (blocked, or waiting for a CPU: not told apart).
    pub without_runqueue: usize,
}

/// The split of a group's summed wall time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeSplit {
    /// Spans.
    pub spans: usize,
    /// Summed wall time, nanoseconds.
    pub wall_ns: u64,
    /// Summed CPU time, nanoseconds (can exceed the wall time when threads ran in parallel).
    pub cpu_ns: u64,
    /// The samples (or `profiling.cpu.samples`) behind `cpu_ns`; each stands for one
    /// sampling period, so the CPU figure is good to about a period per sample's worth.
    pub cpu_samples: u64,
    /// Where `cpu_ns` came from.
    pub cpu_source: CpuSource,
    /// The CPU time counted inside the wall time (per span at most its wall time).
    pub cpu_in_wall_ns: u64,
    /// Blocked inside a poll: summed active − summed CPU, at most the off-CPU time (0
    /// without active time).
    pub blocked_ns: u64,
    /// Queued: woken but not yet polled, from `profiling.wall.queued_ns` of the spans
    /// that carry it (0 when none does: then queued time is part of awaiting).
    pub queued_ns: u64,
    /// Whether a span with active time carries `profiling.wall.queued_ns` (spans without
    /// it keep their queued time in awaiting, which holds it by definition).
    pub queued_measured: bool,
    /// Runnable inside the span but not running (`profiling.wall.runqueue_ns` of the
    /// spans that carry it; 0 when none does): taken out of the blocked time.
    pub runqueue_ns: u64,
    /// Whether a span with active time carries `profiling.wall.runqueue_ns`.
    pub runqueue_measured: bool,
    /// The container's CPU-quota throttling while the spans ran, summed
    /// (`profiling.cgroup.throttled_ns`), and the largest CPU limit seen (thousandths).
    pub throttled_ns: u64,
    /// The CPU limit the spans recorded, in thousandths of a CPU, when any did.
    pub cpu_limit_millicpus: Option<u64>,
    /// Awaiting: the rest of the off-CPU time (0 without active time).
    pub awaiting_ns: u64,
    /// Not on CPU: wall − CPU, when there is no active time (0 with it).
    pub off_cpu_ns: u64,
    /// Off CPU but not split, because some spans lack what the others carry (see
    /// [`TimeSplit::unknown`]); 0 when every span carries the same figures.
    pub unknown_ns: u64,
    /// Which spans the unknown time comes from.
    pub unknown: Unknown,
    /// The active time's source: the one every span carries, else the best one some do.
    pub active: Option<ActiveSource>,
    /// Summed active time of the spans that carry it, nanoseconds (0 without).
    pub active_ns: u64,
    /// Without the active time on every span: its source and how many spans carry it.
    pub partial: Option<(ActiveSource, usize)>,
}

/// Sums over one subset of a group's spans.
#[derive(Clone, Copy, Default)]
struct Sums {
    wall: u64,
    cpu: u64,
    cpu_in_wall: u64,
    active: u64,
    runqueue: u64,
    spans: usize,
}

impl Sums {
    fn add(&mut self, wall: u64, cpu: u64, active: u64, runqueue: u64) {
        self.wall += wall;
        self.cpu += cpu;
        self.cpu_in_wall += cpu.min(wall);
        self.active += active;
        self.runqueue += runqueue;
        self.spans += 1;
    }

    /// The time off CPU.
    fn off_cpu(&self) -> u64 {
        self.wall - self.cpu_in_wall
    }

    /// Active − CPU − run delay, within the time off CPU left after the run delay.
    fn held(&self, runqueue: u64) -> u64 {
        self.active
            .saturating_sub(self.cpu)
            .saturating_sub(runqueue)
            .min(self.off_cpu() - runqueue)
    }
}

impl TimeSplit {
    /// The split of `spans`, with CPU from their samples in `by_id` (by span id).
    pub fn of_spans(spans: &[&Span], by_id: &HashMap<SpanId, Vec<&Sample>>) -> TimeSplit {
        let profile_cpu = |span: &Span| -> (u64, u64) {
            by_id.get(&span.span_id).map_or((0, 0), |samples| {
                samples
                    .iter()
                    .fold((0, 0), |(ns, n), s| (ns + s.cpu_ns, n + s.count))
            })
        };
        let cpu_source = if spans.iter().any(|s| by_id.contains_key(&s.span_id)) {
            CpuSource::Profile
        } else if spans.iter().any(|s| s.cpu_time_ns.unwrap_or(0) > 0) {
            // Only a non-zero attribute says a profile exists that was not read.
            CpuSource::Attributes
        } else {
            CpuSource::None
        };
        let with =
            |field: fn(&Span) -> Option<u64>| spans.iter().filter(|s| field(s).is_some()).count();
        let with_active = with(|s| s.wall_active_ns);
        let with_busy = with(|s| s.busy_ns);
        // The figure every span carries; else the best one some carry, and the spans
        // without it go to the unknown part (one unfollowed root no longer takes the
        // whole group's split away).
        let all = |n: usize| !spans.is_empty() && n == spans.len();
        let active = if all(with_active) {
            Some(ActiveSource::WallActive)
        } else if all(with_busy) {
            Some(ActiveSource::BusyNs)
        } else if with_active > 0 {
            Some(ActiveSource::WallActive)
        } else if with_busy > 0 {
            Some(ActiveSource::BusyNs)
        } else {
            None
        };
        let active_of = |span: &Span| match active {
            Some(ActiveSource::WallActive) => span.wall_active_ns,
            Some(ActiveSource::BusyNs) => span.busy_ns,
            None => None,
        };
        let covered = spans.iter().filter(|s| active_of(s).is_some()).count();
        let partial = active
            .filter(|_| covered < spans.len())
            .map(|source| (source, covered));
        let runqueue_measured = spans
            .iter()
            .any(|s| active_of(s).is_some() && s.wall_runqueue_ns.is_some());
        let queued_measured = spans
            .iter()
            .any(|s| active_of(s).is_some() && s.wall_queued_ns.is_some());
        // Spans with active time and run delay, with active time only, without either.
        let (mut measured, mut unmeasured, mut uncovered) =
            (Sums::default(), Sums::default(), Sums::default());
        let (mut cpu_ns, mut cpu_samples, mut queued) = (0, 0, 0);
        for span in spans {
            let wall = span.wall_ns();
            let (cpu, samples) = match cpu_source {
                CpuSource::Profile => profile_cpu(span),
                CpuSource::Attributes => {
                    (span.cpu_time_ns.unwrap_or(0), span.cpu_samples.unwrap_or(0))
                }
                CpuSource::None => (0, 0),
            };
            cpu_ns += cpu;
            cpu_samples += samples;
            match (active_of(span), span.wall_runqueue_ns) {
                (Some(active), Some(runqueue)) => {
                    measured.add(wall, cpu, active, runqueue);
                    queued += span.wall_queued_ns.unwrap_or(0);
                }
                (Some(active), None) => {
                    unmeasured.add(wall, cpu, active, 0);
                    queued += span.wall_queued_ns.unwrap_or(0);
                }
                (None, _) => uncovered.add(wall, cpu, 0, 0),
            }
        }
        let total = |f: fn(&Sums) -> u64| f(&measured) + f(&unmeasured) + f(&uncovered);
        let mut split = TimeSplit {
            spans: spans.len(),
            wall_ns: total(|s| s.wall),
            cpu_ns,
            cpu_samples,
            cpu_source,
            cpu_in_wall_ns: total(|s| s.cpu_in_wall),
            blocked_ns: 0,
            queued_ns: 0,
            queued_measured,
            runqueue_ns: 0,
            runqueue_measured,
            throttled_ns: spans.iter().filter_map(|s| s.cgroup_throttled_ns).sum(),
            cpu_limit_millicpus: spans
                .iter()
                .filter_map(|s| s.cgroup_cpu_limit_millicpus)
                .max(),
            awaiting_ns: 0,
            off_cpu_ns: 0,
            unknown_ns: 0,
            unknown: Unknown::default(),
            active,
            active_ns: measured.active + unmeasured.active,
            partial,
        };
        if split.active.is_none() {
            split.off_cpu_ns = split.wall_ns - split.cpu_in_wall_ns;
            return split;
        }
        // Subtracted over each set of spans, not per span: a span's CPU is a handful of
        // samples of one period each, so per span "active − CPU" rounds up whenever the
        // samples fall short and is clipped at 0 when they overshoot — biased towards
        // "blocked". Summed first, the sampling errors cancel. The parts still add up
        // to the wall time.
        // Runnable but not run is part of the active time that is not CPU: it is not
        // blocked (the thread was not waiting on anything).
        split.runqueue_ns = measured.runqueue.min(measured.off_cpu());
        let blocked = measured.held(split.runqueue_ns);
        let held = unmeasured.held(0);
        if runqueue_measured && held > 0 {
            // Blocked or waiting for a CPU, where others tell the two apart: unknown.
            split.unknown_ns += held;
            split.unknown.without_runqueue = unmeasured.spans;
            split.blocked_ns = blocked;
        } else {
            // No span measured run delay: preemption stays in blocked (docs/elapsed-time.md).
            split.blocked_ns = blocked + held;
        }
        if uncovered.spans > 0 {
            split.unknown_ns += uncovered.off_cpu();
            split.unknown.without_active = uncovered.spans;
        }
        let awaiting =
            measured.off_cpu() - split.runqueue_ns - blocked + unmeasured.off_cpu() - held;
        split.queued_ns = queued.min(awaiting);
        split.awaiting_ns = awaiting - split.queued_ns;
        split
    }

    /// The parts in drawing order, each with its nanoseconds; they add up to `wall_ns`.
    pub fn parts(&self) -> Vec<(Part, u64)> {
        if self.active.is_some() {
            let mut parts = vec![(Part::Cpu, self.cpu_in_wall_ns)];
            if self.runqueue_measured {
                parts.push((Part::Runqueue, self.runqueue_ns));
            }
            parts.push((Part::Blocked, self.blocked_ns));
            if self.queued_measured {
                parts.push((Part::Queued, self.queued_ns));
            }
            parts.push((Part::Awaiting, self.awaiting_ns));
            if self.unknown != Unknown::default() {
                parts.push((Part::Unknown, self.unknown_ns));
            }
            parts
        } else {
            vec![
                (Part::Cpu, self.cpu_in_wall_ns),
                (Part::OffCpu, self.off_cpu_ns),
            ]
        }
    }

    /// The nanoseconds of `part`, when the split has that part.
    pub fn ns(&self, part: Part) -> Option<u64> {
        self.parts()
            .into_iter()
            .find_map(|(p, ns)| (p == part).then_some(ns))
    }

    /// The share of the wall time of `part`, when the split has that part and a wall
    /// time: the figure every view prints for it.
    pub fn share(&self, part: Part) -> Option<Percent> {
        self.ns(part).and_then(|ns| Percent::of(ns, self.wall_ns))
    }

    /// Where the split's figures came from, in a sentence.
    pub fn source(&self) -> String {
        let cpu = match self.cpu_source {
            CpuSource::Profile => "CPU from the profile samples",
            CpuSource::Attributes => {
                "CPU from profiling.cpu.time_ns (no profile read has these spans' samples)"
            }
            CpuSource::None => "no CPU samples and no CPU in profiling.cpu.time_ns",
        };
        let mut active = match (self.active, self.partial) {
            (Some(source), _) => format!(
                "blocked = {attr} − CPU, awaiting = wall − {attr} ({})",
                source.describe(),
                attr = source.attribute()
            ),
            (None, _) => format!(
                "no {BUSY_NS_ATTRIBUTE} or {WALL_ACTIVE_ATTRIBUTE} on the spans, so CPU against \
                 not on CPU (blocked and awaiting cannot be told apart)"
            ),
        };
        if let (Some((source, n)), true) = (self.partial, self.unknown.without_active > 0) {
            active.push_str(&format!(
                "; unknown: the time off CPU of the {} of {} spans without {} (blocked and \
                 awaiting cannot be told apart there)",
                self.spans - n,
                self.spans,
                source.attribute()
            ));
        }
        if self.unknown.without_runqueue > 0 {
            active.push_str(&format!(
                "; unknown: active − CPU of the {} span(s) without {WALL_RUNQUEUE_ATTRIBUTE} \
                 (blocked and waiting for a CPU cannot be told apart there)",
                self.unknown.without_runqueue
            ));
        }
        if self.active.is_some() && self.queued_measured {
            format!(
                "{cpu}; {active}; queued = {WALL_QUEUED_ATTRIBUTE} (woken, not yet polled: \
                 waiting for a worker), taken out of awaiting"
            )
        } else {
            format!("{cpu}; {active}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{test_span_id, TraceId};
    use std::sync::Arc;

    const MS: u64 = 1_000_000;

    fn span(id: &str, wall_ms: u64, busy_ms: Option<u64>) -> Span {
        Span {
            trace_id: TraceId::from(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10),
            span_id: test_span_id(id),
            profile_id: Some(id.into()),
            busy_ns: busy_ms.map(|b| b * MS),
            ..Span::test_root(0, 0, wall_ms * MS)
        }
    }

    fn sample(id: &str, cpu_ms: u64) -> Sample {
        Sample {
            frames: vec![Arc::from("f")],
            cpu_ns: cpu_ms * MS,
            count: cpu_ms / 10,
            span_id: Some(test_span_id(id)),
            trace_id: None,
            span_name: None,
            window: None,
        }
    }

    #[test]
    fn busy_time_splits_off_cpu_time_into_blocked_and_awaiting() {
        // 100 ms wall: 20 ms CPU, 70 ms busy; a second span whose sampled CPU (40 ms)
        // exceeds its busy time (30 ms) by a sample's rounding. Summed over the group:
        // 100 ms busy − 60 ms CPU = 40 ms blocked (the overshoot cancels, where per span
        // it would be clipped and leave 50 ms); awaiting 150 − 60 − 40 = 50 ms.
        let (a, b) = (span("a", 100, Some(70)), span("b", 50, Some(30)));
        let samples = [sample("a", 20), sample("b", 40)];
        let mut by_id: HashMap<SpanId, Vec<&Sample>> = HashMap::new();
        by_id.insert(test_span_id("a"), vec![&samples[0]]);
        by_id.insert(test_span_id("b"), vec![&samples[1]]);
        let split = TimeSplit::of_spans(&[&a, &b], &by_id);
        assert_eq!(split.active, Some(ActiveSource::BusyNs));
        assert_eq!(split.cpu_source, CpuSource::Profile);
        assert_eq!((split.cpu_ns, split.cpu_samples), (60 * MS, 6));
        assert_eq!(split.blocked_ns, 40 * MS);
        assert_eq!(split.awaiting_ns, 50 * MS);
        let total: u64 = split.parts().iter().map(|(_, ns)| ns).sum();
        assert_eq!(total, split.wall_ns);
        assert!(
            split.source().contains("busy_ns − CPU"),
            "{}",
            split.source()
        );
    }

    /// A root burning CPU beside other work on every core: 484 ms wall, 290 ms of CPU,
    /// active the whole time, runnable but not run for 180 ms. The run delay comes out of
    /// "blocked" (which read 189.7 ms before it was measured).
    #[test]
    fn run_delay_is_taken_out_of_blocked_when_every_span_measured_it() {
        let mut a = span("a", 484, None);
        a.wall_active_ns = Some(484 * MS);
        a.wall_runqueue_ns = Some(180 * MS);
        let mut by_id = HashMap::new();
        by_id.insert(a.span_id, vec![sample("a", 290)]);
        let by_id: HashMap<SpanId, Vec<&Sample>> = by_id
            .iter()
            .map(|(k, v)| (*k, v.iter().collect()))
            .collect();
        let split = TimeSplit::of_spans(&[&a], &by_id);
        assert!(split.runqueue_measured);
        assert_eq!(
            split.parts(),
            [
                (Part::Cpu, 290 * MS),
                (Part::Runqueue, 180 * MS),
                (Part::Blocked, 14 * MS),
                (Part::Awaiting, 0)
            ]
        );
        // One span without it: its active − CPU is blocked or waiting for a CPU, not
        // told apart, so unknown; the other's run delay still counts.
        let mut b = a.clone();
        b.span_id = test_span_id("b");
        b.wall_runqueue_ns = None;
        let split = TimeSplit::of_spans(&[&a, &b], &HashMap::new());
        assert!(split.runqueue_measured);
        assert_eq!(split.unknown.without_runqueue, 1);
        assert_eq!(
            split.parts(),
            [
                (Part::Cpu, 0),
                (Part::Runqueue, 180 * MS),
                (Part::Blocked, 304 * MS),
                (Part::Awaiting, 0),
                (Part::Unknown, 484 * MS)
            ]
        );
        assert!(
            split
                .source()
                .contains("active − CPU of the 1 span(s) without"),
            "{}",
            split.source()
        );
        // No span measured it: the delay stays inside blocked (a documented limit).
        let mut a = a.clone();
        a.wall_runqueue_ns = None;
        let split = TimeSplit::of_spans(&[&a, &b], &HashMap::new());
        assert!(!split.runqueue_measured);
        assert_eq!(split.unknown, Unknown::default());
        assert_eq!(split.blocked_ns, 2 * 484 * MS);
    }

    #[test]
    fn queued_time_is_taken_out_of_awaiting_when_every_span_measured_it() {
        // 100 ms wall, no CPU, 10 ms active, 60 ms queued: 10 blocked, 60 queued, 30 awaiting.
        let mut a = span("a", 100, None);
        a.wall_active_ns = Some(10 * MS);
        a.wall_queued_ns = Some(60 * MS);
        let split = TimeSplit::of_spans(&[&a], &HashMap::new());
        assert!(split.queued_measured);
        assert_eq!(
            split.parts(),
            [
                (Part::Cpu, 0),
                (Part::Blocked, 10 * MS),
                (Part::Queued, 60 * MS),
                (Part::Awaiting, 30 * MS)
            ]
        );
        // One span without it: its queued time stays inside awaiting (which holds it by
        // definition); the other's still counts.
        let mut b = a.clone();
        b.span_id = test_span_id("b");
        b.wall_queued_ns = None;
        let split = TimeSplit::of_spans(&[&a, &b], &HashMap::new());
        assert!(split.queued_measured);
        assert_eq!(split.queued_ns, 60 * MS);
        assert_eq!(split.awaiting_ns, 2 * 90 * MS - 60 * MS);
    }

    #[test]
    fn spans_without_the_active_time_the_others_carry_are_an_unknown_part() {
        // a: 100 ms, 70 ms busy; b: 50 ms, nothing. a splits, b's 50 ms are unknown
        // (before, b took the whole group's split away).
        let (a, b) = (span("a", 100, Some(70)), span("b", 50, None));
        let split = TimeSplit::of_spans(&[&a, &b], &HashMap::new());
        assert_eq!(split.active, Some(ActiveSource::BusyNs));
        assert_eq!(split.partial, Some((ActiveSource::BusyNs, 1)));
        assert_eq!(split.cpu_source, CpuSource::None);
        assert_eq!(
            split.parts(),
            [
                (Part::Cpu, 0),
                (Part::Blocked, 70 * MS),
                (Part::Awaiting, 30 * MS),
                (Part::Unknown, 50 * MS)
            ]
        );
        assert_eq!(split.share(Part::Unknown), Some(Percent(33)));
        assert!(
            split
                .source()
                .contains("unknown: the time off CPU of the 1 of 2 spans without busy_ns"),
            "{}",
            split.source()
        );
        // No span with active time: CPU against not on CPU.
        let split = TimeSplit::of_spans(&[&b], &HashMap::new());
        assert_eq!(split.active, None);
        assert_eq!(split.parts(), [(Part::Cpu, 0), (Part::OffCpu, 50 * MS)]);
    }

    #[test]
    fn shares_round_half_up_and_need_a_wall_time() {
        assert_eq!(Percent::of(1, 200), Some(Percent(1)));
        assert_eq!(Percent::of(1, 201), Some(Percent(0)));
        assert_eq!(Percent::of(2, 3), Some(Percent(67)));
        assert_eq!(Percent::of(u64::MAX, u64::MAX), Some(Percent(100)));
        assert_eq!(Percent::of(0, 0), None);
        assert_eq!(Percent(42).to_string(), "42%");
    }

    #[test]
    fn wall_active_time_is_preferred_over_busy_time() {
        let mut a = span("a", 100, Some(10));
        a.wall_active_ns = Some(60 * MS);
        a.cpu_time_ns = Some(20 * MS);
        a.cpu_samples = Some(2);
        let split = TimeSplit::of_spans(&[&a], &HashMap::new());
        assert_eq!(split.active, Some(ActiveSource::WallActive));
        assert_eq!(split.cpu_source, CpuSource::Attributes);
        assert_eq!(
            split.parts(),
            [
                (Part::Cpu, 20 * MS),
                (Part::Blocked, 40 * MS),
                (Part::Awaiting, 40 * MS)
            ]
        );
    }
}

/// Random groups of spans for the property tests of every view that prints a split, and
/// the reader of the shares a sentence names.
#[cfg(test)]
pub(crate) mod arbitrary {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::{Part, PART_ORDER};
    use crate::ids::SpanId;
    use crate::input::{Sample, Span};

    const US: u64 = 1_000;

    /// One span's figures: wall (µs), CPU as a share of it (over 1: threads in parallel),
    /// whether the CPU is in samples, the attributes or both, the active time (bridge's or
    /// busy_ns) as a share of the wall, run delay as a share of the active time, queued as
    /// a share of the rest, a profile id or not.
    type Figures = (
        u64,
        f64,
        (bool, bool),
        Option<(f64, bool)>,
        Option<f64>,
        Option<f64>,
        bool,
    );

    fn figures() -> impl Strategy<Value = Figures> {
        (
            1u64..2_000_000,
            0.0..1.3f64,
            (any::<bool>(), any::<bool>()),
            proptest::option::weighted(0.8, (0.0..=1.0f64, proptest::bool::weighted(0.2))),
            proptest::option::weighted(0.6, 0.0..=1.0f64),
            proptest::option::weighted(0.5, 0.0..=1.0f64),
            proptest::bool::weighted(0.9),
        )
    }

    /// 1 to 6 spans of `version`, ids from `first_id`, and the CPU samples of those whose
    /// CPU is in the profile. Spans are spread one second apart from `first_id` seconds.
    pub(crate) fn group(
        version: &'static str,
        first_id: u64,
    ) -> impl Strategy<Value = (Vec<Span>, Vec<Sample>)> {
        proptest::collection::vec(figures(), 1..=6).prop_map(move |all| {
            let mut spans = Vec::new();
            let mut samples = Vec::new();
            for (i, (wall, cpu, (in_profile, in_attrs), active, runqueue, queued, id)) in
                all.into_iter().enumerate()
            {
                let n = first_id + i as u64;
                let start = n * 1_000_000 * US;
                let wall_ns = wall * US;
                let cpu_ns = (cpu * wall_ns as f64) as u64;
                let active_ns = active.map(|(a, busy)| ((a * wall_ns as f64) as u64, busy));
                let mut span = Span {
                    name: "job".into(),
                    service_version: Some(version.into()),
                    profile_id: id.then(|| format!("{n:016x}")),
                    ..Span::test_root(n, start, start + wall_ns)
                };
                if in_attrs {
                    span.cpu_time_ns = Some(cpu_ns);
                    span.cpu_samples = Some(cpu_ns / 10_000_000);
                }
                match active_ns {
                    Some((a, true)) => span.busy_ns = Some(a),
                    Some((a, false)) => {
                        span.wall_active_ns = Some(a);
                        span.wall_runqueue_ns = runqueue.map(|r| (r * a as f64) as u64);
                        span.wall_queued_ns =
                            queued.map(|q| (q * (wall_ns - a.min(wall_ns)) as f64) as u64);
                    }
                    None => {}
                }
                if in_profile && cpu_ns > 0 {
                    samples.push(Sample {
                        frames: vec![Arc::from("work")],
                        cpu_ns,
                        count: (cpu_ns / 10_000_000).max(1),
                        span_id: Some(SpanId::from(n)),
                        trace_id: None,
                        span_name: None,
                        window: None,
                    });
                }
                spans.push(span);
            }
            (spans, samples)
        })
    }

    /// Every `<part label> <n>%` in `text`, in order; an error for a `%` figure that no
    /// part's label names (a share nothing ties to a column).
    pub(crate) fn shares_named(text: &str) -> Result<Vec<(Part, u64)>, String> {
        // Longest first: "CPU" ends "waiting for a CPU" and "not on CPU".
        let mut labels: Vec<Part> = PART_ORDER.to_vec();
        labels.sort_by_key(|p| std::cmp::Reverse(p.label().len()));
        let mut found = Vec::new();
        for (at, _) in text.match_indices('%') {
            let before = &text[..at];
            let digits = before.len() - before.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            let number: u64 = before[at - digits..]
                .parse()
                .map_err(|_| format!("a % without a number at {at} in {text:?}"))?;
            let head = before[..at - digits]
                .strip_suffix(' ')
                .ok_or_else(|| format!("{number}% without a label in {text:?}"))?;
            let part = labels
                .iter()
                .find(|p| head.ends_with(p.label()))
                .ok_or_else(|| format!("{number}% names no part in {text:?}"))?;
            found.push((*part, number));
        }
        Ok(found)
    }

    #[test]
    fn shares_named_reads_labels_and_refuses_stray_figures() {
        assert_eq!(
            shares_named("CPU 42% of the wall time (waiting for a CPU 3%, not on CPU 1%)"),
            Ok(vec![
                (Part::Cpu, 42),
                (Part::Runqueue, 3),
                (Part::OffCpu, 1)
            ])
        );
        assert!(shares_named("it blocks in f (95% of the blocked time)").is_err());
        assert!(shares_named("awaiting 43 %").is_err());
    }
}
