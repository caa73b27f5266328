use std::path::PathBuf;

use otel_profiling_cli::report::SpanReport;
use otel_profiling_cli::verdict::{NoSamples, Verdict};

use crate::fixture::{self, MS, V1, V2};
use crate::results;

fn report() -> (tempfile::TempDir, SpanReport) {
    let dir = fixture::both_versions();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    (dir, report)
}

#[test]
fn groups_local_roots_by_name_and_version() {
    let (_dir, report) = report();
    let keys: Vec<(&str, Option<&str>, usize)> = report
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.version.as_deref(), g.count))
        .collect();
    assert_eq!(
        keys,
        [
            ("GET /health", Some(V1), 2),
            ("GET /legacy", None, 1),
            ("GET /orders", Some(V1), 3),
            ("GET /orders", Some(V2), 2),
            ("GET /report", Some(V1), 4),
            ("GET /report", Some(V2), 4),
            ("GET /search", Some(V1), 1),
        ],
        "db.query children are not local roots"
    );
    assert_eq!(report.profile_files, 2);
    assert_eq!(report.span_files, 2);
    assert_eq!(report.sampling.period_ns, 10 * MS);
}

#[test]
fn wall_percentiles_and_cpu_from_profile_and_attributes() {
    let (_dir, report) = report();
    let v1 = report.group("GET /report", Some(V1)).expect("v1 group");
    assert_eq!(v1.wall_p50_ns, 120 * MS);
    assert_eq!(v1.wall_p95_ns, 200 * MS);
    assert_eq!(v1.wall_total_ns, 560 * MS);
    assert_eq!(v1.profile_cpu_ns, 320 * MS);
    assert_eq!(v1.profile_samples, 32);
    assert_eq!(v1.attribute_cpu_ns, Some(320 * MS));
    assert_eq!(v1.attribute_samples, Some(32));
    assert!(
        (v1.cpu_ratio - 320.0 / 560.0).abs() < 1e-9,
        "{}",
        v1.cpu_ratio
    );

    let v2 = report.group("GET /report", Some(V2)).expect("v2 group");
    assert_eq!((v2.wall_p50_ns, v2.wall_p95_ns), (220 * MS, 300 * MS));
    assert_eq!(v2.profile_cpu_ns, 640 * MS);
    assert_eq!(v2.attribute_cpu_ns, Some(640 * MS));
    assert!((v2.cpu_ratio - 640.0 / 960.0).abs() < 1e-9);

    let orders = report.group("GET /orders", Some(V1)).expect("orders");
    assert_eq!(
        (orders.wall_p50_ns, orders.wall_p95_ns),
        (400 * MS, 500 * MS)
    );
    assert_eq!(orders.profile_cpu_ns, 0);
    assert_eq!(orders.attribute_cpu_ns, Some(0));
    assert_eq!(orders.cpu_ratio, 0.0);

    let legacy = report.group("GET /legacy", None).expect("legacy");
    assert_eq!(legacy.attribute_cpu_ns, None, "no evidence is not a zero");
}

#[test]
fn verdicts_follow_the_cpu_wall_ratio() {
    let (_dir, report) = report();
    let verdict = |name, version| report.group(name, version).expect(name).verdict;
    assert_eq!(verdict("GET /report", Some(V1)), Verdict::CpuBound);
    assert_eq!(verdict("GET /report", Some(V2)), Verdict::CpuBound);
    let search = report.group("GET /search", Some(V1)).expect("search");
    assert_eq!(search.verdict, Verdict::Mixed);
    assert!((search.cpu_ratio - 0.3).abs() < 1e-9);
    assert!(search.reason.contains("30%"), "{}", search.reason);
    assert!(report
        .group("GET /report", Some(V1))
        .expect("v1")
        .reason
        .contains("computing"));
}

#[test]
fn slow_span_with_an_empty_profile_is_waiting_never_fast() {
    let (_dir, report) = report();
    let orders = report.group("GET /orders", Some(V1)).expect("orders");
    assert_eq!(orders.verdict, Verdict::Waiting);
    assert_eq!(orders.no_samples, Some(NoSamples::Waiting));
    assert!(
        orders.reason.contains("waiting") && orders.reason.contains("not computing"),
        "{}",
        orders.reason
    );
    assert!(!orders.reason.contains("fast"), "{}", orders.reason);
    assert!(orders.top_self.is_empty() && orders.top_total.is_empty());
    let text = report.to_string();
    let row = text
        .lines()
        .find(|l| l.starts_with("GET /orders") && l.contains(V1))
        .expect("orders row");
    assert!(row.trim_end().ends_with("waiting"), "{row}");
}

#[test]
fn short_and_unsampled_spans_without_samples_are_explained() {
    let (_dir, report) = report();
    let health = report.group("GET /health", Some(V1)).expect("health");
    assert_eq!(health.verdict, Verdict::Waiting);
    assert_eq!(health.no_samples, Some(NoSamples::TooShort));
    assert!(
        health.reason.contains("too short for the sampling period"),
        "{}",
        health.reason
    );
    assert!(health.reason.contains("~20 ms"), "{}", health.reason);

    // Unsampled and no evidence attribute: nothing says it waited.
    let legacy = report.group("GET /legacy", None).expect("legacy");
    assert_eq!(legacy.verdict, Verdict::NoEvidence);
    assert_eq!(legacy.no_samples, Some(NoSamples::Unsampled));
    assert!(
        legacy.reason.contains("pyroscope.profile.id"),
        "{}",
        legacy.reason
    );

    // Every local root span without samples is listed with its reason.
    let listed = |name: &str| -> Vec<NoSamples> {
        report
            .without_samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.reason)
            .collect()
    };
    assert_eq!(listed("GET /orders"), vec![NoSamples::Waiting; 5]);
    assert_eq!(listed("GET /health"), vec![NoSamples::TooShort; 2]);
    assert_eq!(listed("GET /legacy"), vec![NoSamples::Unsampled]);
    assert!(listed("GET /report").is_empty());
    // How the list is printed: the golden report.txt (binary.rs).
}

#[test]
fn top_functions_by_self_and_total_cpu() {
    let (_dir, report) = report();
    let v2 = report.group("GET /report", Some(V2)).expect("v2");
    let named = |list: &[otel_profiling_cli::functions::FunctionCpu]| -> Vec<(String, u64)> {
        list.iter()
            .map(|f| (f.function.clone(), f.cpu_ns / MS))
            .collect()
    };
    assert_eq!(
        named(&v2.top_self),
        [
            ("encode_json".to_owned(), 400),
            ("render_rows".to_owned(), 240)
        ]
    );
    // main and handle_report are on every stack; among equals, the deeper one first.
    assert_eq!(
        named(&v2.top_total),
        [
            ("handle_report".to_owned(), 640),
            ("main".to_owned(), 640),
            ("encode_json".to_owned(), 400),
            ("paginate".to_owned(), 400),
            ("serialize".to_owned(), 400),
        ]
    );
    // An inlined function is its own frame, innermost first.
    let search = report.group("GET /search", Some(V1)).expect("search");
    assert_eq!(named(&search.top_self), [("search_index".to_owned(), 30)]);
    assert_eq!(
        named(&search.top_total),
        [
            ("search_index".to_owned(), 30),
            ("handle_search".to_owned(), 30),
            ("main".to_owned(), 30),
        ]
    );
}

#[test]
fn the_users_functions_come_first_under_async_runtime_frames() {
    let dir = fixture::async_service();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let g = report.group("GET /catalog", Some(V1)).expect("group");
    let named = |list: &[otel_profiling_cli::functions::FunctionCpu]| -> Vec<(String, u64)> {
        list.iter()
            .map(|f| (f.function.clone(), f.cpu_ns / MS))
            .collect()
    };
    // serde and alloc under serialize_catalog are charged to it; clock_gettime to the
    // handler that asked the time.
    assert_eq!(
        named(&g.user_self),
        [
            (fixture::SERIALIZE_CATALOG.to_owned(), 40),
            (fixture::HANDLER.to_owned(), 30),
        ]
    );
    assert_eq!(
        named(&g.user_total),
        [
            (fixture::HANDLER.to_owned(), 70),
            (fixture::SERIALIZE_CATALOG.to_owned(), 40),
        ]
    );
    assert_eq!(
        named(&g.grouped),
        [("libc".to_owned(), 50), ("alloc".to_owned(), 20),]
    );

    // The text lists the user's functions under each title, and names what was grouped.
    let text = report.to_string();
    let after = |title: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.contains(title))
            .skip(2)
            .take(2)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(
        after("top functions of your code by self CPU"),
        [
            format!("40.0 ms 40.0% {}", fixture::SERIALIZE_CATALOG),
            format!("30.0 ms 30.0% {}", fixture::HANDLER),
        ],
        "{text}"
    );
    assert_eq!(
        after("top functions of your code by total CPU"),
        [
            format!("70.0 ms 70.0% {}", fixture::HANDLER),
            format!("40.0 ms 40.0% {}", fixture::SERIALIZE_CATALOG),
        ],
        "{text}"
    );
    assert!(
        text.contains("in runtime and libraries (innermost frame; --all-frames lists them): libc 50.0%, alloc 20.0%"),
        "{text}"
    );

    // Every frame, as before, on request: the runtime's frames hold 100 % of the total
    // and fill the list.
    let all = SpanReport {
        all_frames: true,
        ..report
    }
    .to_string();
    assert!(
        all.contains("top functions by total CPU (anywhere on the stack):"),
        "{all}"
    );
    assert!(
        all.contains("100.0%  std::rt::lang_start_internal"),
        "{all}"
    );
    assert!(!all.contains("in runtime and libraries"), "{all}");
}

#[test]
fn samples_without_a_span_id_are_reported_apart() {
    let (_dir, report) = report();
    assert_eq!(
        report.outside_spans.name_only,
        [("GET /report".to_owned(), 20 * MS)]
    );
    assert_eq!(report.outside_spans.unknown_span_ns, 0);
    assert_eq!(report.outside_spans.no_span_ns, 0);
    // Not counted in either version's group.
    assert_eq!(
        report
            .group("GET /report", Some(V1))
            .expect("v1")
            .profile_cpu_ns,
        320 * MS
    );
    // How it is printed: the golden report.txt (binary.rs).
}

#[test]
fn display_is_a_readable_table() {
    let (dir, report) = report();
    let text = report.to_string();
    // The whole text (header, rows, explanations, top functions): the binary's golden
    // file, which reads the same directory as `.` (the path is on a line of its own).
    results::check(
        "report.txt",
        &text.replace(&dir.path().display().to_string(), "."),
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("GET /report") && l.contains(V2))
        .expect("v2 row");
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "GET /report",
            V2,
            "4",
            "220.0 ms",
            "300.0 ms",
            "640.0 ms",
            "640.0 ms",
            // No active time on any group's spans: CPU against not on CPU, each share as
            // the sentence prints it.
            "67%",
            "33%",
            "CPU-bound"
        ]
    );
}

#[test]
fn several_directories_are_read_together_and_each_once() {
    let (before, after) = fixture::one_version_each();
    let dirs: Vec<PathBuf> = vec![
        before.path().to_path_buf(),
        after.path().to_path_buf(),
        before.path().to_path_buf(),
    ];
    let report = SpanReport::from_dirs(&dirs).expect("report");
    assert_eq!(report.dirs.len(), 2);
    assert_eq!(report.group("GET /report", Some(V1)).expect("v1").count, 4);
    assert_eq!(
        report
            .group("GET /report", Some(V2))
            .expect("v2")
            .profile_cpu_ns,
        640 * MS
    );
    assert_eq!(
        report
            .group("GET /report", Some(V1))
            .expect("v1")
            .profile_cpu_ns,
        320 * MS
    );
}

/// tower-http's default `TraceLayer` names every root span `request`: grouped by span name,
/// every endpoint would be one row (here `request`, 8 spans, CPU/wall 0.375, "mixed"). Spans carrying
/// `http.route` are grouped by `{method} {route}` instead.
#[test]
fn spans_with_a_route_are_grouped_by_method_and_route() {
    let dir = fixture::spans_named_request_with_routes();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let rows: Vec<(&str, usize, u64, Verdict)> = report
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.count, g.profile_cpu_ns / MS, g.verdict))
        .collect();
    assert_eq!(
        rows,
        [
            ("GET /cpu", 3, 240, Verdict::CpuBound),
            ("GET /io", 3, 0, Verdict::Waiting),
            // The older conventions' `http.method` names the method too.
            ("POST /items/{id}", 2, 60, Verdict::Mixed),
        ]
    );
    let text = report.to_string();
    assert!(
        text.contains("GET /cpu, version 1.0.0: CPU-bound"),
        "{text}"
    );
    assert!(!text.contains("\nrequest"), "{text}");

    // The flame graph and the diff select the same rows by that name.
    let graph = otel_profiling_cli::flame::FlameGraph::from_dirs(
        &[dir.path().to_path_buf()],
        &otel_profiling_cli::flame::FlameSelection::SpanName("GET /cpu".into()),
    )
    .expect("flame of a route");
    assert_eq!((graph.samples, graph.cpu_ns), (24, 240 * MS));
    let diff = otel_profiling_cli::diff::VersionDiff::between_dirs(
        dir.path(),
        dir.path(),
        "POST /items/{id}",
    )
    .expect("diff of a route");
    assert_eq!(diff.before.requests, 2, "{diff}");
}

/// Issue 11: with the spans' active time, a route that holds its thread off CPU (a
/// blocking call inside the poll) is "blocked in poll", not "waiting" like one that awaits;
/// without active time both would read "waiting" (CPU/wall ≈ 0).
#[test]
fn a_span_holding_its_thread_off_cpu_is_blocked_in_poll_not_waiting() {
    let dir = fixture::routes_with_active_time();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let rows: Vec<(&str, Verdict, u64, u64)> = report
        .groups
        .iter()
        .map(|g| {
            (
                g.name.as_str(),
                g.verdict,
                g.split.blocked_ns / MS,
                g.split.awaiting_ns / MS,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("GET /cpu", Verdict::CpuBound, 45, 15),
            ("GET /io", Verdict::Waiting, 6, 294),
            ("GET /sleep", Verdict::BlockedInPoll, 294, 6),
        ]
    );
    let text = report.to_string();
    let sleep = text
        .lines()
        .find(|l| l.starts_with("GET /sleep, "))
        .expect("sleep group");
    assert!(
        sleep.contains("blocked in poll — blocked in poll 98% of the wall time (awaiting 2%)"),
        "{sleep}"
    );
    let io = text
        .lines()
        .find(|l| l.starts_with("GET /io, "))
        .expect("io group");
    assert!(io.contains("waiting") && io.contains("no thread"), "{io}");
    assert!(
        text.contains(
            "where the wall time went: CPU 0.0 ms (0%), blocked in poll 294.0 ms (98%), awaiting \
             6.0 ms (2%)"
        ),
        "{text}"
    );
}

/// Issue 11: a waiting span names the child spans that cover its waiting ("waiting on a
/// dependency"), or says to instrument the call when none does.
#[test]
fn waiting_names_the_child_spans_covering_it_or_asks_for_instrumentation() {
    let dir = fixture::waiting_with_and_without_child_spans();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let orders = report.group("GET /orders", Some(V1)).expect("orders");
    assert_eq!(orders.verdict, Verdict::Waiting, "{}", orders.reason);
    assert!(
        orders.reason.contains(
            "waiting on a dependency: 3 × inventory.lookup (90.0 ms), covering 90.0 of its 98.0 ms per span awaiting"
        ),
        "{}",
        orders.reason
    );
    assert_eq!(orders.dependencies.roots, 2);
    assert_eq!(orders.dependencies.covered_ns, 2 * 90 * MS);
    let slow = report.group("GET /slow", Some(V1)).expect("slow");
    assert_eq!(slow.verdict, Verdict::Waiting, "{}", slow.reason);
    assert!(
        slow.reason.contains(
            "no child span covers its 98.0 ms per span awaiting: instrument the dependency call"
        ),
        "{}",
        slow.reason
    );
    // Child spans are not rows of their own.
    assert!(report.group("inventory.lookup", Some(V1)).is_none());
}

/// Issue 11 item 2: a span whose futures were woken but not polled for most of its time was
/// queued behind other work — not "waiting" — and the concurrent activity shows the work.
#[test]
fn woken_but_not_polled_is_queued_not_waiting() {
    let dir = fixture::queued_behind_cpu_work();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let poll = report.group("GET /poll", Some(V1)).expect("poll");
    assert_eq!(poll.verdict, Verdict::Queued, "{}", poll.reason);
    assert!(
        poll.reason.starts_with(
            "queued 80% of the wall time (blocked in poll 2%, awaiting 18%): woken but not \
             yet polled"
        ) && !poll.reason.contains("is waiting"),
        "{}",
        poll.reason
    );
    assert_eq!(
        (poll.split.queued_ns, poll.split.awaiting_ns),
        (3 * 80 * MS, 3 * 18 * MS)
    );
    let concurrent = poll.concurrent.as_ref().expect("shown for a queued group");
    assert_eq!(
        concurrent.by_span.first().map(|(n, _)| n.as_str()),
        Some("request")
    );
    let text = report.to_string();
    assert!(
        text.contains(
            "where the wall time went: CPU 0.0 ms (0%), blocked in poll 6.0 ms (2%), queued \
             240.0 ms (80%), awaiting 54.0 ms (18%)"
        ),
        "{text}"
    );
}

/// Issue 11 item 4: a group blocked in poll names where it blocks, from the watchdog's
/// blocked-in-poll profile (`*_blocked.pb.gz`): the user's function holding the blocked
/// wall time, not the runtime's or std's.
#[test]
fn blocked_in_poll_names_the_blocking_function_from_the_blocked_profile() {
    let dir = fixture::routes_with_blocked_profile();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let sleep = report.group("GET /sleep", Some(V1)).expect("sleep");
    assert_eq!(sleep.verdict, Verdict::BlockedInPoll, "{}", sleep.reason);
    assert_eq!(sleep.blocked_profile_ns, 3 * 95 * MS);
    assert_eq!(
        sleep
            .blocking
            .iter()
            .map(|f| (f.function.as_str(), f.cpu_ns / MS))
            .collect::<Vec<_>>(),
        [("flush_to_slow_disk", 270), ("take_lock", 15)]
    );
    assert!(
        sleep
            .reason
            .contains("it blocks in flush_to_slow_disk (95% of the blocked time"),
        "{}",
        sleep.reason
    );
    assert!(
        report
            .to_string()
            .contains("where it blocks (blocked-in-poll profile, 285.0 ms blocked in all): flush_to_slow_disk 270.0 ms, take_lock 15.0 ms"),
        "{report}"
    );
    // The blocked profile is not CPU: the CPU figures are unchanged by it.
    assert_eq!(sleep.profile_cpu_ns, 0);
    let cpu = report.group("GET /cpu", Some(V1)).expect("cpu");
    assert!(cpu.blocking.is_empty());
}

/// Requests no route matched (a method, no `http.route`: 404s) are no endpoint: their
/// group sorts last and is one line at the report's end, without advice; spans all
/// named `request` get the hint naming `otel_profiling::axum::trace_layer()`.
#[test]
fn unmatched_routes_come_last_in_one_line_and_request_spans_get_the_route_hint() {
    let dir = fixture::unmatched_and_unnamed_requests();
    let report = SpanReport::from_dirs(&[dir.path().to_path_buf()]).expect("report");
    let names: Vec<(&str, bool)> = report
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.unmatched_route))
        .collect();
    assert_eq!(
        names,
        [("GET /cpu", false), ("request", false), ("GET", true)]
    );
    let text = report.to_string();
    assert!(
        text.contains(
            "\nUnmatched routes (no http.route: 404s and other requests no route matched, not \
             endpoints): GET, version 1.0.0 (4 span(s), wall p50 1.0 ms)"
        ),
        "{text}"
    );
    // No section, no table row and no advice for them.
    assert!(!text.contains("\nGET, version"), "{text}");
    assert!(!text.contains("\nGET  "), "{text}");
    assert!(!text.contains("instrument the dependency call"), "{text}");
    assert!(!text.contains("Spans without CPU samples"), "{text}");
    let request = text
        .split("\nrequest, version 1.0.0:")
        .nth(1)
        .expect("the request group's section");
    assert!(
        request.contains(
            "hint: every span is named `request` with no http.route (tower-http's \
             `TraceLayer::new_for_http()`), so all endpoints share this one row: \
             `otel_profiling::axum::trace_layer()` names server spans `{method} {route}`"
        ),
        "{text}"
    );
    // A routed group gets no such hint.
    let cpu = text
        .split("\nGET /cpu, version 1.0.0:")
        .nth(1)
        .expect("cpu section");
    assert!(
        !cpu.split("\nrequest")
            .next()
            .unwrap_or("")
            .contains("hint:"),
        "{text}"
    );
}
