//! Errors of the Pyroscope exporter's construction.

/// Why a [`PyroscopeExporter`](super::PyroscopeExporter) could not be built. Each message
/// starts with the setting at fault (`pyroscope.server_address: …`) and never contains a
/// credential.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PyroscopeError {
    /// A URL setting (`pyroscope.server_address`, `otlp_profiles.endpoint`) is not an
    /// `http`/`https` URL with a host and without credentials, query or fragment: the
    /// crate's one URL check, the one the environment reader uses too. Names the setting;
    /// credentials in the URL are shown as `***`.
    #[error(transparent)]
    Url(#[from] crate::config::ConfigError),
    /// The application name (the `service_name` label) is empty.
    #[error("pyroscope.application_name: must not be empty")]
    EmptyApplicationName,
    /// An extra series label has an unusable name.
    #[error("pyroscope.labels: invalid label name {name:?}: {reason}")]
    LabelName {
        /// The label name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A series label's value is longer than Pyroscope accepts.
    #[error(
        "pyroscope.labels: the value of label {name:?} is {len} bytes; Pyroscope accepts at \
         most {limit} (validation.max-label-value-length)"
    )]
    LabelValueTooLong {
        /// The label name.
        name: String,
        /// The value's length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// More series labels than Pyroscope accepts.
    #[error(
        "pyroscope.labels: {count} series labels ({names}); Pyroscope accepts at most {limit} \
         per series (validation.max-label-names-per-series), one of them kept free for \
         span_name"
    )]
    TooManyLabels {
        /// Labels the series would carry (`__name__`, `service_name` and `span_name` included).
        count: usize,
        /// Their names.
        names: String,
        /// The limit.
        limit: usize,
    },
    /// An extra HTTP header is malformed or reserved.
    #[error("pyroscope.headers: header {name:?}: {reason}")]
    Header {
        /// The header name.
        name: String,
        /// What is wrong (the value is never shown).
        reason: String,
    },
    /// Another setting is out of range.
    #[error("{field}: {reason}")]
    Setting {
        /// The setting, e.g. `pyroscope.request_timeout`.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The HTTP client could not be built (TLS setup).
    #[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
    #[error("pyroscope: cannot build the HTTP client: {0}")]
    HttpClient(#[source] HttpClientError),
    /// The TLS stack refused the client TLS files (the message names the setting).
    #[error("{0}")]
    Tls(String),
    /// The uploader thread could not be started.
    #[error("pyroscope: cannot start the uploader thread: {0}")]
    Thread(#[source] std::io::Error),
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
/// Why the HTTP client could not be built ([`PyroscopeError::HttpClient`]): the HTTP
/// library's error, kept opaque so that library is not part of this crate's API. Its
/// message is the library's, and [`source`](std::error::Error::source) continues with the
/// library's cause (e.g. the TLS backend's error).
#[derive(Debug)]
pub struct HttpClientError(reqwest::Error);

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl HttpClientError {
    pub(crate) fn new(error: reqwest::Error) -> HttpClientError {
        HttpClientError(error)
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl std::fmt::Display for HttpClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
impl std::error::Error for HttpClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

#[cfg(all(test, any(feature = "pyroscope", feature = "otlp-http")))]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// Wrapping the HTTP library's error changes neither the message nor the cause chain.
    #[test]
    fn http_client_error_keeps_the_message_and_the_cause() {
        let inner = reqwest::blocking::Client::new()
            .get("not a url")
            .build()
            .expect_err("not a URL");
        let message = inner.to_string();
        let cause = inner.source().map(ToString::to_string);
        assert!(
            cause.is_some(),
            "the library's error has a cause: {inner:?}"
        );
        let error = PyroscopeError::HttpClient(HttpClientError::new(inner));
        assert_eq!(
            error.to_string(),
            format!("pyroscope: cannot build the HTTP client: {message}")
        );
        let wrapped = error.source().expect("the opaque error");
        assert_eq!(wrapped.to_string(), message);
        assert_eq!(wrapped.source().map(ToString::to_string), cause);
    }
}
