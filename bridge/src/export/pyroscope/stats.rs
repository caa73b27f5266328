//! Counters of the profile exporters (Pyroscope push and OTLP profiles share them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Counters of one exporter, updated by `export` and the uploader thread; read them with
/// [`snapshot`](Self::snapshot) (the fields of [`PyroscopeSnapshot`] say what each counts).
///
/// Every push ends up in exactly one of `profiles_sent`, `profiles_failed` and
/// `profiles_dropped`, or is still counted in `profiles_queued`; once the exporter is
/// dropped the queue is empty, so those three add up to the pushes made plus
/// `pushes_split` (each split replaces one push by two). A profile within the limits is
/// one push; a split one is as many pushes as its parts needed (see `profiles_split`).
/// Fields are read one by one: a snapshot taken while uploads happen may be off by the
/// profile in transit.
#[derive(Debug, Default)]
pub struct PyroscopeStats {
    /// Profiles in the queue now, the one being sent included.
    pub(crate) profiles_queued: AtomicU64,
    /// Profiles the server accepted (2xx).
    pub(crate) profiles_sent: AtomicU64,
    /// Profiles the server refused permanently (4xx other than 429, 3xx): not retried.
    pub(crate) profiles_failed: AtomicU64,
    /// Profiles lost otherwise: pushed out of a full queue, larger than the whole queue,
    /// given up after the last attempt, or still queued when the shutdown timeout ran out.
    pub(crate) profiles_dropped: AtomicU64,
    /// Attempts after the first (resends of a profile).
    pub(crate) retries: AtomicU64,
    /// Bytes of encoded requests in the queue now (at most `max_queue_bytes`).
    pub(crate) bytes_queued: AtomicU64,
    /// Interval profiles larger than [`PyroscopeLimits`](super::PyroscopeLimits) allow,
    /// split into parts before sending.
    pub(crate) profiles_split: AtomicU64,
    /// Parts those profiles were split into.
    pub(crate) split_parts: AtomicU64,
    /// Pushes answered 429 that were replaced by two smaller ones (a push larger than the
    /// server's ingestion burst is refused every time: it is never resent as is).
    pub(crate) pushes_split: AtomicU64,
    /// Answers 429 (rate limited), all attempts counted.
    pub(crate) rate_limited: AtomicU64,
    /// Answers 4xx other than 429 (refused for good; a limit, when named, is logged).
    pub(crate) rejected: AtomicU64,
    /// Answers 5xx.
    pub(crate) server_errors: AtomicU64,
    /// Attempts with no answer (connection refused or reset, timeout).
    pub(crate) network_errors: AtomicU64,
    /// Requests accepted with an OTLP partial success (some profiles or samples rejected;
    /// counted in `profiles_sent` too, not retried, the message logged).
    pub(crate) partial_successes: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A copy of [`PyroscopeStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PyroscopeSnapshot {
    /// Profiles in the queue now, the one being sent included.
    pub profiles_queued: u64,
    /// Profiles the server accepted (2xx).
    pub profiles_sent: u64,
    /// Profiles the server refused permanently (4xx other than 429, 3xx): not retried.
    pub profiles_failed: u64,
    /// Profiles lost otherwise: pushed out of a full queue, larger than the whole queue,
    /// given up after the last attempt, or still queued when the shutdown timeout ran out.
    pub profiles_dropped: u64,
    /// Attempts after the first (resends of a profile).
    pub retries: u64,
    /// Bytes of encoded requests in the queue now (at most `max_queue_bytes`).
    pub bytes_queued: u64,
    /// Interval profiles larger than [`PyroscopeLimits`](super::PyroscopeLimits) allow,
    /// split into parts before sending.
    pub profiles_split: u64,
    /// Parts those profiles were split into.
    pub split_parts: u64,
    /// Pushes answered 429 that were replaced by two smaller ones (a push larger than the
    /// server's ingestion burst is refused every time: it is never resent as is).
    pub pushes_split: u64,
    /// Answers 429 (rate limited), all attempts counted.
    pub rate_limited: u64,
    /// Answers 4xx other than 429 (refused for good; a limit, when named, is logged).
    pub rejected: u64,
    /// Answers 5xx.
    pub server_errors: u64,
    /// Attempts with no answer (connection refused or reset, timeout).
    pub network_errors: u64,
    /// Requests accepted with an OTLP partial success (some profiles or samples rejected;
    /// counted in `profiles_sent` too, not retried, the message logged).
    pub partial_successes: u64,
}

impl PyroscopeStats {
    /// The counters now.
    pub fn snapshot(&self) -> PyroscopeSnapshot {
        PyroscopeSnapshot {
            profiles_queued: self.profiles_queued.load(Ordering::Relaxed),
            profiles_sent: self.profiles_sent.load(Ordering::Relaxed),
            profiles_failed: self.profiles_failed.load(Ordering::Relaxed),
            profiles_dropped: self.profiles_dropped.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            bytes_queued: self.bytes_queued.load(Ordering::Relaxed),
            profiles_split: self.profiles_split.load(Ordering::Relaxed),
            split_parts: self.split_parts.load(Ordering::Relaxed),
            pushes_split: self.pushes_split.load(Ordering::Relaxed),
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            server_errors: self.server_errors.load(Ordering::Relaxed),
            network_errors: self.network_errors.load(Ordering::Relaxed),
            partial_successes: self.partial_successes.load(Ordering::Relaxed),
        }
    }

    /// The last upload error (no credentials in it), if any upload failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

// Written only by the upload clients.
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl PyroscopeStats {
    pub(crate) fn set_last_error(&self, error: &str) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
