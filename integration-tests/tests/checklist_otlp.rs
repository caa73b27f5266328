//! The verification checklist, unchanged, with the recordings' profiles shipped as OTLP
//! profiles (`POST /v1development/profiles`, the path Grafana Pyroscope serves) instead of
//! Pyroscope's push API, against the in-process stand-in (a stand-in for tests, not a
//! backend), which converts them the way Pyroscope does.

use otel_profiling::export::pyroscope::PROFILE_TYPE_ID;
use otel_profiling_integration_tests::checklist::{
    record_all, run_all, Backends, INVESTIGATE_TITLE,
};
use otel_profiling_integration_tests::standin::StandIn;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const CHECKLIST_EXE: &str = env!("CARGO_BIN_EXE_checklist");

/// One recording at a time: the CPU-vs-I/O check needs the CPU-heavy span to get a core.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every check passes; the stored profiles came over OTLP (Pyroscope's `__otel__` label),
/// as `process_cpu` CPU profiles whose samples carry the recorded spans' ids.
#[test]
fn the_checklist_passes_with_profiles_over_otlp() {
    let _turn = one_at_a_time();
    let standin = StandIn::start().expect("stand-in");
    let url = standin.url();
    let backends = Backends::new(&url, &url, &url, Duration::from_secs(8))
        .expect("the stand-in's URL is valid")
        .with_profiles_over_otlp(true);
    let recordings = record_all(CHECKLIST_EXE.as_ref(), &backends).expect("recordings");
    let results = run_all(&backends, &recordings);
    for r in &results {
        println!("{r}");
    }
    assert!(results.len() >= 6, "{} checks", results.len());
    assert!(results.iter().any(|r| r.title == INVESTIGATE_TITLE));
    for r in &results {
        assert!(r.passed, "{r}");
    }

    let samples = standin.samples();
    assert!(!samples.is_empty());
    assert!(
        samples
            .iter()
            .all(|s| s.labels.get("__otel__").map(String::as_str) == Some("true")),
        "every stored sample came over OTLP"
    );
    let cpu_span = &recordings.cpu.span_id;
    assert!(
        samples
            .iter()
            .any(|s| s.profile_type == PROFILE_TYPE_ID && s.span_id.as_ref() == Some(cpu_span)),
        "the CPU span's samples are stored as {PROFILE_TYPE_ID} with its span id"
    );
    assert!(standin.push_counters().accepted_profiles > 0);
}

/// The checklist binary's flag selects OTLP profiles, and the run is green end to end.
#[test]
fn the_checklist_binary_runs_green_with_its_otlp_flag() {
    let _turn = one_at_a_time();
    let out = Command::new(CHECKLIST_EXE)
        .args(["--standin", "--profiles-over-otlp", "--timeout", "8"])
        .env_remove("TEMPO_URL")
        .env_remove("PYROSCOPE_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .expect("run checklist");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("profiles over OTLP"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert!(
        stdout.contains(&format!("PASS 6. {INVESTIGATE_TITLE}")),
        "check 6 is in the output: {stdout}"
    );
}
