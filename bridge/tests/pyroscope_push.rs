//! The Pyroscope exporter against the tests' HTTP/1.1 receiver on 127.0.0.1
//! (`support/receiver.rs`).
//!
//! What arrives is gunzipped with flate2, the `PushRequest` read with the workspace's one
//! push.v1 codec (the exporter's message types, `otel_profiling::test_support`, whose field
//! numbers the bridge's `field_numbers_match_push_proto` checks byte by byte against
//! grafana/pyroscope `api/push/v1/push.proto`), the inner pprof with
//! `otel_profiling_pprof::decode`.

#[path = "support/receiver.rs"]
mod receiver;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use otel_profiling::collector::{EncodedProfile, ProfileKind, ProfileSink};
use otel_profiling::export::pyroscope::{
    PyroscopeBackoff, PyroscopeConfig, PyroscopeExporter, PyroscopeSnapshot, PyroscopeStats,
    ALLOC_OBJECTS_PROFILE_TYPE_ID, ALLOC_PROFILE_NAME, ALLOC_SPACE_PROFILE_TYPE_ID,
    BLOCK_CONTENTIONS_PROFILE_TYPE_ID, BLOCK_DELAY_PROFILE_TYPE_ID, BLOCK_PROFILE_NAME,
    INUSE_OBJECTS_PROFILE_TYPE_ID, INUSE_SPACE_PROFILE_TYPE_ID,
};
use otel_profiling::pprof::{self, FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
use otel_profiling::test_support::push_v1::PushRequest;
use prost::Message;
use receiver::{closed_port, fresh_listener, rebind, Receiver, Request};

// ───────────────────────────── what arrived ─────────────────────────────

impl Request {
    fn push(&self) -> Vec<Series> {
        decode_push(&self.payload())
    }
}

/// `RawProfileSeries` as read back.
#[derive(Debug)]
struct Series {
    labels: Vec<(String, String)>,
    /// (raw_profile, ID)
    samples: Vec<(Vec<u8>, String)>,
}

/// A `PushRequest`, which must hold no field outside `push.proto`: prost keeps no unknown
/// field, so re-encoding what it read gives other bytes when one was there.
fn decode_push(buf: &[u8]) -> Vec<Series> {
    let push = PushRequest::decode(buf).expect("PushRequest protobuf");
    assert_eq!(
        push.encode_to_vec(),
        buf,
        "the push holds a field outside push.proto"
    );
    push.series
        .into_iter()
        .map(|s| Series {
            labels: s.labels.into_iter().map(|l| (l.name, l.value)).collect(),
            samples: s
                .samples
                .into_iter()
                .map(|r| (r.raw_profile, r.id))
                .collect(),
        })
        .collect()
}

/// The single (raw_profile, ID) of a one-profile push.
fn only_sample(request: &Request) -> (Vec<u8>, String) {
    let series = request.push();
    assert_eq!(series.len(), 1, "one series per push");
    assert_eq!(series[0].samples.len(), 1, "one profile per push");
    series[0].samples[0].clone()
}

// ───────────────────────────── helpers ─────────────────────────────

const SPAN_ID: u64 = 0x00c0_ffee_0000_beef;
const TRACE_ID: u128 = 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10;

/// A real gzipped pprof with one sample labelled with a span.
fn profile(span_id: u64) -> EncodedProfile {
    let start = SystemTime::now();
    let duration = Duration::from_secs(10);
    let mut builder = ProfileBuilder::new(10_000_000, start, duration);
    let frame = SymbolizedFrame {
        address: 0x1000 + span_id,
        lines: vec![FrameLine {
            function: "checkout::render".into(),
            file: None,
            line: None,
        }],
    };
    let labels = SampleLabels {
        span_id: Some(span_id),
        trace_id: Some(TRACE_ID),
        span_name: Some("GET /cart".into()),
    };
    builder.add_sample(&[frame], &labels, 3);
    EncodedProfile {
        kind: ProfileKind::Cpu,
        start,
        duration,
        samples: 3,
        gzip_pprof: pprof::encode_gzip(&builder.build()).expect("encode"),
    }
}

/// A profile of about `size` bytes of arbitrary content (the exporter does not look inside).
fn blob(size: usize, seed: u64) -> EncodedProfile {
    let mut x = seed | 1;
    let gzip_pprof = (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    EncodedProfile {
        kind: ProfileKind::Cpu,
        start: SystemTime::now(),
        duration: Duration::from_secs(10),
        samples: 1,
        gzip_pprof,
    }
}

/// Short backoffs so the tests stay fast.
fn config(url: &str) -> PyroscopeConfig {
    PyroscopeConfig::new(url, "checkout")
        .with_backoff(PyroscopeBackoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
            8,
        ))
        .with_request_timeout(Duration::from_secs(2))
        .with_shutdown_timeout(Duration::from_secs(2))
}

fn wait_stats(
    stats: &PyroscopeStats,
    timeout: Duration,
    done: impl Fn(&PyroscopeSnapshot) -> bool,
) -> PyroscopeSnapshot {
    let until = Instant::now() + timeout;
    loop {
        let s = stats.snapshot();
        if done(&s) || Instant::now() >= until {
            return s;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn sample_labels(raw: &[u8]) -> Vec<(String, String)> {
    let p = otel_profiling_pprof::decode(raw).expect("pprof");
    let s = |i: i64| p.string_table[i as usize].clone();
    p.sample
        .iter()
        .flat_map(|sample| sample.label.iter().map(|l| (s(l.key), s(l.str))))
        .collect()
}

// ───────────────────────────── tests ─────────────────────────────

#[test]
fn push_carries_labels_headers_auth_and_span_labels() {
    let receiver = Receiver::ok(fresh_listener());
    let config = config(&receiver.url())
        .with_label("service_version", "1.2.3")
        .with_label("env", "staging")
        .with_label("env", "dev")
        .with_basic_auth("user", "pa:ss")
        .with_tenant_id("tenant-1")
        .with_header("X-Extra", "yes");
    let mut exporter = PyroscopeExporter::new(config).expect("exporter");
    let stats = exporter.stats();
    let sent = profile(SPAN_ID);
    exporter.export(&sent).expect("export");

    let requests = receiver.wait_for(1, Duration::from_secs(5));
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/push.v1.PusherService/Push");
    assert_eq!(r.header("content-type"), Some("application/proto"));
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert!(r.body.starts_with(&[0x1f, 0x8b]), "body is gzipped");
    assert_eq!(r.header("authorization"), Some("Basic dXNlcjpwYTpzcw=="));
    assert_eq!(r.header("x-scope-orgid"), Some("tenant-1"));
    assert_eq!(r.header("x-extra"), Some("yes"));
    let agent = r.header("user-agent").expect("user-agent");
    assert_eq!(
        agent,
        format!("otel-profiling/{}", env!("CARGO_PKG_VERSION"))
    );

    let series = r.push();
    assert_eq!(series.len(), 1);
    let labels: Vec<(&str, &str)> = series[0]
        .labels
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            ("__name__", "process_cpu"),
            ("env", "dev"),
            ("service_name", "checkout"),
            ("service_version", "1.2.3"),
        ]
    );
    let (raw, id) = only_sample(r);
    assert_eq!(
        raw, sent.gzip_pprof,
        "raw_profile is the gzipped pprof as given"
    );
    assert_eq!(id.len(), 36, "{id}");
    assert_eq!(id.as_bytes()[14], b'4', "UUID v4: {id}");
    let span_labels = sample_labels(&raw);
    assert!(span_labels.contains(&("span_id".into(), format!("{SPAN_ID:016x}"))));
    assert!(span_labels.contains(&("trace_id".into(), format!("{TRACE_ID:032x}"))));

    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.profiles_sent == 1);
    assert_eq!(
        (s.profiles_sent, s.profiles_queued, s.bytes_queued),
        (1, 0, 0)
    );

    // The bearer variant, without tenant.
    let bearer = Receiver::ok(fresh_listener());
    let mut exporter = PyroscopeExporter::new(
        PyroscopeConfig::new(bearer.url(), "checkout").with_bearer_token("tok-123"),
    )
    .expect("exporter");
    exporter.export(&profile(SPAN_ID)).expect("export");
    let requests = bearer.wait_for(1, Duration::from_secs(5));
    assert_eq!(requests[0].header("authorization"), Some("Bearer tok-123"));
    assert_eq!(requests[0].header("x-scope-orgid"), None);
}

/// Issue 11 item 3: blocked-in-poll profiles are pushed beside CPU ones, to the same
/// service, as the `block` profile type, with their span labels.
#[test]
fn blocked_profiles_are_pushed_as_the_block_type_beside_cpu() {
    let receiver = Receiver::ok(fresh_listener());
    let mut exporter =
        PyroscopeExporter::new(config(&receiver.url()).with_label("env", "dev")).expect("exporter");
    let start = SystemTime::now();
    let mut builder = ProfileBuilder::blocked(start, Duration::from_secs(10));
    let frame = SymbolizedFrame {
        address: 0x1000,
        lines: vec![FrameLine {
            function: "app::read_inventory_file_synchronously".into(),
            file: None,
            line: None,
        }],
    };
    let labels = SampleLabels {
        span_id: Some(SPAN_ID),
        trace_id: Some(TRACE_ID),
        span_name: Some("GET /blocking".into()),
    };
    builder.add_blocked(&[frame], &labels, 1, 250_000_000);
    let blocked = EncodedProfile {
        kind: ProfileKind::Blocked,
        start,
        duration: Duration::from_secs(10),
        samples: 1,
        gzip_pprof: pprof::encode_gzip(&builder.build()).expect("encode"),
    };
    exporter.export(&profile(SPAN_ID)).expect("cpu");
    exporter.export(&blocked).expect("blocked");
    let requests = receiver.wait_for(2, Duration::from_secs(5));
    assert_eq!(requests.len(), 2);
    let names: Vec<Vec<(String, String)>> =
        requests.iter().map(|r| r.push().remove(0).labels).collect();
    let label = |labels: &[(String, String)], name: &str| {
        labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(label(&names[0], "__name__").as_deref(), Some("process_cpu"));
    assert_eq!(
        label(&names[1], "__name__").as_deref(),
        Some(BLOCK_PROFILE_NAME)
    );
    for labels in &names {
        assert_eq!(label(labels, "service_name").as_deref(), Some("checkout"));
        assert_eq!(label(labels, "env").as_deref(), Some("dev"));
    }
    let (raw, _) = only_sample(&requests[1]);
    assert_eq!(raw, blocked.gzip_pprof);
    let decoded = otel_profiling_pprof::decode(&raw).expect("pprof");
    let s = |i: i64| decoded.string_table[i as usize].clone();
    let types: Vec<String> = decoded
        .sample_type
        .iter()
        .map(|t| format!("{}:{}", s(t.r#type), s(t.unit)))
        .collect();
    // With `__name__=block`, Pyroscope stores the two series of Go's block profile.
    let period = decoded.period_type.as_ref().expect("period type");
    let period = format!("{}:{}", s(period.r#type), s(period.unit));
    assert_eq!(
        format!("{BLOCK_PROFILE_NAME}:{}:{period}", types[1]),
        BLOCK_DELAY_PROFILE_TYPE_ID
    );
    assert_eq!(
        format!("{BLOCK_PROFILE_NAME}:{}:{period}", types[0]),
        BLOCK_CONTENTIONS_PROFILE_TYPE_ID
    );
    assert_eq!(decoded.sample[0].value, [1, 250_000_000]);
    assert!(sample_labels(&raw).contains(&("span_id".into(), format!("{SPAN_ID:016x}"))));
}

/// Issue 43: allocation profiles are pushed as Pyroscope's `memory` type, marked as
/// per-interval values (`__delta__="false"`: Pyroscope would otherwise take its alloc
/// series as Go's cumulative heap profile and subtract one push from the next), with
/// their span labels, so span selection works for them as for CPU.
#[test]
fn allocation_profiles_are_pushed_as_the_memory_type_not_cumulative() {
    let receiver = Receiver::ok(fresh_listener());
    let mut exporter = PyroscopeExporter::new(config(&receiver.url())).expect("exporter");
    let start = SystemTime::now();
    let mut builder = ProfileBuilder::allocations(524_288, start, Duration::from_secs(10));
    let frame = SymbolizedFrame {
        address: 0x1000,
        lines: vec![FrameLine {
            function: "app::parse_order".into(),
            file: None,
            line: None,
        }],
    };
    let span_labels = SampleLabels {
        span_id: Some(SPAN_ID),
        trace_id: Some(TRACE_ID),
        span_name: Some("POST /orders".into()),
    };
    builder.add_allocations(std::slice::from_ref(&frame), &span_labels, 120, 9_437_184);
    let alloc = EncodedProfile {
        kind: ProfileKind::Alloc,
        start,
        duration: Duration::from_secs(10),
        samples: 18,
        gzip_pprof: pprof::encode_gzip(&builder.build()).expect("encode"),
    };
    exporter.export(&profile(SPAN_ID)).expect("cpu");
    exporter.export(&alloc).expect("alloc");
    let requests = receiver.wait_for(2, Duration::from_secs(5));
    let labels: Vec<Vec<(String, String)>> =
        requests.iter().map(|r| r.push().remove(0).labels).collect();
    let label = |labels: &[(String, String)], name: &str| {
        labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(label(&labels[0], "__delta__"), None, "CPU as before");
    assert_eq!(
        label(&labels[1], "__name__").as_deref(),
        Some(ALLOC_PROFILE_NAME)
    );
    assert_eq!(label(&labels[1], "__delta__").as_deref(), Some("false"));
    assert_eq!(
        label(&labels[1], "service_name").as_deref(),
        Some("checkout")
    );
    let names: Vec<&str> = labels[1].iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.windows(2).all(|w| w[0] <= w[1]), "sorted: {names:?}");
    let (raw, _) = only_sample(&requests[1]);
    let (ids, values) = memory_type_ids(&raw);
    assert_eq!(
        ids,
        [ALLOC_OBJECTS_PROFILE_TYPE_ID, ALLOC_SPACE_PROFILE_TYPE_ID]
    );
    assert_eq!(values, [120, 9_437_184]);
    assert!(sample_labels(&raw).contains(&("span_id".into(), format!("{SPAN_ID:016x}"))));

    // With in-use tracking: Go's whole heap profile, four series of one push.
    let mut heap = ProfileBuilder::heap(524_288, start, Duration::from_secs(10));
    heap.add_allocations(std::slice::from_ref(&frame), &span_labels, 120, 9_437_184);
    heap.add_inuse(&[frame], &span_labels, 30, 2_097_152);
    let heap = EncodedProfile {
        gzip_pprof: pprof::encode_gzip(&heap.build()).expect("encode"),
        ..alloc
    };
    exporter.export(&heap).expect("heap");
    let requests = receiver.wait_for(3, Duration::from_secs(5));
    let pushed = requests[2].push().remove(0).labels;
    assert_eq!(label(&pushed, "__delta__").as_deref(), Some("false"));
    let (raw, _) = only_sample(&requests[2]);
    let (ids, values) = memory_type_ids(&raw);
    assert_eq!(
        ids,
        [
            ALLOC_OBJECTS_PROFILE_TYPE_ID,
            ALLOC_SPACE_PROFILE_TYPE_ID,
            INUSE_OBJECTS_PROFILE_TYPE_ID,
            INUSE_SPACE_PROFILE_TYPE_ID
        ]
    );
    assert_eq!(values, [120, 9_437_184, 30, 2_097_152]);
}

/// The Pyroscope profile type ids of a pushed `memory` pprof's sample types, and its first
/// sample's values.
fn memory_type_ids(raw: &[u8]) -> (Vec<String>, Vec<i64>) {
    let decoded = otel_profiling_pprof::decode(raw).expect("pprof");
    let s = |i: i64| decoded.string_table[i as usize].clone();
    let period = decoded.period_type.as_ref().expect("period type");
    let period = format!("{}:{}", s(period.r#type), s(period.unit));
    let ids = decoded
        .sample_type
        .iter()
        .map(|t| {
            format!(
                "{ALLOC_PROFILE_NAME}:{}:{}:{period}",
                s(t.r#type),
                s(t.unit)
            )
        })
        .collect();
    (ids, decoded.sample[0].value.clone())
}

#[test]
fn one_request_per_export_in_order() {
    let receiver = Receiver::ok(fresh_listener());
    let mut exporter = PyroscopeExporter::new(config(&receiver.url())).expect("exporter");
    let profiles: Vec<EncodedProfile> = (1..=5).map(profile).collect();
    for p in &profiles {
        exporter.export(p).expect("export");
    }
    let requests = receiver.wait_for(5, Duration::from_secs(5));
    assert_eq!(requests.len(), 5);
    let mut ids = HashSet::new();
    for (request, expected) in requests.iter().zip(&profiles) {
        let (raw, id) = only_sample(request);
        assert_eq!(raw, expected.gzip_pprof, "in export order");
        assert!(ids.insert(id), "each profile has its own ID");
    }
    drop(exporter);
    assert_eq!(receiver.requests().len(), 5, "nothing sent twice");
}

#[test]
fn a_503_is_retried_and_delivered_once() {
    let receiver = Receiver::answering(
        fresh_listener(),
        Box::new(|i, _| match i {
            0 => (
                503,
                vec![],
                br#"{"code":"unavailable","message":"ingester restarting"}"#.to_vec(),
            ),
            _ => (200, vec![], b"{}".to_vec()),
        }),
    );
    let mut exporter = PyroscopeExporter::new(config(&receiver.url())).expect("exporter");
    let stats = exporter.stats();
    exporter.export(&profile(SPAN_ID)).expect("export");
    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.profiles_sent == 1);
    drop(exporter);
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2, "one failure, one retry");
    let ids: HashSet<String> = requests.iter().map(|r| only_sample(r).1).collect();
    assert_eq!(ids.len(), 1, "the retry is the same profile");
    assert_eq!(requests[0].body, requests[1].body);
    assert_eq!(
        (
            s.profiles_sent,
            s.retries,
            s.profiles_failed,
            s.profiles_dropped
        ),
        (1, 1, 0, 0)
    );
    let last = stats.last_error().expect("last error");
    assert!(
        last.contains("503") && last.contains("unavailable"),
        "{last}"
    );
}

#[test]
fn a_429_retry_after_is_honoured_up_to_the_max_backoff() {
    let receiver = Receiver::answering(
        fresh_listener(),
        Box::new(|i, _| match i {
            0 => (429, vec![("Retry-After", "30".to_string())], vec![]),
            _ => (200, vec![], b"{}".to_vec()),
        }),
    );
    let config = config(&receiver.url()).with_backoff(PyroscopeBackoff::new(
        Duration::from_millis(5),
        Duration::from_millis(300),
        8,
    ));
    let mut exporter = PyroscopeExporter::new(config).expect("exporter");
    let stats = exporter.stats();
    exporter.export(&profile(SPAN_ID)).expect("export");
    let start = Instant::now();
    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.profiles_sent == 1);
    let elapsed = start.elapsed();
    assert_eq!((s.profiles_sent, s.retries), (1, 1));
    // Retry-After 30 s, capped at the 300 ms maximum (full jitter alone would be ≤ 5 ms).
    assert!(elapsed >= Duration::from_millis(280), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[test]
fn a_400_is_not_retried() {
    let receiver = Receiver::answering(
        fresh_listener(),
        Box::new(|_, _| {
            (
                400,
                vec![],
                br#"{"code":"invalid_argument","message":"invalid labels"}"#.to_vec(),
            )
        }),
    );
    let mut exporter = PyroscopeExporter::new(config(&receiver.url())).expect("exporter");
    let stats = exporter.stats();
    exporter.export(&profile(SPAN_ID)).expect("export");
    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.profiles_failed == 1);
    // Several backoff periods later, still one request.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.requests().len(), 1);
    assert_eq!(
        (
            s.profiles_failed,
            s.retries,
            s.profiles_sent,
            s.profiles_dropped
        ),
        (1, 0, 0, 0)
    );
    let last = stats.last_error().expect("last error");
    assert!(
        last.contains("400") && last.contains("invalid_argument"),
        "{last}"
    );
}

/// One timed `export` call.
#[derive(Debug, Clone, Copy)]
struct Timed {
    wall: Duration,
    /// The scheduler took the CPU away during the call (an involuntary context switch)
    /// without the call itself ever waiting (no voluntary switch: no lock wait, no I/O).
    preempted: bool,
}

/// Context switches of this thread so far: (voluntary, involuntary).
fn context_switches() -> (i64, i64) {
    // SAFETY: `rusage` is plain data, valid when zeroed; getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid out pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    (usage.ru_nvcsw, usage.ru_nivcsw)
}

/// Times `n` exports of ~10 KiB; checks the queue bound after each.
fn export_burst(
    exporter: &mut PyroscopeExporter,
    stats: &PyroscopeStats,
    n: u64,
    max_bytes: u64,
) -> Vec<Timed> {
    let mut times = Vec::new();
    for i in 0..n {
        let p = blob(10 * 1024, i + 1);
        let (voluntary, involuntary) = context_switches();
        let t = Instant::now();
        exporter.export(&p).expect("export");
        let wall = t.elapsed();
        let (voluntary_after, involuntary_after) = context_switches();
        times.push(Timed {
            wall,
            preempted: voluntary_after == voluntary && involuntary_after > involuntary,
        });
        let queued = stats.snapshot().bytes_queued;
        assert!(queued <= max_bytes, "bytes_queued {queued} > {max_bytes}");
    }
    times
}

/// Every call under 1 ms unless the scheduler preempted it (2 cores, several busy
/// threads); none waited for anything; all together under 200 ms.
fn assert_fast(times: &[Timed]) {
    let total: Duration = times.iter().map(|t| t.wall).sum();
    assert!(total < Duration::from_millis(200), "total {total:?}");
    for (i, t) in times.iter().enumerate() {
        assert!(
            t.wall < Duration::from_millis(1)
                || (t.preempted && t.wall < Duration::from_millis(50)),
            "export call {i} took {:?} (preempted: {})",
            t.wall,
            t.preempted
        );
    }
}

#[test]
fn down_then_black_holed_never_blocks_and_counts_every_loss() {
    const MAX: usize = 64 * 1024;
    let addr = closed_port();
    let shutdown = Duration::from_millis(500);
    let config = PyroscopeConfig::new(format!("http://{addr}"), "checkout")
        .with_max_queue_bytes(MAX)
        .with_request_timeout(Duration::from_secs(3))
        .with_shutdown_timeout(shutdown)
        .with_backoff(PyroscopeBackoff::new(
            Duration::from_millis(5),
            Duration::from_millis(20),
            3,
        ));
    let mut exporter = PyroscopeExporter::new(config).expect("exporter");
    let stats = exporter.stats();

    // Down: connections refused.
    let down = export_burst(&mut exporter, &stats, 200, MAX as u64);
    assert_fast(&down);

    // Black-holed: connections accepted, never answered.
    let hole = Receiver::black_hole(rebind(addr));
    let until = Instant::now() + Duration::from_secs(5);
    let mut holed = Vec::new();
    while hole.accepted.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        holed.extend(export_burst(&mut exporter, &stats, 1, MAX as u64));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        hole.accepted.load(Ordering::SeqCst) > 0,
        "the uploader reached the black hole"
    );
    holed.extend(export_burst(&mut exporter, &stats, 200, MAX as u64));
    assert_fast(&holed[holed.len() - 200..]);
    let exported = 200 + holed.len() as u64;

    let before = stats.snapshot();
    assert!(before.profiles_queued > 0, "{before:?}");
    assert!(before.bytes_queued <= MAX as u64);

    let t = Instant::now();
    drop(exporter);
    let took = t.elapsed();
    assert!(
        took < shutdown + Duration::from_secs(1),
        "drop took {took:?}"
    );

    let s = stats.snapshot();
    assert_eq!((s.profiles_queued, s.bytes_queued), (0, 0), "{s:?}");
    assert_eq!(s.profiles_sent, 0, "nothing was answered: {s:?}");
    assert_eq!(s.profiles_failed, 0, "{s:?}");
    assert_eq!(
        s.profiles_sent + s.profiles_failed + s.profiles_dropped + s.profiles_queued,
        exported,
        "every export is accounted for: {s:?}"
    );
    assert!(hole.requests().is_empty());
}

#[test]
fn sending_resumes_when_the_receiver_comes_back() {
    let addr = closed_port();
    let config = PyroscopeConfig::new(format!("http://{addr}"), "checkout").with_backoff(
        PyroscopeBackoff::new(Duration::from_millis(10), Duration::from_millis(100), 1000),
    );
    let mut exporter = PyroscopeExporter::new(config).expect("exporter");
    let stats = exporter.stats();
    let profiles: Vec<EncodedProfile> = (1..=3).map(profile).collect();
    for p in &profiles {
        exporter.export(p).expect("export");
    }
    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.retries >= 2);
    assert!(s.retries >= 2 && s.profiles_sent == 0, "{s:?}");
    assert_eq!(s.profiles_queued, 3);

    let receiver = Receiver::ok(rebind(addr));
    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.profiles_sent == 3);
    assert_eq!(
        (s.profiles_sent, s.profiles_dropped, s.profiles_queued),
        (3, 0, 0)
    );
    let late = profile(4);
    exporter.export(&late).expect("export");
    let requests = receiver.wait_for(4, Duration::from_secs(5));
    let raws: Vec<Vec<u8>> = requests.iter().map(|r| only_sample(r).0).collect();
    let expected: Vec<Vec<u8>> = profiles
        .iter()
        .chain([&late])
        .map(|p| p.gzip_pprof.clone())
        .collect();
    assert_eq!(
        raws, expected,
        "queued profiles arrive, in order, once each"
    );
}

#[test]
fn drop_sends_what_is_queued() {
    let receiver = Receiver::answering(
        fresh_listener(),
        Box::new(|_, _| {
            std::thread::sleep(Duration::from_millis(30));
            (200, vec![], b"{}".to_vec())
        }),
    );
    let mut exporter = PyroscopeExporter::new(config(&receiver.url())).expect("exporter");
    let stats = exporter.stats();
    for i in 1..=4 {
        exporter.export(&profile(i)).expect("export");
    }
    drop(exporter);
    assert_eq!(stats.snapshot().profiles_sent, 4);
    assert_eq!(receiver.requests().len(), 4);
}

#[test]
fn config_errors_name_the_field() {
    let error = |config: PyroscopeConfig| {
        PyroscopeExporter::new(config)
            .expect_err("invalid config")
            .to_string()
    };
    let e = error(PyroscopeConfig::new("ftp://localhost:4040", "app"));
    assert!(
        e.starts_with("pyroscope.server_address:") && e.contains("ftp"),
        "{e}"
    );
    let e = error(PyroscopeConfig::new("http://localhost:4040/?x=1", "app"));
    assert!(
        e.starts_with("pyroscope.server_address:") && e.contains("query"),
        "{e}"
    );
    let e = error(PyroscopeConfig::new("localhost:4040", "app"));
    assert!(e.starts_with("pyroscope.server_address:"), "{e}");
    let e = error(PyroscopeConfig::new("http://localhost:4040", ""));
    assert!(e.starts_with("pyroscope.application_name:"), "{e}");
    let e = error(PyroscopeConfig::new("http://localhost:4040", "app").with_label("bad-name", "x"));
    assert!(
        e.starts_with("pyroscope.labels:") && e.contains("bad-name"),
        "{e}"
    );
    let e = error(PyroscopeConfig::new("http://localhost:4040", "app").with_label("__name__", "x"));
    assert!(e.contains("__name__"), "{e}");
    let e = error(
        PyroscopeConfig::new("http://localhost:4040", "app").with_header("Content-Type", "x"),
    );
    assert!(e.starts_with("pyroscope.headers:"), "{e}");
    let e = error(PyroscopeConfig::new("http://localhost:4040", "app").with_max_queue_bytes(0));
    assert!(e.starts_with("pyroscope.max_queue_bytes:"), "{e}");
    assert!(
        PyroscopeConfig::new("https://profiles.example.com/prefix", "app")
            .with_label("service_version", "1")
            .validate()
            .is_ok()
    );
}

#[test]
fn debug_redacts_secrets() {
    let config = PyroscopeConfig::new("http://localhost:4040", "app")
        .with_basic_auth("alice", "hunter2-password")
        .with_header("X-Api-Key", "k3y-value")
        .with_header("Authorization-Extra", "abc-secret-header")
        .with_header("X-Request-Source", "visible-value")
        .with_tenant_id("tenant-7");
    let text = format!("{config:?}");
    for secret in ["hunter2-password", "k3y-value", "abc-secret-header"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    assert!(text.contains("***") && text.contains("alice") && text.contains("visible-value"));
    assert!(text.contains("tenant-7"));
    let bearer = format!(
        "{:?}",
        PyroscopeConfig::new("http://localhost:4040", "app").with_bearer_token("tok-very-secret")
    );
    assert!(
        !bearer.contains("tok-very-secret") && bearer.contains("***"),
        "{bearer}"
    );
    let exporter = PyroscopeExporter::new(config).expect("exporter");
    let text = format!("{exporter:?}");
    assert!(!text.contains("hunter2") && !text.contains("k3y"), "{text}");
}

/// A real profile of `n` samples, each under its own span (so none merge), over a few
/// hundred distinct stacks 20 frames deep.
fn big_profile(n: u64) -> EncodedProfile {
    let start = SystemTime::now();
    let duration = Duration::from_secs(10);
    let mut builder = ProfileBuilder::new(10_000_000, start, duration);
    for i in 0..n {
        let stack: Vec<SymbolizedFrame> = (0..20u64)
            .map(|d| {
                let f = (i % 251) * 32 + d;
                SymbolizedFrame {
                    address: 0x10_0000 + f * 16,
                    lines: vec![FrameLine {
                        function: format!("service::handlers::module_{}::function_{f}", f % 17)
                            .into(),
                        file: Some("src/handlers.rs".into()),
                        line: Some(f as u32),
                    }],
                }
            })
            .collect();
        let labels = SampleLabels {
            span_id: Some(0x1_0000 + i),
            trace_id: Some(u128::from(i) << 64 | 1),
            span_name: Some(format!("GET /items/{}", i % 40).into()),
        };
        builder.add_sample(&stack, &labels, 1 + i % 4);
    }
    EncodedProfile {
        kind: ProfileKind::Cpu,
        start,
        duration,
        samples: n,
        gzip_pprof: pprof::encode_gzip(&builder.build()).expect("encode"),
    }
}

/// (span_id label, value) of every sample of every profile of every push.
fn received_samples(requests: &[Request]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for request in requests {
        for series in request.push() {
            for (raw, _) in &series.samples {
                let p = otel_profiling_pprof::decode(raw).expect("pprof");
                for sample in &p.sample {
                    let span = sample
                        .label
                        .iter()
                        .find(|l| p.string_table[l.key as usize] == "span_id")
                        .map(|l| p.string_table[l.str as usize].clone())
                        .unwrap_or_default();
                    out.push((span, sample.value[0]));
                }
            }
        }
    }
    out.sort();
    out
}

/// Profiles over Pyroscope's limits are split so that every profile and every push fits,
/// keeping every sample, its labels and the interval's timestamps: at the default limits
/// and with them lowered tenfold.
#[test]
fn large_profiles_are_split_to_fit_the_limits() {
    use otel_profiling::export::pyroscope::PyroscopeLimits;
    use prost::Message as _;
    let whole = big_profile(40_000);
    let decoded = otel_profiling_pprof::decode(&whole.gzip_pprof).expect("pprof");
    let expected = received_samples(&[Request {
        method: "POST".into(),
        path: String::new(),
        headers: vec![],
        body: otel_profiling_test_push(&whole.gzip_pprof),
    }]);
    eprintln!(
        "whole profile: {} samples, {} bytes uncompressed, {} gzipped",
        decoded.sample.len(),
        decoded.encoded_len(),
        whole.gzip_pprof.len()
    );
    let defaults = PyroscopeLimits::default();
    let tenth = PyroscopeLimits::default()
        .with_max_samples_per_profile(defaults.max_samples_per_profile / 10)
        .with_max_profile_bytes(defaults.max_profile_bytes / 10)
        .with_max_push_bytes(defaults.max_push_bytes / 10);
    for limits in [defaults, tenth] {
        let receiver = Receiver::ok(fresh_listener());
        let mut exporter = PyroscopeExporter::new(
            config(&receiver.url())
                .with_limits(limits)
                .with_max_queue_bytes(64 << 20),
        )
        .expect("exporter");
        let stats = exporter.stats();
        exporter.export(&whole).expect("export");
        drop(exporter);
        let requests = receiver.requests();
        let snapshot = stats.snapshot();
        let mut profiles = 0;
        for request in &requests {
            let mut push_bytes = 0;
            for series in request.push() {
                for (raw, _) in &series.samples {
                    let p = otel_profiling_pprof::decode(raw).expect("pprof part");
                    assert!(
                        p.sample.len() <= limits.max_samples_per_profile,
                        "{limits:?}"
                    );
                    assert!(p.encoded_len() <= limits.max_profile_bytes, "{limits:?}");
                    assert_eq!(p.time_nanos, decoded.time_nanos, "interval start kept");
                    assert_eq!(p.duration_nanos, decoded.duration_nanos, "duration kept");
                    push_bytes += p.encoded_len();
                    profiles += 1;
                }
            }
            assert!(
                push_bytes <= limits.max_push_bytes,
                "{limits:?}: push of {push_bytes}"
            );
        }
        eprintln!(
            "{limits:?}: {} pushes, {profiles} profiles, {snapshot:?}",
            requests.len()
        );
        assert!(profiles >= 3, "{limits:?}: split into {profiles}");
        assert_eq!(snapshot.profiles_split, 1);
        assert_eq!(snapshot.split_parts, profiles as u64);
        assert_eq!(snapshot.profiles_sent, requests.len() as u64);
        assert_eq!(
            received_samples(&requests),
            expected,
            "{limits:?}: every sample kept"
        );
    }
}

/// The body of a one-profile push, as the receiver's decoder expects it (test helper).
fn otel_profiling_test_push(raw: &[u8]) -> Vec<u8> {
    // PushRequest{series: [RawProfileSeries{samples: [RawSample{raw_profile}]}]}, by hand.
    fn field(number: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3 | 2) as u8];
        let mut len = payload.len() as u64;
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(payload);
        out
    }
    field(1, &field(2, &field(1, raw)))
}

/// A server whose ingestion burst is smaller than a push answers 429 every time: such a
/// push is split in two (and again) until the halves fit, never resent as is, and every
/// sample arrives once.
#[test]
fn a_push_over_the_servers_burst_is_split_never_resent_as_is() {
    use otel_profiling::export::pyroscope::PyroscopeLimits;
    const BURST: usize = 60_000;
    let receiver = Receiver::answering(
        fresh_listener(),
        Box::new(|_, request| {
            if request.payload().len() > BURST {
                (
                    429,
                    vec![],
                    br#"{"code":"resource_exhausted","message":"push rate limit exceeded"}"#
                        .to_vec(),
                )
            } else {
                (200, vec![], b"{}".to_vec())
            }
        }),
    );
    // Our own limits are above the server's burst: only its 429s make pushes smaller.
    let whole = big_profile(3_000);
    let mut exporter = PyroscopeExporter::new(
        config(&receiver.url()).with_limits(
            PyroscopeLimits::default()
                .with_max_push_bytes(4 << 20)
                .with_max_profile_bytes(4 << 20),
        ),
    )
    .expect("exporter");
    let stats = exporter.stats();
    exporter.export(&whole).expect("export");
    let s = wait_stats(&stats, Duration::from_secs(20), |s| {
        s.profiles_queued == 0 && s.profiles_sent > 0
    });
    drop(exporter);
    let requests = receiver.requests();
    let refused: Vec<&Request> = requests
        .iter()
        .filter(|r| r.payload().len() > BURST)
        .collect();
    let accepted: Vec<Request> = requests
        .iter()
        .filter(|r| r.payload().len() <= BURST)
        .cloned()
        .collect();
    eprintln!(
        "{} refused, {} accepted, {s:?}",
        refused.len(),
        accepted.len()
    );
    // No refused push was sent twice.
    let mut bodies = HashSet::new();
    for r in &refused {
        assert!(
            bodies.insert(r.payload()),
            "a push refused with 429 was resent as is"
        );
    }
    assert!(
        s.pushes_split >= 1 && s.rate_limited as usize == refused.len(),
        "{s:?}"
    );
    assert_eq!(s.profiles_dropped + s.profiles_failed, 0, "{s:?}");
    let expected = received_samples(&[Request {
        method: "POST".into(),
        path: String::new(),
        headers: vec![],
        body: otel_profiling_test_push(&whole.gzip_pprof),
    }]);
    assert_eq!(received_samples(&accepted), expected, "every sample once");
}

/// A 400 naming one of Pyroscope's limits is not retried, is counted as rejected, and the
/// logged error names the limit and the setting that avoids it.
#[test]
fn a_400_for_a_limit_names_the_limit() {
    let receiver = Receiver::answering(
        fresh_listener(),
        Box::new(|_, _| {
            (
                400,
                vec![],
                br#"{"code":"invalid_argument","message":"profile series '{service_name=\"checkout\"}' has 17000 samples, which exceeds the limit of 16000 (max_profile_stacktrace_samples)"}"#.to_vec(),
            )
        }),
    );
    let mut exporter = PyroscopeExporter::new(config(&receiver.url())).expect("exporter");
    let stats = exporter.stats();
    exporter.export(&profile(SPAN_ID)).expect("export");
    let s = wait_stats(&stats, Duration::from_secs(5), |s| s.profiles_failed == 1);
    assert_eq!((s.rejected, s.rate_limited, s.retries), (1, 0, 0), "{s:?}");
    let last = stats.last_error().expect("last error");
    assert!(
        last.contains("validation.max-profile-stacktrace-samples")
            && last.contains("pyroscope.limits.max_samples_per_profile"),
        "{last}"
    );
}
