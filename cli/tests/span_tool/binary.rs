use std::process::{Command, Output};

use crate::fixture;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .args(args)
        .output()
        .expect("run otel-profiling")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn binary_report_flame_and_diff_on_a_fixture() {
    let dir = fixture::both_versions();
    let path = dir.path().to_str().expect("utf-8 temp path");

    let out = run(&["report", path]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("VERDICT"), "{stdout}");
    assert!(
        stdout.contains("CPU-bound") && stdout.contains("waiting"),
        "{stdout}"
    );

    let svg = dir.path().join("report.svg");
    let out = run(&[
        "flame",
        path,
        "--span-name",
        "GET /report",
        "-o",
        svg.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let drawn = std::fs::read_to_string(&svg).expect("svg written");
    assert!(drawn.contains("CPU of spans named GET /report") && drawn.contains("encode_json"));

    let out = run(&[
        "diff",
        path,
        "--span-name",
        "GET /report",
        "--from",
        "1.0.0",
        "--to",
        "2.0.0",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("encode_json"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn binary_diff_of_two_directories() {
    let (before, after) = fixture::one_version_each();
    let out = run(&[
        "diff",
        before.path().to_str().expect("utf-8"),
        after.path().to_str().expect("utf-8"),
        "--span-name",
        "GET /report",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("+80.00 ms"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn binary_fails_with_the_message() {
    let dir = fixture::both_versions();
    let path = dir.path().to_str().expect("utf-8");
    let out = run(&["report", "/nonexistent/otel-profiling-dir"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).starts_with("error: /nonexistent/otel-profiling-dir: no such directory"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&[
        "diff",
        path,
        "--span-name",
        "GET /report",
        "--from",
        "1.0.0",
        "--to",
        "9",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("versions found: \"1.0.0\", \"2.0.0\""),
        "{}",
        text(&out.stderr)
    );

    let out = run(&["flame", path, "--span-id", "zz", "-o", "/dev/null"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("not 16 hexadecimal digits"));

    // Usage errors: one directory without versions; both selections at once.
    let out = run(&["diff", path, "--span-name", "GET /report"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("give --from and --to"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&[
        "flame",
        path,
        "--span-id",
        "0000000000002000",
        "--span-name",
        "x",
        "-o",
        "/dev/null",
    ]);
    assert!(!out.status.success());
}

/// `report | head -1`: the reader goes away; the tool stops quietly with success instead
/// of panicking on the broken pipe. The read end is closed before the tool writes, so
/// every write meets the broken pipe, however small the report.
#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    use std::process::Stdio;
    let dir = fixture::both_versions();
    let path = dir.path().to_str().expect("utf-8 temp path");
    for args in [
        vec!["report", path],
        vec![
            "diff",
            path,
            "--span-name",
            "GET /report",
            "--from",
            "1.0.0",
            "--to",
            "2.0.0",
        ],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run otel-profiling");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("exit");
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}: {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
