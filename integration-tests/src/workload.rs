//! The recorded operations: a known CPU-heavy span, an I/O-bound span, and a report
//! endpoint in two versions. Run in a process of its own (the profiler is process-global),
//! normally through `checklist record ...` (see [`crate::recorder`]).

use std::hint::black_box;
use std::time::{Duration, Instant};

use opentelemetry::trace::TraceContextExt as _;
use otel_profiling::config::{OtlpProtocol, ProfilesExporter};
use otel_profiling::{ProfileIdScope, Telemetry};
use serde_json::json;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The known function of the CPU-heavy operation (a substring of its symbol).
pub const CPU_FUNCTION: &str = "checklist_cpu_work";
/// The regression's function in the control scenario.
pub const SERIALIZE_FUNCTION: &str = "repeat_serialize";
/// Name of the CPU-heavy root span.
pub const CPU_SPAN: &str = "checklist cpu-heavy";
/// Name of the I/O-bound root span.
pub const IO_SPAN: &str = "checklist io-bound";
/// Name of the root span whose async task blocks its worker (`std::thread::sleep` in a poll).
pub const BLOCKING_SPAN: &str = "checklist blocks-its-worker";
/// Name of the root span whose async task awaits a timer (no thread inside it meanwhile).
pub const AWAITING_SPAN: &str = "checklist awaits-a-timer";
/// Name of the control scenario's root span.
pub const REPORT_SPAN: &str = "GET /report";
/// How long the CPU-heavy and I/O-bound spans last.
pub const SPAN_DURATION: Duration = Duration::from_millis(400);
/// How often the recordings upload their profiles (each profile is stamped at its
/// interval's start, so a span's samples lie at most this long before the span).
pub const UPLOAD_INTERVAL: Duration = Duration::from_secs(5);
/// How many times the older report version serializes; the newer one does 8× more.
pub const SERIALIZE_PASSES_OLD: u32 = 1;
/// See [`SERIALIZE_PASSES_OLD`].
pub const SERIALIZE_PASSES_NEW: u32 = 8;

/// What to record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A CPU-heavy span, then an I/O-bound (sleeping) span.
    CpuAndIo,
    /// Broken on purpose: the "I/O-bound" span burns CPU instead of waiting.
    CpuAndBusyIo,
    /// Two tasks on a one-worker tokio runtime: one blocks its worker inside a poll, one
    /// awaits a timer.
    BlockingAndAwaiting,
    /// Broken on purpose: the "blocking" task awaits a timer too.
    AwaitingTwice,
    /// `GET /report`, older version (one serialization pass).
    ReportOld,
    /// `GET /report`, newer version (eight serialization passes, same response size).
    ReportNew,
}

impl Scenario {
    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::CpuAndIo => "cpu-and-io",
            Scenario::CpuAndBusyIo => "cpu-and-busy-io",
            Scenario::BlockingAndAwaiting => "blocking-and-awaiting",
            Scenario::AwaitingTwice => "awaiting-twice",
            Scenario::ReportOld => "report-old",
            Scenario::ReportNew => "report-new",
        }
    }

    /// Parses [`Scenario::name`].
    pub fn parse(s: &str) -> Option<Scenario> {
        [
            Scenario::CpuAndIo,
            Scenario::CpuAndBusyIo,
            Scenario::BlockingAndAwaiting,
            Scenario::AwaitingTwice,
            Scenario::ReportOld,
            Scenario::ReportNew,
        ]
        .into_iter()
        .find(|x| x.name() == s)
    }
}

/// Everything a recording needs.
#[derive(Clone, Debug)]
pub struct RecordSpec {
    /// OTLP/HTTP base endpoint (e.g. `http://localhost:4318`).
    pub otlp_endpoint: String,
    /// Pyroscope server.
    pub pyroscope_url: String,
    /// `service.name`.
    pub service_name: String,
    /// `service.version`.
    pub service_version: String,
    /// What to run.
    pub scenario: Scenario,
    /// Whether local roots get `pyroscope.profile.id` (false = `ProfileIdScope::None`).
    pub profile_id: bool,
    /// Ship profiles as OTLP profiles to `{pyroscope_url}/v1development/profiles` (the path
    /// Pyroscope serves) instead of Pyroscope's push API.
    pub profiles_over_otlp: bool,
}

/// Busy CPU work until `budget` of wall time has passed.
#[inline(never)]
pub fn checklist_cpu_work(budget: Duration) -> u64 {
    let start = Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while start.elapsed() < budget {
        for i in 0..10_000u64 {
            x = black_box(x.rotate_left(7) ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
        }
    }
    x
}

/// Serializes the report rows once (the regression's function).
#[inline(never)]
pub fn repeat_serialize(rows: &[(u64, f64, &str)]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(rows.len() * 48);
    for (id, amount, name) in rows {
        let _ = write!(
            out,
            "{{\"id\":{id},\"amount\":{amount:.3},\"name\":\"{name}\"}},"
        );
    }
    black_box(out)
}

/// Renders the report: `passes` serializations, the last one is the response.
#[inline(never)]
pub fn render_report(passes: u32) -> String {
    let rows: Vec<(u64, f64, &str)> = (0..60_000u64)
        .map(|i| (i, i as f64 * 1.25, "checklist row"))
        .collect();
    let mut body = String::new();
    for _ in 0..passes.max(1) {
        body = repeat_serialize(&rows);
    }
    body
}

fn ids() -> (String, String) {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    (sc.trace_id().to_string(), sc.span_id().to_string())
}

/// Runs one root span as a task on a one-worker tokio runtime: the task either blocks its
/// worker inside a poll (`std::thread::sleep`) or awaits a timer for as long.
fn run_async(name: &'static str, blocks: bool) -> Result<serde_json::Value, String> {
    use tracing::Instrument as _;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let span = tracing::info_span!("root", otel.name = name);
    let started = Instant::now();
    let task = async move {
        let ids = ids();
        tokio::task::yield_now().await;
        if blocks {
            checklist_blocking_call(SPAN_DURATION);
        } else {
            tokio::time::sleep(SPAN_DURATION).await;
        }
        ids
    };
    let handle = runtime.spawn(task.instrument(span));
    let (trace_id, span_id) = runtime.block_on(handle).map_err(|e| format!("task: {e}"))?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(json!({
        "name": name, "trace_id": trace_id, "span_id": span_id,
        "wall_ms": wall_ms, "response_bytes": null,
    }))
}

/// A blocking call made inside an async task: holds the worker thread off CPU.
#[inline(never)]
pub fn checklist_blocking_call(d: Duration) {
    std::thread::sleep(d);
}

/// Records the scenario in this process and returns one JSON line per root span
/// (`name`, `trace_id`, `span_id`, `wall_ms`). Call once per process.
pub fn record(spec: &RecordSpec) -> Result<Vec<serde_json::Value>, String> {
    let telemetry = Telemetry::builder()
        .service_name(spec.service_name.clone())
        .resource_attribute("service.version", spec.service_version.clone())
        .resource_attribute("deployment.environment", "checklist")
        .resource_attribute(
            "service.instance.id",
            format!("{}-{}", spec.service_name, std::process::id()),
        )
        .profile_id_scope(if spec.profile_id {
            ProfileIdScope::LocalRoots
        } else {
            ProfileIdScope::None
        })
        .upload_interval(UPLOAD_INTERVAL)
        .otlp(&spec.otlp_endpoint, OtlpProtocol::HttpProtobuf)
        .map_err(|e| e.to_string())?;
    let telemetry = if spec.profiles_over_otlp {
        telemetry
            .otlp_profiles(
                &format!(
                    "{}{}",
                    spec.pyroscope_url.trim_end_matches('/'),
                    otel_profiling::export::otlp_profiles::PROFILES_PATH
                ),
                OtlpProtocol::HttpProtobuf,
                Vec::new(),
            )
            .map_err(|e| e.to_string())?
            .profiles_exporter(ProfilesExporter::Otlp)
    } else {
        telemetry
            .pyroscope(&spec.pyroscope_url, None, None)
            .map_err(|e| e.to_string())?
    };
    let telemetry = telemetry.init().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut run = |name: &'static str, work: &dyn Fn() -> Option<usize>| {
        let span = tracing::info_span!(
            "root",
            otel.name = name,
            report.bytes = tracing::field::Empty
        );
        let started = Instant::now();
        let (trace_id, span_id, bytes) = span.in_scope(|| {
            let (t, s) = ids();
            let bytes = work();
            if let Some(b) = bytes {
                tracing::Span::current().record("report.bytes", b as u64);
            }
            (t, s, bytes)
        });
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        drop(span);
        out.push(json!({
            "name": name, "trace_id": trace_id, "span_id": span_id,
            "wall_ms": wall_ms, "response_bytes": bytes,
        }));
    };
    match spec.scenario {
        Scenario::CpuAndIo | Scenario::CpuAndBusyIo => {
            run(CPU_SPAN, &|| {
                black_box(checklist_cpu_work(SPAN_DURATION));
                None
            });
            let busy = spec.scenario == Scenario::CpuAndBusyIo;
            run(IO_SPAN, &|| {
                if busy {
                    black_box(checklist_cpu_work(SPAN_DURATION));
                } else {
                    std::thread::sleep(SPAN_DURATION);
                }
                None
            });
        }
        Scenario::BlockingAndAwaiting | Scenario::AwaitingTwice => {
            let blocks = spec.scenario == Scenario::BlockingAndAwaiting;
            out.push(run_async(BLOCKING_SPAN, blocks)?);
            out.push(run_async(AWAITING_SPAN, false)?);
        }
        Scenario::ReportOld => run(REPORT_SPAN, &|| {
            Some(render_report(SERIALIZE_PASSES_OLD).len())
        }),
        Scenario::ReportNew => run(REPORT_SPAN, &|| {
            Some(render_report(SERIALIZE_PASSES_NEW).len())
        }),
    }
    let stats = telemetry.stats();
    drop(telemetry);
    if let Some(p) = stats.pyroscope {
        eprintln!("checklist record: pyroscope {p:?}");
    }
    Ok(out)
}
