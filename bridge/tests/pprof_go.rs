//! The pprof encoder's output is read by Go's own pprof reader (`go tool pprof`), which
//! is the same parser family Pyroscope uses: function names, inlined frames, values and
//! span labels must come out as written.
//!
//! Needs the `go` binary (Debian: `golang-go`); without it the check is skipped with a
//! note, or fails when `OTEL_PROFILING_REQUIRE_GO=1` (CI) — see `common::go_available`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use otel_profiling::pprof::{
    encode_gzip, FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame,
};

const PERIOD_NS: i64 = 10_101_010; // 99 Hz
const SPAN_ID: u64 = 0xc0ffee;
const SPAN_ID_HEX: &str = "0000000000c0ffee";
const TRACE_ID: u128 = 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736;
const TRACE_ID_HEX: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_NAME: &str = "GET /reports/{id}";

fn line(function: &str, file: &str, line: u32) -> FrameLine {
    FrameLine {
        function: function.into(),
        file: Some(file.into()),
        line: Some(line),
    }
}

/// Two samples: `to_string` inlined into `render_report` called from `main`, with span
/// labels, ×3; and `main` alone, unlabelled, ×2.
fn profile_bytes() -> Vec<u8> {
    let stack = [
        SymbolizedFrame {
            address: 0x5555_0000_2000,
            lines: vec![
                line("serde_json::ser::to_string", "src/ser.rs", 2100),
                line("app::render_report", "src/report.rs", 42),
            ],
        },
        SymbolizedFrame {
            address: 0x5555_0000_1000,
            lines: vec![line("app::main", "src/main.rs", 7)],
        },
    ];
    let labels = SampleLabels {
        span_id: Some(SPAN_ID),
        trace_id: Some(TRACE_ID),
        span_name: Some(SPAN_NAME.into()),
    };
    let mut b = ProfileBuilder::new(PERIOD_NS, SystemTime::now(), Duration::from_secs(10));
    b.add_sample(&stack, &labels, 1);
    b.add_sample(&stack, &labels, 2); // merged with the first
    b.add_sample(&stack[1..], &SampleLabels::default(), 2);
    encode_gzip(&b.build()).expect("encode")
}

/// Output of `go tool pprof <flag> <file>`, which must succeed.
fn go_pprof(flag: &str, file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof", flag])
        .arg(file)
        .output()
        .expect("run go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {flag} failed ({}):\n{}\n{stdout}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Removes the file when dropped, also when an assertion fails.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Lines of `text` split into whitespace-separated words, for layout-independent matching.
fn word_lines(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn go_tool_pprof_reads_functions_inlining_values_and_span_labels() {
    if !common::go_available() {
        return;
    }
    let file = TempFile(std::env::temp_dir().join(format!(
        "otel-profiling-pprof-go-{}.pb.gz",
        std::process::id()
    )));
    std::fs::write(&file.0, profile_bytes()).expect("write profile");

    // -raw: header, merged values, labels as `key:[value]` on one line (keys sorted),
    // and locations with the inlined frame first, its caller on the next line. Samples
    // are ordered by labels (the unlabelled one first), locations numbered in that order:
    // 1 is `main`, 2 the inlined `to_string`.
    let raw = go_pprof("-raw", &file.0);
    assert!(raw.contains("PeriodType: cpu nanoseconds"), "{raw}");
    assert!(raw.contains(&format!("Period: {PERIOD_NS}")), "{raw}");
    let raw_words = word_lines(&raw);
    let value = |n: i64| format!("{}:", n * PERIOD_NS);
    assert!(
        raw_words.contains(&vec![value(3).as_str(), "2", "1"]),
        "merged labelled sample (3 × period over locations 2 1):\n{raw}"
    );
    assert!(
        raw_words.contains(&vec![value(2).as_str(), "1"]),
        "unlabelled sample:\n{raw}"
    );
    let label_line =
        format!("span_id:[{SPAN_ID_HEX}] span_name:[{SPAN_NAME}] trace_id:[{TRACE_ID_HEX}]");
    assert!(
        raw.lines().any(|l| l.trim() == label_line),
        "expected label line {label_line:?}:\n{raw}"
    );
    assert!(
        raw_words.contains(&vec![
            "2:",
            "0x555500002000",
            "M=1",
            "serde_json::ser::to_string",
            "src/ser.rs:2100",
            "s=0"
        ]),
        "{raw}"
    );
    assert!(
        raw_words.contains(&vec!["app::render_report", "src/report.rs:42", "s=0"]),
        "{raw}"
    );

    // -traces: each label on its own line as `key:  value`, then the stack, leaf first,
    // inlined frames marked.
    let traces = go_pprof("-traces", &file.0);
    let trace_words = word_lines(&traces);
    for (key, val) in [
        ("span_id:", SPAN_ID_HEX),
        ("trace_id:", TRACE_ID_HEX),
        ("span_name:", SPAN_NAME),
    ] {
        let expected: Vec<&str> = std::iter::once(key).chain(val.split(' ')).collect();
        assert!(
            trace_words.contains(&expected),
            "expected `{key}  {val}`:\n{traces}"
        );
    }
    let labelled_stack = [
        "30.30ms   serde_json::ser::to_string (inline)",
        "          app::render_report",
        "          app::main",
    ]
    .map(|l| l.split_whitespace().collect::<Vec<_>>());
    assert!(
        trace_words.windows(3).any(|w| w == labelled_stack),
        "expected the inlined stack:\n{traces}"
    );
    assert!(
        trace_words.contains(&vec!["20.20ms", "app::main"]),
        "{traces}"
    );

    // -tags: one section per key, with its value.
    let tags = go_pprof("-tags", &file.0);
    for (key, val) in [
        ("span_id", SPAN_ID_HEX),
        ("trace_id", TRACE_ID_HEX),
        ("span_name", SPAN_NAME),
    ] {
        assert!(
            tags.contains(&format!("{key}: Total 30.3ms")),
            "{key} section:\n{tags}"
        );
        assert!(
            tags.lines()
                .any(|l| l.trim() == format!("30.3ms (  100%): {val}")),
            "{key} value {val}:\n{tags}"
        );
    }
}

/// A skipped check shows in a plain `cargo test` (no `--nocapture`): the skip line gets
/// past the harness's capture of a passing test. The test binary runs itself, with the
/// Go check switched off.
#[test]
fn a_skipped_check_is_visible_without_nocapture() {
    if std::env::var_os("OTEL_PROFILING_SKIP_GO").is_some() {
        common::skip::skipped(
            "a_skipped_check_is_visible_without_nocapture",
            "OTEL_PROFILING_SKIP_GO is set",
        );
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "go_tool_pprof_reads_functions_inlining_values_and_span_labels",
        ])
        .env("OTEL_PROFILING_SKIP_GO", "1")
        .env_remove("OTEL_PROFILING_REQUIRE_GO")
        .output()
        .expect("the test binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("SKIPPED the go tool pprof check: OTEL_PROFILING_SKIP_GO=1"),
        "the skip is visible: stderr was {stderr:?}"
    );
}
