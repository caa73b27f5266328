//! What CPU time against wall time says about a span: computing, blocked inside a poll,
//! waiting, or in between — and why a span has no CPU samples at all.
//!
//! With the spans' active time (`profiling.wall.active_ns`, or `busy_ns`; see
//! [`crate::split`]) the time off CPU splits in two: *blocked in poll* (a thread was inside
//! the span but not running: a blocking call inside a poll, which also stalls every other
//! task of that worker) and *awaiting* (no thread was inside the span: waiting on a
//! dependency, a timer, or queued). Without it, off-CPU time is all called waiting.
//!
//! An empty profile is never read as "fast": a slow span without samples did not run on a
//! CPU long enough to be sampled, so it was waiting; a short one may simply have been
//! missed by the sampling period.

use std::fmt;

use crate::input::{Sampling, Span};
use crate::stats::percentile;

/// CPU/wall ratio from which a span is [`Verdict::CpuBound`].
pub const CPU_BOUND_RATIO: f64 = 0.5;
/// CPU/wall ratio below which a span is [`Verdict::Waiting`].
pub const WAITING_RATIO: f64 = 0.1;
/// Blocked/wall ratio from which a span that is not CPU-bound is [`Verdict::BlockedInPoll`].
pub const BLOCKED_RATIO: f64 = 0.5;
/// Queued/wall ratio from which a waiting or mixed span is [`Verdict::Queued`].
pub const QUEUED_RATIO: f64 = 0.5;
/// Run-delay/wall ratio from which a span that is not CPU-bound is
/// [`Verdict::WaitingForCpu`]. The rule is the one the other waits follow: the measured part
/// over its threshold (with blocked time now net of the run delay, at most one of blocked
/// and run delay can exceed half the wall time; a tie goes to the run delay, which was
/// measured, where blocked is what is left).
pub const RUNQUEUE_RATIO: f64 = 0.5;

/// Whether spans spent their wall time computing or waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// CPU time is at least [`CPU_BOUND_RATIO`] of wall time.
    CpuBound,
    /// Not CPU-bound, and a thread was inside the span but off CPU for at least
    /// [`BLOCKED_RATIO`] of the wall time: a blocking call inside a poll.
    BlockedInPoll,
    /// Woken but not polled for at least [`QUEUED_RATIO`] of the wall time: waiting for a
    /// worker behind other work, not for a dependency (`profiling.wall.queued_ns`).
    Queued,
    /// Not CPU-bound, and runnable inside the span but not running for at least
    /// [`RUNQUEUE_RATIO`] of the wall time (`profiling.wall.runqueue_ns`): other work, or the
    /// container's CPU quota, held the CPUs.
    WaitingForCpu,
    /// Between the two thresholds: part computing, part waiting.
    Mixed,
    /// CPU time is under [`WAITING_RATIO`] of wall time, or there are no CPU samples.
    Waiting,
}

impl Verdict {
    /// The verdict for a CPU/wall ratio.
    pub fn from_ratio(ratio: f64) -> Verdict {
        if ratio >= CPU_BOUND_RATIO {
            Verdict::CpuBound
        } else if ratio < WAITING_RATIO {
            Verdict::Waiting
        } else {
            Verdict::Mixed
        }
    }

    /// The verdict for a CPU/wall ratio and, when the spans' active time is known, the
    /// blocked/wall ratio.
    pub fn from_split(cpu_ratio: f64, blocked_ratio: Option<f64>) -> Verdict {
        match blocked_ratio {
            Some(blocked) if cpu_ratio < CPU_BOUND_RATIO && blocked >= BLOCKED_RATIO => {
                Verdict::BlockedInPoll
            }
            _ => Verdict::from_ratio(cpu_ratio),
        }
    }

    /// A waiting or mixed verdict becomes [`Verdict::Queued`] when the span's futures were
    /// woken but not polled for at least [`QUEUED_RATIO`] of the wall time.
    pub fn with_queued(self, queued_ratio: Option<f64>) -> Verdict {
        match (self, queued_ratio) {
            (Verdict::Waiting | Verdict::Mixed, Some(q)) if q >= QUEUED_RATIO => Verdict::Queued,
            _ => self,
        }
    }

    /// A verdict that is not CPU-bound becomes [`Verdict::WaitingForCpu`] when the span's
    /// threads were runnable but not running for at least [`RUNQUEUE_RATIO`] of the wall
    /// time.
    pub fn with_runqueue(self, runqueue_ratio: Option<f64>) -> Verdict {
        match (self, runqueue_ratio) {
            (Verdict::CpuBound, _) => self,
            (_, Some(r)) if r >= RUNQUEUE_RATIO => Verdict::WaitingForCpu,
            _ => self,
        }
    }

    /// Why a span is [`Verdict::WaitingForCpu`]: the container's throttling when it
    /// explains the delay (at least half of it), else other work.
    pub fn runqueue_reason(
        cpu_ratio: f64,
        runqueue_ratio: f64,
        runqueue_ns: u64,
        throttled_ns: u64,
        cpu_limit_millicpus: Option<u64>,
    ) -> String {
        let why = if throttled_ns > 0 && throttled_ns.saturating_mul(2) >= runqueue_ns {
            let limit = cpu_limit_millicpus
                .map(|m| format!(" (limit {} CPUs)", m as f64 / 1000.0))
                .unwrap_or_default();
            format!(
                "the container was throttled {:.0} ms while it ran{limit}",
                throttled_ns as f64 / 1e6
            )
        } else {
            "other work held the CPUs".to_owned()
        };
        format!(
            "runnable but not running for {:.0}% of the wall time (CPU {:.0}%): {why} — the \
             span was not blocked and not waiting on a dependency",
            runqueue_ratio * 100.0,
            cpu_ratio * 100.0,
        )
    }

    /// Why a span is [`Verdict::Queued`].
    pub fn queued_reason(cpu_ratio: f64, blocked_ratio: Option<f64>, queued_ratio: f64) -> String {
        format!(
            "woken but not yet polled for {:.0}% of the wall time (CPU {:.0}%, blocked in poll \
             {:.0}%): queued for a worker behind other work on a busy runtime, not waiting on \
             a dependency — the concurrent activity says what ran instead",
            queued_ratio * 100.0,
            cpu_ratio * 100.0,
            blocked_ratio.unwrap_or(0.0) * 100.0
        )
    }

    /// Why this verdict follows from the ratios (`blocked_ratio` as for
    /// [`Verdict::from_split`]).
    pub fn reason_split(self, cpu_ratio: f64, blocked_ratio: Option<f64>) -> String {
        let Some(blocked) = blocked_ratio else {
            return self.reason(cpu_ratio);
        };
        let (cpu, blocked) = (cpu_ratio * 100.0, blocked * 100.0);
        let awaiting = (100.0 - cpu.min(100.0) - blocked).max(0.0);
        match self {
            Verdict::BlockedInPoll => format!(
                "a thread was inside the span but off CPU for {blocked:.0}% of the wall time \
                 (CPU {cpu:.0}%, awaiting {awaiting:.0}%): a blocking call (std::fs, \
                 std::thread::sleep, a contended std::sync::Mutex, blocking DNS or HTTP) — \
                 inside an async task's poll it holds the worker and stalls every other task \
                 on it — or the machine's CPUs were busy with other work"
            ),
            Verdict::Waiting => format!(
                "CPU is {cpu:.0}% and blocked in poll {blocked:.0}% of the wall time: for \
                 {awaiting:.0}% no thread was inside the span — awaiting a dependency, a timer \
                 or a free worker, not computing"
            ),
            Verdict::Mixed => format!(
                "CPU {cpu:.0}%, blocked in poll {blocked:.0}%, awaiting {awaiting:.0}% of the \
                 wall time: part computing, part waiting"
            ),
            Verdict::Queued => Verdict::queued_reason(cpu_ratio, blocked_ratio, 0.0),
            Verdict::WaitingForCpu => format!(
                "CPU {cpu:.0}%, blocked in poll {blocked:.0}% of the wall time: runnable but \
                 not running for most of the rest"
            ),
            Verdict::CpuBound => format!(
                "CPU is {cpu:.0}% of the wall time (blocked in poll {blocked:.0}%, awaiting \
                 {awaiting:.0}%): the span is computing; the top functions say where"
            ),
        }
    }

    /// Why this verdict follows from `ratio`.
    pub fn reason(self, ratio: f64) -> String {
        let share = ratio * 100.0;
        match self {
            Verdict::BlockedInPoll => format!(
                "CPU is {share:.0}% of the wall time and a thread was held inside the span \
                 off CPU: a blocking call inside a poll"
            ),
            Verdict::Queued => Verdict::queued_reason(ratio, None, 0.0),
            Verdict::WaitingForCpu => format!(
                "CPU is {share:.0}% of the wall time: runnable but not running for most of the rest"
            ),
            Verdict::CpuBound => format!(
                "CPU is {share:.0}% of the wall time: the span is computing; the top functions say where"
            ),
            Verdict::Mixed => {
                format!("CPU is {share:.0}% of the wall time: part computing, part waiting")
            }
            Verdict::Waiting => format!(
                "CPU is {share:.0}% of the wall time: a slow span with sparse CPU samples is waiting, not computing"
            ),
        }
    }
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
        })
    }
}

/// Why spans have no CPU samples (ordered from the most to the least telling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NoSamples {
    /// The spans' `profiling.cpu.time_ns` records CPU, but no profile read has their
    /// samples: the profile covering them is elsewhere or not written yet.
    ProfileNotRead,
    /// No profile file was read at all.
    NoProfiles,
    /// The spans carry no `pyroscope.profile.id`: nothing tied samples to them.
    Unsampled,
    /// Shorter (p95) than two sampling periods: likely missed by the sampling.
    TooShort,
    /// Long enough to be sampled had it computed, and a thread sat inside it off CPU for
    /// at least [`BLOCKED_RATIO`] of the wall time (its active time says so): blocked in
    /// a poll.
    BlockedInPoll,
    /// Long enough to be sampled had it computed: it was waiting.
    Waiting,
}

impl NoSamples {
    /// Why `spans` (of one group, or a single span) have no CPU samples.
    pub fn classify(spans: &[&Span], sampling: Sampling) -> NoSamples {
        if spans.iter().any(|s| s.cpu_time_ns.unwrap_or(0) > 0) {
            return NoSamples::ProfileNotRead;
        }
        if !sampling.profiles_read {
            return NoSamples::NoProfiles;
        }
        if spans.iter().all(|s| s.profile_id.is_none()) {
            return NoSamples::Unsampled;
        }
        let mut walls: Vec<u64> = spans.iter().map(|s| s.wall_ns()).collect();
        walls.sort_unstable();
        let wall: u64 = walls.iter().sum();
        // The active time (the bridge's, else tracing-opentelemetry's) on every span.
        let active: Option<u64> = spans.iter().map(|s| s.wall_active_ns.or(s.busy_ns)).sum();
        let blocked = |active: u64| wall > 0 && active as f64 >= BLOCKED_RATIO * wall as f64;
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

    /// A short label: `waiting`, `too short`, `unsampled`, ...
    pub fn label(self) -> &'static str {
        match self {
            NoSamples::ProfileNotRead => "profile not read",
            NoSamples::NoProfiles => "no profiles",
            NoSamples::Unsampled => "unsampled",
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
            NoSamples::NoProfiles => "no CPU samples because no profile file (*_cpu.pb.gz) was \
                read: the profiler did not run or has not written yet; this is no evidence \
                that the span is fast"
                .to_owned(),
            NoSamples::Unsampled => "unsampled: the spans carry no pyroscope.profile.id, so \
                no CPU sample is tied to them (no ProfileIdSpanProcessor, or the trace was not \
                sampled); this is no evidence that the span is fast"
                .to_owned(),
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
    use super::*;

    #[test]
    fn thresholds() {
        assert_eq!(Verdict::from_ratio(0.5), Verdict::CpuBound);
        assert_eq!(Verdict::from_ratio(0.49), Verdict::Mixed);
        assert_eq!(Verdict::from_ratio(0.1), Verdict::Mixed);
        assert_eq!(Verdict::from_ratio(0.099), Verdict::Waiting);
        assert_eq!(Verdict::from_ratio(0.0), Verdict::Waiting);
        assert_eq!(Verdict::CpuBound.to_string(), "CPU-bound");
    }

    #[test]
    fn waiting_for_a_cpu_is_the_run_delay_over_its_threshold_and_names_the_cause() {
        assert_eq!(
            Verdict::BlockedInPoll.with_runqueue(Some(0.6)),
            Verdict::WaitingForCpu
        );
        assert_eq!(
            Verdict::Mixed.with_runqueue(Some(0.5)),
            Verdict::WaitingForCpu
        );
        assert_eq!(Verdict::Waiting.with_runqueue(Some(0.49)), Verdict::Waiting);
        assert_eq!(Verdict::Mixed.with_runqueue(None), Verdict::Mixed);
        assert_eq!(
            Verdict::CpuBound.with_runqueue(Some(0.9)),
            Verdict::CpuBound
        );
        assert_eq!(Verdict::WaitingForCpu.to_string(), "waiting for a CPU");
        let throttled =
            Verdict::runqueue_reason(0.3, 0.6, 600 * 1_000_000, 450 * 1_000_000, Some(500));
        assert!(
            throttled.contains("the container was throttled 450 ms while it ran (limit 0.5 CPUs)"),
            "{throttled}"
        );
        let busy = Verdict::runqueue_reason(0.3, 0.6, 600 * 1_000_000, 10 * 1_000_000, None);
        assert!(busy.contains("other work held the CPUs"), "{busy}");
    }

    /// Short spans with no samples: "too short" only while the threads' time inside
    /// them adds up to less than two sampling periods; past that, the exact active time
    /// decides (blocked in poll when they were inside for most of their wall time).
    #[test]
    fn short_blocked_spans_are_blocked_once_their_active_time_could_have_been_sampled() {
        const MS: u64 = 1_000_000;
        let span = |id: u64, wall_us: u64, active_us: Option<u64>| Span {
            wall_active_ns: active_us.map(|a| a * 1_000),
            ..Span::test_root(id, id * 1_000 * MS, id * 1_000 * MS + wall_us * 1_000)
        };
        let sampling = Sampling {
            profiles_read: true,
            period_ns: 10 * MS,
        };
        let blocked: Vec<Span> = (1..=3).map(|i| span(i, 15_600, Some(15_500))).collect();
        let all: Vec<&Span> = blocked.iter().collect();
        // 46.5 ms inside, not one sample: not computing.
        assert_eq!(
            NoSamples::classify(&all, sampling),
            NoSamples::BlockedInPoll
        );
        // One such span (15.5 ms inside, under two periods) may simply have been missed.
        assert_eq!(
            NoSamples::classify(&all[..1], sampling),
            NoSamples::TooShort
        );
        // Short spans mostly awaiting are waiting, not too short, once as much is known.
        let awaiting: Vec<Span> = (1..=5).map(|i| span(i, 15_600, Some(5_000))).collect();
        let all: Vec<&Span> = awaiting.iter().collect();
        assert_eq!(NoSamples::classify(&all, sampling), NoSamples::Waiting);
        // Without active time, the wall time's p95 decides as before.
        let unknown: Vec<Span> = (1..=5).map(|i| span(i, 15_600, None)).collect();
        let all: Vec<&Span> = unknown.iter().collect();
        assert_eq!(NoSamples::classify(&all, sampling), NoSamples::TooShort);
    }

    #[test]
    fn blocked_in_poll_needs_active_time_and_loses_to_cpu() {
        // Without active time, off-CPU time is waiting as before.
        assert_eq!(Verdict::from_split(0.02, None), Verdict::Waiting);
        assert_eq!(Verdict::from_split(0.02, Some(0.9)), Verdict::BlockedInPoll);
        assert_eq!(Verdict::from_split(0.3, Some(0.5)), Verdict::BlockedInPoll);
        assert_eq!(Verdict::from_split(0.02, Some(0.49)), Verdict::Waiting);
        assert_eq!(Verdict::from_split(0.3, Some(0.2)), Verdict::Mixed);
        assert_eq!(Verdict::from_split(0.6, Some(0.4)), Verdict::CpuBound);
        let reason = Verdict::BlockedInPoll.reason_split(0.02, Some(0.9));
        assert!(
            reason.contains("90%") && reason.contains("awaiting 8%"),
            "{reason}"
        );
        assert_eq!(Verdict::Waiting.with_queued(Some(0.6)), Verdict::Queued);
        assert_eq!(Verdict::Mixed.with_queued(Some(0.5)), Verdict::Queued);
        assert_eq!(Verdict::Waiting.with_queued(Some(0.4)), Verdict::Waiting);
        assert_eq!(Verdict::Waiting.with_queued(None), Verdict::Waiting);
        assert_eq!(
            Verdict::BlockedInPoll.with_queued(Some(0.9)),
            Verdict::BlockedInPoll
        );
        assert_eq!(Verdict::CpuBound.with_queued(Some(0.9)), Verdict::CpuBound);
        let reason = Verdict::Waiting.reason_split(0.02, Some(0.01));
        assert!(
            reason.contains("97%") && reason.contains("no thread"),
            "{reason}"
        );
    }
}
