//! Golden files of the tool's output (`tests/data/results/`), inferno's model: the inputs
//! are the fixture directories of `fixture.rs` (fixed times, ids and stacks; no clock, no
//! random ids), the expected outputs are committed files. A missing file is written (the
//! test passes and says so); `OTEL_PROFILING_BLESS=1` rewrites them all; otherwise the
//! output must match byte for byte. The tool runs inside the fixture directory and is
//! given relative paths, so no temporary path (nor its length, in aligned columns) shows.

use std::path::{Path, PathBuf};

use crate::golden;

/// The golden file `name`.
pub fn path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/results")
        .join(name)
}

/// Checks `output` against the golden file `name`.
pub fn check(name: &str, output: &str) {
    golden::check(&path(name), output);
}
