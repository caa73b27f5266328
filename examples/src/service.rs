//! The example service: `GET /report` (CPU-heavy: response serialization dominates),
//! `GET /orders` (I/O-bound: three calls to the slow inventory dependency) and
//! `GET /healthz`. Each request is a local root span named after its route.

use std::net::SocketAddr;
use std::sync::Arc;
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
}

/// The service's routes.
pub fn router(config: ServiceConfig) -> Router {
    let rows = report::build_rows(config.report_rows);
    let state = Arc::new(AppState { config, rows });
    Router::new()
        .route("/report", get(report_handler))
        .route("/orders", get(orders_handler))
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
