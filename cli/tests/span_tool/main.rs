//! The span report tool on fixture directories built with `ProfileBuilder` and handwritten
//! OTLP JSON: report numbers and verdicts, flame graphs, diffs, errors and the binary, and
//! the HTML report in a headless browser.

mod binary;
mod browser;
mod diff;
mod diff_split;
mod errors;
mod fixture;
mod flame;
#[path = "../../../bridge/tests/support/golden.rs"]
mod golden;
mod report;
mod results;
#[path = "../../../bridge/tests/support/skip.rs"]
mod skip;
