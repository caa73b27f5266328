//! Demo: a small tokio service with a CPU-heavy and an I/O-bound endpoint, profiled with
//! the embedded default (no server): CPU samples labelled with the running span go to
//! gzipped pprof files, finished spans to OTLP JSON lines, both in a local directory.
//!
//! It prints the first span context switches the sampler sees, then each request's wall
//! time next to the CPU time its samples stand for, and where the files are.
//!
//! Run: `cargo run -p otel-profiling-examples --bin demo`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor, SpanData, SpanProcessor};
use otel_profiling::local_sink::LocalSpanExporter;
use otel_profiling::{
    current_local_root, sampler, CpuEvidenceProcessor, ProfileIdSpanProcessor, Profiler,
    ProfilingLayer, CPU_TIME_ATTRIBUTE, PROFILE_ID_ATTRIBUTE,
};
use tracing::Instrument;
use tracing_core::span::Id;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// How many context switches to print before going quiet.
const SWITCHES_SHOWN: usize = 16;
static SWITCHES: AtomicUsize = AtomicUsize::new(0);

/// Prints what a CPU sample taken right now on this thread would be labelled with.
/// Registered after `ProfilingLayer`, so it sees the value that layer just set.
struct SwitchPrinter;

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SwitchPrinter {
    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        print_switch("enter", id, &ctx);
    }
    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        print_switch("exit ", id, &ctx);
    }
}

fn print_switch<S: tracing::Subscriber + for<'a> LookupSpan<'a>>(
    what: &str,
    id: &Id,
    ctx: &Context<'_, S>,
) {
    let n = SWITCHES.fetch_add(1, Ordering::Relaxed);
    if n >= SWITCHES_SHOWN {
        if n == SWITCHES_SHOWN {
            println!("  … (further switches not shown)");
        }
        return;
    }
    let name = ctx.span(id).map(|s| s.name()).unwrap_or("?");
    let labels = match current_local_root() {
        Some(root) => format!(
            "span_id={} span_name={}",
            root.span_id().map_or("-".to_string(), |s| s.to_string()),
            root.name().map_or("-".into(), |n| n.resolve()),
        ),
        None => "(no span)".to_string(),
    };
    let thread = std::thread::current();
    let thread = format!("{}{:?}", thread.name().unwrap_or("?"), thread.id());
    println!("  {thread:<24} {what} {name:<11} -> samples labelled {labels}");
}

/// Prints each finished local root span: wall time against the CPU its samples stand for.
#[derive(Debug)]
struct PrintRoots;

impl SpanProcessor for PrintRoots {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}
    fn on_end(&self, span: SpanData) {
        let attr = |key: &str| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == key)
                .map(|kv| kv.value.clone())
        };
        let Some(profile_id) = attr(PROFILE_ID_ATTRIBUTE) else {
            return;
        };
        static HEADER: std::sync::Once = std::sync::Once::new();
        HEADER.call_once(|| {
            println!("\nfinished requests (CPU from the samples taken under each span):")
        });
        let wall = span
            .end_time
            .duration_since(span.start_time)
            .unwrap_or_default();
        let cpu_ns = match attr(CPU_TIME_ATTRIBUTE) {
            Some(opentelemetry::Value::I64(ns)) => ns,
            _ => 0,
        };
        let cpu = Duration::from_nanos(cpu_ns.max(0) as u64);
        let ratio = cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9);
        let verdict = if ratio > 0.5 {
            "CPU-bound"
        } else if ratio < 0.1 {
            "waiting"
        } else {
            "mixed"
        };
        println!(
            "  {:<12} pyroscope.profile.id={profile_id}  wall {:>6.1} ms  CPU {:>6.1} ms  -> {verdict}",
            span.name,
            wall.as_secs_f64() * 1e3,
            cpu.as_secs_f64() * 1e3,
        );
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The report's response serialization: pure CPU.
#[inline(never)]
fn serialize_report(rows: u64) -> u64 {
    let mut x = rows;
    for i in 0..rows * 400_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i) ^ (x >> 29);
    }
    x
}

async fn report(rows: u64) -> u64 {
    let mut total = 0;
    for _ in 0..4 {
        total ^= serialize_report(rows);
        tokio::task::yield_now().await;
    }
    total
}

async fn orders() -> u64 {
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(50))
            .instrument(tracing::info_span!("db.query"))
            .await;
    }
    0
}

fn fail(what: &str, err: impl std::fmt::Display) -> ! {
    eprintln!("demo: {what}: {err}");
    std::process::exit(1);
}

fn main() {
    let profiler = Profiler::builder()
        .interval(Duration::from_secs(2))
        .start()
        .unwrap_or_else(|e| fail("could not start the profiler", e));
    let dir = profiler
        .output_dir()
        .map(|d| d.to_path_buf())
        .unwrap_or_default();
    let spans =
        LocalSpanExporter::new(&dir).unwrap_or_else(|e| fail("could not create the span file", e));
    let spans_path = spans.path().to_path_buf();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_span_processor(CpuEvidenceProcessor::new(PrintRoots))
        .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(spans)))
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("demo")))
        .with(ProfilingLayer::default())
        .with(SwitchPrinter);
    if let Err(err) = tracing::subscriber::set_global_default(subscriber) {
        fail("could not install the tracing subscriber", err);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tokio-worker")
        .enable_all()
        .on_thread_start(sampler::tokio_on_thread_start())
        .on_thread_stop(sampler::tokio_on_thread_stop())
        .build()
        .unwrap_or_else(|e| fail("could not start tokio", e));

    println!("span context switches as the sampler sees them (first {SWITCHES_SHOWN}):");
    runtime.block_on(async {
        let mut handles = Vec::new();
        for i in 0..3u64 {
            handles.push(tokio::spawn(
                report(8 + i).instrument(tracing::info_span!("GET /report")),
            ));
            handles.push(tokio::spawn(
                orders().instrument(tracing::info_span!("GET /orders")),
            ));
        }
        for handle in handles {
            let _ = handle.await;
        }
    });
    drop(runtime);
    let stats = profiler.stats();
    profiler.shutdown(Duration::from_secs(5));
    let _ = provider.shutdown();

    println!(
        "\nsamples taken {}, dropped {}; files in {}:",
        stats.sampler.taken,
        stats.sampler.dropped,
        dir.display()
    );
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for file in files.iter().rev().take(6).rev() {
        println!("  {}", file.display());
    }
    println!("spans of this run: {}", spans_path.display());
    println!("read a profile with: go tool pprof -traces <file>_cpu.pb.gz");
}
