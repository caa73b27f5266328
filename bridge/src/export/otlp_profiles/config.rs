//! Settings of the OTLP profiles exporter: plain data in every build (the environment
//! reader and `Telemetry::otlp_profiles` fill them, see [`crate::config`]); their
//! validation comes with the exporter.

use std::fmt;
use std::time::Duration;

use crate::config::{ClientTls, OtlpProtocol};
use crate::export::pyroscope::{is_secret_header, PyroscopeBackoff, PyroscopeLimits};

/// Settings of [`OtlpProfilesExporter`](super::OtlpProfilesExporter). `Debug` hides the
/// values of headers whose names look secret.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OtlpProfilesConfig {
    /// For HTTP the full URL requests are posted to, e.g.
    /// `http://localhost:4040/v1development/profiles` (used verbatim, as OTel exporters use a
    /// signal-specific endpoint); for gRPC the server, e.g. `http://localhost:4317`.
    pub endpoint: String,
    /// Transport (default `http/protobuf`; gRPC needs the `otlp-grpc` feature).
    pub protocol: OtlpProtocol,
    /// Resource attributes (`service.name` first), string-valued.
    pub resource: Vec<(String, String)>,
    /// Extra HTTP headers (`OTEL_EXPORTER_OTLP_PROFILES_HEADERS`), e.g. `Authorization`,
    /// `X-Scope-OrgID`.
    pub headers: Vec<(String, String)>,
    /// Timeout of one request, connecting included (default 10 s, OTLP's default).
    pub request_timeout: Duration,
    /// Bound of the queue, in bytes of encoded requests (default 16 MiB).
    pub max_queue_bytes: usize,
    /// Retry policy (the Pyroscope exporter's).
    pub backoff: PyroscopeBackoff,
    /// How long dropping the exporter may spend sending what is queued (default 5 s).
    pub shutdown_timeout: Duration,
    /// What one profile may hold (the Pyroscope exporter's limits, Pyroscope's with a margin).
    pub limits: PyroscopeLimits,
    /// gzip requests (`OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION`, else
    /// `OTEL_EXPORTER_OTLP_COMPRESSION`: `gzip` or `none`). `None` (the default): gzip over
    /// HTTP, where Pyroscope and the Collector both accept it and profiles shrink about
    /// tenfold; none over gRPC, OTLP's default there.
    pub gzip: Option<bool>,
    /// Client TLS of an `https://` endpoint (`OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE`,
    /// `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`, else the generic ones).
    pub tls: ClientTls,
}

impl fmt::Debug for OtlpProfilesConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let shown = if is_secret_header(name) {
                    "***"
                } else {
                    value.as_str()
                };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("OtlpProfilesConfig")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("resource", &self.resource)
            .field("headers", &headers)
            .field("request_timeout", &self.request_timeout)
            .field("max_queue_bytes", &self.max_queue_bytes)
            .field("backoff", &self.backoff)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("limits", &self.limits)
            .field("gzip", &self.gzip)
            .field("tls", &self.tls)
            .finish()
    }
}

impl OtlpProfilesConfig {
    /// Settings for `endpoint` (the full URL) and `service_name`, everything else default.
    pub fn new(endpoint: impl Into<String>, service_name: impl Into<String>) -> Self {
        OtlpProfilesConfig {
            endpoint: endpoint.into(),
            protocol: OtlpProtocol::HttpProtobuf,
            resource: vec![("service.name".into(), service_name.into())],
            headers: Vec::new(),
            request_timeout: Duration::from_secs(10),
            max_queue_bytes: 16 << 20,
            backoff: PyroscopeBackoff::default(),
            shutdown_timeout: Duration::from_secs(5),
            limits: PyroscopeLimits::default(),
            gzip: None,
            tls: ClientTls::new(),
        }
    }

    /// Settings for a generic OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, or the traces
    /// endpoint): for HTTP the signal path `/v1development/profiles` is appended, as the
    /// OTel spec says for every signal; gRPC uses the endpoint as is.
    pub fn from_base(base: &str, protocol: OtlpProtocol, service_name: impl Into<String>) -> Self {
        let endpoint = match protocol {
            OtlpProtocol::HttpProtobuf => {
                format!("{}{}", base.trim_end_matches('/'), super::PROFILES_PATH)
            }
            OtlpProtocol::Grpc => base.to_string(),
        };
        OtlpProfilesConfig::new(endpoint, service_name).with_protocol(protocol)
    }

    /// Adds a resource attribute (a later `service.name` replaces the first).
    pub fn with_resource_attribute(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        let key = key.into();
        let value = value.into();
        match self.resource.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.resource.push((key, value)),
        }
        self
    }

    /// Sets the transport.
    pub fn with_protocol(mut self, protocol: OtlpProtocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Adds an HTTP header (gRPC metadata) to every request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// How long dropping the exporter may spend sending what is queued.
    pub fn with_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Sets the retry policy.
    pub fn with_backoff(mut self, backoff: PyroscopeBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets what one profile may hold.
    pub fn with_limits(mut self, limits: PyroscopeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Whether requests are gzipped (see [`gzip`](Self::gzip) for the default).
    pub fn with_gzip(mut self, gzip: bool) -> Self {
        self.gzip = Some(gzip);
        self
    }

    /// Sets the client TLS of an `https://` endpoint.
    pub fn with_tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// Sets the timeout of one request.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }
}
