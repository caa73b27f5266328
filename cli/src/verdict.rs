//! What CPU time against wall time says about a span: computing, waiting, or in between —
//! and why a span has no CPU samples at all.
//!
//! An empty profile is never read as "fast": a slow span without samples did not run on a
//! CPU long enough to be sampled, so it was waiting; a short one may simply have been
//! missed by the sampling period.

use std::fmt;

use crate::input::Span;
use crate::stats::percentile;

/// CPU/wall ratio from which a span is [`Verdict::CpuBound`].
pub const CPU_BOUND_RATIO: f64 = 0.5;
/// CPU/wall ratio below which a span is [`Verdict::Waiting`].
pub const WAITING_RATIO: f64 = 0.1;

/// Whether spans spent their wall time computing or waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// CPU time is at least [`CPU_BOUND_RATIO`] of wall time.
    CpuBound,
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

    /// Why this verdict follows from `ratio`.
    pub fn reason(self, ratio: f64) -> String {
        let share = ratio * 100.0;
        match self {
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
            Verdict::Mixed => "mixed",
            Verdict::Waiting => "waiting",
        })
    }
}

/// What the sampling could have seen: needed to explain an empty profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Some profile file was read.
    pub profiles_read: bool,
    /// The sampling period, nanoseconds.
    pub period_ns: u64,
}

impl Sampling {
    /// Spans whose wall time is under this often get no sample: two periods (20 ms at
    /// 100 Hz, the figure Pyroscope documents for span profiles).
    pub fn too_short_ns(&self) -> u64 {
        self.period_ns.saturating_mul(2)
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
        if percentile(&walls, 95.0) < sampling.too_short_ns() {
            NoSamples::TooShort
        } else {
            NoSamples::Waiting
        }
    }

    /// A short label: `waiting`, `too short`, `unsampled`, ...
    pub fn label(self) -> &'static str {
        match self {
            NoSamples::ProfileNotRead => "profile not read",
            NoSamples::NoProfiles => "no profiles",
            NoSamples::Unsampled => "unsampled",
            NoSamples::TooShort => "too short",
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
}
