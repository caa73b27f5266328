//! The axum + tower-http service of `axum_routes`, run in-process under load for a few
//! seconds, then the span report over its files: one row per route, named by
//! `otel_profiling::axum::trace_layer()`, with the verdict each route deserves.

use std::path::PathBuf;
use std::time::Duration;

use otel_profiling_cli::input::Input;
use otel_profiling_cli::report::SpanReport;
use otel_profiling_cli::verdict::Verdict;
use otel_profiling_examples::axum_routes;

const LOAD_FOR: Duration = Duration::from_secs(3);

#[test]
fn the_report_has_one_row_per_route_with_its_verdict() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("axum-routes");
    let _ = std::fs::remove_dir_all(&dir);
    let summary = axum_routes::run(&dir, LOAD_FOR).expect("service run");
    assert_eq!(summary.failed, 0, "{summary:?}");
    let report = SpanReport::from_dirs(std::slice::from_ref(&dir)).expect("report");
    println!("{report}");

    // One row per route, each span counted: never one `request` row, never raw paths.
    let version = Some(env!("CARGO_PKG_VERSION"));
    let rows: Vec<(&str, usize)> = report
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.count))
        .collect();
    let [cpu_n, io_n, sleep_n] = summary.answered.map(|n| n as usize);
    assert_eq!(
        rows,
        [
            ("GET /cpu", cpu_n),
            ("GET /io", io_n),
            ("GET /sleep", sleep_n)
        ]
    );
    assert!(summary.answered.iter().all(|&n| n >= 5), "{summary:?}");
    // The CPU samples carry the same names (their `span_name` label).
    let input = Input::load(std::slice::from_ref(&dir)).expect("input");
    let mut labels: Vec<&str> = input
        .samples
        .iter()
        .filter_map(|s| s.span_name.as_deref())
        .collect();
    labels.sort_unstable();
    labels.dedup();
    assert!(
        labels
            .iter()
            .all(|l| ["GET /cpu", "GET /io", "GET /sleep"].contains(l)),
        "{labels:?}"
    );
    let group = |name| report.group(name, version).expect(name);

    // GET /cpu computes. Its CPU/wall is what the machine gave the handler: the handlers'
    // own thread-CPU account says how much, and the profile must agree with it.
    let cpu = group("GET /cpu");
    let measured = summary.measured.get("/cpu").ratio();
    println!(
        "GET /cpu: report CPU/wall {:.2}, handlers' own account {measured:.2}",
        cpu.cpu_ratio
    );
    assert!(
        (cpu.cpu_ratio - measured).abs() < 0.15,
        "the profile's CPU/wall {:.2} vs measured {measured:.2}",
        cpu.cpu_ratio
    );
    if measured >= 0.6 {
        assert_eq!(cpu.verdict, Verdict::CpuBound, "{}", cpu.reason);
    } else {
        // Other processes took the CPU (a loaded CI machine): the verdict follows the
        // ratio, which is checked above; "CPU-bound" cannot be demanded then.
        println!("note: the machine gave GET /cpu only {measured:.2} of its wall time");
        assert_ne!(cpu.verdict, Verdict::Waiting, "{}", cpu.reason);
    }

    // And the report points at the handler's own function, not at runtime frames.
    let top = cpu.user_self.first().map(|f| f.function.as_str());
    // `checksums`, or the handler closure it is inlined into when the naming pass gives
    // the closure without its inlined frame (seen intermittently on a 2-core machine:
    // 2 of 3 runs; under investigation) — either way the handler's code, not runtime.
    assert!(
        top.is_some_and(|f| f.ends_with("axum_routes::checksums")
            || f.starts_with("otel_profiling_examples::axum_routes::cpu::{{closure}}")),
        "{:?}",
        cpu.user_self
    );

    // GET /io awaits its dependency: little CPU for a long wall time.
    let io = group("GET /io");
    assert_eq!(io.verdict, Verdict::Waiting, "{}", io.reason);
    assert!(io.cpu_ratio < 0.1, "{}", io.cpu_ratio);

    // GET /sleep blocks its runtime worker in `std::thread::sleep`: the thread uses no CPU,
    // like GET /io, but a thread sits inside the span the whole time
    // (`profiling.wall.active_ns` ≈ wall), so it is "blocked in poll", not "waiting".
    let sleep = group("GET /sleep");
    assert_eq!(sleep.verdict, Verdict::BlockedInPoll, "{}", sleep.reason);
    // The watchdog's blocked-in-poll profile says where: the handler's own code, found by
    // unwinding the blocked thread's stack (optimised code: no frame pointers kept).
    let blocks_in = sleep.blocking.first().map(|f| f.function.as_str());
    assert!(
        blocks_in.is_some_and(|f| f.starts_with("otel_profiling_examples::axum_routes::")),
        "{:?} ({})",
        sleep.blocking,
        sleep.reason
    );
    assert!(
        sleep
            .reason
            .contains("it blocks in otel_profiling_examples::axum_routes::"),
        "{}",
        sleep.reason
    );
    assert!(sleep.cpu_ratio < 0.1, "{}", sleep.cpu_ratio);
    assert!(summary.measured.get("/sleep").ratio() < 0.1);
    assert!(
        sleep.split.blocked_ns as f64 >= 0.8 * sleep.wall_total_ns as f64,
        "{:?}",
        sleep.split
    );
    assert!(
        io.split.awaiting_ns as f64 >= 0.8 * io.wall_total_ns as f64,
        "{:?}",
        io.split
    );
}
