//! `diff`'s split per version: where each version's wall time went (CPU, blocked in poll,
//! awaiting), its verdict, and which part grew — for a regression in each part.

use std::process::Command;

use otel_profiling_cli::diff::VersionDiff;
use otel_profiling_cli::split::Part;
use otel_profiling_cli::verdict::Verdict;

use crate::fixture::{self, Regression, MS, V1, V2};

const ENDPOINT: &str = "POST /checkout";

fn diff(kind: Regression) -> (tempfile::TempDir, VersionDiff) {
    let dir = fixture::regression(kind);
    let diff = VersionDiff::between_versions(dir.path(), ENDPOINT, V1, V2).expect("diff");
    (dir, diff)
}

/// (part, ms per request) of a side's own split.
fn parts_ms(parts: Vec<(Part, f64)>) -> Vec<(Part, f64)> {
    parts
        .into_iter()
        .map(|(p, ns)| (p, ns / MS as f64))
        .collect()
}

/// (part, growth in ms per request), the one that grew most first.
fn deltas_ms(diff: &VersionDiff) -> Vec<(Part, f64)> {
    diff.parts
        .iter()
        .map(|p| (p.part, p.delta_ns() / MS as f64))
        .collect()
}

/// 1.0.0 is the same in every fixture: 100 ms, 10 ms CPU in one sample, 10 ms blocked,
/// 80 ms awaiting one inventory.lookup.
fn check_before(diff: &VersionDiff) {
    let b = &diff.before;
    assert_eq!(
        b.requests, 3,
        "GET /hot's request spans are another endpoint"
    );
    assert_eq!(
        parts_ms(b.parts_per_request()),
        [
            (Part::Cpu, 10.0),
            (Part::Blocked, 10.0),
            (Part::Awaiting, 80.0)
        ]
    );
    assert_eq!(b.split.cpu_samples, 3);
    assert_eq!(b.verdict, Verdict::Mixed);
}

/// The `diff` binary's text for the fixture.
fn diff_text(dir: &tempfile::TempDir) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .arg("diff")
        .arg(dir.path())
        .args(["--span-name", ENDPOINT, "--from", V1, "--to", V2])
        .output()
        .expect("run otel-profiling");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The cells of the split table's row for `label`.
fn split_row(text: &str, label: &str) -> Vec<String> {
    let table = text
        .split("Where the wall time went, per request")
        .nth(1)
        .expect("split table");
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .expect("row of the version");
    row.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

fn what_changed(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix("What changed: "))
        .expect("a What changed line")
}

#[test]
fn an_awaiting_regression_is_named_first_with_the_dependency_awaited() {
    let (dir, diff) = diff(Regression::Awaiting);
    check_before(&diff);
    assert_eq!(
        parts_ms(diff.after.parts_per_request()),
        [
            (Part::Cpu, 10.0),
            (Part::Blocked, 10.0),
            (Part::Awaiting, 120.0)
        ]
    );
    assert_eq!(
        deltas_ms(&diff),
        [
            (Part::Awaiting, 40.0),
            (Part::Cpu, 0.0),
            (Part::Blocked, 0.0)
        ]
    );
    assert_eq!(diff.after.verdict, Verdict::Waiting);
    assert!(
        diff.after.reason.contains("3 × inventory.lookup"),
        "{}",
        diff.after.reason
    );

    let text = diff_text(&dir);
    println!("{text}");
    assert_eq!(
        what_changed(&text),
        "wall p50 +40.00 ms (mean +40.00 ms per request): awaiting +40.00 ms (now waiting on \
         3 × inventory.lookup (90.0 ms); was 1 × inventory.lookup (40.0 ms)); verdict mixed → \
         waiting"
    );
    assert_eq!(
        split_row(&text, V1),
        [
            V1,
            "100.00 ms",
            "3",
            "10.00 ms (10%)",
            "10.00 ms (10%)",
            "80.00 ms (80%)",
            "mixed"
        ]
    );
    assert_eq!(
        split_row(&text, V2),
        [
            V2,
            "140.00 ms",
            "3",
            "10.00 ms (7%)",
            "10.00 ms (7%)",
            "120.00 ms (86%)",
            "waiting"
        ]
    );
    let header: Vec<&str> = text
        .lines()
        .find(|l| l.contains("CPU SAMPLES") && l.contains("VERDICT"))
        .expect("split header")
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "WALL",
            "CPU SAMPLES",
            "CPU",
            "BLOCKED IN POLL",
            "AWAITING",
            "VERDICT"
        ]
    );
}

#[test]
fn a_cpu_regression_is_named_first_with_the_function_that_grew() {
    let (dir, diff) = diff(Regression::Cpu);
    check_before(&diff);
    assert_eq!(
        parts_ms(diff.after.parts_per_request()),
        [
            (Part::Cpu, 90.0),
            (Part::Blocked, 10.0),
            (Part::Awaiting, 80.0)
        ]
    );
    assert_eq!(
        deltas_ms(&diff),
        [
            (Part::Cpu, 80.0),
            (Part::Blocked, 0.0),
            (Part::Awaiting, 0.0)
        ]
    );
    assert_eq!(diff.after.split.cpu_samples, 27);
    assert_eq!(diff.after.verdict, Verdict::CpuBound);

    let text = diff_text(&dir);
    println!("{text}");
    assert_eq!(
        what_changed(&text),
        "wall p50 +80.00 ms (mean +80.00 ms per request): CPU +80.00 ms (in price_rules: its \
         total CPU per request +80.00 ms); verdict mixed → CPU-bound"
    );
    assert_eq!(
        split_row(&text, V2),
        [
            V2,
            "180.00 ms",
            "27",
            "90.00 ms (50%)",
            "10.00 ms (6%)",
            "80.00 ms (44%)",
            "CPU-bound"
        ]
    );
}

#[test]
fn a_blocked_in_poll_regression_is_named_first_with_where_it_blocks() {
    let (dir, diff) = diff(Regression::Blocked);
    check_before(&diff);
    assert_eq!(
        parts_ms(diff.after.parts_per_request()),
        [
            (Part::Cpu, 10.0),
            (Part::Blocked, 100.0),
            (Part::Awaiting, 80.0)
        ]
    );
    assert_eq!(
        deltas_ms(&diff),
        [
            (Part::Blocked, 90.0),
            (Part::Cpu, 0.0),
            (Part::Awaiting, 0.0)
        ]
    );
    assert_eq!(diff.after.verdict, Verdict::BlockedInPoll);

    let text = diff_text(&dir);
    println!("{text}");
    assert_eq!(
        what_changed(&text),
        "wall p50 +90.00 ms (mean +90.00 ms per request): blocked in poll +90.00 ms (now blocks \
         in flush_to_slow_disk); verdict mixed → blocked in poll"
    );
    assert_eq!(
        split_row(&text, V2),
        [
            V2,
            "190.00 ms",
            "3",
            "10.00 ms (5%)",
            "100.00 ms (53%)",
            "80.00 ms (42%)",
            "blocked in poll"
        ]
    );
}
