//! What following spans costs, measured in one run against the alternatives:
//!
//! * `enter_exit`: one enter+exit of an existing span, `tracing-opentelemetry` alone vs
//!   with `ProfilingLayer` beside it (target: at most +25 %);
//! * `new_root_span`: create, enter, exit and close a root span, same two set-ups;
//! * `span_lifecycle`: a root span's whole life as a tokio task sees it — create, 4 polls
//!   (enter+exit), close — with `tracing-opentelemetry` alone vs with everything this
//!   crate adds in a service (the layer, the profile-id and CPU-evidence processors, the
//!   sampler running at 100 Hz with the thread registered, so active-time clock reads and
//!   counter claims happen); both providers end in the same no-op processor (target: at
//!   most +15 %);
//! * `context_switch`: this crate's context switch (set + restore) vs the `pyroscope`
//!   crate's `tag_wrapper` add+remove with its pprof backend running at 100 Hz
//!   (target: at least 100x cheaper); and the same switch with the OTEP 4947 thread
//!   context off and on (`otel-profiling+thread_ctx`), with one root name and with two
//!   names entered in turn (`/two-names`, where each switch copies the name's bytes).
//!
//! Run: `cargo bench -p otel-profiling --bench span_switch`. The ratios are printed at
//! the end from criterion's own estimates.

mod common;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::Criterion;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};
use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::{
    CpuEvidenceProcessor, LocalRoot, ProfileIdScope, ProfileIdSpanProcessor, ProfilingLayer,
    SpanContextGuard, SpanName,
};
use tracing_subscriber::layer::SubscriberExt;

fn provider() -> SdkTracerProvider {
    // No exporter: the cost measured is the span hooks', not an exporter's.
    SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .build()
}

fn otel_only(provider: &SdkTracerProvider) -> tracing::Dispatch {
    tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"))),
    )
}

fn otel_and_profiling(provider: &SdkTracerProvider) -> tracing::Dispatch {
    tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("bench")))
            .with(ProfilingLayer::default()),
    )
}

fn bench_enter_exit(c: &mut Criterion) {
    let provider = provider();
    let mut group = c.benchmark_group("enter_exit");
    for (name, dispatch) in [
        (
            "registry",
            tracing::Dispatch::new(tracing_subscriber::registry()),
        ),
        (
            "registry+profiling",
            tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::default())),
        ),
        ("otel", otel_only(&provider)),
        ("otel+profiling", otel_and_profiling(&provider)),
    ] {
        tracing::dispatcher::with_default(&dispatch, || {
            let root = tracing::info_span!("GET /report");
            let _root = root.enter();
            let child = tracing::info_span!("serialize");
            group.bench_function(name, |b| {
                b.iter(|| {
                    let entered = black_box(&child).enter();
                    drop(black_box(entered));
                })
            });
        });
    }
    group.finish();

    let mut group = c.benchmark_group("new_root_span");
    for (name, dispatch) in [
        ("otel", otel_only(&provider)),
        ("otel+profiling", otel_and_profiling(&provider)),
    ] {
        tracing::dispatcher::with_default(&dispatch, || {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let span = tracing::info_span!("GET /report");
                    drop(black_box(span.enter()));
                })
            });
        });
    }
    group.finish();
}

/// Receives ended spans and drops them: the exporter's cost is not what is measured.
#[derive(Debug)]
struct Discard;

impl SpanProcessor for Discard {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}
    fn on_end(&self, span: SpanData) {
        black_box(span);
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

fn bench_span_lifecycle(c: &mut Criterion) {
    let plain = SdkTracerProvider::builder()
        .with_span_processor(Discard)
        .build();
    // What `Telemetry` installs: one processor sets the profile id and adds the evidence.
    let bridged = SdkTracerProvider::builder()
        .with_span_processor(
            CpuEvidenceProcessor::new(Discard).with_profile_id(ProfileIdScope::LocalRoots),
        )
        .build();
    let mut group = c.benchmark_group("span_lifecycle");
    let lifecycle = |group: &mut criterion::BenchmarkGroup<'_, _>, name: &str, dispatch| {
        tracing::dispatcher::with_default(&dispatch, || {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let span = tracing::info_span!("GET /report");
                    for _ in 0..4 {
                        drop(black_box(span.enter()));
                    }
                    drop(black_box(span));
                })
            });
        });
    };
    lifecycle(&mut group, "otel", otel_only(&plain));
    // Where the added cost goes: the layer alone, then with the processors (no sampler:
    // no CPU counters are claimed), then everything.
    lifecycle(&mut group, "otel+layer", otel_and_profiling(&plain));
    lifecycle(
        &mut group,
        "otel+layer+processors",
        otel_and_profiling(&bridged),
    );
    let sampler = match Sampler::start(SamplerConfig::default().with_frequency_hz(100)) {
        Ok(sampler) => sampler,
        Err(err) => {
            eprintln!("sampler did not start, skipping span_lifecycle/otel+bridge: {err}");
            return;
        }
    };
    if let Err(err) = sampler.register_current_thread() {
        eprintln!("thread not registered, skipping span_lifecycle/otel+bridge: {err}");
        return;
    }
    lifecycle(&mut group, "otel+bridge", otel_and_profiling(&bridged));
    group.finish();
    drop(sampler);
}

fn bench_context_switch(c: &mut Criterion) {
    let mut group = c.benchmark_group("context_switch");
    let root = LocalRoot::new(
        SpanId::from(0x0123_4567_89ab_cdef),
        TraceId::from(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef),
        Some(SpanName::intern("GET /report")),
    );
    // Two roots with different names, entered in turn: each switch also changes the
    // name, which the thread context copies into its record (the one-name case does not).
    let other = LocalRoot::new(
        SpanId::from(0x0123_4567_89ab_cdee),
        TraceId::from(0x0123_4567_89ab_cdef_0123_4567_89ab_cdee),
        Some(SpanName::intern("POST /orders/{id}/items")),
    );
    let two_names = |b: &mut criterion::Bencher| {
        b.iter(|| {
            drop(black_box(SpanContextGuard::enter(Some(black_box(&root)))));
            drop(black_box(SpanContextGuard::enter(Some(black_box(&other)))));
        })
    };
    // The OTEP 4947 thread context off (never enabled: a relaxed load and a branch per
    // transition), then on (the record written at every transition).
    group.bench_function("otel-profiling", |b| {
        b.iter(|| drop(black_box(SpanContextGuard::enter(Some(black_box(&root))))))
    });
    group.bench_function("otel-profiling/two-names", two_names);
    otel_profiling::thread_ctx::enable_with_resource(&[("service.name".into(), "bench".into())])
        .expect("thread context");
    group.bench_function("otel-profiling+thread_ctx", |b| {
        b.iter(|| drop(black_box(SpanContextGuard::enter(Some(black_box(&root))))))
    });
    group.bench_function("otel-profiling+thread_ctx/two-names", two_names);
    thread_ctx_ab(root, other);
    otel_profiling::thread_ctx::disable();

    // The pyroscope crate's own tagging, with its pprof backend sampling at 100 Hz. Its
    // server is an unused local port: uploads fail off the measured thread.
    match common::start_pyroscope_agent(100) {
        Ok(agent) => {
            let (add, remove) = agent.tag_wrapper();
            let span_id = "0123456789abcdef".to_string();
            group.bench_function("pyroscope-tag_wrapper", |b| {
                b.iter(|| {
                    let _ = add("span_id".to_string(), span_id.clone());
                    let _ = remove("span_id".to_string(), span_id.clone());
                })
            });
            if let Ok(ready) = agent.stop() {
                ready.shutdown();
            }
        }
        Err(err) => eprintln!("pyroscope agent did not start, skipping its benchmark: {err}"),
    }
    group.finish();
}

/// The thread context's cost measured interleaved, so that a machine shared with other
/// work loads both sides alike: rounds of (writer off, writer on) batches of switches,
/// the minimum of each side and the median of the per-round differences. "Off" here is
/// `thread_ctx::disable()` after it was on (a relaxed load, a branch, and the caller's
/// record marked invalid: a TLS load and store more than never enabled).
fn thread_ctx_ab(root: LocalRoot, other: LocalRoot) {
    const BATCH: u32 = 200_000;
    const ROUNDS: usize = 31;
    let batch = |roots: &[LocalRoot]| {
        let start = std::time::Instant::now();
        for _ in 0..BATCH {
            for r in roots {
                drop(black_box(SpanContextGuard::enter(Some(black_box(r)))));
            }
        }
        start.elapsed().as_secs_f64() * 1e9 / f64::from(BATCH) / roots.len() as f64
    };
    println!("\n=== thread context, interleaved off/on (ns per set+restore) ===");
    for (label, roots) in [
        ("one root name", vec![root.clone()]),
        ("two names in turn", vec![root, other]),
    ] {
        let (mut off, mut on, mut diff) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            otel_profiling::thread_ctx::disable();
            let a = batch(&roots);
            otel_profiling::thread_ctx::enable_with_resource(&[(
                "service.name".into(),
                "bench".into(),
            )])
            .expect("thread context");
            let b = batch(&roots);
            off.push(a);
            on.push(b);
            diff.push(b - a);
        }
        let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        diff.sort_by(f64::total_cmp);
        println!(
            "{label:<20} off min {:>6.1}  on min {:>6.1}  on-off median {:>5.1} (min {:.1}, max {:.1})",
            min(&off),
            min(&on),
            diff[ROUNDS / 2],
            diff[0],
            diff[ROUNDS - 1]
        );
    }
}

/// Criterion's point estimate of the mean, in nanoseconds, from its saved results.
fn mean_ns(group: &str, id: &str) -> Option<f64> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = dir
        .join("criterion")
        .join(group)
        // Criterion's directory for an id with `/` in it.
        .join(id.replace('/', "_"))
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

fn print_ratios() {
    let row = |label: &str, group: &str, base: &str, other: &str| match (
        mean_ns(group, base),
        mean_ns(group, other),
    ) {
        (Some(b), Some(o)) => println!("{label:<58} {b:>10.1} ns {o:>12.1} ns   {:>8.2}x", o / b),
        _ => println!("{label:<58} (no estimate: benchmark filtered out or skipped)"),
    };
    println!("\n=== ratios from this run (criterion mean estimates) ===");
    println!(
        "{:<58} {:>13} {:>15} {:>11}",
        "comparison", "baseline", "other", "other/base"
    );
    row(
        "enter+exit: otel+profiling vs otel alone",
        "enter_exit",
        "otel",
        "otel+profiling",
    );
    row(
        "enter+exit: registry+profiling vs registry alone",
        "enter_exit",
        "registry",
        "registry+profiling",
    );
    if let (Some(r), Some(rp), Some(o)) = (
        mean_ns("enter_exit", "registry"),
        mean_ns("enter_exit", "registry+profiling"),
        mean_ns("enter_exit", "otel"),
    ) {
        println!(
            "profiling layer's own enter+exit: {:.1} ns = {:.1} % of the OpenTelemetry layer's own {:.1} ns (target <= 25 %)",
            rp - r,
            100.0 * (rp - r) / (o - r),
            o - r
        );
    }
    row(
        "new root span: otel+profiling vs otel alone",
        "new_root_span",
        "otel",
        "otel+profiling",
    );
    for (label, other) in [
        (
            "root span lifecycle (create, 4 polls, close): layer vs otel",
            "otel+layer",
        ),
        (
            "root span lifecycle: layer + processors vs otel",
            "otel+layer+processors",
        ),
        (
            "root span lifecycle: bridge (+ sampler running) vs otel",
            "otel+bridge",
        ),
    ] {
        row(label, "span_lifecycle", "otel", other);
    }
    for (label, base, other) in [
        (
            "switch: thread context on vs off (same root name)",
            "otel-profiling",
            "otel-profiling+thread_ctx",
        ),
        (
            "switch x2: thread context on vs off (names alternate)",
            "otel-profiling/two-names",
            "otel-profiling+thread_ctx/two-names",
        ),
    ] {
        row(label, "context_switch", base, other);
        if let (Some(b), Some(o)) = (
            mean_ns("context_switch", base),
            mean_ns("context_switch", other),
        ) {
            // A set + restore is two root transitions.
            let transitions = if base.ends_with("two-names") {
                4.0
            } else {
                2.0
            };
            println!(
                "  thread context adds {:.1} ns per set+restore, {:.2} ns per root transition",
                (o - b) * 2.0 / transitions,
                (o - b) / transitions
            );
        }
    }
    row(
        "switch: pyroscope tag_wrapper add+remove vs otel-profiling",
        "context_switch",
        "otel-profiling",
        "pyroscope-tag_wrapper",
    );
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    bench_enter_exit(&mut c);
    bench_span_lifecycle(&mut c);
    // Last: the pyroscope agent installs a SIGPROF handler that would disturb the others.
    bench_context_switch(&mut c);
    c.final_summary();
    print_ratios();
}
