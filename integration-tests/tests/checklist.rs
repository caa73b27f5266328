//! The verification checklist, run against the in-process stand-in (a stand-in for tests,
//! not a backend) or, with `TEMPO_URL`, `PYROSCOPE_URL` and `OTEL_EXPORTER_OTLP_ENDPOINT`
//! set, against a real stack. Each check also has a test proving it fails when what it
//! checks is broken.
//!
//! Recordings run in child processes (`checklist record ...`: the profiler is
//! process-global), one at a time so that they do not compete for the CPU.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use otel_profiling::export::pyroscope::{
    BLOCK_CONTENTIONS_PROFILE_TYPE_ID, BLOCK_DELAY_PROFILE_TYPE_ID, PROFILE_NAME, PROFILE_TYPE_ID,
};
use otel_profiling::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
use otel_profiling::PROFILE_ID_ATTRIBUTE;
use otel_profiling_cli::input::{otlp, Input};
use otel_profiling_cli::investigate::Evidence as InvestigateEvidence;
use otel_profiling_cli::report::SpanGroup;
use otel_profiling_cli::verdict::Verdict as ReportVerdict;
use otel_profiling_integration_tests::checklist::{
    check_blocked_in_poll, check_control, check_cpu_vs_io, check_investigate_matches_grafana,
    check_profile_link, check_recorded, reads_cpu_heavy, record_all, selection_differences,
    Backends, GrafanaSelection, InvestigateSelection, Recordings, INVESTIGATE_TITLE,
};
use otel_profiling_integration_tests::clients::{
    to_hex, OtlpClient, PushClient, SpanProfileQuery, TraceSpan,
};
use otel_profiling_integration_tests::recorder::{
    record_in_child, unique_service_name, RecordedOp,
};
use otel_profiling_integration_tests::standin::StandIn;
use otel_profiling_integration_tests::workload::{
    RecordSpec, Scenario, AWAITING_SPAN, BLOCKING_SPAN, CPU_FUNCTION, CPU_SPAN, IO_SPAN,
    SERIALIZE_FUNCTION,
};

const CHECKLIST_EXE: &str = env!("CARGO_BIN_EXE_checklist");

struct Fixture {
    standin: Option<Arc<StandIn>>,
    backends: Backends,
    recordings: Result<Recordings, String>,
}

/// Serializes child recordings (CPU ratios must not suffer from competing children).
fn children() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The backends (the stand-in unless the environment names a stack) and the recordings
/// of the four checks, made once per test process.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let (standin, backends) = match Backends::from_env() {
            Some(b) => (None, b.expect("the stack's settings are valid")),
            None => {
                let s = Arc::new(StandIn::start().expect("stand-in starts on 127.0.0.1:0"));
                let url = s.url();
                (
                    Some(s),
                    // Polls end as soon as the data is there; the bound only matters on a
                    // loaded machine, where a child's last push can take seconds to land.
                    Backends::new(&url, &url, &url, Duration::from_secs(8))
                        .expect("the stand-in's URL is valid"),
                )
            }
        };
        let recordings = {
            let _lock = children();
            record_all(CHECKLIST_EXE.as_ref(), &backends)
        };
        Fixture {
            standin,
            backends,
            recordings,
        }
    })
}

fn recordings() -> &'static Recordings {
    match &fixture().recordings {
        Ok(r) => r,
        Err(e) => panic!("recording the operations failed: {e}"),
    }
}

fn record(scenario: Scenario, profile_id: bool) -> Vec<RecordedOp> {
    let b = &fixture().backends;
    let spec = RecordSpec {
        otlp_endpoint: b.otlp_endpoint.clone(),
        pyroscope_url: b.pyroscope_url.clone(),
        service_name: unique_service_name(scenario.name()),
        service_version: "2.0.0".into(),
        scenario,
        profile_id,
        profiles_over_otlp: false,
    };
    let _lock = children();
    record_in_child(CHECKLIST_EXE.as_ref(), &spec).expect("recording")
}

fn find<'a>(ops: &'a [RecordedOp], name: &str) -> &'a RecordedOp {
    ops.iter().find(|o| o.name == name).expect("span recorded")
}

// ---- The checklist, green ----

#[test]
fn check1_trace_and_profile_are_available() {
    let r = check_recorded(&fixture().backends, &recordings().cpu, CPU_FUNCTION);
    println!("{r}");
    assert!(r.passed, "{r}");
    let e = &r.evidence[0];
    assert_eq!(e.trace_id.len(), 32);
    assert_eq!(e.span_id.len(), 16);
    assert!(e.cpu_ms.unwrap() > 0.0 && e.wall_ms.unwrap() > 0.0);
    assert!(
        e.top_function.as_deref().unwrap().contains(CPU_FUNCTION),
        "{r}"
    );
}

#[test]
fn check2_profile_id_and_grafana_query_select_this_operation_only() {
    let r = check_profile_link(&fixture().backends, &recordings().cpu, CPU_FUNCTION);
    println!("{r}");
    assert!(r.passed, "{r}");
    assert!(r.evidence[0]
        .notes
        .iter()
        .any(|n| n.contains("another service_version")));
    assert!(r.evidence[0]
        .notes
        .iter()
        .any(|n| n.contains("another service_name")));
}

#[test]
fn check3_cpu_heavy_span_vs_io_bound_span() {
    let rec = recordings();
    let r = check_cpu_vs_io(&fixture().backends, &rec.cpu, &rec.io, CPU_FUNCTION);
    println!("{r}");
    assert!(r.passed, "{r}");
    let (cpu, io) = (&r.evidence[0], &r.evidence[1]);
    // The report's verdicts: CPU-bound, or waiting for a CPU on a busy machine (seen in
    // CI: 200 ms of CPU in 401 ms, 178 ms of it waiting for a CPU).
    assert!(
        cpu.notes[0].contains(": CPU-bound — ") || cpu.notes[0].contains(": waiting for a CPU — "),
        "{r}"
    );
    assert!(cpu.cpu_ms.unwrap() > 0.0);
    assert!(io.wall_ms.unwrap() >= 100.0);
    assert!(io.cpu_ms.unwrap() < 0.1 * io.wall_ms.unwrap());
    // It sleeps in a synchronous call: its thread is held off CPU inside it.
    assert!(io.notes[0].contains(": blocked in poll — "), "{r}");
}

#[test]
fn check4_control_older_version_spends_far_less_in_the_regression() {
    let rec = recordings();
    let r = check_control(
        &fixture().backends,
        &rec.report_old,
        &rec.report_new,
        SERIALIZE_FUNCTION,
    );
    println!("{r}");
    assert!(r.passed, "{r}");
    assert_eq!(rec.report_old.response_bytes, rec.report_new.response_bytes);
}

/// The checks take their verdicts from the span report (`report_verdict`): one root span
/// as the bridge writes it, `wall_ms` long, with its CPU, active time and run delay.
fn group_of(wall_ms: u64, cpu_ms: u64, active_ms: u64, runqueue_ms: u64) -> SpanGroup {
    let ms = |v: u64| (v * 1_000_000).to_string();
    let line = serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
    "traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "00000000000000ab",
    "name": "GET /x", "startTimeUnixNano": "1000000000",
    "endTimeUnixNano": (1_000_000_000 + wall_ms * 1_000_000).to_string(),
    "attributes": [
        {"key": "pyroscope.profile.id", "value": {"stringValue": "00000000000000ab"}},
        {"key": "profiling.cpu.samples", "value": {"intValue": (cpu_ms / 10).to_string()}},
        {"key": "profiling.cpu.time_ns", "value": {"intValue": ms(cpu_ms)}},
        {"key": "profiling.wall.active_ns", "value": {"intValue": ms(active_ms)}},
        {"key": "profiling.wall.runqueue_ns", "value": {"intValue": ms(runqueue_ms)}},
    ]}]}]}]});
    let input = Input {
        spans: otlp::spans_from_json(&line).expect("a span"),
        span_files: 1,
        ..Input::default()
    };
    let span = &input.spans[0];
    SpanGroup::of_spans(&input, "GET /x", None, &[span])
}

/// A slow span that computed nothing is waiting, never fast; and the CI failure this
/// guards: a 200 ms CPU-heavy span stretched to 420 ms by another process on the CPUs
/// (210 ms of run delay) still reads CPU-heavy, never "mixed".
#[test]
fn the_checks_read_verdicts_as_the_report_gives_them() {
    let idle = group_of(800, 0, 1, 0);
    assert_eq!(idle.verdict, ReportVerdict::Waiting, "{}", idle.reason);
    assert!(!reads_cpu_heavy(&idle));
    let computing = group_of(800, 500, 800, 0);
    assert_eq!(computing.verdict, ReportVerdict::CpuBound);
    assert!(reads_cpu_heavy(&computing));
    let preempted = group_of(420, 200, 415, 210);
    assert!(
        reads_cpu_heavy(&preempted),
        "{}: {}",
        preempted.verdict,
        preempted.reason
    );
    let half = group_of(800, 200, 250, 0);
    assert!(!reads_cpu_heavy(&half), "{}: {}", half.verdict, half.reason);
}

// ---- Each check fails when what it checks is broken ----

#[test]
fn check2_fails_without_the_profile_id_attribute() {
    let ops = record(Scenario::CpuAndIo, false);
    let r = check_profile_link(&fixture().backends, find(&ops, CPU_SPAN), CPU_FUNCTION);
    println!("{r}");
    assert!(!r.passed, "{r}");
    assert!(r.reason.contains(PROFILE_ID_ATTRIBUTE), "{r}");
}

#[test]
fn check3_fails_when_the_io_span_burns_cpu() {
    let ops = record(Scenario::CpuAndBusyIo, true);
    let b = &fixture().backends;
    let r = check_cpu_vs_io(b, find(&ops, CPU_SPAN), find(&ops, IO_SPAN), CPU_FUNCTION);
    println!("{r}");
    assert!(!r.passed, "{r}");
    assert!(r.reason.contains("I/O-bound span"), "{r}");
}

#[test]
fn check5_a_span_blocking_its_worker_is_blocked_in_poll_not_waiting() {
    let rec = recordings();
    let r = check_blocked_in_poll(&fixture().backends, &rec.blocking, &rec.awaiting);
    println!("{r}");
    assert!(r.passed, "{r}");
    assert!(r.evidence[0].notes[0].contains("blocked in poll"), "{r}");
    assert!(r.evidence[1].notes[0].contains("awaiting"), "{r}");
}

#[test]
fn check5_fails_when_the_blocking_span_awaits_instead() {
    let ops = record(Scenario::AwaitingTwice, true);
    let b = &fixture().backends;
    let r = check_blocked_in_poll(b, find(&ops, BLOCKING_SPAN), find(&ops, AWAITING_SPAN));
    println!("{r}");
    assert!(!r.passed, "{r}");
    assert!(r.reason.contains("blocking span"), "{r}");
}

#[test]
fn check6_investigate_selects_the_profile_grafana_selects() {
    let rec = recordings();
    let r = check_investigate_matches_grafana(&fixture().backends, &rec.cpu, CPU_FUNCTION);
    println!("{r}");
    assert!(r.passed, "{r}");
    assert_eq!(r.number, 6);
    assert_eq!(r.title, INVESTIGATE_TITLE);
    let e = &r.evidence[0];
    assert_eq!(e.span_id, rec.cpu.span_id);
    assert!(e.cpu_ms.unwrap() > 0.0, "{r}");
    assert!(e.notes.iter().any(|n| n.contains("evidence Span")), "{r}");
}

/// Check 6's comparison on hand-made selections: the same selection passes; each
/// difference (series, span, profile type, interval, evidence, CPU) fails, naming it.
#[test]
fn check6_comparison_names_what_differs() {
    let span = "00f067aa0ba902b7";
    let grafana_query = SpanProfileQuery {
        profile_type_id: PROFILE_TYPE_ID.to_string(),
        label_selector: r#"{service_name="app",service_version="1.5.0"}"#.to_string(),
        span_selector: vec![span.to_string()],
        start_ms: 1_000_000,
        end_ms: 1_120_400,
    };
    let grafana = GrafanaSelection {
        query: grafana_query.clone(),
        total: 400_000_000,
        total_over_investigation: 400_000_000,
        samples_within_window: true,
    };
    let same = InvestigateSelection {
        span_id: span.to_string(),
        label_selector: grafana_query.label_selector.clone(),
        span_query: grafana_query.clone(),
        evidence: InvestigateEvidence::Span,
        profile_cpu_ns: Some(400_000_000),
    };
    assert_eq!(
        selection_differences(span, &grafana, &same),
        Vec::<String>::new()
    );
    // A wider interval selecting the same samples is the same selection.
    let mut wider = same.clone();
    wider.span_query.start_ms -= 15_000;
    assert!(selection_differences(span, &grafana, &wider).is_empty());

    let differs = |inv: &InvestigateSelection, g: &GrafanaSelection, what: &str| {
        let problems = selection_differences(span, g, inv);
        assert!(
            problems.iter().any(|p| p.contains(what)),
            "{what}: {problems:?}"
        );
    };
    let other_version = r#"{service_name="app",service_version="1.4.0"}"#.to_string();
    let mut inv = same.clone();
    inv.label_selector = other_version.clone();
    differs(&inv, &grafana, "label selector: investigate reports");
    let mut inv = same.clone();
    inv.span_query.label_selector = other_version;
    differs(
        &inv,
        &grafana,
        "label selector: investigate's span profile query",
    );
    let mut inv = same.clone();
    inv.span_query.span_selector = Vec::new();
    differs(&inv, &grafana, "span selector");
    let mut inv = same.clone();
    inv.span_id = "1111111111111111".into();
    differs(&inv, &grafana, "looked at span");
    let mut inv = same.clone();
    inv.span_query.profile_type_id = BLOCK_DELAY_PROFILE_TYPE_ID.to_string();
    differs(&inv, &grafana, "profile type");
    let mut inv = same.clone();
    inv.span_query.end_ms -= 1;
    differs(&inv, &grafana, "does not contain Grafana's");
    let mut inv = same.clone();
    inv.evidence = InvestigateEvidence::Workload;
    differs(&inv, &grafana, "evidence");
    let mut inv = same.clone();
    inv.profile_cpu_ns = Some(390_000_000);
    differs(&inv, &grafana, "CPU: investigate's group has 390000000 ns");
    let mut inv = same.clone();
    inv.profile_cpu_ns = None;
    differs(&inv, &grafana, "no group");
    // Grafana's own window misses samples the wider interval holds: only allowed when
    // the span's profiles may lie outside the window.
    let short = GrafanaSelection {
        total: 300_000_000,
        ..grafana.clone()
    };
    differs(&same, &short, "±60 s window selects 300000000 ns");
    let outside = GrafanaSelection {
        samples_within_window: false,
        ..short
    };
    assert!(selection_differences(span, &outside, &same).is_empty());
    // Nothing selected on either side is no evidence of the same selection.
    let empty = GrafanaSelection {
        total: 0,
        total_over_investigation: 0,
        ..grafana
    };
    let mut inv = same;
    inv.profile_cpu_ns = Some(0);
    differs(&inv, &empty, "selects no samples");
}

#[test]
fn check4_fails_when_both_versions_serialize_alike() {
    let rec = recordings();
    let r = check_control(
        &fixture().backends,
        &rec.report_new,
        &rec.report_new,
        SERIALIZE_FUNCTION,
    );
    assert!(!r.passed, "{r}");
    // The older version against the newer one, reversed: the "older" one costs more.
    let r = check_control(
        &fixture().backends,
        &rec.report_new,
        &rec.report_old,
        SERIALIZE_FUNCTION,
    );
    assert!(!r.passed, "{r}");
    assert!(r.reason.contains("not far less"), "{r}");
}

fn random_bytes<const N: usize>(salt: u64) -> [u8; N] {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut x = nanos ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(std::process::id());
    let mut out = [0u8; N];
    for b in &mut out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
    out[0] |= 1;
    out
}

fn string_attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// A CPU profile by hand: `count` samples of `main → checklist_cpu_work` labelled with
/// `span_id`/`trace_id`.
fn hand_profile(span_id: u64, trace_id: u128, count: u64) -> otel_profiling_pprof::Profile {
    let frame = |address, name: &str| SymbolizedFrame {
        address,
        lines: vec![FrameLine {
            function: name.into(),
            file: None,
            line: None,
        }],
    };
    let stack = [frame(0x2000, "checklist_cpu_work"), frame(0x1000, "main")];
    let mut builder = ProfileBuilder::new(
        10_000_000,
        SystemTime::now() - Duration::from_millis(500),
        Duration::from_secs(1),
    );
    builder.add_sample(
        &stack,
        &SampleLabels {
            span_id: Some(span_id),
            trace_id: Some(trace_id),
            span_name: Some("checklist handmade".into()),
        },
        count,
    );
    // As the wire message, which the tests below alter as a misbehaving client would.
    otel_profiling_pprof::decode(&builder.build().encode()).expect("our own bytes decode")
}

/// Sends a root span with `pyroscope.profile.id` by OTLP and pushes a profile whose samples
/// carry `label_span` as their span id; returns the recorded operation.
fn handmade_operation(label_other_span: bool) -> (RecordedOp, u64) {
    let b = &fixture().backends;
    let service = unique_service_name(if label_other_span {
        "mislabel"
    } else {
        "handmade"
    });
    let trace_id = random_bytes::<16>(1);
    let span_id = random_bytes::<8>(2);
    let other_span = random_bytes::<8>(3);
    let end = SystemTime::now();
    let start = end - Duration::from_millis(300);
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    string_attr("service.name", &service),
                    string_attr("service.version", "3.0.0"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: trace_id.to_vec(),
                    span_id: span_id.to_vec(),
                    name: "checklist handmade".into(),
                    kind: 2,
                    start_time_unix_nano: unix_nanos(start),
                    end_time_unix_nano: unix_nanos(end),
                    attributes: vec![string_attr(PROFILE_ID_ATTRIBUTE, &to_hex(&span_id))],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    OtlpClient::new(&b.otlp_endpoint)
        .export(&request)
        .expect("OTLP export");
    let labelled = if label_other_span {
        other_span
    } else {
        span_id
    };
    let profile = hand_profile(
        u64::from_be_bytes(labelled),
        u128::from_be_bytes(trace_id),
        25,
    );
    PushClient::new(&b.pyroscope_url)
        .push(
            &[
                ("__name__", PROFILE_NAME),
                ("service_name", &service),
                ("service_version", "3.0.0"),
            ],
            &otel_profiling_pprof::encode_gzip(&profile).unwrap(),
        )
        .expect("push accepted");
    let op = RecordedOp {
        name: "checklist handmade".into(),
        trace_id: to_hex(&trace_id),
        span_id: to_hex(&span_id),
        wall_ms: 300.0,
        response_bytes: None,
        service_name: service,
        service_version: "3.0.0".into(),
    };
    (op, u64::from_be_bytes(other_span))
}

#[test]
fn span_query_check_passes_for_correctly_labelled_handmade_samples() {
    let (op, _) = handmade_operation(false);
    let r = check_profile_link(&fixture().backends, &op, CPU_FUNCTION);
    println!("{r}");
    assert!(r.passed, "{r}");
}

#[test]
fn span_query_check_fails_when_samples_carry_another_span_id() {
    let (op, other) = handmade_operation(true);
    let b = &fixture().backends;
    let r = check_profile_link(b, &op, CPU_FUNCTION);
    println!("{r}");
    assert!(!r.passed, "{r}");
    assert!(r.reason.contains("no samples for span"), "{r}");
    assert!(!check_recorded(b, &op, CPU_FUNCTION).passed);
    // The samples are there, under the other span's id.
    let span = first_span(b, &op);
    let mut query = SpanProfileQuery::for_span(&span);
    query.span_selector = vec![format!("{other:016x}")];
    assert!(!b
        .pyroscope
        .select_merge_span_profile(&query)
        .unwrap()
        .is_empty());
}

// ---- Pyroscope's and Tempo's rules ----

/// Pyroscope does not refuse a `span_id` that is not 16 hex characters: it stores the
/// sample with span 0 (`spanIDFromLabels`, `pkg/pprof/pprof.go`), so no span query finds it.
#[test]
fn a_15_hex_span_id_is_stored_as_span_0_like_pyroscope_does() {
    let b = &fixture().backends;
    let span = random_bytes::<8>(4);
    let span_hex = to_hex(&span);
    let mut profile = hand_profile(u64::from_be_bytes(span), 7, 3);
    let label = profile
        .string_table
        .iter_mut()
        .find(|s| **s == span_hex)
        .expect("span id label");
    *label = span_hex[1..].to_string(); // 15 hex
    let service = unique_service_name("badspan");
    let zeroed_before = fixture()
        .standin
        .as_ref()
        .map(|s| s.push_counters().span_ids_zeroed);
    PushClient::new(&b.pyroscope_url)
        .push(
            &[("__name__", PROFILE_NAME), ("service_name", &service)],
            &otel_profiling_pprof::encode_gzip(&profile).unwrap(),
        )
        .expect("a 15-hex span id is accepted, not rejected");
    let now_ms = unix_nanos(SystemTime::now()) as i64 / 1_000_000;
    let query = SpanProfileQuery {
        profile_type_id: PROFILE_TYPE_ID.into(),
        label_selector: format!("{{service_name=\"{service}\"}}"),
        span_selector: vec![span_hex],
        start_ms: now_ms - 60_000,
        end_ms: now_ms + 60_000,
    };
    assert!(
        b.pyroscope
            .select_merge_span_profile(&query)
            .unwrap()
            .is_empty(),
        "stored without the span: the span's query finds nothing"
    );
    if let (Some(s), Some(before)) = (&fixture().standin, zeroed_before) {
        assert_eq!(s.push_counters().span_ids_zeroed, before + 1);
        assert!(s
            .samples()
            .iter()
            .any(|x| x.labels.get("service_name") == Some(&service) && x.span_id.is_none()));
    }
}

#[test]
fn span_and_trace_ids_stay_out_of_series_labels() {
    let Some(standin) = &fixture().standin else {
        return; // a real stack's storage is not inspectable this way
    };
    let _ = recordings();
    let samples = standin.samples();
    assert!(!samples.is_empty());
    for s in &samples {
        assert!(!s.labels.contains_key("span_id") && !s.labels.contains_key("trace_id"));
        // CPU profiles, and the blocked-in-poll profiles of check 5's blocking task.
        assert!(
            [
                PROFILE_TYPE_ID,
                BLOCK_DELAY_PROFILE_TYPE_ID,
                BLOCK_CONTENTIONS_PROFILE_TYPE_ID
            ]
            .contains(&s.profile_type.as_str()),
            "{}",
            s.profile_type
        );
    }
    assert!(samples.iter().any(|s| s.profile_type == PROFILE_TYPE_ID));
    assert!(samples
        .iter()
        .any(|s| s.span_id.is_some() && s.trace_id.is_some()));
    assert!(samples
        .iter()
        .any(|s| s.labels.get("span_name").map(String::as_str) == Some(CPU_SPAN)));
}

#[test]
fn tempo_api_answers_404_for_unknown_and_400_for_malformed_ids() {
    let b = &fixture().backends;
    assert_eq!(b.tempo.get_trace(&"ab".repeat(16)).unwrap(), None);
    let err = b.tempo.get_trace("not-a-trace-id").unwrap_err();
    assert!(err.to_string().contains("400"), "{err}");
}

#[test]
fn time_range_and_profile_type_filter_the_span_query() {
    let b = &fixture().backends;
    let (op, _) = handmade_operation(false);
    let span: TraceSpan = first_span(b, &op);
    let q = SpanProfileQuery::for_span(&span);
    assert!(!b
        .pyroscope
        .select_merge_span_profile(&q)
        .unwrap()
        .is_empty());
    let mut later = q.clone();
    later.start_ms = q.end_ms + 3_600_000;
    later.end_ms = later.start_ms + 120_000;
    assert!(b
        .pyroscope
        .select_merge_span_profile(&later)
        .unwrap()
        .is_empty());
    let mut other_type = q.clone();
    other_type.profile_type_id = "memory:alloc_space:bytes:space:bytes".into();
    assert!(b
        .pyroscope
        .select_merge_span_profile(&other_type)
        .unwrap()
        .is_empty());
}

#[test]
fn flame_graph_uses_pyroscope_shape_with_int64_strings() {
    let b = &fixture().backends;
    let (op, _) = handmade_operation(false);
    let span = first_span(b, &op);
    let q = SpanProfileQuery::for_span(&span);
    let raw = reqwest::blocking::Client::new()
        .post(format!(
            "{}/querier.v1.QuerierService/SelectMergeSpanProfile",
            b.pyroscope_url
        ))
        .header("Content-Type", "application/json")
        .body(
            serde_json::json!({
                "profileTypeID": q.profile_type_id, "labelSelector": q.label_selector,
                "spanSelector": q.span_selector, "start": q.start_ms, "end": q.end_ms,
            })
            .to_string(),
        )
        .send()
        .unwrap()
        .text()
        .unwrap();
    let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let fg = &raw["flamegraph"];
    assert_eq!(fg["names"][0], "total");
    assert_eq!(fg["total"], "250000000"); // 25 samples × 10 ms, as a JSON string
    assert!(fg["maxSelf"].is_string());
    let levels = fg["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 3); // total → main → checklist_cpu_work
    assert_eq!(levels[2]["values"].as_array().unwrap().len(), 4);
    assert!(levels[2]["values"][0].is_string());
    let graph = b.pyroscope.select_merge_span_profile(&q).unwrap();
    assert_eq!(graph.function_total("checklist_cpu_work"), 250_000_000);
    assert_eq!(graph.top_function().unwrap().0, "checklist_cpu_work");
}

// ---- The command line follows the conventions ----

#[test]
fn help_goes_to_stdout_and_exits_0() {
    let out = std::process::Command::new(CHECKLIST_EXE)
        .arg("--help")
        .output()
        .expect("checklist runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for flag in ["--tempo", "--pyroscope", "--otlp", "--timeout", "--standin"] {
        assert!(stdout.contains(flag), "{flag} in the help: {stdout}");
    }
    assert!(
        !stdout.contains("Commands:"),
        "the internal mode stays hidden: {stdout}"
    );
}

#[test]
fn usage_errors_go_to_stderr_and_exit_2() {
    for args in [
        &["--bogus"][..],
        &["--timeout", "soon"],
        &["--standin", "--tempo", "http://127.0.0.1:3200"],
    ] {
        let out = std::process::Command::new(CHECKLIST_EXE)
            .args(args)
            .env_remove("TEMPO_URL")
            .env_remove("PYROSCOPE_URL")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .output()
            .expect("checklist runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    // No backends and no --standin: a usage error naming the variables.
    let out = std::process::Command::new(CHECKLIST_EXE)
        .env_remove("TEMPO_URL")
        .env_remove("PYROSCOPE_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .expect("checklist runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("TEMPO_URL") && stderr.contains("--standin"),
        "{stderr}"
    );
}

/// The first span Tempo holds for `op`'s trace.
fn first_span(b: &Backends, op: &RecordedOp) -> TraceSpan {
    b.tempo
        .get_trace(&op.trace_id)
        .expect("Tempo answers")
        .expect("the trace is there")
        .spans
        .remove(0)
}
