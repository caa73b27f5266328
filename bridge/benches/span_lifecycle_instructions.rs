//! Instructions per root span lifecycle (create, 4 polls, close), counted by valgrind's
//! callgrind: the same set-ups as `span_switch`'s `span_lifecycle` group, in a figure that
//! does not move with the machine's load (criterion's nanoseconds on the project's shared
//! 2-core VM vary by ±30 % between runs; instruction counts repeat exactly).
//!
//! Run: `cargo bench -p otel-profiling --bench span_lifecycle_instructions` (needs
//! `valgrind`; prints that it skipped otherwise). The bench runs itself under callgrind
//! once per set-up, counting only inside `lifecycles`, and prints each count per
//! lifecycle and its ratio to `tracing-opentelemetry` alone. Instructions are not time
//! (a cache miss or an atomic costs more than an add), so `span_switch` stays the
//! measure in nanoseconds; this one says what changed when that one is noisy.

use std::hint::black_box;
use std::process::Command;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, InMemorySpanExporter, SdkTracerProvider, SpanData, SpanProcessor,
};
use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::{CpuEvidenceProcessor, ProfileIdScope, ProfilingLayer};
use tracing_subscriber::layer::SubscriberExt;

/// Lifecycles counted per set-up (after as many uncounted ones to warm caches up).
const LIFECYCLES: u32 = 20_000;
const SETUP_VAR: &str = "SPAN_LIFECYCLE_SETUP";

/// (name, what it is) of each set-up, the baseline first.
const SETUPS: &[(&str, &str)] = &[
    ("otel", "tracing-opentelemetry alone (no-op processor)"),
    (
        "floor",
        "+ the least any span-labelling bridge pays (see `FloorLayer`)",
    ),
    (
        "api-floor",
        "+ only the public calls any bridge needs (see `ApiFloorLayer`)",
    ),
    ("layer", "+ ProfilingLayer"),
    ("processor", "+ CpuEvidenceProcessor with the profile id"),
    ("bridge", "+ sampler running (counters, active time)"),
    (
        "bridge-threadctx",
        "+ the OTEP 4947 thread context published",
    ),
    (
        "otel-batch",
        "tracing-opentelemetry alone, SDK batch processor",
    ),
    ("bridge-batch", "everything, SDK batch processor"),
];

/// The exporting end of the pipeline: takes each span and drops it. `Discard(true)` is
/// also the floor's processor (see `FloorLayer`): one constant attribute on local roots.
#[derive(Debug)]
struct Discard(bool);

impl SpanProcessor for Discard {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        use opentelemetry::trace::{Span as _, TraceContextExt as _};
        // Nothing at all when not the floor: the baseline must stay the baseline.
        if !self.0 {
            return;
        }
        let parent = cx.span().span_context().clone();
        if !parent.is_valid() || parent.is_remote() {
            span.set_attribute(opentelemetry::KeyValue::new(
                "pyroscope.profile.id",
                "0123456789abcdef",
            ));
        }
    }
    fn on_end(&self, span: SpanData) {
        black_box(span);
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The floor: what any bridge that labels samples by span must at least do beside
/// `tracing-opentelemetry`, and nothing of what this crate does — on each enter, find the
/// span in the registry and read one value of its own from the span's extensions (the
/// label; here a marker put there when the span was made); and on each local root, one
/// attribute (`pyroscope.profile.id`, here a constant of the same length, not even the
/// id's hex). No record write, no scope stack, no clock, no counters, no evidence.
#[derive(Default)]
struct FloorLayer;

struct FloorMarker(u64);

impl<S> tracing_subscriber::Layer<S> for FloorLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(FloorMarker(id.into_u64()));
        }
    }

    fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            black_box(span.extensions().get::<FloorMarker>().map(|m| m.0));
        }
    }
}

/// The other floor: the calls to the public APIs of `tracing-subscriber`,
/// `tracing-opentelemetry` and the SDK that a bridge meeting issue 11 and 12 cannot avoid,
/// and no per-poll work at all: being a layer (every callback of the span's lifecycle
/// dispatched to it, each doing nothing), learning each span's OpenTelemetry ids once
/// (`get_otel_context`, the only public way; here on creation), and one constant
/// attribute on local roots (`Discard(true)`). No label lookup, record write, clock,
/// counters, evidence or thread context: what is left of the budget above this is what
/// all of those may cost together.
#[derive(Default)]
struct ApiFloorLayer {
    dispatch: std::sync::OnceLock<tracing::dispatcher::WeakDispatch>,
}

impl<S> tracing_subscriber::Layer<S> for ApiFloorLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        use opentelemetry::trace::TraceContextExt as _;
        if let Some(dispatch) = self.dispatch.get().and_then(|d| d.upgrade()) {
            if let Some(cx) = tracing_opentelemetry::get_otel_context(id, &dispatch) {
                black_box(cx.span().span_context().span_id());
            }
        }
    }

    fn on_enter(&self, id: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(id);
    }

    fn on_exit(&self, id: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(id);
    }

    fn on_close(&self, id: tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(id);
    }
}

/// What callgrind counts: `n` lifecycles of a root span, as a tokio task's span lives.
#[inline(never)]
fn lifecycles(n: u32) {
    for _ in 0..n {
        let span = tracing::info_span!("GET /report");
        for _ in 0..4 {
            drop(black_box(span.enter()));
        }
        drop(black_box(span));
    }
}

/// Runs one set-up's lifecycles (inside callgrind).
fn run(setup: &str) {
    let batch = setup.ends_with("-batch");
    let end = |provider: opentelemetry_sdk::trace::TracerProviderBuilder, bridged: bool| {
        match (batch, bridged) {
            (false, false) => provider.with_span_processor(Discard(false)),
            (false, true) => provider.with_span_processor(
                CpuEvidenceProcessor::new(Discard(false))
                    .with_profile_id(ProfileIdScope::LocalRoots),
            ),
            (true, false) => provider.with_span_processor(
                BatchSpanProcessor::builder(InMemorySpanExporter::default()).build(),
            ),
            (true, true) => provider.with_span_processor(
                CpuEvidenceProcessor::new(
                    BatchSpanProcessor::builder(InMemorySpanExporter::default()).build(),
                )
                .with_profile_id(ProfileIdScope::LocalRoots),
            ),
        }
        .build()
    };
    let bridged = !matches!(
        setup,
        "otel" | "layer" | "otel-batch" | "floor" | "api-floor"
    );
    let provider = if setup == "floor" || setup == "api-floor" {
        SdkTracerProvider::builder()
            .with_span_processor(Discard(true))
            .build()
    } else {
        end(SdkTracerProvider::builder(), bridged)
    };
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
    let layer = !matches!(setup, "otel" | "otel-batch" | "floor" | "api-floor");
    let dispatch = if setup == "floor" {
        tracing::Dispatch::new(tracing_subscriber::registry().with(otel).with(FloorLayer))
    } else if setup == "api-floor" {
        tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(otel)
                .with(ApiFloorLayer::default()),
        )
    } else if layer {
        tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(otel)
                .with(ProfilingLayer::default()),
        )
    } else {
        tracing::Dispatch::new(tracing_subscriber::registry().with(otel))
    };
    let sampler = if setup.starts_with("bridge") {
        let sampler = Sampler::start(SamplerConfig::default().with_frequency_hz(100))
            .expect("the sampler starts");
        sampler
            .register_current_thread()
            .expect("the thread registers");
        Some(sampler)
    } else {
        None
    };
    if setup.ends_with("threadctx") {
        otel_profiling::thread_ctx::enable().expect("the thread context is published");
    }
    tracing::dispatcher::with_default(&dispatch, || {
        lifecycles(LIFECYCLES);
        lifecycles(LIFECYCLES);
    });
    if setup.ends_with("threadctx") {
        otel_profiling::thread_ctx::disable();
    }
    drop(sampler);
    let _ = provider.shutdown();
}

/// Instructions callgrind counted inside `lifecycles` for `setup`, per lifecycle.
fn count(setup: &str) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out_file = std::env::temp_dir().join(format!(
        "otel-profiling-callgrind-{}-{setup}.out",
        std::process::id()
    ));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--toggle-collect=*lifecycles*")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(&exe)
        .env(SETUP_VAR, setup)
        .output()
        .map_err(|e| format!("valgrind: {e}"))?;
    let _ = std::fs::remove_file(&out_file);
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("{setup}: valgrind failed: {log}"));
    }
    let collected = log
        .lines()
        .find_map(|line| line.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("{setup}: no count in valgrind's output: {log}"))?;
    Ok(collected / f64::from(2 * LIFECYCLES))
}

fn main() {
    if let Ok(setup) = std::env::var(SETUP_VAR) {
        run(&setup);
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it too: only count when
    // benchmarking.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("span_lifecycle_instructions: skipped (valgrind is not installed)");
        return;
    }
    println!("instructions per root span lifecycle (create, 4 polls, close), callgrind:");
    let mut baselines = std::collections::HashMap::new();
    for (setup, what) in SETUPS {
        match count(setup) {
            Ok(per) => {
                let base_name = if setup.ends_with("-batch") {
                    "otel-batch"
                } else {
                    "otel"
                };
                if *setup == base_name {
                    baselines.insert(base_name, per);
                }
                let ratio = baselines
                    .get(base_name)
                    .map_or(String::from("-"), |base| format!("{:.3}x", per / base));
                println!("  {setup:<17} {per:>9.0}  {ratio:>7}  {what}");
            }
            Err(err) => println!("  {setup:<17} failed: {err}"),
        }
    }
}
