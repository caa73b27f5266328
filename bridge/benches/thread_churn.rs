//! What short-lived threads cost: 10,000 threads, each entering one span and exiting,
//! with and without the sampler running, measured in one run. The first `span.enter()` on
//! a new thread registers it with the sampler (claims a recycled slot, creates and arms
//! its CPU timer); this prints its p50/p99 against the same enter with no sampler, the
//! added peak RSS, and the resident memory per live registered thread.
//!
//! Each mode runs in its own child process, so peak RSS is its own.
//!
//! Run: `cargo bench -p otel-profiling --bench thread_churn`

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::ProfilingLayer;
use tracing_subscriber::layer::SubscriberExt;

const THREADS: usize = 10_000;
/// Threads alive at once during the churn.
const CONCURRENT: usize = 16;
/// Threads kept alive for the per-thread resident memory figure.
const LIVE: usize = 500;

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Runs the churn in this process: returns (first-enter times, peak RSS growth KiB,
/// resident KiB per live thread).
fn churn(with_sampler: bool) -> (Vec<Duration>, u64, u64) {
    let sampler = std::sync::Arc::new(with_sampler.then(|| {
        Sampler::start(SamplerConfig::default()).unwrap_or_else(|e| panic!("sampler: {e}"))
    }));
    // The collector's part: drain every 100 ms, which also recycles exited threads' slots.
    let (stop, stopped) = mpsc::channel::<()>();
    let drainer = {
        let sampler = sampler.clone();
        std::thread::spawn(move || {
            while stopped.recv_timeout(Duration::from_millis(100)).is_err() {
                if let Some(sampler) = sampler.as_ref() {
                    sampler.drain(|_| {});
                }
            }
        })
    };
    let dispatch =
        tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::new()));
    let hwm_before = status_kib("VmHWM:");
    let mut times = Vec::with_capacity(THREADS);
    let mut started = 0;
    while started < THREADS {
        let batch: Vec<_> = (0..CONCURRENT.min(THREADS - started))
            .map(|_| {
                let dispatch = dispatch.clone();
                std::thread::spawn(move || {
                    tracing::dispatcher::with_default(&dispatch, || {
                        let span = tracing::info_span!("request");
                        let start = Instant::now();
                        let entered = span.enter();
                        let took = start.elapsed();
                        std::hint::black_box(&entered);
                        took
                    })
                })
            })
            .collect();
        started += batch.len();
        times.extend(batch.into_iter().map(|t| t.join().unwrap_or_default()));
    }
    let hwm_growth = status_kib("VmHWM:").saturating_sub(hwm_before);
    // Resident memory of LIVE registered threads, each having run a little CPU.
    let rss_before = status_kib("VmRSS:");
    let (release, released) = mpsc::channel::<()>();
    let released = std::sync::Arc::new(std::sync::Mutex::new(released));
    let (ready, readied) = mpsc::channel::<()>();
    let live: Vec<_> = (0..LIVE)
        .map(|_| {
            let (dispatch, released, ready) = (dispatch.clone(), released.clone(), ready.clone());
            std::thread::spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    let span = tracing::info_span!("live");
                    let _entered = span.enter();
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_millis(30) {
                        std::hint::black_box(start.elapsed());
                    }
                    let _ = ready.send(());
                    let _ = released.lock().map(|r| r.recv());
                })
            })
        })
        .collect();
    for _ in 0..LIVE {
        let _ = readied.recv();
    }
    let per_thread = status_kib("VmRSS:").saturating_sub(rss_before) / LIVE as u64;
    drop(release);
    for t in live {
        let _ = t.join();
    }
    let _ = stop.send(());
    let _ = drainer.join();
    drop(sampler);
    (times, hwm_growth, per_thread)
}

fn main() {
    if let Some(mode) = std::env::args()
        .nth(1)
        .filter(|a| a == "none" || a == "sampler")
    {
        let (mut times, hwm, per_thread) = churn(mode == "sampler");
        times.sort_unstable();
        println!(
            "{} {} {} {}",
            percentile(&times, 0.5).as_nanos(),
            percentile(&times, 0.99).as_nanos(),
            hwm,
            per_thread
        );
        return;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let run = |mode: &str| -> [u64; 4] {
        let out = Command::new(&exe)
            .arg(mode)
            .output()
            .unwrap_or_else(|e| panic!("child: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let values: Vec<u64> = text
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        assert_eq!(values.len(), 4, "child output: {text}");
        [values[0], values[1], values[2], values[3]]
    };
    println!("{THREADS} threads ({CONCURRENT} at a time), each entering one span:");
    let none = run("none");
    let with = run("sampler");
    println!(
        "  first enter, no sampler:      p50 {:>6.2} us  p99 {:>6.2} us  peak RSS +{} KiB  resident/live thread {} KiB",
        none[0] as f64 / 1e3,
        none[1] as f64 / 1e3,
        none[2],
        none[3]
    );
    println!(
        "  first enter, sampler 100 Hz:  p50 {:>6.2} us  p99 {:>6.2} us  peak RSS +{} KiB  resident/live thread {} KiB",
        with[0] as f64 / 1e3,
        with[1] as f64 / 1e3,
        with[2],
        with[3]
    );
    println!(
        "  registration adds: p50 {:.2} us ({:.1}x the plain first enter), {} KiB resident per live thread",
        with[0].saturating_sub(none[0]) as f64 / 1e3,
        with[0] as f64 / none[0].max(1) as f64,
        with[3].saturating_sub(none[3])
    );
}
