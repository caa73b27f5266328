//! What can go wrong talking to a backend, each naming the request.

/// An error of a query client. Every variant names the request (`GET <url>`) it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// A setting (URL, auth variable) is invalid; names the setting.
    #[error("{name}: {message}")]
    Setting {
        /// The setting or environment variable.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// The request did not get an answer (connection refused, timeout, TLS).
    #[error("{request}: {message}")]
    Transport {
        /// `METHOD url`.
        request: String,
        /// The transport's error.
        message: String,
    },
    /// The backend answered with a non-success status.
    #[error("{request}: HTTP {status}: {body}")]
    Status {
        /// `METHOD url`.
        request: String,
        /// HTTP status.
        status: u16,
        /// The answer's body (truncated to 2 KiB).
        body: String,
    },
    /// The answer could not be decoded.
    #[error("{request}: {message}")]
    Decode {
        /// `METHOD url`.
        request: String,
        /// What did not decode.
        message: String,
    },
}

impl QueryError {
    /// The HTTP status of a [`QueryError::Status`].
    pub fn status(&self) -> Option<u16> {
        match self {
            QueryError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}
