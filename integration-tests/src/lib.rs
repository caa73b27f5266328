//! Cross-crate verification of otel-profiling against its deployment.
//!
//! `tests/stack_config.rs` parses `docker-compose.yml`, `deploy/tempo.yaml` and the Grafana
//! provisioning under `deploy/grafana/`, and checks them against the bridge's own constants:
//! the profile type id Grafana queries, the span attribute to series label mapping, the
//! environment variables the demo service is given. No Docker is needed.
//!
//! The verification checklist (`tests/checklist.rs`, the `checklist` binary) records known
//! operations with the bridge and checks, through the real APIs of Tempo and Pyroscope
//! ([`clients`]), that their traces and span profiles are there and say what they should
//! ([`checklist`]). By default the tests run against [`standin`] — an in-process stand-in
//! for tests, not a backend; with `TEMPO_URL`, `PYROSCOPE_URL` and
//! `OTEL_EXPORTER_OTLP_ENDPOINT` set, against the real stack. See `docs/verification.md`.

pub mod checklist;
pub mod clients;
pub mod recorder;
pub mod standin;
pub mod workload;
