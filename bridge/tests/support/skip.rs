//! Saying a check was skipped so that a plain `cargo test` shows it: straight to the
//! process's standard error stream. libtest captures what `eprintln!` writes in a passing
//! test (and shows it only with `--nocapture`), so a skipped check would read as a pass.
//!
//! Shared by the bridge's, the CLI's and the integration tests (`#[path]`).

use std::io::Write as _;

/// Writes `SKIPPED <what>: <why>` to stderr, past the harness's capture.
pub(crate) fn skipped(what: &str, why: &str) {
    let line = format!("SKIPPED {what}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}
