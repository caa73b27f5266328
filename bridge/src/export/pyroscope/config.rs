//! Settings of the Pyroscope exporter, and their validation.
//!
//! The settings are plain data in every build (the environment reader fills them, see
//! [`crate::config`]); their validation, which builds the request headers and the push URL,
//! comes with the HTTP exporters (the `pyroscope` or `otlp-http` feature).

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
use reqwest::Url;

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
use super::error::PyroscopeError;
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
use super::PROFILE_NAME;

/// Path of the push RPC, relative to the server address.
pub(crate) const PUSH_PATH: &str = "push.v1.PusherService/Push";

/// Credentials for the Pyroscope server.
///
/// `Debug` shows the user name but never the password or the token.
#[derive(Clone, PartialEq, Eq)]
pub enum PyroscopeAuth {
    /// HTTP basic authentication (`Authorization: Basic base64(user:password)`), e.g.
    /// Grafana Cloud's instance id and access token.
    Basic {
        /// User name.
        user: String,
        /// Password or access token.
        password: String,
    },
    /// A bearer token (`Authorization: Bearer <token>`).
    Bearer(String),
}

impl fmt::Debug for PyroscopeAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyroscopeAuth::Basic { user, .. } => f
                .debug_struct("Basic")
                .field("user", user)
                .field("password", &Redacted)
                .finish(),
            PyroscopeAuth::Bearer(_) => f.debug_tuple("Bearer").field(&Redacted).finish(),
        }
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl PyroscopeAuth {
    /// The `Authorization` header value, marked sensitive.
    fn header_value(&self) -> Result<HeaderValue, PyroscopeError> {
        let text = match self {
            PyroscopeAuth::Basic { user, password } => {
                format!("Basic {}", base64(format!("{user}:{password}").as_bytes()))
            }
            PyroscopeAuth::Bearer(token) => format!("Bearer {token}"),
        };
        let mut value = HeaderValue::from_str(&text).map_err(|_| PyroscopeError::Setting {
            field: "pyroscope.auth",
            reason: "credentials may only contain visible ASCII characters".into(),
        })?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// Retry policy: exponential backoff with full jitter.
///
/// Before retry *n* (1-based) the uploader waits a random time in
/// `[0, min(max, initial × 2^(n-1))]`, or what a 429's `Retry-After` asks (capped by `max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PyroscopeBackoff {
    /// Cap of the first wait (default 500 ms).
    pub initial: Duration,
    /// Cap of any wait (default 30 s).
    pub max: Duration,
    /// Attempts per profile, the first included, before it is dropped (default 8).
    pub max_attempts: u32,
}

impl Default for PyroscopeBackoff {
    fn default() -> Self {
        PyroscopeBackoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            max_attempts: 8,
        }
    }
}

impl PyroscopeBackoff {
    /// A policy with these bounds.
    pub fn new(initial: Duration, max: Duration, max_attempts: u32) -> Self {
        PyroscopeBackoff {
            initial,
            max,
            max_attempts,
        }
    }

    /// The cap of the wait before retry `retry` (1-based).
    pub(crate) fn cap(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// Settings of [`PyroscopeExporter`](super::PyroscopeExporter).
///
/// Checked by [`PyroscopeConfig::validate`] (and so by `PyroscopeExporter::new`); errors name
/// the setting. `Debug` hides the password, the token and the values of headers whose names
/// look secret (containing `auth`, `token`, `key`, `secret`, `password`, `cookie` or
/// `credential`).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PyroscopeConfig {
    /// Base URL of the server, e.g. `http://localhost:4040` (`http` or `https`, optionally
    /// with a path prefix; no query, no credentials).
    pub server_address: String,
    /// Application name: the `service_name` series label. Required.
    pub application_name: String,
    /// Extra series labels, in order; a later duplicate name replaces an earlier one, and a
    /// label with an empty value is left out. Names follow Prometheus
    /// (`[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__`).
    pub labels: Vec<(String, String)>,
    /// Credentials, if any.
    pub auth: Option<PyroscopeAuth>,
    /// Tenant id, sent as `X-Scope-OrgID`.
    pub tenant_id: Option<String>,
    /// Extra HTTP headers.
    pub headers: Vec<(String, String)>,
    /// Timeout of one request, connecting included (default 10 s).
    pub request_timeout: Duration,
    /// Bound of the queue, in bytes of encoded requests (default 16 MiB).
    pub max_queue_bytes: usize,
    /// Retry policy.
    pub backoff: PyroscopeBackoff,
    /// How long dropping the exporter may spend sending what is queued (default 5 s).
    pub shutdown_timeout: Duration,
    /// What one profile and one push may hold (default: Pyroscope's limits with a margin).
    pub limits: PyroscopeLimits,
}

impl fmt::Debug for PyroscopeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<(&str, &dyn fmt::Debug)> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let shown: &dyn fmt::Debug = if is_secret_header(name) {
                    &Redacted
                } else {
                    value
                };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("PyroscopeConfig")
            .field("server_address", &self.server_address)
            .field("application_name", &self.application_name)
            .field("labels", &self.labels)
            .field("auth", &self.auth)
            .field("tenant_id", &self.tenant_id)
            .field("headers", &headers)
            .field("request_timeout", &self.request_timeout)
            .field("max_queue_bytes", &self.max_queue_bytes)
            .field("backoff", &self.backoff)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Prints `***`.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// Whether a header's value must not be shown.
pub(crate) fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "auth",
        "token",
        "key",
        "secret",
        "password",
        "cookie",
        "credential",
    ]
    .iter()
    .any(|word| name.contains(word))
}

impl PyroscopeConfig {
    /// Settings for `server_address` and `application_name`, everything else default.
    pub fn new(server_address: impl Into<String>, application_name: impl Into<String>) -> Self {
        PyroscopeConfig {
            server_address: server_address.into(),
            application_name: application_name.into(),
            labels: Vec::new(),
            auth: None,
            tenant_id: None,
            headers: Vec::new(),
            request_timeout: Duration::from_secs(10),
            max_queue_bytes: 16 << 20,
            backoff: PyroscopeBackoff::default(),
            shutdown_timeout: Duration::from_secs(5),
            limits: PyroscopeLimits::default(),
        }
    }

    /// Adds a series label.
    pub fn with_label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((name.into(), value.into()));
        self
    }

    /// Adds series labels.
    pub fn with_labels<K, V>(mut self, labels: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.labels
            .extend(labels.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Sets the credentials.
    pub fn with_auth(mut self, auth: PyroscopeAuth) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Sets HTTP basic authentication.
    pub fn with_basic_auth(self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.with_auth(PyroscopeAuth::Basic {
            user: user.into(),
            password: password.into(),
        })
    }

    /// Sets a bearer token.
    pub fn with_bearer_token(self, token: impl Into<String>) -> Self {
        self.with_auth(PyroscopeAuth::Bearer(token.into()))
    }

    /// Sets the tenant id (`X-Scope-OrgID`).
    pub fn with_tenant_id(mut self, tenant_id: impl Into<String>) -> Self {
        self.tenant_id = Some(tenant_id.into());
        self
    }

    /// Adds an HTTP header to every request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the timeout of one request.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the bound of the queue, in bytes.
    pub fn with_max_queue_bytes(mut self, bytes: usize) -> Self {
        self.max_queue_bytes = bytes;
        self
    }

    /// Sets the retry policy.
    pub fn with_backoff(mut self, backoff: PyroscopeBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets what one profile and one push may hold.
    pub fn with_limits(mut self, limits: PyroscopeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// How long dropping the exporter may spend sending what is queued.
    pub fn with_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl PyroscopeConfig {
    /// Checks every setting; the error names the first bad one.
    pub fn validate(&self) -> Result<(), PyroscopeError> {
        self.clone().validate_into().map(|_| ())
    }

    /// Checks and converts the settings for the uploader.
    pub(crate) fn validate_into(self) -> Result<ValidConfig, PyroscopeError> {
        let endpoint = push_endpoint(&self.server_address)?;
        if self.application_name.trim().is_empty() {
            return Err(PyroscopeError::EmptyApplicationName);
        }
        let labels = checked_series_labels(&self.application_name, &self.labels)?;
        let headers = self.request_headers()?;
        if self.request_timeout.is_zero() {
            return Err(setting(
                "pyroscope.request_timeout",
                "must be greater than 0",
            ));
        }
        if self.max_queue_bytes == 0 {
            return Err(setting(
                "pyroscope.max_queue_bytes",
                "must be greater than 0",
            ));
        }
        self.limits.validate()?;
        let backoff = self.backoff;
        if backoff.max_attempts == 0 {
            return Err(setting(
                "pyroscope.backoff.max_attempts",
                "must be at least 1",
            ));
        }
        if backoff.initial.is_zero() {
            return Err(setting(
                "pyroscope.backoff.initial",
                "must be greater than 0",
            ));
        }
        if backoff.max < backoff.initial {
            return Err(setting(
                "pyroscope.backoff.max",
                "must not be less than the initial backoff",
            ));
        }
        Ok(ValidConfig {
            endpoint,
            labels,
            headers,
            request_timeout: self.request_timeout,
            max_queue_bytes: self.max_queue_bytes,
            backoff,
            shutdown_timeout: self.shutdown_timeout,
            limits: self.limits,
        })
    }

    /// The headers every push carries, `User-Agent` aside (set on the client).
    fn request_headers(&self) -> Result<HeaderMap, PyroscopeError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/proto"),
        );
        headers.insert(
            reqwest::header::CONTENT_ENCODING,
            HeaderValue::from_static("gzip"),
        );
        headers.insert(
            HeaderName::from_static("connect-protocol-version"),
            HeaderValue::from_static("1"),
        );
        for (name, value) in &self.headers {
            let header_error = |reason: &str| PyroscopeError::Header {
                name: name.clone(),
                reason: reason.to_string(),
            };
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| header_error("not a valid HTTP header name"))?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(header_error("set by the exporter; cannot be changed"));
            }
            if header == reqwest::header::AUTHORIZATION && self.auth.is_some() {
                return Err(header_error("conflicts with pyroscope.auth"));
            }
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| header_error("the value may only contain visible ASCII characters"))?;
            if is_secret_header(name) {
                value.set_sensitive(true);
            }
            headers.append(header, value);
        }
        if let Some(auth) = &self.auth {
            headers.insert(reqwest::header::AUTHORIZATION, auth.header_value()?);
        }
        if let Some(tenant) = &self.tenant_id {
            if tenant.is_empty() {
                return Err(setting("pyroscope.tenant_id", "must not be empty"));
            }
            let value = HeaderValue::from_str(tenant).map_err(|_| {
                setting(
                    "pyroscope.tenant_id",
                    "may only contain visible ASCII characters",
                )
            })?;
            headers.insert(HeaderName::from_static("x-scope-orgid"), value);
        }
        Ok(headers)
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// Headers the protocol needs as the exporter sets them.
const RESERVED_HEADERS: [&str; 7] = [
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
    "connect-protocol-version",
];

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
fn setting(field: &'static str, reason: &str) -> PyroscopeError {
    PyroscopeError::Setting {
        field,
        reason: reason.to_string(),
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl ValidConfig {
    /// What the uploader thread needs.
    pub(crate) fn upload_settings(&self) -> super::uploader::UploadSettings {
        super::uploader::UploadSettings {
            endpoint: self.endpoint.clone(),
            headers: self.headers.clone(),
            request_timeout: self.request_timeout,
            backoff: self.backoff,
            transport: super::uploader::Transport::Http,
            gzip: true,
            tls: crate::config::ClientTls::new(),
        }
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// Settings after validation, as the exporter and its thread use them.
#[derive(Debug)]
pub(crate) struct ValidConfig {
    /// `{server}/push.v1.PusherService/Push`.
    pub(crate) endpoint: Url,
    /// Series labels, sorted by name, names unique.
    pub(crate) labels: Vec<(String, String)>,
    /// Headers of every request (credentials marked sensitive).
    pub(crate) headers: HeaderMap,
    pub(crate) request_timeout: Duration,
    pub(crate) max_queue_bytes: usize,
    pub(crate) backoff: PyroscopeBackoff,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) limits: PyroscopeLimits,
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// The push URL for a server address, checked by the crate's one URL validator
/// ([`crate::config::parse_url`]: `http`/`https`, a host, no credentials, no query).
pub(crate) fn push_endpoint(address: &str) -> Result<Url, PyroscopeError> {
    Ok(crate::config::parse_http_url(
        "pyroscope.server_address",
        address,
        crate::config::PYROSCOPE_URL_EXAMPLE,
        &format!("/{PUSH_PATH}"),
    )?)
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// `__name__`, `service_name` and the extra labels: later names replace earlier ones,
/// empty values are left out, sorted by name.
pub(crate) fn checked_series_labels(
    application: &str,
    extra: &[(String, String)],
) -> Result<Vec<(String, String)>, PyroscopeError> {
    let mut labels = BTreeMap::new();
    labels.insert("__name__".to_string(), PROFILE_NAME.to_string());
    labels.insert("service_name".to_string(), application.to_string());
    for (name, value) in extra {
        if let Some(reason) = label_name_problem(name) {
            return Err(PyroscopeError::LabelName {
                name: name.clone(),
                reason,
            });
        }
        if !value.is_empty() {
            labels.insert(name.clone(), value.clone());
        }
    }
    for (name, value) in &labels {
        if value.len() > MAX_LABEL_VALUE_BYTES {
            return Err(PyroscopeError::LabelValueTooLong {
                name: name.clone(),
                len: value.len(),
                limit: MAX_LABEL_VALUE_BYTES,
            });
        }
    }
    // Pyroscope turns the `span_name` sample label into a series label: keep room for it.
    let count = labels.len() + usize::from(!labels.contains_key("span_name"));
    if count > MAX_LABEL_NAMES {
        return Err(PyroscopeError::TooManyLabels {
            count,
            names: labels.keys().cloned().collect::<Vec<_>>().join(", "),
            limit: MAX_LABEL_NAMES,
        });
    }
    Ok(labels.into_iter().collect())
}

/// Longest label value Pyroscope accepts (`validation.max-label-value-length`, default).
/// Longer `span_name` sample values are cut by the collector; series labels from the
/// configuration are refused at setup.
pub const MAX_LABEL_VALUE_BYTES: usize = 2048;
/// Most label names per series Pyroscope accepts (`validation.max-label-names-per-series`).
pub const MAX_LABEL_NAMES: usize = 30;

/// How big one push may be, so that Grafana Pyroscope accepts it whole.
///
/// Pyroscope's defaults (v2.2.1): a profile holds at most 16,000 samples
/// (`validation.max-profile-stacktrace-samples`) and 4 MiB uncompressed
/// (`validation.max-profile-size-bytes`), and a tenant's ingestion limiter
/// (`distributor.rateLimit`: 4 MiB/s, burst 2 MiB per distributor) charges each profile
/// its series labels plus its uncompressed size at once, so a profile costing more than
/// the burst is refused with 429 every time. Each interval's profile is split into parts
/// within these limits and each part is sent as its own push (Pyroscope stores the
/// profiles of a push one by one, so resending a push of several after an error could
/// store some twice); every sample, its labels and the interval's timestamps are kept.
/// The defaults keep a margin under Pyroscope's: lower them if your server's are lower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PyroscopeLimits {
    /// Samples per profile at most (default 15,000).
    pub max_samples_per_profile: usize,
    /// Uncompressed bytes per profile at most (default 1.5 MiB: within the push limit).
    pub max_profile_bytes: usize,
    /// Uncompressed bytes per push at most (default 1.5 MiB, under the 2 MiB ingestion
    /// burst with room for the series labels); a push carries one profile, so this also
    /// bounds each profile.
    pub max_push_bytes: usize,
}

impl Default for PyroscopeLimits {
    fn default() -> Self {
        PyroscopeLimits {
            max_samples_per_profile: 15_000,
            max_profile_bytes: 1536 * 1024,
            max_push_bytes: 1536 * 1024,
        }
    }
}

impl PyroscopeLimits {
    /// Sets the samples per profile.
    pub fn with_max_samples_per_profile(mut self, samples: usize) -> Self {
        self.max_samples_per_profile = samples;
        self
    }

    /// Sets the uncompressed bytes per profile.
    pub fn with_max_profile_bytes(mut self, bytes: usize) -> Self {
        self.max_profile_bytes = bytes;
        self
    }

    /// Sets the uncompressed bytes per push.
    pub fn with_max_push_bytes(mut self, bytes: usize) -> Self {
        self.max_push_bytes = bytes;
        self
    }

    #[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
    pub(crate) fn validate(&self) -> Result<(), PyroscopeError> {
        if self.max_samples_per_profile == 0 {
            return Err(setting(
                "pyroscope.limits.max_samples_per_profile",
                "must be at least 1",
            ));
        }
        if self.max_profile_bytes < 1024 {
            return Err(setting(
                "pyroscope.limits.max_profile_bytes",
                "must be at least 1024",
            ));
        }
        if self.max_push_bytes < self.max_profile_bytes {
            return Err(setting(
                "pyroscope.limits.max_push_bytes",
                "must be at least max_profile_bytes (a push holds one profile or more)",
            ));
        }
        Ok(())
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// Why `name` is not a usable series label name, if it is not.
fn label_name_problem(name: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    let valid = match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        _ => false,
    };
    if !valid {
        Some("must match [a-zA-Z_][a-zA-Z0-9_]*")
    } else if name.starts_with("__") {
        Some("names starting with __ are reserved")
    } else {
        None
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// Standard base64 with padding (RFC 4648 §4), for basic authentication.
fn base64(input: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(input)
}

#[cfg(all(test, any(feature = "pyroscope", feature = "otlp-http")))]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    #[test]
    fn endpoint_keeps_a_path_prefix() {
        let url = push_endpoint("https://example.com/pyroscope/").expect("valid");
        assert_eq!(
            url.as_str(),
            "https://example.com/pyroscope/push.v1.PusherService/Push"
        );
        let url = push_endpoint("http://localhost:4040").expect("valid");
        assert_eq!(
            url.as_str(),
            "http://localhost:4040/push.v1.PusherService/Push"
        );
    }

    #[test]
    fn endpoint_rejects_credentials_without_echoing_them() {
        let err = push_endpoint("http://u:s3cret@localhost:4040")
            .expect_err("credentials")
            .to_string();
        assert!(err.starts_with("pyroscope.server_address"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn labels_are_sorted_unique_and_later_wins() {
        let extra = vec![
            ("zone".to_string(), "a".to_string()),
            ("env".to_string(), "dev".to_string()),
            ("zone".to_string(), "b".to_string()),
            ("dropped".to_string(), String::new()),
        ];
        let labels = checked_series_labels("app", &extra).expect("valid");
        let names: Vec<&str> = labels.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["__name__", "env", "service_name", "zone"]);
        assert_eq!(labels[3].1, "b");
    }

    #[test]
    fn label_names_follow_prometheus() {
        for bad in ["", "1a", "a-b", "a.b", "__x", "é"] {
            assert!(label_name_problem(bad).is_some(), "{bad:?}");
        }
        for good in ["a", "_a", "A_1", "service_version"] {
            assert!(label_name_problem(good).is_none(), "{good:?}");
        }
    }

    #[test]
    fn series_labels_over_pyroscope_limits_are_refused_naming_the_label() {
        let long = "v".repeat(MAX_LABEL_VALUE_BYTES + 1);
        let err = checked_series_labels("checkout", &[("region".into(), long)]).unwrap_err();
        assert!(
            matches!(err, PyroscopeError::LabelValueTooLong { ref name, len: 2049, limit: 2048 } if name == "region"),
            "{err}"
        );
        assert!(err.to_string().contains("\"region\""), "{err}");
        let err = checked_series_labels(&"s".repeat(3000), &[]).unwrap_err();
        assert!(err.to_string().contains("service_name"), "{err}");
        let fits = "v".repeat(MAX_LABEL_VALUE_BYTES);
        assert!(checked_series_labels("checkout", &[("region".into(), fits)]).is_ok());
        // __name__ and service_name, room for span_name: 27 more fit, 28 do not.
        let many = |n: usize| -> Vec<(String, String)> {
            (0..n).map(|i| (format!("label_{i}"), "x".into())).collect()
        };
        assert!(checked_series_labels("checkout", &many(27)).is_ok());
        let err = checked_series_labels("checkout", &many(28)).unwrap_err();
        assert!(
            matches!(
                err,
                PyroscopeError::TooManyLabels {
                    count: 31,
                    limit: 30,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("max-label-names-per-series"),
            "{err}"
        );
        // A configured span_name series label takes the reserved place itself.
        let mut with_span_name = many(27);
        with_span_name.push(("span_name".into(), "GET /".into()));
        assert!(checked_series_labels("checkout", &with_span_name).is_ok());
    }

    #[test]
    fn limits_are_checked_with_the_field_named() {
        let config = |limits: PyroscopeLimits| {
            PyroscopeConfig::new("http://localhost:4040", "checkout")
                .with_limits(limits)
                .validate()
        };
        assert!(config(PyroscopeLimits::default()).is_ok());
        let err = config(PyroscopeLimits::default().with_max_samples_per_profile(0)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pyroscope.limits.max_samples_per_profile"),
            "{err}"
        );
        let err = config(PyroscopeLimits::default().with_max_profile_bytes(10)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pyroscope.limits.max_profile_bytes"),
            "{err}"
        );
        let err = config(PyroscopeLimits::default().with_max_push_bytes(4096)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pyroscope.limits.max_push_bytes"),
            "{err}"
        );
    }

    #[test]
    fn backoff_caps_grow_and_saturate() {
        let b = PyroscopeBackoff::new(Duration::from_millis(500), Duration::from_secs(30), 8);
        assert_eq!(b.cap(1), Duration::from_millis(500));
        assert_eq!(b.cap(2), Duration::from_secs(1));
        assert_eq!(b.cap(4), Duration::from_secs(4));
        assert_eq!(b.cap(7), Duration::from_secs(30));
        assert_eq!(b.cap(100), Duration::from_secs(30));
    }

    #[test]
    fn secret_headers_are_recognised() {
        for name in [
            "Authorization",
            "X-Api-Key",
            "x-auth-token",
            "X-Secret",
            "Cookie",
        ] {
            assert!(is_secret_header(name), "{name}");
        }
        assert!(!is_secret_header("X-Scope-OrgID"));
    }
}
