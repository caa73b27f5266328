//! Configuration from the environment, following both ecosystems' conventions.
//!
//! | variable | meaning | accepted form |
//! |---|---|---|
//! | `OTEL_SERVICE_NAME` | service name (wins over `PYROSCOPE_APPLICATION_NAME`) | non-empty text |
//! | `OTEL_RESOURCE_ATTRIBUTES` | resource attributes | `key=value,key2=value2` (values percent-decoded) |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | OTLP receiver for traces (Tempo); `/v1/traces` is appended for HTTP | `http(s)://host:port` |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the traces URL itself, used as given (wins over the generic endpoint) | `http://localhost:4318/v1/traces` |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` | OTLP protocol (the signal's own wins) | `http/protobuf` (default) or `grpc` |
//! | `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TRACES_HEADERS` | headers of span export requests (the signal's own wins) | `name=value,name2=value2` (values percent-decoded) |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` | span export timeout (the signal's own wins; default 10 s) | whole milliseconds |
//! | `OTEL_EXPORTER_OTLP_COMPRESSION`, `…_TRACES_COMPRESSION`, `…_PROFILES_COMPRESSION` | gzip requests (the signal's own wins) | `gzip` or `none` |
//! | `OTEL_EXPORTER_OTLP_CERTIFICATE`, `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY` (and their `TRACES_`/`PROFILES_` forms) | client TLS of `https://` endpoints: the trusted certificates, mutual TLS (see [`ClientTls`]) | PEM file paths |
//! | `OTEL_EXPORTER_OTLP_INSECURE` (and its `TRACES_`/`PROFILES_` forms) | scheme of a gRPC endpoint written without one | `true` (`http://`) or `false` (`https://`, the default) |
//! | `OTEL_TRACES_EXPORTER` | `none`: spans are exported nowhere (local files included) | `otlp` (default) or `none` |
//! | `OTEL_SDK_DISABLED` | `true`: no span exported, no profiler started, nothing written | `true` or `false` |
//! | `PYROSCOPE_SERVER_ADDRESS` | Pyroscope server for profiles | `http(s)://host:port` |
//! | `PYROSCOPE_APPLICATION_NAME` | service name when `OTEL_SERVICE_NAME` is unset | non-empty text |
//! | `PYROSCOPE_BASIC_AUTH_USER`, `PYROSCOPE_BASIC_AUTH_PASSWORD` | basic auth (both or neither) | text |
//! | `PYROSCOPE_AUTH_TOKEN` | bearer token (instead of basic auth) | text |
//! | `PYROSCOPE_TENANT_ID` | `X-Scope-OrgID` header | text |
//! | `PYROSCOPE_LABELS` | static series labels on every profile | `key=value,key2=value2` |
//! | `PYROSCOPE_HTTP_HEADERS` | extra headers of Pyroscope pushes | a JSON object, `{"X-Header": "value"}` |
//! | `PYROSCOPE_SAMPLE_RATE` | samples per second | integer 1–1000 |
//! | `PYROSCOPE_UPLOAD_INTERVAL` | profile length, 100 ms to 60 s ([`MAX_PROFILE_INTERVAL`](crate::collector::MAX_PROFILE_INTERVAL): Grafana's span link searches 60 s around a span) | `10s`, `500ms`, `1m` or whole seconds (`10`); no space before the unit (`10 s` is rejected, as Go's `time.ParseDuration` that Pyroscope's own agents use rejects it) |
//! | `OTEL_PROFILING_OUTPUT_DIR` | local files directory (no backend configured); default `$CARGO_TARGET_DIR/otel-profiling` when `CARGO_TARGET_DIR` is set, else `target/otel-profiling` (see [`crate::local_sink`]) | a path |
//! | `OTEL_PROFILING_MAX_LIVE_ROOTS` | the most local roots labelled at once; past it a root's samples carry no span labels, counted (default 262144; see [`crate::set_max_live_roots`]) | 1 to 8388608 |
//! | `OTEL_PROFILING_OUTPUT_MAX_BYTES` | bound on our files in the local directory, oldest removed first (default 256 MiB; the standalone `ProfilerBuilder` reads it too) | bytes, or `64KiB`, `256MiB`, `1GiB`; `0` for no bound at all (the explicit opt-out: the directory then grows without end) |
//! | `OTEL_PROFILING_ALLOC_SAMPLE_BYTES` | mean bytes between two allocation samples, per thread, with a `ProfilingAllocator` as the global allocator (default 512 KiB; `ProfilerBuilder::allocation_sample_bytes` wins) | bytes, or `64KiB`, `1MiB`; `0` switches allocation sampling off; at most 1 TiB |
//! | `OTEL_PROFILING_ALLOC_INUSE` | track sampled allocations until they are freed, for in-use memory by span (`inuse_objects`, `inuse_space`; default off; `ProfilerBuilder::allocation_inuse` wins; see `docs/allocations.md`) | `true` or `false` |
//! | `OTEL_PROFILING_BLOCKED_THRESHOLD` | how long a thread must be held inside one poll of a span, off-CPU in a system call, before its stack goes into the blocked-in-poll profile (default 10ms; see `docs/blocked-in-poll.md`) | `10ms`, `50ms`, `1s` (1 ms to 60 s), or `off` (no watchdog) |
//! | `OTEL_PROFILING_PROFILES_EXPORTER` | where profiles go: Pyroscope's push API, OTLP profiles, or both. Unset: `otlp` when `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` is set (`both` if `PYROSCOPE_SERVER_ADDRESS` is set too), else Pyroscope when configured | `pyroscope`, `otlp` or `both` |
//! | `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` | OTLP profiles receiver, used as given; else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1development/profiles` (HTTP) | `http://localhost:4040/v1development/profiles` (Pyroscope), `http://localhost:4318/v1development/profiles` (Collector) |
//! | `OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL` | OTLP profiles protocol; else `OTEL_EXPORTER_OTLP_PROTOCOL` | `http/protobuf` (default) or `grpc` |
//! | `OTEL_EXPORTER_OTLP_PROFILES_HEADERS` | headers of OTLP profiles requests; else `OTEL_EXPORTER_OTLP_HEADERS` | `name=value,name2=value2` (values percent-decoded) |
//! | `OTEL_PROFILING_QUIET` | no stderr line at start saying where local files go (`Telemetry::quiet` wins) | `1`/`true` or `0`/`false` |
//! | `OTEL_PROFILING_THREAD_CONTEXT` | publish each thread's running span for profilers outside the process (OTEP 4947 thread context and OTEP 4719 process context; default on; `Telemetry::thread_context` wins; see [`crate::thread_ctx`]) | `1`/`true` or `0`/`false` |
//!
//! An empty variable counts as unset. A malformed one fails setup with an error naming the
//! variable and the accepted form. Secrets never appear in `Debug` output or errors.
//!
//! The reader builds the exporters' own settings where they exist: the `PYROSCOPE_*`
//! variables become a [`PyroscopeConfig`] and the `OTEL_EXPORTER_OTLP_PROFILES_*` ones an
//! [`OtlpProfilesConfig`] (one type each, whether set here or in code), and every
//! URL is checked by the one URL check the exporters use too.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::export::otlp_profiles::OtlpProfilesConfig;
use crate::export::pyroscope::{PyroscopeAuth, PyroscopeConfig};
use crate::local_sink::output_dir_variable;

pub use crate::export::tls::ClientTls;

/// A configuration value that was malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem} (got {value:?}; expected {expected})")]
pub struct ConfigError {
    /// The variable or builder field.
    pub field: &'static str,
    /// What is wrong.
    pub problem: &'static str,
    /// The offending value (redacted for secrets).
    pub value: String,
    /// The accepted form.
    pub expected: &'static str,
}

impl ConfigError {
    pub(crate) fn new(
        field: &'static str,
        problem: &'static str,
        value: &str,
        expected: &'static str,
    ) -> ConfigError {
        ConfigError {
            field,
            problem,
            value: value.to_string(),
            expected,
        }
    }
}

/// OTLP transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OtlpProtocol {
    /// OTLP over HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    #[default]
    HttpProtobuf,
    /// OTLP over gRPC (port 4317).
    Grpc,
}

/// Where traces go.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OtlpTarget {
    /// Base endpoint, e.g. `http://localhost:4318` (HTTP) or `http://localhost:4317`
    /// (gRPC); or, from `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, the traces URL itself.
    pub endpoint: String,
    /// Transport.
    pub protocol: OtlpProtocol,
    /// Request headers (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else `_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// Export timeout (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `_TIMEOUT`, in ms);
    /// `None`: the exporter's default (10 s).
    pub timeout: Option<Duration>,
    /// gzip request bodies (`OTEL_EXPORTER_OTLP_TRACES_COMPRESSION`, else
    /// `_COMPRESSION`, `gzip`; default `none`).
    pub gzip: bool,
    /// Client TLS of `https://` endpoints (`OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE`,
    /// `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`, else the generic ones); default: the
    /// platform's trusted certificates, no client certificate.
    pub tls: ClientTls,
    /// `endpoint` is the signal's own URL: used as given, no `/v1/traces` appended.
    signal_endpoint: bool,
    /// The variables (or builder fields) the endpoint and protocol came from, for errors.
    fields: (&'static str, &'static str),
}

impl OtlpTarget {
    /// A base endpoint set in code ([`Telemetry::otlp`](crate::Telemetry::otlp)).
    pub fn new(endpoint: impl Into<String>, protocol: OtlpProtocol) -> OtlpTarget {
        OtlpTarget {
            endpoint: endpoint.into(),
            protocol,
            headers: Vec::new(),
            timeout: None,
            gzip: false,
            tls: ClientTls::new(),
            signal_endpoint: false,
            fields: ("otlp.endpoint", "otlp.protocol"),
        }
    }

    /// The URL the exporter is given: for HTTP the signal path `/v1/traces` is appended to
    /// a base endpoint; a signal-specific one is used as given (the OpenTelemetry spec).
    pub fn traces_url(&self) -> String {
        match self.protocol {
            OtlpProtocol::HttpProtobuf if !self.signal_endpoint => {
                format!("{}/v1/traces", self.endpoint.trim_end_matches('/'))
            }
            _ => self.endpoint.clone(),
        }
    }

    /// The variable or builder field the endpoint came from.
    pub(crate) fn endpoint_field(&self) -> &'static str {
        self.fields.0
    }

    /// The variable or builder field the protocol came from.
    pub(crate) fn protocol_field(&self) -> &'static str {
        self.fields.1
    }
}

/// Which exporters get the profiles (`OTEL_PROFILING_PROFILES_EXPORTER`,
/// [`Telemetry::profiles_exporter`](crate::Telemetry::profiles_exporter)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProfilesExporter {
    /// Pyroscope's push API (`PYROSCOPE_SERVER_ADDRESS`).
    Pyroscope,
    /// OTLP profiles (`OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT`, else the generic endpoint).
    Otlp,
    /// Both, the same profiles to each.
    Both,
}

impl ProfilesExporter {
    /// Whether the Pyroscope push is chosen.
    pub fn pyroscope(self) -> bool {
        matches!(self, ProfilesExporter::Pyroscope | ProfilesExporter::Both)
    }

    /// Whether OTLP profiles are chosen.
    pub fn otlp(self) -> bool {
        matches!(self, ProfilesExporter::Otlp | ProfilesExporter::Both)
    }

    /// Reads `pyroscope`, `otlp` or `both` (case-insensitive).
    pub fn parse(field: &'static str, value: &str) -> Result<ProfilesExporter, ConfigError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "pyroscope" => Ok(ProfilesExporter::Pyroscope),
            "otlp" => Ok(ProfilesExporter::Otlp),
            "both" => Ok(ProfilesExporter::Both),
            _ => Err(ConfigError::new(
                field,
                "unknown profiles exporter",
                value,
                "`pyroscope`, `otlp` or `both`",
            )),
        }
    }
}

/// Everything the environment said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnvConfig {
    /// `OTEL_SERVICE_NAME` or `PYROSCOPE_APPLICATION_NAME`.
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order.
    pub resource_attributes: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_TRACES_{ENDPOINT,PROTOCOL,HEADERS,TIMEOUT}`, each falling back
    /// to the generic `OTEL_EXPORTER_OTLP_*`.
    pub otlp: Option<OtlpTarget>,
    /// `OTEL_TRACES_EXPORTER=none`: spans are exported nowhere (not to local files either).
    pub traces_disabled: bool,
    /// `OTEL_SDK_DISABLED=true`: no span exported and no profiler started.
    pub sdk_disabled: bool,
    /// Variables under this crate's prefixes that it does not read (typos, settings not
    /// applied): setup names each once. Only [`EnvConfig::from_env`] fills it (a lookup
    /// cannot list the names).
    pub(crate) notes: Vec<super::env_names::EnvNote>,
    /// `PYROSCOPE_SERVER_ADDRESS`, `PYROSCOPE_BASIC_AUTH_*`, `PYROSCOPE_AUTH_TOKEN` and
    /// `PYROSCOPE_TENANT_ID`, read straight into the exporter's settings (the application
    /// name is the service name read here; [`Telemetry::build`](crate::Telemetry::build)
    /// sets it and the series labels from the service name and resource in use).
    pub pyroscope: Option<PyroscopeConfig>,
    /// `PYROSCOPE_LABELS`: static series labels on every profile (`key=value,…`, the
    /// Pyroscope Java agent's form), before those set in code.
    pub profile_labels: Vec<(String, String)>,
    /// `PYROSCOPE_SAMPLE_RATE`.
    pub sample_rate_hz: Option<u32>,
    /// `PYROSCOPE_UPLOAD_INTERVAL`.
    pub upload_interval: Option<Duration>,
    /// `OTEL_PROFILING_OUTPUT_DIR`.
    pub output_dir: Option<PathBuf>,
    /// `OTEL_PROFILING_OUTPUT_MAX_BYTES`: the bound on the local directory (0: none).
    pub output_max_bytes: Option<u64>,
    /// `OTEL_PROFILING_MAX_LIVE_ROOTS`: the most local roots labelled at once.
    pub max_live_roots: Option<u64>,
    /// `OTEL_PROFILING_QUIET`: no stderr line saying where local files go.
    pub quiet: Option<bool>,
    /// `OTEL_PROFILING_BLOCKED_THRESHOLD`: `Some(None)` for `off`.
    pub blocked_threshold: Option<Option<Duration>>,
    /// `OTEL_PROFILING_THREAD_CONTEXT`: publish the OTEP 4947 thread context.
    pub thread_context: Option<bool>,
    /// `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` / `_PROTOCOL` / `_HEADERS`, each falling back
    /// to the generic `OTEL_EXPORTER_OTLP_*`: where OTLP profiles would go, read straight
    /// into the exporter's settings ([`Telemetry::build`](crate::Telemetry::build) sets the
    /// resource from the one in use).
    pub otlp_profiles: Option<OtlpProfilesConfig>,
    /// `OTEL_PROFILING_PROFILES_EXPORTER`; when unset, `otlp` is implied by
    /// `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` (with Pyroscope too when
    /// `PYROSCOPE_SERVER_ADDRESS` is set), else profiles go to Pyroscope when configured.
    pub profiles_exporter: Option<ProfilesExporter>,
}

impl EnvConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<EnvConfig, ConfigError> {
        let mut config = EnvConfig::from_lookup(|name| std::env::var(name).ok())?;
        let names: Vec<String> = std::env::vars_os()
            .filter(|(_, value)| !value.is_empty())
            .filter_map(|(name, _)| name.into_string().ok())
            .collect();
        config.notes = super::env_names::check(names.iter().map(String::as_str));
        Ok(config)
    }

    /// Reads variables through `lookup` (for tests and embedding).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<EnvConfig, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = EnvConfig {
            service_name: get("OTEL_SERVICE_NAME").or_else(|| get("PYROSCOPE_APPLICATION_NAME")),
            ..EnvConfig::default()
        };
        if let Some(v) = get("OTEL_RESOURCE_ATTRIBUTES") {
            config.resource_attributes = parse_resource_attributes(&v)?;
        }
        config.otlp = otlp_traces_from(&get)?;
        config.traces_disabled = traces_exporter_none(&get)?;
        config.sdk_disabled = match get("OTEL_SDK_DISABLED") {
            None => false,
            Some(v) => parse_bool("OTEL_SDK_DISABLED", &v)?,
        };
        let user = get("PYROSCOPE_BASIC_AUTH_USER");
        let password = get("PYROSCOPE_BASIC_AUTH_PASSWORD");
        let token = get("PYROSCOPE_AUTH_TOKEN");
        let auth =
            match (user, password, token) {
                (Some(user), Some(password), None) => Some(PyroscopeAuth::Basic { user, password }),
                (None, None, Some(token)) => Some(PyroscopeAuth::Bearer(token)),
                (None, None, None) => None,
                (Some(_), None, _) => return Err(ConfigError::new(
                    "PYROSCOPE_BASIC_AUTH_PASSWORD",
                    "missing while PYROSCOPE_BASIC_AUTH_USER is set",
                    "",
                    "both PYROSCOPE_BASIC_AUTH_USER and PYROSCOPE_BASIC_AUTH_PASSWORD, or neither",
                )),
                (None, Some(_), _) => return Err(ConfigError::new(
                    "PYROSCOPE_BASIC_AUTH_USER",
                    "missing while PYROSCOPE_BASIC_AUTH_PASSWORD is set",
                    "",
                    "both PYROSCOPE_BASIC_AUTH_USER and PYROSCOPE_BASIC_AUTH_PASSWORD, or neither",
                )),
                (Some(_), Some(_), Some(_)) => {
                    return Err(ConfigError::new(
                        "PYROSCOPE_AUTH_TOKEN",
                        "set together with basic auth",
                        "***",
                        "either a bearer token or basic auth, not both",
                    ))
                }
            };
        let tenant_id = get("PYROSCOPE_TENANT_ID");
        let http_headers = match get("PYROSCOPE_HTTP_HEADERS") {
            Some(v) => parse_json_headers("PYROSCOPE_HTTP_HEADERS", &v)?,
            None => Vec::new(),
        };
        if let Some(v) = get("PYROSCOPE_LABELS") {
            config.profile_labels = parse_labels("PYROSCOPE_LABELS", &v)?;
        }
        match get("PYROSCOPE_SERVER_ADDRESS") {
            Some(server) => {
                let server = parse_url("PYROSCOPE_SERVER_ADDRESS", &server, PYROSCOPE_URL_EXAMPLE)?;
                let application = config.service_name.as_deref().unwrap_or("unknown_service");
                let mut pyroscope = PyroscopeConfig::new(server, application);
                pyroscope.auth = auth;
                pyroscope.tenant_id = tenant_id;
                pyroscope.headers = http_headers;
                config.pyroscope = Some(pyroscope);
            }
            None if auth.is_some() || tenant_id.is_some() || !http_headers.is_empty() => {
                return Err(ConfigError::new(
                    "PYROSCOPE_SERVER_ADDRESS",
                    "missing while Pyroscope credentials or tenant are set",
                    "",
                    "the server URL, e.g. http://localhost:4040",
                ))
            }
            None => {}
        }
        if let Some(v) = get("PYROSCOPE_SAMPLE_RATE") {
            let rate = v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|r| (1..=1000).contains(r));
            config.sample_rate_hz = Some(rate.ok_or_else(|| {
                ConfigError::new(
                    "PYROSCOPE_SAMPLE_RATE",
                    "not a sampling rate",
                    &v,
                    "an integer from 1 to 1000 (samples per second)",
                )
            })?);
        }
        if let Some(v) = get("PYROSCOPE_UPLOAD_INTERVAL") {
            let interval = parse_duration(&v).filter(|d| {
                (crate::collector::MIN_PROFILE_INTERVAL..=crate::collector::MAX_PROFILE_INTERVAL)
                    .contains(d)
            });
            config.upload_interval = Some(interval.ok_or_else(|| {
                ConfigError::new(
                    "PYROSCOPE_UPLOAD_INTERVAL",
                    "not a duration from 100 ms to 60 s",
                    &v,
                    "a duration like `10s`, `500ms`, `1m`, or whole seconds, with no space before the unit",
                )
            })?);
        }
        if let Some(v) = get("OTEL_PROFILING_BLOCKED_THRESHOLD") {
            config.blocked_threshold = Some(if v.trim().eq_ignore_ascii_case("off") {
                None
            } else {
                let threshold = parse_duration(&v)
                    .filter(|d| (Duration::from_millis(1)..=Duration::from_secs(60)).contains(d));
                Some(threshold.ok_or_else(|| {
                    ConfigError::new(
                        "OTEL_PROFILING_BLOCKED_THRESHOLD",
                        "not a threshold between 1 ms and 60 s",
                        &v,
                        "a duration like `10ms`, `50ms` or `1s`, or `off`",
                    )
                })?)
            });
        }
        config.output_dir = output_dir_variable(|name| lookup(name).map(OsString::from));
        config.output_max_bytes = output_max_bytes_variable(get)?;
        if let Some(v) = get("OTEL_PROFILING_MAX_LIVE_ROOTS") {
            config.max_live_roots = Some(parse_max_live_roots(&v).ok_or_else(|| {
                ConfigError::new(
                    "OTEL_PROFILING_MAX_LIVE_ROOTS",
                    "not a number of roots between 1 and 8388608",
                    &v,
                    "a count like `262144`",
                )
            })?);
        }
        let service = config.service_name.as_deref().unwrap_or("unknown_service");
        config.otlp_profiles = otlp_profiles_from(&get, service)?;
        config.profiles_exporter = match get("OTEL_PROFILING_PROFILES_EXPORTER") {
            Some(v) => Some(ProfilesExporter::parse(
                "OTEL_PROFILING_PROFILES_EXPORTER",
                &v,
            )?),
            None if get("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT").is_some() => {
                Some(if config.pyroscope.is_some() {
                    ProfilesExporter::Both
                } else {
                    ProfilesExporter::Otlp
                })
            }
            None => None,
        };
        if let Some(v) = get("OTEL_PROFILING_QUIET") {
            config.quiet = Some(match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(ConfigError::new(
                        "OTEL_PROFILING_QUIET",
                        "not a switch",
                        &v,
                        "`1` or `true` (quiet), `0` or `false`",
                    ))
                }
            });
        }
        if let Some(v) = get("OTEL_PROFILING_THREAD_CONTEXT") {
            config.thread_context = Some(match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(ConfigError::new(
                        "OTEL_PROFILING_THREAD_CONTEXT",
                        "not a switch",
                        &v,
                        "`1` or `true` (publish the thread context), `0` or `false`",
                    ))
                }
            });
        }
        Ok(config)
    }
}

/// A signal's own variable, else the generic one, as the OpenTelemetry specification
/// defines them: the name that was set (errors name it) and its value.
pub(crate) fn pick(
    get: &dyn Fn(&str) -> Option<String>,
    (specific, generic): (&'static str, &'static str),
) -> Option<(&'static str, String)> {
    match get(specific) {
        Some(v) => Some((specific, v)),
        None => get(generic).map(|v| (generic, v)),
    }
}

/// The signal's protocol variable or the generic one (the generic name, with no value,
/// when neither is set).
fn pick_protocol(
    get: &dyn Fn(&str) -> Option<String>,
    specific: &'static str,
) -> Result<(&'static str, OtlpProtocol), ConfigError> {
    const GENERIC: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
    let (field, value) = match pick(get, (specific, GENERIC)) {
        Some((field, v)) => (field, Some(v)),
        None => (GENERIC, None),
    };
    Ok((field, parse_protocol(field, value.as_deref())?))
}

/// A signal's request settings.
struct RequestSettings {
    headers: Vec<(String, String)>,
    timeout: Option<Duration>,
    /// `None`: unset.
    gzip: Option<bool>,
}

/// The signal's headers, timeout and compression variables, each or the generic one.
fn pick_request_settings(
    get: &dyn Fn(&str) -> Option<String>,
    [headers, timeout, compression]: [&'static str; 3],
) -> Result<RequestSettings, ConfigError> {
    let headers = match pick(get, (headers, "OTEL_EXPORTER_OTLP_HEADERS")) {
        Some((field, v)) => parse_headers(field, &v)?,
        None => Vec::new(),
    };
    let timeout = match pick(get, (timeout, "OTEL_EXPORTER_OTLP_TIMEOUT")) {
        Some((field, v)) => Some(parse_timeout_ms(field, &v)?),
        None => None,
    };
    let gzip = match pick(get, (compression, "OTEL_EXPORTER_OTLP_COMPRESSION")) {
        Some((field, v)) => Some(parse_compression(field, &v)?),
        None => None,
    };
    Ok(RequestSettings {
        headers,
        timeout,
        gzip,
    })
}

/// The traces target: the signal-specific variables, each falling back to the generic
/// one, as the OpenTelemetry specification defines them.
fn otlp_traces_from(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<OtlpTarget>, ConfigError> {
    let (protocol_field, protocol) = pick_protocol(get, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")?;
    let RequestSettings {
        headers,
        timeout,
        gzip,
    } = pick_request_settings(
        get,
        [
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        ],
    )?;
    let gzip = gzip.unwrap_or(false);
    let (endpoint_field, endpoint, signal_endpoint) =
        match get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v, true),
            None => match get("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Some(v) => ("OTEL_EXPORTER_OTLP_ENDPOINT", v, false),
                None => return Ok(None),
            },
        };
    let example = if signal_endpoint {
        otlp_traces_url_example(protocol)
    } else {
        otlp_url_example(protocol)
    };
    let endpoint = with_grpc_scheme(
        get,
        protocol,
        &endpoint,
        (
            "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
            "OTEL_EXPORTER_OTLP_INSECURE",
        ),
    )?;
    Ok(Some(OtlpTarget {
        endpoint: parse_url(endpoint_field, &endpoint, example)?,
        protocol,
        headers,
        timeout,
        gzip,
        tls: ClientTls::from_env(get, &crate::export::tls::TRACES)?,
        signal_endpoint,
        fields: (endpoint_field, protocol_field),
    }))
}

/// `endpoint` with the scheme `OTEL_EXPORTER_OTLP_[SIGNAL_]INSECURE` gives a gRPC endpoint
/// written without one (`collector:4317`): `http://` when insecure, else `https://` (the
/// specification's default). A scheme that is written wins, as the specification says;
/// HTTP endpoints always need one.
fn with_grpc_scheme(
    get: &dyn Fn(&str) -> Option<String>,
    protocol: OtlpProtocol,
    endpoint: &str,
    (specific, generic): (&'static str, &'static str),
) -> Result<String, ConfigError> {
    let insecure = match pick(get, (specific, generic)) {
        Some((field, v)) => Some(parse_bool(field, &v)?),
        None => None,
    };
    let trimmed = endpoint.trim();
    if protocol != OtlpProtocol::Grpc || trimmed.contains("://") {
        return Ok(endpoint.to_string());
    }
    let scheme = if insecure == Some(true) {
        "http"
    } else {
        "https"
    };
    Ok(format!("{scheme}://{trimmed}"))
}

/// `gzip` or `none`.
fn parse_compression(field: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "gzip" => Ok(true),
        "none" => Ok(false),
        _ => Err(ConfigError::new(
            field,
            "unsupported compression",
            value,
            "`gzip` or `none`",
        )),
    }
}

/// An OTLP protocol (`None`: the default, `http/protobuf`).
fn parse_protocol(field: &'static str, value: Option<&str>) -> Result<OtlpProtocol, ConfigError> {
    match value.map(str::trim) {
        None | Some("http/protobuf") => Ok(OtlpProtocol::HttpProtobuf),
        Some("grpc") => Ok(OtlpProtocol::Grpc),
        Some(other) => Err(ConfigError::new(
            field,
            "unsupported protocol",
            other,
            "`http/protobuf` or `grpc`",
        )),
    }
}

/// `OTEL_TRACES_EXPORTER`: `otlp` (the default) or `none`; any other exporter is an
/// error, never silently replaced by local files.
fn traces_exporter_none(get: &dyn Fn(&str) -> Option<String>) -> Result<bool, ConfigError> {
    let Some(v) = get("OTEL_TRACES_EXPORTER") else {
        return Ok(false);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "otlp" => Ok(false),
        "none" => Ok(true),
        _ => Err(ConfigError::new(
            "OTEL_TRACES_EXPORTER",
            "unsupported span exporter",
            &v,
            "`otlp` or `none`",
        )),
    }
}

/// `PYROSCOPE_HTTP_HEADERS`: a JSON object of string values, as the Pyroscope agents read
/// it (`{"X-Header": "value"}`).
fn parse_json_headers(
    field: &'static str,
    value: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
    const EXPECTED: &str =
        "a JSON object of header names to string values, e.g. {\"X-Header\": \"value\"}";
    // Values are often secrets: never echoed.
    let invalid = |problem| ConfigError::new(field, problem, "***", EXPECTED);
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(value).map_err(|_| invalid("not a JSON object"))?;
    object
        .into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(v) if !name.trim().is_empty() => Ok((name, v)),
            _ => Err(invalid(
                "a header without a name or with a value that is not a string",
            )),
        })
        .collect()
}

/// `PYROSCOPE_LABELS`: comma-separated `key=value` pairs.
fn parse_labels(field: &'static str, value: &str) -> Result<Vec<(String, String)>, ConfigError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(ConfigError::new(
                field,
                "not key=value pairs",
                value,
                "comma-separated key=value pairs, e.g. region=eu-west-1,team=checkout",
            )),
        })
        .collect()
}

/// An OpenTelemetry boolean: `true` or `false`, case-insensitive (anything else is an
/// error here, not a silent `false`).
fn parse_bool(field: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ConfigError::new(
            field,
            "not a boolean",
            value,
            "`true` or `false`",
        )),
    }
}

/// An OTLP timeout: whole milliseconds, as the specification defines it.
fn parse_timeout_ms(field: &'static str, value: &str) -> Result<Duration, ConfigError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| {
            ConfigError::new(
                field,
                "not a timeout",
                value,
                "whole milliseconds, e.g. 10000",
            )
        })
}

/// The accepted form of a signal-specific traces endpoint.
fn otlp_traces_url_example(protocol: OtlpProtocol) -> &'static str {
    match protocol {
        OtlpProtocol::HttpProtobuf => {
            "the full http:// or https:// URL, used as given, e.g. http://localhost:4318/v1/traces"
        }
        OtlpProtocol::Grpc => "an http:// or https:// URL, e.g. http://localhost:4317",
    }
}

fn otlp_profiles_from(
    get: &dyn Fn(&str) -> Option<String>,
    service_name: &str,
) -> Result<Option<OtlpProfilesConfig>, ConfigError> {
    let (_, protocol) = pick_protocol(get, "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL")?;
    // Compression: `None` (unset) leaves the exporter's default.
    let RequestSettings {
        headers,
        timeout,
        gzip,
    } = pick_request_settings(
        get,
        [
            "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
            "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",
        ],
    )?;
    let insecure = (
        "OTEL_EXPORTER_OTLP_PROFILES_INSECURE",
        "OTEL_EXPORTER_OTLP_INSECURE",
    );
    let tls = ClientTls::from_env(get, &crate::export::tls::PROFILES)?;
    let finish = |mut config: OtlpProfilesConfig| {
        config.headers = headers;
        if let Some(timeout) = timeout {
            config.request_timeout = timeout;
        }
        config.gzip = gzip;
        config.tls = tls;
        config
    };
    if let Some(endpoint) = get("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") {
        // A signal-specific endpoint is used as given (the OTel spec).
        let endpoint = with_grpc_scheme(get, protocol, &endpoint, insecure)?;
        let endpoint = parse_url(
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            &endpoint,
            otlp_profiles_url_example(protocol),
        )?;
        let config = OtlpProfilesConfig::new(endpoint, service_name).with_protocol(protocol);
        return Ok(Some(finish(config)));
    }
    match get("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some(base) => {
            let base = with_grpc_scheme(get, protocol, &base, insecure)?;
            let base = parse_url(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &base,
                otlp_url_example(protocol),
            )?;
            let config = OtlpProfilesConfig::from_base(&base, protocol, service_name);
            Ok(Some(finish(config)))
        }
        None => Ok(None),
    }
}

/// The accepted form of an OTLP profiles endpoint.
pub(crate) fn otlp_profiles_url_example(protocol: OtlpProtocol) -> &'static str {
    match protocol {
        OtlpProtocol::HttpProtobuf => {
            "the full http:// or https:// URL, e.g. http://localhost:4040/v1development/profiles \
             (Pyroscope) or http://localhost:4318/v1development/profiles (a Collector)"
        }
        OtlpProtocol::Grpc => {
            "an http:// or https:// URL such as http://localhost:4317 (OTLP/gRPC)"
        }
    }
}

/// The accepted form of a Pyroscope server URL (Pyroscope listens on 4040).
pub(crate) const PYROSCOPE_URL_EXAMPLE: &str =
    "an http:// or https:// URL such as http://localhost:4040 (Pyroscope's port)";

/// The accepted form of an OTLP endpoint for `protocol`, with that protocol's default port
/// (OTLP/HTTP 4318, OTLP/gRPC 4317).
pub(crate) fn otlp_url_example(protocol: OtlpProtocol) -> &'static str {
    match protocol {
        OtlpProtocol::HttpProtobuf => {
            "an http:// or https:// URL such as http://localhost:4318 (OTLP/HTTP; OTLP/gRPC uses 4317)"
        }
        OtlpProtocol::Grpc => {
            "an http:// or https:// URL such as http://localhost:4317 (OTLP/gRPC; OTLP/HTTP uses 4318)"
        }
    }
}

/// The crate's one URL check, for every URL setting from the environment, the `Telemetry`
/// builder and the exporters' own settings: `http(s)://host[:port][/path]`, without
/// credentials, query or fragment; returned without a trailing slash. `expected` is the
/// accepted form with an example for this setting. Errors name `field`; credentials in the
/// value are shown as `***`.
/// A cap on live roots: 1 to 2²³ (what a label word can index).
fn parse_max_live_roots(v: &str) -> Option<u64> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=crate::label::table::MAX_LABEL_SLOTS).contains(n))
}

pub(crate) fn parse_url(
    field: &'static str,
    value: &str,
    expected: &'static str,
) -> Result<String, ConfigError> {
    let v = value.trim();
    let shown = without_credentials(value);
    let error = |problem| ConfigError {
        field,
        problem,
        value: shown.clone(),
        expected,
    };
    let rest = v
        .strip_prefix("http://")
        .or_else(|| v.strip_prefix("https://"))
        .ok_or_else(|| error("not an http(s) URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.contains('@') {
        return Err(error(
            "credentials in the URL are not supported (set them as credentials or a header)",
        ));
    }
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(error("no valid host"));
    }
    if let Some((_, port)) = host.rsplit_once(':').filter(|_| !host.ends_with(']')) {
        if port.parse::<u16>().is_err() {
            return Err(error("invalid port"));
        }
    }
    if v.contains('?') || v.contains('#') {
        return Err(error("query or fragment not allowed"));
    }
    Ok(v.trim_end_matches('/').to_string())
}

/// [`parse_url`], then `path` appended, as the URL the HTTP exporters send to.
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
pub(crate) fn parse_http_url(
    field: &'static str,
    value: &str,
    expected: &'static str,
    path: &str,
) -> Result<reqwest::Url, ConfigError> {
    let base = parse_url(field, value, expected)?;
    reqwest::Url::parse(&format!("{base}{path}")).map_err(|_| ConfigError {
        field,
        problem: "not a valid URL",
        value: without_credentials(value),
        expected,
    })
}

/// `value` with what stands before an `@` in its authority shown as `***`.
fn without_credentials(value: &str) -> String {
    let scheme_end = value.find("://").map_or(0, |i| i + 3);
    let (scheme, rest) = value.split_at(scheme_end);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}***{}", &rest[at..]),
        None => value.to_string(),
    }
}

/// `key=value,key2=value2` with percent-encoded values (the OpenTelemetry spec form).
pub(crate) fn parse_resource_attributes(value: &str) -> Result<Vec<(String, String)>, ConfigError> {
    parse_key_values(
        "OTEL_RESOURCE_ATTRIBUTES",
        value,
        value,
        "comma-separated key=value pairs, e.g. service.version=1.2,deployment.environment=prod",
    )
}

/// `OTEL_EXPORTER_OTLP_*HEADERS`: the same form as resource attributes (the OTel spec's);
/// the value never appears in errors (it usually holds credentials).
pub(crate) fn parse_headers(
    field: &'static str,
    value: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
    parse_key_values(
        field,
        value,
        "***",
        "comma-separated name=value pairs, e.g. Authorization=Bearer%20token,X-Scope-OrgID=tenant",
    )
}

/// `key=value,key2=value2` of `field`; `shown` is what errors print of the value.
fn parse_key_values(
    field: &'static str,
    value: &str,
    shown: &str,
    expected: &'static str,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, val) = pair
            .split_once('=')
            .ok_or_else(|| ConfigError::new(field, "a pair without `=`", shown, expected))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(ConfigError::new(field, "an empty key", shown, expected));
        }
        let val = percent_decode(val.trim()).ok_or_else(|| {
            ConfigError::new(field, "a malformed percent-encoding", shown, expected)
        })?;
        out.push((key.to_string(), val));
    }
    Ok(out)
}

/// `s` percent-decoded as the OTel spec encodes header values; `None` when a `%` is not
/// followed by two hex digits (a typo there should fail setup, not reach the server) or
/// the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let well_formed = s.match_indices('%').all(|(i, _)| {
        s.as_bytes()
            .get(i + 1..i + 3)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|decoded| decoded.into_owned())
}

/// `OTEL_PROFILING_OUTPUT_MAX_BYTES` as `get` reports it (blank counts as unset): the one
/// reader of the variable, for [`EnvConfig`] and the standalone
/// [`ProfilerBuilder`](crate::ProfilerBuilder).
pub(crate) fn output_max_bytes_variable(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<u64>, ConfigError> {
    const NAME: &str = "OTEL_PROFILING_OUTPUT_MAX_BYTES";
    let Some(v) = get(NAME).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    crate::export::local_budget::parse_bytes(&v)
        .map(Some)
        .ok_or_else(|| {
            ConfigError::new(
                NAME,
                "not a size",
                &v,
                "bytes, or with a KiB, MiB or GiB suffix (`512MiB`); 0 for no bound",
            )
        })
}

/// `OTEL_PROFILING_ALLOC_SAMPLE_BYTES`: the mean bytes between two allocation samples
/// (`None` when unset or blank).
pub(crate) fn alloc_sample_bytes_variable(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<u64>, ConfigError> {
    const NAME: &str = "OTEL_PROFILING_ALLOC_SAMPLE_BYTES";
    let Some(v) = get(NAME).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    crate::export::local_budget::parse_bytes(&v)
        .filter(|&bytes| bytes <= crate::allocations::MAX_SAMPLE_BYTES)
        .map(Some)
        .ok_or_else(|| {
            ConfigError::new(
                NAME,
                "not a size up to 1TiB",
                &v,
                "bytes, or with a KiB, MiB or GiB suffix (`512KiB`, the default); 0 \
                 switches allocation sampling off",
            )
        })
}

/// `OTEL_PROFILING_ALLOC_INUSE`: whether sampled allocations are tracked until freed
/// (`None` when unset or blank).
pub(crate) fn alloc_inuse_variable(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<bool>, ConfigError> {
    const NAME: &str = "OTEL_PROFILING_ALLOC_INUSE";
    get(NAME)
        .filter(|v| !v.trim().is_empty())
        .map(|v| parse_bool(NAME, &v))
        .transpose()
}

/// `10s`, `500ms`, `1m`, `2h`, or a bare number of seconds; surrounding blanks are
/// ignored, a blank between the number and the unit (`10 s`) is not accepted. The syntax
/// of every duration variable the setup reads (`PYROSCOPE_UPLOAD_INTERVAL`, say), for
/// tools that take the same values.
///
/// ```
/// use std::time::Duration;
/// use otel_profiling::config::parse_duration;
///
/// assert_eq!(parse_duration("15s"), Some(Duration::from_secs(15)));
/// assert_eq!(parse_duration(" 2h "), Some(Duration::from_secs(7200)));
/// assert_eq!(parse_duration("10 s"), None);
/// ```
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
