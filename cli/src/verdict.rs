//! What CPU time against wall time says about a span: computing, blocked inside a poll,
//! waiting, or in between — and why a span has no CPU samples at all.
//!
//! The verdict and the sentence that gives its reason are both read from the group's
//! [`TimeSplit`]: the verdict compares the parts' shares ([`TimeSplit::share`], whole
//! percent) with the thresholds below, and the sentence prints those same shares, each
//! after its part's label. So a sentence never says a figure its table row, bar or diff
//! column does not show.
//!
//! An empty profile is never read as "fast": a slow span without samples did not run on a
//! CPU long enough to be sampled, so it was waiting; a short one may simply have been
//! missed by the sampling period. And a root the bridge kept no evidence for (no
//! `profiling.*` attribute, no sample) is "no evidence", never "waiting": why it has none
//! is told apart ([`NoEvidence`]).

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::input::{Sampling, Span};
use crate::split::{Part, Percent, TimeSplit, Unknown, PART_ORDER};
use crate::stats::percentile;

/// CPU share (percent of the wall time) from which a span is [`Verdict::CpuBound`].
pub const CPU_BOUND_PERCENT: u64 = 50;
/// CPU share below which a span is [`Verdict::Waiting`].
pub const WAITING_PERCENT: u64 = 10;
/// Blocked share from which a span that is not CPU-bound is [`Verdict::BlockedInPoll`].
pub const BLOCKED_PERCENT: u64 = 50;
/// Queued share from which a waiting or mixed span is [`Verdict::Queued`].
pub const QUEUED_PERCENT: u64 = 50;
/// Run-delay share from which a span that is not CPU-bound is [`Verdict::WaitingForCpu`].
/// The rule is the one the other waits follow: the measured part over its threshold (with
/// blocked time net of the run delay, at most one of blocked and run delay can exceed
/// half the wall time; a tie goes to the run delay, which was measured, where blocked is
/// what is left).
pub const RUNQUEUE_PERCENT: u64 = 50;
/// Unknown share (spans without the figures the others carry) from which a span that is
/// not CPU-bound is [`Verdict::NoEvidence`]: the rest is too little to judge by.
pub const UNKNOWN_PERCENT: u64 = 50;

/// Whether spans spent their wall time computing or waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// CPU time is at least [`CPU_BOUND_PERCENT`] of wall time.
    CpuBound,
    /// Not CPU-bound, and a thread was inside the span but off CPU for at least
    /// [`BLOCKED_PERCENT`] of the wall time: a blocking call inside a poll.
    BlockedInPoll,
    /// Woken but not polled for at least [`QUEUED_PERCENT`] of the wall time: waiting for a
    /// worker behind other work, not for a dependency (`profiling.wall.queued_ns`).
    Queued,
    /// Not CPU-bound, and runnable inside the span but not running for at least
    /// [`RUNQUEUE_PERCENT`] of the wall time (`profiling.wall.runqueue_ns`): other work, or
    /// the container's CPU quota, held the CPUs.
    WaitingForCpu,
    /// Between the two thresholds: part computing, part waiting.
    Mixed,
    /// CPU time is under [`WAITING_PERCENT`] of wall time.
    Waiting,
    /// Nothing says where the time went: no samples and no evidence attributes (see
    /// [`NoEvidence`]), or most of it is the split's unknown part.
    NoEvidence,
}

impl Verdict {
    /// The verdict the split's shares give.
    pub fn of_split(split: &TimeSplit) -> Verdict {
        let share = |part| split.share(part).map_or(0, |p: Percent| p.0);
        if share(Part::Cpu) >= CPU_BOUND_PERCENT {
            Verdict::CpuBound
        } else if share(Part::Runqueue) >= RUNQUEUE_PERCENT {
            Verdict::WaitingForCpu
        } else if share(Part::Blocked) >= BLOCKED_PERCENT {
            Verdict::BlockedInPoll
        } else if share(Part::Queued) >= QUEUED_PERCENT {
            Verdict::Queued
        } else if share(Part::Unknown) >= UNKNOWN_PERCENT {
            Verdict::NoEvidence
        } else if share(Part::Cpu) < WAITING_PERCENT {
            Verdict::Waiting
        } else {
            Verdict::Mixed
        }
    }

    /// The part a sentence about this verdict leads with.
    fn lead(self, split: &TimeSplit) -> Part {
        let part = match self {
            Verdict::BlockedInPoll => Part::Blocked,
            Verdict::Queued => Part::Queued,
            Verdict::WaitingForCpu => Part::Runqueue,
            Verdict::NoEvidence => Part::Unknown,
            Verdict::CpuBound | Verdict::Mixed | Verdict::Waiting => Part::Cpu,
        };
        if split.ns(part).is_some() {
            part
        } else {
            Part::Cpu
        }
    }

    /// Why this verdict follows from `split`: its lead part's share, the other parts'
    /// shares (those that round to 0 % left out), and what that means.
    pub fn reason(self, split: &TimeSplit) -> String {
        if split.wall_ns == 0 {
            return "the spans took no wall time".to_owned();
        }
        let lead = self.lead(split);
        let figure = |part: Part| {
            split
                .share(part)
                .map(|share| format!("{} {share}", part.label()))
        };
        let others: Vec<String> = PART_ORDER
            .into_iter()
            .filter(|&part| part != lead)
            .filter(|&part| split.share(part).is_some_and(|s| s.0 > 0))
            .filter_map(figure)
            .collect();
        let mut figures = format!("{} of the wall time", figure(lead).unwrap_or_default());
        if !others.is_empty() {
            figures.push_str(&format!(" ({})", others.join(", ")));
        }
        let meaning = match self {
            Verdict::CpuBound => "the span is computing; the top functions say where".to_owned(),
            Verdict::Mixed => "part computing, part waiting".to_owned(),
            Verdict::Waiting if split.active.is_some() => "not computing — awaiting is time \
                no thread was inside the span: a dependency, a timer or a free worker"
                .to_owned(),
            Verdict::Waiting => {
                "a slow span with sparse CPU samples is waiting, not computing".to_owned()
            }
            Verdict::BlockedInPoll => {
                let preemption = if split.runqueue_measured {
                    ""
                } else {
                    " — or the machine's CPUs were busy with other work (run delay not \
                     measured)"
                };
                format!(
                    "a thread was inside the span but off CPU: a blocking call (std::fs, \
                     std::thread::sleep, a contended std::sync::Mutex, blocking DNS or HTTP) \
                     — inside an async task's poll it holds the worker and stalls every other \
                     task on it{preemption}"
                )
            }
            Verdict::Queued => "woken but not yet polled: queued for a worker behind other \
                work on a busy runtime, not waiting on a dependency — the concurrent activity \
                says what ran instead"
                .to_owned(),
            Verdict::WaitingForCpu => format!(
                "runnable but not running: {} — the span was not blocked and not waiting on \
                 a dependency",
                runqueue_cause(split)
            ),
            Verdict::NoEvidence if split.ns(Part::Unknown).is_some() => {
                format!("not split: {}", unknown_cause(split.unknown))
            }
            Verdict::NoEvidence => "nothing says whether the spans computed or waited".to_owned(),
        };
        format!("{figures}: {meaning}")
    }
}

/// Why the spans waited for a CPU: the container's throttling when it explains the delay
/// (at least half of it), else other work.
fn runqueue_cause(split: &TimeSplit) -> String {
    let (throttled, delay) = (split.throttled_ns, split.runqueue_ns);
    if throttled > 0 && throttled.saturating_mul(2) >= delay {
        let limit = split
            .cpu_limit_millicpus
            .map(|m| format!(" (limit {} CPUs)", m as f64 / 1000.0))
            .unwrap_or_default();
        format!(
            "the container was throttled {:.0} ms while it ran{limit}",
            throttled as f64 / 1e6
        )
    } else {
        "other work held the CPUs".to_owned()
    }
}

/// Which spans the unknown part comes from.
fn unknown_cause(unknown: Unknown) -> String {
    let mut causes = Vec::new();
    if unknown.without_active > 0 {
        causes.push(format!(
            "{} span(s) carry no active time while the others do (roots the bridge did not \
             follow, or whose figures were lost)",
            unknown.without_active
        ));
    }
    if unknown.without_runqueue > 0 {
        causes.push(format!(
            "{} span(s) carry no run delay while the others do (no watchdog ran for them)",
            unknown.without_runqueue
        ));
    }
    causes.join("; ")
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Verdict::CpuBound => "CPU-bound",
            Verdict::BlockedInPoll => "blocked in poll",
            Verdict::Queued => "queued",
            Verdict::WaitingForCpu => "waiting for a CPU",
            Verdict::Mixed => "mixed",
            Verdict::Waiting => "waiting",
            Verdict::NoEvidence => "no evidence",
        })
    }
}

/// What the whole input says about the bridge's evidence: needed to tell why a root has
/// none ([`NoEvidence`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvidenceContext {
    /// The `service.version`s some local root of which carries the bridge's evidence
    /// attributes (so its tracer provider has a `CpuEvidenceProcessor`).
    pub versions_with_evidence: HashSet<Option<String>>,
    /// How many local roots of each `service.version` were read.
    pub roots_by_version: HashMap<Option<String>, usize>,
    /// The time windows of the profiles read (`[start, end)`, ns since the epoch): a
    /// sampler ran over each.
    pub profile_windows: Vec<(u64, u64)>,
}

impl EvidenceContext {
    /// The context of `roots` (the local roots read) and the profiles' windows.
    pub fn new(roots: &[&Span], profile_windows: Vec<(u64, u64)>) -> EvidenceContext {
        EvidenceContext {
            versions_with_evidence: roots
                .iter()
                .filter(|s| has_evidence(s))
                .map(|s| s.service_version.clone())
                .collect(),
            roots_by_version: roots.iter().fold(HashMap::new(), |mut n, s| {
                *n.entry(s.service_version.clone()).or_default() += 1;
                n
            }),
            profile_windows,
        }
    }

    /// Why `spans` (none of which carries evidence) have none: as the bridge says on the
    /// spans (`profiling.evidence.missing`, the reason most of them give), else inferred
    /// from the other roots and the profiles' windows.
    fn why_none(&self, spans: &[&Span]) -> NoEvidence {
        let mut said: HashMap<NoEvidence, usize> = HashMap::new();
        for span in spans {
            let reason = match span.evidence_missing.as_deref() {
                Some("not_followed") => NoEvidence::NotFollowed,
                Some("no_sampler") => NoEvidence::NoSampler,
                Some("root_cap") => NoEvidence::RootCap,
                _ => continue,
            };
            *said.entry(reason).or_default() += 1;
        }
        if let Some((reason, _)) = said
            .into_iter()
            .max_by_key(|&(r, n)| (n, std::cmp::Reverse(r)))
        {
            return reason;
        }
        // Other roots of the same version as these spans were read.
        let mut ours: HashMap<&Option<String>, usize> = HashMap::new();
        for span in spans {
            *ours.entry(&span.service_version).or_default() += 1;
        }
        let others = ours
            .iter()
            .any(|(v, &n)| self.roots_by_version.get(*v).is_some_and(|&all| all > n));
        let processor = spans
            .iter()
            .any(|s| self.versions_with_evidence.contains(&s.service_version));
        if !processor {
            // Other roots of the same version read, and none carries evidence: the
            // provider has no processor. With nothing to compare, it cannot be told.
            return if others {
                NoEvidence::NoProcessor
            } else {
                NoEvidence::Undetermined
            };
        }
        if self.profile_windows.is_empty() {
            return NoEvidence::NotFollowedOrNoSampler;
        }
        let sampled_at = |t: u64| self.profile_windows.iter().any(|&(a, b)| a <= t && t < b);
        if spans.iter().any(|s| sampled_at(s.start_unix_nano)) {
            NoEvidence::NotFollowed
        } else {
            NoEvidence::NoSampler
        }
    }
}

/// Whether a span carries the evidence attributes the bridge writes on every local root
/// it followed (`profiling.cpu.samples`, `profiling.cpu.time_ns`,
/// `profiling.wall.active_ns`, always together).
pub fn has_evidence(span: &Span) -> bool {
    span.cpu_samples.is_some() || span.cpu_time_ns.is_some() || span.wall_active_ns.is_some()
}

/// Why a local root carries no evidence attribute and no sample. The bridge leaves the
/// attributes out rather than write zeros that would read as "never ran"
/// (`bridge/src/hooks/evidence.rs`), so their absence says only that it kept none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoEvidence {
    /// Other roots of its version carry evidence and a profile read covers its start: a
    /// sampler ran, the processor claimed counters, and no layer or wrapper of the crate
    /// followed the root (the plain `FutureExt::with_context`, say).
    NotFollowed,
    /// Other roots of its version carry evidence, and no profile read covers its start:
    /// no sampler ran when it started, so no counters were claimed.
    NoSampler,
    /// Other roots of its version carry evidence; the profiles read say nothing of when
    /// they were taken, so "not followed" cannot be told from "no sampler at its start".
    NotFollowedOrNoSampler,
    /// The bridge says the live-root cap (`max_live_roots`) was reached when it started.
    RootCap,
    /// No root of its version read carries evidence: the tracer provider has no
    /// `CpuEvidenceProcessor`.
    NoProcessor,
    /// No other root to compare it with.
    Undetermined,
}

impl NoEvidence {
    fn label(self) -> &'static str {
        match self {
            NoEvidence::NotFollowed => "not followed",
            NoEvidence::NoSampler => "no sampler at its start",
            NoEvidence::NotFollowedOrNoSampler => "not followed or no sampler",
            NoEvidence::RootCap => "over the live-root cap",
            NoEvidence::NoProcessor => "no evidence processor",
            NoEvidence::Undetermined => "no evidence",
        }
    }

    fn explain(self) -> &'static str {
        match self {
            NoEvidence::NotFollowed => {
                "not followed by otel-profiling: no profiling.* \
                attribute and no CPU sample, while other roots of its version carry them and \
                a sampler ran at its start — its work ran outside the crate's layer and \
                wrappers (e.g. a future given the plain opentelemetry FutureExt::with_context): \
                enter its span through ProfilingLayer, or wrap the future with \
                with_profiling_context (ProfilingFutureExt)"
            }
            NoEvidence::NoSampler => {
                "no sampler was running when it started (no profile \
                read covers its start), so the bridge kept no evidence for it: start the \
                profiler before the work it should see"
            }
            NoEvidence::NotFollowedOrNoSampler => {
                "no profiling.* attribute and no CPU \
                sample, while other roots of its version carry them: either the crate did not \
                follow it (enter its span through ProfilingLayer, or wrap its future with \
                with_profiling_context) or no sampler ran at its start — the profiles read do \
                not say when they were taken"
            }
            NoEvidence::RootCap => {
                "the bridge kept no evidence for it: the live-root cap \
                (max_live_roots, OTEL_PROFILING_MAX_LIVE_ROOTS) was reached when it started, \
                so no counters were claimed (and its samples carry no span labels either): \
                raise the cap if this many roots are really alive at once"
            }
            NoEvidence::NoProcessor => {
                "no root of its version carries profiling.* \
                attributes: the tracer provider has no CpuEvidenceProcessor (Telemetry adds \
                one; else wrap the exporting span processor in CpuEvidenceProcessor::new), so \
                no CPU, active or queued time was recorded"
            }
            NoEvidence::Undetermined => {
                "no profiling.* attribute and no CPU sample, and no \
                other root read to compare with: no CpuEvidenceProcessor, a root the crate did \
                not follow (ProfilingLayer, with_profiling_context) or no sampler at its start"
            }
        }
    }
}

/// Why spans have no CPU samples (ordered from the most to the least telling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoSamples {
    /// Samples were taken under the spans (their `profiling.cpu.samples`; without it, their
    /// `profiling.cpu.time_ns` records at least two sampling periods), but no profile read
    /// has them: the profile covering them is elsewhere or not written yet.
    ProfileNotRead,
    /// The spans' `profiling.cpu.time_ns` records CPU (`cpu_ns` in all), but no sample was
    /// taken under them (their `profiling.cpu.samples` is 0; without it, the CPU is under
    /// two sampling periods): none is no sign of a missing profile.
    CpuUnderSampling {
        /// Their CPU time together, nanoseconds.
        cpu_ns: u64,
    },
    /// No profile file was read at all.
    NoProfiles,
    /// The spans carry no `pyroscope.profile.id`: nothing tied samples to them.
    Unsampled,
    /// No evidence attribute, no active time at all: the bridge kept nothing for them.
    NoEvidence(NoEvidence),
    /// Shorter (p95) than two sampling periods: likely missed by the sampling.
    TooShort,
    /// Long enough to be sampled had it computed, and a thread sat inside it off CPU for
    /// at least [`BLOCKED_PERCENT`] of the wall time (its active time says so): blocked in
    /// a poll.
    BlockedInPoll,
    /// Long enough to be sampled had it computed: it was waiting.
    Waiting,
}

impl NoSamples {
    /// The reason without its figure: what groups spans in the report's list.
    pub fn kind(self) -> NoSamples {
        match self {
            NoSamples::CpuUnderSampling { .. } => NoSamples::CpuUnderSampling { cpu_ns: 0 },
            other => other,
        }
    }

    /// One reason for spans of `self`'s and `other`'s kind together: the CPU their
    /// attributes record is summed (other kinds carry nothing to add).
    pub fn merged(self, other: NoSamples) -> NoSamples {
        match (self, other) {
            (
                NoSamples::CpuUnderSampling { cpu_ns: a },
                NoSamples::CpuUnderSampling { cpu_ns: b },
            ) => NoSamples::CpuUnderSampling {
                cpu_ns: a.saturating_add(b),
            },
            (kept, _) => kept,
        }
    }

    /// Why `spans` (of one group, or a single span) have no CPU samples.
    pub fn classify(spans: &[&Span], sampling: Sampling, context: &EvidenceContext) -> NoSamples {
        let cpu_ns: u64 = spans.iter().map(|s| s.cpu_time_ns.unwrap_or(0)).sum();
        if cpu_ns > 0 {
            // The bridge counted the samples taken under each root
            // (`profiling.cpu.samples`): none taken is no missing profile, however much
            // CPU (samples land where the threads are at each period's end; spread thin,
            // 4 expected is 0 taken one time in 50). Without the count, the CPU time
            // decides: under two periods a span often gets no sample at all (a 5 ms job
            // at 100 Hz, half the time).
            let counted = spans.iter().all(|s| s.cpu_samples.is_some());
            let taken: u64 = spans.iter().filter_map(|s| s.cpu_samples).sum();
            let due = if counted {
                taken > 0
            } else {
                cpu_ns >= sampling.too_short_ns()
            };
            return if due {
                NoSamples::ProfileNotRead
            } else {
                NoSamples::CpuUnderSampling { cpu_ns }
            };
        }
        if !sampling.profiles_read {
            return NoSamples::NoProfiles;
        }
        if spans.iter().all(|s| s.profile_id.is_none()) {
            return NoSamples::Unsampled;
        }
        // Neither the bridge's figures nor tracing-opentelemetry's: no sample is no
        // evidence of waiting, since nothing says the sampler could tie one to them.
        if !spans.iter().any(|s| has_evidence(s) || s.busy_ns.is_some()) {
            return NoSamples::NoEvidence(context.why_none(spans));
        }
        let mut walls: Vec<u64> = spans.iter().map(|s| s.wall_ns()).collect();
        walls.sort_unstable();
        let wall: u64 = walls.iter().sum();
        // The active time (the bridge's, else tracing-opentelemetry's) on every span.
        let active: Option<u64> = spans.iter().map(|s| s.wall_active_ns.or(s.busy_ns)).sum();
        let blocked =
            |active: u64| Percent::of(active, wall).is_some_and(|p| p.0 >= BLOCKED_PERCENT);
        // The sampling period limits the CPU evidence, not the active time, which is
        // exact: threads inside the spans for two periods or more in all, with not one
        // sample, were not computing (had they been, at least two samples were due), however
        // short each span is.
        if let Some(active) = active.filter(|&a| a >= sampling.too_short_ns()) {
            return if blocked(active) {
                NoSamples::BlockedInPoll
            } else {
                NoSamples::Waiting
            };
        }
        if percentile(&walls, 95.0) < sampling.too_short_ns() {
            return NoSamples::TooShort;
        }
        match active {
            Some(active) if blocked(active) => NoSamples::BlockedInPoll,
            _ => NoSamples::Waiting,
        }
    }

    /// Whether this says nothing about where the time went (the verdict is then
    /// [`Verdict::NoEvidence`] unless the spans' active time splits it).
    pub fn is_no_evidence(self) -> bool {
        matches!(
            self,
            NoSamples::NoProfiles | NoSamples::Unsampled | NoSamples::NoEvidence(_)
        )
    }

    /// A short label: `waiting`, `too short`, `unsampled`, ...
    pub fn label(self) -> &'static str {
        match self {
            NoSamples::ProfileNotRead => "profile not read",
            NoSamples::CpuUnderSampling { .. } => "CPU under sampling",
            NoSamples::NoProfiles => "no profiles",
            NoSamples::Unsampled => "unsampled",
            NoSamples::NoEvidence(why) => why.label(),
            NoSamples::TooShort => "too short",
            NoSamples::BlockedInPoll => "blocked in poll",
            NoSamples::Waiting => "waiting",
        }
    }

    /// The explanation, with the sampling period's figures.
    pub fn explain(self, sampling: Sampling) -> String {
        let period_ms = sampling.period_ns as f64 / 1e6;
        let hz = if sampling.period_ns > 0 {
            1e9 / sampling.period_ns as f64
        } else {
            0.0
        };
        match self {
            NoSamples::ProfileNotRead => "no profile sample carries these span ids, but their \
                profiling.cpu.time_ns records CPU: the profile covering them is not in these \
                directories (one is written every interval and at shutdown); the verdict uses \
                the span attributes"
                .to_owned(),
            NoSamples::CpuUnderSampling { cpu_ns } if cpu_ns < sampling.too_short_ns() => {
                format!(
                    "no profile sample carries these span ids, and their profiling.cpu.time_ns \
                     records {:.1} ms of CPU, under the {:.0} ms it takes to expect samples at \
                     {hz:.0} Hz: too little CPU for stacks; the verdict uses the span \
                     attributes",
                    cpu_ns as f64 / 1e6,
                    sampling.too_short_ns() as f64 / 1e6
                )
            }
            NoSamples::CpuUnderSampling { cpu_ns } => format!(
                "no profile sample carries these span ids, and none was taken under them \
                 (profiling.cpu.samples 0) though their profiling.cpu.time_ns records {:.1} ms \
                 of CPU, {:.1} periods at {hz:.0} Hz: CPU spread thin over short stretches \
                 gets few samples, and none is no missing profile; the verdict uses the span \
                 attributes",
                cpu_ns as f64 / 1e6,
                cpu_ns as f64 / sampling.period_ns.max(1) as f64
            ),
            NoSamples::NoProfiles => "no CPU samples because no profile file (*_cpu.pb.gz) was \
                read: the profiler did not run or has not written yet; this is no evidence \
                that the span is fast"
                .to_owned(),
            NoSamples::Unsampled => "unsampled: the spans carry no pyroscope.profile.id, so \
                no CPU sample is tied to them (no ProfileIdSpanProcessor, or the trace was not \
                sampled); this is no evidence that the span is fast"
                .to_owned(),
            NoSamples::NoEvidence(why) => format!(
                "{}; nothing says whether it computed or waited",
                why.explain()
            ),
            NoSamples::TooShort => format!(
                "too short for the sampling period: one sample per {period_ms:.0} ms of CPU \
                 ({hz:.0} Hz), so spans under ~{:.0} ms often get none (Pyroscope documents \
                 ~20 ms at 100 Hz); they may also be waiting",
                sampling.too_short_ns() as f64 / 1e6
            ),
            NoSamples::BlockedInPoll => format!(
                "no CPU samples, yet a thread was inside the span for most of its wall time: \
                 it was blocked inside a poll (a blocking call holding its thread off CPU), \
                 not computing and not awaiting; at {hz:.0} Hz every {period_ms:.0} ms of CPU \
                 is sampled"
            ),
            NoSamples::Waiting => format!(
                "a slow span with no CPU samples is waiting (I/O, locks, downstream calls), \
                 not computing: at {hz:.0} Hz every {period_ms:.0} ms of CPU is sampled"
            ),
        }
    }
}

impl fmt::Display for NoSamples {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.label())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const MS: u64 = 1_000_000;

    /// One span of `wall` ms with `cpu` ms of CPU in its attributes and, when given,
    /// `active`, `runqueue` and `queued` ms.
    fn root(wall: u64, cpu: u64, active: Option<u64>, runqueue: Option<u64>) -> Span {
        Span {
            cpu_time_ns: Some(cpu * MS / 10),
            cpu_samples: Some(cpu / 10),
            wall_active_ns: active.map(|a| a * MS / 10),
            wall_runqueue_ns: runqueue.map(|r| r * MS / 10),
            ..Span::test_root(1, 0, wall * MS / 10)
        }
    }

    fn split(span: &Span) -> TimeSplit {
        TimeSplit::of_spans(&[span], &HashMap::new())
    }

    /// Walls in tenths of a ms: the verdict compares the share as printed (rounded), so
    /// 49.6 % of CPU is CPU-bound, as "CPU 50%" says.
    #[test]
    fn verdicts_compare_the_shares_the_sentences_print() {
        let of = |wall, cpu, active| Verdict::of_split(&split(&root(wall, cpu, active, None)));
        assert_eq!(of(1000, 500, None), Verdict::CpuBound);
        assert_eq!(of(1000, 496, None), Verdict::CpuBound);
        assert_eq!(of(1000, 494, None), Verdict::Mixed);
        assert_eq!(of(1000, 95, None), Verdict::Mixed);
        assert_eq!(of(1000, 94, None), Verdict::Waiting);
        assert_eq!(of(1000, 20, Some(900)), Verdict::BlockedInPoll);
        assert_eq!(of(1000, 20, Some(400)), Verdict::Waiting);
        assert_eq!(of(1000, 300, Some(500)), Verdict::Mixed);
        let s = split(&root(1000, 496, None, None));
        assert_eq!(
            Verdict::CpuBound.reason(&s),
            "CPU 50% of the wall time (not on CPU 50%): the span is computing; the top \
             functions say where"
        );
        assert_eq!(Verdict::CpuBound.to_string(), "CPU-bound");
    }

    /// The figures of the demo row (CPU 0.42, run delay 0.42, blocked 0.15,
    /// awaiting 0.01): the sentence names the run delay, where it used to call the rest
    /// of the wall time "awaiting 43%".
    #[test]
    fn a_sentence_names_every_part_of_the_split_with_its_share() {
        let s = split(&root(1000, 420, Some(990), Some(420)));
        assert_eq!(Verdict::of_split(&s), Verdict::Mixed);
        assert_eq!(
            Verdict::Mixed.reason(&s),
            "CPU 42% of the wall time (waiting for a CPU 42%, blocked in poll 15%, awaiting \
             1%): part computing, part waiting"
        );
        // Blocked leads its own verdict; "or the CPUs were busy" only without run delay.
        let s = split(&root(1000, 0, Some(980), Some(0)));
        let reason = Verdict::of_split(&s).reason(&s);
        assert!(
            reason.starts_with("blocked in poll 98% of the wall time (awaiting 2%): a thread")
                && !reason.contains("busy with other work"),
            "{reason}"
        );
        let s = split(&root(1000, 0, Some(980), None));
        assert!(Verdict::BlockedInPoll
            .reason(&s)
            .contains("or the machine's CPUs were busy with other work (run delay not measured)"));
    }

    #[test]
    fn waiting_for_a_cpu_is_the_run_delay_over_its_threshold_and_names_the_cause() {
        let mut span = root(1000, 300, Some(1000), Some(600));
        assert_eq!(Verdict::of_split(&split(&span)), Verdict::WaitingForCpu);
        // A CPU-bound span stays CPU-bound whatever its run delay.
        assert_eq!(
            Verdict::of_split(&split(&root(1000, 500, Some(1000), Some(500)))),
            Verdict::CpuBound
        );
        assert_eq!(Verdict::WaitingForCpu.to_string(), "waiting for a CPU");
        span.cgroup_throttled_ns = Some(45 * MS);
        span.cgroup_cpu_limit_millicpus = Some(500);
        let throttled = Verdict::WaitingForCpu.reason(&split(&span));
        assert_eq!(
            throttled,
            "waiting for a CPU 60% of the wall time (CPU 30%, blocked in poll 10%): runnable \
             but not running: the container was throttled 45 ms while it ran (limit 0.5 \
             CPUs) — the span was not blocked and not waiting on a dependency"
        );
        span.cgroup_throttled_ns = Some(MS);
        let busy = Verdict::WaitingForCpu.reason(&split(&span));
        assert!(busy.contains("other work held the CPUs"), "{busy}");
    }

    #[test]
    fn most_of_the_time_unknown_is_no_evidence() {
        let followed = Span {
            span_id: crate::ids::SpanId::from(2u64),
            ..root(100, 0, Some(100), None)
        };
        let unfollowed = Span {
            span_id: crate::ids::SpanId::from(3u64),
            wall_active_ns: None,
            ..root(300, 0, None, None)
        };
        let s = TimeSplit::of_spans(&[&followed, &unfollowed], &HashMap::new());
        assert_eq!(Verdict::of_split(&s), Verdict::NoEvidence);
        assert_eq!(
            Verdict::NoEvidence.reason(&s),
            "unknown 75% of the wall time (blocked in poll 25%): not split: 1 span(s) carry \
             no active time while the others do (roots the bridge did not follow, or whose \
             figures were lost)"
        );
    }

    fn context(roots: &[&Span], windows: Vec<(u64, u64)>) -> EvidenceContext {
        EvidenceContext::new(roots, windows)
    }

    /// A root with a profile id and nothing else is told apart by what the other roots
    /// and the profiles' windows say — never "waiting", never "too short".
    #[test]
    fn why_a_root_has_no_evidence_is_told_apart() {
        let sampling = Sampling {
            profiles_read: true,
            period_ns: 10 * MS,
        };
        // A 5 ms job, as the plain FutureExt::with_context leaves it: too short, were it
        // followed.
        let job = Span::test_root(1, 1_000 * MS, 1_005 * MS);
        let followed = Span {
            cpu_time_ns: Some(0),
            cpu_samples: Some(0),
            wall_active_ns: Some(0),
            ..Span::test_root(2, 2_000 * MS, 2_100 * MS)
        };
        let classify = |ctx: &EvidenceContext| NoSamples::classify(&[&job], sampling, ctx);
        let covered = vec![(900 * MS, 3_000 * MS)];
        assert_eq!(
            classify(&context(&[&job, &followed], covered.clone())),
            NoSamples::NoEvidence(NoEvidence::NotFollowed)
        );
        assert_eq!(
            classify(&context(&[&job, &followed], vec![(1_500 * MS, 3_000 * MS)])),
            NoSamples::NoEvidence(NoEvidence::NoSampler)
        );
        assert_eq!(
            classify(&context(&[&job, &followed], vec![])),
            NoSamples::NoEvidence(NoEvidence::NotFollowedOrNoSampler)
        );
        // The bridge's own word (read from Tempo, no profile windows): exact, and it wins
        // over what the context would infer.
        for (said, reason) in [
            ("not_followed", NoEvidence::NotFollowed),
            ("no_sampler", NoEvidence::NoSampler),
            ("root_cap", NoEvidence::RootCap),
        ] {
            let told = Span {
                evidence_missing: Some(said.into()),
                ..job.clone()
            };
            let ctx = context(&[&told, &followed], vec![]);
            assert_eq!(
                NoSamples::classify(&[&told], sampling, &ctx),
                NoSamples::NoEvidence(reason),
                "{said}"
            );
        }
        // Another root of the version, without evidence either: no processor.
        let other = Span::test_root(3, 2_000 * MS, 2_100 * MS);
        assert_eq!(
            classify(&context(&[&job, &other], covered.clone())),
            NoSamples::NoEvidence(NoEvidence::NoProcessor)
        );
        // A root of another version carries evidence: says nothing of this one's.
        let elsewhere = Span {
            service_version: Some("2".into()),
            ..followed.clone()
        };
        assert_eq!(
            classify(&context(&[&job, &elsewhere], covered.clone())),
            NoSamples::NoEvidence(NoEvidence::Undetermined)
        );
        assert_eq!(
            classify(&context(&[&job], covered.clone())),
            NoSamples::NoEvidence(NoEvidence::Undetermined)
        );
        let why = classify(&context(&[&job, &followed], covered)).explain(sampling);
        assert!(
            why.contains("with_profiling_context") && !why.contains("waiting"),
            "{why}"
        );
        // With evidence (followed, no CPU), the short job is too short, as before.
        assert_eq!(
            NoSamples::classify(&[&followed], sampling, &context(&[&followed], vec![])).label(),
            "waiting"
        );
    }

    /// CPU in the attributes and no sample: a missing profile only when samples were
    /// due (two periods of CPU or more); a 5 ms job of CPU at 100 Hz often gets none,
    /// which says nothing of the profiles read.
    #[test]
    fn cpu_without_samples_is_a_missing_profile_only_when_samples_were_due() {
        let sampling = Sampling {
            profiles_read: true,
            period_ns: 10 * MS,
        };
        let job = |id: u64, cpu_ms: u64| Span {
            cpu_time_ns: Some(cpu_ms * MS),
            cpu_samples: Some(0),
            wall_active_ns: Some(cpu_ms * MS),
            ..Span::test_root(id, id * 1_000 * MS, id * 1_000 * MS + cpu_ms * MS)
        };
        let ctx = EvidenceContext::default();
        let short = job(1, 5);
        let why = NoSamples::classify(&[&short], sampling, &ctx);
        assert_eq!(why, NoSamples::CpuUnderSampling { cpu_ns: 5 * MS });
        let text = why.explain(sampling);
        assert!(
            text.contains("5.0 ms of CPU") && !text.contains("not in these directories"),
            "{text}"
        );
        // Five such jobs together: 25 ms, but the bridge counted no sample under them:
        // no missing profile.
        let mut jobs: Vec<Span> = (1..=5).map(|i| job(i, 5)).collect();
        let all: Vec<&Span> = jobs.iter().collect();
        let why = NoSamples::classify(&all, sampling, &ctx);
        assert_eq!(why, NoSamples::CpuUnderSampling { cpu_ns: 25 * MS });
        let text = why.explain(sampling);
        assert!(
            text.contains("none was taken under them") && !text.contains("not in these"),
            "{text}"
        );
        // One sample counted under them, none in the profiles read: a profile is missing.
        jobs[2].cpu_samples = Some(1);
        let all: Vec<&Span> = jobs.iter().collect();
        assert_eq!(
            NoSamples::classify(&all, sampling, &ctx),
            NoSamples::ProfileNotRead
        );
        // Without the count (older spans), the CPU time decides.
        for job in &mut jobs {
            job.cpu_samples = None;
        }
        let all: Vec<&Span> = jobs.iter().collect();
        assert_eq!(
            NoSamples::classify(&all, sampling, &ctx),
            NoSamples::ProfileNotRead
        );
    }

    /// Short spans with no samples: "too short" only while the threads' time inside
    /// them adds up to less than two sampling periods; past that, the exact active time
    /// decides (blocked in poll when they were inside for most of their wall time).
    #[test]
    fn short_blocked_spans_are_blocked_once_their_active_time_could_have_been_sampled() {
        let span = |id: u64, wall_us: u64, active_us: Option<u64>| Span {
            wall_active_ns: active_us.map(|a| a * 1_000),
            busy_ns: Some(0),
            ..Span::test_root(id, id * 1_000 * MS, id * 1_000 * MS + wall_us * 1_000)
        };
        let sampling = Sampling {
            profiles_read: true,
            period_ns: 10 * MS,
        };
        let ctx = EvidenceContext::default();
        let blocked: Vec<Span> = (1..=3).map(|i| span(i, 15_600, Some(15_500))).collect();
        let all: Vec<&Span> = blocked.iter().collect();
        // 46.5 ms inside, not one sample: not computing.
        assert_eq!(
            NoSamples::classify(&all, sampling, &ctx),
            NoSamples::BlockedInPoll
        );
        // One such span (15.5 ms inside, under two periods) may simply have been missed.
        assert_eq!(
            NoSamples::classify(&all[..1], sampling, &ctx),
            NoSamples::TooShort
        );
        // Short spans mostly awaiting are waiting, not too short, once as much is known.
        let awaiting: Vec<Span> = (1..=5).map(|i| span(i, 15_600, Some(5_000))).collect();
        let all: Vec<&Span> = awaiting.iter().collect();
        assert_eq!(
            NoSamples::classify(&all, sampling, &ctx),
            NoSamples::Waiting
        );
        // Without the bridge's active time, busy_ns (0 here) decides.
        let unknown: Vec<Span> = (1..=5).map(|i| span(i, 15_600, None)).collect();
        let all: Vec<&Span> = unknown.iter().collect();
        assert_eq!(
            NoSamples::classify(&all, sampling, &ctx),
            NoSamples::TooShort
        );
    }
}
