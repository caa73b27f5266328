//! The local-only use, through the one-call setup: with no backend configured (and in a
//! build with every backend feature off, as CI's `--no-default-features` pass runs it),
//! `Telemetry::build` writes pprof files and OTLP JSON span lines, and the profile's
//! samples carry the span id the span file has.

mod common;

use std::time::Duration;

use otel_profiling::Telemetry;
use tracing_subscriber::layer::SubscriberExt;

/// Stays in its own loop so samples land in it.
#[inline(never)]
fn local_only_work(cpu: Duration) -> u64 {
    let start = common::thread_cpu_time();
    let mut x = 1u64;
    while common::thread_cpu_time() - start < cpu {
        for i in 0..10_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
    }
    x
}

#[test]
fn one_call_setup_writes_profiles_and_spans_locally() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-local-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let telemetry = Telemetry::builder()
        .service_name("local-only")
        .output_dir(&dir)
        .frequency_hz(250)
        .upload_interval(Duration::from_millis(500))
        .quiet(true)
        .build()
        .expect("local-only setup");
    assert_eq!(telemetry.profiles_dir(), Some(dir.as_path()));
    let spans_file = telemetry
        .spans_file()
        .expect("spans go to a file")
        .to_path_buf();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(telemetry.layer()));
    tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("GET /local").in_scope(|| local_only_work(Duration::from_millis(300)));
    });
    drop(dispatch);
    drop(telemetry); // last profile written, spans flushed

    let spans = std::fs::read_to_string(&spans_file).expect("spans file");
    let span_ids: Vec<String> = common::spans_of_file(&spans)
        .iter()
        .filter(|span| span["name"] == "GET /local")
        .map(|span| span["spanId"].as_str().expect("span id").to_string())
        .collect();
    let [span_id] = span_ids.as_slice() else {
        panic!("expected one GET /local span, got {span_ids:?}");
    };

    let mut labelled = 0;
    for entry in std::fs::read_dir(&dir).expect("output dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with("_cpu.pb.gz") {
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
                    .any(|l| s(l.key) == "span_id" && s(l.str) == span_id.as_str())
            })
            .count();
    }
    assert!(labelled > 0, "no sample labelled with the span {span_id}");
    let _ = std::fs::remove_dir_all(&dir);
}
