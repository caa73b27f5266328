use axum::routing::get;
use axum::Router;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Backends, service name and the rest from the environment (docs/configuration.md);
    // with nothing set, profiles and spans go to local files (the path is printed).
    // Made before the runtime, so that it is dropped after it (docs/setup.md).
    let telemetry = otel_profiling::Telemetry::from_env()?
        .default_service_name("quickstart")
        .build()?;
    opentelemetry::global::set_tracer_provider(telemetry.tracer_provider().clone());
    tracing_subscriber::registry()
        // RUST_LOG filters the log lines only: the spans must reach the profiling layer.
        .with(fmt::layer().with_filter(EnvFilter::from_default_env()))
        .with(telemetry.layer())
        .init();

    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(serve())?;
    // The runtime first (its tasks' spans end), then the guard: the last profile written,
    // the spans flushed, each within the shutdown timeout.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    drop(telemetry);
    Ok(())
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let app = Router::new()
        .route("/work", get(work))
        .route("/wait", get(wait))
        .route("/blocking", get(blocking))
        // tower-http's TraceLayer, its root spans named `GET /work`, `GET /wait`.
        .layer(otel_profiling::axum::trace_layer());
    let address = std::env::var("ADDRESS").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// CPU the profile attributes to `GET /work`.
async fn work() -> String {
    let hits = (0..200_000_000u64).filter(|n| n % 7 == 3).count();
    format!("{hits} hits\n")
}

/// Waiting, not computing: the report says so.
async fn wait() -> &'static str {
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    "done\n"
}

/// Work on tokio's blocking pool, still `GET /blocking`'s: the request's span is carried
/// into the closure, so the pool's thread is sampled under it (without `in_scope`, its
/// CPU would belong to no span).
async fn blocking() -> String {
    let span = tracing::Span::current();
    let sum = tokio::task::spawn_blocking(move || {
        span.in_scope(|| (0..50_000_000u64).filter(|n| n % 3 == 0).sum::<u64>())
    })
    .await
    .unwrap_or_default();
    format!("{sum} summed\n")
}
