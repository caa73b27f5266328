//! "Benchmarking serialization can test it": the two report serializers on the same rows,
//! measured in one run, with the ratio printed at the end.
//!
//! Run: `cargo bench -p otel-profiling-examples --bench serializer`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use otel_profiling_examples::report::{build_rows, render, Serializer};

fn main() {
    let rows = build_rows(5_000);
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    let mut group = c.benchmark_group("report_serializer");
    for (name, serializer) in [("v1", Serializer::V1), ("paged", Serializer::Paged)] {
        group.bench_function(name, |b| {
            b.iter(|| black_box(render(serializer, black_box(&rows))))
        });
    }
    group.finish();
    c.final_summary();

    // The ratio, measured once more side by side (criterion keeps its estimates to itself).
    let time = |s: Serializer| {
        let start = Instant::now();
        for _ in 0..5 {
            black_box(render(s, &rows));
        }
        start.elapsed() / 5
    };
    let (v1, paged) = (time(Serializer::V1), time(Serializer::Paged));
    println!(
        "\nper report of {} rows: v1 {:.2} ms, paged {:.2} ms -> paged/v1 = {:.1}x",
        rows.len(),
        v1.as_secs_f64() * 1e3,
        paged.as_secs_f64() * 1e3,
        paged.as_secs_f64() / v1.as_secs_f64()
    );
}
