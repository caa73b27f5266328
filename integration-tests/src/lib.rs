//! Cross-crate verification of otel-profiling against its deployment.
//!
//! `tests/stack_config.rs` parses `docker-compose.yml`, `deploy/tempo.yaml` and the Grafana
//! provisioning under `deploy/grafana/`, and checks them against the bridge's own constants:
//! the profile type id Grafana queries, the span attribute to series label mapping, the
//! environment variables the demo service is given. No Docker is needed.
//!
//! Checks against a running stack (`TEMPO_URL`, `PYROSCOPE_URL`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) are future work; see `docs/stack.md`.
