use axum::extract::Path;
use axum::routing::get;
use axum::Router;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let telemetry = otel_profiling::Telemetry::from_env()?
        .default_service_name("catalog")
        .init()?; // global tracing subscriber + tracer provider; local files by default
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
        .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
        .on_thread_park(otel_profiling::sampler::tokio_on_thread_park())
        .on_thread_unpark(otel_profiling::sampler::tokio_on_thread_unpark())
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = Router::new()
            .route("/items/{id}", get(item))
            .route("/search", get(search))
            // On the Router (not around it), so each span knows its matched route:
            // root spans `GET /items/{id}` and `GET /search`, whatever the id.
            .layer(otel_profiling::axum::trace_layer());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
        println!("listening on http://{}", listener.local_addr()?);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    })?;
    drop(runtime); // the service's spans end with its tasks
    drop(telemetry); // then the last profile is written and the spans flushed
    Ok(())
}

async fn item(Path(id): Path<u64>) -> String {
    format!("item {id}\n")
}

async fn search() -> String {
    // CPU the profile attributes to `GET /search`.
    let hits = (0..2_000_000u64).filter(|n| n % 7 == 3).count();
    format!("{hits} hits\n")
}
