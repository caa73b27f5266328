//! Runs a recording in a child process (`<checklist binary> record ...`): the profiler
//! owns `SIGPROF` and `Telemetry` is per process, so each recorded scenario gets a fresh
//! process.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::workload::RecordSpec;

/// One recorded root span, as the recording process saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedOp {
    /// Span name.
    pub name: String,
    /// 32 hex.
    pub trace_id: String,
    /// 16 hex.
    pub span_id: String,
    /// Wall time measured in-process, ms.
    pub wall_ms: f64,
    /// Response size, for the report scenario.
    pub response_bytes: Option<u64>,
    /// `service.name` of the recording.
    pub service_name: String,
    /// `service.version` of the recording.
    pub service_version: String,
}

/// The arguments of `checklist record` for `spec`.
pub fn record_args(spec: &RecordSpec) -> Vec<String> {
    let mut args = vec![
        "record".to_string(),
        "--otlp".into(),
        spec.otlp_endpoint.clone(),
        "--pyroscope".into(),
        spec.pyroscope_url.clone(),
        "--service".into(),
        spec.service_name.clone(),
        "--version".into(),
        spec.service_version.clone(),
        "--scenario".into(),
        spec.scenario.name().into(),
    ];
    if !spec.profile_id {
        args.push("--no-profile-id".into());
    }
    if spec.profiles_over_otlp {
        args.push("--profiles-over-otlp".into());
    }
    args
}

/// Runs `exe record ...` and parses the spans it printed.
pub fn record_in_child(exe: &Path, spec: &RecordSpec) -> Result<Vec<RecordedOp>, String> {
    let output = Command::new(exe)
        .args(record_args(spec))
        // The child is configured by its arguments only.
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("PYROSCOPE_SERVER_ADDRESS")
        .env_remove("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT")
        .env_remove("OTEL_PROFILING_PROFILES_EXPORTER")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_SERVICE_NAME")
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if !output.status.success() {
        return Err(format!(
            "recording {} failed ({}): {}",
            spec.scenario.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut ops = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        ops.push(RecordedOp {
            name: s("name"),
            trace_id: s("trace_id"),
            span_id: s("span_id"),
            wall_ms: v.get("wall_ms").and_then(Value::as_f64).unwrap_or(0.0),
            response_bytes: v.get("response_bytes").and_then(Value::as_u64),
            service_name: spec.service_name.clone(),
            service_version: spec.service_version.clone(),
        });
    }
    if ops.is_empty() {
        return Err(format!(
            "recording {} printed no spans",
            spec.scenario.name()
        ));
    }
    Ok(ops)
}

/// A service name unique to this run (`checklist-<pid>-<ns>-<tag>`).
pub fn unique_service_name(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "checklist-{}-{}-{tag}",
        std::process::id(),
        nanos % 1_000_000_000_000
    )
}
