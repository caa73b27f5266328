//! OTLP span export for the one-call setup: [`OtlpExporterError`] in every build, the gRPC
//! exporter with the `otlp-grpc` feature.
//!
//! HTTP/protobuf (the `otlp-http` feature) uses `opentelemetry-otlp`'s blocking reqwest client and runs on the batch
//! span processor's own thread. gRPC (tonic) needs a Tokio reactor for its connection, and
//! the batch processor's thread has none, so [`GrpcSpanExporter`] owns a one-worker Tokio
//! runtime: the channel is created inside it and every export is driven on it. The host
//! application's own runtime is never used (nor required).

#[cfg(feature = "otlp-grpc")]
use std::fmt;
#[cfg(feature = "otlp-grpc")]
use std::sync::{Mutex, PoisonError};
#[cfg(feature = "otlp-grpc")]
use std::time::Duration;

#[cfg(feature = "otlp-grpc")]
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
#[cfg(feature = "otlp-grpc")]
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
#[cfg(feature = "otlp-grpc")]
use opentelemetry_sdk::Resource;

/// Why an OTLP span exporter could not be built.
/// [`SetupError::OtlpSpans`](crate::SetupError::OtlpSpans) adds the setting it was built
/// from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtlpExporterError {
    /// `opentelemetry-otlp` refused the settings.
    #[error("cannot build the OTLP span exporter: {0}")]
    Build(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The gRPC exporter's runtime could not start.
    #[error("cannot start the OTLP/gRPC exporter's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// The tonic OTLP exporter, driven on a runtime of its own.
#[cfg(feature = "otlp-grpc")]
pub struct GrpcSpanExporter {
    inner: opentelemetry_otlp::SpanExporter,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

#[cfg(feature = "otlp-grpc")]
impl fmt::Debug for GrpcSpanExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcSpanExporter").finish_non_exhaustive()
    }
}

#[cfg(feature = "otlp-grpc")]
impl GrpcSpanExporter {
    /// Connects (lazily) to `endpoint`, e.g. `http://localhost:4317`.
    pub fn new(endpoint: &str) -> Result<GrpcSpanExporter, OtlpExporterError> {
        GrpcSpanExporter::with_settings(endpoint, &[], None, false)
    }

    /// [`new`](Self::new), sending `headers` as request metadata, giving each export
    /// `timeout` (the exporter's default, 10 s, when `None`) and gzipping requests with
    /// `gzip`. A header that is not valid gRPC metadata is an error naming it.
    pub fn with_settings(
        endpoint: &str,
        headers: &[(String, String)],
        timeout: Option<std::time::Duration>,
        gzip: bool,
    ) -> Result<GrpcSpanExporter, OtlpExporterError> {
        GrpcSpanExporter::with_tls(
            endpoint,
            headers,
            timeout,
            gzip,
            &crate::config::ClientTls::new(),
        )
    }

    /// [`with_settings`](Self::with_settings), with the client TLS `tls` for an
    /// `https://` endpoint (the platform's trusted certificates when it is empty).
    pub fn with_tls(
        endpoint: &str,
        headers: &[(String, String)],
        timeout: Option<std::time::Duration>,
        gzip: bool,
        tls: &crate::config::ClientTls,
    ) -> Result<GrpcSpanExporter, OtlpExporterError> {
        use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
        let mut metadata = tonic::metadata::MetadataMap::new();
        for (name, value) in headers {
            let key =
                tonic::metadata::MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes())
                    .map_err(|e| {
                        OtlpExporterError::Build(format!("header {name:?}: {e}").into())
                    })?;
            let value = tonic::metadata::MetadataValue::try_from(value.as_str())
                .map_err(|e| OtlpExporterError::Build(format!("header {name:?}: {e}").into()))?;
            metadata.insert(key, value);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otel-profiling-otlp-grpc")
            // tonic's connection tasks run on these threads: no spans or profiles of
            // their own (see `collector.rs`).
            .on_thread_start(|| {
                // Never popped: the scope lasts until the thread ends, and its context
                // stack is freed with the thread.
                std::mem::forget(opentelemetry::Context::enter_telemetry_suppressed_scope());
            })
            .enable_all()
            .build()
            .map_err(OtlpExporterError::Runtime)?;
        // The exporter's default; the channel and the exporter must agree.
        let timeout = timeout.unwrap_or(Duration::from_secs(10));
        let inner = {
            let _entered = runtime.enter();
            let channel = crate::export::grpc_channel::channel(endpoint, timeout, tls)
                .map_err(|e| OtlpExporterError::Build(e.into()))?;
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_channel(channel)
                .with_metadata(metadata)
                .with_timeout(timeout);
            if gzip {
                builder = builder.with_compression(opentelemetry_otlp::Compression::Gzip);
            }
            builder
                .build()
                .map_err(|e| OtlpExporterError::Build(Box::new(e)))?
        };
        Ok(GrpcSpanExporter {
            inner,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|r| r.handle().clone())
    }

    fn stop_runtime(&self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(runtime) = runtime {
            // Never wait for a connection attempt that may hang.
            runtime.shutdown_background();
        }
    }
}

#[cfg(feature = "otlp-grpc")]
impl SpanExporter for GrpcSpanExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match self.handle() {
            Some(handle) => handle.block_on(self.inner.export(batch)),
            None => Err(OTelSdkError::AlreadyShutdown),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let result = match self.handle() {
            Some(handle) => {
                let _entered = handle.enter();
                self.inner.shutdown_with_timeout(timeout)
            }
            None => Ok(()),
        };
        self.stop_runtime();
        result
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(feature = "otlp-grpc")]
impl Drop for GrpcSpanExporter {
    fn drop(&mut self) {
        self.stop_runtime();
    }
}
