//! An axum 0.8 service traced by tower-http's `TraceLayer` through
//! `otel_profiling::axum::trace_layer()`, so each request's root span is named after its
//! route (`GET /cpu`) rather than `request`. Three endpoints:
//!
//! * `GET /cpu`: CPU-heavy (checksums computed in the handler);
//! * `GET /io`: I/O-bound (two calls to a slow local TCP dependency, awaited);
//! * `GET /sleep`: calls `std::thread::sleep` inside the async handler, blocking its
//!   runtime worker — the mistake a profile should help find.
//!
//! [`run`] starts the telemetry with local files, serves, drives load on every route for a
//! while from another thread, stops and writes the last files; the `axum_routes` binary
//! then prints the span report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::get;
use axum::Router;

use crate::inventory;

/// The routes, as the report names their rows.
pub const ROUTES: [&str; 3] = ["/cpu", "/io", "/sleep"];

/// How the handlers behave.
#[derive(Clone, Copy, Debug)]
pub struct RoutesConfig {
    /// Checksum rounds per `GET /cpu` (see [`calibrate_rounds`]).
    pub cpu_rounds: u64,
    /// The slow dependency `GET /io` calls.
    pub dependency: SocketAddr,
    /// How long `GET /sleep` blocks its worker.
    pub sleep: Duration,
}

/// Thread CPU and wall time the handlers measured themselves, per route: an account
/// independent of the profiler, to check the report against.
#[derive(Clone, Debug, Default)]
pub struct Measured(Arc<Mutex<BTreeMap<&'static str, RouteTotals>>>);

/// Totals of one route's handler bodies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteTotals {
    /// Requests handled.
    pub requests: u64,
    /// Thread CPU time inside the handler body, nanoseconds.
    pub cpu_ns: u64,
    /// Wall time of the handler body, nanoseconds.
    pub wall_ns: u64,
}

impl RouteTotals {
    /// CPU / wall (0 without wall time).
    pub fn ratio(&self) -> f64 {
        if self.wall_ns == 0 {
            0.0
        } else {
            self.cpu_ns as f64 / self.wall_ns as f64
        }
    }
}

impl Measured {
    /// The totals of `route` so far.
    pub fn get(&self, route: &str) -> RouteTotals {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(route).copied().unwrap_or_default()
    }

    fn add(&self, route: &'static str, cpu_ns: u64, wall_ns: u64) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let totals = map.entry(route).or_default();
        totals.requests += 1;
        totals.cpu_ns += cpu_ns;
        totals.wall_ns += wall_ns;
    }

    /// Runs `body` (a synchronous part of a handler) and adds its thread CPU and wall time
    /// to `route`.
    fn time<T>(&self, route: &'static str, body: impl FnOnce() -> T) -> T {
        let (cpu, wall) = (thread_cpu_ns(), Instant::now());
        let out = body();
        let wall_ns = u64::try_from(wall.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.add(route, thread_cpu_ns().saturating_sub(cpu), wall_ns);
        out
    }
}

/// CPU time of the calling thread, nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[derive(Clone)]
struct AppState {
    config: RoutesConfig,
    measured: Measured,
}

/// The service: three routes, each request a root span named `GET {route}` by
/// `otel_profiling::axum::trace_layer()` (added with `Router::layer`, so it sees the
/// matched route).
pub fn router(config: RoutesConfig, measured: Measured) -> Router {
    Router::new()
        .route("/cpu", get(cpu))
        .route("/io", get(io))
        .route("/sleep", get(sleep))
        .with_state(AppState { config, measured })
        .layer(otel_profiling::axum::trace_layer())
}

async fn cpu(State(state): State<AppState>) -> String {
    let sum = state
        .measured
        .time("/cpu", || checksums(state.config.cpu_rounds));
    format!("{sum:016x}\n")
}

async fn io(State(state): State<AppState>) -> String {
    // The wall time is the awaits; the handler's own CPU is negligible.
    let start = Instant::now();
    let mut stock = 0;
    for sku in ["SKU-00017-0", "SKU-00042-1"] {
        stock += inventory::lookup(state.config.dependency, sku)
            .await
            .unwrap_or(0);
    }
    let wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    state.measured.add("/io", 0, wall_ns);
    format!("{stock} in stock\n")
}

async fn sleep(State(state): State<AppState>) -> &'static str {
    // Blocks the runtime worker: no CPU, and nothing else runs on this worker meanwhile.
    state
        .measured
        .time("/sleep", || std::thread::sleep(state.config.sleep));
    "slept\n"
}

/// CPU work the optimizer cannot remove: `rounds` rounds of a multiplicative hash.
#[inline(never)]
pub fn checksums(rounds: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for i in 0..rounds {
        h = (h ^ i).wrapping_mul(0x0100_0000_01b3).rotate_left(5);
    }
    std::hint::black_box(h)
}

/// Rounds of [`checksums`] that take about `target` of CPU on this machine and build.
pub fn calibrate_rounds(target: Duration) -> u64 {
    let probe = 200_000;
    let (start, cpu) = (Instant::now(), thread_cpu_ns());
    let mut runs = 0u64;
    while start.elapsed() < Duration::from_millis(30) || runs == 0 {
        checksums(probe);
        runs += 1;
    }
    let per_round = thread_cpu_ns().saturating_sub(cpu).max(1) as f64 / (runs * probe) as f64;
    ((target.as_nanos() as f64 / per_round) as u64).max(1_000)
}

/// What [`run`] did.
#[derive(Debug)]
pub struct RunSummary {
    /// Requests answered per route, in [`ROUTES`] order.
    pub answered: [u64; 3],
    /// Requests that failed.
    pub failed: u64,
    /// The handlers' own measurement.
    pub measured: Measured,
}

/// Errors of [`run`].
pub type RunError = Box<dyn std::error::Error + Send + Sync>;

/// Runs the service with telemetry writing to `dir` (local files only), drives every route
/// for `load_for` with one client loop each, then stops and writes the last profile and
/// spans. Installs the global `tracing` subscriber: call once per process.
pub fn run(dir: &Path, load_for: Duration) -> Result<RunSummary, RunError> {
    let telemetry = otel_profiling::Telemetry::builder()
        .service_name("axum-routes")
        .resource_attribute("service.version", env!("CARGO_PKG_VERSION"))
        .output_dir(dir)
        .init()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
        .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
        .build()?;
    // The client and the dependency run apart from the service's runtime, as other
    // processes would: a worker blocked by `/sleep` must not stall them.
    let outside = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let dependency = outside.block_on(async {
        let addr = inventory::serve(Duration::from_millis(20)).await?;
        Ok::<_, std::io::Error>(addr)
    })?;
    let config = RoutesConfig {
        cpu_rounds: calibrate_rounds(Duration::from_millis(20)),
        dependency,
        sleep: Duration::from_millis(30),
    };
    let measured = Measured::default();
    let app = router(config, measured.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = runtime.spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });

    let (answered, failed) = outside.block_on(load(&url, load_for));
    let _ = stop.send(());
    runtime.block_on(server)??;
    drop(runtime);
    drop(outside);
    drop(telemetry); // the last profile and the spans written
    Ok(RunSummary {
        answered,
        failed,
        measured,
    })
}

/// One client loop per route for `duration`; requests answered per route and failures.
async fn load(base_url: &str, duration: Duration) -> ([u64; 3], u64) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + duration;
    let loops = ROUTES.map(|route| {
        let (client, url) = (client.clone(), format!("{base_url}{route}"));
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0, 0);
            while Instant::now() < deadline {
                let answered = match client.get(&url).send().await {
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
        })
    });
    let (mut answered, mut failed) = ([0; 3], 0);
    for (i, task) in loops.into_iter().enumerate() {
        let (ok, bad) = task.await.unwrap_or((0, 1));
        answered[i] = ok;
        failed += bad;
    }
    (answered, failed)
}
