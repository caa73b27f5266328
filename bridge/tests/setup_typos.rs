//! A mistyped variable (`PYROSCOPE_SERVER_ADDRES`) used to send everything to local files
//! without a word. Setup now names it, the variable it may have meant, and where the data
//! goes. Runs the test binary again as a child with the typo in its environment.

use std::process::Command;

const CHILD: &str = "OTEL_PROFILING_TYPOS_CHILD";

/// In the child: the one-call setup from the environment, then nothing else.
#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("otel-profiling-typos-{}", std::process::id()));
    let telemetry = otel_profiling::Telemetry::from_env()
        .expect("environment")
        .service_name("typos")
        .output_dir(&dir)
        .quiet(true)
        .build()
        .expect("setup");
    drop(telemetry);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_mistyped_variable_is_named_with_the_one_meant() {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child", "--nocapture"])
        .env(CHILD, "1")
        .env("PYROSCOPE_SERVER_ADDRES", "http://pyroscope:4040")
        .env_remove("PYROSCOPE_SERVER_ADDRESS")
        .output()
        .expect("child runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("PYROSCOPE_SERVER_ADDRES "))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("did you mean PYROSCOPE_SERVER_ADDRESS?")
            && lines[0].contains("goes to local files in"),
        "{}",
        lines[0]
    );
}
