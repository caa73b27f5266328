//! A filter in front of the layer that drops every span (an `EnvFilter` at `warn` on the
//! whole subscriber) loses every span label without an error: the profiler says so once,
//! on stderr. Each case runs in a child process (the test binary again), whose stderr the
//! parent reads: the warning is printed by the collector's thread, and the global
//! subscriber can be set only once per process.

use std::process::Command;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;

const CHILD: &str = "OTEL_PROFILING_FILTERED_SPANS_CHILD";
const WARNING: &str = "no span has reached otel-profiling's layer";

/// In the child: a service whose subscriber filters at `filter`, creating `info` spans
/// and burning CPU in them for about 0.7 s (several 150 ms profile intervals).
fn run_service(filter: &str) {
    let dir = std::env::temp_dir().join(format!(
        "otel-profiling-filtered-spans-{}",
        std::process::id()
    ));
    let guard = otel_profiling::Telemetry::builder()
        .service_name("filtered")
        .output_dir(&dir)
        .upload_interval(Duration::from_millis(150))
        .quiet(true)
        .build()
        .expect("setup");
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new(filter))
        .with(guard.layer());
    tracing::subscriber::set_global_default(subscriber).expect("global subscriber");
    let until = Instant::now() + Duration::from_millis(700);
    let mut sum = 0u64;
    while Instant::now() < until {
        let _span = tracing::info_span!("request").entered();
        for i in 0..20_000u64 {
            sum = sum.wrapping_add(std::hint::black_box(i).wrapping_mul(31));
        }
    }
    std::hint::black_box(sum);
    guard.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs case `filter` in a child; its stderr.
fn child_stderr(filter: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, filter)
        .output()
        .expect("child runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed: {stderr}");
    stderr
}

/// The entry point of the child processes (does nothing when run as a test).
#[test]
fn child() {
    if let Ok(filter) = std::env::var(CHILD) {
        run_service(&filter);
    }
}

#[test]
fn a_filter_that_drops_every_span_is_named_once() {
    let filtered = child_stderr("warn");
    assert_eq!(
        filtered.matches(WARNING).count(),
        1,
        "one warning naming the filter: {filtered}"
    );
    assert!(filtered.contains("EnvFilter"), "{filtered}");
    let passed = child_stderr("info");
    assert!(
        !passed.contains(WARNING),
        "no warning when the spans reach the layer: {passed}"
    );
}
