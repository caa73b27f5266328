//! The local stack (`docker-compose.yml`, `deploy/`, `Dockerfile`) agrees with the bridge.
//!
//! Docker is not needed: the files are parsed and checked against the constants of the
//! `otel-profiling` crate, so that what Grafana queries is what the exporter pushes:
//!
//! * the three backends exist with their ports, pinned images and healthchecks;
//! * Tempo receives OTLP on all interfaces (4317, 4318) and serves its API on 3200;
//! * the Tempo data source links spans to a provisioned Pyroscope data source, with
//!   `profileTypeId` = [`PROFILE_TYPE_ID`] and the tag mapping = [`RESOURCE_SERIES_LABELS`];
//! * the data source URLs name compose services and ports those services listen on;
//! * Grafana runs with anonymous Admin access and the feature toggles its version needs;
//! * the demo service's environment is accepted by [`EnvConfig::from_lookup`], and every
//!   variable in it is one that the bridge or the example service reads.
//!
//! Each check returns the problems it finds instead of panicking on the first one, and the
//! `*_is_reported` tests mutate the parsed files to prove that the checks can fail.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use otel_profiling::config::{EnvConfig, OtlpProtocol};
use otel_profiling::export::pyroscope::PROFILE_TYPE_ID;
use otel_profiling::{resource_series_labels, RESOURCE_SERIES_LABELS};
use serde_yaml::Value;

/// Grafana's data source type for Pyroscope.
const PYROSCOPE_DS_TYPE: &str = "grafana-pyroscope-datasource";
/// Grafana's data source type for Tempo.
const TEMPO_DS_TYPE: &str = "tempo";
/// Where the Grafana image reads data source provisioning files.
const GRAFANA_DATASOURCES_DIR: &str = "/etc/grafana/provisioning/datasources";
/// The folder of this repository holding the data source files.
const DATASOURCES_DIR: &str = "deploy/grafana/provisioning/datasources";

/// The backends and the container ports each must publish on the same host port.
const BACKENDS: &[(&str, &[u16])] = &[
    ("tempo", &[3200, 4317, 4318]),
    ("pyroscope", &[4040]),
    ("grafana", &[3000]),
];
/// The port each backend's healthcheck must probe (its HTTP server).
const HEALTH_PORTS: &[(&str, u16)] = &[("tempo", 3200), ("pyroscope", 4040), ("grafana", 3000)];
const TEMPO_API_PORT: u16 = 3200;
const OTLP_GRPC_PORT: u16 = 4317;
const OTLP_HTTP_PORT: u16 = 4318;
const PYROSCOPE_PORT: u16 = 4040;

/// The toggles older Grafana versions need for "Profiles for this span" and the embedded
/// flame graph. grafana/grafana#80792 (January 2024) removed them: always on from 10.4.
const PROFILE_TOGGLES: &[&str] = &["traceToProfiles", "tracesEmbeddedFlameGraph"];
const GRAFANA_WITHOUT_TOGGLES: [u32; 2] = [10, 4];

/// Tempo 2.x configuration blocks that Tempo 3 refuses (its strict parser has no such
/// fields: ingesters and the compactor were replaced by the live-store and the backend
/// scheduler), or, for `metrics_generator_client`, still parses but deprecates.
const TEMPO_2_ONLY_BLOCKS: &[&str] = &[
    "ingester",
    "ingester_client",
    "compactor",
    "metrics_generator_client",
];

/// The example service's health route (`examples/src/service.rs`), probed by the demo's
/// healthcheck.
const HEALTH_ROUTE: &str = "/healthz";

/// Variables the example service reads itself (`examples/src/app.rs`), besides those of
/// `otel_profiling::Telemetry::from_env`.
const SERVICE_VARS: &[&str] = &[
    "SERVICE_VERSION",
    "REPORT_SERIALIZER",
    "REPORT_ROWS",
    "BIND_ADDR",
    "INVENTORY_ADDR",
    "INVENTORY_LATENCY_MS",
    "SHUTDOWN_ON_STDIN_EOF",
];

// ---------------------------------------------------------------------------------------
// Loading

/// Every file of the stack, parsed.
#[derive(Clone)]
struct Stack {
    compose: Value,
    tempo: Value,
    /// (file name, parsed file), sorted by name.
    datasource_files: Vec<(String, Value)>,
    dockerfile: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration-tests sits in the workspace root")
        .to_path_buf()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse_yaml(name: &str, text: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{name}: not valid YAML: {e}"))
}

impl Stack {
    fn load() -> Stack {
        let dir = repo_root().join(DATASOURCES_DIR);
        let mut datasource_files = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            let is_yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            );
            if is_yaml {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let text = std::fs::read_to_string(&path).expect("readable data source file");
                datasource_files.push((name.clone(), parse_yaml(&name, &text)));
            }
        }
        datasource_files.sort_by(|a, b| a.0.cmp(&b.0));
        Stack {
            compose: parse_yaml("docker-compose.yml", &read("docker-compose.yml")),
            tempo: parse_yaml("deploy/tempo.yaml", &read("deploy/tempo.yaml")),
            datasource_files,
            dockerfile: read("Dockerfile"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading YAML values

/// The value at `path`: mapping keys, or indices into sequences.
fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| match v {
        Value::Mapping(m) => m.get(*key),
        Value::Sequence(s) => key.parse::<usize>().ok().and_then(|i| s.get(i)),
        _ => None,
    })
}

/// Like [`at`], for changing a parsed file in the negative tests.
fn at_mut<'a>(value: &'a mut Value, path: &[&str]) -> &'a mut Value {
    path.iter().fold(value, |v, key| match v {
        Value::Mapping(m) => m
            .get_mut(*key)
            .unwrap_or_else(|| panic!("no key {key:?} in {path:?}")),
        Value::Sequence(s) => &mut s[key.parse::<usize>().expect("a sequence index")],
        _ => panic!("{key:?} of {path:?} is neither a mapping nor a sequence"),
    })
}

/// A scalar as text (YAML `true`, `1.5` and `"x"` all count).
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn text_at(value: &Value, path: &[&str]) -> Option<String> {
    at(value, path).and_then(scalar)
}

/// A sequence of scalars (`command: [...]`, `profiles: [...]`), or one string.
fn strings(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Sequence(s)) => s.iter().filter_map(scalar).collect(),
        Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

fn service<'a>(compose: &'a Value, name: &str) -> Option<&'a Value> {
    at(compose, &["services", name])
}

/// A service's `environment`, in either compose form (mapping or `KEY=value` list).
fn environment(service: &Value) -> BTreeMap<String, String> {
    match service.get("environment") {
        Some(Value::Mapping(m)) => m
            .iter()
            .filter_map(|(k, v)| Some((scalar(k)?, scalar(v).unwrap_or_default())))
            .collect(),
        Some(Value::Sequence(s)) => s
            .iter()
            .filter_map(scalar)
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (kv, String::new()),
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// One `ports` entry: the container port and the host port it is published on.
#[derive(Debug, PartialEq)]
struct Port {
    host: Option<u16>,
    container: u16,
}

/// A service's `ports`, short (`[ip:]host:container[/proto]`) or long syntax.
fn ports(service: &Value) -> Vec<Port> {
    let Some(Value::Sequence(entries)) = service.get("ports") else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| match entry {
            Value::Mapping(_) => Some(Port {
                host: text_at(entry, &["published"]).and_then(|p| p.parse().ok()),
                container: text_at(entry, &["target"])?.parse().ok()?,
            }),
            other => {
                let text = scalar(other)?;
                let text = text.split('/').next().unwrap_or_default();
                let parts: Vec<&str> = text.split(':').collect();
                let container = parts.last()?.parse().ok()?;
                let host = (parts.len() >= 2)
                    .then(|| parts[parts.len() - 2].parse().ok())
                    .flatten();
                Some(Port { host, container })
            }
        })
        .collect()
}

/// A service's bind mounts and named volumes: (source, target) of `source:target[:mode]`.
fn volumes(service: &Value) -> Vec<(String, String)> {
    strings(service.get("volumes"))
        .into_iter()
        .filter_map(|v| {
            let mut parts = v.split(':');
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

/// `depends_on`: service name and its condition (`service_started` for the list form).
fn depends_on(service: &Value) -> BTreeMap<String, String> {
    match service.get("depends_on") {
        Some(Value::Mapping(m)) => m
            .iter()
            .filter_map(|(k, v)| {
                let condition = text_at(v, &["condition"]).unwrap_or("service_started".into());
                Some((scalar(k)?, condition))
            })
            .collect(),
        Some(Value::Sequence(s)) => s
            .iter()
            .filter_map(scalar)
            .map(|name| (name, "service_started".to_string()))
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// Whether a healthcheck `test` is a command (not `NONE`) that mentions `port`, as
/// `host:port` in a URL or `/port` in bash's `/dev/tcp/host/port`.
fn probes_port(test: &[String], port: u16) -> bool {
    matches!(test.first().map(String::as_str), Some("CMD" | "CMD-SHELL"))
        && test
            .iter()
            .any(|t| t.contains(&format!(":{port}")) || t.contains(&format!("/{port}")))
}

/// `host:port` of `http(s)://host:port[/path]` or of a bare `host:port`.
fn host_port(address: &str) -> Option<(String, u16)> {
    let rest = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"))
        .unwrap_or(address);
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

/// An image reference's tag (`None` when untagged) and whether it carries a digest.
fn image_tag(image: &str) -> (Option<&str>, bool) {
    let (name, digest) = match image.split_once('@') {
        Some((name, _)) => (name, true),
        None => (image, false),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    (last.split_once(':').map(|(_, tag)| tag), digest)
}

/// `13.2.0` or `v3.0.3` as numbers; `None` for anything else (`latest`, `main`).
fn version(tag: &str) -> Option<Vec<u32>> {
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let numbers: Option<Vec<u32>> = tag.split('.').map(|p| p.parse().ok()).collect();
    numbers.filter(|n| n.len() >= 2)
}

fn image_version(compose: &Value, service_name: &str) -> Option<Vec<u32>> {
    let image = text_at(service(compose, service_name)?, &["image"])?;
    version(image_tag(&image).0?)
}

// ---------------------------------------------------------------------------------------
// What the bridge says

/// The tag mapping Grafana must use: every (resource attribute, series label) pair the
/// exporter applies, both environment keys included (docs/stack.md, "Tag mapping").
fn expected_tag_mapping() -> BTreeSet<(String, String)> {
    RESOURCE_SERIES_LABELS
        .iter()
        .map(|(key, label)| (key.to_string(), label.to_string()))
        .collect()
}

/// The variables `EnvConfig::from_lookup` asks for given `env`, and what it made of them.
fn bridge_config(env: &BTreeMap<String, String>) -> (BTreeSet<String>, Result<EnvConfig, String>) {
    let asked = RefCell::new(BTreeSet::new());
    let config = EnvConfig::from_lookup(|name| {
        asked.borrow_mut().insert(name.to_string());
        env.get(name).cloned()
    })
    .map_err(|e| e.to_string());
    (asked.into_inner(), config)
}

// ---------------------------------------------------------------------------------------
// Checks: each returns the problems it found

/// The three backends: present, ports published, images pinned, healthchecks that probe
/// the backend's own HTTP port, bind-mounted files that exist.
fn check_compose(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, expected_ports) in BACKENDS {
        let Some(svc) = service(&stack.compose, name) else {
            problems.push(format!("compose: no service `{name}`"));
            continue;
        };
        let published = ports(svc);
        for port in *expected_ports {
            let wanted = Port {
                host: Some(*port),
                container: *port,
            };
            if !published.contains(&wanted) {
                problems.push(format!(
                    "compose: `{name}` does not publish container port {port} on host port {port} (has {published:?})"
                ));
            }
        }
        match text_at(svc, &["image"]) {
            None => problems.push(format!("compose: `{name}` has no image")),
            Some(image) => match image_tag(&image) {
                (_, true) => {}
                (None, false) => problems.push(format!(
                    "compose: `{name}` image `{image}` is not pinned (no tag)"
                )),
                (Some(tag), false) if version(tag).is_none() => problems.push(format!(
                    "compose: `{name}` image `{image}` is not pinned to a version (tag `{tag}`)"
                )),
                _ => {}
            },
        }
        let test = strings(at(svc, &["healthcheck", "test"]));
        let health_port = HEALTH_PORTS
            .iter()
            .find(|(s, _)| s == name)
            .map(|(_, p)| *p);
        if !health_port.is_some_and(|port| probes_port(&test, port)) {
            problems.push(format!(
                "compose: `{name}` has no healthcheck probing its port {health_port:?} (test {test:?})"
            ));
        }
    }
    let services = at(&stack.compose, &["services"])
        .and_then(Value::as_mapping)
        .into_iter()
        .flatten();
    for (name, svc) in services {
        let name = scalar(name).unwrap_or_default();
        for (source, _) in volumes(svc) {
            if source.starts_with('.') && !repo_root().join(&source).exists() {
                problems.push(format!("compose: `{name}` mounts missing `{source}`"));
            }
        }
    }
    problems
}

/// Tempo: OTLP on all interfaces, API on 3200, local storage on the mounted volume, the
/// config file that compose really mounts, no 2.x-only blocks in a 3.x image.
fn check_tempo(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let cfg = &stack.tempo;
    let port = text_at(cfg, &["server", "http_listen_port"]);
    if port.as_deref() != Some(&TEMPO_API_PORT.to_string()) {
        problems.push(format!(
            "tempo.yaml: server.http_listen_port is {port:?}, expected {TEMPO_API_PORT}"
        ));
    }
    for (protocol, otlp_port) in [("grpc", OTLP_GRPC_PORT), ("http", OTLP_HTTP_PORT)] {
        let path = [
            "distributor",
            "receivers",
            "otlp",
            "protocols",
            protocol,
            "endpoint",
        ];
        let endpoint = text_at(cfg, &path);
        let expected = format!("0.0.0.0:{otlp_port}");
        if endpoint.as_deref() != Some(expected.as_str()) {
            problems.push(format!(
                "tempo.yaml: OTLP {protocol} endpoint is {endpoint:?}, expected {expected:?} \
                 (Tempo 2.7+ binds localhost by default, unreachable from other containers)"
            ));
        }
    }
    if text_at(cfg, &["storage", "trace", "backend"]).as_deref() != Some("local") {
        problems.push("tempo.yaml: storage.trace.backend is not `local`".to_string());
    }
    let Some(svc) = service(&stack.compose, "tempo") else {
        problems.push("compose: no service `tempo`".to_string());
        return problems;
    };
    let mounts = volumes(svc);
    for path in [
        ["storage", "trace", "wal", "path"],
        ["storage", "trace", "local", "path"],
    ] {
        let dir = text_at(cfg, &path).unwrap_or_default();
        let on_volume = mounts
            .iter()
            .any(|(source, target)| !source.starts_with('.') && dir.starts_with(target.as_str()));
        if !on_volume {
            problems.push(format!(
                "tempo.yaml: {} = {dir:?} is not on a volume of the tempo service",
                path.join(".")
            ));
        }
    }
    let config_file = strings(svc.get("command"))
        .iter()
        .find_map(|arg| arg.strip_prefix("-config.file=").map(str::to_string));
    let mounted = config_file.as_ref().is_some_and(|file| {
        mounts
            .iter()
            .any(|(s, t)| t == file && s.trim_start_matches("./") == "deploy/tempo.yaml")
    });
    if !mounted {
        problems.push(format!(
            "compose: tempo reads {config_file:?}, which is not ./deploy/tempo.yaml mounted there"
        ));
    }
    if image_version(&stack.compose, "tempo").is_some_and(|v| v[0] >= 3) {
        for block in TEMPO_2_ONLY_BLOCKS {
            if cfg.get(*block).is_some() {
                problems.push(format!("tempo.yaml: `{block}` is a Tempo 2.x block"));
            }
        }
    }
    problems
}

/// All provisioned data sources, with the file each came from.
fn datasources(stack: &Stack) -> (Vec<(String, Value)>, Vec<String>) {
    let mut problems = Vec::new();
    let mut all = Vec::new();
    for (file, doc) in &stack.datasource_files {
        if text_at(doc, &["apiVersion"]).as_deref() != Some("1") {
            problems.push(format!("{file}: apiVersion is not 1"));
        }
        match doc.get("datasources") {
            Some(Value::Sequence(list)) => {
                all.extend(list.iter().map(|d| (file.clone(), d.clone())))
            }
            _ => problems.push(format!("{file}: no `datasources` list")),
        }
    }
    (all, problems)
}

/// The trace-to-profiles link and the data source URLs.
fn check_datasources(stack: &Stack) -> Vec<String> {
    let (all, mut problems) = datasources(stack);
    let mut uids = BTreeSet::new();
    for (file, ds) in &all {
        match text_at(ds, &["uid"]) {
            Some(uid) if !uids.insert(uid.clone()) => {
                problems.push(format!("{file}: uid `{uid}` is provisioned twice"))
            }
            Some(_) => {}
            None => problems.push(format!("{file}: a data source without a uid")),
        }
    }
    let of_type = |t: &str| -> Vec<&(String, Value)> {
        all.iter()
            .filter(|(_, ds)| text_at(ds, &["type"]).as_deref() == Some(t))
            .collect()
    };

    // URLs: a compose service, on a port it serves.
    let url_checks = [
        (TEMPO_DS_TYPE, "tempo", TEMPO_API_PORT),
        (PYROSCOPE_DS_TYPE, "pyroscope", PYROSCOPE_PORT),
    ];
    for (ds_type, service_name, port) in url_checks {
        let found = of_type(ds_type);
        if found.is_empty() {
            problems.push(format!("provisioning: no data source of type `{ds_type}`"));
        }
        for (file, ds) in found {
            let url = text_at(ds, &["url"]).unwrap_or_default();
            let expected = (service_name.to_string(), port);
            match host_port(&url) {
                Some(hp) if hp == expected => {}
                _ => problems.push(format!(
                    "{file}: `{ds_type}` url {url:?} is not http://{service_name}:{port}"
                )),
            }
            if service(&stack.compose, service_name).is_none() {
                problems.push(format!(
                    "{file}: url names `{service_name}`, not a compose service"
                ));
            }
        }
    }

    // The link itself.
    let tempos = of_type(TEMPO_DS_TYPE);
    let Some((file, tempo)) = tempos.first() else {
        return problems;
    };
    let Some(link) = at(tempo, &["jsonData", "tracesToProfiles"]) else {
        problems.push(format!("{file}: Tempo has no jsonData.tracesToProfiles"));
        return problems;
    };
    let target = text_at(link, &["datasourceUid"]).unwrap_or_default();
    let target_type = all
        .iter()
        .find(|(_, ds)| text_at(ds, &["uid"]).as_deref() == Some(target.as_str()))
        .and_then(|(_, ds)| text_at(ds, &["type"]));
    if target_type.as_deref() != Some(PYROSCOPE_DS_TYPE) {
        problems.push(format!(
            "{file}: tracesToProfiles.datasourceUid `{target}` is not a provisioned \
             `{PYROSCOPE_DS_TYPE}` (it is {target_type:?})"
        ));
    }
    let profile_type = text_at(link, &["profileTypeId"]);
    if profile_type.as_deref() != Some(PROFILE_TYPE_ID) {
        problems.push(format!(
            "{file}: tracesToProfiles.profileTypeId is {profile_type:?}, the exporter pushes {PROFILE_TYPE_ID:?}"
        ));
    }
    if link.get("customQuery") != Some(&Value::Bool(false)) {
        problems.push(format!(
            "{file}: tracesToProfiles.customQuery must be false (the tag mapping builds the query)"
        ));
    }
    let mut keys = BTreeSet::new();
    let mut mapping = BTreeSet::new();
    for tag in at(link, &["tags"])
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        let key = text_at(tag, &["key"]).unwrap_or_default();
        // Grafana uses the key itself as the label when `value` is empty.
        let label = text_at(tag, &["value"]).unwrap_or_else(|| key.clone());
        if !keys.insert(key.clone()) {
            problems.push(format!("{file}: tag key `{key}` is mapped twice"));
        }
        mapping.insert((key, label));
    }
    let expected = expected_tag_mapping();
    for (key, label) in expected.difference(&mapping) {
        problems.push(format!(
            "{file}: tracesToProfiles.tags lacks {key} -> {label} (the exporter's series label)"
        ));
    }
    for (key, label) in mapping.difference(&expected) {
        problems.push(format!(
            "{file}: tracesToProfiles.tags maps {key} -> {label}, which the exporter never pushes"
        ));
    }

    // Grafana reads these files.
    let grafana_mounts = service(&stack.compose, "grafana")
        .map(volumes)
        .unwrap_or_default();
    let mounted = grafana_mounts.iter().any(|(source, target)| {
        source.trim_start_matches("./") == DATASOURCES_DIR && target == GRAFANA_DATASOURCES_DIR
    });
    if !mounted {
        problems.push(format!(
            "compose: grafana does not mount ./{DATASOURCES_DIR} at {GRAFANA_DATASOURCES_DIR}"
        ));
    }
    problems
}

/// Grafana: anonymous Admin, no login form, the toggles its version needs, and it starts
/// after the backends are healthy.
fn check_grafana(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(svc) = service(&stack.compose, "grafana") else {
        return vec!["compose: no service `grafana`".to_string()];
    };
    let env = environment(svc);
    for (var, expected) in [
        ("GF_AUTH_ANONYMOUS_ENABLED", "true"),
        ("GF_AUTH_ANONYMOUS_ORG_ROLE", "Admin"),
        ("GF_AUTH_DISABLE_LOGIN_FORM", "true"),
    ] {
        if env.get(var).map(String::as_str) != Some(expected) {
            problems.push(format!(
                "compose: grafana {var} is {:?}, expected {expected:?}",
                env.get(var)
            ));
        }
    }
    let toggles: BTreeSet<&str> = env
        .get("GF_FEATURE_TOGGLES_ENABLE")
        .map(|t| t.split([' ', ',']).filter(|t| !t.is_empty()).collect())
        .unwrap_or_default();
    match image_version(&stack.compose, "grafana") {
        None => problems.push("compose: grafana image has no version".to_string()),
        Some(v) if v.as_slice() < GRAFANA_WITHOUT_TOGGLES.as_slice() => {
            for toggle in PROFILE_TOGGLES {
                if !toggles.contains(toggle) {
                    problems.push(format!(
                        "compose: Grafana {v:?} needs the `{toggle}` feature toggle"
                    ));
                }
            }
        }
        Some(v) => {
            for toggle in PROFILE_TOGGLES {
                if toggles.contains(toggle) {
                    problems.push(format!(
                        "compose: `{toggle}` no longer exists in Grafana {v:?} (always on)"
                    ));
                }
            }
        }
    }
    let deps = depends_on(svc);
    for backend in ["tempo", "pyroscope"] {
        if deps.get(backend).map(String::as_str) != Some("service_healthy") {
            problems.push(format!(
                "compose: grafana does not wait for `{backend}` to be healthy"
            ));
        }
    }
    problems
}

/// The demo service: profile `demo`, built from the Dockerfile, started after the backends,
/// and an environment the bridge accepts and points at the compose services.
fn check_demo(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(svc) = service(&stack.compose, "demo") else {
        return vec!["compose: no service `demo`".to_string()];
    };
    if strings(svc.get("profiles")) != ["demo"] {
        problems.push("compose: `demo` is not only in the `demo` profile".to_string());
    }
    if text_at(svc, &["build", "dockerfile"]).as_deref() != Some("Dockerfile") {
        problems.push("compose: `demo` is not built from ./Dockerfile".to_string());
    }
    let deps = depends_on(svc);
    for backend in ["tempo", "pyroscope"] {
        if deps.get(backend).map(String::as_str) != Some("service_healthy") {
            problems.push(format!(
                "compose: demo does not wait for `{backend}` to be healthy"
            ));
        }
    }

    let env = environment(svc);
    // Its healthcheck asks the service's own port for the service's health route.
    let bind_port = env
        .get("BIND_ADDR")
        .and_then(|a| host_port(a))
        .map(|(_, p)| p);
    let test = strings(at(svc, &["healthcheck", "test"]));
    let route_exists = example_sources_mention(&format!("\"{HEALTH_ROUTE}\""));
    let probed = bind_port.is_some_and(|port| probes_port(&test, port))
        && test.iter().any(|t| t.contains(HEALTH_ROUTE));
    if !probed || !route_exists {
        problems.push(format!(
            "compose: demo healthcheck {test:?} does not GET {HEALTH_ROUTE} on BIND_ADDR port \
             {bind_port:?} (route in examples/src: {route_exists})"
        ));
    }

    let (asked, config) = bridge_config(&env);
    for var in env.keys() {
        if !asked.contains(var) && !SERVICE_VARS.contains(&var.as_str()) {
            problems.push(format!(
                "compose: demo sets {var}, which neither the bridge nor the service reads"
            ));
        }
    }
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            problems.push(format!(
                "compose: demo environment rejected by the bridge: {e}"
            ));
            return problems;
        }
    };
    if config.service_name.is_none() {
        problems.push("compose: demo sets no service name".to_string());
    }
    match &config.otlp {
        None => problems.push("compose: demo sends no traces (no OTLP endpoint)".to_string()),
        Some(otlp) => {
            let port = match otlp.protocol {
                OtlpProtocol::Grpc => OTLP_GRPC_PORT,
                _ => OTLP_HTTP_PORT,
            };
            if host_port(&otlp.endpoint) != Some(("tempo".to_string(), port)) {
                problems.push(format!(
                    "compose: demo OTLP endpoint {} is not tempo:{port} for {:?}",
                    otlp.endpoint, otlp.protocol
                ));
            }
        }
    }
    match &config.pyroscope {
        None => problems.push("compose: demo pushes no profiles (no Pyroscope)".to_string()),
        Some(p)
            if host_port(&p.server_address) != Some(("pyroscope".to_string(), PYROSCOPE_PORT)) =>
        {
            problems.push(format!(
                "compose: demo Pyroscope address {} is not pyroscope:{PYROSCOPE_PORT}",
                p.server_address
            ))
        }
        Some(_) => {}
    }
    // The series labels these resource attributes become are ones Grafana selects on.
    let grafana_labels: BTreeSet<String> =
        expected_tag_mapping().into_iter().map(|(_, l)| l).collect();
    for (label, _) in resource_series_labels(&config.resource_attributes) {
        if !grafana_labels.contains(&label) {
            problems.push(format!(
                "compose: demo series label `{label}` is not mapped in Grafana"
            ));
        }
    }
    problems
}

/// Whether a source file of the examples package contains `needle`.
fn example_sources_mention(needle: &str) -> bool {
    fn walk(dir: &Path, needle: &str) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, needle)
                } else {
                    path.extension().is_some_and(|e| e == "rs")
                        && std::fs::read_to_string(&path).is_ok_and(|text| text.contains(needle))
                }
            })
    }
    walk(&repo_root().join("examples/src"), needle)
}

/// Whether the examples package builds a binary called `name`.
fn example_binary_exists(name: &str) -> bool {
    let root = repo_root().join("examples");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    root.join(format!("src/bin/{name}.rs")).exists()
        || manifest.contains(&format!("name = \"{name}\""))
}

/// The workspace's members, from the root `Cargo.toml`'s `members = [...]`.
fn workspace_members() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    // `members = ["a", "b", ...]` on one line, as the root manifest writes it.
    let list = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .and_then(|rest| rest.split(']').next())
        .expect("[workspace] members = [...] on one line");
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The Dockerfile: pinned Rust on bookworm, the examples package built in release, a slim
/// bookworm runtime running `service`; and the load generator aimed at the demo service.
fn check_dockerfile(stack: &Stack) -> Vec<String> {
    let mut problems = Vec::new();
    let froms: Vec<&str> = stack
        .dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let builder_pinned = froms.first().is_some_and(|image| {
        image.starts_with("rust:")
            && image.ends_with("-bookworm")
            && image_tag(image)
                .0
                .and_then(|t| version(t.trim_end_matches("-bookworm")))
                .is_some()
    });
    if !builder_pinned {
        problems.push(format!(
            "Dockerfile: builder is {:?}, expected rust:<version>-bookworm",
            froms.first()
        ));
    }
    if froms.last() != Some(&"debian:bookworm-slim") {
        problems.push(format!(
            "Dockerfile: runtime is {:?}, expected debian:bookworm-slim",
            froms.last()
        ));
    }
    if !stack
        .dockerfile
        .contains("cargo build --release --locked -p otel-profiling-examples")
    {
        problems.push("Dockerfile: does not build otel-profiling-examples in release".to_string());
    }
    // Cargo loads the whole workspace: a member missing from the image fails the build.
    let copied: Vec<&str> = stack
        .dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("COPY "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for member in workspace_members() {
        // A member inside a copied directory (bridge/handler-proof under bridge) is copied.
        let inside = |dir: &&str| {
            member == *dir
                || member
                    .strip_prefix(*dir)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        if !copied.iter().any(inside) {
            problems.push(format!(
                "Dockerfile: workspace member `{member}` is not copied into the builder"
            ));
        }
    }
    let cmd = stack
        .dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("CMD "))
        .unwrap_or_default();
    if cmd != r#"["service"]"# {
        problems.push(format!(
            "Dockerfile: CMD is {cmd:?}, expected [\"service\"]"
        ));
    }
    let load = service(&stack.compose, "demo-load");
    let load_command = load.map(|s| strings(s.get("command"))).unwrap_or_default();
    for binary in ["service", "load"] {
        if !example_binary_exists(binary) {
            problems.push(format!("examples: no binary `{binary}`"));
        }
        if !stack
            .dockerfile
            .contains(&format!("target/release/{binary}"))
        {
            problems.push(format!("Dockerfile: binary `{binary}` is not copied"));
        }
    }
    // demo-load drives http://demo:<the port BIND_ADDR gives the service>.
    let demo_port = service(&stack.compose, "demo")
        .and_then(|s| environment(s).get("BIND_ADDR").cloned())
        .and_then(|addr| host_port(&addr))
        .map(|(_, port)| port);
    let target = load_command.get(1).and_then(|url| host_port(url));
    match (load_command.first().map(String::as_str), target, demo_port) {
        (Some("load"), Some((host, port)), Some(bind)) if host == "demo" && port == bind => {}
        _ => problems.push(format!(
            "compose: demo-load runs {load_command:?}, not `load http://demo:{demo_port:?}`"
        )),
    }
    problems
}

fn check_all(stack: &Stack) -> Vec<String> {
    [
        check_compose(stack),
        check_tempo(stack),
        check_datasources(stack),
        check_grafana(stack),
        check_demo(stack),
        check_dockerfile(stack),
    ]
    .concat()
}

fn assert_clean(what: &str, problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// The stack as committed

#[test]
fn backends_publish_their_ports_with_pinned_images_and_healthchecks() {
    assert_clean("compose", check_compose(&Stack::load()));
}

#[test]
fn tempo_receives_otlp_on_all_interfaces_and_serves_its_api_on_3200() {
    assert_clean("tempo", check_tempo(&Stack::load()));
}

#[test]
fn tempo_links_spans_to_the_profiles_the_exporter_pushes() {
    let stack = Stack::load();
    assert_clean("data sources", check_datasources(&stack));
    // Spelled out, for the reader of a failure: the provisioned link, value by value.
    let (all, _) = datasources(&stack);
    let tempo = all
        .iter()
        .map(|(_, ds)| ds)
        .find(|ds| text_at(ds, &["type"]).as_deref() == Some(TEMPO_DS_TYPE))
        .expect("a Tempo data source");
    let link = at(tempo, &["jsonData", "tracesToProfiles"]).expect("tracesToProfiles");
    assert_eq!(
        text_at(link, &["profileTypeId"]).as_deref(),
        Some(PROFILE_TYPE_ID)
    );
    assert_eq!(
        text_at(link, &["datasourceUid"]).as_deref(),
        Some("pyroscope")
    );
    assert_eq!(
        text_at(tempo, &["url"]).as_deref(),
        Some("http://tempo:3200")
    );
}

#[test]
fn grafana_tag_mapping_is_the_exporters_series_labels() {
    // Every attribute the exporter turns into a label is mapped, to that label, including
    // both spellings of the deployment environment.
    let expected = expected_tag_mapping();
    assert_eq!(expected.len(), RESOURCE_SERIES_LABELS.len());
    for (key, label) in [
        ("service.name", "service_name"),
        ("deployment.environment", "deployment_environment"),
        ("deployment.environment.name", "deployment_environment"),
    ] {
        assert!(
            expected.contains(&(key.to_string(), label.to_string())),
            "{key}"
        );
    }
    // And a resource carrying them yields exactly those labels, so the selector Grafana
    // builds from a span's resource names the series the profiles were pushed to.
    let attrs: Vec<(String, String)> = RESOURCE_SERIES_LABELS
        .iter()
        .map(|(k, _)| (k.to_string(), "x".to_string()))
        .collect();
    let pushed: BTreeSet<String> = resource_series_labels(&attrs)
        .into_iter()
        .map(|(l, _)| l)
        .collect();
    let selected: BTreeSet<String> = expected.into_iter().map(|(_, l)| l).collect();
    assert_eq!(pushed, selected);
    assert_clean("data sources", check_datasources(&Stack::load()));
}

#[test]
fn grafana_is_anonymous_admin_with_the_toggles_its_version_needs() {
    assert_clean("grafana", check_grafana(&Stack::load()));
}

#[test]
fn demo_environment_is_accepted_by_the_bridge() {
    let stack = Stack::load();
    assert_clean("demo", check_demo(&stack));
    let env = environment(service(&stack.compose, "demo").expect("demo service"));
    let (_, config) = bridge_config(&env);
    let config = config.expect("the bridge accepts the demo environment");
    let otlp = config.otlp.expect("traces are exported");
    assert_eq!(otlp.endpoint, "http://tempo:4318");
    assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(otlp.traces_url(), "http://tempo:4318/v1/traces");
    let pyroscope = config.pyroscope.expect("profiles are pushed");
    assert_eq!(pyroscope.server_address, "http://pyroscope:4040");
    assert!(config.service_name.is_some());
}

#[test]
fn dockerfile_builds_the_example_service() {
    assert_clean("Dockerfile", check_dockerfile(&Stack::load()));
}

// ---------------------------------------------------------------------------------------
// The checks can fail

/// Applies `mutation` to a freshly loaded (and clean) stack, and asserts that a problem
/// mentioning `expected` is reported.
fn assert_reports(expected: &str, mutation: impl FnOnce(&mut Stack)) {
    let mut stack = Stack::load();
    assert_clean("before the mutation", check_all(&stack));
    mutation(&mut stack);
    let problems = check_all(&stack);
    assert!(
        problems.iter().any(|p| p.contains(expected)),
        "expected a problem mentioning {expected:?}, got {problems:#?}"
    );
}

/// The Tempo data source, in whichever file it is.
fn tempo_datasource(stack: &mut Stack) -> &mut Value {
    stack
        .datasource_files
        .iter_mut()
        .filter_map(|(_, doc)| doc.get_mut("datasources")?.as_sequence_mut())
        .flatten()
        .find(|ds| text_at(ds, &["type"]).as_deref() == Some(TEMPO_DS_TYPE))
        .expect("a Tempo data source")
}

fn pyroscope_datasource(stack: &mut Stack) -> &mut Value {
    stack
        .datasource_files
        .iter_mut()
        .filter_map(|(_, doc)| doc.get_mut("datasources")?.as_sequence_mut())
        .flatten()
        .find(|ds| text_at(ds, &["type"]).as_deref() == Some(PYROSCOPE_DS_TYPE))
        .expect("a Pyroscope data source")
}

fn tags(stack: &mut Stack) -> &mut Vec<Value> {
    at_mut(
        tempo_datasource(stack),
        &["jsonData", "tracesToProfiles", "tags"],
    )
    .as_sequence_mut()
    .expect("a tags list")
}

fn set(value: &mut Value, path: &[&str], to: &str) {
    *at_mut(value, path) = Value::String(to.to_string());
}

#[test]
fn a_wrong_profile_type_is_reported() {
    assert_reports("profileTypeId", |s| {
        set(
            tempo_datasource(s),
            &["jsonData", "tracesToProfiles", "profileTypeId"],
            "process_cpu:samples:count:cpu:nanoseconds",
        )
    });
}

#[test]
fn a_changed_tag_label_is_reported() {
    assert_reports("lacks service.version -> service_version", |s| {
        let tag = tags(s)
            .iter_mut()
            .find(|t| text_at(t, &["key"]).as_deref() == Some("service.version"))
            .expect("service.version is mapped");
        set(tag, &["value"], "version");
    });
}

#[test]
fn a_missing_environment_key_is_reported() {
    assert_reports("lacks deployment.environment.name", |s| {
        tags(s).retain(|t| text_at(t, &["key"]).as_deref() != Some("deployment.environment.name"))
    });
}

#[test]
fn an_extra_tag_mapping_is_reported() {
    assert_reports("never pushes", |s| {
        let extra = serde_yaml::from_str("{key: host.name, value: host_name}").unwrap();
        tags(s).push(extra);
    });
}

#[test]
fn a_dangling_profiles_datasource_is_reported() {
    assert_reports("datasourceUid", |s| {
        set(
            tempo_datasource(s),
            &["jsonData", "tracesToProfiles", "datasourceUid"],
            "profiles",
        )
    });
}

#[test]
fn a_profiles_datasource_of_another_type_is_reported() {
    assert_reports("datasourceUid", |s| {
        set(pyroscope_datasource(s), &["type"], "prometheus")
    });
}

#[test]
fn a_custom_query_is_reported() {
    assert_reports("customQuery", |s| {
        *at_mut(
            tempo_datasource(s),
            &["jsonData", "tracesToProfiles", "customQuery"],
        ) = Value::Bool(true);
    });
}

#[test]
fn a_datasource_url_off_the_compose_network_is_reported() {
    assert_reports("url", |s| {
        set(pyroscope_datasource(s), &["url"], "http://localhost:4040")
    });
}

#[test]
fn otlp_bound_to_localhost_is_reported() {
    assert_reports("OTLP grpc endpoint", |s| {
        set(
            &mut s.tempo,
            &[
                "distributor",
                "receivers",
                "otlp",
                "protocols",
                "grpc",
                "endpoint",
            ],
            "localhost:4317",
        )
    });
}

#[test]
fn a_tempo_2_block_in_tempo_3_is_reported() {
    assert_reports("Tempo 2.x block", |s| {
        let block = serde_yaml::from_str("{max_block_duration: 5m}").unwrap();
        s.tempo
            .as_mapping_mut()
            .unwrap()
            .insert("ingester".into(), block);
    });
}

#[test]
fn unpinned_images_are_reported() {
    assert_reports("not pinned to a version", |s| {
        set(
            &mut s.compose,
            &["services", "grafana", "image"],
            "grafana/grafana:latest",
        )
    });
    assert_reports("not pinned (no tag)", |s| {
        set(
            &mut s.compose,
            &["services", "pyroscope", "image"],
            "grafana/pyroscope",
        )
    });
}

#[test]
fn an_unpublished_port_is_reported() {
    assert_reports("container port 4318", |s| {
        at_mut(&mut s.compose, &["services", "tempo", "ports"])
            .as_sequence_mut()
            .unwrap()
            .retain(|p| !scalar(p).unwrap_or_default().ends_with(":4318"))
    });
}

#[test]
fn an_old_grafana_without_toggles_is_reported() {
    assert_reports("needs the `traceToProfiles` feature toggle", |s| {
        set(
            &mut s.compose,
            &["services", "grafana", "image"],
            "grafana/grafana:10.2.3",
        )
    });
}

#[test]
fn a_grafana_login_is_reported() {
    assert_reports("GF_AUTH_ANONYMOUS_ORG_ROLE", |s| {
        set(
            &mut s.compose,
            &[
                "services",
                "grafana",
                "environment",
                "GF_AUTH_ANONYMOUS_ORG_ROLE",
            ],
            "Viewer",
        )
    });
}

#[test]
fn a_demo_variable_nobody_reads_is_reported() {
    assert_reports("neither the bridge nor the service reads", |s| {
        let env = at_mut(&mut s.compose, &["services", "demo", "environment"])
            .as_mapping_mut()
            .unwrap();
        let address = env.remove("PYROSCOPE_SERVER_ADDRESS").unwrap();
        env.insert("PYROSCOPE_SERVER".into(), address);
    });
}

#[test]
fn a_demo_variable_the_bridge_rejects_is_reported() {
    assert_reports("OTEL_EXPORTER_OTLP_PROTOCOL", |s| {
        set(
            &mut s.compose,
            &[
                "services",
                "demo",
                "environment",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ],
            "http/json",
        )
    });
}

#[test]
fn a_demo_aimed_at_the_wrong_port_is_reported() {
    assert_reports("is not tempo:4317", |s| {
        set(
            &mut s.compose,
            &[
                "services",
                "demo",
                "environment",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ],
            "grpc",
        )
    });
}

#[test]
fn a_demo_healthcheck_on_another_port_is_reported() {
    assert_reports("demo healthcheck", |s| {
        set(
            &mut s.compose,
            &["services", "demo", "environment", "BIND_ADDR"],
            "0.0.0.0:9090",
        )
    });
}
