//! The OTLP/HTTP profiles exporter: the Pyroscope exporter's pipeline with the OTLP
//! protocol.

use std::fmt;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::StatusCode;

use super::{convert, OtlpProfilesConfig};
use crate::collector::{EncodedProfile, ProfileSink};
use crate::config::OtlpProtocol;
use crate::export::pyroscope::pipeline::{Pipeline, StartError};
use crate::export::pyroscope::uploader::{
    ClientError, Protocol, StatusClass, Transport, UploadSettings,
};
use crate::export::pyroscope::{
    is_secret_header, HttpClientError, PyroscopeError, PyroscopeLimits, PyroscopeStats,
};
use crate::pprof::{self, split::SplitLimits};

/// Name of the OTLP profiles uploader thread.
pub const OTLP_UPLOADER_THREAD_NAME: &str = "otel-profiling-otlp-profiles";

impl OtlpProfilesConfig {
    fn settings(&self) -> Result<UploadSettings, PyroscopeError> {
        let endpoint = crate::config::parse_http_url(
            "otlp_profiles.endpoint",
            &self.endpoint,
            crate::config::otlp_profiles_url_example(self.protocol),
            "",
        )?;
        if self.request_timeout.is_zero() {
            return Err(PyroscopeError::Setting {
                field: "otlp_profiles.request_timeout",
                reason: "must be greater than 0".into(),
            });
        }
        if self.max_queue_bytes == 0 {
            return Err(PyroscopeError::Setting {
                field: "otlp_profiles.max_queue_bytes",
                reason: "must be greater than 0".into(),
            });
        }
        if self.backoff.max_attempts == 0 || self.backoff.initial.is_zero() {
            return Err(PyroscopeError::Setting {
                field: "otlp_profiles.backoff",
                reason: "needs at least one attempt and an initial wait above 0".into(),
            });
        }
        self.limits.validate()?;
        let transport = match self.protocol {
            OtlpProtocol::HttpProtobuf => Transport::Http,
            #[cfg(feature = "otlp-grpc")]
            OtlpProtocol::Grpc => Transport::Grpc,
            #[cfg(not(feature = "otlp-grpc"))]
            OtlpProtocol::Grpc => {
                return Err(PyroscopeError::Setting {
                    field: "otlp_profiles.protocol",
                    reason: "grpc needs the otel-profiling feature \"otlp-grpc\"".into(),
                })
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        // gzip by default over HTTP only (see `OtlpProfilesConfig::gzip`).
        let gzip = self.gzip.unwrap_or(transport == Transport::Http);
        if gzip && transport == Transport::Http {
            headers.insert(
                reqwest::header::CONTENT_ENCODING,
                HeaderValue::from_static("gzip"),
            );
        }
        for (name, value) in &self.headers {
            let header_error = |reason: &str| PyroscopeError::Header {
                name: name.clone(),
                reason: reason.to_string(),
            };
            let header = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| header_error("not a valid HTTP header name"))?;
            if [
                "content-type",
                "content-encoding",
                "content-length",
                "transfer-encoding",
                "host",
                "connection",
            ]
            .contains(&header.as_str())
            {
                return Err(header_error("set by the exporter; cannot be changed"));
            }
            let mut value = HeaderValue::from_str(value.trim())
                .map_err(|_| header_error("the value may only contain visible ASCII characters"))?;
            if is_secret_header(name) {
                value.set_sensitive(true);
            }
            headers.append(header, value);
        }
        Ok(UploadSettings {
            endpoint,
            headers,
            request_timeout: self.request_timeout,
            backoff: self.backoff,
            transport,
            gzip,
            tls: self.tls.clone(),
        })
    }
}

/// A [`ProfileSink`] that sends each interval's profiles as OTLP
/// `ExportProfilesServiceRequest`s from its own thread.
///
/// ```no_run
/// use otel_profiling::export::otlp_profiles::{OtlpProfilesConfig, OtlpProfilesExporter};
///
/// let config = OtlpProfilesConfig::new("http://localhost:4040/v1development/profiles", "checkout")
///     .with_resource_attribute("service.version", "1.4.2");
/// let exporter = OtlpProfilesExporter::new(config)?;
/// let stats = exporter.stats();
/// # Ok::<(), otel_profiling::export::pyroscope::PyroscopeError>(())
/// ```
pub struct OtlpProfilesExporter {
    pipeline: Pipeline,
    resource: Vec<(String, String)>,
    limits: PyroscopeLimits,
    endpoint: String,
}

impl fmt::Debug for OtlpProfilesExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpProfilesExporter")
            .field("endpoint", &self.endpoint)
            .field("stats", &self.pipeline.stats().snapshot())
            .finish_non_exhaustive()
    }
}

impl OtlpProfilesExporter {
    /// Validates `config`, builds the HTTP client and starts the uploader thread.
    pub fn new(config: OtlpProfilesConfig) -> Result<OtlpProfilesExporter, PyroscopeError> {
        let settings = config.settings()?;
        let endpoint = settings.endpoint.to_string();
        let pipeline = Pipeline::start(
            settings,
            Box::new(Otlp),
            config.max_queue_bytes,
            config.shutdown_timeout,
            OTLP_UPLOADER_THREAD_NAME,
        )
        .map_err(|e| match e {
            StartError::Client(ClientError::Http(e)) => {
                PyroscopeError::HttpClient(HttpClientError::new(e))
            }
            StartError::Client(ClientError::Grpc(reason)) => PyroscopeError::Setting {
                field: "otlp_profiles.endpoint",
                reason,
            },
            StartError::Client(ClientError::Tls(reason)) => PyroscopeError::Tls(reason),
            StartError::Thread(e) => PyroscopeError::Thread(e),
        })?;
        Ok(OtlpProfilesExporter {
            pipeline,
            resource: config.resource,
            limits: config.limits,
            endpoint,
        })
    }

    /// The counters (the same kind as the Pyroscope exporter's).
    pub fn stats(&self) -> Arc<PyroscopeStats> {
        self.pipeline.stats().clone()
    }

    /// The URL requests are posted to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// The encoded requests for one interval's profile: one per part within `limits`.
/// Splits are counted in `stats`.
pub(crate) fn requests(
    gzip_pprof: &[u8],
    resource: &[(String, String)],
    limits: PyroscopeLimits,
    stats: &PyroscopeStats,
) -> std::io::Result<Vec<Vec<u8>>> {
    let decoded = pprof::decode(gzip_pprof)?;
    let split = SplitLimits {
        max_samples: limits.max_samples_per_profile,
        max_bytes: limits.max_profile_bytes.min(limits.max_push_bytes),
    };
    let parts = if split.fits(&decoded) {
        vec![decoded]
    } else {
        let parts = pprof::split::split(&decoded, split);
        PyroscopeStats::add(&stats.profiles_split, 1);
        PyroscopeStats::add(&stats.split_parts, parts.len() as u64);
        parts
    };
    parts
        .iter()
        .map(|part| {
            convert::convert_profile(part, resource)
                .map(|request| request.encode_to_vec())
                .map_err(std::io::Error::other)
        })
        .collect()
}

impl ProfileSink for OtlpProfilesExporter {
    /// Converts the profile (split within the limits) and queues the requests; never waits
    /// for the network. A profile this crate cannot read is counted as dropped.
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        let stats = self.pipeline.stats().clone();
        let bodies = match requests(&profile.gzip_pprof, &self.resource, self.limits, &stats) {
            Ok(bodies) => bodies,
            Err(e) => {
                PyroscopeStats::add(&stats.profiles_dropped, 1);
                return Err(std::io::Error::other(format!(
                    "OTLP profiles: cannot convert the profile ({e}); dropped"
                )));
            }
        };
        let mut result = Ok(());
        for body in bodies {
            if let Err(e) = self.pipeline.enqueue(body) {
                result = Err(e);
            }
        }
        result
    }
}

/// Every profile of `request`.
fn profiles_mut(
    request: &mut ExportProfilesServiceRequest,
) -> impl Iterator<Item = &mut opentelemetry_proto::tonic::profiles::v1development::Profile> {
    request
        .resource_profiles
        .iter_mut()
        .flat_map(|r| r.scope_profiles.iter_mut())
        .flat_map(|s| s.profiles.iter_mut())
}

/// OTLP as the uploader speaks it (HTTP statuses here; gRPC codes are classified by the
/// uploader).
struct Otlp;

/// `google.rpc.Status`, the body of an OTLP/HTTP error answer (code 1, message 2).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

impl Protocol for Otlp {
    fn what(&self) -> &'static str {
        "OTLP profiles export"
    }

    /// The OTLP/HTTP spec's retryable statuses: 429, 502, 503, 504.
    fn classify(&self, status: StatusCode) -> StatusClass {
        match status.as_u16() {
            429 => StatusClass::RateLimited,
            502..=504 => StatusClass::Retryable,
            _ => StatusClass::Permanent,
        }
    }

    fn error_detail(&self, body: &[u8]) -> String {
        if body.is_empty() {
            return String::new();
        }
        match RpcStatus::decode(body) {
            Ok(status) if !status.message.is_empty() && status.message.is_ascii() => {
                format!(": {}", status.message.trim())
            }
            _ => {
                let text: String = String::from_utf8_lossy(body)
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .take(200)
                    .collect();
                format!(": {}", text.trim())
            }
        }
    }

    /// Two requests with the same resource and dictionary, each with half of every
    /// profile's samples.
    fn split(&self, plain: &[u8]) -> Option<[Vec<u8>; 2]> {
        let request = ExportProfilesServiceRequest::decode(plain).ok()?;
        let samples: usize = request
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .flat_map(|s| &s.profiles)
            .map(|p| p.samples.len())
            .sum();
        if samples < 2 {
            return None;
        }
        let mut first = request.clone();
        let mut second = request;
        for (a, b) in profiles_mut(&mut first).zip(profiles_mut(&mut second)) {
            let half = a.samples.len().div_ceil(2);
            a.samples.truncate(half);
            b.samples.drain(..half);
        }
        Some([first.encode_to_vec(), second.encode_to_vec()])
    }

    fn partial_success(&self, body: &[u8]) -> Option<String> {
        let response = ExportProfilesServiceResponse::decode(body).ok()?;
        let partial = response.partial_success?;
        if partial.rejected_profiles == 0 && partial.error_message.is_empty() {
            return None;
        }
        Some(format!(
            "{} profile(s) rejected{}",
            partial.rejected_profiles,
            if partial.error_message.is_empty() {
                String::new()
            } else {
                format!(": {}", partial.error_message)
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesPartialSuccess;
    use std::time::Duration;

    #[test]
    fn retry_classes_follow_the_otlp_spec() {
        let p = Otlp;
        for (code, class) in [
            (429, StatusClass::RateLimited),
            (502, StatusClass::Retryable),
            (503, StatusClass::Retryable),
            (504, StatusClass::Retryable),
            (500, StatusClass::Permanent),
            (400, StatusClass::Permanent),
            (413, StatusClass::Permanent),
        ] {
            let status = StatusCode::from_u16(code).expect("status");
            assert_eq!(p.classify(status), class, "{code}");
        }
        let body = RpcStatus {
            code: 3,
            message: "bad profile".into(),
        }
        .encode_to_vec();
        assert_eq!(p.error_detail(&body), ": bad profile");
        assert_eq!(p.error_detail(b""), "");
    }

    #[test]
    fn partial_success_is_reported_and_full_success_is_not() {
        let p = Otlp;
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 2,
                error_message: "too old".into(),
            }),
        };
        assert_eq!(
            p.partial_success(&partial.encode_to_vec()).as_deref(),
            Some("2 profile(s) rejected: too old")
        );
        assert_eq!(
            p.partial_success(&ExportProfilesServiceResponse::default().encode_to_vec()),
            None
        );
        assert_eq!(p.partial_success(b""), None);
    }

    #[test]
    fn a_split_request_carries_every_sample_once() {
        use crate::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
        use std::time::UNIX_EPOCH;
        let mut b = ProfileBuilder::new(10, UNIX_EPOCH, Duration::from_secs(1));
        for i in 0..5u64 {
            let frame = SymbolizedFrame {
                address: 0x100 + i,
                lines: vec![FrameLine {
                    function: format!("f{i}").into(),
                    file: None,
                    line: None,
                }],
            };
            let labels = SampleLabels {
                span_id: Some(i + 1),
                trace_id: Some(7),
                span_name: None,
            };
            b.add_sample(&[frame], &labels, i + 1);
        }
        let stats = PyroscopeStats::default();
        let bodies = requests(
            &pprof::encode_gzip(&b.build()).expect("encodes"),
            &[("service.name".into(), "svc".into())],
            PyroscopeLimits::default(),
            &stats,
        )
        .expect("converts");
        assert_eq!(bodies.len(), 1);
        let [a, b] = Otlp.split(&bodies[0]).expect("splits");
        let total = |bytes: &[u8]| -> i64 {
            let r = ExportProfilesServiceRequest::decode(bytes).expect("decodes");
            r.resource_profiles[0].scope_profiles[0].profiles[0]
                .samples
                .iter()
                .map(|s| s.values[0])
                .sum()
        };
        assert_eq!(total(&a) + total(&b), total(&bodies[0]));
        assert_eq!(total(&bodies[0]), 15);
        assert!(total(&a) > 0 && total(&b) > 0);
    }

    #[test]
    fn profiles_over_the_limits_are_split_like_the_push() {
        use crate::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
        use std::time::UNIX_EPOCH;
        let mut b = ProfileBuilder::new(10, UNIX_EPOCH, Duration::from_secs(1));
        for i in 0..30u64 {
            let frame = SymbolizedFrame {
                address: 0x100 + i,
                lines: vec![FrameLine {
                    function: format!("f{i}").into(),
                    file: None,
                    line: None,
                }],
            };
            b.add_sample(&[frame], &SampleLabels::default(), 1);
        }
        let stats = PyroscopeStats::default();
        let limits = PyroscopeLimits::default().with_max_samples_per_profile(10);
        let bodies = requests(
            &pprof::encode_gzip(&b.build()).expect("encodes"),
            &[],
            limits,
            &stats,
        )
        .expect("converts");
        assert_eq!(bodies.len(), 3);
        let s = stats.snapshot();
        assert_eq!((s.profiles_split, s.split_parts), (1, 3));
    }

    #[test]
    fn settings_refuse_bad_endpoints_and_headers() {
        let err = |c: OtlpProfilesConfig| c.settings().expect_err("refused").to_string();
        assert!(err(OtlpProfilesConfig::new("ftp://x", "s")).starts_with("otlp_profiles.endpoint"));
        assert!(err(OtlpProfilesConfig::new("http://u:p@x/", "s")).contains("credentials"));
        let e = err(OtlpProfilesConfig::new("http://x/", "s").with_header("Content-Type", "a"));
        assert!(e.contains("cannot be changed"), "{e}");
        let ok = OtlpProfilesConfig::new("http://x:4040/v1development/profiles", "s")
            .with_header("Authorization", "Bearer t")
            .settings()
            .expect("valid");
        assert_eq!(ok.endpoint.path(), "/v1development/profiles");
        let shown = format!(
            "{:?}",
            OtlpProfilesConfig::new("http://x/", "s").with_header("Authorization", "Bearer t")
        );
        assert!(!shown.contains("Bearer t"), "{shown}");
    }
}
