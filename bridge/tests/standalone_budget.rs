//! `Profiler::builder().start()` without `Telemetry` keeps its local directory within the
//! same default bound (issue 42: it wrote `<start>_cpu.pb.gz` every interval without
//! end), reads `OTEL_PROFILING_OUTPUT_MAX_BYTES` as the setup does, and reports what it
//! removed in `ProfilerStats`. (Own test binary: the profiler and the environment are
//! process-wide.)

mod common;

use std::time::{Duration, Instant};

use otel_profiling::{Profiler, ProfilerError};

const VARIABLE: &str = "OTEL_PROFILING_OUTPUT_MAX_BYTES";

#[test]
fn a_standalone_profiler_keeps_its_directory_bounded_and_says_what_it_removed() {
    let dir =
        std::env::temp_dir().join(format!("otel-profiling-standalone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");

    // A malformed bound fails at start, naming the variable, before anything runs.
    std::env::set_var(VARIABLE, "lots");
    match Profiler::builder().output_dir(&dir).start() {
        Err(e @ ProfilerError::Config(_)) => {
            assert!(e.to_string().starts_with(VARIABLE), "{e}")
        }
        other => panic!("{other:?}"),
    }
    std::env::remove_var(VARIABLE);

    // An earlier run's 300 MiB (sparse: no disk used), past the default 256 MiB.
    let old = dir.join("2020-01-01T00-00-00.000Z_cpu.pb.gz");
    std::fs::File::create(&old)
        .and_then(|f| f.set_len(300 << 20))
        .expect("old file");
    let profiler = Profiler::builder()
        .frequency_hz(250)
        .interval(Duration::from_secs(30))
        .blocked_watchdog(None)
        .output_dir(&dir)
        .start()
        .expect("profiler");
    assert!(profiler.local_budget().is_some());
    let start = Instant::now();
    while profiler.stats().profiles_exported == 0 && start.elapsed() < Duration::from_secs(20) {
        common::burn(Duration::from_millis(50));
        assert!(profiler.flush(Duration::from_secs(10)), "flush");
    }
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");
    assert!(stats.profiles_exported >= 1, "{stats:?}");
    assert!(!old.exists(), "the earlier run's file went first");
    assert_eq!(
        (stats.local_files_removed, stats.local_bytes_removed),
        (1, 300 << 20),
        "{stats:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
