//! Memory the profiler adds to a release binary, with and without line tables
//! (issue 10 item 6).
//!
//! Build it the way the README recommends for file and line numbers:
//!
//! ```text
//! CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
//!     cargo bench -p otel-profiling --bench symbolizer_memory
//! ```
//!
//! The binary links this crate and with it tokio, hyper, reqwest, rustls, tonic and the
//! OpenTelemetry SDK: tens of thousands of functions, like a real service. It runs four
//! child processes of itself: {this binary, a copy with its debug sections removed by
//! `objcopy --strip-debug`} × {no profiler, the profiler at 100 Hz with 1 s profiles}. Each
//! child runs the same mixed workload (tokio tasks doing JSON, gzip, protobuf, maps,
//! sorting and formatting) on two sampled worker threads for `SECONDS`, and reads
//! `/proc/self/status` every 20 ms. It reports, in kB:
//! - `before`: RSS just before the first profile is named (the last reading in the first
//!   0.8 s, before the first 1 s interval ends);
//! - `peak`: the highest RSS seen over the run (the highest `VmRSS`, with its split);
//! - `end`: RSS after the last of several intervals;
//!
//! each as `RssAnon`/`RssFile`, the symbolization time per interval (mean and max, wall
//! time) and the CPU time of the collector thread over the run (naming is most of it).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Length of one child's workload.
const SECONDS: u64 = 10;

/// RSS figures in kB: (anon, file).
#[derive(Clone, Copy, Default, Debug)]
struct Rss {
    anon: u64,
    file: u64,
}

impl Rss {
    fn total(self) -> u64 {
        self.anon + self.file
    }

    fn read() -> Rss {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Rss {
            anon: field("RssAnon:"),
            file: field("RssFile:"),
        }
    }
}

/// One unit of mixed work: JSON round trip, gzip, protobuf encoding, maps, sorting.
fn work_unit(seed: u64) -> u64 {
    use std::collections::{BTreeMap, HashMap};
    let mut items = Vec::new();
    for i in 0..64u64 {
        let v = seed.wrapping_mul(6364136223846793005).wrapping_add(i);
        items.push(serde_json::json!({
            "id": v % 10_000,
            "name": format!("item-{}", v % 977),
            "tags": [v % 7, v % 11, v % 13],
            "price": (v % 10_000) as f64 / 100.0,
        }));
    }
    let text = serde_json::to_string(&items).unwrap_or_default();
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut by_name: HashMap<String, u64> = HashMap::new();
    let mut ordered: BTreeMap<u64, String> = BTreeMap::new();
    if let Some(array) = parsed.as_array() {
        for item in array {
            let name = item["name"].as_str().unwrap_or_default().to_string();
            let id = item["id"].as_u64().unwrap_or_default();
            *by_name.entry(name.clone()).or_default() += id;
            ordered.insert(id, name);
        }
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = encoder.write_all(text.as_bytes());
    let gz = encoder.finish().unwrap_or_default();
    let mut words: Vec<&str> = text.split(['"', ',', ':']).collect();
    words.sort_unstable();
    words.dedup();
    let mut proto = Vec::new();
    for (id, name) in ordered.iter().take(32) {
        prost::encoding::uint64::encode(1, id, &mut proto);
        prost::encoding::string::encode(2, name, &mut proto);
    }
    (gz.len() + words.len() + proto.len() + by_name.len()) as u64
}

/// The workload: a two-worker tokio runtime whose threads are sampled, running tasks of
/// mixed work until `deadline`.
fn workload(deadline: Instant) -> u64 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
        .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("runtime: {e}");
            std::process::exit(2);
        }
    };
    runtime.block_on(async move {
        let mut total = 0u64;
        let mut seed = 1u64;
        while Instant::now() < deadline {
            let tasks: Vec<_> = (0..16)
                .map(|t| {
                    seed = seed.wrapping_add(1);
                    let s = seed ^ t;
                    tokio::spawn(async move {
                        let mut acc = 0;
                        for i in 0..4 {
                            acc += work_unit(s.wrapping_add(i));
                            tokio::task::yield_now().await;
                        }
                        acc
                    })
                })
                .collect();
            for task in tasks {
                total = total.wrapping_add(task.await.unwrap_or(0));
            }
        }
        total
    })
}

/// A sink that only counts: no files, no network.
struct Count(Arc<AtomicU64>);

impl otel_profiling::collector::ProfileSink for Count {
    fn export(&mut self, _: &otel_profiling::collector::EncodedProfile) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// CPU time the collector's threads have used, in ms (`/proc/self/task/*/schedstat`): the
/// naming time above is wall time, which a busy machine inflates.
fn collector_cpu_ms() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut nanos = 0u64;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // "otel-profiling-collector" and "-encoder", cut to 15 bytes by the kernel.
        if !comm.starts_with("otel-profiling") {
            continue;
        }
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        nanos += schedstat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    nanos as f64 / 1e6
}

/// One measurement; prints `key=value` pairs on one line.
fn child(profiler_on: bool) {
    let exported = Arc::new(AtomicU64::new(0));
    let profiler = if profiler_on {
        match otel_profiling::Profiler::builder()
            .frequency_hz(100)
            .interval(Duration::from_secs(1))
            .local_files(false)
            .sink(Count(exported.clone()))
            .start()
        {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("profiler: {e}");
                std::process::exit(2);
            }
        }
    } else {
        None
    };
    // Readings every 20 ms: the last one before the first profile, and the peak.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let monitor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut before, mut peak) = (Rss::default(), Rss::default());
            while !stop.load(Ordering::Relaxed) {
                let now = Rss::read();
                if started.elapsed() < Duration::from_millis(800) {
                    before = now;
                }
                if now.total() > peak.total() {
                    peak = now;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (before, peak)
        })
    };
    std::hint::black_box(workload(Instant::now() + Duration::from_secs(SECONDS)));
    // One more interval after the work, so `end` is the steady state between intervals.
    std::thread::sleep(Duration::from_millis(1500));
    let end = Rss::read();
    let collector_ms = collector_cpu_ms();
    stop.store(true, Ordering::Relaxed);
    let (before, peak) = monitor.join().unwrap_or_default();
    let (intervals, mean_ms, max_ms) = match &profiler {
        Some(p) => {
            let s = p.stats();
            let n = exported.load(Ordering::Relaxed).max(1);
            (
                exported.load(Ordering::Relaxed),
                s.symbolize_nanos as f64 / n as f64 / 1e6,
                s.symbolize_nanos_max as f64 / 1e6,
            )
        }
        None => (0, 0.0, 0.0),
    };
    drop(profiler);
    println!(
        "before_anon={} before_file={} peak_anon={} peak_file={} end_anon={} end_file={} \
         intervals={intervals} symbolize_mean_ms={mean_ms:.1} symbolize_max_ms={max_ms:.1} \
         collector_cpu_ms={collector_ms:.1}",
        before.anon, before.file, peak.anon, peak.file, end.anon, end.file
    );
}

/// Runs `exe --child mode` and returns its `key=value` pairs.
fn run(exe: &Path, mode: &str) -> Option<Vec<(String, f64)>> {
    let out = Command::new(exe).args(["--child", mode]).output().ok()?;
    if !out.status.success() {
        eprintln!("{mode}: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(args.get(i + 1).is_some_and(|m| m == "profiler"));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("cannot find own executable: {e}");
            std::process::exit(1);
        }
    };
    let stripped = std::env::temp_dir().join(format!(
        "otel-profiling-symmem-{}-stripped",
        std::process::id()
    ));
    let strip_ok = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(&exe)
        .arg(&stripped)
        .status()
        .is_ok_and(|s| s.success());
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len()) / 1_000_000;
    println!(
        "binary: {} MB on disk ({}), {} MB without debug sections",
        size(&exe),
        exe.display(),
        size(&stripped)
    );
    println!(
        "kB: RSS anon+file; before = just before the first profile is named, \
         end = after {SECONDS} s of 1 s profiles"
    );
    let mut binaries = vec![("line tables", exe.as_path())];
    if strip_ok {
        binaries.push(("no debug info", stripped.as_path()));
    } else {
        eprintln!("objcopy --strip-debug failed: measuring the binary as built only");
    }
    for (label, binary) in binaries {
        let (Some(off), Some(on)) = (run(binary, "none"), run(binary, "profiler")) else {
            continue;
        };
        let get = |r: &[(String, f64)], k: &str| {
            r.iter().find(|(key, _)| key == k).map_or(0.0, |(_, v)| *v)
        };
        for (name, r) in [("no profiler", &off), ("profiler", &on)] {
            let rss = |phase: &str| {
                let anon = get(r, &format!("{phase}_anon"));
                let file = get(r, &format!("{phase}_file"));
                format!("{:>6.0} ({:>6.0} + {:>6.0})", anon + file, anon, file)
            };
            println!(
                "{label:>14} {name:>11}: before {}  peak {}  end {}",
                rss("before"),
                rss("peak"),
                rss("end")
            );
        }
        let added = |phase: &str| {
            let total = |r: &[(String, f64)]| {
                get(r, &format!("{phase}_anon")) + get(r, &format!("{phase}_file"))
            };
            (total(&on) - total(&off)) / 1024.0
        };
        println!(
            "{label:>14} added by the profiler: peak {:.1} MiB, end {:.1} MiB; \
             symbolization per interval: mean {:.1} ms, max {:.1} ms over {} intervals; \
             collector thread CPU {:.0} ms in all",
            added("peak"),
            added("end"),
            get(&on, "symbolize_mean_ms"),
            get(&on, "symbolize_max_ms"),
            get(&on, "intervals"),
            get(&on, "collector_cpu_ms")
        );
    }
    let _ = std::fs::remove_file(&stripped);
}
