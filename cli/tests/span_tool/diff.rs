use otel_profiling_cli::diff::VersionDiff;
use otel_profiling_cli::ReportError;

use crate::fixture::{self, MS, V1, V2};
use crate::results;

fn close(a: f64, b: u64) -> bool {
    (a - b as f64).abs() < 1.0
}

fn check_report_diff(diff: &VersionDiff) {
    assert_eq!(diff.span_name, "GET /report");
    assert_eq!((diff.before.requests, diff.after.requests), (4, 4));
    assert!(close(diff.before.cpu_per_request_ns, 80 * MS));
    assert!(close(diff.after.cpu_per_request_ns, 160 * MS));
    assert_eq!(
        diff.before.attribute_cpu_per_request_ns.map(|v| v as u64),
        Some(80 * MS)
    );
    assert_eq!(
        (diff.before.wall_p50_ns, diff.after.wall_p50_ns),
        (120 * MS, 220 * MS)
    );
    let first = &diff.grown[0];
    assert_eq!(first.function, "encode_json", "{:?}", diff.grown);
    assert!(close(first.before_ns, 20 * MS) && close(first.after_ns, 100 * MS));
    assert!(close(first.delta_ns(), 80 * MS));
    // Then the callers on the way there (self unchanged, total grown); render_rows did
    // not grow and is not named.
    let names: Vec<&str> = diff.grown.iter().map(|d| d.function.as_str()).collect();
    assert_eq!(
        names,
        [
            "encode_json",
            "paginate",
            "handle_report",
            "main",
            "serialize"
        ]
    );
    // The new code path is named apart.
    let new: Vec<(&str, u64)> = diff
        .new_functions
        .iter()
        .map(|d| (d.function.as_str(), d.total_after_ns as u64 / MS))
        .collect();
    assert_eq!(new, [("paginate", 100)]);
}

#[test]
fn diff_by_version_names_the_grown_function_first() {
    let dir = fixture::both_versions();
    let diff = VersionDiff::between_versions(dir.path(), "GET /report", V1, V2).expect("diff");
    check_report_diff(&diff);
    assert_eq!(
        (diff.before.label.as_str(), diff.after.label.as_str()),
        (V1, V2)
    );
}

#[test]
fn diff_between_directories_gives_the_same_answer() {
    let (before, after) = fixture::one_version_each();
    let diff = VersionDiff::between_dirs(before.path(), after.path(), "GET /report").expect("diff");
    check_report_diff(&diff);
    assert_eq!(diff.before.label, before.path().display().to_string());
}

#[test]
fn diff_display_shows_before_after_and_delta_per_request() {
    let dir = fixture::both_versions();
    let text = VersionDiff::between_versions(dir.path(), "GET /report", V1, V2)
        .expect("diff")
        .to_string();
    // The whole text: the binary's golden file (the diff names no directory).
    results::check("diff_versions.txt", &text);
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("encode_json"))
        .expect("encode_json row");
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells,
        [
            "encode_json",
            "20.00 ms",
            "100.00 ms",
            "+80.00 ms",
            "+80.00 ms"
        ]
    );
}

#[test]
fn diff_with_nothing_grown_says_so() {
    let dir = fixture::both_versions();
    let diff = VersionDiff::between_versions(dir.path(), "GET /report", V2, V1).expect("diff");
    assert!(diff.grown.is_empty(), "{:?}", diff.grown);
    let diff = VersionDiff::between_versions(dir.path(), "GET /orders", V1, V2).expect("diff");
    assert!(diff.grown.is_empty());
    results::check("diff_nothing_grown.txt", &diff.to_string());
}

#[test]
fn unknown_version_lists_the_versions_that_exist() {
    let dir = fixture::both_versions();
    let err =
        VersionDiff::between_versions(dir.path(), "GET /report", V1, "3.0.0").expect_err("3.0.0");
    match &err {
        ReportError::UnknownVersion { available, .. } => assert_eq!(available, &[V1, V2]),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "no \"GET /report\" spans of service.version \"3.0.0\"; versions found: \"1.0.0\", \"2.0.0\""
    );
    // Spans without service.version are asked for as "(none)".
    let diff = VersionDiff::between_versions(dir.path(), "GET /legacy", "(none)", "(none)");
    assert!(diff.is_ok(), "{diff:?}");
}

#[test]
fn unknown_span_name_lists_the_names_that_exist() {
    let (before, after) = fixture::one_version_each();
    let err = VersionDiff::between_dirs(before.path(), after.path(), "GET /search")
        .expect_err("absent in after");
    let text = err.to_string();
    assert!(text.contains(&after.path().display().to_string()), "{text}");
    assert!(
        text.contains("span names found: \"GET /orders\", \"GET /report\""),
        "{text}"
    );
}
