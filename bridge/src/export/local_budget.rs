//! A bound on the local output directory, so that a service left writing local files (a
//! typo in a backend variable lands here too) never fills the disk.
//!
//! Every profile and span file of ours in the directory counts, earlier runs' included
//! (`diff` reads them): before a write, the oldest of them go until the write fits. The
//! span file is rotated at an eighth of the bound, so that the oldest span lines can go
//! too and the bound holds within about that much. What is removed is counted
//! ([`HealthStats`](crate::HealthStats)) and said once on stderr. Only the exporters'
//! threads call this, never the request path.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::local_sink::is_sink_file;

/// The default bound: 256 MiB, for every local sink and span exporter unless given
/// another ([`Telemetry::output_max_bytes`](crate::Telemetry::output_max_bytes),
/// `OTEL_PROFILING_OUTPUT_MAX_BYTES`, `ProfilerBuilder::output_max_bytes`, or
/// `with_budget` on the sink or exporter).
pub const DEFAULT_OUTPUT_MAX_BYTES: u64 = 256 << 20;

/// The bound on one directory's files of ours, shared by the profile sink and the span
/// file of one setup.
#[derive(Debug)]
pub struct LocalBudget {
    dir: PathBuf,
    /// 0: no bound.
    max_bytes: u64,
    removed_files: AtomicU64,
    removed_bytes: AtomicU64,
    said: AtomicBool,
}

impl LocalBudget {
    /// The bound `max_bytes` on `dir`. `0` means no bound at all: nothing is ever
    /// removed and the span file is never rotated, so the directory grows for as long as
    /// the process writes; it is the explicit opt-out, never a default.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> LocalBudget {
        LocalBudget {
            dir: dir.into(),
            max_bytes,
            removed_files: AtomicU64::new(0),
            removed_bytes: AtomicU64::new(0),
            said: AtomicBool::new(false),
        }
    }

    /// The size at which the span file is rotated: an eighth of the bound.
    pub fn span_file_limit(&self) -> Option<u64> {
        (self.max_bytes > 0).then(|| (self.max_bytes / 8).max(1))
    }

    /// Files and bytes removed so far.
    pub fn removed(&self) -> (u64, u64) {
        (
            self.removed_files.load(Ordering::Relaxed),
            self.removed_bytes.load(Ordering::Relaxed),
        )
    }

    /// Makes room for `incoming` more bytes: removes our oldest files (never `keep`, the
    /// file being appended to) until the directory's files of ours and `incoming` fit.
    /// Errors (a file gone meanwhile, a directory not listable) leave things as they are.
    pub fn make_room(&self, incoming: u64, keep: Option<&Path>) {
        if self.max_bytes == 0 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(String, u64)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let len = e.metadata().ok()?.len();
                is_sink_file(&name).then_some((name, len))
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, len)| len).sum();
        if total.saturating_add(incoming) <= self.max_bytes {
            return;
        }
        // Names start with their UTC stamp: by name is oldest first.
        files.sort_unstable();
        for (name, len) in files {
            if total.saturating_add(incoming) <= self.max_bytes {
                break;
            }
            let path = self.dir.join(&name);
            if keep == Some(path.as_path()) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                self.removed_files.fetch_add(1, Ordering::Relaxed);
                self.removed_bytes.fetch_add(len, Ordering::Relaxed);
                if !self.said.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "otel-profiling: {} reached its bound of {} bytes \
                         (OTEL_PROFILING_OUTPUT_MAX_BYTES): removing its oldest profile and \
                         span files, first {name}; the count is in the health stats",
                        self.dir.display(),
                        self.max_bytes
                    );
                }
            }
        }
    }
}

/// Reads a byte count: whole bytes, or with a `KiB`, `MiB` or `GiB` suffix; `None` if it is
/// not one.
pub fn parse_bytes(value: &str) -> Option<u64> {
    let value = value.trim();
    let (digits, unit) = match value.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => value.split_at(at),
        None => (value, ""),
    };
    let scale: u64 = match unit {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_with_binary_suffixes() {
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64KiB"), Some(64 << 10));
        assert_eq!(parse_bytes(" 256MiB "), Some(256 << 20));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        for bad in [
            "",
            "MiB",
            "1.5MiB",
            "10MB",
            "10 MiB",
            "-1",
            "99999999999999GiB",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_oldest_of_our_files_go_first_and_others_stay() {
        let dir =
            std::env::temp_dir().join(format!("otel-profiling-budget-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let write = |name: &str, len: usize| std::fs::write(dir.join(name), vec![0u8; len]);
        write("2026-01-01T00-00-00.000Z_cpu.pb.gz", 400).expect("write");
        write("2026-01-01T00-00-10.000Z_spans.jsonl", 400).expect("write");
        write("2026-01-01T00-00-20.000Z_cpu.pb.gz", 400).expect("write");
        write("notes.txt", 5000).expect("write");
        let budget = LocalBudget::new(&dir, 1000);
        budget.make_room(100, None);
        assert!(
            !dir.join("2026-01-01T00-00-00.000Z_cpu.pb.gz").exists(),
            "oldest gone"
        );
        assert!(dir.join("2026-01-01T00-00-10.000Z_spans.jsonl").exists());
        assert!(dir.join("notes.txt").exists(), "not ours: never touched");
        assert_eq!(budget.removed(), (1, 400));
        // The span file being appended to stays, the next oldest goes.
        budget.make_room(500, Some(&dir.join("2026-01-01T00-00-10.000Z_spans.jsonl")));
        assert!(dir.join("2026-01-01T00-00-10.000Z_spans.jsonl").exists());
        assert!(!dir.join("2026-01-01T00-00-20.000Z_cpu.pb.gz").exists());
        assert_eq!(budget.removed(), (2, 800));
        // No bound: nothing goes.
        LocalBudget::new(&dir, 0).make_room(u64::MAX, None);
        assert!(dir.join("2026-01-01T00-00-10.000Z_spans.jsonl").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
