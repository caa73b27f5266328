//! The one-call setup against local receivers: traces arrive over OTLP/HTTP with
//! `pyroscope.profile.id` on the root span, profiles arrive at the Pyroscope push endpoint,
//! and the span id in the trace is the `span_id` label of the profile's samples.

mod common;
#[path = "support/receiver.rs"]
mod receiver;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use otel_profiling::config::{EnvConfig, OtlpProtocol};
use otel_profiling::test_support::push_v1::PushRequest;
use otel_profiling::Telemetry;
use prost::Message;
use receiver::{fresh_listener, Receiver};
use tracing_subscriber::layer::SubscriberExt;

/// The tests' HTTP/1.1 receiver, answering every request with 200 and an empty body.
fn receiver() -> Receiver {
    Receiver::answering(fresh_listener(), Box::new(|_, _| (200, vec![], Vec::new())))
}

#[inline(never)]
fn checkout_cpu(cpu: Duration) -> u64 {
    let start = Instant::now();
    let mut x = 1u64;
    while start.elapsed() < cpu {
        let mut i = 0u32;
        while i < 10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            i += 1;
        }
    }
    x
}

#[test]
fn traces_and_profiles_reach_their_receivers_with_the_same_span_id() {
    let _turn = common::turn();
    let otlp = receiver();
    let pyroscope = receiver();
    let (otlp_url, pyro_url) = (otlp.url(), pyroscope.url());
    // Everything from the environment, as an operator sets it: the traces endpoint used as
    // given, gzip, a header; Pyroscope with the agents' variables (the Java agent's forms
    // for labels and extra headers).
    let traces_url = format!("{otlp_url}/v1/traces");
    let vars = [
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url.as_str()),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-otlp=from-env"),
        ("PYROSCOPE_SERVER_ADDRESS", pyro_url.as_str()),
        ("PYROSCOPE_BASIC_AUTH_USER", "u"),
        ("PYROSCOPE_BASIC_AUTH_PASSWORD", "p"),
        ("PYROSCOPE_TENANT_ID", "tenant-1"),
        ("PYROSCOPE_LABELS", "region=eu-west-1"),
        ("PYROSCOPE_HTTP_HEADERS", r#"{"X-Extra": "from-env"}"#),
    ];
    let env = EnvConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    })
    .expect("valid variables");
    let telemetry = Telemetry::from_env_config(env)
        .service_name("checkout")
        .resource_attribute("service.version", "2.0.1")
        .resource_attribute("deployment.environment", "test")
        .frequency_hz(250)
        .upload_interval(Duration::from_millis(500))
        .build()
        .expect("telemetry");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("POST /checkout").in_scope(|| {
            std::hint::black_box(checkout_cpu(Duration::from_millis(300)));
        });
    });
    drop(telemetry);

    // Traces: OTLP/HTTP protobuf at /v1/traces; the root carries pyroscope.profile.id.
    let traces = otlp.requests();
    assert!(!traces.is_empty(), "no OTLP request");
    let mut root_id = None;
    for req in &traces {
        assert_eq!(req.path, "/v1/traces");
        assert_eq!(
            req.header("content-encoding"),
            Some("gzip"),
            "OTEL_EXPORTER_OTLP_COMPRESSION"
        );
        assert_eq!(
            req.header("x-otlp"),
            Some("from-env"),
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
        );
        let export = ExportTraceServiceRequest::decode(&req.payload()[..]).expect("OTLP protobuf");
        for rs in &export.resource_spans {
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    if span.name == "POST /checkout" {
                        let id: String = span.span_id.iter().map(|b| format!("{b:02x}")).collect();
                        let attr = span
                            .attributes
                            .iter()
                            .find(|kv| kv.key == "pyroscope.profile.id")
                            .and_then(|kv| kv.value.as_ref())
                            .and_then(|v| match &v.value {
                                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => Some(s.clone()),
                                _ => None,
                            });
                        assert_eq!(attr.as_deref(), Some(id.as_str()));
                        assert!(span
                            .attributes
                            .iter()
                            .any(|kv| kv.key == "profiling.cpu.samples"));
                        root_id = Some(id);
                    }
                }
            }
        }
    }
    let root_id = root_id.expect("root span exported");

    // Profiles: the push endpoint, the workload's labels, and samples labelled with the
    // root's id.
    let pushes = pyroscope.requests();
    assert!(!pushes.is_empty(), "no push");
    let mut span_ids = HashSet::new();
    for req in &pushes {
        assert_eq!(req.path, "/push.v1.PusherService/Push");
        assert_eq!(req.header("x-scope-orgid"), Some("tenant-1"));
        assert_eq!(
            req.header("x-extra"),
            Some("from-env"),
            "PYROSCOPE_HTTP_HEADERS"
        );
        assert!(req
            .header("authorization")
            .is_some_and(|a| a.starts_with("Basic ")));
        let push = PushRequest::decode(&req.payload()[..]).expect("push protobuf");
        for series in &push.series {
            let label = |n: &str| {
                series
                    .labels
                    .iter()
                    .find(|l| l.name == n)
                    .map(|l| l.value.as_str())
            };
            assert_eq!(label("__name__"), Some("process_cpu"));
            assert_eq!(label("service_name"), Some("checkout"));
            assert_eq!(label("service_version"), Some("2.0.1"));
            assert_eq!(label("deployment_environment"), Some("test"));
            assert_eq!(label("region"), Some("eu-west-1"), "PYROSCOPE_LABELS");
            for sample in &series.samples {
                let profile = otel_profiling_pprof::decode(&sample.raw_profile).expect("pprof");
                let s = |i: i64| profile.string_table[i as usize].clone();
                for smp in &profile.sample {
                    for l in &smp.label {
                        if s(l.key) == "span_id" {
                            span_ids.insert(s(l.str));
                        }
                    }
                }
            }
        }
    }
    assert!(span_ids.contains(&root_id), "{root_id} not in {span_ids:?}");
}

/// gRPC OTLP to an address where nothing listens: setup works, spans are attempted off the
/// request path, and shutdown is bounded — the host is never slowed or crashed.
#[test]
fn an_unreachable_grpc_collector_never_blocks_the_host() {
    let _turn = common::turn();
    let dir = std::env::temp_dir().join(format!("otel-profiling-grpc-{}", std::process::id()));
    let telemetry = Telemetry::builder()
        .service_name("checkout")
        .otlp("http://127.0.0.1:9", OtlpProtocol::Grpc)
        .expect("otlp url")
        .output_dir(&dir)
        .shutdown_timeout(Duration::from_secs(2))
        .build()
        .expect("telemetry");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let start = Instant::now();
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..1000 {
            tracing::info_span!("GET /ping").in_scope(|| {});
        }
    });
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "spans took {:?}",
        start.elapsed()
    );
    // The failure is counted (and logged), not silent.
    telemetry.flush();
    let spans = telemetry.stats().spans;
    assert!(
        spans.batches_failed >= 1 && spans.spans_failed >= 1 && spans.spans_sent == 0,
        "{spans:?}"
    );
    let stop = Instant::now();
    drop(telemetry);
    assert!(
        stop.elapsed() < Duration::from_secs(6),
        "shutdown took {:?}",
        stop.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// OTLP/HTTP to an address where nothing listens: every lost batch is counted with its
/// spans in the health counters (and logged, at most once a minute).
#[test]
fn an_unreachable_http_collector_is_counted() {
    let _turn = common::turn();
    let dir = std::env::temp_dir().join(format!("otel-profiling-http-{}", std::process::id()));
    let telemetry = Telemetry::builder()
        .service_name("checkout")
        .otlp("http://127.0.0.1:9", OtlpProtocol::HttpProtobuf)
        .expect("otlp url")
        .output_dir(&dir)
        .shutdown_timeout(Duration::from_secs(2))
        .build()
        .expect("telemetry");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..10 {
            tracing::info_span!("GET /ping").in_scope(|| {});
        }
    });
    telemetry.flush();
    let spans = telemetry.stats().spans;
    assert_eq!((spans.spans_failed, spans.spans_sent), (10, 0), "{spans:?}");
    assert!(spans.batches_failed >= 1, "{spans:?}");
    drop(telemetry);
    let _ = std::fs::remove_dir_all(&dir);
}
