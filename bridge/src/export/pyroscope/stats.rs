//! Counters of the Pyroscope exporter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Counters of one exporter, updated by `export` and the uploader thread.
///
/// Every push ends up in exactly one of `profiles_sent`, `profiles_failed` and
/// `profiles_dropped`, or is still counted in `profiles_queued`; once the exporter is
/// dropped the queue is empty, so those three add up to the pushes made. A profile within
/// the limits is one push; a split one is as many pushes as its parts needed (see
/// `profiles_split`). Fields are read one by one: a snapshot taken while uploads happen may be off
/// by the profile in transit.
#[derive(Debug, Default)]
pub struct PyroscopeStats {
    /// Profiles in the queue now, the one being sent included.
    pub profiles_queued: AtomicU64,
    /// Profiles the server accepted (2xx).
    pub profiles_sent: AtomicU64,
    /// Profiles the server refused permanently (4xx other than 429, 3xx): not retried.
    pub profiles_failed: AtomicU64,
    /// Profiles lost otherwise: pushed out of a full queue, larger than the whole queue,
    /// given up after the last attempt, or still queued when the shutdown timeout ran out.
    pub profiles_dropped: AtomicU64,
    /// Attempts after the first (resends of a profile).
    pub retries: AtomicU64,
    /// Bytes of encoded requests in the queue now (at most `max_queue_bytes`).
    pub bytes_queued: AtomicU64,
    /// Interval profiles larger than [`PyroscopeLimits`](super::PyroscopeLimits) allow,
    /// split into parts before sending.
    pub profiles_split: AtomicU64,
    /// Parts those profiles were split into.
    pub split_parts: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A copy of [`PyroscopeStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PyroscopeSnapshot {
    /// See [`PyroscopeStats::profiles_queued`].
    pub profiles_queued: u64,
    /// See [`PyroscopeStats::profiles_sent`].
    pub profiles_sent: u64,
    /// See [`PyroscopeStats::profiles_failed`].
    pub profiles_failed: u64,
    /// See [`PyroscopeStats::profiles_dropped`].
    pub profiles_dropped: u64,
    /// See [`PyroscopeStats::retries`].
    pub retries: u64,
    /// See [`PyroscopeStats::bytes_queued`].
    pub bytes_queued: u64,
    /// See [`PyroscopeStats::profiles_split`].
    pub profiles_split: u64,
    /// See [`PyroscopeStats::split_parts`].
    pub split_parts: u64,
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
        }
    }

    /// The last upload error (no credentials in it), if any upload failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

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
