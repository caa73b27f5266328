//! The bridge's OTLP profiles exporter against the stand-in (a stand-in for tests, not a
//! backend) on Pyroscope's OTLP paths, over HTTP and gRPC: what is stored is what the
//! profile held (span ids, service, `process_cpu`, values), and a request over the
//! ingestion burst (HTTP 429 / gRPC RESOURCE_EXHAUSTED) is split, never resent as is.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use otel_profiling::collector::{EncodedProfile, ProfileKind, ProfileSink};
use otel_profiling::config::OtlpProtocol;
use otel_profiling::export::otlp_profiles::{
    OtlpProfilesConfig, OtlpProfilesExporter, PROFILES_PATH,
};
use otel_profiling::export::pyroscope::{PyroscopeBackoff, PROFILE_TYPE_ID};
use otel_profiling::pprof::{
    encode_gzip, FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame,
};
use otel_profiling_integration_tests::standin::{Limits, StandIn};

const PERIOD: i64 = 10_000_000;

/// A CPU profile of `spans` spans, each with `per_span` distinct stacks of 2 samples.
fn profile(spans: u64, per_span: u64) -> EncodedProfile {
    let start = SystemTime::now();
    let mut b = ProfileBuilder::new(PERIOD, start, Duration::from_secs(10));
    for span in 1..=spans {
        for i in 0..per_span {
            let frames = [
                SymbolizedFrame {
                    address: 0x1000 + span * 1000 + i,
                    lines: vec![FrameLine {
                        function: format!("app::leaf_{span}_{i}").into(),
                        file: Some("src/app.rs".into()),
                        line: Some(i as u32 + 1),
                    }],
                },
                SymbolizedFrame {
                    address: 0x10,
                    lines: vec![FrameLine {
                        function: "app::main".into(),
                        file: None,
                        line: None,
                    }],
                },
            ];
            let labels = SampleLabels {
                span_id: Some(0xa000 + span),
                trace_id: Some(0xbeef),
                span_name: Some("GET /x".into()),
            };
            b.add_sample(&frames, &labels, 2);
        }
    }
    let pprof = b.build();
    EncodedProfile {
        kind: ProfileKind::Cpu,
        start,
        duration: Duration::from_secs(10),
        samples: pprof.sample_count() as u64,
        gzip_pprof: encode_gzip(&pprof).expect("encodes"),
    }
}

fn config(standin: &StandIn, protocol: OtlpProtocol) -> OtlpProfilesConfig {
    let endpoint = match protocol {
        OtlpProtocol::HttpProtobuf => format!("{}{PROFILES_PATH}", standin.url()),
        _ => standin.url(),
    };
    OtlpProfilesConfig::new(endpoint, "otlp-export-test")
        .with_protocol(protocol)
        .with_resource_attribute("service.version", "3.1")
        .with_backoff(PyroscopeBackoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
            12,
        ))
        .with_shutdown_timeout(Duration::from_secs(20))
}

/// Samples stored per span id: value sum.
fn stored(standin: &StandIn) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for s in standin.samples() {
        assert_eq!(s.profile_type, PROFILE_TYPE_ID);
        assert_eq!(
            s.labels.get("service_name").map(String::as_str),
            Some("otlp-export-test")
        );
        assert_eq!(
            s.labels.get("service_version").map(String::as_str),
            Some("3.1")
        );
        assert_eq!(
            s.labels.get("span_name").map(String::as_str),
            Some("GET /x")
        );
        assert_eq!(
            s.trace_id.as_deref(),
            Some("0000000000000000000000000000beef")
        );
        *out.entry(s.span_id.clone().unwrap_or_default())
            .or_insert(0) += s.value;
    }
    out
}

fn round_trip(protocol: OtlpProtocol) {
    round_trip_with(protocol, None);
}

/// One profile through the exporter with `gzip` (`None`: its default); returns the
/// stand-in's (gzipped, plain) request counts.
fn round_trip_with(protocol: OtlpProtocol, gzip: Option<bool>) -> (usize, usize) {
    let standin = StandIn::start().expect("stand-in");
    let mut config = config(&standin, protocol);
    if let Some(gzip) = gzip {
        config = config.with_gzip(gzip);
    }
    let mut exporter = OtlpProfilesExporter::new(config).expect("exporter");
    let stats = exporter.stats();
    exporter.export(&profile(3, 4)).expect("queued");
    drop(exporter);
    let s = stats.snapshot();
    assert_eq!(
        (s.profiles_sent, s.profiles_dropped, s.profiles_failed),
        (1, 0, 0),
        "{s:?}"
    );
    let per_span = stored(&standin);
    let expected: BTreeMap<String, i64> = (1..=3u64)
        .map(|span| (format!("{:016x}", 0xa000 + span), 4 * 2 * PERIOD))
        .collect();
    assert_eq!(per_span, expected);
    standin.request_encodings()
}

/// `OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION` as the exporter's `gzip`: by default gzip over
/// HTTP and plain over gRPC; each way can be turned, and what arrives decodes the same.
#[test]
fn compression_is_as_configured_on_both_transports() {
    let http = OtlpProtocol::HttpProtobuf;
    let grpc = OtlpProtocol::Grpc;
    assert_eq!(round_trip_with(http, None), (1, 0));
    assert_eq!(round_trip_with(http, Some(false)), (0, 1));
    assert_eq!(round_trip_with(grpc, None), (0, 1));
    assert_eq!(round_trip_with(grpc, Some(true)), (1, 0));
}

#[test]
fn http_profiles_land_with_their_spans() {
    round_trip(OtlpProtocol::HttpProtobuf);
}

#[test]
fn grpc_profiles_land_with_their_spans() {
    round_trip(OtlpProtocol::Grpc);
}

/// A request over the ingestion burst is answered 429 (gRPC: RESOURCE_EXHAUSTED) every
/// time: the exporter sends its samples in halves until they fit, and everything lands.
fn split_on_rate_limit(protocol: OtlpProtocol) {
    let mut limits = Limits::default();
    limits.ingestion_burst_bytes = 6_000;
    limits.ingestion_rate_bytes = 1e9;
    let standin = StandIn::start_with_limits(limits).expect("stand-in");
    let mut exporter = OtlpProfilesExporter::new(config(&standin, protocol)).expect("exporter");
    let stats = exporter.stats();
    exporter.export(&profile(4, 40)).expect("queued");
    drop(exporter);
    let s = stats.snapshot();
    assert!(s.rate_limited >= 1 && s.pushes_split >= 1, "{s:?}");
    assert_eq!((s.profiles_dropped, s.profiles_failed), (0, 0), "{s:?}");
    let per_span = stored(&standin);
    assert_eq!(per_span.len(), 4, "{per_span:?}");
    assert!(
        per_span.values().all(|v| *v == 40 * 2 * PERIOD),
        "{per_span:?}"
    );
}

#[test]
fn http_429_splits_the_request() {
    split_on_rate_limit(OtlpProtocol::HttpProtobuf);
}

#[test]
fn grpc_resource_exhausted_splits_the_request() {
    split_on_rate_limit(OtlpProtocol::Grpc);
}

/// An invalid request (400 / INVALID_ARGUMENT) is refused for good: counted as failed,
/// not retried.
#[test]
fn a_refused_profile_is_not_retried() {
    for protocol in [OtlpProtocol::HttpProtobuf, OtlpProtocol::Grpc] {
        let mut limits = Limits::default();
        limits.max_profile_samples = 2;
        let standin = StandIn::start_with_limits(limits).expect("stand-in");
        let config = config(&standin, protocol)
            .with_limits(otel_profiling::export::pyroscope::PyroscopeLimits::default());
        let mut exporter = OtlpProfilesExporter::new(config).expect("exporter");
        let stats = exporter.stats();
        exporter.export(&profile(1, 5)).expect("queued");
        drop(exporter);
        let s = stats.snapshot();
        assert_eq!(
            (s.profiles_failed, s.retries, s.rejected),
            (1, 0, 1),
            "{protocol:?}: {s:?}"
        );
        assert!(
            stats
                .last_error()
                .is_some_and(|e| e.contains("not retried")),
            "{:?}",
            stats.last_error()
        );
    }
}
