//! The backends of the one-call setup, each behind its cargo feature (`pyroscope`,
//! `otlp-http`, `otlp-grpc`, `tls`). This is the one place that knows which are compiled
//! in: [`check`] refuses a setting that needs one left out, naming the setting and the
//! feature, before anything starts, so nothing is silently dropped.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SpanExporter, SpanProcessor, TracerProviderBuilder,
};

use super::SetupError;
use crate::collector::ProfileSink;
use crate::config::{OtlpProtocol, OtlpTarget};
use crate::export::otlp_profiles::OtlpProfilesConfig;
use crate::export::pyroscope::{PyroscopeConfig, PyroscopeStats};
use crate::export::span_stats::{CountingSpanExporter, SpanExportStats};
use crate::{CpuEvidenceProcessor, ProfileIdScope};

/// Where a setting came from, so errors name it as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// A `Telemetry` builder method.
    Builder,
    /// An environment variable.
    Env,
}

impl Source {
    fn pyroscope_server(self) -> &'static str {
        match self {
            Source::Builder => "pyroscope.server_address",
            Source::Env => "PYROSCOPE_SERVER_ADDRESS",
        }
    }
}

/// The backend features compiled into a build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Compiled {
    pub(super) pyroscope: bool,
    pub(super) otlp_http: bool,
    pub(super) otlp_grpc: bool,
    pub(super) tls: bool,
}

impl Compiled {
    /// This build's.
    pub(super) const THIS_BUILD: Compiled = Compiled {
        pyroscope: cfg!(feature = "pyroscope"),
        otlp_http: cfg!(feature = "otlp-http"),
        otlp_grpc: cfg!(feature = "otlp-grpc"),
        tls: cfg!(feature = "tls"),
    };
}

fn disabled(
    field: &'static str,
    value: &str,
    feature: &'static str,
    purpose: &'static str,
) -> SetupError {
    SetupError::FeatureDisabled {
        field,
        value: value.to_string(),
        feature,
        purpose,
    }
}

/// `https://` needs the `tls` feature (reqwest without it refuses the scheme at every
/// request, tonic at every connection, which would only show up as failed exports).
fn check_tls(compiled: Compiled, field: &'static str, url: &str) -> Result<(), SetupError> {
    if url.starts_with("https://") && !compiled.tls {
        return Err(disabled(field, url, "tls", "https:// URLs"));
    }
    Ok(())
}

/// One line per exporter whose TLS files are set while its endpoint is `http://`, where
/// they are not used (a likely mistake: the scheme is what turns TLS on).
pub(super) fn unused_tls(
    otlp: Option<&OtlpTarget>,
    otlp_profiles: Option<&OtlpProfilesConfig>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut note = |what: &str, url: &str, fields: Vec<&'static str>| {
        if !fields.is_empty() && !url.starts_with("https://") {
            lines.push(format!(
                "otel-profiling: {} set, but {what} go to {url}, not https://: no TLS, the \
                 files are not used",
                fields.join(", ")
            ));
        }
    };
    if let Some(target) = otlp {
        note("spans", &target.traces_url(), target.tls.fields());
    }
    if let Some(target) = otlp_profiles {
        note("OTLP profiles", &target.endpoint, target.tls.fields());
    }
    lines
}

/// Fails when a configured backend needs a feature `compiled` lacks.
pub(super) fn check(
    compiled: Compiled,
    otlp: Option<(&OtlpTarget, Source)>,
    pyroscope: Option<(&PyroscopeConfig, Source)>,
) -> Result<(), SetupError> {
    if let Some((config, source)) = pyroscope {
        let field = source.pyroscope_server();
        if !compiled.pyroscope {
            return Err(disabled(
                field,
                &config.server_address,
                "pyroscope",
                "pushing profiles to Pyroscope",
            ));
        }
        check_tls(compiled, field, &config.server_address)?;
    }
    if let Some((target, source)) = otlp {
        match target.protocol {
            OtlpProtocol::HttpProtobuf if !compiled.otlp_http => {
                // From the environment the protocol is usually just the default: name the
                // endpoint that was set.
                return Err(match source {
                    Source::Env => disabled(
                        target.endpoint_field(),
                        &target.endpoint,
                        "otlp-http",
                        "OTLP span export over http/protobuf, the default OTEL_EXPORTER_OTLP_PROTOCOL",
                    ),
                    Source::Builder => disabled(
                        target.protocol_field(),
                        "http/protobuf",
                        "otlp-http",
                        "OTLP span export over HTTP",
                    ),
                });
            }
            OtlpProtocol::HttpProtobuf => {
                check_tls(compiled, target.endpoint_field(), &target.endpoint)?
            }
            OtlpProtocol::Grpc if !compiled.otlp_grpc => {
                return Err(disabled(
                    target.protocol_field(),
                    "grpc",
                    "otlp-grpc",
                    "OTLP span export over gRPC",
                ));
            }
            OtlpProtocol::Grpc => check_tls(compiled, target.endpoint_field(), &target.endpoint)?,
        }
    }
    Ok(())
}

/// Fails when the OTLP profiles target needs a feature `compiled` lacks (or a transport
/// this crate does not have for profiles), naming the setting.
pub(super) fn check_otlp_profiles(
    compiled: Compiled,
    target: Option<&(OtlpProfilesConfig, Source)>,
) -> Result<(), SetupError> {
    let Some((target, source)) = target else {
        return Ok(());
    };
    let endpoint_field = match source {
        Source::Builder => "otlp_profiles.endpoint",
        Source::Env => "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
    };
    match target.protocol {
        OtlpProtocol::HttpProtobuf if !compiled.otlp_http => Err(disabled(
            endpoint_field,
            &target.endpoint,
            "otlp-http",
            "OTLP profiles over http/protobuf",
        )),
        OtlpProtocol::HttpProtobuf => check_tls(compiled, endpoint_field, &target.endpoint),
        OtlpProtocol::Grpc if !compiled.otlp_grpc => Err(disabled(
            match source {
                Source::Builder => "otlp_profiles.protocol",
                Source::Env => "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
            },
            "grpc",
            "otlp-grpc",
            "OTLP profiles over gRPC",
        )),
        // The queue and uploader thread come with either HTTP backend feature.
        OtlpProtocol::Grpc if !compiled.pyroscope && !compiled.otlp_http => Err(disabled(
            endpoint_field,
            &target.endpoint,
            "otlp-http",
            "the profile uploader OTLP profiles over gRPC run on",
        )),
        OtlpProtocol::Grpc => check_tls(compiled, endpoint_field, &target.endpoint),
    }
}

/// The OTLP profiles sink for `config` with the setup's resource (`attributes`, with
/// `service.name`), and its counters.
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
pub(super) fn otlp_profiles_sink(
    config: &OtlpProfilesConfig,
    attributes: &[(String, String)],
    timeout: Duration,
) -> Result<(Box<dyn ProfileSink>, Arc<PyroscopeStats>), SetupError> {
    use crate::export::otlp_profiles::OtlpProfilesExporter;
    let service = attributes
        .iter()
        .rev()
        .find(|(k, _)| k == "service.name")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "unknown_service".into());
    let mut config = config.clone().with_shutdown_timeout(timeout);
    config.resource = vec![("service.name".into(), service)];
    for (k, v) in attributes.iter().filter(|(k, _)| k != "service.name") {
        config = config.with_resource_attribute(k.clone(), v.clone());
    }
    let exporter = OtlpProfilesExporter::new(config).map_err(SetupError::OtlpProfiles)?;
    let stats = exporter.stats();
    Ok((Box::new(exporter), stats))
}

#[cfg(not(any(feature = "pyroscope", feature = "otlp-http")))]
pub(super) fn otlp_profiles_sink(
    _target: &OtlpProfilesConfig,
    _: &[(String, String)],
    _: Duration,
) -> Result<(Box<dyn ProfileSink>, Arc<PyroscopeStats>), SetupError> {
    Err(not_compiled(
        "otlp_profiles.endpoint",
        &_target.endpoint,
        "otlp-http",
        "OTLP profiles over HTTP",
    ))
}

/// Counts and batches `exporter`'s spans, with CPU evidence and the profile id on the
/// spans in `scope`, into `provider`. One processor does all three: the SDK clones each
/// ended span's data for every processor but the last.
pub(super) fn add_span_exporter(
    provider: TracerProviderBuilder,
    exporter: impl SpanExporter + 'static,
    what: String,
    scope: ProfileIdScope,
) -> (TracerProviderBuilder, Arc<SpanExportStats>) {
    let exporter = CountingSpanExporter::new(exporter, what);
    let stats = exporter.stats();
    let batch = CountEnded {
        inner: BatchSpanProcessor::builder(exporter).build(),
        stats: stats.clone(),
    };
    let provider =
        provider.with_span_processor(CpuEvidenceProcessor::new(batch).with_profile_id(scope));
    (provider, stats)
}

/// Counts the spans handed to the batch processor, so that what it never exported (still
/// queued when the shutdown timeout ran out) is known: ended − sent − failed.
#[derive(Debug)]
struct CountEnded<P> {
    inner: P,
    stats: Arc<SpanExportStats>,
}

impl<P: SpanProcessor> SpanProcessor for CountEnded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: opentelemetry_sdk::trace::SpanData) {
        self.stats.note_ended();
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// Adds the OTLP exporter for `target` (set through `source`) to `provider`.
pub(super) fn with_otlp(
    provider: TracerProviderBuilder,
    target: &OtlpTarget,
    source: Source,
    scope: ProfileIdScope,
) -> Result<(TracerProviderBuilder, Arc<SpanExportStats>), SetupError> {
    match target.protocol {
        OtlpProtocol::HttpProtobuf => with_otlp_http(provider, target, source, scope),
        OtlpProtocol::Grpc => with_otlp_grpc(provider, target, source, scope),
    }
}

/// Only reached when [`check`] was skipped: still an error, never a silent drop.
#[allow(dead_code)] // unused when every backend is compiled in
fn not_compiled(
    field: &'static str,
    value: &str,
    feature: &'static str,
    purpose: &'static str,
) -> SetupError {
    disabled(field, value, feature, purpose)
}

#[cfg(feature = "otlp-http")]
fn with_otlp_http(
    provider: TracerProviderBuilder,
    target: &OtlpTarget,
    _: Source,
    scope: ProfileIdScope,
) -> Result<(TracerProviderBuilder, Arc<SpanExportStats>), SetupError> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(target.traces_url())
        .with_headers(target.headers.iter().cloned().collect());
    if let Some(timeout) = target.timeout {
        builder = builder.with_timeout(timeout);
    }
    if target.gzip {
        builder = builder.with_compression(opentelemetry_otlp::Compression::Gzip);
    }
    #[cfg(feature = "tls")]
    if target.traces_url().starts_with("https://") && !target.tls.is_empty() {
        builder = builder.with_http_client(tls_http_client(target)?);
    }
    let exporter = builder.build().map_err(|e| SetupError::OtlpSpans {
        field: target.endpoint_field(),
        source: crate::export::otlp::OtlpExporterError::Build(Box::new(e)),
    })?;
    Ok(add_span_exporter(
        provider,
        exporter,
        format!("otlp http/protobuf to {}", target.traces_url()),
        scope,
    ))
}

/// The blocking client of the span exporter with the target's TLS files, as
/// `opentelemetry-otlp` builds its own (its timeout; made on a thread of its own, since
/// reqwest's blocking client cannot be made inside the host's Tokio runtime).
#[cfg(all(feature = "otlp-http", feature = "tls"))]
fn tls_http_client(target: &OtlpTarget) -> Result<reqwest::blocking::Client, SetupError> {
    let timeout = target.timeout.unwrap_or(Duration::from_secs(10));
    let tls = target.tls.clone();
    let error = |message: String| SetupError::OtlpSpans {
        field: target.endpoint_field(),
        source: crate::export::otlp::OtlpExporterError::Build(message.into()),
    };
    std::thread::Builder::new()
        .name("otel-profiling-setup".into())
        .spawn(move || -> Result<reqwest::blocking::Client, String> {
            let builder = reqwest::blocking::Client::builder().timeout(timeout);
            let builder = tls.apply_reqwest(builder)?;
            // The span exporter's request thread is the telemetry's: never sampled.
            crate::sampler::adopt::declining_client_threads(|| builder.build())
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        })
        .map_err(|e| error(format!("cannot start a thread: {e}")))?
        .join()
        .map_err(|_| error("the thread building the HTTP client panicked".into()))?
        .map_err(error)
}

#[cfg(not(feature = "otlp-http"))]
fn with_otlp_http(
    _: TracerProviderBuilder,
    target: &OtlpTarget,
    _: Source,
    _: ProfileIdScope,
) -> Result<(TracerProviderBuilder, Arc<SpanExportStats>), SetupError> {
    Err(not_compiled(
        target.protocol_field(),
        "http/protobuf",
        "otlp-http",
        "OTLP span export over HTTP",
    ))
}

#[cfg(feature = "otlp-grpc")]
fn with_otlp_grpc(
    provider: TracerProviderBuilder,
    target: &OtlpTarget,
    _: Source,
    scope: ProfileIdScope,
) -> Result<(TracerProviderBuilder, Arc<SpanExportStats>), SetupError> {
    let exporter = crate::export::otlp::GrpcSpanExporter::with_tls(
        &target.traces_url(),
        &target.headers,
        target.timeout,
        target.gzip,
        &target.tls,
    )
    .map_err(|error| SetupError::OtlpSpans {
        field: target.endpoint_field(),
        source: error,
    })?;
    Ok(add_span_exporter(
        provider,
        exporter,
        format!("otlp grpc to {}", target.traces_url()),
        scope,
    ))
}

#[cfg(not(feature = "otlp-grpc"))]
fn with_otlp_grpc(
    _: TracerProviderBuilder,
    target: &OtlpTarget,
    _: Source,
    _: ProfileIdScope,
) -> Result<(TracerProviderBuilder, Arc<SpanExportStats>), SetupError> {
    Err(not_compiled(
        target.protocol_field(),
        "grpc",
        "otlp-grpc",
        "OTLP span export over gRPC",
    ))
}

/// The Pyroscope push sink for `config` with the application name and series labels of
/// the setup, and its counters.
#[cfg(feature = "pyroscope")]
pub(super) fn pyroscope_sink(
    config: &PyroscopeConfig,
    service_name: &str,
    labels: Vec<(String, String)>,
    timeout: Duration,
) -> Result<(Box<dyn ProfileSink>, Arc<PyroscopeStats>), SetupError> {
    use crate::export::pyroscope::PyroscopeExporter;
    let mut config = config
        .clone()
        .with_labels(labels.into_iter().filter(|(k, _)| k != "service_name"))
        .with_shutdown_timeout(timeout);
    config.application_name = service_name.to_string();
    let exporter = PyroscopeExporter::new(config)?;
    let stats = exporter.stats();
    Ok((Box::new(exporter), stats))
}

#[cfg(not(feature = "pyroscope"))]
pub(super) fn pyroscope_sink(
    config: &PyroscopeConfig,
    _: &str,
    _: Vec<(String, String)>,
    _: Duration,
) -> Result<(Box<dyn ProfileSink>, Arc<PyroscopeStats>), SetupError> {
    Err(not_compiled(
        "pyroscope.server_address",
        &config.server_address,
        "pyroscope",
        "pushing profiles to Pyroscope",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Compiled = Compiled {
        pyroscope: true,
        otlp_http: true,
        otlp_grpc: true,
        tls: true,
    };

    fn otlp(endpoint: &str, protocol: OtlpProtocol) -> OtlpTarget {
        OtlpTarget::new(endpoint, protocol)
    }

    /// The target the environment `vars` give (it knows which variables it came from).
    fn otlp_env(vars: &[(&str, &str)]) -> OtlpTarget {
        crate::config::EnvConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
        .expect("valid variables")
        .otlp
        .expect("an OTLP target")
    }

    fn pyroscope(server: &str) -> PyroscopeConfig {
        PyroscopeConfig::new(server, "checkout")
    }

    /// Compiled features, the OTLP and Pyroscope settings, the message's start.
    type Case<'a> = (
        Compiled,
        Option<(&'a OtlpTarget, Source)>,
        Option<(&'a PyroscopeConfig, Source)>,
        &'static str,
    );

    fn message(result: Result<(), SetupError>) -> String {
        match result {
            Err(e @ SetupError::FeatureDisabled { .. }) => e.to_string(),
            other => panic!("expected FeatureDisabled, got {other:?}"),
        }
    }

    /// Every backend asked for but compiled out fails, naming the setting as the user
    /// wrote it and the feature; with the feature, the same setting passes. Pure, so every
    /// build checks every combination.
    #[test]
    fn a_backend_compiled_out_is_refused_naming_the_setting_and_the_feature() {
        let grpc = otlp("http://tempo:4317", OtlpProtocol::Grpc);
        let http = otlp("http://tempo:4318", OtlpProtocol::HttpProtobuf);
        let grpc_env = otlp_env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://tempo:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        let http_env = otlp_env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://tempo:4318")]);
        let https_env = otlp_env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "https://tempo:4318/v1/traces",
        )]);
        let pyro = pyroscope("http://pyroscope:4040");
        let pyros = pyroscope("https://pyroscope:4040");
        let cases: [Case; 9] = [
            (
                Compiled { otlp_grpc: false, ..ALL },
                Some((&grpc_env, Source::Env)),
                None,
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the otel-profiling feature \"otlp-grpc\"",
            ),
            (
                Compiled { otlp_grpc: false, ..ALL },
                Some((&grpc, Source::Builder)),
                None,
                "otlp.protocol=grpc needs the otel-profiling feature \"otlp-grpc\"",
            ),
            (
                Compiled { otlp_http: false, ..ALL },
                Some((&http_env, Source::Env)),
                None,
                "OTEL_EXPORTER_OTLP_ENDPOINT=http://tempo:4318 needs the otel-profiling feature \"otlp-http\"",
            ),
            (
                Compiled { otlp_http: false, ..ALL },
                Some((&http, Source::Builder)),
                None,
                "otlp.protocol=http/protobuf needs the otel-profiling feature \"otlp-http\"",
            ),
            (
                Compiled { tls: false, ..ALL },
                Some((&https_env, Source::Env)),
                None,
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=https://tempo:4318/v1/traces needs the otel-profiling feature \"tls\"",
            ),
            (
                Compiled { pyroscope: false, ..ALL },
                None,
                Some((&pyro, Source::Env)),
                "PYROSCOPE_SERVER_ADDRESS=http://pyroscope:4040 needs the otel-profiling feature \"pyroscope\"",
            ),
            (
                Compiled { pyroscope: false, ..ALL },
                None,
                Some((&pyro, Source::Builder)),
                "pyroscope.server_address=http://pyroscope:4040 needs the otel-profiling feature \"pyroscope\"",
            ),
            (
                Compiled { tls: false, ..ALL },
                None,
                Some((&pyros, Source::Env)),
                "PYROSCOPE_SERVER_ADDRESS=https://pyroscope:4040 needs the otel-profiling feature \"tls\"",
            ),
            // Pyroscope is checked first, whichever is also wrong.
            (
                Compiled { pyroscope: false, otlp_grpc: false, ..ALL },
                Some((&grpc_env, Source::Env)),
                Some((&pyro, Source::Env)),
                "PYROSCOPE_SERVER_ADDRESS=http://pyroscope:4040 needs the otel-profiling feature \"pyroscope\"",
            ),
        ];
        for (compiled, otlp, pyroscope, expected) in cases {
            let msg = message(check(compiled, otlp, pyroscope));
            assert!(msg.starts_with(expected), "{msg}\nexpected: {expected}");
            assert!(msg.contains("Cargo.toml"), "{msg}");
            assert!(check(ALL, otlp, pyroscope).is_ok(), "{msg}");
        }
    }

    /// What needs no feature passes in any build: nothing configured (local files), plain
    /// http:// without `tls`; https:// for gRPC needs `tls` as it does for HTTP.
    #[test]
    fn what_needs_no_feature_passes() {
        let none = Compiled {
            pyroscope: false,
            otlp_http: false,
            otlp_grpc: false,
            tls: false,
        };
        assert!(check(none, None, None).is_ok());
        let no_tls = Compiled { tls: false, ..ALL };
        let http = otlp("http://tempo:4318", OtlpProtocol::HttpProtobuf);
        let pyro = pyroscope("http://pyroscope:4040");
        assert!(check(
            no_tls,
            Some((&http, Source::Env)),
            Some((&pyro, Source::Env))
        )
        .is_ok());
        let grpc = otlp("http://tempo:4317", OtlpProtocol::Grpc);
        assert!(check(no_tls, Some((&grpc, Source::Env)), None).is_ok());
        let grpcs = otlp("https://tempo:4317", OtlpProtocol::Grpc);
        let msg = message(check(no_tls, Some((&grpcs, Source::Builder)), None));
        assert!(
            msg.starts_with(
                "otlp.endpoint=https://tempo:4317 needs the otel-profiling feature \"tls\""
            ),
            "{msg}"
        );
        let profiles = OtlpProfilesConfig::new("https://collector:4317", "s")
            .with_protocol(OtlpProtocol::Grpc);
        assert!(check_otlp_profiles(no_tls, Some(&(profiles, Source::Env))).is_err());
    }

    /// OTLP profiles asked for over a transport compiled out are refused naming the
    /// setting and the feature; with the feature they pass.
    #[test]
    fn otlp_profiles_compiled_out_are_refused_naming_the_setting_and_the_feature() {
        let http = OtlpProfilesConfig::new("http://pyroscope:4040/v1development/profiles", "s");
        let https = OtlpProfilesConfig::new("https://pyroscope:4040/v1development/profiles", "s");
        let grpc =
            OtlpProfilesConfig::new("http://collector:4317", "s").with_protocol(OtlpProtocol::Grpc);
        let cases = [
            (
                Compiled { otlp_http: false, ..ALL },
                (http.clone(), Source::Env),
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT=http://pyroscope:4040/v1development/profiles needs the otel-profiling feature \"otlp-http\"",
            ),
            (
                Compiled { otlp_http: false, ..ALL },
                (http, Source::Builder),
                "otlp_profiles.endpoint=http://pyroscope:4040/v1development/profiles needs the otel-profiling feature \"otlp-http\"",
            ),
            (
                Compiled { tls: false, ..ALL },
                (https, Source::Env),
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT=https://pyroscope:4040/v1development/profiles needs the otel-profiling feature \"tls\"",
            ),
            (
                Compiled { otlp_grpc: false, ..ALL },
                (grpc, Source::Env),
                "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL=grpc needs the otel-profiling feature \"otlp-grpc\"",
            ),
        ];
        for (compiled, target, expected) in cases {
            let msg = message(check_otlp_profiles(compiled, Some(&target)));
            assert!(msg.starts_with(expected), "{msg}\nexpected: {expected}");
            assert!(check_otlp_profiles(ALL, Some(&target)).is_ok(), "{msg}");
        }
        assert!(check_otlp_profiles(ALL, None).is_ok());
    }
}
