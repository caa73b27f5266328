//! Demo: a small tokio service whose requests interleave on two workers, printing every
//! span context switch the profiler would see (which local root each thread is labelled
//! with, at each enter and exit).
//!
//! Run: `cargo run -p otel-profiling-examples --bin demo`

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};
use otel_profiling::{current_local_root, ProfileIdSpanProcessor, ProfilingLayer};
use tracing::Instrument;
use tracing_core::span::Id;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

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
    let name = ctx.span(id).map(|s| s.name()).unwrap_or("?");
    let thread = std::thread::current();
    let labels = match current_local_root() {
        Some(root) => format!(
            "span_id={} span_name={}",
            root.span_id().map_or("-".to_string(), |s| s.to_string()),
            root.name().map_or("-".into(), |n| n.resolve()),
        ),
        None => "(no span)".to_string(),
    };
    let thread = format!("{}{:?}", thread.name().unwrap_or("?"), thread.id());
    println!("{thread:<24} {what} {name:<11} -> samples labelled {labels}");
}

/// Prints each finished span that carries `pyroscope.profile.id` (the local roots).
#[derive(Debug)]
struct PrintMarkedSpans;

impl SpanProcessor for PrintMarkedSpans {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}
    fn on_end(&self, span: SpanData) {
        if let Some(id) = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == otel_profiling::PROFILE_ID_ATTRIBUTE)
        {
            println!(
                "{:<24} ended local root {:<12} span_id={} pyroscope.profile.id={}",
                "",
                span.name,
                span.span_context.span_id(),
                id.value
            );
        }
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

#[inline(never)]
fn render_report(rows: u64) -> u64 {
    (0..rows * 20_000).fold(0u64, |acc, x| acc.wrapping_mul(31).wrapping_add(x))
}

async fn report(n: u64) -> u64 {
    let mut total = 0;
    for _ in 0..2 {
        total += render_report(n);
        tokio::task::yield_now().await;
    }
    total
}

async fn slow_dependency() {
    tokio::time::sleep(Duration::from_millis(20))
        .instrument(tracing::info_span!("db.query"))
        .await;
}

fn main() {
    let provider = SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_span_processor(PrintMarkedSpans)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("demo")))
        .with(ProfilingLayer::default())
        .with(SwitchPrinter);
    if let Err(err) = tracing::subscriber::set_global_default(subscriber) {
        eprintln!("demo: could not install the tracing subscriber: {err}");
        std::process::exit(1);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tokio-worker")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("demo: could not start tokio: {err}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async {
        let mut handles = Vec::new();
        for i in 0..2u64 {
            handles.push(tokio::spawn(
                report(5 + i).instrument(tracing::info_span!("GET /report")),
            ));
            handles.push(tokio::spawn(
                async {
                    slow_dependency().await;
                    0
                }
                .instrument(tracing::info_span!("GET /orders")),
            ));
        }
        for handle in handles {
            let _ = handle.await;
        }
    });
}
