//! The exporter: validates the configuration, queues encoded pushes, owns the uploader.

use std::sync::Arc;

use crate::collector::{EncodedProfile, ProfileKind, ProfileSink};
use crate::pprof::{self, split::SplitLimits};

use super::pipeline::{Pipeline, StartError};
use super::uploader::{ClientError, Protocol, StatusClass};
use super::{
    proto, HttpClientError, PyroscopeConfig, PyroscopeError, PyroscopeLimits, PyroscopeStats,
    ALLOC_PROFILE_NAME, BLOCK_PROFILE_NAME,
};

/// Name of the uploader thread.
pub const UPLOADER_THREAD_NAME: &str = "otel-profiling-uploader";
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
    pipeline: Pipeline,
    labels: Vec<proto::LabelPair>,
    /// `labels` with `__name__` = [`BLOCK_PROFILE_NAME`], for blocked-in-poll profiles.
    block_labels: Vec<proto::LabelPair>,
    /// `labels` with `__name__` = [`ALLOC_PROFILE_NAME`] and `__delta__` = `false`, for
    /// allocation profiles.
    alloc_labels: Vec<proto::LabelPair>,
    limits: PyroscopeLimits,
    endpoint: String,
}

impl std::fmt::Debug for PyroscopeExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyroscopeExporter")
            .field("endpoint", &self.endpoint)
            .field("stats", &self.pipeline.stats().snapshot())
            .finish_non_exhaustive()
    }
}

impl PyroscopeExporter {
    /// Validates `config`, builds the HTTP client and starts the `otel-profiling-uploader`
    /// thread.
    pub fn new(config: PyroscopeConfig) -> Result<PyroscopeExporter, PyroscopeError> {
        let valid = config.validate_into()?;
        let labels: Vec<proto::LabelPair> = valid
            .labels
            .iter()
            .map(|(name, value)| proto::LabelPair {
                name: name.clone(),
                value: value.clone(),
            })
            .collect();
        let named = |profile_name: &str| -> Vec<proto::LabelPair> {
            labels
                .iter()
                .map(|label: &proto::LabelPair| proto::LabelPair {
                    name: label.name.clone(),
                    value: if label.name == "__name__" {
                        profile_name.to_string()
                    } else {
                        label.value.clone()
                    },
                })
                .collect()
        };
        let block_labels = named(BLOCK_PROFILE_NAME);
        let mut alloc_labels = named(ALLOC_PROFILE_NAME);
        // Each interval's allocations, not a running total: without it Pyroscope's
        // ingester takes `memory` alloc series as cumulative (Go's heap profile) and
        // subtracts one profile from the next (see `ALLOC_PROFILE_NAME`).
        alloc_labels.push(proto::LabelPair {
            name: "__delta__".to_string(),
            value: "false".to_string(),
        });
        alloc_labels.sort_by(|a, b| a.name.cmp(&b.name));
        let endpoint = valid.endpoint.to_string();
        let limits = valid.limits;
        let pipeline = Pipeline::start(
            valid.upload_settings(),
            Box::new(PushProtocol),
            valid.max_queue_bytes,
            valid.shutdown_timeout,
            UPLOADER_THREAD_NAME,
        )
        .map_err(|e| match e {
            StartError::Client(ClientError::Http(e)) => {
                PyroscopeError::HttpClient(HttpClientError::new(e))
            }
            StartError::Client(ClientError::Grpc(reason)) => PyroscopeError::Setting {
                field: "pyroscope.server_address",
                reason,
            },
            StartError::Client(ClientError::Tls(reason)) => PyroscopeError::Tls(reason),
            StartError::Thread(e) => PyroscopeError::Thread(e),
        })?;
        Ok(PyroscopeExporter {
            pipeline,
            labels,
            block_labels,
            alloc_labels,
            limits,
            endpoint,
        })
    }

    /// The counters, shared with the uploader thread. Clone the `Arc` before handing the
    /// exporter to the profiler; it stays readable after the exporter is gone.
    pub fn stats(&self) -> Arc<PyroscopeStats> {
        self.pipeline.stats().clone()
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
                let stats = self.pipeline.stats();
                PyroscopeStats::add(&stats.profiles_split, 1);
                PyroscopeStats::add(&stats.split_parts, parts.len() as u64);
                parts
                    .iter()
                    .filter_map(|p| {
                        pprof::proto::encode_gzip(p)
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
                ProfileKind::Alloc => &self.alloc_labels,
                _ => &self.labels,
            };
            let body = proto::encode_push_many(labels, &profiles);
            if let Err(e) = self.pipeline.enqueue(body) {
                result = Err(e);
            }
        }
        result
    }
}

/// Pyroscope's push API as the uploader speaks it: Connect errors, 429 and 5xx retried.
struct PushProtocol;

impl Protocol for PushProtocol {
    fn what(&self) -> &'static str {
        "pyroscope push"
    }

    fn classify(&self, status: reqwest::StatusCode) -> StatusClass {
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            StatusClass::RateLimited
        } else if status.is_server_error() {
            StatusClass::Retryable
        } else {
            StatusClass::Permanent
        }
    }

    fn error_detail(&self, body: &[u8]) -> String {
        super::uploader::connect_error_detail(body)
    }

    fn limit_hint(&self, message: &str) -> Option<&'static str> {
        super::uploader::pyroscope_limit_hint(message)
    }

    fn split(&self, plain: &[u8]) -> Option<[Vec<u8>; 2]> {
        proto::split_push(plain)
    }
}
