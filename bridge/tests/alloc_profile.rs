//! Allocation profiles by span (issue 43), with the crate's allocator as this test
//! binary's global allocator: known allocations under known roots, on two threads, land
//! in the `_alloc.pb.gz` profiles under those roots' `span_id`, within the sampling's
//! error; a root that allocates nothing gets no sample; a thread that never registered
//! is counted, not profiled.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId};
use otel_profiling::{LocalRoot, ProfilingAllocator, SpanContextGuard, SpanName};

#[global_allocator]
static ALLOC: ProfilingAllocator = ProfilingAllocator::system();

/// The mean bytes between samples here: small enough for tight estimates in a short test.
const MEAN: u64 = 16 * 1024;

fn root(span: u64, name: &str) -> LocalRoot {
    LocalRoot::new(
        SpanId::from(span),
        TraceId::from(u128::from(span) << 64 | 1),
        Some(SpanName::intern(name)),
    )
}

/// `count` allocations of `size` bytes, each freed at once; a 20 ms pause every
/// `pace_every`, so that the thread's buffer (64 samples, drained every 100 ms) never
/// fills: at most about 6 samples a pause.
fn allocate(count: usize, size: usize, pace_every: usize) {
    for i in 0..count {
        black_box(vec![1u8; size]);
        if pace_every > 0 && i % pace_every == pace_every - 1 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Per `span_id` label ("" for none): (alloc_objects, alloc_space) over every profile.
fn totals(dir: &std::path::Path) -> HashMap<String, (i64, i64)> {
    let mut by_span = HashMap::new();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with("_alloc.pb.gz") {
            continue;
        }
        files += 1;
        let profile = otel_profiling_pprof::decode(&std::fs::read(&path).expect("read"))
            .expect("valid pprof");
        let s = |i: i64| profile.string_table[i as usize].clone();
        let types: Vec<(String, String)> = profile
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("alloc_objects".into(), "count".into()),
                ("alloc_space".into(), "bytes".into())
            ]
        );
        let period = profile.period_type.as_ref().expect("period type");
        assert_eq!(
            (s(period.r#type), s(period.unit)),
            ("space".into(), "bytes".into())
        );
        assert_eq!(profile.period, MEAN as i64);
        let function_names = |location_id: u64| -> Vec<String> {
            let location = profile.location.iter().find(|l| l.id == location_id);
            location
                .map(|l| {
                    l.line
                        .iter()
                        .filter_map(|line| {
                            profile.function.iter().find(|f| f.id == line.function_id)
                        })
                        .map(|f| s(f.name))
                        .collect()
                })
                .unwrap_or_default()
        };
        for sample in &profile.sample {
            // The hook's own frames are dropped: the innermost is the allocator's call
            // (inlined names included), and the test's `allocate` is on the stack.
            let leaf = function_names(sample.location_id[0]);
            let stack: Vec<String> = sample
                .location_id
                .iter()
                .flat_map(|&id| function_names(id))
                .collect();
            assert!(
                !stack.iter().any(|f| f.contains("allocations::hook::")),
                "the hook's frames are left out: {stack:?}"
            );
            // With inlined names (debug info), the innermost is the allocator's frame.
            if stack.iter().any(|f| f.contains("ProfilingAllocator")) {
                assert!(
                    leaf.first().is_some_and(|f| f.starts_with(
                        "<otel_profiling::allocations::allocator::ProfilingAllocator"
                    )),
                    "the innermost frame is the allocator's: {leaf:?}"
                );
            }
            if sample.label.iter().any(|l| s(l.key) == "span_id") {
                assert!(
                    stack.iter().any(|f| f.ends_with("alloc_profile::allocate")),
                    "the allocating function is on the stack: {stack:?}"
                );
            }
            let span = sample
                .label
                .iter()
                .find(|l| s(l.key) == "span_id")
                .map(|l| s(l.str))
                .unwrap_or_default();
            assert!(!sample.location_id.is_empty(), "every sample has a stack");
            let total = by_span.entry(span).or_insert((0, 0));
            total.0 += sample.value[0];
            total.1 += sample.value[1];
        }
    }
    assert!(files >= 1, "no allocation profile in {}", dir.display());
    by_span
}

#[test]
fn allocations_are_estimated_per_root_and_labelled_when_made() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-alloc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let profiler = otel_profiling::Profiler::builder()
        .output_dir(&dir)
        .allocation_sample_bytes(MEAN)
        .interval(Duration::from_secs(1))
        .start()
        .expect("profiler");

    let small = root(0x0a, "GET /small");
    let large = root(0x0b, "GET /large");
    let idle = root(0x0c, "GET /idle");

    // Root "small" on two threads: 2 × 10,000 allocations of 1,000 bytes (20 MB). The
    // profiler registered this thread; the other registers itself (as the tracing layer
    // or the runtime hooks would).
    let other = {
        let small = small.clone();
        std::thread::spawn(move || {
            otel_profiling::sampler::register_current_thread().expect("register");
            let _in = SpanContextGuard::enter(Some(&small));
            allocate(10_000, 1_000, 100);
        })
    };
    {
        let _in = SpanContextGuard::enter(Some(&small));
        allocate(10_000, 1_000, 100);
    }
    other.join().expect("thread");
    // Root "large": 300 allocations of 100,000 bytes (30 MB), almost every one sampled.
    {
        let _in = SpanContextGuard::enter(Some(&large));
        allocate(300, 100_000, 5);
    }
    // Root "idle" allocates nothing while it runs: no sample may carry it.
    {
        let _in = SpanContextGuard::enter(Some(&idle));
        std::thread::sleep(Duration::from_millis(50));
    }
    // Outside any root: 2,000 allocations of 2,000 bytes (4 MB), unlabelled.
    allocate(2_000, 2_000, 50);
    // A thread that never registers: counted, not profiled.
    let before = otel_profiling::allocations::stats().unregistered;
    std::thread::spawn(|| allocate(2_000, 4_096, 0))
        .join()
        .expect("thread");

    assert!(profiler.flush(Duration::from_secs(10)), "flushed");
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shut down");
    let alloc = stats.allocations;
    eprintln!("{alloc:?}; in profiles {}", stats.alloc_samples_in_profiles);
    assert!(alloc.installed, "{alloc:?}");
    assert_eq!(alloc.sample_bytes, MEAN);
    assert_eq!(alloc.dropped, 0, "paced: no buffer filled: {alloc:?}");
    assert!(alloc.unregistered > before, "{alloc:?}");
    assert_eq!(alloc.low_stack, 0, "{alloc:?}");

    let by_span = totals(&dir);
    eprintln!("{by_span:?}");
    let span = |id: u64| format!("{id:016x}");
    let (objects, bytes) = by_span[&span(0x0a)];
    // About 1,200 samples: one standard error is about 3 %; the bounds are 4 of them,
    // plus the few other allocations the root's code makes.
    let err = |got: i64, want: f64| (got as f64 / want - 1.0).abs();
    assert!(err(bytes, 20e6) < 0.12, "small: {bytes} bytes for 20 MB");
    assert!(
        err(objects, 20_000.0) < 0.12,
        "small: {objects} objects for 20,000"
    );
    let (objects, bytes) = by_span[&span(0x0b)];
    assert!(err(bytes, 30e6) < 0.05, "large: {bytes} bytes for 30 MB");
    assert!(
        err(objects, 300.0) < 0.05,
        "large: {objects} objects for 300"
    );
    assert!(
        !by_span.contains_key(&span(0x0c)),
        "idle root labelled: {by_span:?}"
    );
    let (_, bytes) = by_span[""];
    assert!(
        err(bytes, 4e6) < 0.3,
        "unlabelled: {bytes} bytes for 4 MB and more"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
