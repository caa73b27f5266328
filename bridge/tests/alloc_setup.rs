//! Allocations by span through the one-call setup and a `tracing` span (issue 43): the
//! crate's allocator as the global one, `Telemetry::allocation_sample_bytes`, and the
//! span in the local span file carrying `profiling.alloc.bytes` close to what it
//! allocated, with `_alloc.pb.gz` profiles labelled with its span id. Own test binary:
//! the allocator is its global allocator, and `Telemetry` is per process.

mod common;

use std::hint::black_box;
use std::time::Duration;

use otel_profiling::{ProfilingAllocator, Telemetry, ALLOC_BYTES_ATTRIBUTE};
use tracing_subscriber::layer::SubscriberExt as _;

#[global_allocator]
static ALLOC: ProfilingAllocator = ProfilingAllocator::system();

const MEAN: u64 = 32 * 1024;

/// 8 MB in 2,000 allocations of 4,000 bytes, paced so the thread's buffer (64 samples,
/// drained every 100 ms) never fills: about 25 samples between two drains.
fn allocate_8mb() {
    for i in 0..2_000 {
        black_box(vec![7u8; 4_000]);
        if i % 20 == 19 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn a_tracing_root_carries_its_allocations_in_the_span_and_the_profile() {
    let dir =
        std::env::temp_dir().join(format!("otel-profiling-alloc-setup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let telemetry = Telemetry::builder()
        .service_name("alloc-setup")
        .output_dir(&dir)
        .allocation_sample_bytes(MEAN)
        .upload_interval(Duration::from_millis(500))
        .quiet(true)
        .build()
        .expect("local-only setup");
    let spans_file = telemetry
        .spans_file()
        .expect("spans go to a file")
        .to_path_buf();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(telemetry.layer()));
    tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("GET /alloc").in_scope(allocate_8mb);
    });
    let stats = telemetry.stats();
    drop(dispatch);
    drop(telemetry); // last profile written, spans flushed
    let allocations = stats.profiler.allocations;
    assert_eq!(allocations.sample_bytes, MEAN, "{allocations:?}");
    assert_eq!(allocations.dropped, 0, "paced: {allocations:?}");

    let spans = std::fs::read_to_string(&spans_file).expect("spans file");
    let found: Vec<(String, i64)> = common::spans_of_file(&spans)
        .iter()
        .filter(|span| span["name"] == "GET /alloc")
        .map(|span| {
            let bytes = span["attributes"]
                .as_array()
                .expect("attributes")
                .iter()
                .find(|kv| kv["key"] == ALLOC_BYTES_ATTRIBUTE)
                .and_then(|kv| kv["value"]["intValue"].as_str())
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("no {ALLOC_BYTES_ATTRIBUTE}: {span}"));
            (span["spanId"].as_str().expect("span id").to_string(), bytes)
        })
        .collect();
    let [(span_id, bytes)] = found.as_slice() else {
        panic!("expected one GET /alloc span, got {found:?}");
    };
    // About 245 samples: one standard error is 6.4 %; 4 of them, plus what the span's
    // own bookkeeping allocates.
    let err = (*bytes as f64 / 8e6 - 1.0).abs();
    assert!(err < 0.26, "{bytes} bytes for 8 MB");

    let mut labelled = 0i64;
    for entry in std::fs::read_dir(&dir).expect("output dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with("_alloc.pb.gz") {
            continue;
        }
        let profile =
            otel_profiling_pprof::decode(&std::fs::read(&path).expect("read")).expect("pprof");
        let s = |i: i64| profile.string_table[i as usize].as_str();
        labelled += profile
            .sample
            .iter()
            .filter(|sample| {
                sample
                    .label
                    .iter()
                    .any(|l| s(l.key) == "span_id" && s(l.str) == span_id)
            })
            .map(|sample| sample.value[1])
            .sum::<i64>();
    }
    // The profile and the attribute weigh the same samples.
    let apart = (labelled as f64 / *bytes as f64 - 1.0).abs();
    assert!(
        apart < 0.01,
        "profile {labelled} bytes, attribute {bytes} bytes"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
