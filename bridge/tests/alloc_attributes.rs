//! Per-root allocation estimates (issue 43): `profiling.alloc.bytes` and
//! `profiling.alloc.count` on local roots whose tasks allocate known amounts while they
//! hop between the two workers of a tokio runtime; a root that fills its thread's
//! allocation buffer still gets every sample's weight; a root that allocates nothing
//! reads (about) nothing. Own test binary: the crate's allocator is its global allocator.

mod common;

use std::hint::black_box;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt as _, Tracer as _, TracerProvider as _};
use otel_profiling::{
    ProfilingAllocator, ProfilingContext, ProfilingFutureExt as _, ALLOC_BYTES_ATTRIBUTE,
    ALLOC_COUNT_ATTRIBUTE,
};

#[global_allocator]
static ALLOC: ProfilingAllocator = ProfilingAllocator::system();

/// The mean bytes between samples: small, for tight estimates in a short test.
const MEAN: u64 = 16 * 1024;

/// `count` allocations of `size` bytes, each freed at once, yielding to the runtime
/// every `yield_every` (the task may resume on the other worker).
async fn allocate(count: usize, size: usize, yield_every: usize) {
    for i in 0..count {
        black_box(vec![1u8; size]);
        if i % yield_every == yield_every - 1 {
            tokio::task::yield_now().await;
        }
    }
}

fn int_attribute(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> i64 {
    match span.attributes.iter().find(|kv| kv.key.as_str() == key) {
        Some(kv) => match kv.value {
            opentelemetry::Value::I64(v) => v,
            ref other => panic!("{}: {key} is {other:?}", span.name),
        },
        None => panic!("{} has no {key}: {:?}", span.name, span.attributes),
    }
}

#[test]
fn roots_carry_unbiased_allocation_estimates_across_threads() {
    let dir =
        std::env::temp_dir().join(format!("otel-profiling-alloc-attrs-{}", std::process::id()));
    let profiler = otel_profiling::Profiler::builder()
        .output_dir(&dir)
        .allocation_sample_bytes(MEAN)
        .start()
        .expect("profiler");
    let (provider, exporter) = common::evidence_provider();
    let tracer = provider.tracer("alloc-attributes");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
        .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
        .enable_all()
        .build()
        .expect("runtime");
    let root = |name: &'static str| opentelemetry::Context::current_with_span(tracer.start(name));

    // (name, allocations, size, yield every): small ones, large ones, a burst that fills
    // its thread's 64-sample buffer long before a drain, and nothing.
    let work: [(&'static str, usize, usize, usize); 4] = [
        ("small", 20_000, 500, 50),
        ("large", 400, 50_000, 4),
        ("burst", 10_000, 4_000, 10_000),
        ("idle", 0, 0, 1),
    ];
    let before = otel_profiling::allocations::stats();
    let contexts: Vec<_> = work.iter().map(|w| (w, root(w.0))).collect();
    runtime.block_on(async {
        let tasks: Vec<_> = contexts
            .iter()
            .map(|(&(name, count, size, every), cx)| {
                tokio::spawn(
                    async move {
                        allocate(count, size, every).await;
                        if count == 0 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    .with_profiling_context(ProfilingContext::new(cx.clone(), name)),
                )
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
    });
    for (_, cx) in &contexts {
        cx.span().end();
    }
    let after = otel_profiling::allocations::stats();
    // A registered thread whose thread-local destructor allocates at its exit, when the
    // profiler's own thread-locals (its registration) may already be gone: sampled or
    // counted, never a panic in the allocator (which would abort the process).
    struct AllocatesAtExit;
    impl Drop for AllocatesAtExit {
        fn drop(&mut self) {
            for _ in 0..256 {
                black_box(vec![3u8; 4_096]);
            }
        }
    }
    thread_local! {
        static AT_EXIT: std::cell::RefCell<Option<AllocatesAtExit>> =
            const { std::cell::RefCell::new(None) };
    }
    let at_exit_before = otel_profiling::allocations::stats().samples;
    std::thread::spawn(|| {
        otel_profiling::sampler::register_current_thread().expect("register");
        AT_EXIT.with(|slot| *slot.borrow_mut() = Some(AllocatesAtExit));
    })
    .join()
    .expect("a thread that allocates in its thread-local destructor exits cleanly");
    assert!(
        otel_profiling::allocations::stats().samples > at_exit_before,
        "the destructor's 1 MB was sampled"
    );
    // A new mean takes effect within a MiB of allocations, however long a countdown the
    // old one drew: 1 TiB, then 16 KiB for 8 MB in 4,000-byte allocations. The first
    // MiB still counts down the old countdown's chunk; of the 1,738 allocations after it
    // each is sampled with p = 1 - exp(-4000/16384) = 0.217: 376 ± 17 samples. Before
    // countdowns were taken a MiB at a time, none: the 1 TiB countdown ran on.
    profiler.set_allocation_sample_bytes(1 << 40).expect("mean");
    for _ in 0..64 {
        black_box(vec![0u8; 1 << 20]);
    }
    profiler.set_allocation_sample_bytes(MEAN).expect("mean");
    let before_change = otel_profiling::allocations::stats().samples;
    for _ in 0..2_000 {
        black_box(vec![1u8; 4_000]);
    }
    let sampled = otel_profiling::allocations::stats().samples - before_change;
    assert!(
        (300..=460).contains(&sampled),
        "{sampled} samples of 8 MB at a 16 KiB mean after a 1 TiB one"
    );
    drop(runtime);
    drop(profiler);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{after:?}");
    assert!(
        after.dropped > before.dropped,
        "the burst filled its buffer: {after:?}"
    );

    let spans = exporter.get_finished_spans().expect("spans");
    let err = |got: i64, want: f64| (got as f64 / want - 1.0).abs();
    for &(name, count, size, _) in &work {
        let span = spans.iter().find(|s| s.name == name).expect(name);
        let bytes = int_attribute(span, ALLOC_BYTES_ATTRIBUTE);
        let objects = int_attribute(span, ALLOC_COUNT_ATTRIBUTE);
        eprintln!("{name}: {bytes} bytes, {objects} allocations (truth {count} × {size})");
        if count == 0 {
            // Its task's own polls allocate next to nothing: at most a few samples.
            assert!(bytes < 4 * MEAN as i64, "idle: {bytes} bytes");
            continue;
        }
        let truth = (count * size) as f64;
        // Standard errors: small ~4 % (600 samples), burst ~2.5 % (2,400), large ~1 %
        // (each allocation sampled with p = 0.95); the bounds are over 3 of them, plus
        // the few allocations the runtime makes under the root.
        assert!(
            err(bytes, truth) < 0.13,
            "{name}: {bytes} bytes for {truth}"
        );
        assert!(
            err(objects, count as f64) < 0.13,
            "{name}: {objects} allocations for {count}"
        );
        if name == "large" {
            // Each sample stands for 1.05 allocations: counted whole, 400 read 377.
            assert!(
                err(objects, count as f64) < 0.05,
                "large: {objects} allocations for {count}"
            );
        }
    }
}
