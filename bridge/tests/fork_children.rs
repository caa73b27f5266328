//! Forked children of a profiled process: they must neither hang on a lock a parent
//! thread held at the fork, nor wait for (or detach) a parent thread that does not exist
//! in them. Each child is given 10 s and killed past that (a hang fails the test).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use otel_profiling::{CpuEvidenceProcessor, Profiler, ProfilingContext, SpanName};

fn local_profiler(dir: &std::path::Path) -> Profiler {
    Profiler::builder()
        .frequency_hz(250)
        .interval(Duration::from_millis(200))
        .output_dir(dir)
        .start()
        .expect("profiler")
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("otel-profiling-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The natural pattern in a child: replace the inherited profiler with a new one. The
/// inherited one's collector thread (and its watchdog and uploader) exist only in the
/// parent: dropping it in the child must not wait for them (it waited 5 s) nor detach
/// their `pthread_t`s (which may name the child's new threads: dropping the child's own
/// profiler then failed to join its collector, "Invalid argument").
#[test]
fn a_child_replacing_its_inherited_profiler_neither_waits_nor_fails() {
    let _turn = common::turn();
    let dir = temp_dir("fork-replace");
    let profiler = local_profiler(&dir);
    std::thread::sleep(Duration::from_millis(50));
    let code = common::run_child(move || {
        let started = Instant::now();
        // What `profiler = Profiler::builder()…start()` does: the new one starts, then
        // the inherited one is dropped.
        let new = local_profiler(&dir);
        drop(profiler);
        let profiler = new;
        let replaced = started.elapsed();
        let stopping = Instant::now();
        let finished = profiler.shutdown(Duration::from_secs(5));
        let stopped = stopping.elapsed();
        match (
            replaced < Duration::from_secs(1),
            finished,
            stopped < Duration::from_secs(2),
        ) {
            (true, true, true) => 0,
            (false, _, _) => 2, // waited for the parent's threads
            (_, false, _) => 3, // its own collector could not be joined
            _ => 4,
        }
    });
    assert_eq!(
        code,
        Some(0),
        "2: dropping the inherited profiler waited; 3: the child's own profiler failed to \
         stop; 4: stopping it was slow; None: the child hung"
    );
    let _ = std::fs::remove_dir_all(temp_dir("fork-replace"));
}

/// While parent threads start and end roots through the evidence processor (its table's
/// shard locks), intern span names (the interner's lock) and follow the roots (the
/// layer-side lookups), children fork and do the same: none may find a lock held by a
/// parent thread. Before the fork handlers held these locks, 76 of 200 children hung.
#[test]
fn children_forked_while_parent_threads_end_roots_never_hang() {
    let _turn = common::turn();
    let dir = temp_dir("fork-locks");
    let profiler = local_profiler(&dir);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CpuEvidenceProcessor::new(common::Discard))
        .build();
    let stop = Arc::new(AtomicBool::new(false));
    let ended = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (provider, stop, ended) = (provider.clone(), stop.clone(), ended.clone());
            std::thread::spawn(move || {
                let tracer = provider.tracer("fork-test");
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let span = tracer.start("root");
                    let cx = opentelemetry::Context::current_with_span(span);
                    ProfilingContext::new(cx.clone(), "root").in_scope(|| {
                        // A new name now and then: the interner's slow path.
                        SpanName::intern(&format!("worker-{w}-{}", i % 64));
                    });
                    cx.span().end();
                    ended.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    while ended.load(Ordering::Relaxed) < 100 {
        std::thread::yield_now();
    }
    let mut hung = 0;
    let mut failed = 0;
    for round in 0..200u32 {
        let provider = provider.clone();
        match common::run_child(move || {
            let tracer = provider.tracer("fork-child");
            for i in 0..4 {
                let mut span = tracer.start("child root");
                SpanName::intern(&format!("child-{round}-{i}"));
                span.end();
            }
            // The child's copy of the provider is left alone (its processors' state is
            // the parent's); the child ends here.
            std::mem::forget(provider);
            0
        }) {
            Some(0) => {}
            Some(_) => failed += 1,
            None => hung += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    drop(profiler);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (hung, failed),
        (0, 0),
        "of 200 children: {hung} hung, {failed} failed"
    );
}

/// The profile uploader's thread is the parent's too: a child dropping an inherited
/// exporter (one the application kept, or built before forking) must not wait the
/// shutdown timeout for a thread it does not have, nor touch the queue that thread may
/// have held locked at the fork. (Given to a profiler, an exporter lives in the
/// collector thread, which a child's copy of the profiler leaves alone.)
#[cfg(feature = "pyroscope")]
#[test]
fn a_child_drops_an_inherited_uploader_without_waiting() {
    use otel_profiling::export::pyroscope::{PyroscopeConfig, PyroscopeExporter};
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let address = format!("http://{}", silent.local_addr().expect("address"));
    let exporter = PyroscopeExporter::new(
        PyroscopeConfig::new(address, "fork-test").with_shutdown_timeout(Duration::from_secs(3)),
    )
    .expect("exporter");
    let code = common::run_child(move || {
        let started = Instant::now();
        drop(exporter);
        if started.elapsed() < Duration::from_secs(1) {
            0
        } else {
            2
        }
    });
    assert_eq!(
        code,
        Some(0),
        "2: the child waited for the parent's uploader"
    );
    drop(silent);
}
