//! The one place tonic channels are made, for spans and profiles alike: the endpoint, its
//! timeouts and, for `https://`, the client TLS settings (or the platform's trusted
//! certificates). Must be called inside the exporter's own Tokio runtime.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::config::ClientTls;

/// A lazily connecting channel to `endpoint` (`http://` or `https://`).
pub(crate) fn channel(
    endpoint: &str,
    timeout: Duration,
    tls: &ClientTls,
) -> Result<Channel, String> {
    let endpoint = endpoint.trim_end_matches('/');
    let built = Endpoint::from_shared(endpoint.to_string())
        .map_err(|e| format!("not a gRPC endpoint: {e}"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let built = if endpoint.starts_with("https://") {
        secure(built, endpoint, tls)?
    } else {
        built
    };
    Ok(built.connect_lazy())
}

#[cfg(feature = "tls")]
fn secure(built: Endpoint, endpoint: &str, tls: &ClientTls) -> Result<Endpoint, String> {
    built
        .tls_config(tls.tonic())
        .map_err(|e| format!("TLS settings of {endpoint}: {e}"))
}

/// Only reached when setup's feature check was skipped: an error, never a plain connection.
#[cfg(not(feature = "tls"))]
fn secure(_: Endpoint, endpoint: &str, _: &ClientTls) -> Result<Endpoint, String> {
    Err(format!(
        "{endpoint}: https:// needs the otel-profiling feature \"tls\""
    ))
}
