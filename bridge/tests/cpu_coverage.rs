//! The profiles hold the process's CPU, threads that never enter a span included (issue
//! 40: at least 95 % of it for threads that live longer than the scan period, the
//! profiler's own threads left out), and where they do not, the low share is counted
//! (`collector/coverage.rs`). Alone in its test binary: every thread of the process
//! counts.

use std::time::{Duration, Instant};

use otel_profiling::Profiler;

fn spin(d: Duration) -> u64 {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
    x
}

/// A profiler with the default adoption (`adopt: None`) or the one given.
fn profiler(dir: &std::path::Path, adopt: Option<bool>) -> Profiler {
    let builder = Profiler::builder()
        .output_dir(dir)
        .cpu_coverage_window(Duration::from_millis(1000));
    match adopt {
        Some(on) => builder.sample_unregistered_threads(on),
        None => builder,
    }
    .start()
    .expect("profiler")
}

#[test]
fn threads_that_never_register_are_sampled_and_a_low_share_is_counted() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-coverage-{}", std::process::id()));

    // The default: a thread that never enters a span is adopted within a scan period,
    // and the windows after that hold (about) all of the process's CPU.
    let profiler = profiler(&dir, None);
    let unregistered = std::thread::spawn(|| spin(Duration::from_millis(3600)));
    let sampled = std::thread::spawn(|| {
        otel_profiling::sampler::register_current_thread().expect("register");
        spin(Duration::from_millis(3600))
    });
    let _ = (unregistered.join(), sampled.join());
    let adopted = profiler.stats();
    eprintln!(
        "adopting: last window {} ‰, {} low windows, {:?}",
        adopted.cpu_coverage_permille, adopted.cpu_low_coverage_windows, adopted.sampler
    );
    assert!(adopted.sampler.adoptions >= 1, "{adopted:?}");
    assert!(
        adopted.cpu_coverage_permille >= 950,
        "{} ‰ with a thread that never registered: {adopted:?}",
        adopted.cpu_coverage_permille
    );
    // At most the window in which the thread began before the scan found it was low.
    assert!(adopted.cpu_low_coverage_windows <= 1, "{adopted:?}");
    assert!(adopted.cpu_process_ns >= 2_000_000_000, "{adopted:?}");
    profiler.shutdown(Duration::from_secs(10));

    // Adoption switched off: half the CPU on a thread with no timer, every window reads
    // about 50 %, and that is counted.
    let profiler = self::profiler(&dir, Some(false));
    let unsampled = std::thread::spawn(|| spin(Duration::from_millis(2600)));
    let sampled = std::thread::spawn(|| {
        otel_profiling::sampler::register_current_thread().expect("register");
        spin(Duration::from_millis(2600))
    });
    let _ = (unsampled.join(), sampled.join());
    let low = profiler.stats();
    assert!(
        low.cpu_low_coverage_windows >= 1,
        "no low window counted: {low:?}"
    );
    assert!(
        low.cpu_coverage_permille < 800,
        "{} ‰ with half the CPU unsampled",
        low.cpu_coverage_permille
    );
    profiler.shutdown(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}
