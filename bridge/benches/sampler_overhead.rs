//! What sampling costs a CPU-bound multi-threaded process, measured in one run:
//! no profiler vs this crate's profiler at 100 Hz vs the `pyroscope` crate's pprof backend
//! at 100 Hz.
//!
//! Each configuration runs in its own child process (so peak RSS and the SIGPROF owner are
//! its own), several times, interleaved. Each child runs the same fixed amount of work on
//! as many threads as there are cores, and reports: wall time (throughput), the process's
//! CPU time (`getrusage`), peak RSS, and the time `start` took on the calling thread.
//!
//! Run: `cargo bench -p otel-profiling --bench sampler_overhead`

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

const MODES: [&str; 4] = ["none", "otel-profiling", "pyroscope", "otel-prof+blackhole"];
const ROUNDS: usize = 5;
/// Work units per thread (each unit is a deep call chain doing arithmetic).
const UNITS: u64 = 600_000;

#[inline(never)]
fn leaf(mut x: u64) -> u64 {
    for i in 0..2_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i) ^ (x >> 31);
    }
    x
}

/// A call chain 24 frames deep, so unwinding has real work to do.
#[inline(never)]
fn chain(depth: u32, x: u64) -> u64 {
    if depth == 0 {
        leaf(x)
    } else {
        std::hint::black_box(chain(depth - 1, x.rotate_left(1)))
    }
}

fn workload(threads: usize) -> u64 {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let _ = otel_profiling::sampler::register_current_thread();
                let mut acc = t as u64;
                for u in 0..UNITS {
                    acc ^= chain(24, acc ^ u);
                }
                acc
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or(0))
        .fold(0, |a, b| a ^ b)
}

fn rusage() -> (Duration, u64) {
    // SAFETY: plain FFI with an out-parameter.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec * 1000) as u32);
    (
        tv(usage.ru_utime) + tv(usage.ru_stime),
        usage.ru_maxrss as u64 * 1024,
    )
}

/// One measurement in a child process; prints `wall_ns cpu_ns maxrss_bytes start_ns`.
fn child(mode: &str) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let dir = std::env::temp_dir().join(format!("otel-profiling-bench-{}", std::process::id()));
    let (_, rss_before) = rusage();
    let t0 = Instant::now();
    let guard: Box<dyn std::any::Any> = match mode {
        "none" => Box::new(()),
        "otel-prof+blackhole" => {
            // Pushing to a Pyroscope that accepts connections and never answers, with 1 s
            // profiles so uploads are attempted throughout the workload.
            let hole = match std::net::TcpListener::bind("127.0.0.1:0") {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("bind: {e}");
                    std::process::exit(2);
                }
            };
            let url = format!(
                "http://{}",
                hole.local_addr().map(|a| a.to_string()).unwrap_or_default()
            );
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for stream in hole.incoming().flatten() {
                    held.push(stream); // accept, never read or answer
                }
            });
            let sink = otel_profiling::export::pyroscope::PyroscopeExporter::new(
                otel_profiling::export::pyroscope::PyroscopeConfig::new(&url, "bench")
                    .with_request_timeout(std::time::Duration::from_secs(2))
                    .with_shutdown_timeout(std::time::Duration::from_millis(500)),
            );
            match sink.map_err(|e| e.to_string()).and_then(|sink| {
                otel_profiling::Profiler::builder()
                    .frequency_hz(100)
                    .interval(std::time::Duration::from_secs(1))
                    .sink(sink)
                    .start()
                    .map_err(|e| e.to_string())
            }) {
                Ok(p) => Box::new(p),
                Err(e) => {
                    eprintln!("profiler: {e}");
                    std::process::exit(2);
                }
            }
        }
        "otel-profiling" => match otel_profiling::Profiler::builder()
            .frequency_hz(100)
            .output_dir(&dir)
            .start()
        {
            Ok(p) => Box::new(p),
            Err(e) => {
                eprintln!("profiler: {e}");
                std::process::exit(2);
            }
        },
        _ => match common::start_pyroscope_agent(100) {
            Ok(a) => Box::new(a),
            Err(e) => {
                eprintln!("pyroscope: {e}");
                std::process::exit(2);
            }
        },
    };
    let start_ns = t0.elapsed().as_nanos();
    let (cpu_before, _) = rusage();
    let t1 = Instant::now();
    std::hint::black_box(workload(threads));
    let wall = t1.elapsed();
    let (cpu_after, rss_after) = rusage();
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{} {} {} {}",
        wall.as_nanos(),
        (cpu_after - cpu_before).as_nanos(),
        rss_after.saturating_sub(rss_before),
        start_ns
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(args.get(i + 1).map_or("none", String::as_str));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and test harness probes
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find own executable: {e}");
            std::process::exit(1);
        }
    };
    let mut results: Vec<Vec<[f64; 4]>> = vec![Vec::new(); MODES.len()];
    for round in 0..ROUNDS {
        for (m, mode) in MODES.iter().enumerate() {
            let out = Command::new(&exe).args(["--child", mode]).output();
            let Ok(out) = out else { continue };
            let text = String::from_utf8_lossy(&out.stdout);
            let nums: Vec<f64> = text
                .split_whitespace()
                .filter_map(|s| s.parse().ok())
                .collect();
            if nums.len() == 4 {
                results[m].push([nums[0], nums[1], nums[2], nums[3]]);
            } else {
                eprintln!(
                    "{mode} round {round} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    let stat = |m: usize, k: usize| median(results[m].iter().map(|r| r[k]).collect());
    if results.iter().any(|r| r.is_empty()) {
        eprintln!("a configuration produced no result");
        std::process::exit(1);
    }
    println!("\n=== sampler overhead, median of {ROUNDS} interleaved runs, 100 Hz ===");
    println!(
        "{:<20} {:>10} {:>12} {:>12} {:>14} {:>12}",
        "config", "wall ms", "CPU ms", "CPU vs none", "peak RSS +MiB", "start ms"
    );
    let base_cpu = stat(0, 1);
    let base_wall = stat(0, 0);
    for (m, mode) in MODES.iter().enumerate() {
        println!(
            "{:<20} {:>10.1} {:>12.1} {:>11.2}% {:>14.1} {:>12.2}",
            mode,
            stat(m, 0) / 1e6,
            stat(m, 1) / 1e6,
            100.0 * (stat(m, 1) / base_cpu - 1.0),
            stat(m, 2) / (1024.0 * 1024.0),
            stat(m, 3) / 1e6,
        );
    }
    println!(
        "throughput vs none: otel-profiling {:.3}x, pyroscope {:.3}x, otel-profiling pushing to a black hole {:.3}x",
        base_wall / stat(1, 0),
        base_wall / stat(2, 0),
        base_wall / stat(3, 0)
    );
}
