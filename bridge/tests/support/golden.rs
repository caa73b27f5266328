//! Golden files, on inferno's model: a test renders its output as text and compares it
//! byte for byte with a file committed under `tests/data/…/results/`.
//!
//! * The file is missing: the test writes it and passes, with a note on stderr (commit it).
//! * `OTEL_PROFILING_BLESS=1`: the test rewrites it (after an intended change of output).
//! * Otherwise a difference fails the test with a line diff (`-` golden, `+` actual).
//!
//! Shared by the bridge's and the CLI's tests (`#[path]`), so both regenerate the same way.

use std::path::Path;

/// The environment variable that rewrites golden files.
pub(crate) const BLESS: &str = "OTEL_PROFILING_BLESS";

/// Compares `actual` with the golden file `path`, writing it when missing or blessed.
pub(crate) fn check(path: &Path, actual: &str) {
    let bless = std::env::var_os(BLESS).is_some_and(|v| v == "1");
    let expected = match std::fs::read_to_string(path) {
        Ok(text) if !bless => text,
        Ok(_) | Err(_) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).expect("create the golden file's directory");
            }
            std::fs::write(path, actual).expect("write the golden file");
            eprintln!(
                "note: wrote golden file {} ({}); commit it",
                path.display(),
                if bless { "blessed" } else { "it was missing" }
            );
            return;
        }
    };
    if expected != actual {
        panic!(
            "output differs from the golden file {} (- golden, + actual; rerun with {BLESS}=1 \
             to accept the new output):\n{}",
            path.display(),
            line_diff(&expected, actual)
        );
    }
}

/// The lines that differ between `old` and `new` (longest common subsequence), with two
/// lines of context around each change.
pub(crate) fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    // common[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || common[i + 1][j] >= common[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut out = String::new();
    let mut shown_to = 0;
    for &k in &changed {
        let from = k.saturating_sub(CONTEXT).max(shown_to);
        let to = (k + CONTEXT + 1).min(ops.len());
        if from > shown_to {
            out.push_str("@@\n");
        }
        for (mark, line) in &ops[from..to] {
            out.push(*mark);
            out.push_str(line.strip_suffix('\n').unwrap_or(line));
            if !line.ends_with('\n') {
                out.push_str("  (no newline at end)");
            }
            out.push('\n');
        }
        shown_to = shown_to.max(to);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::line_diff;

    #[test]
    fn diff_marks_changed_lines_with_context() {
        let diff = line_diff("a\nb\nc\nd\n", "a\nB\nc\nd\ne\n");
        assert_eq!(diff, " a\n-b\n+B\n c\n d\n+e\n");
        let far = line_diff("1\n2\n3\n4\n5\n6\n7\n8\n", "1\n2\n3\n4\n5\n6\n7\nx\n");
        assert_eq!(far, "@@\n 6\n 7\n-8\n+x\n");
    }
}
