//! The span report tool on fixture directories built with `ProfileBuilder` and handwritten
//! OTLP JSON: report numbers and verdicts, flame graphs, diffs, errors and the binary.

mod binary;
mod diff;
mod errors;
mod fixture;
mod flame;
mod report;
