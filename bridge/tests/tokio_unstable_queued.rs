//! Queued time of `tracing`-instrumented tasks on a real tokio runtime built with
//! `--cfg tokio_unstable` and its `tracing` feature (the instrumentation tokio-console
//! reads). Without the flag this file compiles to nothing: `.ci/run` builds it with the
//! flag, in a target directory of its own.
//!
//! `RUSTFLAGS="--cfg tokio_unstable" cargo test -p otel-profiling --test tokio_unstable_queued`
#![cfg(tokio_unstable)]

mod common;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::{
    CpuEvidenceProcessor, ProfilingLayer, WALL_ACTIVE_ATTRIBUTE, WALL_QUEUED_ATTRIBUTE,
};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

use common::{burn, ns_attribute as ns};

/// A task woken while the only worker burns CPU waits for the worker: its root reports
/// that wait as queued, not as time awaiting a dependency.
#[test]
fn a_woken_task_behind_cpu_work_is_queued() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(
            exporter.clone(),
        )))
        .build();
    let sampler = Sampler::start(SamplerConfig::default().with_frequency_hz(100)).expect("sampler");
    // Global: tokio's workers create the task spans and emit the waker events.
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("tokio")))
            .with(ProfilingLayer::default()),
    )
    .expect("the only subscriber of this test binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let root = tracing::info_span!(parent: None, "queued");
    let awaited = Duration::from_millis(50);
    let stretch = Duration::from_millis(300);
    runtime.block_on(async {
        // Waker events flow (a yield wakes its own task).
        tokio::spawn(tokio::task::yield_now())
            .await
            .expect("warm-up task");
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = tokio::spawn(
            async move {
                let _ = started_tx.send(());
                let _ = rx.await;
            }
            .instrument(root.clone()),
        );
        // The waiter is parked on its channel before the worker is taken.
        let _ = started_rx.await;
        std::thread::spawn(move || {
            std::thread::sleep(awaited);
            let _ = tx.send(());
        });
        // The only worker burns without yielding: the waiter, woken at 50 ms, is polled
        // after it.
        tokio::spawn(async move { burn(stretch) })
            .await
            .expect("hog");
        waiter.await.expect("waiter");
    });
    drop(root);
    drop(runtime);
    drop(sampler);
    let spans = exporter.get_finished_spans().expect("spans");
    let span = spans.iter().find(|s| s.name == "queued").expect("exported");
    let queued = ns(span, WALL_QUEUED_ATTRIBUTE);
    let active = ns(span, WALL_ACTIVE_ATTRIBUTE);
    eprintln!("tracing root in a real tokio task: queued {queued:?}, active {active:?}");
    assert!(queued >= Duration::from_millis(200), "queued {queued:?}");
    assert!(active <= Duration::from_millis(60), "active {active:?}");
}
