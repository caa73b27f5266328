//! What the allocation profiler costs, measured side by side in one run:
//!
//! * `pair`: one 64-byte allocation and its free, through the system allocator and
//!   through a `ProfilingAllocator` wrapping it, called directly in alternating batches,
//!   with allocation sampling off (the wrapper's pass-through) and on at the default
//!   mean (512 KiB: the countdown, and one sample in about 8,000 pairs), and on with
//!   in-use tracking (the sampled blocks in arena cells; every free's address check is
//!   paid in all three): target ≤ 5 ns more than the system allocator;
//! * `json`: a JSON round trip (serde_json's `Value`: ~90 allocations of mixed sizes)
//!   through the system allocator and through the wrapper, sampling off and on at the
//!   default mean, and on with in-use tracking (this binary's global allocator switches
//!   between them at run time): target ≤ 2 % throughput lost against the system
//!   allocator;
//! * `sampled`: one allocation that is sampled (the mean set to 1 byte), 8, 16 and 48
//!   frames below the bench's `main`, timed one by one: p50, p90 and p99 (target p99 ≤
//!   2 µs); 16 frames down with in-use tracking on (a cell taken too); and 16 frames
//!   down on a thread that never registered (its stack copied before the walk);
//! * instructions per `pair` (valgrind's callgrind, when installed): a figure that does
//!   not move with the machine's load.
//!
//! Run: `cargo bench -p otel-profiling --bench allocations` (`ALLOC_BENCH_ROUNDS`,
//! default 300). Rounds alternate the set-ups and each ratio is taken within its round;
//! the median over rounds is printed with its quartiles.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use otel_profiling::allocations::DEFAULT_SAMPLE_BYTES;
use otel_profiling::ProfilingAllocator;

/// This binary's allocator: the system's or the wrapper, switched at run time, so that a
/// workload runs through either in one process (both sides pay the same branch).
struct Switch;

/// Whether [`Switch`] sends allocations through [`WRAPPED`].
static THROUGH_WRAPPER: AtomicBool = AtomicBool::new(true);

// SAFETY: every call goes to `System` or to the wrapper around `System`. The wrapper's
// blocks are `System`'s except the in-use arena's cells, which only sampled allocations
// made through the wrapper with tracking on get: each of those is freed or grown while
// the switch still points at the wrapper (the bench's own collections are allocated in
// full before any round), and the wrapper frees `System`'s blocks as `System` does.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if THROUGH_WRAPPER.load(Ordering::Relaxed) {
                WRAPPED.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if THROUGH_WRAPPER.load(Ordering::Relaxed) {
                WRAPPED.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if THROUGH_WRAPPER.load(Ordering::Relaxed) {
                WRAPPED.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if THROUGH_WRAPPER.load(Ordering::Relaxed) {
                WRAPPED.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[global_allocator]
static GLOBAL: Switch = Switch;

/// The wrapper, called directly beside `System` and through [`Switch`] (one hook and
/// thread-locals for both).
static WRAPPED: ProfilingAllocator = ProfilingAllocator::system();

const PAIRS_PER_BATCH: u32 = 20_000;
const JSON_PER_BATCH: u32 = 200;
const SETUP_VAR: &str = "ALLOC_BENCH_CALLGRIND";

/// `n` allocate+free pairs of 64 bytes through `alloc`.
#[inline(never)]
fn pairs<A: GlobalAlloc>(alloc: &A, n: u32) {
    let layout = Layout::from_size_align(64, 8).expect("layout");
    for _ in 0..n {
        // SAFETY: a valid layout; the block is freed with it at once.
        unsafe {
            let p = alloc.alloc(layout);
            black_box(p);
            if !p.is_null() {
                alloc.dealloc(p, layout);
            }
        }
    }
}

/// An order as a JSON document: nested objects, arrays and strings of mixed sizes.
fn order() -> serde_json::Value {
    let lines: Vec<serde_json::Value> = (0..12u64)
        .map(|i| {
            serde_json::json!({
                "sku": format!("SKU-{i:06}-blue-large"),
                "quantity": i,
                "price_cents": 1999 * i,
            })
        })
        .collect();
    serde_json::json!({
        "id": 42,
        "customer": "customer-with-a-longish-name@example.com",
        "lines": lines,
        "notes": "leave at the door, ring twice".repeat(4),
    })
}

#[inline(never)]
fn json_round_trips(order: &serde_json::Value, n: u32) {
    for _ in 0..n {
        let text = serde_json::to_string(order).expect("serialize");
        let back: serde_json::Value = serde_json::from_str(&text).expect("parse");
        black_box(back);
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn summary(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        quantile(&values, 0.25),
        quantile(&values, 0.5),
        quantile(&values, 0.75),
    )
}

fn time(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_nanos() as f64
}

/// Allocates at `depth` frames below the caller, timing each of `n` allocations.
#[inline(never)]
fn sampled_at_depth(depth: u32, n: usize, out: &mut Vec<f64>) {
    if depth > 0 {
        sampled_at_depth(black_box(depth - 1), n, out);
        return;
    }
    for _ in 0..n {
        let start = Instant::now();
        let v: Vec<u8> = Vec::with_capacity(black_box(64));
        let ns = start.elapsed().as_nanos() as f64;
        drop(black_box(v));
        out.push(ns);
    }
}

/// Sampled allocations timed one by one, `depth` frames below the caller: 40 times 32
/// (half a thread's buffer), each followed by a pause for the collector to drain them.
/// Returns the times, and the samples taken, dropped and truncated meanwhile.
fn sampled_runs(depth: u32) -> (Vec<f64>, u64, u64, u64) {
    let before = otel_profiling::allocations::stats();
    let mut sampled = Vec::new();
    for _ in 0..40 {
        sampled_at_depth(depth, 32, &mut sampled);
        std::thread::sleep(Duration::from_millis(150));
    }
    let after = otel_profiling::allocations::stats();
    (
        sampled,
        after.samples - before.samples,
        after.dropped - before.dropped,
        after.truncated - before.truncated,
    )
}

/// Instructions callgrind counted inside `pairs` for one set-up, per pair.
fn instructions(setup: &str) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out_file = std::env::temp_dir().join(format!(
        "otel-profiling-alloc-callgrind-{}-{setup}.out",
        std::process::id()
    ));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--toggle-collect=*allocations::pairs*")
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
    Ok(collected / f64::from(PAIRS_PER_BATCH))
}

/// Under callgrind: one set-up's pairs.
fn callgrind_run(setup: &str) {
    let dir = std::env::temp_dir().join(format!("otel-profiling-alloc-cg-{}", std::process::id()));
    let profiler = (setup != "system").then(|| {
        otel_profiling::Profiler::builder()
            .output_dir(&dir)
            .allocation_sample_bytes(if setup == "off" {
                0
            } else {
                DEFAULT_SAMPLE_BYTES
            })
            .allocation_inuse(setup == "inuse")
            .start()
            .expect("profiler")
    });
    if setup == "system" {
        pairs(&System, PAIRS_PER_BATCH);
    } else {
        pairs(&WRAPPED, PAIRS_PER_BATCH);
    }
    drop(profiler);
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    if let Ok(setup) = std::env::var(SETUP_VAR) {
        callgrind_run(&setup);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it too: only measure
    // when benchmarking.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds: usize = std::env::var("ALLOC_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(300)
        .max(1);
    let dir =
        std::env::temp_dir().join(format!("otel-profiling-alloc-bench-{}", std::process::id()));
    let profiler = otel_profiling::Profiler::builder()
        .output_dir(&dir)
        .allocation_sample_bytes(DEFAULT_SAMPLE_BYTES)
        .start()
        .expect("profiler");
    let order = order();
    let per_pair = f64::from(PAIRS_PER_BATCH);
    let per_json = f64::from(JSON_PER_BATCH);
    // Allocated in full now: no push below grows them (see `Switch`).
    let series = || Vec::with_capacity(rounds);
    let (mut off_extra, mut on_extra, mut inuse_extra) = (series(), series(), series());
    let mut system_ns = series();
    let (mut json_ratio, mut json_off_ratio, mut json_inuse_ratio) = (series(), series(), series());
    let mut json_ns = series();
    // Set-ups: 0 System, 1 the wrapper sampling off, 2 on, 3 on with in-use tracking.
    let set_up = |which: usize| {
        profiler
            .set_allocation_sample_bytes(if which >= 2 { DEFAULT_SAMPLE_BYTES } else { 0 })
            .expect("mean");
        profiler.set_allocation_inuse(which == 3).expect("in-use");
    };
    for round in 0..rounds {
        // Each round: the four set-ups, in an order rotated by the round.
        let mut ns = [0f64; 4];
        for k in 0..4 {
            let which = (k + round) % 4;
            set_up(which);
            ns[which] = match which {
                0 => time(|| pairs(&System, PAIRS_PER_BATCH)),
                _ => time(|| pairs(&WRAPPED, PAIRS_PER_BATCH)),
            } / per_pair;
        }
        system_ns.push(ns[0]);
        off_extra.push(ns[1] - ns[0]);
        on_extra.push(ns[2] - ns[0]);
        inuse_extra.push(ns[3] - ns[0]);
        // The JSON round trip through the four set-ups.
        let mut json = [0f64; 4];
        for k in 0..4 {
            let which = (k + round) % 4;
            THROUGH_WRAPPER.store(which > 0, Ordering::Relaxed);
            set_up(which);
            json[which] = time(|| json_round_trips(&order, JSON_PER_BATCH)) / per_json;
        }
        THROUGH_WRAPPER.store(true, Ordering::Relaxed);
        json_ns.push(json[0]);
        json_ratio.push(json[0] / json[2]);
        json_off_ratio.push(json[0] / json[1]);
        json_inuse_ratio.push(json[0] / json[3]);
    }
    profiler.set_allocation_inuse(false).expect("in-use");
    // Sampled allocations, one by one, 48 frames below here: 32 at a time (half a
    // thread's buffer), then a pause for the collector to drain it.
    profiler.set_allocation_sample_bytes(1).expect("mean");
    // A new mean takes effect when the thread's current countdown (drawn at 512 KiB)
    // runs out: one large allocation, untimed, ends it.
    drop(black_box(Vec::<u8>::with_capacity(64 << 20)));
    // At three depths below here (frames the walk has to go through to reach main).
    let mut sampled_by_depth: Vec<_> = [8u32, 16, 48]
        .into_iter()
        .map(|depth| {
            (
                format!("{depth} frames below the bench"),
                sampled_runs(depth),
            )
        })
        .collect();
    // With in-use tracking: a cell taken for each sampled block.
    profiler.set_allocation_inuse(true).expect("in-use");
    sampled_by_depth.push((
        "16 frames below the bench, in-use tracking on".into(),
        sampled_runs(16),
    ));
    profiler.set_allocation_inuse(false).expect("in-use");
    // On a thread that never registers: the shared buffer, the walk over a copy.
    let unregistered = std::thread::spawn(|| {
        drop(black_box(Vec::<u8>::with_capacity(64 << 20)));
        sampled_runs(16)
    })
    .join()
    .expect("unregistered thread");
    sampled_by_depth.push((
        "16 frames, a thread that never registered".into(),
        unregistered,
    ));
    profiler
        .set_allocation_sample_bytes(DEFAULT_SAMPLE_BYTES)
        .expect("mean");
    let stats = profiler.stats();
    drop(profiler);
    let _ = std::fs::remove_dir_all(&dir);

    let (_, system, _) = summary(system_ns);
    println!("allocations: {rounds} rounds, medians [quartiles]");
    println!("  pair (64 B alloc + free) through System: {system:.1} ns");
    let (q1, m, q3) = summary(off_extra);
    println!("  wrapper, sampling off:  +{m:.2} ns a pair [{q1:.2}, {q3:.2}]");
    let (q1, m, q3) = summary(on_extra);
    println!("  wrapper, sampling on (512 KiB mean): +{m:.2} ns a pair [{q1:.2}, {q3:.2}]");
    let (q1, m, q3) = summary(inuse_extra);
    println!("    and in-use tracking on: +{m:.2} ns a pair [{q1:.2}, {q3:.2}]");
    let (_, json, _) = summary(json_ns);
    let (q1, m, q3) = summary(json_off_ratio);
    println!(
        "  JSON round trip {json:.0} ns through System: throughput through the wrapper, \
         sampling off / System {m:.4} [{q1:.4}, {q3:.4}]"
    );
    let (q1, m, q3) = summary(json_ratio);
    println!("    sampling on (512 KiB mean) / System {m:.4} [{q1:.4}, {q3:.4}]");
    let (q1, m, q3) = summary(json_inuse_ratio);
    println!("    and in-use tracking on / System {m:.4} [{q1:.4}, {q3:.4}]");
    for (what, (all, taken, dropped, truncated)) in sampled_by_depth {
        // The first allocation after each pause runs on cold caches (the thread slept
        // 150 ms, other work ran): told apart, as a service's first allocation after idle.
        let (mut firsts, mut sampled): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
        for (i, ns) in all.into_iter().enumerate() {
            if i % 32 == 0 {
                firsts.push(ns);
            } else {
                sampled.push(ns);
            }
        }
        firsts.sort_by(f64::total_cmp);
        sampled.sort_by(f64::total_cmp);
        let (p50, p90, p99) = (
            quantile(&sampled, 0.5),
            quantile(&sampled, 0.9),
            quantile(&sampled, 0.99),
        );
        println!(
            "  sampled allocation, {what}: p50 {p50:.0} ns, p90 {p90:.0} ns, \
             p99 {p99:.0} ns ({} timed; the first after each pause: p50 {:.0} ns, max {:.0} ns; \
             {taken} sampled, the pauses' own included; dropped {dropped}, truncated {truncated})",
            sampled.len(),
            quantile(&firsts, 0.5),
            firsts.last().copied().unwrap_or(0.0),
        );
    }
    println!(
        "  over the run: dropped {} of {} samples (the timed rounds allocate faster than a \
         thread's buffer holds between drains)",
        stats.allocations.dropped, stats.allocations.samples
    );
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("  instructions: skipped (valgrind is not installed)");
        return;
    }
    let counts: Vec<(&str, Result<f64, String>)> = ["system", "off", "on", "inuse"]
        .into_iter()
        .map(|setup| (setup, instructions(setup)))
        .collect();
    for (setup, count) in &counts {
        match count {
            Ok(per) => println!("  instructions a pair, {setup:<6}: {per:.1}"),
            Err(err) => println!("  instructions a pair, {setup:<6}: failed: {err}"),
        }
    }
}
