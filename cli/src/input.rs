//! Reading the directories otel-profiling's local sink writes: profiles and spans, merged.

pub mod otlp;
pub mod pprof;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use otlp::Span;
pub use pprof::Sample;

use crate::error::ReportError;
use crate::ids::{SpanId, TraceId};
use crate::ownership::Ownership;
use crate::verdict::EvidenceContext;

/// File name ending of the profile files (the local sink's).
pub use otel_profiling::local_sink::CPU_PROFILE_SUFFIX as PROFILE_SUFFIX;
/// File name ending of the span files (the local sink's).
pub use otel_profiling::local_sink::SPANS_SUFFIX;

/// What the sampling could have seen: needed to explain an empty profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Some profile file was read.
    pub profiles_read: bool,
    /// The sampling period, nanoseconds.
    pub period_ns: u64,
}

impl Sampling {
    /// Spans whose wall time is under this often get no sample: two periods (20 ms at
    /// 100 Hz, the figure Pyroscope documents for span profiles).
    pub fn too_short_ns(&self) -> u64 {
        self.period_ns.saturating_mul(2)
    }
}

/// The sampling period assumed when no profile says (100 Hz, the profiler's default).
pub const DEFAULT_PERIOD_NS: u64 = 10_000_000;

/// Everything read from one or more directories.
#[derive(Clone, Debug, Default)]
pub struct Input {
    /// The directories read, each once, in the order given.
    pub dirs: Vec<PathBuf>,
    /// Every span, each (trace id, span id) once.
    pub spans: Vec<Span>,
    /// Every profile sample of every profile file.
    pub samples: Vec<Sample>,
    /// Every sample of the blocked-in-poll profiles (`*_blocked.pb.gz`, written by the
    /// bridge's watchdog): `cpu_ns` holds the blocked wall time (the `delay` value), not CPU.
    pub blocked: Vec<Sample>,
    /// Every sample of the allocation profiles (`*_alloc.pb.gz`, written with the bridge's
    /// `ProfilingAllocator`): `cpu_ns` holds the estimated bytes allocated
    /// (`alloc_space`), `count` the samples, not CPU.
    pub allocated: Vec<Sample>,
    /// What the sampled allocations still held at the end of the newest allocation
    /// profile of each directory that tracked in-use memory (`inuse_space`: a snapshot,
    /// never summed over profiles): `cpu_ns` holds the estimated bytes held.
    pub held: Vec<Sample>,
    /// Number of profile files read.
    pub profile_files: usize,
    /// Number of span files read.
    pub span_files: usize,
    /// The largest sampling period of the profiles read, if any says.
    pub period_ns: Option<u64>,
    /// The windows of the CPU profiles read that say theirs (`[start, end)`, ns since the
    /// epoch): when a sampler ran, which tells a root started without one.
    pub profile_windows: Vec<(u64, u64)>,
    /// The source file of each function the profiles name one for.
    pub sources: HashMap<Arc<str>, Arc<str>>,
    /// Executables whose profiles say they have no debug info, each once.
    pub without_debug_info: std::collections::BTreeSet<String>,
    /// Crates to count as the user's code beside those the source files show (`--crate`).
    pub user_crates: Vec<String>,
    /// The profiles carry function names only, no source files (a backend's merged
    /// profile): as for an executable without debug info, the named crates and those of
    /// the `main` functions are the user's, every other crate a dependency.
    pub names_only: bool,
}

impl Input {
    /// Whose code each frame is, from the profiles' source files and
    /// [`user_crates`](Self::user_crates) (see [`crate::ownership`]); for an executable
    /// without debug info or profiles of names only ([`names_only`](Self::names_only)),
    /// from the crates of its `main` functions and `--crate`.
    pub fn ownership(&self) -> Arc<Ownership> {
        let owners = Ownership::new(self.sources.clone(), &self.user_crates);
        if (self.without_debug_info.is_empty() && !self.names_only) || !self.sources.is_empty() {
            return Arc::new(owners);
        }
        // No source files: the crates whose `main` ran are the user's. Read from a backend
        // (names only), a sample without a span id is the workload around the span
        // (`investigate`'s fallback, "concurrent workload activity, not this span"): it
        // decides nothing, or a main-thread sample that happened to fall in that window
        // would make the binary's crate the only user crate and the span's own code (a
        // library crate of the same workspace) a dependency.
        let mut mains: std::collections::BTreeSet<String> = self
            .samples
            .iter()
            .filter(|s| !self.names_only || s.span_id.is_some())
            .flat_map(|s| s.frames.iter())
            .filter_map(|f| {
                let krate = f.strip_suffix("::main")?;
                let plain =
                    !krate.is_empty() && krate.chars().all(|c| c.is_alphanumeric() || c == '_');
                (plain && crate::functions::library_group(f).is_none()).then(|| krate.to_owned())
            })
            .collect();
        if self.names_only {
            mains.extend(self.span_module_crates());
        }
        Arc::new(owners.entry_crates_only(mains))
    }

    /// The crates the spans were made in, from their `code.module.name` (see
    /// [`CODE_MODULE_ATTRIBUTES`](otlp::CODE_MODULE_ATTRIBUTES)), leaving out runtime,
    /// library and profiler crates (spans a framework's or this crate's layer makes):
    /// read from a backend (function names only), these are the user's code.
    pub fn span_module_crates(&self) -> std::collections::BTreeSet<String> {
        self.spans
            .iter()
            .filter_map(|s| s.code_module.as_deref())
            .filter_map(|module| {
                let krate = module.split("::").next()?;
                let plain =
                    !krate.is_empty() && krate.chars().all(|c| c.is_alphanumeric() || c == '_');
                let library = crate::functions::library_group(&format!("{krate}::x")).is_some();
                (plain && !library).then(|| krate.to_owned())
            })
            .collect()
    }

    /// Reads every `*_cpu.pb.gz` and `*_spans.jsonl` file of `dirs`.
    ///
    /// Fails on a missing directory, one holding neither kind of file, a corrupt profile
    /// or a malformed span line, naming the path.
    pub fn load(dirs: &[PathBuf]) -> Result<Input, ReportError> {
        if dirs.is_empty() {
            return Err(ReportError::NoDirectories);
        }
        let mut input = Input::default();
        let mut seen_dirs = HashSet::new();
        let mut seen_spans = HashSet::new();
        for dir in dirs {
            if !dir.is_dir() {
                return Err(ReportError::DirectoryMissing { path: dir.clone() });
            }
            let canonical = dir.canonicalize().map_err(|source| ReportError::Io {
                path: dir.clone(),
                source,
            })?;
            if !seen_dirs.insert(canonical) {
                continue;
            }
            input.dirs.push(dir.clone());
            let (profiles, blocked, allocated, span_files) = list_files(dir)?;
            if profiles.is_empty() && span_files.is_empty() {
                return Err(ReportError::DirectoryEmpty { path: dir.clone() });
            }
            for path in &profiles {
                let profile = pprof::read_profile(path)?;
                if profile.period_ns > 0 {
                    input.period_ns = input.period_ns.max(Some(profile.period_ns));
                }
                input.samples.extend(profile.samples);
                input.profile_windows.extend(profile.window);
                input.sources.extend(profile.sources);
                input.without_debug_info.extend(profile.without_debug_info);
            }
            for path in &blocked {
                input
                    .blocked
                    .extend(pprof::read_profile_value(path, BLOCKED_VALUE)?.samples);
            }
            // Sorted by start time: the last in-use snapshot read is the newest.
            let mut newest_held = None;
            for path in &allocated {
                let profile = pprof::decode_file(path)?;
                let allocated = pprof::resolve_value(&profile, ALLOC_VALUE).samples;
                // A heap profile's sample may hold only in-use values (allocated in an
                // earlier interval).
                input.allocated.extend(
                    allocated
                        .into_iter()
                        .filter(|s| s.cpu_ns > 0 || s.count > 0),
                );
                if pprof::has_value(&profile, HELD_VALUE) {
                    newest_held = Some(pprof::resolve_value(&profile, HELD_VALUE).samples);
                }
            }
            input
                .held
                .extend(newest_held.into_iter().flatten().filter(|s| s.cpu_ns > 0));
            for path in &span_files {
                for span in otlp::read_spans(path)? {
                    if seen_spans.insert((span.trace_id, span.span_id)) {
                        input.spans.push(span);
                    }
                }
            }
            input.profile_files += profiles.len();
            input.span_files += span_files.len();
        }
        Ok(input)
    }

    /// What the local roots and profiles read say about the bridge's evidence, to tell
    /// why a root has none.
    pub fn evidence(&self) -> EvidenceContext {
        EvidenceContext::new(&self.local_roots(), self.profile_windows.clone())
    }

    /// The sampling period of the profiles, or [`DEFAULT_PERIOD_NS`] when none says.
    pub fn sampling_period_ns(&self) -> u64 {
        self.period_ns.unwrap_or(DEFAULT_PERIOD_NS)
    }

    /// The local root spans: the spans whose CPU samples are labelled with their id.
    ///
    /// A span is a local root when it has no parent, its flags say the parent is remote,
    /// it carries CPU evidence (`profiling.cpu.*`, set only on local roots), or it has a
    /// `pyroscope.profile.id` and its parent is not among the spans read (with
    /// `ProfileIdScope::All`, children carry a profile id too, but their parent is here).
    pub fn local_roots(&self) -> Vec<&Span> {
        let ids: HashSet<(TraceId, SpanId)> =
            self.spans.iter().map(|s| (s.trace_id, s.span_id)).collect();
        self.spans
            .iter()
            .filter(|s| match &s.parent_span_id {
                None => true,
                Some(parent) => {
                    s.parent_is_remote
                        || s.cpu_samples.is_some()
                        || s.cpu_time_ns.is_some()
                        || (s.profile_id.is_some() && !ids.contains(&(s.trace_id, *parent)))
                }
            })
            .collect()
    }

    /// The samples of each span id label.
    pub fn samples_by_span_id(&self) -> HashMap<SpanId, Vec<&Sample>> {
        by_span_id(&self.samples)
    }

    /// The blocked-in-poll samples labelled with a span id, by span id.
    pub fn blocked_by_span_id(&self) -> HashMap<SpanId, Vec<&Sample>> {
        by_span_id(&self.blocked)
    }

    /// The allocation samples by `span_id` label (bytes in `cpu_ns`).
    pub fn allocated_by_span_id(&self) -> HashMap<SpanId, Vec<&Sample>> {
        by_span_id(&self.allocated)
    }

    /// The newest in-use samples by `span_id` label (bytes held in `cpu_ns`).
    pub fn held_by_span_id(&self) -> HashMap<SpanId, Vec<&Sample>> {
        by_span_id(&self.held)
    }

    /// What the sampling could have seen, to explain spans without samples.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            profiles_read: self.profile_files > 0,
            period_ns: self.sampling_period_ns(),
        }
    }

    /// The names of the local root spans and of the samples' `span_name` labels, sorted.
    pub fn span_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .local_roots()
            .iter()
            .map(|s| s.report_name().into_owned())
            .chain(
                self.samples
                    .iter()
                    .filter_map(|s| s.span_name.as_deref().map(str::to_owned)),
            )
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// How a span without `service.version` is shown, and how to ask for it.
pub const NO_VERSION: &str = "(none)";

/// `version` as shown: the version, or [`NO_VERSION`].
pub fn version_label(version: Option<&str>) -> &str {
    version.unwrap_or(NO_VERSION)
}

/// The profile files and span files of `dir`, each sorted by name (a timeline).
/// `samples` labelled with a span id, by span id.
fn by_span_id(samples: &[Sample]) -> HashMap<SpanId, Vec<&Sample>> {
    let mut map: HashMap<SpanId, Vec<&Sample>> = HashMap::new();
    for sample in samples {
        if let Some(id) = sample.span_id {
            map.entry(id).or_default().push(sample);
        }
    }
    map
}

/// The blocked-in-poll profiles' file name ending (the local sink's).
pub use otel_profiling::local_sink::BLOCKED_PROFILE_SUFFIX as BLOCKED_SUFFIX;
/// The sample type of a blocked-in-poll profile that holds the blocked nanoseconds.
const BLOCKED_VALUE: &str = "delay";

/// The allocation profiles' file name ending (the local sink's).
pub use otel_profiling::local_sink::ALLOC_PROFILE_SUFFIX as ALLOC_SUFFIX;
/// The sample type of an allocation profile that holds the estimated bytes.
const ALLOC_VALUE: &str = "alloc_space";
/// The sample type of an allocation profile (in-use tracking on) that holds the
/// estimated bytes still held at its end.
const HELD_VALUE: &str = "inuse_space";

/// The CPU profiles, blocked-in-poll profiles, allocation profiles and span files of
/// `dir`, each sorted.
type Listing = (Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>, Vec<PathBuf>);

fn list_files(dir: &Path) -> Result<Listing, ReportError> {
    let io_error = |source| ReportError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut profiles = Vec::new();
    let mut blocked = Vec::new();
    let mut allocated = Vec::new();
    let mut spans = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Hidden files are the sink's half-written temporaries.
        if name.starts_with('.') || !entry.path().is_file() {
            continue;
        }
        if name.ends_with(PROFILE_SUFFIX) {
            profiles.push(entry.path());
        } else if name.ends_with(BLOCKED_SUFFIX) {
            blocked.push(entry.path());
        } else if name.ends_with(ALLOC_SUFFIX) {
            allocated.push(entry.path());
        } else if name.ends_with(SPANS_SUFFIX) {
            spans.push(entry.path());
        }
    }
    profiles.sort();
    blocked.sort();
    allocated.sort();
    spans.sort();
    Ok((profiles, blocked, allocated, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: Option<&str>, profile_id: bool) -> Span {
        Span {
            trace_id: "0102030405060708090a0b0c0d0e0f10".parse().unwrap(),
            span_id: id.parse().unwrap(),
            parent_span_id: parent.map(|p| p.parse().unwrap()),
            parent_is_remote: false,
            name: id.into(),
            start_unix_nano: 0,
            end_unix_nano: 0,
            service_version: None,
            profile_id: profile_id.then(|| id.to_owned()),
            cpu_samples: None,
            cpu_time_ns: None,
            http_route: None,
            http_method: None,
            wall_active_ns: None,
            wall_queued_ns: None,
            wall_runqueue_ns: None,
            cgroup_throttled_ns: None,
            cgroup_cpu_limit_millicpus: None,
            busy_ns: None,
            code_module: None,
            evidence_missing: None,
            alloc_bytes: None,
            alloc_count: None,
        }
    }

    /// A heap profile: its allocation samples are read as allocations (a sample holding
    /// only in-use values, allocated in an earlier interval, is none), and the in-use
    /// values of the newest such profile alone as what is held.
    #[test]
    fn the_newest_heap_profile_says_what_is_held() {
        use otel_profiling::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
        use std::time::{Duration, SystemTime};
        let dir = tempfile::tempdir().expect("dir");
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cpu = ProfileBuilder::new(10_000_000, start, Duration::from_secs(10));
        std::fs::write(
            dir.path().join(format!("a{PROFILE_SUFFIX}")),
            cpu.build().encode_gzip().expect("encode"),
        )
        .expect("write");
        let stack = |name: &str, address: u64| {
            vec![SymbolizedFrame {
                address,
                lines: vec![FrameLine {
                    function: name.into(),
                    file: None,
                    line: None,
                }],
            }]
        };
        let labels = SampleLabels {
            span_id: Some(7),
            ..SampleLabels::default()
        };
        for (file, held) in [("1", 4_000u64), ("2", 1_000)] {
            let mut heap = ProfileBuilder::heap(1024, start, Duration::from_secs(10));
            heap.add_allocations(&stack("fill", 0x10), &labels, 2, 8_192);
            heap.add_inuse(&stack("cache", 0x20), &labels, 1, held);
            std::fs::write(
                dir.path().join(format!("{file}{ALLOC_SUFFIX}")),
                heap.build().encode_gzip().expect("encode"),
            )
            .expect("write");
        }
        let input = Input::load(&[dir.path().to_path_buf()]).expect("load");
        let names = |samples: &[Sample]| -> Vec<(String, u64)> {
            samples
                .iter()
                .map(|s| {
                    (
                        s.frames.last().map(|f| f.to_string()).unwrap_or_default(),
                        s.cpu_ns,
                    )
                })
                .collect()
        };
        assert_eq!(
            names(&input.allocated),
            [("fill".to_owned(), 8_192), ("fill".to_owned(), 8_192)]
        );
        assert_eq!(names(&input.held), [("cache".to_owned(), 1_000)]);
    }

    /// Read from a backend (names only) with no `main` on the span's stacks: the crates
    /// the spans were made in are the user's, never a framework's or the profiler's, and
    /// a dependency no span names is not the user's code.
    #[test]
    fn names_only_the_spans_modules_name_the_users_crates() {
        let frames = [
            "tokio::runtime::poll",
            "svc::catalog::import",
            "miniz_oxide::inflate",
        ];
        let mut input = Input {
            samples: vec![Sample {
                frames: frames.iter().rev().map(|f| Arc::from(*f)).collect(),
                cpu_ns: 10_000_000,
                count: 1,
                span_id: Some(SpanId::from(1)),
                trace_id: None,
                span_name: None,
                window: None,
            }],
            names_only: true,
            ..Input::default()
        };
        assert!(
            input.ownership().is_user("miniz_oxide::inflate"),
            "without the spans' modules, told from the names alone"
        );
        for (id, module) in [
            ("0000000000000001", "otel_profiling::axum"),
            ("0000000000000002", "svc::catalog"),
            ("0000000000000003", "tower_http::trace"),
            ("0000000000000004", "9bad::x"),
        ] {
            let mut s = span(id, None, true);
            s.code_module = Some(module.into());
            input.spans.push(s);
        }
        assert_eq!(
            input.span_module_crates().into_iter().collect::<Vec<_>>(),
            ["9bad", "svc"].map(String::from)
        );
        let owners = input.ownership();
        assert!(owners.is_user("svc::catalog::import"));
        assert_eq!(
            owners.group("miniz_oxide::inflate").as_deref(),
            Some("miniz_oxide")
        );
        assert_eq!(
            owners.group("sqlite3VdbeExec").as_deref(),
            Some(crate::ownership::C_GROUP)
        );
        assert!(!owners.is_user("otel_profiling::hooks::otel_scope::in_scope"));
    }

    #[test]
    fn the_workload_around_a_span_does_not_decide_whose_code_it_is() {
        let sample = |frames: &[&str], span_id: Option<SpanId>| Sample {
            frames: frames.iter().rev().map(|f| Arc::from(*f)).collect(),
            cpu_ns: 10_000_000,
            count: 1,
            span_id,
            trace_id: None,
            span_name: None,
            window: span_id.is_none().then_some((0, 1)),
        };
        let mut input = Input {
            samples: vec![sample(
                &["svc_lib::handler", "svc_lib::write_export"],
                Some(SpanId::from(7)),
            )],
            names_only: true,
            ..Input::default()
        };
        assert!(input.ownership().is_user("svc_lib::write_export"));
        // A main-thread sample of the service's profile over the span's interval (the
        // `investigate` fallback): still the span's code.
        input
            .samples
            .push(sample(&["svc::main", "svc_lib::serve"], None));
        assert!(input.ownership().is_user("svc_lib::write_export"));
        // The span's own sample naming `main`: the entry crate rule, as before.
        input.samples.push(sample(
            &["svc::main", "svc_lib::serve"],
            Some(SpanId::from(7)),
        ));
        assert!(!input.ownership().is_user("svc_lib::write_export"));
        assert!(input.ownership().is_user("svc::main"));
    }

    #[test]
    fn local_roots() {
        let mut remote_child = span("0000000000000004", Some("00000000000000ff"), false);
        remote_child.parent_is_remote = true;
        let mut with_evidence = span("0000000000000005", Some("0000000000000001"), false);
        with_evidence.cpu_samples = Some(0);
        let input = Input {
            spans: vec![
                span("0000000000000001", None, true),
                // A child with a profile id (ProfileIdScope::All): its parent is here.
                span("0000000000000002", Some("0000000000000001"), true),
                // A profiled span whose parent is in another process (or file).
                span("0000000000000003", Some("00000000000000ee"), true),
                remote_child,
                with_evidence,
                span("0000000000000006", Some("0000000000000001"), false),
            ],
            ..Input::default()
        };
        let roots: Vec<String> = input
            .local_roots()
            .iter()
            .map(|s| s.span_id.to_string())
            .collect();
        assert_eq!(
            roots,
            [
                "0000000000000001",
                "0000000000000003",
                "0000000000000004",
                "0000000000000005"
            ]
        );
    }
}
