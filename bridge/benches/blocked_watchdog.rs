//! What the blocked-in-poll watchdog costs: its own CPU time per tick and per second with
//! N registered threads (10, 100, 1000), in three states:
//!
//! * `outside`: parked outside any span (every tick reads each thread's span record, a
//!   few loads, no system call);
//! * `in root, blocked`: each inside its own root, blocked in a system call (the worst
//!   case: every thread is a candidate; up to `max_threads_per_tick` per tick get a CPU
//!   clock read, two `/proc/self/task/<tid>/syscall` reads, a stack copy and an unwind);
//! * the same with the cap raised to N (every blocked thread looked at every tick), to
//!   show the per-look cost the cap bounds.
//!
//! The figure is the watchdog thread's own CPU clock, summed over its ticks (the
//! `cpu_ns` counter), divided by ticks and by wall time. The default tick is 5 ms
//! (threshold 10 ms). Looks are drained every 100 ms, as the collector does.
//!
//! Run: `cargo bench -p otel-profiling --bench blocked_watchdog`

use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceId};
use otel_profiling::sampler::watchdog::{self, Watchdog, WatchdogConfig};
use otel_profiling::sampler::{self, Sampler, SamplerConfig};
use otel_profiling::{LocalRoot, SpanContextGuard};

const RUN: Duration = Duration::from_secs(2);

/// Parks `n` registered threads, inside a root each when `in_root`, until `release`.
fn park(
    n: usize,
    in_root: bool,
    gate: &Arc<(Mutex<bool>, Condvar)>,
) -> Vec<std::thread::JoinHandle<()>> {
    let ready = Arc::new(Barrier::new(n + 1));
    let handles = (0..n)
        .map(|i| {
            let (ready, gate) = (ready.clone(), gate.clone());
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    sampler::register_current_thread().expect("register");
                    let root = LocalRoot::new(SpanId::from(i as u64 + 1), TraceId::from(7), None);
                    let _guard = in_root.then(|| SpanContextGuard::enter(Some(&root)));
                    ready.wait();
                    // Blocked in futex(2) until released.
                    let (lock, cv) = &*gate;
                    let mut open = lock.lock().expect("gate");
                    while !*open {
                        open = cv.wait(open).expect("gate");
                    }
                })
                .expect("spawn")
        })
        .collect();
    ready.wait();
    handles
}

fn measure(n: usize, in_root: bool, cap: usize) -> (f64, f64, u64, u64) {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let threads = park(n, in_root, &gate);
    let before = watchdog::stats();
    let dog = Watchdog::start(WatchdogConfig::default().with_max_threads_per_tick(cap))
        .expect("watchdog")
        .expect("no other watchdog");
    let start = Instant::now();
    while start.elapsed() < RUN {
        std::thread::sleep(Duration::from_millis(100));
        watchdog::drain_blocked(|_| {});
    }
    drop(dog);
    let wall = start.elapsed();
    watchdog::drain_blocked(|_| {});
    let after = watchdog::stats();
    *gate.0.lock().expect("gate") = true;
    gate.1.notify_all();
    for t in threads {
        t.join().expect("thread");
    }
    let ticks = (after.ticks - before.ticks).max(1);
    let cpu = after.cpu_ns - before.cpu_ns;
    let per_tick_us = cpu as f64 / ticks as f64 / 1e3;
    let share = cpu as f64 / wall.as_nanos() as f64 * 100.0;
    (
        per_tick_us,
        share,
        after.samples - before.samples,
        after.skipped - before.skipped,
    )
}

fn main() {
    let _sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    println!(
        "{:>7}  {:<26} {:>6}  {:>12}  {:>10}  {:>9}  {:>9}",
        "threads", "state", "cap", "CPU/tick", "CPU share", "looks/s", "skipped/s"
    );
    for n in [10, 100, 1000] {
        for (state, in_root, cap) in [
            ("outside any root", false, 16),
            ("in root, blocked", true, 16),
            ("in root, blocked, no cap", true, n),
        ] {
            let (per_tick, share, looks, skipped) = measure(n, in_root, cap);
            let secs = RUN.as_secs_f64();
            println!(
                "{n:>7}  {state:<26} {cap:>6}  {per_tick:>9.1} µs  {share:>8.2} %  {:>9.0}  {:>9.0}",
                looks as f64 / secs,
                skipped as f64 / secs
            );
        }
    }
}
