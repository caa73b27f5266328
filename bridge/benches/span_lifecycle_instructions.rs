//! Instructions per root span lifecycle (create, 4 polls, close), counted by valgrind's
//! callgrind, for the set-ups in `lifecycle_setups` (`span_lifecycle_interleaved` times
//! the same ones): a figure that does not move with the machine's load, where nanoseconds
//! on the project's shared 2-core VM do.
//!
//! Run: `cargo bench -p otel-profiling --bench span_lifecycle_instructions` (needs
//! `valgrind`; prints that it skipped otherwise). The bench runs itself under callgrind
//! once per set-up, counting only inside `lifecycle_setups::lifecycles`, and prints each
//! count per lifecycle and its ratio to `tracing-opentelemetry` alone. Instructions are
//! not time (a cache miss or an atomic costs more than an add), so the interleaved bench
//! stays the measure in nanoseconds; this one says where the instructions go.

mod lifecycle_setups;

use std::process::Command;

use lifecycle_setups::{baseline_of, needs_sampler, needs_thread_ctx, Setup, SETUPS};
use otel_profiling::sampler::{Sampler, SamplerConfig};

/// Lifecycles counted per set-up (after as many uncounted ones to warm caches up).
const LIFECYCLES: u32 = 20_000;
const SETUP_VAR: &str = "SPAN_LIFECYCLE_SETUP";

/// Runs one set-up's lifecycles (inside callgrind).
fn run(setup: &str) {
    // Natively this bench's polls and the gaps between them last about a microsecond:
    // short stretches, which read no clock. Under callgrind they last ~50 times longer,
    // and at the real threshold (250 µs) some would read the thread's clocks, which they
    // never do natively: the threshold is raised so that the count is the native path's.
    // (The cost of a long stretch's reading is measured apart: docs/benchmarks.md.)
    otel_profiling::test_support::set_long_stretch_ns(u64::MAX / 4);
    let bench = Setup::new(setup);
    let sampler = needs_sampler(setup).then(|| {
        let sampler = Sampler::start(SamplerConfig::default().with_frequency_hz(100))
            .expect("the sampler starts");
        sampler
            .register_current_thread()
            .expect("the thread registers");
        sampler
    });
    if needs_thread_ctx(setup) {
        otel_profiling::thread_ctx::enable().expect("the thread context is published");
    }
    bench.run(LIFECYCLES);
    bench.run(LIFECYCLES);
    if needs_thread_ctx(setup) {
        otel_profiling::thread_ctx::disable();
    }
    drop(sampler);
}

/// Instructions callgrind counted inside `lifecycles` for `setup`, per lifecycle.
fn count(setup: &str) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out_file = std::env::temp_dir().join(format!(
        "otel-profiling-callgrind-{}-{setup}.out",
        std::process::id()
    ));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--toggle-collect=*lifecycle_setups::lifecycles")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(&exe)
        .env(SETUP_VAR, setup)
        .output()
        .map_err(|e| format!("valgrind: {e}"))?;
    let _ = std::fs::remove_file(&out_file);
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("{setup}: valgrind failed: {log}"));
    }
    let collected = log
        .lines()
        .find_map(|line| line.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("{setup}: no count in valgrind's output: {log}"))?;
    Ok(collected / f64::from(2 * LIFECYCLES))
}

fn main() {
    if let Ok(setup) = std::env::var(SETUP_VAR) {
        run(&setup);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it too: only count when
    // benchmarking.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("span_lifecycle_instructions: skipped (valgrind is not installed)");
        return;
    }
    println!("instructions per root span lifecycle (create, 4 polls, close), callgrind:");
    let mut baselines = std::collections::HashMap::new();
    for (setup, what) in SETUPS {
        match count(setup) {
            Ok(per) => {
                let base_name = baseline_of(setup);
                if *setup == base_name {
                    baselines.insert(base_name, per);
                }
                let ratio = baselines
                    .get(base_name)
                    .map_or(String::from("-"), |base| format!("{:.3}x", per / base));
                println!("  {setup:<17} {per:>9.0}  {ratio:>7}  {what}");
            }
            Err(err) => println!("  {setup:<17} failed: {err}"),
        }
    }
}
