//! Fixture directories as otel-profiling's local sink writes them: pprof profiles built with
//! `ProfileBuilder` and OTLP JSON span lines written by hand.
//!
//! Two versions of a service, 10 ms sampling period (100 Hz):
//!
//! | span name | version | spans | wall (ms) | CPU per span |
//! |---|---|---|---|---|
//! | `GET /report` | 1.0.0 | 4 | 100, 120, 140, 200 | render_rows 60 ms, encode_json 20 ms |
//! | `GET /report` | 2.0.0 | 4 | 200, 220, 240, 300 | render_rows 60 ms, encode_json 100 ms (under a new `paginate`) |
//! | `GET /search` | 1.0.0 | 1 | 100 | search_index (inlined in handle_search) 30 ms |
//! | `GET /orders` | 1.0.0 | 3 | 300, 400, 500 | none (waiting), evidence 0 |
//! | `GET /orders` | 2.0.0 | 2 | 300, 500 | none |
//! | `GET /health` | 1.0.0 | 2 | 2, 3 | none (too short) |
//! | `GET /legacy` | (none) | 1 | 150 | none, no profile id (unsampled) |
//!
//! Each `GET /orders` 1.0.0 span has a `db.query` child (not a local root). Two extra
//! samples carry only the span name `GET /report` (an unsampled trace).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use otel_profiling::pprof::{
    encode_gzip, FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame,
};
use serde_json::{json, Value};

pub const PERIOD_NS: i64 = 10_000_000;
pub const MS: u64 = 1_000_000;
pub const V1: &str = "1.0.0";
pub const V2: &str = "2.0.0";

/// A stack, outermost first; `"outer > inner"` is one address (spaced: Rust names hold `>`) whose lines are `inner`
/// inlined into `outer`.
pub type Stack = &'static [&'static str];

pub const REPORT_RENDER: Stack = &["main", "handle_report", "render_rows"];
pub const REPORT_ENCODE: Stack = &["main", "handle_report", "serialize", "encode_json"];
/// 2.0.0 pages its output: a new frame between `serialize` and `encode_json`.
pub const REPORT_PAGED: Stack = &[
    "main",
    "handle_report",
    "serialize",
    "paginate",
    "encode_json",
];
pub const SEARCH: Stack = &["main", "handle_search > search_index"];
pub const UNSAMPLED: Stack = &["main", "handle_report", "legacy_encoder"];

#[derive(Clone, Debug)]
pub struct FixtureSpan {
    pub name: &'static str,
    pub version: Option<&'static str>,
    pub span_id: u64,
    pub trace_id: u128,
    pub parent: Option<u64>,
    pub wall_ms: u64,
    pub profile_id: bool,
    /// `profiling.cpu.samples` (time = samples × period), when the span carries evidence.
    pub evidence: Option<u64>,
    pub stacks: Vec<(Stack, u64)>,
    /// (method attribute key, method, `http.route`) of an HTTP server span named apart
    /// from its route; `None`: `http.route` is the span name.
    pub route: Option<(&'static str, &'static str, &'static str)>,
    /// `profiling.wall.active_ns` in ms, when the span carries it.
    pub active_ms: Option<u64>,
    /// Start, ms after the fixture's base time; `None`: one second per span index.
    pub at_ms: Option<u64>,
    /// `profiling.wall.queued_ns` in ms, when the span carries it.
    pub queued_ms: Option<u64>,
}

impl FixtureSpan {
    pub fn id(&self) -> String {
        format!("{:016x}", self.span_id)
    }
}

fn span(
    name: &'static str,
    version: Option<&'static str>,
    span_id: u64,
    wall_ms: u64,
    stacks: Vec<(Stack, u64)>,
) -> FixtureSpan {
    let samples = stacks.iter().map(|(_, n)| n).sum();
    FixtureSpan {
        name,
        version,
        span_id,
        trace_id: 0xabc0_0000_0000_0000_0000_0000_0000_0000 | u128::from(span_id),
        parent: None,
        wall_ms,
        profile_id: true,
        evidence: Some(samples),
        stacks,
        route: None,
        active_ms: None,
        at_ms: None,
        queued_ms: None,
    }
}

/// The spans of version 1.0.0 (plus the unversioned legacy span).
pub fn v1_spans() -> Vec<FixtureSpan> {
    let mut spans = Vec::new();
    for (i, wall) in [100, 120, 140, 200].into_iter().enumerate() {
        spans.push(span(
            "GET /report",
            Some(V1),
            0x1000 + i as u64,
            wall,
            vec![(REPORT_RENDER, 6), (REPORT_ENCODE, 2)],
        ));
    }
    spans.push(span(
        "GET /search",
        Some(V1),
        0x1a00,
        100,
        vec![(SEARCH, 3)],
    ));
    for (i, wall) in [300, 400, 500].into_iter().enumerate() {
        let root = span("GET /orders", Some(V1), 0x1200 + i as u64, wall, vec![]);
        let mut child = span("db.query", Some(V1), 0x1300 + i as u64, wall - 10, vec![]);
        child.trace_id = root.trace_id;
        child.parent = Some(root.span_id);
        child.evidence = None;
        spans.push(root);
        spans.push(child);
    }
    for (i, wall) in [2, 3].into_iter().enumerate() {
        spans.push(span(
            "GET /health",
            Some(V1),
            0x1400 + i as u64,
            wall,
            vec![],
        ));
    }
    let mut legacy = span("GET /legacy", None, 0x1500, 150, vec![]);
    legacy.profile_id = false;
    legacy.evidence = None;
    spans.push(legacy);
    spans
}

/// The spans of version 2.0.0.
pub fn v2_spans() -> Vec<FixtureSpan> {
    let mut spans = Vec::new();
    for (i, wall) in [200, 220, 240, 300].into_iter().enumerate() {
        spans.push(span(
            "GET /report",
            Some(V2),
            0x2000 + i as u64,
            wall,
            vec![(REPORT_RENDER, 6), (REPORT_PAGED, 10)],
        ));
    }
    for (i, wall) in [300, 500].into_iter().enumerate() {
        spans.push(span(
            "GET /orders",
            Some(V2),
            0x2200 + i as u64,
            wall,
            vec![],
        ));
    }
    spans
}

/// Writes one profile file and one span file for `spans` into `dir` (created if needed);
/// `stamp` names them. `name_only` samples carry the span name `GET /report` but no id.
pub fn write(dir: &Path, stamp: &str, spans: &[FixtureSpan], name_only: u64) {
    std::fs::create_dir_all(dir).expect("create fixture dir");
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut profile = ProfileBuilder::new(PERIOD_NS, start, Duration::from_secs(10));
    let mut addresses = HashMap::new();
    for s in spans {
        let labels = SampleLabels {
            span_id: Some(s.span_id),
            trace_id: Some(s.trace_id),
            span_name: Some(Arc::from(s.name)),
        };
        for (stack, count) in &s.stacks {
            profile.add_sample(&frames(stack, &mut addresses), &labels, *count);
        }
    }
    if name_only > 0 {
        let labels = SampleLabels {
            span_id: None,
            trace_id: None,
            span_name: Some(Arc::from("GET /report")),
        };
        profile.add_sample(&frames(UNSAMPLED, &mut addresses), &labels, name_only);
    }
    let bytes = encode_gzip(&profile.build()).expect("encode profile");
    std::fs::write(dir.join(format!("{stamp}_cpu.pb.gz")), bytes).expect("write profile");

    let mut lines = String::new();
    let mut versions: Vec<Option<&str>> = spans.iter().map(|s| s.version).collect();
    versions.dedup();
    for version in versions {
        let of_version: Vec<&FixtureSpan> = spans.iter().filter(|s| s.version == version).collect();
        lines.push_str(&request_line(version, &of_version));
        lines.push('\n');
    }
    std::fs::write(dir.join(format!("{stamp}_spans.jsonl")), lines).expect("write spans");
}

/// Innermost-first symbolized frames of an outermost-first stack.
fn frames(stack: Stack, addresses: &mut HashMap<&'static str, u64>) -> Vec<SymbolizedFrame> {
    stack
        .iter()
        .rev()
        .map(|entry| {
            let next = 0x1000 * (addresses.len() as u64 + 1);
            let address = *addresses.entry(entry).or_insert(next);
            let lines = entry
                .rsplit(" > ")
                .map(|function| FrameLine {
                    function: Arc::from(function),
                    file: None,
                    line: None,
                })
                .collect();
            SymbolizedFrame { address, lines }
        })
        .collect()
}

/// One `ExportTraceServiceRequest` line: one resource (service "shop", `version`).
fn request_line(version: Option<&str>, spans: &[&FixtureSpan]) -> String {
    let mut resource = vec![json!({"key": "service.name", "value": {"stringValue": "shop"}})];
    if let Some(v) = version {
        resource.push(json!({"key": "service.version", "value": {"stringValue": v}}));
    }
    let spans: Vec<Value> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| span_json(i, s))
        .collect();
    json!({
        "resourceSpans": [{
            "resource": {"attributes": resource, "droppedAttributesCount": 0},
            "scopeSpans": [{
                "scope": {"name": "shop", "version": ""},
                "spans": spans,
                "schemaUrl": ""
            }],
            "schemaUrl": ""
        }]
    })
    .to_string()
}

fn span_json(index: usize, s: &FixtureSpan) -> Value {
    let start: u64 = 1_700_000_000_000_000_000
        + match s.at_ms {
            Some(at) => at * MS,
            None => index as u64 * 1_000_000_000,
        };
    let mut attributes = match s.route {
        None => vec![json!({"key": "http.route", "value": {"stringValue": s.name}})],
        // An empty key or route leaves that attribute out.
        Some((method_key, method, route)) => [(method_key, method), ("http.route", route)]
            .into_iter()
            .filter(|(key, value)| !key.is_empty() && !value.is_empty())
            .map(|(key, value)| json!({"key": key, "value": {"stringValue": value}}))
            .collect(),
    };
    if s.profile_id {
        attributes.push(json!({"key": "pyroscope.profile.id", "value": {"stringValue": s.id()}}));
    }
    if let Some(samples) = s.evidence {
        attributes.push(
            json!({"key": "profiling.cpu.samples", "value": {"intValue": samples.to_string()}}),
        );
        attributes.push(json!({
            "key": "profiling.cpu.time_ns",
            "value": {"intValue": (samples * PERIOD_NS as u64).to_string()}
        }));
    }
    if let Some(active) = s.active_ms {
        attributes.push(json!({
            "key": "profiling.wall.active_ns",
            "value": {"intValue": (active * 1_000_000).to_string()}
        }));
    }
    if let Some(queued) = s.queued_ms {
        attributes.push(json!({
            "key": "profiling.wall.queued_ns",
            "value": {"intValue": (queued * 1_000_000).to_string()}
        }));
    }
    json!({
        "traceId": format!("{:032x}", s.trace_id),
        "spanId": s.id(),
        "traceState": "",
        "parentSpanId": s.parent.map(|p| format!("{p:016x}")).unwrap_or_default(),
        "flags": 257,
        "name": s.name,
        "kind": 2,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": (start + s.wall_ms * MS).to_string(),
        "attributes": attributes,
        "droppedAttributesCount": 0,
        "events": [],
        "links": [],
        "status": {"message": "", "code": 0}
    })
}

/// An async service's stacks as a release build names them: the C `main`, std's and
/// tokio's frames around the handler's async block (`{{closure}}`, polled through
/// `Pin<P>`), and the user's `serialize_catalog` under it calling into serde and alloc.
const RUNTIME: [&str; 5] = [
    "main",
    "std::rt::lang_start_internal",
    "tokio::runtime::scheduler::multi_thread::worker::run",
    "tokio::runtime::task::harness::Harness<T,S>::poll",
    "<core::pin::Pin<P> as core::future::future::Future>::poll",
];
pub const HANDLER: &str = "shop::handlers::get_catalog::{{closure}}";
pub const SERIALIZE_CATALOG: &str = "shop::catalog::serialize_catalog";
pub const ASYNC_SERIALIZE: Stack = &[
    RUNTIME[0],
    RUNTIME[1],
    RUNTIME[2],
    RUNTIME[3],
    RUNTIME[4],
    HANDLER,
    SERIALIZE_CATALOG,
];
pub const ASYNC_SERIALIZE_ALLOC: Stack = &[
    RUNTIME[0],
    RUNTIME[1],
    RUNTIME[2],
    RUNTIME[3],
    RUNTIME[4],
    HANDLER,
    SERIALIZE_CATALOG,
    "<&mut serde_json::ser::Serializer<W> as serde::ser::Serializer>::serialize_str",
    "alloc::vec::Vec<T>::extend_from_slice",
];
pub const ASYNC_CLOCK: Stack = &[
    RUNTIME[0],
    RUNTIME[1],
    RUNTIME[2],
    RUNTIME[3],
    RUNTIME[4],
    HANDLER,
    "std::time::Instant::now",
    "clock_gettime",
];
pub const ASYNC_HANDLER: Stack = &[
    RUNTIME[0], RUNTIME[1], RUNTIME[2], RUNTIME[3], RUNTIME[4], HANDLER,
];
pub const ASYNC_IDLE: Stack = &[
    RUNTIME[0],
    RUNTIME[1],
    RUNTIME[2],
    "tokio::runtime::io::driver::Driver::turn",
    "mio::poll::Poll::poll",
    "epoll_wait",
];

/// A temporary directory with one `GET /catalog` span of an async service, 100 ms of CPU
/// in 10 samples: `serialize_catalog` 40 ms (20 ms in serde/alloc under it), the handler's
/// async block 30 ms more (20 ms of it in `clock_gettime`), tokio's I/O driver 30 ms.
pub fn async_service() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spans = [span(
        "GET /catalog",
        Some(V1),
        0x4000,
        200,
        vec![
            (ASYNC_SERIALIZE, 2),
            (ASYNC_SERIALIZE_ALLOC, 2),
            (ASYNC_CLOCK, 2),
            (ASYNC_HANDLER, 1),
            (ASYNC_IDLE, 3),
        ],
    )];
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    dir
}

/// A temporary directory with both versions, in two pairs of files (as two services
/// writing into one directory do), and 2 name-only samples.
pub fn both_versions() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "2026-01-01T00-00-00.000Z", &v1_spans(), 2);
    write(dir.path(), "2026-01-01T00-00-10.000Z", &v2_spans(), 0);
    dir
}

/// Two temporary directories: version 1.0.0 in the first, 2.0.0 in the second.
pub fn one_version_each() -> (tempfile::TempDir, tempfile::TempDir) {
    let before = tempfile::tempdir().expect("tempdir");
    let after = tempfile::tempdir().expect("tempdir");
    write_one_version_each(before.path(), after.path());
    (before, after)
}

/// [`one_version_each`] as `before/` and `after/` in one temporary directory (for output
/// that names the directories: relative names are the same on every machine).
pub fn one_version_each_in_one_dir() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    write_one_version_each(&root.path().join("before"), &root.path().join("after"));
    root
}

fn write_one_version_each(before: &Path, after: &Path) {
    write(before, "2026-01-01T00-00-00.000Z", &v1_spans(), 0);
    write(after, "2026-01-02T00-00-00.000Z", &v2_spans(), 0);
}

pub const CPU_WORK: Stack = &["main", "handle", "compute_checksums"];

/// A temporary directory with an axum service traced by tower-http's default `TraceLayer`
/// plus a hand-written `http.route`: every root span is named `request`. 10 ms sampling.
///
/// | route | method key | spans | wall (ms) | CPU per span |
/// |---|---|---|---|---|
/// | `GET /cpu` | `http.request.method` | 3 | 100 | 80 ms |
/// | `GET /io` | `http.request.method` | 3 | 100 | none (evidence 0) |
/// | `POST /items/{id}` | `http.method` (older conventions) | 2 | 100 | 30 ms |
pub fn spans_named_request_with_routes() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spans = Vec::new();
    let routes: [(&str, &str, &str, u64, u64); 3] = [
        ("http.request.method", "GET", "/cpu", 3, 8),
        ("http.request.method", "GET", "/io", 3, 0),
        ("http.method", "POST", "/items/{id}", 2, 3),
    ];
    let mut id = 0x5000;
    for (key, method, route, count, samples) in routes {
        for _ in 0..count {
            let stacks = if samples > 0 {
                vec![(CPU_WORK, samples)]
            } else {
                vec![]
            };
            let mut span = span("request", Some(V1), id, 100, stacks);
            span.route = Some((key, method, route));
            spans.push(span);
            id += 1;
        }
    }
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    dir
}

/// A routed endpoint, requests no route matched, and spans left with tower-http's
/// default name:
///
/// | span name | attributes | spans | wall (ms) | CPU per span |
/// |---|---|---|---|---|
/// | `GET /cpu` | `http.request.method`, `http.route` | 3 | 100 | 80 ms |
/// | `GET` | `http.request.method` only (404s) | 4 | 1 | none |
/// | `request` | neither | 3 | 100 | 80 ms |
pub fn unmatched_and_unnamed_requests() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spans = Vec::new();
    // (name, (method key, method, route), spans, wall ms, samples per span)
    #[allow(clippy::type_complexity)]
    let kinds: [(&str, (&str, &str, &str), u64, u64, u64); 3] = [
        (
            "GET /cpu",
            ("http.request.method", "GET", "/cpu"),
            3,
            100,
            8,
        ),
        ("GET", ("http.request.method", "GET", ""), 4, 1, 0),
        ("request", ("", "", ""), 3, 100, 8),
    ];
    let mut id = 0x7000;
    for (name, route, count, wall_ms, samples) in kinds {
        for _ in 0..count {
            let stacks = if samples > 0 {
                vec![(CPU_WORK, samples)]
            } else {
                vec![]
            };
            let mut span = span(name, Some(V1), id, wall_ms, stacks);
            span.route = Some(route);
            span.active_ms = Some(wall_ms);
            spans.push(span);
            id += 1;
        }
    }
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    dir
}

/// Three routes of one service whose spans carry their active time: `GET /cpu` computes,
/// `GET /sleep` holds its thread off CPU (a blocking call inside the poll, no samples),
/// `GET /io` awaits with no thread inside it.
pub fn routes_with_active_time() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spans = Vec::new();
    // (route, samples of 10 ms, active ms) of 100 ms spans.
    let routes: [(&str, u64, u64); 3] = [("/cpu", 8, 95), ("/sleep", 0, 98), ("/io", 0, 2)];
    let mut id = 0x6000;
    for (route, samples, active) in routes {
        for _ in 0..3 {
            let stacks = if samples > 0 {
                vec![(CPU_WORK, samples)]
            } else {
                vec![]
            };
            let mut span = span("request", Some(V1), id, 100, stacks);
            span.route = Some(("http.request.method", "GET", route));
            span.active_ms = Some(active);
            spans.push(span);
            id += 1;
        }
    }
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    dir
}

/// Two waiting routes of 100 ms roots (2 ms active, no CPU): `GET /orders` makes three
/// sequential `inventory.lookup` calls of 30 ms each (child spans), `GET /slow` makes an
/// uninstrumented call (no child span).
pub fn waiting_with_and_without_child_spans() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spans = Vec::new();
    let mut id = 0x7000;
    for (i, route) in ["/orders", "/slow"].into_iter().enumerate() {
        for r in 0..2u64 {
            let at = (i as u64 * 2 + r) * 1_000;
            let root_id = id;
            let mut root = span("request", Some(V1), root_id, 100, vec![]);
            root.route = Some(("http.request.method", "GET", route));
            root.active_ms = Some(2);
            root.at_ms = Some(at);
            spans.push(root);
            id += 1;
            if route == "/orders" {
                for call in 0..3u64 {
                    let mut child = span("inventory.lookup", Some(V1), id, 30, vec![]);
                    child.parent = Some(root_id);
                    child.trace_id = spans.last().map_or(0, |r: &FixtureSpan| r.trace_id);
                    child.profile_id = false;
                    child.evidence = None;
                    child.at_ms = Some(at + 5 + call * 30);
                    spans.push(child);
                    id += 1;
                }
            }
        }
    }
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    dir
}

/// `GET /poll` roots of 100 ms that ran 2 ms, were woken but not polled for 80 ms (queued
/// behind `GET /hog`'s CPU), and awaited the rest.
pub fn queued_behind_cpu_work() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spans = Vec::new();
    for i in 0..3u64 {
        let mut span = span("request", Some(V1), 0x8000 + i, 100, vec![]);
        span.route = Some(("http.request.method", "GET", "/poll"));
        span.active_ms = Some(2);
        span.queued_ms = Some(80);
        spans.push(span);
        let mut hog = span_of_cpu(0x8100 + i);
        hog.route = Some(("http.request.method", "GET", "/hog"));
        spans.push(hog);
    }
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    dir
}

fn span_of_cpu(id: u64) -> FixtureSpan {
    let mut s = span("request", Some(V1), id, 100, vec![(CPU_WORK, 9)]);
    s.active_ms = Some(100);
    s.queued_ms = Some(0);
    s
}

/// [`routes_with_active_time`], plus the watchdog's blocked-in-poll profile of the
/// `GET /sleep` spans: each blocked 90 ms in `flush_to_slow_disk` (under std's sleep) and
/// 5 ms in `take_lock`.
pub fn routes_with_blocked_profile() -> tempfile::TempDir {
    let dir = routes_with_active_time();
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut profile = ProfileBuilder::blocked(start, Duration::from_secs(10));
    let mut addresses = HashMap::new();
    let sleeping: Stack = &[
        "main",
        "handler",
        "flush_to_slow_disk",
        "std::thread::sleep",
        "nanosleep",
    ];
    let locking: Stack = &["main", "handler", "take_lock", "std::sync::Mutex<T>::lock"];
    // `routes_with_active_time` numbers GET /sleep's spans 0x6003..=0x6005.
    for id in 0x6003u64..=0x6005 {
        let labels = SampleLabels {
            span_id: Some(id),
            trace_id: Some(0xabc0_0000_0000_0000_0000_0000_0000_0000 | u128::from(id)),
            span_name: Some(Arc::from("request")),
        };
        profile.add_blocked(&frames(sleeping, &mut addresses), &labels, 1, 90 * MS);
        profile.add_blocked(&frames(locking, &mut addresses), &labels, 1, 5 * MS);
    }
    let bytes = encode_gzip(&profile.build()).expect("encode blocked profile");
    std::fs::write(
        dir.path().join("2026-01-01T00-00-00.000Z_blocked.pb.gz"),
        bytes,
    )
    .expect("write blocked profile");
    dir
}

/// The part of the wall time a [`regression`] fixture's 2.0.0 grows.
#[derive(Clone, Copy, Debug)]
pub enum Regression {
    /// Three sequential `inventory.lookup` calls where 1.0.0 made one.
    Awaiting,
    /// A new `price_rules` computing 80 ms per request.
    Cpu,
    /// A blocking call holding the thread 90 ms per request (`flush_to_slow_disk` in the
    /// blocked-in-poll profile).
    Blocked,
}

pub const CHECKOUT_PRICING: Stack = &["main", "handle", "price_rules"];

/// One directory, `POST /checkout` (spans named `request`, routed) in 1.0.0 and 2.0.0,
/// three requests each, every root carrying `profiling.wall.active_ns`:
///
/// | | wall | CPU (samples) | active | blocked | awaiting | children per request |
/// |---|---|---|---|---|---|---|
/// | 1.0.0 | 100 | 10 (1) | 20 | 10 | 80 | 1 × inventory.lookup 40 ms |
/// | 2.0.0 `Awaiting` | 140 | 10 (1) | 20 | 10 | 120 | 3 × inventory.lookup 30 ms |
/// | 2.0.0 `Cpu` | 180 | 90 (9) | 100 | 10 | 80 | as 1.0.0 |
/// | 2.0.0 `Blocked` | 190 | 10 (1) | 110 | 100 | 80 | as 1.0.0 |
///
/// 2.0.0 also serves `GET /hot` from spans named `request`, 3 × 300 ms of CPU: a diff
/// that took every `request` span for the endpoint would see CPU grow.
pub fn regression(kind: Regression) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spans = Vec::new();
    let mut id = 0x9000;
    for version in [V1, V2] {
        let new = version == V2;
        // (wall, stacks, active ms, lookups per request, lookup ms)
        let (wall, stacks, active, lookups, lookup_ms): (u64, Vec<(Stack, u64)>, u64, u64, u64) =
            match (new, kind) {
                (false, _) => (100, vec![(CPU_WORK, 1)], 20, 1, 40),
                (true, Regression::Awaiting) => (140, vec![(CPU_WORK, 1)], 20, 3, 30),
                (true, Regression::Cpu) => {
                    (180, vec![(CPU_WORK, 1), (CHECKOUT_PRICING, 8)], 100, 1, 40)
                }
                (true, Regression::Blocked) => (190, vec![(CPU_WORK, 1)], 110, 1, 40),
            };
        for r in 0..3u64 {
            let at = u64::from(new) * 10_000 + r * 1_000;
            let root_id = id;
            let mut root = span("request", Some(version), root_id, wall, stacks.clone());
            root.route = Some(("http.request.method", "POST", "/checkout"));
            root.active_ms = Some(active);
            root.at_ms = Some(at);
            let trace_id = root.trace_id;
            spans.push(root);
            id += 1;
            for call in 0..lookups {
                let mut child = span("inventory.lookup", Some(version), id, lookup_ms, vec![]);
                child.parent = Some(root_id);
                child.trace_id = trace_id;
                child.profile_id = false;
                child.evidence = None;
                child.at_ms = Some(at + 5 + call * lookup_ms);
                spans.push(child);
                id += 1;
            }
        }
        if new {
            for r in 0..3u64 {
                let mut hot = span("request", Some(V2), id, 300, vec![(CPU_WORK, 30)]);
                hot.route = Some(("http.request.method", "GET", "/hot"));
                hot.active_ms = Some(300);
                hot.at_ms = Some(20_000 + r * 1_000);
                spans.push(hot);
                id += 1;
            }
        }
    }
    write(dir.path(), "2026-01-01T00-00-00.000Z", &spans, 0);
    if let Regression::Blocked = kind {
        write_blocked_checkout(dir.path(), &spans);
    }
    dir
}

/// The watchdog's blocked-in-poll profile of [`regression`]'s 2.0.0 `POST /checkout`
/// roots: 90 ms each in `flush_to_slow_disk`.
fn write_blocked_checkout(dir: &Path, spans: &[FixtureSpan]) {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut profile = ProfileBuilder::blocked(start, Duration::from_secs(30));
    let mut addresses = HashMap::new();
    let sleeping: Stack = &[
        "main",
        "handle",
        "flush_to_slow_disk",
        "std::thread::sleep",
        "nanosleep",
    ];
    let checkout_v2 = spans.iter().filter(|s| {
        s.version == Some(V2) && s.parent.is_none() && s.route.map(|r| r.2) == Some("/checkout")
    });
    for s in checkout_v2 {
        let labels = SampleLabels {
            span_id: Some(s.span_id),
            trace_id: Some(s.trace_id),
            span_name: Some(Arc::from(s.name)),
        };
        profile.add_blocked(&frames(sleeping, &mut addresses), &labels, 1, 90 * MS);
    }
    let bytes = encode_gzip(&profile.build()).expect("encode blocked profile");
    std::fs::write(dir.join("2026-01-01T00-00-00.000Z_blocked.pb.gz"), bytes)
        .expect("write blocked profile");
}

/// [`routes_with_active_time`], where the `GET /cpu` spans also allocate (the bridge's
/// `ProfilingAllocator` installed): each carries `profiling.alloc.bytes` 2,500,000 and
/// `profiling.alloc.count` 1,200, and the allocation profile holds, per span, 2 MB under
/// `render_page` (through `Vec` growth and the allocator's frame) and 0.5 MB under
/// `parse_query`. In-use tracking was on: at the profile's end each span's allocations
/// still hold 1 MB under `render_page` (a cache it fills), and 0.5 MB under `warm_cache`
/// allocated in an earlier profile's interval (in use here, allocated nothing here).
pub fn routes_with_allocations() -> tempfile::TempDir {
    let dir = routes_with_active_time();
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut profile = ProfileBuilder::heap(512 * 1024, start, Duration::from_secs(10));
    let mut addresses = HashMap::new();
    let rendering: Stack = &[
        "main",
        "handler",
        "render_page",
        "alloc::raw_vec::RawVec<T,A>::grow_one",
        "<otel_profiling::allocations::allocator::ProfilingAllocator as core::alloc::global::GlobalAlloc>::alloc",
    ];
    let parsing: Stack = &[
        "main",
        "handler",
        "parse_query",
        "alloc::string::String::push",
    ];
    // `routes_with_active_time` numbers GET /cpu's spans 0x6000..=0x6002.
    for id in 0x6000u64..=0x6002 {
        let labels = SampleLabels {
            span_id: Some(id),
            trace_id: Some(0xabc0_0000_0000_0000_0000_0000_0000_0000 | u128::from(id)),
            span_name: Some(Arc::from("request")),
        };
        profile.add_allocations(&frames(rendering, &mut addresses), &labels, 800, 2_000_000);
        profile.add_allocations(&frames(parsing, &mut addresses), &labels, 400, 500_000);
        profile.add_inuse(&frames(rendering, &mut addresses), &labels, 100, 1_000_000);
        let warming: Stack = &["main", "handler", "warm_cache"];
        profile.add_inuse(&frames(warming, &mut addresses), &labels, 50, 500_000);
    }
    let bytes = encode_gzip(&profile.build()).expect("encode allocation profile");
    std::fs::write(
        dir.path().join("2026-01-01T00-00-00.000Z_alloc.pb.gz"),
        bytes,
    )
    .expect("write allocation profile");
    // The spans' attributes, added to the span file's lines.
    let spans_path = dir.path().join("2026-01-01T00-00-00.000Z_spans.jsonl");
    let text = std::fs::read_to_string(&spans_path).expect("span file");
    let mut lines = String::new();
    for line in text.lines() {
        let mut request: Value = serde_json::from_str(line).expect("OTLP JSON");
        for rs in request["resourceSpans"]
            .as_array_mut()
            .expect("resourceSpans")
        {
            for ss in rs["scopeSpans"].as_array_mut().expect("scopeSpans") {
                for span in ss["spans"].as_array_mut().expect("spans") {
                    let id = span["spanId"].as_str().expect("span id");
                    if !["0000000000006000", "0000000000006001", "0000000000006002"].contains(&id) {
                        continue;
                    }
                    let attributes = span["attributes"].as_array_mut().expect("attributes");
                    attributes.push(
                        json!({"key": "profiling.alloc.bytes", "value": {"intValue": "2500000"}}),
                    );
                    attributes.push(
                        json!({"key": "profiling.alloc.count", "value": {"intValue": "1200"}}),
                    );
                }
            }
        }
        lines.push_str(&request.to_string());
        lines.push('\n');
    }
    std::fs::write(&spans_path, lines).expect("write spans");
    dir
}
