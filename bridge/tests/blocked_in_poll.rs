//! End to end on the blocked-in-poll profile: a root that blocks its tokio worker in
//! `std::thread::sleep` inside a poll shows up in `<start>_blocked.pb.gz` with the blocking
//! function on its stack, labelled with the root's span id and weighted by the blocked
//! wall time; a root burning CPU and a root awaiting a timer give no blocked samples.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use otel_profiling::{sampler, Profiler, ProfilingLayer};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const BLOCK: Duration = Duration::from_millis(300);

/// A synchronous call inside a poll: the worker thread is held, off-CPU.
#[inline(never)]
fn read_inventory_file_synchronously() {
    std::thread::sleep(BLOCK);
    std::hint::black_box(());
}

/// Burns CPU inside a poll.
#[inline(never)]
fn price_the_basket(cpu: Duration) -> u64 {
    let start = common::thread_cpu_time();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    while common::thread_cpu_time() - start < cpu {
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    std::hint::black_box(x)
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    out.retain(|p| p.to_string_lossy().ends_with(suffix));
    out.sort();
    out
}

/// Issue 11 item 3: the watchdog's blocked stacks name the blocking function.
#[test]
fn the_watchdogs_blocked_stacks_name_the_blocking_function() {
    let _turn = common::turn();
    let dir = std::env::temp_dir().join(format!("otel-profiling-blocked-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let profiler = Profiler::builder()
        .interval(Duration::from_millis(500))
        .output_dir(&dir)
        .start()
        .expect("profiler");
    let provider = SdkTracerProvider::builder().build();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("blocked")))
            .with(ProfilingLayer::default()),
    );
    let _default = tracing::dispatcher::set_default(&dispatch);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .on_thread_start(sampler::tokio_on_thread_start())
        .on_thread_stop(sampler::tokio_on_thread_stop())
        .build()
        .expect("runtime");
    let ids: HashMap<&str, String> = runtime.block_on(async {
        let mut handles = Vec::new();
        for name in ["GET /blocking", "GET /compute", "GET /awaiting"] {
            let span = tracing::info_span!(parent: None, "root", otel.name = name);
            let id = span.context().span().span_context().span_id().to_string();
            let fut = async move {
                match name {
                    "GET /blocking" => read_inventory_file_synchronously(),
                    "GET /compute" => {
                        price_the_basket(BLOCK);
                    }
                    _ => tokio::time::sleep(BLOCK).await,
                }
            }
            .instrument(span);
            let task = tokio::spawn(tracing::instrument::WithSubscriber::with_subscriber(
                fut,
                dispatch.clone(),
            ));
            handles.push((name, id, task));
        }
        let mut ids = HashMap::new();
        for (name, id, task) in handles {
            task.await.expect("task");
            ids.insert(name, id);
        }
        ids
    });
    drop(runtime);
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");
    drop(provider);

    let profiles = files(&dir, "_blocked.pb.gz");
    assert!(
        !profiles.is_empty(),
        "no blocked profile in {}: {:?}",
        dir.display(),
        stats.blocked
    );
    // Blocked nanoseconds by span id, and those in the blocking function.
    let mut delay_by_span: HashMap<String, i64> = HashMap::new();
    let mut in_function = 0i64;
    let mut contentions = 0i64;
    for path in &profiles {
        let bytes = std::fs::read(path).expect("read");
        let profile = otel_profiling_pprof::decode(&bytes).expect("valid pprof");
        let s = |i: i64| profile.string_table[i as usize].clone();
        let types: Vec<(String, String)> = profile
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("contentions".into(), "count".into()),
                ("delay".into(), "nanoseconds".into())
            ]
        );
        let period_type = profile.period_type.as_ref().expect("period type");
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit), profile.period),
            ("contentions".into(), "count".into(), 1)
        );
        for sample in &profile.sample {
            let span_id = sample
                .label
                .iter()
                .find(|l| s(l.key) == "span_id")
                .map(|l| s(l.str))
                .expect("blocked samples carry span_id");
            *delay_by_span.entry(span_id.clone()).or_default() += sample.value[1];
            contentions += sample.value[0];
            let names_it = sample.location_id.iter().any(|id| {
                profile.location.iter().filter(|l| l.id == *id).any(|l| {
                    l.line.iter().any(|line| {
                        profile.function.iter().any(|f| {
                            f.id == line.function_id
                                && s(f.name).ends_with("read_inventory_file_synchronously")
                        })
                    })
                })
            });
            if names_it {
                assert_eq!(span_id, ids["GET /blocking"]);
                in_function += sample.value[1];
            }
        }
    }
    let blocking = Duration::from_nanos(delay_by_span[&ids["GET /blocking"]] as u64);
    assert!(
        blocking <= BLOCK && blocking >= BLOCK / 2,
        "blocked {blocking:?} of {BLOCK:?}"
    );
    assert_eq!(
        Duration::from_nanos(in_function as u64),
        blocking,
        "every blocked stack names the blocking function"
    );
    assert_eq!(contentions, 1, "one block");
    for quiet in ["GET /compute", "GET /awaiting"] {
        assert!(
            !delay_by_span.contains_key(&ids[quiet]),
            "{quiet} has blocked samples: {delay_by_span:?}"
        );
    }
    assert!(stats.blocked.samples > 0, "{:?}", stats.blocked);

    // An independent reader: Go's pprof reads the delay and finds the function and span.
    if common::go_available() {
        let out = std::process::Command::new("go")
            .args(["tool", "pprof", "-sample_index=delay", "-traces"])
            .arg(&profiles[0])
            .output()
            .expect("go tool pprof");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "go tool pprof failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("read_inventory_file_synchronously"), "{text}");
        assert!(text.contains(ids["GET /blocking"].as_str()), "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
