//! The example service: `GET /report` (CPU-heavy: response serialization dominates),
//! `GET /orders` (I/O-bound: three calls to the slow inventory dependency), `GET /export`
//! (blocks its worker: a synchronous write under a `std::sync::Mutex`, inside the async
//! handler — the mistake the blocked-in-poll profile names) and `GET /healthz`. Each
//! request is a local root span named after its route.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use tracing::Instrument;

use crate::inventory;
use crate::report::{self, Row, Serializer};

/// How the service behaves.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The report serializer (the regression switch).
    pub serializer: Serializer,
    /// Rows in each report.
    pub report_rows: usize,
    /// The inventory dependency.
    pub inventory: SocketAddr,
}

struct AppState {
    config: ServiceConfig,
    rows: Vec<Row>,
    /// The export file, written by one request at a time.
    export: Mutex<Option<std::fs::File>>,
}

/// How long the export's synchronous write stalls (a slow disk's flush, or a blocking
/// client's round trip).
pub const EXPORT_STALL: Duration = Duration::from_millis(25);

/// The service's routes.
pub fn router(config: ServiceConfig) -> Router {
    let rows = report::build_rows(config.report_rows);
    let state = Arc::new(AppState {
        config,
        rows,
        export: Mutex::new(tempfile_for_export()),
    });
    Router::new()
        .route("/report", get(report_handler))
        .route("/orders", get(orders_handler))
        .route("/export", get(export_handler))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

async fn report_handler(State(state): State<Arc<AppState>>) -> String {
    let span = tracing::info_span!("GET /report", otel.kind = "server", http.route = "/report");
    async move {
        // CPU-heavy work goes to the blocking pool; the span goes with it.
        let span = tracing::Span::current();
        let state = state.clone();
        let body = tokio::task::spawn_blocking(move || {
            span.in_scope(|| report::render(state.config.serializer, &state.rows))
        })
        .await
        .unwrap_or_default();
        format!("{} bytes\n", body.len())
    }
    .instrument(span)
    .await
}

async fn orders_handler(State(state): State<Arc<AppState>>) -> String {
    let span = tracing::info_span!("GET /orders", otel.kind = "server", http.route = "/orders");
    async move {
        let mut total = 0;
        for sku in ["SKU-00017-0", "SKU-00042-1", "SKU-00099-2"] {
            total += inventory::lookup(state.config.inventory, sku)
                .await
                .unwrap_or(0);
        }
        format!("{total} in stock\n")
    }
    .instrument(span)
    .await
}

async fn export_handler(State(state): State<Arc<AppState>>) -> String {
    let span = tracing::info_span!("GET /export", otel.kind = "server", http.route = "/export");
    async move {
        // The mistake: synchronous, blocking work right inside the async handler. The
        // worker thread is held (off CPU) and every other task on it waits.
        let written = write_export(&state.export, &state.rows[..state.rows.len().min(50)]);
        format!("{written} bytes exported\n")
    }
    .instrument(span)
    .await
}

/// Writes rows to the export file under its lock, then waits for the (slow) flush.
#[inline(never)]
fn write_export(export: &Mutex<Option<std::fs::File>>, rows: &[Row]) -> usize {
    let body = serde_json::to_vec(rows).unwrap_or_default();
    let mut file = export.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(file) = file.as_mut() {
        let _ = file.write_all(&body);
    }
    flush_to_slow_disk();
    body.len()
}

/// Stands for a slow synchronous flush: a blocking system call under the lock.
#[inline(never)]
fn flush_to_slow_disk() {
    std::thread::sleep(EXPORT_STALL);
}

/// An anonymous file for the exports (removed as soon as it is open).
fn tempfile_for_export() -> Option<std::fs::File> {
    let path = std::env::temp_dir().join(format!("otel-profiling-export-{}", std::process::id()));
    let file = std::fs::File::create(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    Some(file)
}

/// Serves `router(config)` on `bind` until `shutdown` resolves; returns after the
/// listener is closed. `on_ready` gets the bound address.
pub async fn serve(
    config: ServiceConfig,
    bind: SocketAddr,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind).await?;
    on_ready(listener.local_addr()?);
    axum::serve(listener, router(config))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Rows such that one healthy serialization takes about `target` on this machine and
/// build (so the demo shows ~100 ms vs ~800 ms in debug and release builds alike).
pub fn calibrate_rows(target: Duration) -> usize {
    let probe = 2_000;
    let rows = report::build_rows(probe);
    let start = std::time::Instant::now();
    let mut runs = 0u32;
    while start.elapsed() < Duration::from_millis(50) || runs == 0 {
        std::hint::black_box(report::serialize_report(&rows));
        runs += 1;
    }
    let per_row = start.elapsed().as_secs_f64() / f64::from(runs) / probe as f64;
    ((target.as_secs_f64() / per_row.max(1e-9)) as usize).clamp(200, 200_000)
}
