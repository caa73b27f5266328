//! The issue's proof of `otel-profiling investigate`: the demo pointed at the stand-in
//! server (the ordinary variables, `OTEL_EXPORTER_OTLP_ENDPOINT` and
//! `PYROSCOPE_SERVER_ADDRESS`), then the investigation of one trace per endpoint, read back
//! from the stand-in's Tempo and Pyroscope APIs only:
//!
//! * `GET /report` of 1.5.0 is CPU-bound in the serializer and, against 1.4.0 as control,
//!   the candidate is `paginate_report`;
//! * `GET /orders` is waiting, `inventory.lookup` covering the wait;
//! * `GET /export` is blocked in poll, naming `write_export`;
//! * a span without a profile id (an `inventory.lookup` child) gets the service's profile
//!   over its interval, titled "concurrent workload activity, not this span".
//!
//! About a minute: the demo runs each release under load for 20 s.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use otel_profiling_cli::investigate::{
    Backends, Baseline, EndpointQuery, EndpointReport, Evidence, Investigation, OperationQuery,
};
use otel_profiling_cli::verdict::Verdict;
use otel_profiling_integration_tests::standin::StandIn;
use otel_profiling_query::{FoundSpan, SearchQuery, TempoClient};

struct Run {
    standin: StandIn,
}

/// The demo, once per test process, against one stand-in.
fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let standin = StandIn::start().expect("the stand-in starts");
        let url = standin.url();
        let out = Command::new(env!("CARGO_BIN_EXE_demo"))
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
            .env("PYROSCOPE_SERVER_ADDRESS", &url)
            .env_remove("OTEL_PROFILING_OUTPUT_DIR")
            .output()
            .expect("the demo runs");
        assert!(
            out.status.success(),
            "demo failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Run { standin }
    })
}

fn backends(run: &Run) -> Backends {
    Backends::from_urls(
        &run.standin.url(),
        &run.standin.url(),
        Duration::from_secs(10),
    )
    .expect("valid URLs")
}

/// Spans the stand-in's Tempo search finds for `traceql` (everything it holds).
fn search(run: &Run, traceql: &str) -> Vec<FoundSpan> {
    let tempo = TempoClient::new(&run.standin.url()).expect("valid URL");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let found = tempo
        .search(&SearchQuery {
            traceql: traceql.to_owned(),
            start_s: now - 3600,
            end_s: now + 60,
            limit: 1000,
            spans_per_set: 3,
        })
        .expect("search");
    assert!(!found.is_empty(), "nothing matches {traceql}");
    found
}

/// The investigation of the median-duration span `traceql` finds.
fn investigate(run: &Run, traceql: &str, baseline: Baseline) -> Investigation {
    let mut found = search(run, traceql);
    found.sort_by_key(|s| s.duration_ns);
    investigate_span(run, &found[found.len() / 2], baseline)
}

fn investigate_span(run: &Run, span: &FoundSpan, baseline: Baseline) -> Investigation {
    let mut query = OperationQuery::of_trace(&span.trace_id);
    query.span_id = Some(span.span_id.clone());
    query.upload_interval = Duration::from_secs(5);
    query.baseline = baseline;
    let investigation = Investigation::run(&backends(run), &query).expect("investigation");
    println!("{investigation}");
    investigation
}

#[test]
fn report_of_1_5_0_is_cpu_bound_and_its_control_names_paginate_report() {
    let run = run();
    let inv = investigate(
        run,
        r#"{ name = "GET /report" && resource.service.version = "1.5.0" }"#,
        Baseline::Version("1.4.0".into()),
    );
    assert_eq!(inv.evidence, Evidence::Span);
    let group = inv.group().expect("a group");
    // CPU-bound; on a machine busy with other work (another build beside the test) the
    // same request reads "waiting for a CPU": computing whenever it had a CPU.
    match group.verdict {
        Verdict::CpuBound => {}
        Verdict::WaitingForCpu => assert!(
            group.split.cpu_in_wall_ns + group.split.runqueue_ns >= group.wall_total_ns * 8 / 10,
            "{inv}"
        ),
        other => panic!("{other}: {inv}"),
    }
    let top: Vec<&str> = group
        .user_total
        .iter()
        .map(|f| f.function.as_str())
        .collect();
    assert!(
        top.iter()
            .any(|f| f.contains("serialize") || f.contains("paginate_report")),
        "the serializer leads the 1.5.0 profile: {top:?}"
    );
    // The demo's services sample allocations: the span's own (Tempo's attribute) and
    // where (Pyroscope's allocation profile of the span), the serializer leading.
    let allocations = group.allocations.as_ref().expect("the span's allocations");
    assert!(
        allocations.spans == 1 && allocations.attribute_bytes > 0,
        "{allocations:?}"
    );
    assert!(
        allocations.profile_bytes > 0
            && allocations
                .top
                .iter()
                .take(2)
                .any(|f| f.function.contains("serialize") || f.function.contains("paginate_report")),
        "{allocations:?}"
    );
    assert!(inv.to_string().contains("allocations: "), "{inv}");
    let control = inv.control.as_ref().expect("a control");
    let diff = control.diff.as_ref().expect("1.4.0 requests were compared");
    let grown = diff
        .allocation_growth
        .as_ref()
        .expect("1.5.0 allocates more per request");
    assert!(grown.function.ends_with("paginate_report"), "{grown:?}");
    assert!(control.compared > 0);
    let cause = diff.cause.as_ref().expect("a candidate");
    assert!(
        cause.function.ends_with("paginate_report"),
        "{}",
        cause.function
    );
    let hypothesis = control.hypothesis().expect("a hypothesis");
    assert!(
        hypothesis.starts_with("Hypothesis, not a proven cause: candidate `")
            && hypothesis.contains("paginate_report")
            && hypothesis.contains("test it separately"),
        "{hypothesis}"
    );
    let json = inv.to_json();
    assert_eq!(json["version"], 1);
    assert_eq!(json["service_version"], "1.5.0");
    assert_eq!(json["span"]["verdict"], group.verdict.to_string());
    assert_documented(&json);
    // The report's page of what was read: the span, its flame graph, its verdict.
    let page = otel_profiling_cli::html::HtmlReport::from_input(&inv.input);
    let path = std::env::temp_dir().join(format!("investigate-{}.html", std::process::id()));
    page.write_file(&path).expect("the page is written");
    let html = std::fs::read_to_string(&path).expect("the page");
    let _ = std::fs::remove_file(&path);
    // The span's verdict badge (the legend names every verdict, so the text alone proves
    // nothing).
    let badge = format!(">{}</span>", group.verdict);
    assert!(
        html.contains("GET /report") && html.contains(&badge),
        "the page shows the verdict {badge}"
    );
    assert!(
        html.contains("paginate_report"),
        "the flame graph names the serializer"
    );
}

/// Every field of an investigation's JSON (nested objects too) is named in
/// docs/investigate.md, so the documented schema cannot fall behind.
fn assert_documented(json: &serde_json::Value) {
    let doc = include_str!("../../docs/investigate.md");
    let mut stack = vec![json];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let named =
                        doc.contains(&format!("`{key}`")) || doc.contains(&format!(".{key}`"));
                    assert!(named, "`{key}` is not in docs/investigate.md");
                    if key == "profiling_attributes" {
                        continue; // the span's own attribute names
                    }
                    stack.push(value);
                }
            }
            serde_json::Value::Array(items) => stack.extend(items.iter().take(1)),
            _ => {}
        }
    }
}

#[test]
fn orders_is_waiting_with_inventory_lookup_covering_the_wait() {
    let run = run();
    let inv = investigate(run, r#"{ name = "GET /orders" }"#, Baseline::Off);
    let group = inv.group().expect("a group");
    assert_eq!(group.verdict, Verdict::Waiting, "{inv}");
    let child = group
        .dependencies
        .children
        .iter()
        .find(|c| c.name == "inventory.lookup")
        .expect("inventory.lookup among the child spans");
    assert!(child.count >= 1);
    assert!(
        group.reason.contains("inventory.lookup"),
        "the reason names the dependency: {}",
        group.reason
    );
    assert!(inv.control.is_none());
}

#[test]
fn export_is_blocked_in_poll_naming_write_export() {
    let run = run();
    let inv = investigate(run, r#"{ name = "GET /export" }"#, Baseline::Off);
    let group = inv.group().expect("a group");
    assert_eq!(group.verdict, Verdict::BlockedInPoll, "{inv}");
    assert!(
        group
            .blocking
            .iter()
            .any(|f| f.function.contains("write_export")),
        "where it blocks: {:?}",
        group.blocking
    );
}

#[test]
fn a_span_without_a_profile_id_gets_the_labelled_workload_fallback() {
    let run = run();
    let inv = investigate(run, r#"{ name = "inventory.lookup" }"#, Baseline::Off);
    assert!(!inv
        .profiling_attributes
        .contains_key("pyroscope.profile.id"));
    assert_eq!(inv.evidence, Evidence::Workload, "{inv}");
    let text = inv.to_string();
    assert!(
        text.contains("concurrent workload activity, not this span"),
        "{text}"
    );
    assert_eq!(
        inv.to_json()["span"]["concurrent"]["title"],
        "concurrent workload activity, not this span"
    );
}

#[test]
fn the_report_endpoint_over_time_per_version_with_its_slowest_traces() {
    let run = run();
    let mut query = EndpointQuery::new("report-service", "GET /report", Duration::from_secs(3600));
    query.upload_interval = Duration::from_secs(5);
    query.spans_per_version = 5;
    let report = EndpointReport::run(&backends(run), &query).expect("endpoint report");
    println!("{report}");
    let versions: Vec<&str> = report.versions.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["1.5.0", "1.4.0"], "most recent first");
    let tempo = TempoClient::new(&run.standin.url()).expect("URL");
    for v in &report.versions {
        assert_eq!(v.read, 5, "{}", v.version);
        assert!(v.found >= v.read);
        assert_eq!(v.slowest.len(), 5);
        assert!(
            v.slowest.windows(2).all(|w| w[0].2 >= w[1].2),
            "slowest first"
        );
        assert!(v.p95_ns >= v.p50_ns && v.p50_ns > 0.0);
        // Quantiles of every span, not of the search's sample: exact when the search held
        // every matching span (the demo's requests are under the limit), else Tempo's
        // estimates, marked approximate.
        let exact = format!("every matching span ({}), exact", v.found);
        assert!(
            (v.quantiles_from == exact && !v.approximate)
                || (v.quantiles_from.starts_with("TraceQL metrics") && v.approximate),
            "{}",
            v.quantiles_from
        );
        // Each listed trace is a request of that version, to go on with in mode 1.
        let (trace_id, span_id, _) = &v.slowest[0];
        let trace = tempo.get_trace(trace_id).expect("trace").expect("known");
        let span = trace.span(span_id).expect("the span");
        assert_eq!(span.resource["service.version"], v.version);
        let group = report
            .report
            .group("GET /report", Some(&v.version))
            .expect("a group per version");
        assert_eq!(group.count, 5);
        // The slowest requests are computing, or were preempted while computing (on a
        // loaded machine the slowest are those that waited for a CPU): never waiting on
        // a dependency or blocked.
        assert!(
            matches!(
                group.verdict,
                Verdict::CpuBound | Verdict::Mixed | Verdict::WaitingForCpu
            ),
            "{}: {}",
            v.version,
            group.reason
        );
        assert!(
            group.split.awaiting_ns < group.wall_total_ns / 10,
            "{}",
            group.reason
        );
    }
    let slow = report.report.group("GET /report", Some("1.5.0")).unwrap();
    let fast = report.report.group("GET /report", Some("1.4.0")).unwrap();
    assert!(slow.profile_cpu_ns > 3 * fast.profile_cpu_ns);
    assert!(
        slow.user_total
            .iter()
            .any(|f| f.function.ends_with("paginate_report")),
        "{:?}",
        slow.user_total
    );
    let json = report.to_json();
    assert_eq!(json["version"], 1);
    assert_documented(&json);
    assert_eq!(
        json["versions"][0]["slowest"].as_array().map(Vec::len),
        Some(5)
    );
    let text = report.to_string();
    assert!(text.contains("Tempo's search returned"), "{text}");
}
