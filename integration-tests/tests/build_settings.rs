//! The span report under every common build setting: the fixture service
//! (`fixtures/build-settings`: one root span burning CPU in inlined code of its own and of
//! a registry crate, `itoa`) is built with each `debug` / `strip` / `split-debuginfo`
//! setting for its own code and `itoa`, profiled by the bridge, and read back by the
//! report. What the report says about the user's code is compared with a golden file per
//! setting (`tests/data/build-settings/`; `OTEL_PROFILING_BLESS=1` rewrites them).
//!
//! The bridge and everything else keep one setting, so they are compiled once (about a
//! minute in release); each setting then rebuilds only the fixture and `itoa`.

#[path = "../../bridge/tests/support/golden.rs"]
mod golden;
#[path = "../../bridge/tests/support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use otel_profiling_cli::report::SpanReport;

/// A function of the user's code on at least this share of the root's CPU is listed (the
/// others are sampling noise: a function either runs under every sample here or almost
/// none).
const LISTED_SHARE: f64 = 0.2;

struct Setting {
    /// The golden file's name.
    slug: &'static str,
    debug: &'static str,
    /// Further profile keys for the fixture and `itoa`.
    extra: &'static [(&'static str, &'static str)],
}

const SETTINGS: &[Setting] = &[
    Setting {
        slug: "line-tables-only",
        debug: "line-tables-only",
        extra: &[],
    },
    Setting {
        slug: "limited",
        debug: "limited",
        extra: &[],
    },
    Setting {
        slug: "full",
        debug: "full",
        extra: &[],
    },
    Setting {
        slug: "debug-0",
        debug: "0",
        extra: &[],
    },
    Setting {
        slug: "full-strip-debuginfo",
        debug: "full",
        extra: &[("strip", "debuginfo")],
    },
    Setting {
        slug: "line-tables-only-split-packed",
        debug: "line-tables-only",
        extra: &[("split-debuginfo", "packed")],
    },
    Setting {
        slug: "line-tables-only-split-unpacked",
        debug: "line-tables-only",
        extra: &[("split-debuginfo", "unpacked")],
    },
];

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/build-settings")
}

/// Builds the fixture under `setting`; the path of its binary.
fn build(cargo: &std::ffi::OsStr, target: &Path, setting: &Setting) -> PathBuf {
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--release",
            "--quiet",
            "--locked",
            "--manifest-path",
        ])
        .arg(fixture_dir().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    let debug = match setting.debug {
        "0" => "0".to_owned(),
        level => format!("\"{level}\""),
    };
    for package in ["settings-fixture", "itoa"] {
        command
            .arg("--config")
            .arg(format!("profile.release.package.{package}.debug={debug}"));
        for (key, value) in setting.extra {
            command.arg("--config").arg(format!(
                "profile.release.package.{package}.{key}=\"{value}\""
            ));
        }
    }
    let status = command.status().expect("cargo runs");
    assert!(status.success(), "the fixture builds as {}", setting.slug);
    target.join("release/settings-fixture")
}

/// What the report says about the user's code, as the golden file holds it.
fn summary(setting: &Setting, report: &SpanReport, exe: &Path) -> String {
    let group = report
        .groups
        .iter()
        .find(|g| g.name == "catalog")
        .expect("the report has the catalog root");
    let cpu = group.profile_cpu_ns.max(1) as f64;
    let mut out = format!(
        "build: debug = {}{}\n",
        setting.debug,
        setting
            .extra
            .iter()
            .map(|(k, v)| format!(", {k} = {v}"))
            .collect::<String>()
    );
    let top = group.user_self.first().map_or("-", |f| f.function.as_str());
    out.push_str(&format!("your code, top by self CPU: {top}\n"));
    let mut total: Vec<&str> = group
        .user_total
        .iter()
        .filter(|f| f.cpu_ns as f64 >= LISTED_SHARE * cpu)
        .map(|f| f.function.as_str())
        .collect();
    total.sort_unstable();
    out.push_str("your code by total CPU (on at least a fifth of it), sorted:\n");
    for function in total {
        out.push_str(&format!("  {function}\n"));
    }
    let text = report.to_string();
    let exe = exe.display().to_string();
    let note = text
        .lines()
        .find(|l| l.starts_with("No inline information"))
        .map_or_else(|| "none".to_owned(), |l| l.replace(&exe, "<exe>"));
    out.push_str(&format!("note: {note}\n"));
    out
}

/// Peak resident set of the fixture's run, as it printed it (`VmHWM kB`).
fn peak_rss_kib(stdout: &str) -> Option<u64> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak rss kB: "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn the_report_names_the_users_code_under_every_build_setting() {
    let Some(cargo) = std::env::var_os("CARGO") else {
        skip::skipped("build_settings", "CARGO is not set (not run by cargo test)");
        return;
    };
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("build-settings-fixture");
    let goldens = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/build-settings");
    let mut figures = Vec::new();
    for setting in SETTINGS {
        let exe = build(&cargo, &target, setting);
        let out = target.join(format!("out-{}", setting.slug));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("output dir");
        let run = Command::new(&exe)
            .arg(&out)
            .output()
            .expect("the fixture runs");
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{}: the fixture failed: {}{}",
            setting.slug,
            stdout,
            String::from_utf8_lossy(&run.stderr)
        );
        let report = SpanReport::from_dirs(std::slice::from_ref(&out)).expect("the report reads");
        golden::check(
            &goldens.join(format!("{}.txt", setting.slug)),
            &summary(setting, &report, &exe),
        );
        figures.push((setting.slug, peak_rss_kib(&stdout)));
    }
    for (slug, rss) in figures {
        eprintln!(
            "{slug}: peak RSS {} kB",
            rss.map_or("?".into(), |r| r.to_string())
        );
    }
}
