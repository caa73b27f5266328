//! Profiles as the OpenTelemetry profiles signal: OTLP `ExportProfilesServiceRequest`
//! (`opentelemetry/proto/profiles/v1development`) over OTLP/HTTP protobuf or OTLP/gRPC.
//!
//! ```text
//!  encoder thread                                 otel-profiling-otlp-profiles thread
//!  ──────────────                                 ───────────────────────────────────
//!  ProfileSink::export ─► pprof ─► split ─► OTLP ─► bounded queue ─► gzip ─► POST
//!                                                   (the Pyroscope exporter's queue,
//!                                                    uploader, backoff and counters)
//! ```
//!
//! # Wire format (facts this module relies on)
//!
//! * **Proto revision**: opentelemetry-proto **v1.10.0**, profiles `v1development`. The
//!   Rust crate `opentelemetry-proto` 0.33.1 (feature `profiles`) vendors that revision
//!   (its `src/proto/opentelemetry-proto/CHANGELOG.md` tops at 1.10.0). In it `Profile` has a
//!   single `sample_type` (1), `samples` (2), `time_unix_nano` (3, fixed64), `duration_nano`
//!   (4), `period_type` (5), `period` (6); `Sample` is `stack_index` (1),
//!   `attribute_indices` (2), `link_index` (3), `values` (4), `timestamps_unix_nano` (5) —
//!   renumbered from v1.9.0, where `values` was 2 — and the `ProfilesDictionary` holds
//!   `mapping_table` (1), `location_table` (2), `function_table` (3), `link_table` (4),
//!   `string_table` (5), `attribute_table` (6, `KeyValueAndUnit`), `stack_table` (7), each
//!   starting with its zero value. Grafana Pyroscope builds against
//!   `go.opentelemetry.io/proto/otlp` v1.10.0 with `.../profiles/v1development` v0.3.0 (its
//!   `go.mod`), the same revision. PyPI's `opentelemetry-proto` **1.45.2** carries it too
//!   (its `Sample` descriptor has the v1.10.0 numbers; opentelemetry-python PR #5223 moved
//!   the bundled protos to v1.10.0): the test `bridge/tests/otlp_profiles_py.rs` decodes our
//!   bytes with it.
//! * **Where Pyroscope takes it** (`pkg/api/api.go`): `POST /v1development/profiles`
//!   (HTTP: `Content-Type: application/x-protobuf`, `application/protobuf` or
//!   `application/json`; `Content-Encoding: gzip` accepted — `pkg/ingester/otlp/
//!   ingest_handler.go`) and the gRPC method
//!   `/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export` on the
//!   same port. Answers: 200 with an `ExportProfilesServiceResponse`; 400 for invalid
//!   profiles, 429 over the ingestion limit, 413 over the body limit, 500 otherwise.
//! * **How Pyroscope converts it** (`pkg/ingester/otlp/convert.go`, `ingest_handler.go`):
//!   - each OTLP `Profile` becomes one pprof with its one sample type; a sample's
//!     `link_index` ≠ 0 becomes the pprof labels `span_id` (hex of `Link.span_id`) and
//!     `trace_id` (hex of `Link.trace_id`, only when 16 bytes) — the per-sample span
//!     columns the push API's labels feed; other sample attributes become labels
//!     (`span_name` then a series label, as with the push API);
//!   - the series gets `service_name` = the resource's `service.name` (else
//!     `unknown_service[:process.executable.name]`), every string resource and scope
//!     attribute under its own key (`service.version` …), `__delta__=false`,
//!     `__otel__=true`;
//!   - the profile name (`__name__`) comes from the types: sample type `samples`/`count`
//!     with period type `cpu`/`nanoseconds` is **`process_cpu`**, its values multiplied by
//!     the period into `cpu`/`nanoseconds` (so the profile type id is
//!     `process_cpu:cpu:nanoseconds:cpu:nanoseconds`, the same as the push API's); type
//!     `off_cpu`/`nanoseconds` without a period type is `off_cpu`; anything else is named
//!     after the period type (third part of `type:unit:period_type:period_unit`). So the
//!     blocked-in-poll profile, sent as two profiles `contentions`/`count` and
//!     `delay`/`nanoseconds` with period type `contentions`/`count`, is stored by
//!     Pyroscope as `contentions:contentions:count:contentions:count` and
//!     `contentions:delay:nanoseconds:contentions:count` (not `block:…` as over the push
//!     API: an OTLP producer cannot set `__name__`, Pyroscope skips that key).
//! * The OpenTelemetry Collector's OTLP receiver accepts the same request at the same
//!   path (`/v1development/profiles`) when its profiles pipeline is enabled.
//!
//! # Conversion
//!
//! [`convert::convert`] turns the pprof the collector already encoded into the request, so
//! the values an OTLP reader sums per link are the pprof's per span by construction (CPU
//! counts × period). Profiles over
//! [`PyroscopeLimits`](crate::export::pyroscope::PyroscopeLimits) are split with
//! `otel_profiling_pprof::split` first, exactly as for the push API; each part is its own request.
//!
//! # Delivery
//!
//! The same bounded queue, uploader thread, backoff with jitter, shutdown timeout and
//! counters ([`PyroscopeStats`](crate::export::pyroscope::PyroscopeStats)) as [`crate::export::pyroscope`]: only the protocol
//! differs. Retried per the OTLP spec: 429, 502, 503, 504 and network errors (a 429 is
//! answered by sending the request's samples in two halves, as for the push API); any other
//! status is permanent. A 200 whose `partial_success` reports rejected profiles or a
//! message counts as sent (the spec forbids retrying it), is counted in
//! `partial_successes` and logged. Over gRPC (`ProfilesService/Export`, tonic on a
//! current-thread runtime of the uploader thread) the OTLP spec's retryable codes
//! (`CANCELLED`, `DEADLINE_EXCEEDED`, `ABORTED`, `OUT_OF_RANGE`, `UNAVAILABLE`,
//! `DATA_LOSS`) are retried, and `RESOURCE_EXHAUSTED` — what Pyroscope answers over its
//! ingestion limit, its HTTP 429 (`toGRPCStatus` in `ingest_handler.go`) — is split like a
//! 429. HTTP needs the `otlp-http` cargo feature, gRPC `otlp-grpc`.

mod config;
pub mod convert;
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
mod exporter;
#[cfg(all(
    feature = "otlp-grpc",
    any(feature = "pyroscope", feature = "otlp-http")
))]
pub(crate) mod grpc;

pub use config::OtlpProfilesConfig;
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
pub use exporter::{OtlpProfilesExporter, OTLP_UPLOADER_THREAD_NAME};

/// The signal path of OTLP/HTTP profiles, appended to a generic OTLP endpoint
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`); Grafana Pyroscope serves it on its HTTP port.
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// The full gRPC method of the profiles service.
pub const GRPC_EXPORT_METHOD: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
