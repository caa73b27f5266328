//! The embedded default sink: profiles and spans as files in a local directory.
//!
//! * every profile interval: `<start>_cpu.pb.gz`, a gzipped pprof (`go tool pprof` reads it),
//!   and `<start>_blocked.pb.gz` when threads were found blocked inside a poll (the
//!   blocked-in-poll profile, see `docs/blocked-in-poll.md`);
//! * finished spans: `<start>_spans.jsonl`, one OTLP `ExportTraceServiceRequest` in JSON per
//!   line, as the OpenTelemetry Collector's file exporter writes them.
//!
//! `<start>` is a UTC timestamp like `2026-11-29T23-50-12.345Z`, so a directory listing
//! reads as a timeline. The directory is the first of:
//!
//! 1. the one given to the builder (`Telemetry::output_dir`, `ProfilerBuilder::output_dir`);
//! 2. `OTEL_PROFILING_OUTPUT_DIR`;
//! 3. `$CARGO_TARGET_DIR/otel-profiling` when `CARGO_TARGET_DIR` is set (as `cargo run`
//!    passes it on from the shell);
//! 4. `otel-profiling/` inside the `target` directory the program's binary is in;
//! 5. `./target/otel-profiling` under the working directory.
//!
//! `Telemetry::build` prints the directory once on stderr
//! (`otel-profiling: writing profiles and spans to <dir>`) unless told to be quiet.
//!
//! Every sink and exporter here keeps the directory within a [`LocalBudget`]: by default
//! [`DEFAULT_OUTPUT_MAX_BYTES`] (256 MiB), also when made directly with
//! [`LocalProfileSink::new`] or [`LocalSpanExporter::new`], so a standalone
//! `Profiler::builder().start()` never writes files without end (about 8,640 profiles a
//! day at 10 s). [`with_budget`](LocalProfileSink::with_budget) gives another bound, or
//! shares one between the profile sink and the span file of a directory;
//! `LocalBudget::new(dir, 0)` is the explicit opt-out: no bound, the directory grows for
//! as long as the process writes.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::local_budget::{LocalBudget, DEFAULT_OUTPUT_MAX_BYTES};
use super::span_json::SpanJson;
use crate::collector::{EncodedProfile, ProfileSink};

/// The environment variable that overrides the default output directory.
pub const OUTPUT_DIR_ENV: &str = "OTEL_PROFILING_OUTPUT_DIR";

/// Cargo's variable for a target directory outside `./target`; the default output directory
/// follows it.
pub const CARGO_TARGET_DIR_ENV: &str = "CARGO_TARGET_DIR";

/// The output directory: `explicit`, else `OTEL_PROFILING_OUTPUT_DIR`, else
/// `$CARGO_TARGET_DIR/otel-profiling`, else `otel-profiling` in the `target` directory the
/// binary is in, else `./target/otel-profiling` (see the module docs).
pub fn output_dir(explicit: Option<&Path>) -> PathBuf {
    choose_output_dir(
        explicit,
        output_dir_variable(std::env::var_os),
        std::env::var_os(CARGO_TARGET_DIR_ENV),
        std::env::current_exe().ok().as_deref(),
    )
}

/// `OTEL_PROFILING_OUTPUT_DIR` as `lookup` reports it; empty or blank counts as unset. The
/// one reader of the variable: [`output_dir`] passes the process environment,
/// [`EnvConfig`](crate::config::EnvConfig) its own lookup.
pub(crate) fn output_dir_variable(
    lookup: impl FnOnce(&'static str) -> Option<OsString>,
) -> Option<PathBuf> {
    lookup(OUTPUT_DIR_ENV)
        .filter(|d| !d.to_str().is_some_and(|d| d.trim().is_empty()))
        .map(PathBuf::from)
}

/// [`output_dir`] with the environment and the binary's path passed in (so tests need not
/// change the process environment). An empty `CARGO_TARGET_DIR` counts as unset.
fn choose_output_dir(
    explicit: Option<&Path>,
    output_dir_env: Option<PathBuf>,
    cargo_target_dir_env: Option<OsString>,
    exe: Option<&Path>,
) -> PathBuf {
    if let Some(dir) = explicit {
        return dir.to_path_buf();
    }
    if let Some(dir) = output_dir_env {
        return dir;
    }
    if let Some(dir) = cargo_target_dir_env.filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("otel-profiling");
    }
    let target = exe.and_then(|exe| {
        exe.ancestors()
            .find(|p| p.file_name().is_some_and(|n| n == "target"))
            .map(Path::to_path_buf)
    });
    target
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("otel-profiling")
}

/// `2026-11-29T23-50-12.345Z`: sortable, and valid in file names everywhere.
pub fn timeline_stamp(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Writes each profile as `<start>_cpu.pb.gz` into a directory, kept within a
/// [`LocalBudget`].
#[derive(Debug)]
pub struct LocalProfileSink {
    dir: PathBuf,
    budget: Arc<LocalBudget>,
}

impl LocalProfileSink {
    /// A sink writing into `dir` (created if missing), keeping it within
    /// [`DEFAULT_OUTPUT_MAX_BYTES`] (see [`with_budget`](Self::with_budget)).
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<LocalProfileSink> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        let budget = Arc::new(LocalBudget::new(&dir, DEFAULT_OUTPUT_MAX_BYTES));
        Ok(LocalProfileSink { dir, budget })
    }

    /// Keeps the directory within `budget` instead of the default (see [`LocalBudget`];
    /// a bound of 0 is none).
    pub fn with_budget(mut self, budget: Arc<LocalBudget>) -> LocalProfileSink {
        self.budget = budget;
        self
    }

    /// The bound kept, with what it removed so far ([`LocalBudget::removed`]).
    pub fn budget(&self) -> &Arc<LocalBudget> {
        &self.budget
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// How CPU profile files end: `<start>_cpu.pb.gz`.
pub const CPU_PROFILE_SUFFIX: &str = "_cpu.pb.gz";
/// How blocked-in-poll profile files end: `<start>_blocked.pb.gz`.
pub const BLOCKED_PROFILE_SUFFIX: &str = "_blocked.pb.gz";
/// How allocation profile files end: `<start>_alloc.pb.gz`.
pub const ALLOC_PROFILE_SUFFIX: &str = "_alloc.pb.gz";
/// How span files end: `<start>_spans.jsonl`.
pub const SPANS_SUFFIX: &str = "_spans.jsonl";

/// Whether `file_name` is one of the files this sink writes (what a tool clearing or
/// reading a sink's directory should touch).
pub fn is_sink_file(file_name: &str) -> bool {
    [
        CPU_PROFILE_SUFFIX,
        BLOCKED_PROFILE_SUFFIX,
        ALLOC_PROFILE_SUFFIX,
        SPANS_SUFFIX,
    ]
    .iter()
    .any(|suffix| file_name.ends_with(suffix))
}

impl ProfileSink for LocalProfileSink {
    fn export(&mut self, profile: &EncodedProfile) -> io::Result<()> {
        let name = format!(
            "{}{}",
            timeline_stamp(profile.start),
            profile.kind.file_suffix()
        );
        self.budget.make_room(profile.gzip_pprof.len() as u64, None);
        // Write then rename, so a reader never sees half a file.
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let written = std::fs::write(&tmp, &profile.gzip_pprof)
            .and_then(|()| std::fs::rename(&tmp, self.dir.join(name)));
        if written.is_err() {
            // The budget does not count `.tmp` files: one left here would stay for good.
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// A new span file's path in `dir`, named by now; after `previous`, one whose name sorts
/// after it (the budget removes oldest first by name): within the same millisecond, the
/// next one is waited for (rotation happens once per an eighth of the bound).
fn span_file_path(dir: &Path, previous: Option<&Path>) -> PathBuf {
    for _ in 0..20 {
        let path = dir.join(format!(
            "{}{SPANS_SUFFIX}",
            timeline_stamp(SystemTime::now())
        ));
        match previous {
            Some(previous) if path.as_path() <= previous => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            _ => return path,
        }
    }
    // The clock went back: a name right after the previous one (`~` sorts after `_`).
    let previous = previous
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str());
    let stem = previous
        .and_then(|n| n.strip_suffix(SPANS_SUFFIX))
        .unwrap_or("span-file");
    dir.join(format!("{stem}~{SPANS_SUFFIX}"))
}

/// A span exporter writing OTLP JSON lines into `<start>_spans.jsonl`.
#[derive(Debug)]
pub struct LocalSpanExporter {
    dir: PathBuf,
    /// The first span file (later ones, after rotation, are named by their own start).
    path: PathBuf,
    file: Mutex<SpanFile>,
    json: SpanJson,
    budget: Arc<LocalBudget>,
}

/// The span file being appended to.
#[derive(Debug)]
struct SpanFile {
    path: PathBuf,
    file: Option<File>,
    /// Bytes in it.
    written: u64,
    /// The line being encoded, kept between batches so that encoding allocates nothing
    /// once it has grown to a batch's size.
    line: Vec<u8>,
}

/// The encoding buffer kept between batches at most (a batch of 512 spans is ~0.4 MiB);
/// a larger one, from an unusual batch, is let go.
const LINE_KEPT_BYTES: usize = 4 << 20;

impl LocalSpanExporter {
    /// An exporter writing into `dir` (created if missing), keeping it within
    /// [`DEFAULT_OUTPUT_MAX_BYTES`] (see [`with_budget`](Self::with_budget)); the file is
    /// named by the time the exporter was created.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<LocalSpanExporter> {
        std::fs::create_dir_all(dir.as_ref())?;
        let path = span_file_path(dir.as_ref(), None);
        Ok(LocalSpanExporter {
            dir: dir.as_ref().to_path_buf(),
            path: path.clone(),
            file: Mutex::new(SpanFile {
                path,
                file: None,
                written: 0,
                line: Vec::new(),
            }),
            json: SpanJson::default(),
            budget: Arc::new(LocalBudget::new(dir.as_ref(), DEFAULT_OUTPUT_MAX_BYTES)),
        })
    }

    /// Keeps the directory within `budget` instead of the default, rotating the span file
    /// at an eighth of it (see [`LocalBudget`]; a bound of 0 is none, and the file is
    /// never rotated). Give it the profile sink's budget
    /// ([`Profiler::local_budget`](crate::Profiler::local_budget)) when both write to one
    /// directory.
    pub fn with_budget(mut self, budget: Arc<LocalBudget>) -> LocalSpanExporter {
        self.budget = budget;
        self
    }

    /// The bound kept, with what it removed so far ([`LocalBudget::removed`]).
    pub fn budget(&self) -> &Arc<LocalBudget> {
        &self.budget
    }

    /// The first file written to (with a budget, later lines may go to newer files).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Encodes `batch` as one line and appends it to the span file.
    fn write_batch(&self, batch: &[SpanData]) -> io::Result<()> {
        let mut state = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let mut line = std::mem::take(&mut state.line);
        line.clear();
        self.json.write_line(batch, &mut line);
        let written = self.append(&mut state, &line);
        if line.capacity() <= LINE_KEPT_BYTES {
            state.line = line;
        }
        written
    }

    /// Appends an encoded line (tests drive the budget with small ones).
    #[cfg(test)]
    fn write_line(&self, line: &[u8]) -> io::Result<()> {
        let mut state = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        self.append(&mut state, line)
    }

    fn append(&self, state: &mut SpanFile, line: &[u8]) -> io::Result<()> {
        let incoming = line.len() as u64;
        if let Some(limit) = self.budget.span_file_limit() {
            if state.written > 0 && state.written + incoming > limit {
                // Rotate: the full file becomes one the budget may remove.
                let path = span_file_path(&self.dir, Some(&state.path));
                state.path = path;
                state.file = None;
                state.written = 0;
            }
        }
        self.budget.make_room(incoming, Some(&state.path));
        if state.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&state.path)?;
            state.file = Some(file);
        }
        match state.file.as_mut() {
            Some(f) => {
                f.write_all(line)?;
                state.written += incoming;
                Ok(())
            }
            None => Err(io::Error::other("span file not open")),
        }
    }
}

impl SpanExporter for LocalSpanExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if batch.is_empty() {
            return Ok(());
        }
        self.write_batch(&batch).map_err(|e| {
            OTelSdkError::InternalFailure(format!("writing spans into {}: {e}", self.dir.display()))
        })
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.json = SpanJson::new(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_files_are_named_by_kind_and_recognised() {
        use crate::collector::ProfileKind;
        assert_eq!(ProfileKind::Cpu.file_suffix(), "_cpu.pb.gz");
        assert_eq!(ProfileKind::Blocked.file_suffix(), "_blocked.pb.gz");
        assert_eq!(ProfileKind::Alloc.file_suffix(), "_alloc.pb.gz");
        for name in [
            "2026-11-30T00-53-20.000Z_cpu.pb.gz",
            "2026-11-30T00-53-20.000Z_blocked.pb.gz",
            "2026-11-30T00-53-20.000Z_spans.jsonl",
        ] {
            assert!(is_sink_file(name), "{name}");
        }
        for name in ["notes.txt", ".x_cpu.pb.gz.tmp", "profile.pb.gz"] {
            assert!(!is_sink_file(name), "{name}");
        }
    }
    use std::time::Duration;

    #[test]
    fn stamps_sort_as_a_timeline() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_000_000_123);
        assert_eq!(timeline_stamp(t), "2026-11-30T00-53-20.123Z");
        assert_eq!(
            timeline_stamp(SystemTime::UNIX_EPOCH),
            "1970-01-01T00-00-00.000Z"
        );
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&timeline_stamp(leap)[..10], "2000-02-29");
        let a = timeline_stamp(t);
        let b = timeline_stamp(t + Duration::from_secs(10));
        assert!(a < b);
    }

    /// Builder > `OTEL_PROFILING_OUTPUT_DIR` > `CARGO_TARGET_DIR` > the binary's `target`
    /// directory > `./target`. Without the `CARGO_TARGET_DIR` step a binary built into
    /// `CARGO_TARGET_DIR=/build` wrote to `./target/otel-profiling` instead.
    #[test]
    fn builder_then_environment_then_cargo_target_dir_then_target() {
        let os = |s: &str| Some(OsString::from(s));
        let exe_in_target = Path::new("/src/app/target/debug/app");
        let exe_elsewhere = Path::new("/build/debug/app");
        let builder = Some(Path::new("/x/y"));
        let dir = |explicit, out: Option<OsString>, cargo, exe| {
            choose_output_dir(explicit, output_dir_variable(|_| out), cargo, exe)
        };
        assert_eq!(
            dir(builder, os("/from/env"), os("/build"), Some(exe_elsewhere)),
            PathBuf::from("/x/y")
        );
        assert_eq!(
            dir(None, os("/from/env"), os("/build"), Some(exe_elsewhere)),
            PathBuf::from("/from/env")
        );
        assert_eq!(
            dir(None, None, os("/build"), Some(exe_elsewhere)),
            PathBuf::from("/build/otel-profiling")
        );
        // CARGO_TARGET_DIR wins over a `target` directory in the binary's path, too.
        assert_eq!(
            dir(None, None, os("/build"), Some(exe_in_target)),
            PathBuf::from("/build/otel-profiling")
        );
        assert_eq!(
            dir(None, None, None, Some(exe_in_target)),
            PathBuf::from("/src/app/target/otel-profiling")
        );
        assert_eq!(
            dir(None, None, None, Some(exe_elsewhere)),
            PathBuf::from("target/otel-profiling")
        );
        assert_eq!(
            dir(None, None, None, None),
            PathBuf::from("target/otel-profiling")
        );
        // Empty variables count as unset.
        assert_eq!(
            dir(None, os(""), os(""), Some(exe_elsewhere)),
            PathBuf::from("target/otel-profiling")
        );
        assert_eq!(
            dir(None, os(""), os("rel/tgt"), None),
            PathBuf::from("rel/tgt/otel-profiling")
        );
        // A blank OTEL_PROFILING_OUTPUT_DIR too, as `EnvConfig` reads it (the same reader).
        assert_eq!(
            dir(None, os("  "), None, None),
            PathBuf::from("target/otel-profiling")
        );
    }

    /// A directory holding an earlier run's 300 MiB of profiles (a sparse file: no disk
    /// used), named `<tag>-<pid>` under the temporary directory.
    fn dir_past_the_default_bound(tag: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("otel-profiling-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let old = dir.join("2020-01-01T00-00-00.000Z_cpu.pb.gz");
        File::create(&old)
            .and_then(|f| f.set_len(300 << 20))
            .expect("old file");
        (dir, old)
    }

    fn profile() -> EncodedProfile {
        EncodedProfile {
            kind: crate::collector::ProfileKind::Cpu,
            start: SystemTime::now(),
            duration: Duration::from_secs(10),
            samples: 1,
            gzip_pprof: vec![1, 2, 3],
        }
    }

    /// Issue 42: made directly (as `Profiler::builder().start()` makes it), the sink had
    /// no bound and wrote files without end. It keeps the default bound now.
    #[test]
    fn a_sink_made_directly_keeps_the_default_bound() {
        let (dir, old) = dir_past_the_default_bound("sink-default");
        let mut sink = LocalProfileSink::new(&dir).expect("sink");
        sink.export(&profile()).expect("export");
        assert!(!old.exists(), "the oldest file went");
        assert_eq!(sink.budget().removed(), (1, 300 << 20));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The same for the span exporter, whose file is then rotated too.
    #[test]
    fn a_span_exporter_made_directly_keeps_the_default_bound() {
        let (dir, old) = dir_past_the_default_bound("spans-default");
        let spans = LocalSpanExporter::new(&dir).expect("exporter");
        assert!(spans.budget().span_file_limit().is_some());
        spans.write_line(b"{}\n").expect("write");
        assert!(!old.exists(), "the oldest file went");
        assert_eq!(spans.budget().removed(), (1, 300 << 20));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A bound of 0 is the explicit opt-out: nothing is removed.
    #[test]
    fn a_zero_bound_removes_nothing() {
        let (dir, old) = dir_past_the_default_bound("sink-unbounded");
        let mut sink = LocalProfileSink::new(&dir)
            .expect("sink")
            .with_budget(Arc::new(LocalBudget::new(&dir, 0)));
        sink.export(&profile()).expect("export");
        let spans = LocalSpanExporter::new(&dir)
            .expect("exporter")
            .with_budget(sink.budget().clone());
        spans.write_line(b"{}\n").expect("write");
        assert!(old.exists());
        assert_eq!(sink.budget().removed(), (0, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A write or rename that fails (a full disk, a name taken) leaves no `.tmp` file,
    /// which no budget would ever remove.
    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("otel-profiling-tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut sink = LocalProfileSink::new(&dir).expect("sink");
        let profile = profile();
        let name = format!("{}{CPU_PROFILE_SUFFIX}", timeline_stamp(profile.start));
        // The name is taken by a directory that is not empty: the rename fails.
        std::fs::create_dir_all(dir.join(&name).join("x")).expect("blocker");
        assert!(sink.export(&profile).is_err());
        let names: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        assert_eq!(names, [name]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn profile_files_are_whole_and_named_by_interval_start() {
        let dir = std::env::temp_dir().join(format!("otel-profiling-sink-{}", std::process::id()));
        let mut sink = LocalProfileSink::new(&dir).expect("sink");
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let profile = EncodedProfile {
            kind: crate::collector::ProfileKind::Cpu,
            start,
            duration: Duration::from_secs(10),
            samples: 3,
            gzip_pprof: vec![1, 2, 3],
        };
        sink.export(&profile).expect("export");
        let written = std::fs::read(dir.join("2026-11-30T00-53-20.000Z_cpu.pb.gz")).expect("file");
        assert_eq!(written, [1, 2, 3]);
        let leftovers = std::fs::read_dir(&dir)
            .expect("dir")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            })
            .count();
        assert_eq!(leftovers, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
