//! The service process: configuration from the environment, telemetry, runtime, serve.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `SERVICE_VERSION` | `1.4.0` | `service.version` (a series label on profiles) |
//! | `REPORT_SERIALIZER` | `v1` | `v1` or `paged` (the regression) |
//! | `REPORT_ROWS` | calibrated to ~100 ms | rows per report |
//! | `BIND_ADDR` | `127.0.0.1:8080` | listen address (`0.0.0.0:8080` in a container) |
//! | `INVENTORY_ADDR` | an in-process dependency | the slow TCP dependency |
//! | `INVENTORY_LATENCY_MS` | `40` | latency of the in-process dependency |
//! | `SHUTDOWN_ON_STDIN_EOF` | unset | stop when standard input closes (used by the demo) |
//!
//! Plus everything `otel_profiling::Telemetry::from_env` reads (`OTEL_*`, `PYROSCOPE_*`).

use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use crate::report::Serializer;
use crate::service::{self, ServiceConfig};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn parsed<T: std::str::FromStr>(name: &str, expected: &str) -> Result<Option<T>, String> {
    var(name)
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| format!("{name}: got {v:?}, expected {expected}"))
        })
        .transpose()
}

/// Runs the service until Ctrl-C (or standard input closes, if asked).
pub fn main_from_env() -> Result<(), Box<dyn Error>> {
    let version = var("SERVICE_VERSION").unwrap_or_else(|| "1.4.0".into());
    let serializer = match var("REPORT_SERIALIZER") {
        None => Serializer::V1,
        Some(s) => Serializer::parse(&s)
            .ok_or_else(|| format!("REPORT_SERIALIZER: got {s:?}, expected `v1` or `paged`"))?,
    };
    let bind: SocketAddr = parsed("BIND_ADDR", "host:port")?
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let inventory_addr: Option<SocketAddr> = parsed("INVENTORY_ADDR", "host:port")?;
    let latency =
        Duration::from_millis(parsed("INVENTORY_LATENCY_MS", "milliseconds")?.unwrap_or(40));
    let rows = match parsed::<usize>("REPORT_ROWS", "a row count")? {
        Some(rows) => rows,
        None => service::calibrate_rows(Duration::from_millis(100)),
    };

    let telemetry = otel_profiling::Telemetry::from_env()?
        .default_service_name("report-service")
        .resource_attribute("service.version", version.clone())
        .init()?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
        .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop())
        .build()?;
    let stdin_eof = var("SHUTDOWN_ON_STDIN_EOF").is_some();
    runtime.block_on(async move {
        let inventory = match inventory_addr {
            Some(addr) => addr,
            None => crate::inventory::serve(latency).await?,
        };
        let config = ServiceConfig {
            serializer,
            report_rows: rows,
            inventory,
        };
        let shutdown = async move {
            if stdin_eof {
                let _ = tokio::task::spawn_blocking(|| {
                    let mut sink = Vec::new();
                    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
                })
                .await;
            } else {
                let _ = tokio::signal::ctrl_c().await;
            }
        };
        service::serve(
            config,
            bind,
            |addr| {
                println!("listening on http://{addr} (version {version}, serializer {serializer:?}, {rows} rows)");
                let _ = std::io::stdout().flush();
            },
            shutdown,
        )
        .await
    })?;
    drop(runtime);
    drop(telemetry); // last profile and spans written
    Ok(())
}
