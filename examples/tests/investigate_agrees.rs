//! The local report and `investigate` agree for the same run: the demo writes its local
//! files, the files are replayed into the stand-in (the span lines over OTLP/HTTP, each
//! profile file pushed under its process's series labels, as the exporter labels them),
//! and for spans of every endpoint and version the local report's one-span group and the
//! investigation's have the same verdict, the same CPU and blocked time and the same top
//! function of your code; and `diff` of the two releases over the files names the same
//! function as the cause as `investigate`'s control does over the stand-in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use otel_profiling_cli::diff::VersionDiff;
use otel_profiling_cli::input::Input;
use otel_profiling_cli::investigate::{Backends, Baseline, Investigation, OperationQuery};
use otel_profiling_cli::report::SpanGroup;
use otel_profiling_integration_tests::clients::{OtlpClient, PushClient};
use otel_profiling_integration_tests::standin::StandIn;

const SERVICE: &str = "report-service";
const USER_CRATE: &str = "otel_profiling_examples";

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the demo's directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    out
}

/// The span ids a pprof file's samples are labelled with.
fn labelled_span_ids(raw: &[u8]) -> Vec<String> {
    let profile = otel_profiling_pprof::decode(raw).expect("a pprof file");
    let key = profile
        .string_table
        .iter()
        .position(|s| s == "span_id")
        .map(|i| i as i64);
    profile
        .sample
        .iter()
        .flat_map(|s| s.label.iter())
        .filter(|l| Some(l.key) == key)
        .filter_map(|l| profile.string_table.get(l.str as usize).cloned())
        .collect()
}

#[test]
fn the_local_report_and_investigate_agree_on_the_same_run() {
    let root = tempfile_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .env("OTEL_PROFILING_OUTPUT_DIR", &root)
        .env_remove("PYROSCOPE_SERVER_ADDRESS")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .expect("the demo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first thing a new user runs warns about nothing of its own making.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("is not a variable otel-profiling reads"),
        "{stderr}"
    );
    let dir = root.join("demo");
    let mut local = Input::load(std::slice::from_ref(&dir)).expect("the demo's files");
    local.user_crates = vec![USER_CRATE.into()];

    // Replay: spans over OTLP/HTTP, profiles pushed per file with the version of the
    // process that wrote it (its spans' `service.version`).
    let standin = StandIn::start().expect("stand-in");
    let otlp = OtlpClient::new(&standin.url());
    for path in files(&dir, "_spans.jsonl") {
        let text = std::fs::read_to_string(&path).expect("span file");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let request: ExportTraceServiceRequest =
                serde_json::from_str(line).expect("an OTLP JSON line");
            otlp.export(&request).expect("the stand-in takes the spans");
        }
    }
    let version_of: HashMap<String, String> = local
        .spans
        .iter()
        .filter_map(|s| Some((s.span_id.to_string(), s.service_version.clone()?)))
        .collect();
    let push = PushClient::new(&standin.url());
    for (suffix, name) in [("_cpu.pb.gz", "process_cpu"), ("_blocked.pb.gz", "block")] {
        for path in files(&dir, suffix) {
            let raw = std::fs::read(&path).expect("profile file");
            let ids = labelled_span_ids(&raw);
            let Some(version) = ids.iter().find_map(|id| version_of.get(id)) else {
                continue; // no span's samples: nothing an investigation selects
            };
            push.push(
                &[
                    ("__name__", name),
                    ("service_name", SERVICE),
                    ("service_version", version),
                ],
                &raw,
            )
            .unwrap_or_else(|e| panic!("push {}: {e:?}", path.display()));
        }
    }

    let url = standin.url();
    let backends = Backends::from_urls(&url, &url, Duration::from_secs(10)).expect("URLs");
    let roots: Vec<_> = local.local_roots().into_iter().cloned().collect();
    let mut compared = 0;
    for (name, version) in [
        ("GET /report", "1.4.0"),
        ("GET /report", "1.5.0"),
        ("GET /orders", "1.4.0"),
        ("GET /export", "1.5.0"),
    ] {
        let mut spans: Vec<_> = roots
            .iter()
            .filter(|s| s.report_name() == name && s.service_version.as_deref() == Some(version))
            .collect();
        spans.sort_by_key(|s| std::cmp::Reverse(s.wall_ns()));
        assert!(!spans.is_empty(), "{name} {version} in the local files");
        for span in spans.iter().take(3) {
            let mine = SpanGroup::of_spans(&local, name, Some(version), &[span]);
            let mut query = OperationQuery::of_trace(&span.trace_id.to_string());
            query.span_id = Some(span.span_id.to_string());
            query.user_crates = vec![USER_CRATE.into()];
            query.upload_interval = Duration::from_secs(5);
            query.baseline = Baseline::Off;
            let inv = Investigation::run(&backends, &query).expect("investigation");
            let theirs = inv.group().expect("a group");
            let what = format!("{name} {version} span {}", span.span_id);
            assert_eq!(
                mine.verdict, theirs.verdict,
                "{what}: {}\n{inv}",
                mine.reason
            );
            assert_eq!(mine.profile_cpu_ns, theirs.profile_cpu_ns, "{what}: CPU");
            assert_eq!(
                mine.split.blocked_ns, theirs.split.blocked_ns,
                "{what}: blocked"
            );
            assert_eq!(
                mine.blocking.first().map(|f| &f.function),
                theirs.blocking.first().map(|f| &f.function),
                "{what}: where it blocks"
            );
            let top = |g: &SpanGroup| g.user_total.first().map(|f| (f.function.clone(), f.cpu_ns));
            assert_eq!(top(&mine), top(theirs), "{what}: top function of your code");
            if name == "GET /report" {
                // Not an agreement of two empty answers. The span's own sample count
                // tells a lost sample from a span that ran no CPU.
                assert!(
                    mine.profile_cpu_ns > 0 && top(&mine).is_some(),
                    "{what}: {} sample(s) in the profile, {:?} counted by the span; \
                     top functions {:?}",
                    mine.profile_samples,
                    span.cpu_samples,
                    mine.top_total
                );
            }
            compared += 1;
        }
    }
    assert_eq!(compared, 12);

    // The same headline from `diff` over the local files and from `investigate` over the
    // stand-in, for the regression in a helper (`paginate_report`) the handler's closure
    // calls, the demo built with line tables only (the workspace's profile for it), and
    // no `--crate`: investigate takes the user's crates from the spans.
    let local_diff = VersionDiff::between_versions_in(&local, "GET /report", "1.4.0", "1.5.0")
        .expect("both releases in the local files");
    let local_cause = local_diff.cause.as_ref().map(|c| c.function.clone());
    let mut slow: Vec<_> = roots
        .iter()
        .filter(|s| {
            s.report_name() == "GET /report" && s.service_version.as_deref() == Some("1.5.0")
        })
        .collect();
    slow.sort_by_key(|s| s.wall_ns());
    let median = slow[slow.len() / 2];
    let mut query = OperationQuery::of_trace(&median.trace_id.to_string());
    query.span_id = Some(median.span_id.to_string());
    query.upload_interval = Duration::from_secs(5);
    query.baseline = Baseline::Version("1.4.0".into());
    let inv = Investigation::run(&backends, &query).expect("investigation");
    let control = inv.control.as_ref().expect("a control");
    let remote_cause = control
        .diff
        .as_ref()
        .and_then(|d| d.cause.as_ref())
        .map(|c| c.function.clone());
    assert_eq!(
        local_cause.as_deref(),
        Some("otel_profiling_examples::report::paginate_report"),
        "diff's headline: {}",
        local_diff.what_changed()
    );
    assert_eq!(remote_cause, local_cause, "investigate's headline:\n{inv}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A fresh directory under the target directory (the demo writes `<dir>/demo`).
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "otel-profiling-agree-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
