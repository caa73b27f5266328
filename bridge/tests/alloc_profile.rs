//! Allocation profiles by span (issue 43), with the crate's allocator as this test
//! binary's global allocator: known allocations under known roots, on two threads, land
//! in the `_alloc.pb.gz` profiles under those roots' `span_id`, within the sampling's
//! error; a root that allocates nothing gets no sample; a thread that never registered
//! is profiled too (its samples through the buffer such threads share, its stack walked
//! over a copy), unlabelled.

mod common;

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

use common::{function_names, span_label, test_root as root};
use otel_profiling::{ProfilingAllocator, SpanContextGuard};

#[global_allocator]
static ALLOC: ProfilingAllocator = ProfilingAllocator::system();

/// The key of the totals of the samples whose stack was not walked, in [`totals`].
const NOT_WALKED: &str = "not walked";

/// The key of the totals of the samples with `allocate_near_the_stack_end` on their
/// stack, in [`totals`].
const NEAR_THE_END: &str = "near the stack's end";

/// The key of the unregistered thread's totals in [`totals`].
const UNREGISTERED: &str = "unregistered thread";

/// The mean bytes between samples here: small enough for tight estimates in a short test.
const MEAN: u64 = 16 * 1024;

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

/// What the thread that never registers allocates: 2,000 × 4,096 bytes (8.2 MB), 20 ms
/// pauses keeping the shared buffer (128 samples, drained every 100 ms) from filling.
/// Its own loop (not a call of `allocate`, which a release build may make a tail call,
/// leaving this frame off the stack).
#[inline(never)]
fn allocate_unregistered() {
    for i in 0..2_000 {
        black_box(vec![1u8; 4_096]);
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What a thread named as the OpenTelemetry SDK's batch threads are allocates (4 MB):
/// telemetry's allocations, never profiled.
#[inline(never)]
fn allocate_as_telemetry() {
    for i in 0..1_000 {
        black_box(vec![1u8; 4_096]);
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The lowest address of the calling thread's stack (`pthread_getattr_np`: test code,
/// free to allocate).
fn stack_low_end() -> u64 {
    // SAFETY: plain FFI on the calling thread, with out-parameters.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let (mut addr, mut size) = (std::ptr::null_mut(), 0);
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        addr as u64
    }
}

/// Recurses until less than 6 KiB of the thread's stack is left (under the walk's
/// budget, 8 KiB in release builds and 16 KiB in debug ones), then allocates 256 KiB
/// there, on a thread that never registered: on x86_64 the walk runs on a stack of its
/// own and the samples are walked whole; elsewhere the hook must see too little room,
/// keep the samples' pc and not fault.
#[inline(never)]
fn allocate_near_the_stack_end(low: u64) {
    let frame = [0u8; 512];
    let sp = black_box(&frame) as *const _ as u64;
    if sp.saturating_sub(low) > 6 * 1024 {
        allocate_near_the_stack_end(black_box(low));
        black_box(&frame);
        return;
    }
    for _ in 0..64 {
        black_box(vec![1u8; 4_096]);
    }
}

/// Per `span_id` label ("" for none): (alloc_objects, alloc_space) over every profile;
/// under the key `UNREGISTERED`, the totals of the samples with `allocate_unregistered`
/// on their stack.
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
        let function_names = |id: u64| function_names(&profile, id);
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
            if stack
                .iter()
                .any(|f| f.ends_with("alloc_profile::allocate_near_the_stack_end"))
            {
                let total = by_span.entry(NEAR_THE_END.into()).or_insert((0, 0));
                total.0 += sample.value[0];
                total.1 += sample.value[1];
            }
            if stack
                .iter()
                .any(|f| f == otel_profiling::collector::ALLOCATION_NOT_WALKED_FRAME)
            {
                assert_eq!(stack.len(), 1, "{stack:?}");
                let total = by_span.entry(NOT_WALKED.into()).or_insert((0, 0));
                total.0 += sample.value[0];
                total.1 += sample.value[1];
            }
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
            let span = span_label(&profile, sample);
            assert!(!sample.location_id.is_empty(), "every sample has a stack");
            assert!(
                !stack
                    .iter()
                    .any(|f| f.ends_with("alloc_profile::allocate_as_telemetry")),
                "the SDK's threads are left out: {stack:?}"
            );
            if stack
                .iter()
                .any(|f| f.ends_with("alloc_profile::allocate_unregistered"))
            {
                assert!(span.is_empty(), "no span on that thread: {span}");
                let total = by_span.entry(UNREGISTERED.into()).or_insert((0, 0));
                total.0 += sample.value[0];
                total.1 += sample.value[1];
            }
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
    // A thread that never registers: profiled all the same, unlabelled.
    let before = otel_profiling::allocations::stats().unregistered;
    std::thread::spawn(allocate_unregistered)
        .join()
        .expect("thread");
    // Near the end of a thread's stack: no room for the walk there.
    let low_before = otel_profiling::allocations::stats().low_stack;
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| allocate_near_the_stack_end(stack_low_end()))
        .expect("spawn")
        .join()
        .expect("a thread allocating near its stack's end");
    let low_stack = otel_profiling::allocations::stats().low_stack - low_before;
    let walks_elsewhere = cfg!(target_arch = "x86_64");
    if walks_elsewhere {
        assert_eq!(low_stack, 0, "the walk ran on its own stack");
    } else {
        assert!(
            low_stack >= 4,
            "~16 samples with too little room: {low_stack}"
        );
    }
    let telemetry_before = otel_profiling::allocations::stats();
    std::thread::Builder::new()
        .name("OpenTelemetry.Traces.BatchProcessor".into())
        .spawn(allocate_as_telemetry)
        .expect("spawn")
        .join()
        .expect("thread");
    let telemetry_after = otel_profiling::allocations::stats();
    assert_eq!(
        telemetry_after.unregistered, telemetry_before.unregistered,
        "the SDK's thread's samples are not counted as the service's"
    );

    assert!(profiler.flush(Duration::from_secs(10)), "flushed");
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shut down");
    let alloc = stats.allocations;
    eprintln!("{alloc:?}; in profiles {}", stats.alloc_samples_in_profiles);
    assert!(alloc.installed, "{alloc:?}");
    assert_eq!(alloc.sample_bytes, MEAN);
    assert_eq!(alloc.dropped, 0, "paced: no buffer filled: {alloc:?}");
    assert!(alloc.unregistered > before, "{alloc:?}");
    assert_eq!(
        alloc.low_stack, low_stack,
        "only near the stack's end: {alloc:?}"
    );

    let by_span = totals(&dir);
    eprintln!("{by_span:?}");
    if walks_elsewhere {
        // Walked whole from 6 KiB above the stack's end: 64 allocations, ~16 samples.
        let (objects, _) = by_span[NEAR_THE_END];
        assert!(
            (20..=160).contains(&objects),
            "{objects} allocations for 64"
        );
        assert!(!by_span.contains_key(NOT_WALKED), "{by_span:?}");
    } else {
        // In the profile under the one frame saying so: 4 KiB allocations at a 16 KiB
        // mean stand for 1 / (1 − e^(−1/4)) = 4.52 allocations a sample.
        let (objects, _) = by_span[NOT_WALKED];
        let want = low_stack as f64 / (1.0 - (-0.25f64).exp());
        assert!(
            (objects as f64 - want).abs() <= 1.0,
            "{objects} allocations not walked for {low_stack} samples"
        );
    }
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
    // About 500 samples: one standard error is about 4.5 %.
    let (objects, bytes) = by_span[UNREGISTERED];
    assert!(
        err(bytes, 8.192e6) < 0.2,
        "unregistered thread: {bytes} bytes for 8.2 MB"
    );
    assert!(
        err(objects, 2_000.0) < 0.2,
        "unregistered thread: {objects} objects for 2,000"
    );
    let (_, bytes) = by_span[""];
    assert!(
        err(bytes, 12.2e6) < 0.3,
        "unlabelled: {bytes} bytes for 12.2 MB and more"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
