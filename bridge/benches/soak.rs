//! Issue 42's soak: the realistic mix of `tests/support/soak_mix.rs` (short roots with
//! distinct names, long roots, plain-API roots, thread churn, forks, the sampler at
//! 100 Hz, the thread context on, spans to local files, profiles to a Pyroscope
//! stand-in) for as long as asked. Every report period it prints RSS and each structure's
//! size (docs/bounds.md); at the end, the RSS slope after warm-up with its 95 % confidence
//! interval, and each structure's size after warm-up and at the end.
//!
//! Run: `SOAK_SECS=3600 cargo bench -p otel-profiling --bench soak`
//! (`SOAK_REPORT_SECS`, default 60; `SOAK_WARMUP_SECS`, default a tenth of the run, at
//! least 60; `SOAK_PAUSE_US`, the short roots' pause every 8 roots, default 2000).

use std::time::{Duration, Instant};

#[path = "../tests/support/soak_mix.rs"]
mod soak_mix;

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument that is not ours skips the run.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && a != "soak")
    {
        return;
    }
    let total = Duration::from_secs(env_secs("SOAK_SECS", 600));
    let report = Duration::from_secs(env_secs("SOAK_REPORT_SECS", 60).max(1));
    let warmup = Duration::from_secs(env_secs("SOAK_WARMUP_SECS", (total.as_secs() / 10).max(60)));
    let pace = Duration::from_micros(env_secs("SOAK_PAUSE_US", 2000));
    let dir = soak_mix::fresh_dir("soak-bench");
    println!(
        "soak: {} s, report every {} s, warm-up {} s, pause {} us, files in {}",
        total.as_secs(),
        report.as_secs(),
        warmup.as_secs(),
        pace.as_micros(),
        dir.display()
    );
    let mix = soak_mix::Mix::start(&dir, pace);
    let start = Instant::now();
    let mut points = Vec::new();
    let (mut anon, mut file) = (Vec::new(), Vec::new());
    // RSS beside the symbolizer's cached names: a bounded cache (capped per file) that
    // keeps filling, ever more slowly, for hours as sampling reaches new addresses.
    let mut with_names = Vec::new();
    let mut warm: Option<soak_mix::Snapshot> = None;
    let mut next_report = report;
    let mut last = mix.snapshot();
    while start.elapsed() < total {
        std::thread::sleep(Duration::from_secs(10).min(report));
        last = mix.snapshot();
        if last.at >= warmup {
            if warm.is_none() {
                println!("-- warm-up over --");
                warm = Some(last.clone());
            }
            let hour = last.at.as_secs_f64() / 3600.0;
            points.push((hour, last.rss_kib as f64 / 1024.0));
            anon.push((hour, last.anon_kib as f64 / 1024.0));
            file.push((hour, last.file_kib as f64 / 1024.0));
            with_names.push((
                hour,
                last.rss_kib as f64 / 1024.0,
                last.health.profiler.symbol_cache_entries as f64,
            ));
        }
        if last.at >= next_report {
            println!("{}", last.line());
            next_report += report;
        }
    }
    println!("{}", last.line());
    println!(
        "forks {} (bad {}), uploads to the stand-in {}",
        mix.forks.load(std::sync::atomic::Ordering::Relaxed),
        mix.bad_forks.load(std::sync::atomic::Ordering::Relaxed),
        mix.uploads()
    );
    match soak_mix::slope_ci(&points) {
        Some(fit) => println!(
            "RSS slope after warm-up: {:+.3} MiB/hour, 95% CI [{:+.3}, {:+.3}] allowing for \
             correlated points (Newey-West, lag {}); [{:+.3}, {:+.3}] as if independent \
             ({} points)",
            fit.slope,
            fit.slope - fit.hac_half,
            fit.slope + fit.hac_half,
            fit.lag,
            fit.slope - fit.ols_half,
            fit.slope + fit.ols_half,
            points.len()
        ),
        None => println!("RSS slope: too few points after warm-up"),
    }
    // The same for its two parts: anonymous memory is what a leak grows; mapped files'
    // pages (the binary's debug info as the symbolizer first reads each part of it) are
    // bounded by the files and dropped by the kernel under pressure.
    for (what, series) in [("anonymous", &anon), ("mapped files", &file)] {
        if let Some(fit) = soak_mix::slope_ci(series) {
            println!(
                "  of it {what}: {:+.3} MiB/hour, 95% CI [{:+.3}, {:+.3}] (Newey-West)",
                fit.slope,
                fit.slope - fit.hac_half,
                fit.slope + fit.hac_half
            );
        }
    }
    // Net of the names: what the process gains that the cache's own count does not
    // explain (the fit's bytes per name says whether the split is believable).
    match soak_mix::slope_net_of(&with_names) {
        Some((fit, per_name)) => println!(
            "RSS slope net of the symbolizer's names: {:+.3} MiB/hour, 95% CI [{:+.3}, \
             {:+.3}] (Newey-West); {:.0} bytes a name",
            fit.slope,
            fit.slope - fit.hac_half,
            fit.slope + fit.hac_half,
            per_name * 1024.0 * 1024.0
        ),
        None => println!("RSS slope net of the symbolizer's names: the names did not move"),
    }
    if let Some(warm) = warm {
        for ((name, before), (_, after)) in warm.sizes().into_iter().zip(last.sizes()) {
            println!("{name:>14}: {before} after warm-up, {after} at the end");
        }
    }
    mix.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
