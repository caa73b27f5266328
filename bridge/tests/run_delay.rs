//! Waiting for a CPU is not "blocked in poll": on a 2-worker runtime, a root burning CPU
//! beside busy loops on every core records its run delay (`profiling.wall.runqueue_ns`),
//! and what is left as blocked (active − CPU − run delay) stays small; a root in
//! `thread::sleep` is not runnable while it sleeps, so it stays blocked. (Own test binary:
//! the busy loops would slow every other test.)

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt as _, Tracer as _, TracerProvider as _};
use otel_profiling::{
    ProfilingContext, ProfilingFutureExt as _, CPU_TIME_ATTRIBUTE, WALL_ACTIVE_ATTRIBUTE,
    WALL_RUNQUEUE_ATTRIBUTE,
};

#[test]
fn a_root_beside_busy_loops_waits_for_a_cpu_and_a_sleeping_one_is_blocked() {
    let (profiler, dir, provider, exporter) = common::profiled_provider("run-delay");
    let tracer = provider.tracer("run-delay");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    // Busy loops on every core, outside any root.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..cores * 2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let root = |name: &'static str| {
        let span = tracer.start(name);
        opentelemetry::Context::current_with_span(span)
    };
    let burning = root("burning");
    runtime.block_on(async {
        let burn = tokio::spawn(
            async { common::burn(Duration::from_millis(300)) }
                .with_profiling_context(ProfilingContext::new(burning.clone(), "burning")),
        );
        burn.await.expect("burn");
    });
    burning.span().end();
    stop.store(true, Ordering::Relaxed);
    for hog in hogs {
        hog.join().expect("hog");
    }
    let sleeping = root("sleeping");
    runtime.block_on(async {
        let nap = tokio::spawn(
            async { std::thread::sleep(Duration::from_millis(300)) }
                .with_profiling_context(ProfilingContext::new(sleeping.clone(), "sleeping")),
        );
        nap.await.expect("nap");
    });
    sleeping.span().end();
    drop(runtime);
    drop(profiler);
    let _ = std::fs::remove_dir_all(&dir);
    let spans = exporter.get_finished_spans().expect("spans");
    let find = |name: &str| spans.iter().find(|s| s.name == name).expect(name);
    let figures = |name: &str| {
        let span = find(name);
        let wall = span
            .end_time
            .duration_since(span.start_time)
            .expect("ended after it started");
        let cpu = common::ns_attribute(span, CPU_TIME_ATTRIBUTE);
        let active = common::ns_attribute(span, WALL_ACTIVE_ATTRIBUTE);
        let runqueue = common::ns_attribute(span, WALL_RUNQUEUE_ATTRIBUTE);
        let blocked = active.saturating_sub(cpu).saturating_sub(runqueue);
        eprintln!("{name}: wall {wall:?} cpu {cpu:?} active {active:?} runqueue {runqueue:?} blocked {blocked:?}");
        (wall, cpu, runqueue, blocked)
    };
    let (wall, cpu, runqueue, blocked) = figures("burning");
    // Measured, not counted from signals: beside the busy loops the kernel's CPU timer
    // signals lag by up to ~170 ms of CPU, so counting them read 180 ms of these 300; the
    // root's stretches read the thread's CPU clock where they end.
    assert!(
        cpu >= Duration::from_millis(240) && cpu <= Duration::from_millis(360),
        "CPU {cpu:?} of a root that burned 300 ms"
    );
    assert!(
        runqueue > Duration::ZERO,
        "run delay recorded beside the busy loops"
    );
    // CPU and run delay are read where each stretch ends (a preempted stretch is always
    // long enough to be read): 10 % of the wall, and 5 ms for the runtime's own polls.
    assert!(
        blocked <= wall / 10 + Duration::from_millis(5),
        "blocked {blocked:?} of {wall:?}: waiting for a CPU read as blocked"
    );
    let (wall, _, _, blocked) = figures("sleeping");
    assert!(
        blocked >= wall / 2,
        "a root in thread::sleep stays blocked: {blocked:?} of {wall:?}"
    );
}
