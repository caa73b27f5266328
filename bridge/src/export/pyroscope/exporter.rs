//! The exporter: validates the configuration, queues encoded pushes, owns the uploader.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::collector::{EncodedProfile, ProfileKind, ProfileSink};
use crate::pprof::{self, split::SplitLimits};

use super::queue::{Enqueued, Shared};
use super::{
    proto, uploader, PyroscopeConfig, PyroscopeError, PyroscopeLimits, PyroscopeStats,
    BLOCK_PROFILE_NAME,
};

/// Name of the uploader thread.
pub const UPLOADER_THREAD_NAME: &str = "otel-profiling-uploader";

/// How much longer than the shutdown timeout `drop` waits for the uploader to finish on its
/// own before leaving it behind.
const DROP_SLACK: Duration = Duration::from_millis(200);

/// A [`ProfileSink`] that pushes profiles to Pyroscope from its own thread.
///
/// ```no_run
/// use otel_profiling::export::pyroscope::{PyroscopeConfig, PyroscopeExporter};
///
/// let config = PyroscopeConfig::new("http://localhost:4040", "checkout")
///     .with_label("service_version", "1.4.2");
/// let exporter = PyroscopeExporter::new(config)?;
/// let stats = exporter.stats(); // keep a handle before giving the exporter away
/// // Profiler::builder().sink(exporter)…
/// # Ok::<(), otel_profiling::export::pyroscope::PyroscopeError>(())
/// ```
pub struct PyroscopeExporter {
    shared: Arc<Shared>,
    labels: Vec<proto::LabelPair>,
    /// `labels` with `__name__` = [`BLOCK_PROFILE_NAME`], for blocked-in-poll profiles.
    block_labels: Vec<proto::LabelPair>,
    limits: PyroscopeLimits,
    endpoint: String,
    shutdown_timeout: Duration,
    thread: Option<JoinHandle<()>>,
    done: mpsc::Receiver<()>,
}

impl std::fmt::Debug for PyroscopeExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyroscopeExporter")
            .field("endpoint", &self.endpoint)
            .field("stats", &self.shared.stats.snapshot())
            .finish_non_exhaustive()
    }
}

impl PyroscopeExporter {
    /// Validates `config`, builds the HTTP client and starts the `otel-profiling-uploader`
    /// thread.
    pub fn new(config: PyroscopeConfig) -> Result<PyroscopeExporter, PyroscopeError> {
        let valid = config.validate_into()?;
        let shared = Arc::new(Shared::new(valid.max_queue_bytes));
        let labels: Vec<proto::LabelPair> = valid
            .labels
            .iter()
            .map(|(name, value)| proto::LabelPair {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
        let block_labels = labels
            .iter()
            .map(|label: &proto::LabelPair| proto::LabelPair {
                name: label.name.clone(),
                value: if label.name == "__name__" {
                    BLOCK_PROFILE_NAME.to_string()
                } else {
                    label.value.clone()
                },
            })
            .collect();
        let endpoint = valid.endpoint.to_string();
        let shutdown_timeout = valid.shutdown_timeout;
        let limits = valid.limits;
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (done_tx, done) = mpsc::sync_channel(1);
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(UPLOADER_THREAD_NAME.into())
            .spawn(move || uploader::run(valid, thread_shared, ready_tx, done_tx))
            .map_err(PyroscopeError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(PyroscopeError::HttpClient(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(PyroscopeError::Thread(std::io::Error::other(
                    "the uploader thread ended while starting",
                )));
            }
        }
        Ok(PyroscopeExporter {
            shared,
            labels,
            block_labels,
            limits,
            endpoint,
            shutdown_timeout,
            thread: Some(thread),
            done,
        })
    }

    /// The counters, shared with the uploader thread. Clone the `Arc` before handing the
    /// exporter to the profiler; it stays readable after the exporter is gone.
    pub fn stats(&self) -> Arc<PyroscopeStats> {
        self.shared.stats.clone()
    }

    /// The gzipped profiles of each push for `profile`: the profile itself when it fits
    /// [`PyroscopeLimits`], else its parts, one per push.
    fn pushes(&self, profile: &EncodedProfile) -> Vec<Vec<Vec<u8>>> {
        let limits = self.limits;
        let split = SplitLimits {
            max_samples: limits.max_samples_per_profile,
            max_bytes: limits.max_profile_bytes.min(limits.max_push_bytes),
        };
        // (gzipped bytes, uncompressed size) of each part.
        let parts: Vec<(Vec<u8>, usize)> = match pprof::decode(&profile.gzip_pprof) {
            Ok(decoded) if !split.fits(&decoded) => {
                let parts = pprof::split::split(&decoded, split);
                PyroscopeStats::add(&self.shared.stats.profiles_split, 1);
                PyroscopeStats::add(&self.shared.stats.split_parts, parts.len() as u64);
                parts
                    .iter()
                    .filter_map(|p| {
                        pprof::encode_gzip(p)
                            .ok()
                            .map(|gz| (gz, prost::Message::encoded_len(p)))
                    })
                    .collect()
            }
            Ok(decoded) => vec![(
                profile.gzip_pprof.clone(),
                prost::Message::encoded_len(&decoded),
            )],
            // Not a profile this crate can read (a custom sink's bytes): pushed as given.
            Err(_) => vec![(profile.gzip_pprof.clone(), profile.gzip_pprof.len())],
        };
        // One profile per push: Pyroscope charges and stores each profile of a push on its
        // own, answering an error if any failed, so resending a push of several could
        // store some twice. (`max_push_bytes` bounds each part through `split`.)
        parts.into_iter().map(|(gz, _)| vec![gz]).collect()
    }

    /// The URL profiles are posted to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl ProfileSink for PyroscopeExporter {
    /// Encodes the push request and queues it; never waits for the network.
    ///
    /// Fails only when the profile is larger than the whole queue or the uploader has
    /// stopped; the profile is then counted as dropped.
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        let mut result = Ok(());
        for push in self.pushes(profile) {
            let profiles: Vec<(&[u8], String)> = push
                .iter()
                .map(|part| (part.as_slice(), uuid::Uuid::new_v4().to_string()))
                .collect();
            // Same service labels; the profile type's name tells CPU from blocked.
            let labels = match profile.kind {
                ProfileKind::Blocked => &self.block_labels,
                _ => &self.labels,
            };
            let body = proto::encode_push_many(labels, &profiles);
            let error = match self.shared.enqueue(body) {
                Enqueued::Queued => continue,
                Enqueued::TooLarge { size, max } => format!(
                    "pyroscope: profile request of {size} bytes exceeds max_queue_bytes ({max}); dropped"
                ),
                Enqueued::Stopped => "pyroscope: the uploader has stopped; profile dropped".into(),
            };
            result = Err(std::io::Error::other(error));
        }
        result
    }
}

impl Drop for PyroscopeExporter {
    fn drop(&mut self) {
        let deadline = Instant::now() + self.shutdown_timeout;
        self.shared.begin_shutdown(deadline);
        match self.done.recv_timeout(self.shutdown_timeout + DROP_SLACK) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(thread) = self.thread.take() {
                    // The thread signals `done` as its very last step: this join is short.
                    let _ = thread.join();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                // Stuck in a request that started before the shutdown: leave it behind.
                let dropped = self.shared.abandon();
                eprintln!(
                    "otel-profiling: pyroscope uploader did not finish within the shutdown \
                     timeout ({:?}); {dropped} queued profile(s) dropped",
                    self.shutdown_timeout
                );
                self.thread.take();
            }
        }
    }
}
