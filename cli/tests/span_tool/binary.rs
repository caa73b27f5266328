use std::path::Path;
use std::process::{Command, Output};

use crate::{fixture, golden, results};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .args(args)
        .output()
        .expect("run otel-profiling")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the tool inside `dir` (output names relative paths only).
fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run otel-profiling")
}

/// Standard output of a successful run inside `dir`.
fn stdout_in(dir: &Path, args: &[&str]) -> String {
    let out = run_in(dir, args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The SVG `flame` writes for `selection` (`--span-id …` or `--span-name …`) of `dir`.
fn flame(dir: &Path, selection: &[&str]) -> String {
    let mut args = vec!["flame", "."];
    args.extend_from_slice(selection);
    args.extend(["-o", "flame.svg"]);
    stdout_in(dir, &args);
    let svg = dir.join("flame.svg");
    let drawn = std::fs::read_to_string(&svg).expect("svg written");
    std::fs::remove_file(&svg).expect("remove the svg");
    drawn
}

/// `diff . --span-name name --from from --to to`.
const fn diff<'a>(name: &'a str, from: &'a str, to: &'a str) -> [&'a str; 8] {
    ["diff", ".", "--span-name", name, "--from", from, "--to", to]
}

#[test]
fn binary_report_matches_its_golden_files() {
    let dir = fixture::both_versions();
    results::check("report.txt", &stdout_in(dir.path(), &["report", "."]));
    results::check(
        "report_all_frames.txt",
        &stdout_in(dir.path(), &["report", ".", "--all-frames"]),
    );
    let blocked = fixture::routes_with_blocked_profile();
    results::check(
        "report_blocked.txt",
        &stdout_in(blocked.path(), &["report", "."]),
    );
    let allocating = fixture::routes_with_allocations();
    results::check(
        "report_alloc.txt",
        &stdout_in(allocating.path(), &["report", "."]),
    );
}

#[test]
fn binary_html_report_matches_its_golden_file() {
    let dir = fixture::both_versions();
    let out = stdout_in(dir.path(), &["report", ".", "--html", "report.html"]);
    results::check("report_html_stdout.txt", &out);
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("page written");
    results::check("report.html", &html);
    // Allocations, when the service sampled them: the report's line, on the page too.
    let allocating = fixture::routes_with_allocations();
    stdout_in(allocating.path(), &["report", ".", "--html", "report.html"]);
    let html =
        std::fs::read_to_string(allocating.path().join("report.html")).expect("page written");
    assert!(
        html.contains(
            "<p class=\"allocations\">allocations: 2.50 MB a span, 1200 allocation(s) \
             (profiling.alloc.*, estimated over 3 span(s)); where (allocation profile, 7.50 MB \
             in all): render_page 6.00 MB (80.0%), parse_query 1.50 MB (20.0%); still held at \
             the end of the newest profile (inuse_space): 4.50 MB in all (render_page 3.00 MB, warm_cache 1.50 MB)</p>"
        ),
        "the page lacks the allocation line, with what is still held"
    );
    // And the allocations drawn: a flame graph in bytes, its frames the allocating ones.
    assert!(
        html.contains("allocated (estimated) in") && html.contains(r#"data-n="render_page""#),
        "the page lacks the allocation flame graph"
    );
    assert!(!std::fs::read_to_string(dir.path().join("report.html"))
        .expect("page")
        .contains("class=\"allocations\""));
}

#[test]
fn binary_flame_matches_its_golden_files() {
    let dir = fixture::both_versions();
    results::check(
        "flame_span_name.svg",
        &flame(dir.path(), &["--span-name", "GET /report"]),
    );
    results::check(
        "flame_span_id.svg",
        &flame(dir.path(), &["--span-id", "0000000000002000"]),
    );
}

#[test]
fn binary_diff_matches_its_golden_files() {
    let dir = fixture::both_versions();
    results::check(
        "diff_versions.txt",
        &stdout_in(dir.path(), &diff("GET /report", "1.0.0", "2.0.0")),
    );
    results::check(
        "diff_nothing_grown.txt",
        &stdout_in(dir.path(), &diff("GET /orders", "1.0.0", "2.0.0")),
    );
}

#[test]
fn binary_diff_of_two_directories() {
    let root = fixture::one_version_each_in_one_dir();
    let out = stdout_in(
        root.path(),
        &["diff", "before", "after", "--span-name", "GET /report"],
    );
    assert!(out.contains("+80.00 ms"), "{out}");
    results::check("diff_dirs.txt", &out);
}

/// Each run is a new process, with new hash-map seeds: what iterates a hash map without
/// sorting shows here.
#[test]
fn binary_output_is_the_same_bytes_run_after_run() {
    let dir = fixture::both_versions();
    let blocked = fixture::routes_with_blocked_profile();
    let blocked_path = blocked.path().to_str().expect("utf-8 temp path");
    let runs: [&[&str]; 4] = [
        &["report", "."],
        &["report", ".", blocked_path],
        &["report", ".", "--all-frames"],
        &diff("GET /report", "1.0.0", "2.0.0"),
    ];
    for args in runs {
        let first = stdout_in(dir.path(), args);
        for _ in 0..3 {
            let again = stdout_in(dir.path(), args);
            assert!(
                again == first,
                "{args:?} printed something else the second time:\n{}",
                golden::line_diff(&first, &again)
            );
        }
    }
    let page = |n: usize| {
        let file = format!("report{n}.html");
        stdout_in(dir.path(), &["report", ".", "--html", &file]);
        std::fs::read(dir.path().join(&file)).expect("page written")
    };
    let first = page(0);
    for n in 1..3 {
        assert!(page(n) == first, "the HTML report changed between runs");
    }
    let svg = flame(dir.path(), &["--span-name", "GET /report"]);
    for _ in 0..3 {
        assert_eq!(flame(dir.path(), &["--span-name", "GET /report"]), svg);
    }
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

#[test]
fn investigate_names_the_bad_setting_and_the_unreachable_backend() {
    let out = Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .args(["investigate", "--tempo", "localhost:3200", "--pyroscope"])
        .arg("http://127.0.0.1:9")
        .args(["--trace-id", "0af7651916cd43dd8448eb211c80319c"])
        .env_remove("TEMPO_AUTH_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("TEMPO_URL"),
        "{}",
        text(&out.stderr)
    );

    // Nothing listens on port 9 (discard): the error names the request.
    let out = Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .args(["investigate", "--tempo", "http://127.0.0.1:9"])
        .args(["--pyroscope", "http://127.0.0.1:9", "--timeout", "2s"])
        .args(["--trace-id", "0af7651916cd43dd8448eb211c80319c"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("GET http://127.0.0.1:9/api/traces/0af7651916cd43dd8448eb211c80319c"),
        "{err}"
    );

    // One operation or one endpoint, not both; a bad duration names itself.
    let both = run(&[
        "investigate",
        "--tempo",
        "http://a",
        "--pyroscope",
        "http://b",
        "--trace-id",
        "1",
        "--span-name",
        "GET /x",
        "--service",
        "s",
    ]);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
    let bad = run(&[
        "investigate",
        "--tempo",
        "http://a",
        "--pyroscope",
        "http://b",
        "--trace-id",
        "1",
        "--since",
        "10 s",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("expected a duration"),
        "{}",
        text(&bad.stderr)
    );
}
