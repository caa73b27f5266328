//! End to end on the embedded default: the profiler writes gzipped pprof files and the span
//! exporter OTLP JSON lines into a directory; the profile holds the span's own function
//! with its `span_id`, the span carries `pyroscope.profile.id` and its CPU evidence, and an
//! independent reader (`go tool pprof`) agrees.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor};
use otel_profiling::local_sink::LocalSpanExporter;
use otel_profiling::{
    sampler, CpuEvidenceProcessor, ProfileIdSpanProcessor, Profiler, ProfilingLayer,
};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// Stays in its own loop (no calls even in debug builds) so samples land in it.
#[inline(never)]
fn render_report_rows(cpu: Duration) -> u64 {
    let start = common::thread_cpu_time();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    loop {
        let mut i = 0u32;
        while i < 20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            i += 1;
        }
        if common::thread_cpu_time() - start >= cpu {
            return x;
        }
    }
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    out.retain(|p| p.to_string_lossy().ends_with(suffix));
    out.sort();
    out
}

#[test]
fn profiles_and_spans_land_in_the_directory_and_agree() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let profiler = Profiler::builder()
        .frequency_hz(250)
        .interval(Duration::from_millis(500))
        .output_dir(&dir)
        .start()
        .expect("profiler");
    assert_eq!(profiler.output_dir(), Some(dir.as_path()));

    let spans = LocalSpanExporter::new(&dir).expect("span exporter");
    let spans_path = spans.path().to_path_buf();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(spans)))
        .build();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("e2e")))
            .with(ProfilingLayer::default()),
    );
    // Spans are created on this thread: the dispatcher must be its default.
    let _default = tracing::dispatcher::set_default(&dispatch);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(sampler::tokio_on_thread_start())
        .on_thread_stop(sampler::tokio_on_thread_stop())
        .build()
        .expect("runtime");
    let ids: Vec<String> = runtime.block_on(async {
        let mut handles = Vec::new();
        for _ in 0..3 {
            let span = tracing::info_span!(parent: None, "GET /report");
            let id = span.context().span().span_context().span_id().to_string();
            let fut = async {
                for _ in 0..4 {
                    render_report_rows(Duration::from_millis(40));
                    tokio::task::yield_now().await;
                }
            }
            .instrument(span);
            handles.push((
                id,
                tokio::spawn(tracing::instrument::WithSubscriber::with_subscriber(
                    fut,
                    dispatch.clone(),
                )),
            ));
        }
        let mut ids = Vec::new();
        for (id, h) in handles {
            h.await.expect("task");
            ids.push(id);
        }
        ids
    });
    drop(runtime);
    // The collector's counters, as the profiler reports them, saw the profiles written.
    assert!(profiler.flush(Duration::from_secs(10)), "flushed in time");
    let stats = profiler.stats();
    assert!(
        stats.profiles_exported >= 1 && stats.samples_in_profiles > 0,
        "{stats:?}"
    );
    assert_eq!(stats.profiles_failed, 0, "{stats:?}");
    assert!(
        profiler.shutdown(Duration::from_secs(10)),
        "shutdown in time"
    );
    drop(provider);

    // Profiles: decoded by our reader, then by Go's.
    let profiles = files(&dir, "_cpu.pb.gz");
    assert!(!profiles.is_empty(), "no profile in {}", dir.display());
    let mut labelled_in_function = 0u64;
    let mut span_ids_seen = HashSet::new();
    for path in &profiles {
        let bytes = std::fs::read(path).expect("read profile");
        let profile = otel_profiling_pprof::decode(&bytes).expect("valid pprof");
        let s = |i: i64| {
            profile
                .string_table
                .get(i as usize)
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(profile.sample_type.len(), 1);
        assert_eq!(
            (
                s(profile.sample_type[0].r#type),
                s(profile.sample_type[0].unit)
            ),
            ("cpu".into(), "nanoseconds".into())
        );
        assert_eq!(profile.period, 4_000_000);
        for sample in &profile.sample {
            let span_id = sample
                .label
                .iter()
                .find(|l| s(l.key) == "span_id")
                .map(|l| s(l.str));
            // The span's function is anywhere on the stack (the unwinder gives whole stacks).
            let in_function = sample.location_id.iter().any(|id| {
                profile.location.iter().filter(|l| l.id == *id).any(|l| {
                    l.line.iter().any(|line| {
                        profile.function.iter().any(|f| {
                            f.id == line.function_id && s(f.name).ends_with("render_report_rows")
                        })
                    })
                })
            });
            if in_function {
                let span_id = span_id.expect("samples in the span's function carry span_id");
                assert!(ids.contains(&span_id), "unknown span id {span_id}");
                labelled_in_function += sample.value[0] as u64 / 4_000_000;
                span_ids_seen.insert(span_id);
            }
        }
    }
    assert!(
        labelled_in_function >= 20,
        "{labelled_in_function} samples in render_report_rows"
    );

    // Spans: OTLP JSON lines; roots carry the profile id and their CPU evidence.
    let text = std::fs::read_to_string(&spans_path).expect("spans file");
    let mut roots = 0;
    for line in text.lines() {
        let request: serde_json::Value = serde_json::from_str(line).expect("one JSON per line");
        for rs in request["resourceSpans"].as_array().expect("resourceSpans") {
            for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
                for span in ss["spans"].as_array().expect("spans") {
                    let attr = |key: &str| {
                        span["attributes"]
                            .as_array()
                            .and_then(|a| a.iter().find(|kv| kv["key"] == key))
                            .map(|kv| kv["value"].clone())
                    };
                    let span_id = span["spanId"].as_str().expect("spanId hex");
                    assert_eq!(span_id.len(), 16);
                    if span["name"] == "GET /report" {
                        roots += 1;
                        assert_eq!(
                            attr("pyroscope.profile.id")
                                .and_then(|v| v["stringValue"].as_str().map(String::from))
                                .as_deref(),
                            Some(span_id)
                        );
                        let samples: i64 = attr("profiling.cpu.samples")
                            .and_then(|v| v["intValue"].as_str().and_then(|s| s.parse().ok()))
                            .expect("cpu evidence");
                        assert!(samples >= 5, "{span_id}: {samples} samples");
                    }
                }
            }
        }
    }
    assert_eq!(roots, 3);

    // An independent reader: Go's pprof finds the function and the labels.
    if !common::go_available() {
        return;
    }
    let newest = profiles
        .iter()
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("a profile");
    let out = std::process::Command::new("go")
        .args(["tool", "pprof", "-traces"])
        .arg(newest)
        .output()
        .expect("go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("render_report_rows"), "{text}");
    assert!(text.contains("span_id"), "{text}");
    assert!(
        span_ids_seen.iter().any(|id| text.contains(id.as_str())),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
