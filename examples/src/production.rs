//! A production-shaped axum service, wired as the README's quickstart wires one (plus the
//! runtime's hooks, `docs/setup.md`), whose endpoints do what real services do and what
//! the bridge must get right:
//!
//! * `GET /fanout`: eight `tokio::spawn`ed tasks computing in the request's span
//!   (`in_current_span`), joined: pure CPU on every worker;
//! * `GET /blocking`: CPU work in `spawn_blocking`, the request span carried into the
//!   pool thread with `Span::in_scope`;
//! * `GET /blocking-unspanned`: the same without the span (the request only awaits it);
//! * `POST /ledger`: a `std::sync::Mutex` held across a file write, `fdatasync` and a slow
//!   device's wait, inside the async handler: it blocks its worker;
//! * `GET /dep`: a call to a slow dependency (a local TCP service), awaited;
//! * a background worker on the plain OpenTelemetry API (`ProfilingContext`), a CPU job
//!   every 20 ms.
//!
//! [`run`] serves it with telemetry writing to a directory, drives every endpoint from
//! another runtime for a while, optionally beside busy loops in other processes, and
//! returns the kernel's own figures for the service's threads over the load
//! (`/proc/self/task/*/schedstat`: CPU time and run delay), for the tests to check the
//! span evidence against.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
use tracing::Instrument;

use crate::axum_routes::{calibrate_rounds, checksums};
use crate::inventory;

/// The endpoints the load drives, as the report names their rows.
pub const ENDPOINTS: [(&str, &str); 5] = [
    ("GET", "/fanout"),
    ("GET", "/blocking"),
    ("GET", "/blocking-unspanned"),
    ("POST", "/ledger"),
    ("GET", "/dep"),
];

/// The plain-API worker's root span name.
pub const WORKER_SPAN: &str = "worker.job";

/// The name of the service runtime's threads (workers and blocking pool).
pub const THREAD_NAME: &str = "prod-svc";

#[derive(Clone)]
struct AppState {
    rounds: u64,
    dependency: SocketAddr,
    ledger: Arc<Mutex<File>>,
}

/// The service (its routes and their state) for a ledger file in `dir`, calling the slow
/// dependency at `dependency`, with CPU work of `rounds` checksum rounds per part: what
/// [`run`] serves, for other harnesses (the overhead bench) to serve the same.
pub fn service(dir: &Path, dependency: SocketAddr, rounds: u64) -> std::io::Result<Router> {
    Ok(router(AppState {
        rounds,
        dependency,
        ledger: Arc::new(Mutex::new(File::create(dir.join("ledger.log"))?)),
    }))
}

/// The service's routes, each request a root span named `{method} {route}`.
fn router(state: AppState) -> Router {
    Router::new()
        .route("/fanout", get(fanout))
        .route("/blocking", get(blocking))
        .route("/blocking-unspanned", get(blocking_unspanned))
        .route("/ledger", post(ledger))
        .route("/dep", get(dep))
        .with_state(state)
        .layer(otel_profiling::axum::trace_layer())
}

async fn fanout(State(state): State<AppState>) -> String {
    let parts: Vec<_> = (0..8)
        .map(|_| {
            let rounds = state.rounds / 4;
            tokio::spawn(async move { checksums(rounds) }.in_current_span())
        })
        .collect();
    let mut sum = 0u64;
    for part in parts {
        sum ^= part.await.unwrap_or(0);
    }
    format!("{sum:016x}\n")
}

async fn blocking(State(state): State<AppState>) -> String {
    let span = tracing::Span::current();
    let rounds = state.rounds;
    let sum = tokio::task::spawn_blocking(move || span.in_scope(|| checksums(rounds)))
        .await
        .unwrap_or(0);
    format!("{sum:016x}\n")
}

async fn blocking_unspanned(State(state): State<AppState>) -> String {
    let rounds = state.rounds;
    let sum = tokio::task::spawn_blocking(move || checksums(rounds))
        .await
        .unwrap_or(0);
    format!("{sum:016x}\n")
}

async fn ledger(State(state): State<AppState>) -> &'static str {
    // The mistake: a blocking lock and a synchronous flush inside the async handler.
    let mut file = state.ledger.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = file.write_all(b"2026-12-07T00:00:00Z credit 100.00 EUR\n");
    let _ = file.sync_data();
    // A slow device's flush (a network disk), held under the lock.
    std::thread::sleep(Duration::from_millis(4));
    "ok\n"
}

async fn dep(State(state): State<AppState>) -> String {
    let stock = inventory::lookup(state.dependency, "SKU-00042-1")
        .await
        .unwrap_or(0);
    format!("{stock}\n")
}

/// One thread's CPU time and run delay from the kernel (`schedstat`), nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelTimes {
    /// Time on CPU.
    pub cpu_ns: u64,
    /// Time runnable, waiting for a CPU.
    pub run_delay_ns: u64,
}

/// The service runtime's threads ([`THREAD_NAME`]) now: tid → times.
fn service_threads() -> std::collections::BTreeMap<u32, KernelTimes> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != THREAD_NAME {
            continue;
        }
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        let mut fields = stat
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0));
        let (cpu_ns, run_delay_ns) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
        out.insert(
            tid,
            KernelTimes {
                cpu_ns,
                run_delay_ns,
            },
        );
    }
    out
}

/// What [`run`] did and what the kernel counted.
#[derive(Debug)]
pub struct ProductionRun {
    /// Requests answered per endpoint, in [`ENDPOINTS`] order.
    pub answered: [u64; 5],
    /// Requests that failed.
    pub failed: u64,
    /// The plain-API worker's jobs.
    pub worker_jobs: u64,
    /// The service threads' CPU time and run delay over the load, summed over threads
    /// (those that ended meanwhile count up to their last reading).
    pub kernel: KernelTimes,
    /// The profiler's own view of its coverage at the end.
    pub stats: otel_profiling::HealthStats,
}

/// Errors of [`run`].
pub type RunError = Box<dyn std::error::Error + Send + Sync>;

/// Runs the service with telemetry writing to `dir`, drives every endpoint for
/// `load_for` (two client loops each) and, with `busy_loops`, keeps that many busy loops
/// in other processes running meanwhile. Installs the global `tracing` subscriber: call
/// once per process.
pub fn run(dir: &Path, load_for: Duration, busy_loops: usize) -> Result<ProductionRun, RunError> {
    let telemetry = otel_profiling::Telemetry::builder()
        .service_name("production-shaped")
        .resource_attribute("service.version", env!("CARGO_PKG_VERSION"))
        .output_dir(dir)
        .init()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(THREAD_NAME)
        .enable_all()
        .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
        .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
        .on_thread_park(otel_profiling::sampler::tokio_on_thread_park())
        .on_thread_unpark(otel_profiling::sampler::tokio_on_thread_unpark())
        .build()?;
    let outside = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let dependency = outside.block_on(inventory::serve(Duration::from_millis(15)))?;
    let ledger = File::create(dir.join("ledger.log"))?;
    let state = AppState {
        rounds: calibrate_rounds(Duration::from_millis(4)),
        dependency,
        ledger: Arc::new(Mutex::new(ledger)),
    };
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = router(state.clone());
    let server = runtime.spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    // The plain-API worker: its own root per job, CPU in `ProfilingContext::in_scope`.
    let working = Arc::new(AtomicBool::new(true));
    let tracer = telemetry.tracer_provider().tracer("worker");
    let worker = runtime.spawn({
        let working = working.clone();
        let rounds = state.rounds;
        async move {
            let mut jobs = 0u64;
            while working.load(Ordering::Relaxed) {
                {
                    let span = tracer.start(WORKER_SPAN);
                    let cx = otel_profiling::ProfilingContext::new(
                        opentelemetry::Context::current_with_span(span),
                        WORKER_SPAN,
                    );
                    cx.in_scope(|| checksums(rounds * 2));
                    cx.context().span().end();
                }
                jobs += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            jobs
        }
    });

    let mut busy: Vec<Child> = (0..busy_loops)
        .map(|_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let before = service_threads();
    let (answered, failed) = outside.block_on(load(&url, load_for));
    let after = service_threads();
    for child in &mut busy {
        let _ = child.kill();
        let _ = child.wait();
    }
    working.store(false, Ordering::Relaxed);
    let worker_jobs = runtime.block_on(worker).unwrap_or(0);
    let _ = stop.send(());
    runtime.block_on(server)??;
    drop(runtime);
    drop(outside);
    let stats = telemetry.stats();
    drop(telemetry); // the last profile and the spans written
    let mut kernel = KernelTimes::default();
    for (tid, end) in &after {
        let start = before.get(tid).copied().unwrap_or_default();
        kernel.cpu_ns += end.cpu_ns.saturating_sub(start.cpu_ns);
        kernel.run_delay_ns += end.run_delay_ns.saturating_sub(start.run_delay_ns);
    }
    Ok(ProductionRun {
        answered,
        failed,
        worker_jobs,
        kernel,
        stats,
    })
}

/// Two client loops per endpoint for `duration`; requests answered per endpoint and
/// failures.
async fn load(base_url: &str, duration: Duration) -> ([u64; 5], u64) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + duration;
    let mut loops = Vec::new();
    for (i, (method, route)) in ENDPOINTS.iter().enumerate() {
        for _ in 0..2 {
            let (client, url) = (client.clone(), format!("{base_url}{route}"));
            let post = *method == "POST";
            loops.push((
                i,
                tokio::spawn(async move {
                    let (mut ok, mut failed) = (0, 0);
                    while Instant::now() < deadline {
                        let request = if post {
                            client.post(&url)
                        } else {
                            client.get(&url)
                        };
                        let answered = match request.send().await {
                            Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                            Err(_) => false,
                        };
                        if answered {
                            ok += 1;
                        } else {
                            failed += 1;
                        }
                    }
                    (ok, failed)
                }),
            ));
        }
    }
    let (mut answered, mut failed) = ([0; 5], 0);
    for (i, task) in loops {
        let (ok, bad) = task.await.unwrap_or((0, 1));
        answered[i] += ok;
        failed += bad;
    }
    (answered, failed)
}
