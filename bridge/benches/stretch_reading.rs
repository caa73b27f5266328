//! What a long stretch's reading costs (issue 40): the thread's CPU clock and its own
//! schedstat run delay, as `record/span_context/own_clocks.rs` reads them where a stretch
//! of 250 µs or more inside a root ends, against the CPU clock alone (what the sampler's
//! handler reads per sample) and against `CLOCK_MONOTONIC` (what a switch reads where the
//! TSC is not the kernel's clock). Medians of batches in the thread's CPU time, one run.
//!
//! Run: `cargo bench -p otel-profiling --bench stretch_reading`.

use std::hint::black_box;
use std::time::Instant;

const BATCH: u32 = 2_000;
const BATCHES: usize = 60;

/// Median per call over batches, in the thread's own CPU time: on a shared machine the
/// wall time of a batch includes other work's turns, the CPU time only ours.
fn median_ns(mut f: impl FnMut()) -> f64 {
    let mut per_call: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let start = thread_cpu_total();
            for _ in 0..BATCH {
                f();
            }
            (thread_cpu_total() - start) as f64 / f64::from(BATCH)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

fn thread_cpu_total() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn thread_cpu_clock() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_nsec as u64
}

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && a != "stretch_reading")
    {
        return;
    }
    assert!(
        otel_profiling::test_support::read_own_clocks(),
        "readable here"
    );
    let reading = median_ns(|| {
        black_box(otel_profiling::test_support::read_own_clocks());
    });
    let cpu_clock = median_ns(|| {
        black_box(thread_cpu_clock());
    });
    let monotonic = median_ns(|| {
        black_box(Instant::now());
    });
    println!(
        "a long stretch's reading, CPU time: {cpu_clock:.0} ns on CPU all along (the CPU \
         clock), {reading:.0} ns off CPU (with the schedstat pread); CLOCK_MONOTONIC \
         {monotonic:.0} ns. Of the shortest long stretch (250 us): {:.2} % and {:.2} %",
        cpu_clock / 250_000.0 * 100.0,
        reading / 250_000.0 * 100.0
    );
}
