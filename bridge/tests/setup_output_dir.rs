//! A default output directory that cannot be written used to stop the service from
//! starting (`Error: local span file: … No such file or directory`). Now it costs only the
//! local files, with one warning; a directory named explicitly still fails setup, naming
//! it. The default case runs in a child whose `CARGO_TARGET_DIR` (which the default
//! follows) points where nothing can be created, even by root.

use std::process::Command;

const CHILD: &str = "OTEL_PROFILING_OUTPUT_DIR_CHILD";
const NOWHERE: &str = "/proc/otel-profiling-nowhere";

#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let telemetry = otel_profiling::Telemetry::builder()
        .service_name("unwritable")
        .quiet(true)
        .build()
        .expect("an unwritable default directory does not fail setup");
    assert_eq!(telemetry.profiles_dir(), None);
    assert_eq!(telemetry.spans_file(), None);
    drop(telemetry);
}

#[test]
fn an_unwritable_default_directory_degrades_with_one_warning() {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child", "--nocapture"])
        .env(CHILD, "1")
        .env("CARGO_TARGET_DIR", NOWHERE)
        .env_remove("OTEL_PROFILING_OUTPUT_DIR")
        .output()
        .expect("child runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings = stderr
        .matches("the default output directory /proc/otel-profiling-nowhere/otel-profiling cannot be written")
        .count();
    assert_eq!(warnings, 1, "{stderr}");
}

#[test]
fn an_unwritable_directory_named_explicitly_fails_setup_naming_it() {
    let error = otel_profiling::Telemetry::builder()
        .service_name("unwritable")
        .output_dir(NOWHERE)
        .quiet(true)
        .build()
        .expect_err("a named directory that cannot be written fails setup");
    assert!(error.to_string().contains(NOWHERE), "{error}");
}
