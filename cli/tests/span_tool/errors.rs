use std::path::PathBuf;

use otel_profiling_cli::report::SpanReport;
use otel_profiling_cli::ReportError;

use crate::fixture;

fn report_of(dir: &std::path::Path) -> ReportError {
    SpanReport::from_dirs(&[dir.to_path_buf()]).expect_err("should fail")
}

#[test]
fn missing_directory_says_which_and_what_is_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nowhere");
    let err = report_of(&missing);
    assert!(matches!(err, ReportError::DirectoryMissing { .. }));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}: no such directory", missing.display())),
        "{text}"
    );
    assert!(
        text.contains("_cpu.pb.gz") && text.contains("_spans.jsonl"),
        "{text}"
    );

    // A file is not a directory either.
    let file = dir.path().join("file");
    std::fs::write(&file, "x").expect("write");
    assert!(matches!(
        report_of(&file),
        ReportError::DirectoryMissing { .. }
    ));
}

#[test]
fn empty_directory_says_which_and_what_is_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("notes.txt"), "unrelated").expect("write");
    std::fs::write(dir.path().join(".x_cpu.pb.gz.tmp"), "half").expect("write");
    let err = report_of(dir.path());
    assert!(matches!(err, ReportError::DirectoryEmpty { .. }));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "{}: no profile or span files",
            dir.path().display()
        )),
        "{text}"
    );
    assert!(
        text.contains("_cpu.pb.gz") && text.contains("_spans.jsonl"),
        "{text}"
    );
    assert!(matches!(
        SpanReport::from_dirs(&[]),
        Err(ReportError::NoDirectories)
    ));
}

#[test]
fn corrupt_profile_names_the_file_and_the_decoder_message() {
    let dir = fixture::both_versions();
    let bad = dir.path().join("2026-01-01T00-00-20.000Z_cpu.pb.gz");
    // A gzip header followed by garbage.
    std::fs::write(&bad, [0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad, 0xbe, 0xef]).expect("write");
    let err = report_of(dir.path());
    let text = err.to_string();
    assert!(matches!(err, ReportError::CorruptProfile { .. }));
    assert!(
        text.starts_with(&format!(
            "{}: not a valid pprof profile: pprof:",
            bad.display()
        )),
        "{text}"
    );

    // Not gzip, not protobuf.
    std::fs::write(&bad, b"\xff\xff\xff\xff not a profile").expect("write");
    let text = report_of(dir.path()).to_string();
    assert!(text.contains("not a profile.proto message"), "{text}");
}

#[test]
fn malformed_span_line_names_the_file_and_line() {
    let dir = fixture::both_versions();
    let path = dir.path().join("2026-01-01T00-00-30.000Z_spans.jsonl");
    std::fs::write(
        &path,
        "{\"resourceSpans\":[]}\n\n{\"resourceSpans\": [ oops\n",
    )
    .expect("write");
    let err = report_of(dir.path());
    assert!(
        matches!(err, ReportError::MalformedSpanLine { line: 3, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}:3: not an OTLP JSON", path.display())),
        "{text}"
    );

    // Valid JSON, invalid span id.
    std::fs::write(
        &path,
        r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"xyz","name":"a"}]}]}]}"#,
    )
    .expect("write");
    let text = report_of(dir.path()).to_string();
    assert!(text.contains(":1: "), "{text}");
    assert!(
        text.contains("spanId \"xyz\" is not 16 hex digits"),
        "{text}"
    );

    // A CPU attribute that is not an integer.
    std::fs::write(
        &path,
        r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"a","attributes":[{"key":"profiling.cpu.time_ns","value":{"stringValue":"lots"}}]}]}]}]}"#,
    )
    .expect("write");
    let text = report_of(dir.path()).to_string();
    assert!(text.contains("profiling.cpu.time_ns"), "{text}");
}

#[test]
fn a_directory_with_spans_only_still_reports_and_says_no_profiles() {
    let dir = fixture::both_versions();
    for entry in std::fs::read_dir(dir.path()).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.to_string_lossy().ends_with("_cpu.pb.gz") {
            std::fs::remove_file(path).expect("remove");
        }
    }
    let report = SpanReport::from_dirs(&[PathBuf::from(dir.path())]).expect("report");
    let v1 = report.group("GET /report", Some(fixture::V1)).expect("v1");
    // The attributes still say where the CPU went: not "waiting", and not "fast".
    assert_eq!(v1.profile_cpu_ns, 0);
    assert_eq!(v1.verdict, otel_profiling_cli::verdict::Verdict::CpuBound);
    assert!(v1.reason.contains("profiling.cpu.time_ns"), "{}", v1.reason);
    let orders = report
        .group("GET /orders", Some(fixture::V1))
        .expect("orders");
    assert_eq!(
        orders.verdict,
        otel_profiling_cli::verdict::Verdict::Waiting
    );
    assert!(
        orders.reason.contains("no profile file"),
        "{}",
        orders.reason
    );
}
