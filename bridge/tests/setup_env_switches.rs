//! The OpenTelemetry switches that turn export off: `OTEL_SDK_DISABLED=true` (no span
//! exported, no profiler started, nothing written) and `OTEL_TRACES_EXPORTER=none` (no
//! span exported, local files included; profiles unaffected). Before, both were ignored
//! and everything went to local files.

use otel_profiling::config::EnvConfig;
use otel_profiling::Telemetry;

fn telemetry(vars: &[(&str, &str)], dir: &std::path::Path) -> otel_profiling::TelemetryGuard {
    let env = EnvConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    })
    .expect("valid variables");
    Telemetry::from_env_config(env)
        .service_name("switches")
        .output_dir(dir)
        .quiet(true)
        .build()
        .expect("setup")
}

/// One test: the profiler is process-wide, so the two cases run one after the other.
#[test]
fn sdk_disabled_and_traces_exporter_none_export_nothing_they_switch_off() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-switches-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let off = telemetry(&[("OTEL_SDK_DISABLED", "true")], &dir);
    assert_eq!(off.profiles_dir(), None, "no profiler");
    assert_eq!(off.spans_file(), None, "no span file");
    tracing::subscriber::with_default(
        tracing_subscriber::layer::SubscriberExt::with(tracing_subscriber::registry(), off.layer()),
        || tracing::info_span!("GET /off").in_scope(|| std::hint::black_box(1 + 1)),
    );
    drop(off);
    assert!(
        !dir.exists(),
        "nothing written under OTEL_SDK_DISABLED=true"
    );

    let no_traces = telemetry(&[("OTEL_TRACES_EXPORTER", "none")], &dir);
    assert_eq!(
        no_traces.profiles_dir(),
        Some(dir.as_path()),
        "profiles still local"
    );
    assert_eq!(no_traces.spans_file(), None, "spans go nowhere");
    drop(no_traces);
    let spans_files = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with("_spans.jsonl"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(
        spans_files, 0,
        "no span file under OTEL_TRACES_EXPORTER=none"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
