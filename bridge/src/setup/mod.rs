//! One-call setup: tracer provider with the span processors, the `tracing` layers, the CPU
//! profiler and the exporters, configured from code and the environment, behind one guard
//! that flushes and stops everything when dropped.
//!
//! ```no_run
//! // Reads OTEL_* and PYROSCOPE_* (see `config`); with no backend configured, profiles and
//! // spans go to local files.
//! let telemetry = otel_profiling::Telemetry::from_env()?.service_name("checkout").init()?;
//! tracing::info_span!("GET /report").in_scope(|| { /* ... */ });
//! drop(telemetry); // last profile written, spans flushed
//! # Ok::<(), otel_profiling::SetupError>(())
//! ```
//!
//! When the application already has a `tracing` subscriber, [`Telemetry::init`] fails with
//! [`SetupError::GlobalSubscriber`]: use [`Telemetry::build`] and add
//! [`TelemetryGuard::layer`] to that subscriber instead. The README ("One-call setup") shows
//! it with `tracing_subscriber::fmt::layer()` and an `EnvFilter`, compiled as a doc test.
//!
//! Each backend is a default-on cargo feature (`pyroscope`, `otlp-http`, `otlp-grpc`,
//! `tls`); configuring one the build leaves out fails [`Telemetry::build`] with
//! [`SetupError::FeatureDisabled`], naming the setting and the feature. Drop the guard
//! after the async runtime has shut down (the complete `main` in docs/setup.md says why).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_core::Subscriber;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::{
    ClientTls, ConfigError, EnvConfig, OtlpProtocol, OtlpTarget, ProfilesExporter,
};
use crate::export::local_budget::{LocalBudget, DEFAULT_OUTPUT_MAX_BYTES};
use crate::export::otlp::OtlpExporterError;
use crate::export::otlp_profiles::OtlpProfilesConfig;
use crate::export::pyroscope::{PyroscopeAuth, PyroscopeConfig, PyroscopeError, PyroscopeStats};
use crate::export::span_stats::{SpanExportSnapshot, SpanExportStats};
use crate::local_sink::{output_dir, LocalSpanExporter};
use crate::{
    ProfileIdScope, Profiler, ProfilerError, ProfilerStats, ProfilingLayer, UnsampledTraces,
};

mod backends;
pub mod config;
mod env_names;
pub(crate) mod profiler;

use backends::{Compiled, Source};

/// OpenTelemetry resource attributes that become Pyroscope series labels (dots become
/// underscores). The Grafana provisioning maps the same keys, so a span's "Profiles for
/// this span" link selects the same running workload.
pub const RESOURCE_SERIES_LABELS: &[(&str, &str)] = &[
    ("service.name", "service_name"),
    ("service.version", "service_version"),
    ("service.namespace", "service_namespace"),
    ("service.instance.id", "service_instance_id"),
    ("deployment.environment", "deployment_environment"),
    ("deployment.environment.name", "deployment_environment"),
];

/// Errors of the one-call setup.
///
/// `Debug` prints the same message as `Display`, so `fn main() -> Result<(), SetupError>`
/// (which reports errors with `Debug`) shows the hint rather than a bare variant name.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A configuration value was malformed (names the variable or field).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The profiler could not start.
    #[error(transparent)]
    Profiler(#[from] ProfilerError),
    /// The Pyroscope exporter refused its settings or could not start (the message names
    /// the setting, e.g. `pyroscope.labels: …`).
    #[error(transparent)]
    Pyroscope(#[from] PyroscopeError),
    /// The OTLP profiles exporter refused its settings or could not start (the message
    /// names the exporter and the setting, e.g. `otlp profiles: otlp_profiles.endpoint: …`;
    /// the error type is the one the OTLP profiles exporter shares with Pyroscope's).
    #[error("otlp profiles: {0}")]
    OtlpProfiles(#[source] PyroscopeError),
    /// The OTLP span exporter could not be built.
    #[error("{field}: {source}")]
    OtlpSpans {
        /// The setting it was built from (`OTEL_EXPORTER_OTLP_ENDPOINT` or `otlp.endpoint`).
        field: &'static str,
        /// Why.
        #[source]
        source: OtlpExporterError,
    },
    /// The local span file could not be created.
    #[error("local span file: {}: {source}", dir.display())]
    LocalSpanFile {
        /// The directory it was to be written in.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A setting asks for a backend this build of the crate leaves out (a cargo feature of
    /// `otel-profiling` that is off).
    #[error(
        "{field}={value} needs the otel-profiling feature \"{feature}\" ({purpose}), which this \
         build leaves out: add it to the `features` of the otel-profiling dependency in Cargo.toml"
    )]
    FeatureDisabled {
        /// The variable or builder field that asked for it.
        field: &'static str,
        /// Its value.
        value: String,
        /// The cargo feature to enable.
        feature: &'static str,
        /// What the feature provides.
        purpose: &'static str,
    },
    /// The thread or process context could not be published (turn it off with
    /// `OTEL_PROFILING_THREAD_CONTEXT=false` or [`Telemetry::thread_context`]).
    #[error("thread context (OTEL_PROFILING_THREAD_CONTEXT): {0}")]
    ThreadContext(#[from] crate::thread_ctx::ThreadContextError),
    /// A global subscriber was already installed.
    #[error(
        "a global tracing subscriber is already installed (e.g. by `tracing_subscriber::fmt::init()`); \
         call `Telemetry::build()` instead of `init()` and add `guard.layer()` to your own \
         subscriber (see the `setup` module docs)"
    )]
    GlobalSubscriber,
}

impl std::fmt::Debug for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Builds the whole telemetry pipeline. Code settings win over the environment.
#[derive(Debug, Default)]
#[must_use]
pub struct Telemetry {
    env: EnvConfig,
    service_name: Option<String>,
    default_service_name: Option<String>,
    resource: Vec<(String, String)>,
    tags: Vec<(String, String)>,
    otlp: Option<OtlpTarget>,
    pyroscope: Option<PyroscopeConfig>,
    otlp_profiles: Option<OtlpProfilesConfig>,
    otlp_tls: Option<ClientTls>,
    profiles_exporter: Option<ProfilesExporter>,
    frequency_hz: Option<u32>,
    interval: Option<Duration>,
    output_dir: Option<PathBuf>,
    output_max_bytes: Option<u64>,
    max_live_roots: Option<u64>,
    quiet: Option<bool>,
    span_name_label: Option<bool>,
    trace_id_label: Option<bool>,
    blocked_threshold: Option<Option<Duration>>,
    alloc_sample_bytes: Option<u64>,
    alloc_inuse: Option<bool>,
    thread_context: Option<bool>,
    scope: ProfileIdScope,
    unsampled: UnsampledTraces,
    shutdown_timeout: Option<Duration>,
}

impl Telemetry {
    /// A builder with nothing configured (local files for both profiles and spans).
    pub fn builder() -> Telemetry {
        Telemetry::default()
    }

    /// A builder seeded from the environment (see [`crate::config`]).
    pub fn from_env() -> Result<Telemetry, SetupError> {
        Ok(Telemetry::from_env_config(EnvConfig::from_env()?))
    }

    /// A builder seeded from an already-read environment.
    pub fn from_env_config(env: EnvConfig) -> Telemetry {
        Telemetry {
            env,
            ..Telemetry::default()
        }
    }

    /// The service name (`service.name`, and `service_name` on profiles), whatever the
    /// environment says (code wins, as in the OpenTelemetry SDK). To leave the operator
    /// the choice, use [`default_service_name`](Self::default_service_name).
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// The service name used only when the environment names none: neither
    /// `OTEL_SERVICE_NAME`, `PYROSCOPE_APPLICATION_NAME` nor a `service.name` in
    /// `OTEL_RESOURCE_ATTRIBUTES` is set (else `unknown_service`, as the SDK has it).
    ///
    /// ```no_run
    /// // `checkout` unless the deployment sets OTEL_SERVICE_NAME (say, `checkout-canary`).
    /// let _telemetry = otel_profiling::Telemetry::from_env()?
    ///     .default_service_name("checkout")
    ///     .init()?;
    /// # Ok::<(), otel_profiling::SetupError>(())
    /// ```
    pub fn default_service_name(mut self, name: impl Into<String>) -> Self {
        self.default_service_name = Some(name.into());
        self
    }

    /// Adds a resource attribute (e.g. `service.version`).
    pub fn resource_attribute(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.resource.push((key.into(), value.into()));
        self
    }

    /// Adds a series label to every profile.
    pub fn profile_tag(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.tags.push((name.into(), value.into()));
        self
    }

    /// Sends traces over OTLP to `endpoint` (e.g. `http://localhost:4318`).
    pub fn otlp(mut self, endpoint: &str, protocol: OtlpProtocol) -> Result<Self, SetupError> {
        self.otlp = Some(OtlpTarget::new(
            crate::config::parse_url(
                "otlp.endpoint",
                endpoint,
                crate::config::otlp_url_example(protocol),
            )?,
            protocol,
        ));
        Ok(self)
    }

    /// Sends profiles to the Pyroscope server at `server` (e.g. `http://localhost:4040`),
    /// with credentials and tenant if given. The application name and series labels come
    /// from the service name and resource at [`build`](Self::build).
    pub fn pyroscope(
        mut self,
        server: &str,
        auth: Option<PyroscopeAuth>,
        tenant_id: Option<String>,
    ) -> Result<Self, SetupError> {
        let server = crate::config::parse_url(
            "pyroscope.server_address",
            server,
            crate::config::PYROSCOPE_URL_EXAMPLE,
        )?;
        let mut config = PyroscopeConfig::new(server, String::new());
        config.auth = auth;
        config.tenant_id = tenant_id;
        self.pyroscope = Some(config);
        Ok(self)
    }

    /// Sends profiles as OTLP profiles to `endpoint`: for `http/protobuf` the full URL
    /// (`http://localhost:4040/v1development/profiles` for Grafana Pyroscope,
    /// `http://localhost:4318/v1development/profiles` for a Collector), for gRPC the server.
    /// Implies [`ProfilesExporter::Otlp`] unless [`profiles_exporter`](Self::profiles_exporter)
    /// says otherwise (or [`ProfilesExporter::Both`] when a Pyroscope server is set too).
    /// The resource comes from the service name and resource at [`build`](Self::build).
    pub fn otlp_profiles(
        mut self,
        endpoint: &str,
        protocol: OtlpProtocol,
        headers: Vec<(String, String)>,
    ) -> Result<Self, SetupError> {
        let endpoint = crate::config::parse_url(
            "otlp_profiles.endpoint",
            endpoint,
            crate::config::otlp_profiles_url_example(protocol),
        )?;
        let mut config = OtlpProfilesConfig::new(endpoint, String::new()).with_protocol(protocol);
        config.headers = headers;
        self.otlp_profiles = Some(config);
        Ok(self)
    }

    /// Client TLS of the OTLP exporters (spans and OTLP profiles) at `https://` endpoints:
    /// the certificates the server's must lead to, the client certificate for mutual TLS
    /// (wins over `OTEL_EXPORTER_OTLP_[TRACES_|PROFILES_]{CERTIFICATE,CLIENT_CERTIFICATE,
    /// CLIENT_KEY}`).
    ///
    /// ```no_run
    /// use otel_profiling::config::{ClientTls, OtlpProtocol};
    /// use otel_profiling::Telemetry;
    ///
    /// let tls = ClientTls::new().with_ca_certificate_file("/etc/otel/ca.pem")?;
    /// let _guard = Telemetry::from_env()?
    ///     .default_service_name("checkout")
    ///     .otlp("https://collector.internal:4317", OtlpProtocol::Grpc)?
    ///     .otlp_tls(tls)
    ///     .init()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn otlp_tls(mut self, tls: ClientTls) -> Self {
        self.otlp_tls = Some(tls);
        self
    }

    /// Which exporters get the profiles: Pyroscope's push API, OTLP profiles, or both
    /// (wins over `OTEL_PROFILING_PROFILES_EXPORTER`). OTLP profiles go to the endpoint of
    /// [`otlp_profiles`](Self::otlp_profiles), else of the environment
    /// (`OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`), else of
    /// [`otlp`](Self::otlp) with `/v1development/profiles` appended for HTTP.
    pub fn profiles_exporter(mut self, exporter: ProfilesExporter) -> Self {
        self.profiles_exporter = Some(exporter);
        self
    }

    /// Samples per second (default 100).
    pub fn frequency_hz(mut self, hz: u32) -> Self {
        self.frequency_hz = Some(hz);
        self
    }

    /// Profile length / upload interval (default 10 s).
    pub fn upload_interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Directory for local files (default: `OTEL_PROFILING_OUTPUT_DIR`, else
    /// `$CARGO_TARGET_DIR/otel-profiling`, else `target/otel-profiling`; see
    /// [`crate::local_sink`]).
    pub fn output_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.output_dir = Some(dir.into());
        self
    }

    /// The bound on this crate's profile and span files in the local directory, earlier
    /// runs' included: the oldest go first, and the span file is rotated at an eighth of
    /// it (`0`: no bound). Default: `OTEL_PROFILING_OUTPUT_MAX_BYTES`, else 256 MiB.
    pub fn output_max_bytes(mut self, bytes: u64) -> Self {
        self.output_max_bytes = Some(bytes);
        self
    }

    /// The most local roots labelled at once (1 to 8,388,608): past it a root's samples
    /// carry no span labels, counted in [`RecordStats::labels_refused`](crate::RecordStats).
    /// Default: `OTEL_PROFILING_MAX_LIVE_ROOTS`, else 262,144 (see
    /// [`set_max_live_roots`](crate::set_max_live_roots)).
    pub fn max_live_roots(mut self, max: u64) -> Self {
        self.max_live_roots = Some(max);
        self
    }

    /// Whether to leave out the one stderr line [`build`](Self::build) prints when profiles
    /// or spans go to local files (`otel-profiling: writing profiles and spans to <dir>`).
    /// Default: `OTEL_PROFILING_QUIET`, else false.
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = Some(quiet);
        self
    }

    /// Whether samples carry `span_name` (default true).
    pub fn span_name_label(mut self, on: bool) -> Self {
        self.span_name_label = Some(on);
        self
    }

    /// Whether samples carry `trace_id` (default true; Pyroscope's span link needs only
    /// `span_id`, and `trace_id` is about a quarter of each sample's bytes).
    pub fn trace_id_label(mut self, on: bool) -> Self {
        self.trace_id_label = Some(on);
        self
    }

    /// Threshold of the blocked-in-poll watchdog (default 10 ms; `None`: off); wins over
    /// `OTEL_PROFILING_BLOCKED_THRESHOLD`. See `docs/blocked-in-poll.md`.
    pub fn blocked_threshold(mut self, threshold: Option<Duration>) -> Self {
        self.blocked_threshold = Some(threshold);
        self
    }

    /// The mean bytes allocated between two allocation samples, per thread, when a
    /// [`ProfilingAllocator`](crate::ProfilingAllocator) is the global allocator (default
    /// 512 KiB; 0 switches allocation sampling off; wins over
    /// `OTEL_PROFILING_ALLOC_SAMPLE_BYTES`). See `docs/allocations.md`.
    pub fn allocation_sample_bytes(mut self, bytes: u64) -> Self {
        self.alloc_sample_bytes = Some(bytes);
        self
    }

    /// Whether sampled allocations are tracked until freed, for in-use memory by span
    /// (default off; wins over `OTEL_PROFILING_ALLOC_INUSE`). See
    /// [`ProfilerBuilder::allocation_inuse`](crate::ProfilerBuilder::allocation_inuse).
    pub fn allocation_inuse(mut self, on: bool) -> Self {
        self.alloc_inuse = Some(on);
        self
    }

    /// Whether to publish each thread's running local root span for profilers outside
    /// the process (the OpenTelemetry eBPF profiler, Datadog's agent): the OTEP 4947
    /// thread context and the OTEP 4719 process context with this resource (default
    /// true; wins over `OTEL_PROFILING_THREAD_CONTEXT`). See [`crate::thread_ctx`].
    pub fn thread_context(mut self, on: bool) -> Self {
        self.thread_context = Some(on);
        self
    }

    /// Which spans get `pyroscope.profile.id` (default: local roots).
    pub fn profile_id_scope(mut self, scope: ProfileIdScope) -> Self {
        self.scope = scope;
        self
    }

    /// What unsampled traces label (default: the root's name).
    pub fn unsampled_traces(mut self, unsampled: UnsampledTraces) -> Self {
        self.unsampled = unsampled;
        self
    }

    /// How long dropping the guard may take (default 5 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = Some(timeout);
        self
    }

    /// Starts everything and returns the guard; compose [`TelemetryGuard::layer`] into
    /// your own subscriber.
    pub fn build(mut self) -> Result<TelemetryGuard, SetupError> {
        // The code's TLS settings replace the environment's, whichever target they reach.
        if let Some(tls) = self.otlp_tls.take() {
            for target in [self.otlp.as_mut(), self.env.otlp.as_mut()]
                .into_iter()
                .flatten()
            {
                target.tls = tls.clone();
            }
            for target in [self.otlp_profiles.as_mut(), self.env.otlp_profiles.as_mut()]
                .into_iter()
                .flatten()
            {
                target.tls = tls.clone();
            }
        }
        // Code, then OTEL_SERVICE_NAME / PYROSCOPE_APPLICATION_NAME, then a `service.name`
        // resource attribute, then the code's default, then the SDK's `unknown_service`.
        let service_name = self
            .service_name
            .clone()
            .or_else(|| self.env.service_name.clone())
            .or_else(|| {
                self.env
                    .resource_attributes
                    .iter()
                    .rev()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .or_else(|| self.default_service_name.clone())
            .unwrap_or_else(|| "unknown_service".to_string());
        let mut attributes: Vec<(String, String)> = self.env.resource_attributes.clone();
        attributes.extend(self.resource.iter().cloned());
        attributes.retain(|(k, _)| k != "service.name");
        attributes.push(("service.name".into(), service_name.clone()));
        let resource = Resource::builder_empty()
            .with_attributes(
                attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build();
        let explicit_dir = self
            .output_dir
            .as_deref()
            .or(self.env.output_dir.as_deref());
        let dir = output_dir(explicit_dir);
        let timeout = self.shutdown_timeout.unwrap_or(Duration::from_secs(5));
        if self.env.sdk_disabled {
            // OTEL_SDK_DISABLED=true: spans are still created (the layers stay cheap
            // no-ops for labels), nothing is exported, no profiler runs.
            if !self.quiet.or(self.env.quiet).unwrap_or(false) {
                eprintln!(
                    "otel-profiling: OTEL_SDK_DISABLED=true: no spans are exported and no \
                     profiler is started"
                );
            }
            return Ok(TelemetryGuard {
                provider: SdkTracerProvider::builder().with_resource(resource).build(),
                profiler: None,
                pyroscope_stats: None,
                otlp_profiles_stats: None,
                span_stats: Arc::new(SpanExportStats::default()),
                spans_file: None,
                unsampled: self.unsampled,
                timeout,
                service_name,
                pid: std::process::id(),
                destinations: Destinations::default(),
                budget: None,
            });
        }
        let otlp = self.otlp_target();
        let (pyroscope, otlp_profiles) = self.profile_targets()?;
        // Before anything starts: a backend compiled out is an error, never ignored.
        backends::check(Compiled::THIS_BUILD, otlp, pyroscope)?;
        // Variables under our prefixes that nothing reads: one line each, saying where the
        // data goes instead when that is local files.
        let spans_local = otlp.is_none() && !self.env.traces_disabled;
        let profiles_local = pyroscope.is_none() && otlp_profiles.is_none();
        // A default directory that cannot be written (a read-only root file system, a
        // working directory the service may not write) costs the local files, not the
        // service; a directory the user named still fails setup, naming it.
        let mut local_ok = true;
        if explicit_dir.is_none() && (spans_local || profiles_local) {
            if let Err(error) = probe_writable(&dir) {
                eprintln!(
                    "otel-profiling: the default output directory {} cannot be written \
                     ({error}): no local profile or span files. Set OTEL_PROFILING_OUTPUT_DIR \
                     to a writable directory, or configure a backend.",
                    dir.display()
                );
                local_ok = false;
            }
        }
        let local = (spans_local || profiles_local) && local_ok;
        for note in &self.env.notes {
            eprintln!("{}", note.line(local.then_some(dir.as_path())));
        }
        for line in
            backends::unused_tls(otlp.map(|(t, _)| t), otlp_profiles.as_ref().map(|(t, _)| t))
        {
            eprintln!("{line}");
        }
        // The cap on labelled roots: the label table is never freed, so its bound is set
        // before any root of this setup is labelled.
        if let Some(max) = self.max_live_roots.or(self.env.max_live_roots) {
            if !(1..=crate::label::table::MAX_LABEL_SLOTS).contains(&max) {
                return Err(SetupError::Config(ConfigError::new(
                    "Telemetry::max_live_roots",
                    "not a number of roots between 1 and 8388608",
                    &max.to_string(),
                    "a count like `262144`",
                )));
            }
            crate::set_max_live_roots(max);
        }
        // The thread context, with the process context readers need first.
        let thread_context = self.thread_context.or(self.env.thread_context);
        if thread_context.unwrap_or(true) {
            match crate::thread_ctx::enable_with_resource(&attributes) {
                Ok(()) => {}
                // On by default where the platform has it; asked for explicitly, an error.
                Err(crate::thread_ctx::ThreadContextError::Unsupported)
                    if thread_context.is_none() => {}
                Err(err) => return Err(err.into()),
            }
        }
        backends::check_otlp_profiles(Compiled::THIS_BUILD, otlp_profiles.as_ref())?;

        let budget = Arc::new(LocalBudget::new(
            &dir,
            self.output_max_bytes
                .or(self.env.output_max_bytes)
                .unwrap_or(DEFAULT_OUTPUT_MAX_BYTES),
        ));
        // Profiles: Pyroscope if configured, else local files.
        let mut profiler = Profiler::builder()
            .output_dir(&dir)
            .local_budget(budget.clone());
        if !local_ok {
            profiler = profiler.local_files(false);
        }
        if let Some(hz) = self.frequency_hz.or(self.env.sample_rate_hz) {
            profiler = profiler.frequency_hz(hz);
        }
        if let Some(interval) = self.interval.or(self.env.upload_interval) {
            profiler = profiler.interval(interval);
        }
        if let Some(on) = self.span_name_label {
            profiler = profiler.span_name_label(on);
        }
        if let Some(on) = self.trace_id_label {
            profiler = profiler.trace_id_label(on);
        }
        if let Some(threshold) = self.blocked_threshold.or(self.env.blocked_threshold) {
            profiler = profiler.blocked_threshold(threshold);
        }
        if let Some(bytes) = self.alloc_sample_bytes {
            profiler = profiler.allocation_sample_bytes(bytes);
        }
        if let Some(on) = self.alloc_inuse {
            profiler = profiler.allocation_inuse(on);
        }
        let mut pyroscope_stats = None;
        if let Some((target, _)) = pyroscope {
            let mut labels = resource_series_labels(&attributes);
            // PYROSCOPE_LABELS, then the code's tags (a later name replaces an earlier one).
            labels.extend(self.env.profile_labels.iter().cloned());
            labels.extend(self.tags.iter().cloned());
            let (sink, stats) = backends::pyroscope_sink(target, &service_name, labels, timeout)?;
            pyroscope_stats = Some(stats);
            profiler = profiler.sink_boxed(sink);
        }
        let mut otlp_profiles_stats = None;
        if let Some((target, _)) = &otlp_profiles {
            let (sink, stats) = backends::otlp_profiles_sink(target, &attributes, timeout)?;
            otlp_profiles_stats = Some(stats);
            profiler = profiler.sink_boxed(sink);
        }

        // Spans: OTLP if configured, else local files; both with CPU evidence.
        let mut provider = SdkTracerProvider::builder().with_resource(resource);
        let mut spans_file = None;
        let span_stats;
        match otlp {
            Some((target, source)) => {
                (provider, span_stats) = backends::with_otlp(provider, target, source, self.scope)?
            }
            // OTEL_TRACES_EXPORTER=none (or no writable default directory): spans go
            // nowhere; the profiles are unaffected.
            None if self.env.traces_disabled || !local_ok => {
                span_stats = Arc::new(SpanExportStats::default())
            }
            None => {
                let exporter = LocalSpanExporter::new(&dir)
                    .map_err(|source| SetupError::LocalSpanFile {
                        dir: dir.clone(),
                        source,
                    })?
                    .with_budget(budget.clone());
                spans_file = Some(exporter.path().to_path_buf());
                let what = format!("local span file {}", exporter.path().display());
                (provider, span_stats) =
                    backends::add_span_exporter(provider, exporter, what, self.scope);
            }
        }
        let provider = provider.build();
        let destinations = Destinations {
            spans: match (otlp, &spans_file) {
                (Some((target, _)), _) => target.traces_url(),
                (None, Some(file)) => file.display().to_string(),
                (None, None) => "nowhere".to_owned(),
            },
            pyroscope: pyroscope.map(|(target, _)| target.server_address.clone()),
            otlp_profiles: otlp_profiles
                .as_ref()
                .map(|(target, _)| target.endpoint.clone()),
        };
        let profiler = profiler.start()?;
        if !self.quiet.or(self.env.quiet).unwrap_or(false) {
            let spans_dir = spans_file.as_deref().and_then(Path::parent);
            if let Some(line) = local_files_notice(profiler.output_dir(), spans_dir) {
                eprintln!("{line}");
            }
            if let Some(line) = backends_notice(&destinations, otlp.is_some()) {
                eprintln!("{line}");
            }
            let interval = self.interval.or(self.env.upload_interval);
            let to_pyroscope = pyroscope_stats.is_some() || otlp_profiles_stats.is_some();
            if let Some(line) = interval_notice(interval, to_pyroscope) {
                eprintln!("{line}");
            }
        }
        Ok(TelemetryGuard {
            provider,
            profiler: Some(profiler),
            pyroscope_stats,
            otlp_profiles_stats,
            span_stats,
            spans_file,
            unsampled: self.unsampled,
            timeout,
            service_name,
            pid: std::process::id(),
            destinations,
            budget: Some(budget),
        })
    }

    /// The OTLP target, code winning over the environment, and where it came from.
    fn otlp_target(&self) -> Option<(&OtlpTarget, Source)> {
        match (&self.otlp, &self.env.otlp) {
            (Some(target), _) => Some((target, Source::Builder)),
            (None, Some(target)) => Some((target, Source::Env)),
            (None, None) => None,
        }
    }

    /// The profile backends [`ProfilesExporter`] chooses: the Pyroscope target and the
    /// OTLP profiles target, each with where its setting came from. A choice that names a
    /// backend with no address is an error naming the setting.
    #[allow(clippy::type_complexity)]
    fn profile_targets(
        &self,
    ) -> Result<
        (
            Option<(&PyroscopeConfig, Source)>,
            Option<(OtlpProfilesConfig, Source)>,
        ),
        SetupError,
    > {
        let pyroscope = self.pyroscope_target();
        let (choice, field) = match (self.profiles_exporter, self.env.profiles_exporter) {
            (Some(choice), _) => (choice, "profiles_exporter"),
            (None, Some(choice)) => (choice, "OTEL_PROFILING_PROFILES_EXPORTER"),
            (None, None) => match (&self.otlp_profiles, pyroscope) {
                (Some(_), Some(_)) => (ProfilesExporter::Both, "otlp_profiles.endpoint"),
                (Some(_), None) => (ProfilesExporter::Otlp, "otlp_profiles.endpoint"),
                (None, _) => (ProfilesExporter::Pyroscope, "profiles_exporter"),
            },
        };
        let pyroscope = if choice.pyroscope() {
            match pyroscope {
                Some(target) => Some(target),
                // The default choice with no server: local files, as before.
                None if choice == ProfilesExporter::Pyroscope
                    && self.profiles_exporter.is_none()
                    && self.env.profiles_exporter.is_none() =>
                {
                    None
                }
                None => {
                    return Err(SetupError::Config(ConfigError::new(
                        field,
                        "profiles to Pyroscope need a server",
                        if choice == ProfilesExporter::Both {
                            "both"
                        } else {
                            "pyroscope"
                        },
                        "PYROSCOPE_SERVER_ADDRESS or Telemetry::pyroscope",
                    )))
                }
            }
        } else {
            None
        };
        let otlp_profiles = if choice.otlp() {
            let target = match (&self.otlp_profiles, &self.env.otlp_profiles, &self.otlp) {
                (Some(t), _, _) => (t.clone(), Source::Builder),
                (None, Some(t), _) => (t.clone(), Source::Env),
                (None, None, Some(traces)) => (
                    OtlpProfilesConfig::from_base(&traces.endpoint, traces.protocol, String::new())
                        .with_tls(traces.tls.clone()),
                    Source::Builder,
                ),
                (None, None, None) => {
                    return Err(SetupError::Config(ConfigError::new(
                        field,
                        "OTLP profiles need an endpoint",
                        if choice == ProfilesExporter::Both {
                            "both"
                        } else {
                            "otlp"
                        },
                        "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT or \
                         Telemetry::otlp_profiles",
                    )))
                }
            };
            Some(target)
        } else {
            None
        };
        Ok((pyroscope, otlp_profiles))
    }

    /// The Pyroscope target, code winning over the environment, and where it came from.
    fn pyroscope_target(&self) -> Option<(&PyroscopeConfig, Source)> {
        match (&self.pyroscope, &self.env.pyroscope) {
            (Some(target), _) => Some((target, Source::Builder)),
            (None, Some(target)) => Some((target, Source::Env)),
            (None, None) => None,
        }
    }

    /// [`build`](Self::build), then installs the layers as the global `tracing`
    /// subscriber and the provider as the global OpenTelemetry tracer provider.
    pub fn init(self) -> Result<TelemetryGuard, SetupError> {
        use tracing_subscriber::layer::SubscriberExt;
        let guard = self.build()?;
        let subscriber = tracing_subscriber::registry().with(guard.layer());
        tracing_core::dispatcher::set_global_default(tracing_core::Dispatch::new(subscriber))
            .map_err(|_| SetupError::GlobalSubscriber)?;
        opentelemetry::global::set_tracer_provider(guard.provider.clone());
        Ok(guard)
    }
}

/// The line printed at start saying where local files go (absolute), or `None` when
/// nothing is written locally.
fn local_files_notice(profiles_dir: Option<&Path>, spans_dir: Option<&Path>) -> Option<String> {
    let shown = |dir: &Path| {
        std::path::absolute(dir)
            .unwrap_or_else(|_| dir.to_path_buf())
            .display()
            .to_string()
    };
    let what = match (profiles_dir, spans_dir) {
        (Some(p), Some(s)) if p == s => format!("profiles and spans to {}", shown(p)),
        (Some(p), Some(s)) => format!("profiles to {} and spans to {}", shown(p), shown(s)),
        (Some(p), None) => format!("profiles to {}", shown(p)),
        (None, Some(s)) => format!("spans to {}", shown(s)),
        (None, None) => return None,
    };
    Some(format!("otel-profiling: writing {what}"))
}

/// The line printed at start naming the backends spans and profiles go to (the local
/// directory has its own, [`local_files_notice`]): a user with backends set sees where
/// the data goes, as one without sees the directory.
fn backends_notice(destinations: &Destinations, spans_over_otlp: bool) -> Option<String> {
    let mut parts = Vec::new();
    if spans_over_otlp {
        parts.push(format!("spans over OTLP to {}", destinations.spans));
    }
    if let Some(address) = &destinations.pyroscope {
        parts.push(format!("profiles to Pyroscope at {address}"));
    }
    if let Some(endpoint) = &destinations.otlp_profiles {
        parts.push(format!("profiles over OTLP to {endpoint}"));
    }
    (!parts.is_empty()).then(|| format!("otel-profiling: sending {}", parts.join("; ")))
}

/// Grafana's embedded span flame graph queries 30 s around the span.
const EMBEDDED_FLAME_GRAPH_WINDOW: Duration = Duration::from_secs(30);

/// The line printed at start when profiles go to Pyroscope with an upload interval longer
/// than Grafana's embedded flame-graph window: a profile is stamped with its interval's
/// start, so spans late in a longer interval fall outside that window.
fn interval_notice(interval: Option<Duration>, to_pyroscope: bool) -> Option<String> {
    let interval = interval?;
    (to_pyroscope && interval > EMBEDDED_FLAME_GRAPH_WINDOW).then(|| {
        format!(
            "otel-profiling: upload interval {interval:?} is longer than the 30 s Grafana's \
             span flame graph searches around a span: spans late in an interval will be \
             missing there (the \"Profiles for this span\" link searches 60 s); 10-30 s is safe"
        )
    })
}

/// Series labels from resource attributes, per [`RESOURCE_SERIES_LABELS`] (the Pyroscope
/// exporter adds `__name__` and `service_name` and checks the whole set).
pub fn resource_series_labels(attributes: &[(String, String)]) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = Vec::new();
    for (key, label) in RESOURCE_SERIES_LABELS {
        if let Some((_, value)) = attributes.iter().rev().find(|(k, _)| k == key) {
            labels.retain(|(l, _)| l != label);
            labels.push((label.to_string(), value.clone()));
        }
    }
    labels
}

/// Whether files can be made in `dir` (creating it): a probe file made and removed.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(".otel-profiling-probe-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// Everything running. Dropping it stops sampling, writes the last profile, uploads what
/// is queued and flushes spans, each bounded by the shutdown timeout.
///
/// Keep it for the life of the service. A guard dropped at once — `init()?;` as a
/// statement, the way `tracing_subscriber::fmt().init()` is called — would stop
/// everything before the first sample, so it is a compiler warning (`unused_must_use`)
/// whose message says to keep it:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// fn main() -> Result<(), otel_profiling::SetupError> {
///     otel_profiling::Telemetry::builder().service_name("svc").init()?;
///     Ok(())
/// }
/// ```
///
/// ```no_run
/// #![deny(unused_must_use)]
/// fn main() -> Result<(), otel_profiling::SetupError> {
///     let _telemetry = otel_profiling::Telemetry::builder().service_name("svc").init()?;
///     // … the service runs here; `_telemetry` is dropped (and flushed) when main returns.
///     Ok(())
/// }
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard stops profiling and span export at once: keep it for the \
              life of the service (`let _telemetry = ….init()?;`)"]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
    profiler: Option<Profiler>,
    pyroscope_stats: Option<Arc<PyroscopeStats>>,
    otlp_profiles_stats: Option<Arc<PyroscopeStats>>,
    span_stats: Arc<SpanExportStats>,
    spans_file: Option<PathBuf>,
    unsampled: UnsampledTraces,
    timeout: Duration,
    service_name: String,
    /// The process that set it up (a forked child's copy shuts nothing down).
    pid: u32,
    /// Where each exporter sends, for what the shutdown line says was lost.
    destinations: Destinations,
    /// The bound on the local directory, when files go there.
    budget: Option<Arc<LocalBudget>>,
}

/// Where the exporters send (URLs, or the local span file).
#[derive(Debug, Default)]
struct Destinations {
    spans: String,
    pyroscope: Option<String>,
    otlp_profiles: Option<String>,
}

/// Health counters of the whole pipeline: a snapshot ([`TelemetryGuard::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthStats {
    /// Sampler and collector counters.
    pub profiler: ProfilerStats,
    /// Pyroscope upload counters, when profiles go to Pyroscope.
    pub pyroscope: Option<crate::export::pyroscope::PyroscopeSnapshot>,
    /// OTLP profiles upload counters (the same kind), when profiles go over OTLP.
    pub otlp_profiles: Option<crate::export::pyroscope::PyroscopeSnapshot>,
    /// Span export counters (OTLP or the local span file): batches and spans sent and
    /// failed. Failures are also logged, the first at once, then at most once a minute.
    pub spans: SpanExportSnapshot,
    /// Local profile and span files removed to keep the directory within
    /// `OTEL_PROFILING_OUTPUT_MAX_BYTES` (the first removal is also said on stderr).
    pub local_files_removed: u64,
    /// Their bytes.
    pub local_bytes_removed: u64,
    /// The span record's process-wide tables: their sizes and what they refused
    /// (docs/bounds.md).
    pub record: crate::RecordStats,
}

impl TelemetryGuard {
    /// The `tracing` layers: `tracing-opentelemetry` with this provider's tracer, and the
    /// profiling layer.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("otel-profiling");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .and_then(ProfilingLayer::new().with_unsampled(self.unsampled))
    }

    /// The tracer provider (for plain OpenTelemetry API users).
    pub fn tracer_provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// The service name in use.
    pub fn service_name(&self) -> &str {
        &self.service_name
    }

    /// Where local profile files go, if profiles are written locally.
    pub fn profiles_dir(&self) -> Option<&Path> {
        self.profiler.as_ref().and_then(Profiler::output_dir)
    }

    /// The local span file, if spans are written locally.
    pub fn spans_file(&self) -> Option<&Path> {
        self.spans_file.as_deref()
    }

    /// Counters: samples taken/dropped, profiles exported/failed, uploads, bytes queued.
    pub fn stats(&self) -> HealthStats {
        HealthStats {
            profiler: self
                .profiler
                .as_ref()
                .map(Profiler::stats)
                .unwrap_or_default(),
            pyroscope: self.pyroscope_stats.as_ref().map(|s| s.snapshot()),
            otlp_profiles: self.otlp_profiles_stats.as_ref().map(|s| s.snapshot()),
            spans: self.span_stats.snapshot(),
            local_files_removed: self.budget.as_ref().map_or(0, |b| b.removed().0),
            local_bytes_removed: self.budget.as_ref().map_or(0, |b| b.removed().1),
            record: crate::record_stats(),
        }
    }

    /// Ends the current profile now and flushes spans.
    pub fn flush(&self) {
        if let Some(p) = &self.profiler {
            p.flush(self.timeout);
        }
        let _ = self.provider.force_flush();
    }

    /// Stops everything (same as dropping).
    pub fn shutdown(self) {}
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // Inherited through fork: the exporters' threads are the parent's, and the
            // SDK's batch processor would wait its whole timeout for one. Nothing is shut
            // down here (the profiler's parts leave themselves alone in a child too);
            // the provider is kept alive so its own drop does not shut it down either.
            std::mem::forget(self.provider.clone());
            return;
        }
        // One timeout for everything: the spans flush on a thread of their own while the
        // profiler writes and uploads its last profiles (one after the other, each with the
        // whole timeout, took twice it against a backend that never answers).
        let profiler = self.profiler.take();
        let provider = &self.provider;
        let timeout = self.timeout;
        std::thread::scope(|scope| {
            let spans = std::thread::Builder::new()
                .name("otel-profiling-shutdown".into())
                .spawn_scoped(scope, move || {
                    let _ = provider.shutdown_with_timeout(timeout);
                });
            if let Some(profiler) = profiler {
                profiler.shutdown(timeout);
            }
            match spans {
                Ok(spans) => {
                    let _ = spans.join();
                }
                // No thread to spare: the spans get what is left of the timeout.
                Err(_) => {
                    let _ = provider.shutdown_with_timeout(timeout / 2);
                }
            }
        });
        if let Some(line) = self.losses() {
            eprintln!("{line}");
        }
    }
}

impl TelemetryGuard {
    /// One line on what the exporters lost over the guard's life (failed, dropped, or still
    /// queued at shutdown), naming where it was going; `None` when nothing was lost.
    fn losses(&self) -> Option<String> {
        let mut lost = Vec::new();
        let spans = self.span_stats.snapshot();
        let unsent = spans
            .spans_ended
            .saturating_sub(spans.spans_sent + spans.spans_failed);
        if spans.spans_failed + unsent > 0 {
            lost.push(format!(
                "{} span(s) to {} ({} in failed batches, {unsent} never sent)",
                spans.spans_failed + unsent,
                self.destinations.spans,
                spans.spans_failed
            ));
        }
        for (stats, to) in [
            (&self.pyroscope_stats, &self.destinations.pyroscope),
            (&self.otlp_profiles_stats, &self.destinations.otlp_profiles),
        ] {
            let (Some(stats), Some(to)) = (stats, to) else {
                continue;
            };
            let s = stats.snapshot();
            let profiles = s.profiles_failed + s.profiles_dropped + s.profiles_queued;
            if profiles > 0 {
                lost.push(format!("{profiles} profile(s) to {to}"));
            }
        }
        (!lost.is_empty()).then(|| {
            format!(
                "otel-profiling: not exported (failed, dropped, or still queued when the {} ms \
                 shutdown timeout ran out): {}",
                self.timeout.as_millis(),
                lost.join("; ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The service name: code, then the environment (`OTEL_SERVICE_NAME`, then a
    /// `service.name` resource attribute), then `default_service_name`, then
    /// `unknown_service`. Under OTEL_SDK_DISABLED, so nothing starts.
    #[test]
    fn default_service_name_yields_to_the_environment() {
        let name = |vars: &[(&str, &str)], code: Option<&str>, default: Option<&str>| {
            let mut vars = vars.to_vec();
            vars.push(("OTEL_SDK_DISABLED", "true"));
            let env = EnvConfig::from_lookup(|name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            })
            .expect("valid variables");
            let mut telemetry = Telemetry::from_env_config(env).quiet(true);
            if let Some(code) = code {
                telemetry = telemetry.service_name(code);
            }
            if let Some(default) = default {
                telemetry = telemetry.default_service_name(default);
            }
            telemetry.build().expect("setup").service_name().to_owned()
        };
        assert_eq!(name(&[], None, Some("dflt")), "dflt");
        assert_eq!(
            name(&[("OTEL_SERVICE_NAME", "svc")], None, Some("dflt")),
            "svc"
        );
        assert_eq!(
            name(&[("PYROSCOPE_APPLICATION_NAME", "app")], None, Some("dflt")),
            "app"
        );
        assert_eq!(
            name(
                &[("OTEL_RESOURCE_ATTRIBUTES", "service.name=res,team=a")],
                None,
                Some("dflt")
            ),
            "res"
        );
        assert_eq!(
            name(&[("OTEL_SERVICE_NAME", "svc")], Some("code"), Some("dflt")),
            "code"
        );
        assert_eq!(name(&[], None, None), "unknown_service");
    }

    /// The profile type id Grafana must query is what the profiles really are: the series
    /// name, then the pprof sample type and period type.
    #[test]
    fn profile_type_id_matches_the_profiles() {
        use crate::export::pyroscope::{PROFILE_NAME, PROFILE_TYPE_ID};
        let profile = crate::pprof::ProfileBuilder::new(
            10_000_000,
            std::time::SystemTime::now(),
            Duration::from_secs(1),
        )
        .build_proto();
        let s = |i: i64| profile.string_table[i as usize].clone();
        let sample = &profile.sample_type[0];
        let period = profile.period_type.as_ref().expect("period type");
        let derived = format!(
            "{PROFILE_NAME}:{}:{}:{}:{}",
            s(sample.r#type),
            s(sample.unit),
            s(period.r#type),
            s(period.unit)
        );
        assert_eq!(derived, PROFILE_TYPE_ID);
    }

    /// `main` returning `Result<_, SetupError>` prints the error with `Debug`: it must carry
    /// the same hint as `Display`, not a bare `GlobalSubscriber`.
    #[test]
    fn setup_error_debug_is_the_display_message() {
        let e = SetupError::GlobalSubscriber;
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(format!("{e:?}").contains("build()"), "{e:?}");
        let e = SetupError::from(ConfigError::new(
            "PYROSCOPE_SAMPLE_RATE",
            "not a sampling rate",
            "fast",
            "an integer from 1 to 1000 (samples per second)",
        ));
        assert_eq!(format!("{e:?}"), e.to_string());
        assert!(
            format!("{e:?}").starts_with("PYROSCOPE_SAMPLE_RATE: "),
            "{e:?}"
        );
        let e = SetupError::LocalSpanFile {
            dir: PathBuf::from("/x"),
            source: std::io::Error::other("bad"),
        };
        assert_eq!(format!("{e:?}"), "local span file: /x: bad");
    }

    /// One line saying where local files go (absolute), and none when nothing is local.
    #[test]
    fn a_long_upload_interval_to_pyroscope_is_flagged() {
        assert_eq!(interval_notice(None, true), None);
        assert_eq!(interval_notice(Some(Duration::from_secs(30)), true), None);
        assert_eq!(interval_notice(Some(Duration::from_secs(60)), false), None);
        let line = interval_notice(Some(Duration::from_secs(60)), true).expect("a line");
        assert!(line.contains("60s") && line.contains("30 s"), "{line}");
    }

    #[test]
    fn backends_notice_names_where_spans_and_profiles_go() {
        let to = |spans: &str, pyroscope: Option<&str>, otlp_profiles: Option<&str>| Destinations {
            spans: spans.to_owned(),
            pyroscope: pyroscope.map(str::to_owned),
            otlp_profiles: otlp_profiles.map(str::to_owned),
        };
        assert_eq!(
            backends_notice(
                &to(
                    "http://tempo:4318/v1/traces",
                    Some("http://pyroscope:4040"),
                    None
                ),
                true
            )
            .as_deref(),
            Some(
                "otel-profiling: sending spans over OTLP to http://tempo:4318/v1/traces; \
                 profiles to Pyroscope at http://pyroscope:4040"
            )
        );
        // Spans to the local file (its own line), profiles over OTLP.
        assert_eq!(
            backends_notice(
                &to("/tmp/x_spans.jsonl", None, Some("http://c:4317")),
                false
            )
            .as_deref(),
            Some("otel-profiling: sending profiles over OTLP to http://c:4317")
        );
        assert_eq!(backends_notice(&to("nowhere", None, None), false), None);
    }

    #[test]
    fn local_files_notice_names_the_directory() {
        let abs = Path::new("/data/otel-profiling");
        assert_eq!(
            local_files_notice(Some(abs), Some(abs)).as_deref(),
            Some("otel-profiling: writing profiles and spans to /data/otel-profiling")
        );
        assert_eq!(
            local_files_notice(Some(abs), None).as_deref(),
            Some("otel-profiling: writing profiles to /data/otel-profiling")
        );
        assert_eq!(
            local_files_notice(None, Some(abs)).as_deref(),
            Some("otel-profiling: writing spans to /data/otel-profiling")
        );
        assert_eq!(local_files_notice(None, None), None);
        let rel =
            local_files_notice(Some(Path::new("target/otel-profiling")), None).expect("a line");
        let cwd = std::env::current_dir().expect("cwd");
        assert_eq!(
            rel,
            format!(
                "otel-profiling: writing profiles to {}",
                cwd.join("target/otel-profiling").display()
            )
        );
    }

    /// Endpoint errors from the builder suggest the protocol's own port, not Pyroscope's.
    #[test]
    fn builder_endpoint_errors_suggest_the_right_port() {
        let e = Telemetry::builder()
            .otlp("tempo:4317", OtlpProtocol::Grpc)
            .expect_err("no scheme");
        let msg = e.to_string();
        assert!(msg.starts_with("otlp.endpoint: "), "{msg}");
        assert!(
            msg.contains("http://localhost:4317") && !msg.contains("4040"),
            "{msg}"
        );
        let e = Telemetry::builder()
            .otlp("tempo:4318", OtlpProtocol::HttpProtobuf)
            .expect_err("no scheme");
        assert!(e.to_string().contains("http://localhost:4318"), "{e}");
    }

    /// A build without a backend refuses its configuration at `build()`, before anything
    /// starts, naming the variable and the feature (these run in CI's
    /// `--no-default-features` pass; `backends` tests every combination in any build).
    #[cfg(not(all(feature = "pyroscope", feature = "otlp-http", feature = "otlp-grpc")))]
    fn refused(vars: &[(&str, &str)]) -> String {
        let env = EnvConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
        .expect("valid variables");
        match Telemetry::from_env_config(env).quiet(true).build() {
            Err(e @ SetupError::FeatureDisabled { .. }) => e.to_string(),
            Err(e) => panic!("expected FeatureDisabled, got {e}"),
            Ok(_) => panic!("a compiled-out backend was accepted: {vars:?}"),
        }
    }

    #[cfg(not(feature = "otlp-grpc"))]
    #[test]
    fn grpc_without_its_feature_fails_setup() {
        let msg = refused(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        assert!(
            msg.starts_with(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the otel-profiling feature \"otlp-grpc\""
            ),
            "{msg}"
        );
    }

    #[cfg(not(feature = "otlp-http"))]
    #[test]
    fn otlp_http_without_its_feature_fails_setup() {
        let msg = refused(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")]);
        assert!(
            msg.starts_with(
                "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 needs the otel-profiling \
                 feature \"otlp-http\""
            ),
            "{msg}"
        );
    }

    #[cfg(not(feature = "pyroscope"))]
    #[test]
    fn pyroscope_without_its_feature_fails_setup() {
        let msg = refused(&[("PYROSCOPE_SERVER_ADDRESS", "http://localhost:4040")]);
        assert!(
            msg.starts_with(
                "PYROSCOPE_SERVER_ADDRESS=http://localhost:4040 needs the otel-profiling \
                 feature \"pyroscope\""
            ),
            "{msg}"
        );
    }

    /// The exporter's own refusal reaches the caller typed (`SetupError::Pyroscope`, not
    /// a string), its message naming the setting.
    #[cfg(feature = "pyroscope")]
    #[test]
    fn a_bad_series_label_fails_setup_typed_and_naming_the_setting() {
        let err = Telemetry::builder()
            .quiet(true)
            .thread_context(false)
            .profile_tag("bad-name", "x")
            .pyroscope("http://127.0.0.1:1", None, None)
            .expect("valid url")
            .build()
            .map(|_| ())
            .expect_err("bad label name");
        let msg = err.to_string();
        assert!(
            msg.starts_with("pyroscope.labels: ") && msg.contains("bad-name"),
            "{msg}"
        );
        assert!(
            matches!(err, SetupError::Pyroscope(PyroscopeError::LabelName { .. })),
            "{msg}"
        );
    }

    #[test]
    fn resource_attributes_become_series_labels() {
        let attrs: Vec<(String, String)> = [
            ("service.name", "checkout"),
            ("service.version", "2.0.1"),
            ("deployment.environment.name", "staging"),
            ("service.instance.id", "pod-7"),
            ("team", "payments"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let labels = resource_series_labels(&attrs);
        assert_eq!(
            labels,
            vec![
                ("service_name".to_string(), "checkout".to_string()),
                ("service_version".to_string(), "2.0.1".to_string()),
                ("service_instance_id".to_string(), "pod-7".to_string()),
                ("deployment_environment".to_string(), "staging".to_string()),
            ]
        );
    }

    fn setup_error(vars: &[(&str, &str)]) -> String {
        let env = EnvConfig::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
        .expect("valid variables");
        match Telemetry::from_env_config(env).quiet(true).build() {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {vars:?}"),
        }
    }

    /// Choosing a profiles backend that has no address fails at setup, naming the setting.
    #[test]
    fn a_profiles_exporter_without_its_address_fails_naming_the_variable() {
        let msg = setup_error(&[("OTEL_PROFILING_PROFILES_EXPORTER", "otlp")]);
        assert!(
            msg.starts_with("OTEL_PROFILING_PROFILES_EXPORTER: "),
            "{msg}"
        );
        assert!(
            msg.contains("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"),
            "{msg}"
        );
        let msg = setup_error(&[
            ("OTEL_PROFILING_PROFILES_EXPORTER", "both"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                "http://localhost:1/v1development/profiles",
            ),
        ]);
        assert!(
            msg.starts_with("OTEL_PROFILING_PROFILES_EXPORTER: "),
            "{msg}"
        );
        assert!(msg.contains("PYROSCOPE_SERVER_ADDRESS"), "{msg}");
        let err = Telemetry::builder()
            .quiet(true)
            .profiles_exporter(ProfilesExporter::Otlp)
            .build()
            .map(|_| ())
            .expect_err("no endpoint");
        assert!(err.to_string().starts_with("profiles_exporter: "), "{err}");
    }

    #[cfg(not(feature = "otlp-http"))]
    #[test]
    fn otlp_profiles_without_the_http_feature_fail_setup() {
        let msg = refused(&[(
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://localhost:4040/v1development/profiles",
        )]);
        assert!(
            msg.starts_with(
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT=http://localhost:4040/v1development/profiles \
                 needs the otel-profiling feature \"otlp-http\""
            ),
            "{msg}"
        );
    }
}
