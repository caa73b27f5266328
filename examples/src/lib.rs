//! Example services for otel-profiling: a tokio/axum service with a CPU-heavy endpoint
//! (`GET /report`, whose response serialization dominates) and an I/O-bound one
//! (`GET /orders`, waiting on a slow TCP dependency), a serializer regression between two
//! releases, and a load generator. The `demo` binary runs it all on the embedded default;
//! the `service` and `load` binaries run against the compose stack. `axum_routes` is an
//! axum + tower-http service whose spans are named after their routes by
//! `otel_profiling::axum`. `production` is a production-shaped one (fan-out,
//! `spawn_blocking` with and without the span, a blocking mutex, a slow dependency, a
//! plain-API worker) whose tests check the evidence against the kernel's figures.

pub mod app;
pub mod axum_routes;
pub mod inventory;
pub mod load;
pub mod production;
pub mod report;
pub mod service;
