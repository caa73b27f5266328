//! The stand-in's Pyroscope ingest limits, its per-tenant rate limiter and the counters of
//! what it refused.
//!
//! Defaults are Grafana Pyroscope v2.2.1's (`pkg/validation/limits.go`,
//! `Limits.RegisterFlags`). Pyroscope's "MB" is 1,048,576 bytes (`bytesInMB`), so the
//! default rate is 4 MiB/s and the burst 2 MiB. A test lowers a limit through the `with_*`
//! builders (or [`Limits::scaled_down`]) and hands the result to
//! [`StandIn::start_with_limits`](super::StandIn::start_with_limits) or
//! [`StandIn::set_limits`](super::StandIn::set_limits).

use std::collections::BTreeMap;
use std::time::Instant;

/// Pyroscope's `bytesInMB` (`pkg/validation/limits.go`).
const BYTES_IN_MB: u64 = 1_048_576;

/// Ingest limits of the stand-in's Pyroscope push endpoint.
///
/// `0` disables the three per-profile limits, as in Pyroscope; the label limits have no
/// "disabled" value there either.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// `validation.max-profile-stacktrace-samples`: `len(Sample)` per profile (16,000).
    pub max_profile_samples: usize,
    /// `validation.max-profile-size-bytes`: decompressed pprof bytes per profile (4 MiB).
    pub max_profile_size_bytes: usize,
    /// `validation.max-profile-stacktrace-sample-labels`: labels per pprof sample (100).
    pub max_sample_labels: usize,
    /// `distributor.ingestion-rate-limit-mb`: token refill, bytes per second (4 MiB/s).
    pub ingestion_rate_bytes: f64,
    /// `distributor.ingestion-burst-size-mb`: bucket size in bytes (2 MiB). A profile
    /// costing more than this is refused every time.
    pub ingestion_burst_bytes: u64,
    /// `validation.max-length-label-name` (1024 bytes).
    pub max_label_name_length: usize,
    /// `validation.max-length-label-value` (2048 bytes).
    pub max_label_value_length: usize,
    /// `validation.max-label-names-per-series` (30), counted after sample labels such as
    /// `span_name` joined the series labels.
    pub max_label_names_per_series: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_profile_samples: 16_000,
            max_profile_size_bytes: 4 * 1024 * 1024,
            max_sample_labels: 100,
            ingestion_rate_bytes: (4 * BYTES_IN_MB) as f64,
            ingestion_burst_bytes: 2 * BYTES_IN_MB,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
            max_label_names_per_series: 30,
        }
    }
}

impl Limits {
    /// Pyroscope's defaults (same as `Default`).
    pub fn pyroscope_defaults() -> Limits {
        Limits::default()
    }

    /// The size limits (samples, profile bytes, rate, burst) divided by `factor`, so that
    /// splitting can be proven with small profiles; label limits are left as they are
    /// (a tenth of 30 label names would refuse the exporter's own series labels).
    pub fn scaled_down(factor: u32) -> Limits {
        let f = factor.max(1);
        let d = Limits::default();
        Limits {
            max_profile_samples: d.max_profile_samples / f as usize,
            max_profile_size_bytes: d.max_profile_size_bytes / f as usize,
            ingestion_rate_bytes: d.ingestion_rate_bytes / f64::from(f),
            ingestion_burst_bytes: d.ingestion_burst_bytes / u64::from(f),
            ..d
        }
    }

    /// Sets [`Limits::max_profile_samples`].
    pub fn with_max_profile_samples(mut self, n: usize) -> Limits {
        self.max_profile_samples = n;
        self
    }

    /// Sets [`Limits::max_profile_size_bytes`].
    pub fn with_max_profile_size_bytes(mut self, n: usize) -> Limits {
        self.max_profile_size_bytes = n;
        self
    }

    /// Sets [`Limits::max_sample_labels`].
    pub fn with_max_sample_labels(mut self, n: usize) -> Limits {
        self.max_sample_labels = n;
        self
    }

    /// Sets the ingestion rate (bytes per second) and burst (bytes).
    pub fn with_ingestion_rate(mut self, bytes_per_second: f64, burst_bytes: u64) -> Limits {
        self.ingestion_rate_bytes = bytes_per_second;
        self.ingestion_burst_bytes = burst_bytes;
        self
    }

    /// Sets [`Limits::max_label_name_length`].
    pub fn with_max_label_name_length(mut self, n: usize) -> Limits {
        self.max_label_name_length = n;
        self
    }

    /// Sets [`Limits::max_label_value_length`].
    pub fn with_max_label_value_length(mut self, n: usize) -> Limits {
        self.max_label_value_length = n;
        self
    }

    /// Sets [`Limits::max_label_names_per_series`].
    pub fn with_max_label_names_per_series(mut self, n: usize) -> Limits {
        self.max_label_names_per_series = n;
        self
    }
}

/// Why a profile was refused: Pyroscope's `validation.Reason` values
/// (`pkg/validation/validate.go`), the `reason` label of its
/// `pyroscope_discarded_samples_total` metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// More samples than [`Limits::max_profile_samples`] (400).
    SamplesLimit,
    /// Decompressed profile over [`Limits::max_profile_size_bytes`] (400).
    ProfileSizeLimit,
    /// A sample with more labels than [`Limits::max_sample_labels`] (400).
    SampleLabelsLimit,
    /// The rate limiter refused the profile's bytes (429).
    RateLimited,
    /// A series label value over [`Limits::max_label_value_length`] (400).
    LabelValueTooLong,
    /// A series label name over [`Limits::max_label_name_length`] (400).
    LabelNameTooLong,
    /// More series label names than [`Limits::max_label_names_per_series`] (400).
    MaxLabelNamesPerSeries,
    /// Bad label name or missing/invalid `__name__` (400).
    InvalidLabels,
    /// A label name twice in one series (400).
    DuplicateLabelNames,
    /// No labels, or no `service_name` (400).
    MissingLabels,
    /// Structurally broken pprof (400), or bytes that are not pprof at all (500 in
    /// Pyroscope, which does not count those; the stand-in does, here).
    MalformedProfile,
}

impl Reason {
    /// Pyroscope's string for the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SamplesLimit => "samples_limit",
            Reason::ProfileSizeLimit => "profile_size_limit",
            Reason::SampleLabelsLimit => "sample_labels_limit",
            Reason::RateLimited => "rate_limited",
            Reason::LabelValueTooLong => "label_value_too_long",
            Reason::LabelNameTooLong => "label_name_too_long",
            Reason::MaxLabelNamesPerSeries => "max_label_names_per_series",
            Reason::InvalidLabels => "invalid_labels",
            Reason::DuplicateLabelNames => "duplicate_label_names",
            Reason::MissingLabels => "missing_labels",
            Reason::MalformedProfile => "malformed_profile",
        }
    }
}

/// What the push endpoint did, counted per profile (one `RawSample` of a push).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushCounters {
    /// Profiles accepted (stored, or empty and so nothing to store).
    pub accepted_profiles: u64,
    /// Samples stored with span 0 because their `span_id` was not 16 hex characters.
    pub span_ids_zeroed: u64,
    /// Samples stored with a zero trace id because their `trace_id` was not 32 hex.
    pub trace_ids_zeroed: u64,
    rejected: BTreeMap<Reason, u64>,
}

impl PushCounters {
    /// Profiles refused for `reason`.
    pub fn rejected(&self, reason: Reason) -> u64 {
        self.rejected.get(&reason).copied().unwrap_or(0)
    }

    /// Profiles refused for any reason.
    pub fn total_rejected(&self) -> u64 {
        self.rejected.values().sum()
    }

    /// Every reason with a non-zero count.
    pub fn rejections(&self) -> &BTreeMap<Reason, u64> {
        &self.rejected
    }

    pub(crate) fn reject(&mut self, reason: Reason) {
        *self.rejected.entry(reason).or_insert(0) += 1;
    }
}

/// A token bucket with the semantics of Go's `golang.org/x/time/rate.Limiter.AllowN`,
/// which Pyroscope's distributor uses through dskit's `limiter.RateLimiter`
/// (`pkg/distributor/distributor.go`, `Distributor.rateLimit`): the bucket starts full,
/// refills at `rate` up to `burst`, a request takes all its tokens at once or none, and
/// a request larger than the burst is never allowed.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: u64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub(crate) fn new(rate: f64, burst: u64) -> TokenBucket {
        TokenBucket {
            rate,
            burst,
            tokens: burst as f64,
            last: None,
        }
    }

    pub(crate) fn allow(&mut self, now: Instant, n: u64) -> bool {
        if n > self.burst {
            return false;
        }
        if let Some(last) = self.last {
            // A clock read earlier than the last one adds nothing (x/time/rate does the same).
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate.max(0.0)).min(self.burst as f64);
        }
        self.last = Some(now);
        if self.tokens >= n as f64 {
            self.tokens -= n as f64;
            true
        } else {
            false
        }
    }
}

/// go-humanize `Bytes` (SI units), as Pyroscope formats the size limit in its message.
pub(crate) fn humanize_si(n: u64) -> String {
    humanize(n, 1000.0, &["B", "kB", "MB", "GB", "TB", "PB", "EB"])
}

/// go-humanize `IBytes` (binary units), as Pyroscope formats the rate-limit message.
pub(crate) fn humanize_iec(n: u64) -> String {
    humanize(n, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"])
}

fn humanize(n: u64, base: f64, units: &[&str]) -> String {
    if n < 10 {
        return format!("{n} B");
    }
    let e = ((n as f64).ln() / base.ln()).floor();
    let unit = units.get(e as usize).copied().unwrap_or("?");
    let value = ((n as f64) / base.powf(e) * 10.0 + 0.5).floor() / 10.0;
    if value < 10.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn defaults_are_pyroscopes() {
        let l = Limits::default();
        assert_eq!(l.max_profile_samples, 16_000);
        assert_eq!(l.max_profile_size_bytes, 4_194_304);
        assert_eq!(l.max_sample_labels, 100);
        assert_eq!(l.ingestion_rate_bytes, 4_194_304.0);
        assert_eq!(l.ingestion_burst_bytes, 2_097_152);
        assert_eq!(l.max_label_name_length, 1024);
        assert_eq!(l.max_label_value_length, 2048);
        assert_eq!(l.max_label_names_per_series, 30);
    }

    #[test]
    fn scaled_down_lowers_sizes_not_label_limits() {
        let l = Limits::scaled_down(10);
        assert_eq!(l.max_profile_samples, 1_600);
        assert_eq!(l.ingestion_burst_bytes, 209_715);
        assert_eq!(l.max_label_names_per_series, 30);
    }

    #[test]
    fn bucket_takes_a_request_whole_and_never_one_over_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 1_000);
        assert!(
            !b.allow(t0, 1_001),
            "over the burst, even with a full bucket"
        );
        assert!(b.allow(t0, 600));
        assert!(!b.allow(t0, 600), "400 left: 600 is refused whole");
        assert!(b.allow(t0, 400));
        // Refill at 100/s: 2 s later 200 tokens.
        assert!(!b.allow(t0 + Duration::from_secs(2), 201));
        assert!(b.allow(t0 + Duration::from_secs(2), 200));
        // Never above the burst, however long the pause.
        let later = t0 + Duration::from_secs(3_600);
        assert!(b.allow(later, 1_000));
        assert!(!b.allow(later, 1));
        assert!(!b.allow(later + Duration::from_secs(3_600), 1_001));
    }

    #[test]
    fn sizes_are_formatted_like_go_humanize() {
        assert_eq!(humanize_si(4_194_304), "4.2 MB");
        assert_eq!(humanize_iec(4_194_304), "4.0 MiB");
        assert_eq!(humanize_iec(2_621_440), "2.5 MiB");
        assert_eq!(humanize_iec(15 * 1024), "15 KiB");
        assert_eq!(humanize_iec(7), "7 B");
    }
}
