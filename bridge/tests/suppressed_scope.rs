//! The bridge's own threads run in OpenTelemetry's suppressed scope: what runs there (a
//! profile sink, an instrumented HTTP client) makes no span and is never sampled, even
//! with a global `tracing` subscriber, tracing-opentelemetry and a global tracer provider
//! installed, the way an application sets them up.

mod common;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::trace::{Tracer as _, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::{pprof, ProfileIdSpanProcessor, Profiler, ProfilingLayer};
use tracing_subscriber::layer::SubscriberExt;

/// The `tracing` span the sink opens for each profile, as an instrumented client would.
const SINK_SPAN: &str = "sink: push profile";
/// The OpenTelemetry API span the sink starts through the global tracer.
const SINK_OTEL_SPAN: &str = "sink: otel api";
/// The span the application's own work runs in.
const APP_SPAN: &str = "GET /app";

/// Burns `cpu` of this thread's CPU time.
#[inline(never)]
fn burn(cpu: Duration) -> u64 {
    let start = common::thread_cpu_time();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    while common::thread_cpu_time() - start < cpu {
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    x
}

/// A sink that does what instrumented code on the collector thread would: opens a
/// `tracing` span and burns CPU in it, and starts an OpenTelemetry span.
struct SpanningSink {
    profiles: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl ProfileSink for SpanningSink {
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        tracing::info_span!(SINK_SPAN).in_scope(|| burn(Duration::from_millis(80)));
        drop(opentelemetry::global::tracer("sink").start(SINK_OTEL_SPAN));
        self.profiles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(profile.gzip_pprof.clone());
        Ok(())
    }
}

/// The `span_name` labels of every sample in `profiles`.
fn span_name_labels(profiles: &[Vec<u8>]) -> Vec<String> {
    let mut names = Vec::new();
    for bytes in profiles {
        let p = otel_profiling_pprof::decode(bytes).expect("the sink's profile decodes");
        let s = |i: i64| p.string_table[usize::try_from(i).expect("index")].clone();
        for sample in &p.sample {
            for label in &sample.label {
                if s(label.key) == pprof::SPAN_NAME_KEY {
                    names.push(s(label.str));
                }
            }
        }
    }
    names
}

#[test]
fn the_collector_threads_work_makes_no_spans_and_no_profiles() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(ProfilingLayer::default()),
    )
    .expect("the only global subscriber of this test binary");

    let profiles = Arc::new(Mutex::new(Vec::new()));
    let profiler = Profiler::builder()
        .frequency_hz(250)
        .interval(Duration::from_secs(60))
        .local_files(false)
        .blocked_watchdog(None)
        .sink(SpanningSink {
            profiles: profiles.clone(),
        })
        .start()
        .expect("profiler");
    // Two intervals: the sink runs at the end of the first (its span, its CPU), and the
    // second's profile would hold the collector thread's samples of that work. Each has
    // the application's CPU, or there would be no profile to hand to the sink.
    for _ in 0..2 {
        tracing::info_span!(APP_SPAN).in_scope(|| burn(Duration::from_millis(100)));
        assert!(profiler.flush(Duration::from_secs(10)), "flush");
    }
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");
    let _ = provider.force_flush();

    let profiles = profiles.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(
        profiles.len() >= 2,
        "the sink ran: {} profiles",
        profiles.len()
    );
    let spans: Vec<String> = exporter
        .get_finished_spans()
        .expect("finished spans")
        .iter()
        .map(|s| s.name.to_string())
        .collect();
    // The pipeline works: the application's spans are exported...
    assert_eq!(
        spans.iter().filter(|n| *n == APP_SPAN).count(),
        2,
        "{spans:?}"
    );
    // ...and none of the sink's.
    assert!(
        !spans.iter().any(|n| n == SINK_SPAN || n == SINK_OTEL_SPAN),
        "spans made on the collector thread were exported: {spans:?}"
    );
    // Samples are labelled with the application's span, never with the sink's: the
    // collector thread was not registered with the sampler.
    let labels = span_name_labels(&profiles);
    assert!(labels.iter().any(|n| n == APP_SPAN), "{labels:?}");
    assert!(
        !labels.iter().any(|n| n == SINK_SPAN),
        "the collector thread's work was profiled: {labels:?}"
    );
}
