//! Pushes finished CPU profiles to Grafana Pyroscope (`push.v1.PusherService/Push`).
//!
//! ```text
//!  encoder thread                            otel-profiling-uploader thread
//!  ──────────────                            ──────────────────────────────
//!  ProfileSink::export ─► encode PushRequest ─► bounded queue (bytes) ─► gzip ─► POST
//!  (never waits on the network)               oldest dropped on overflow   retry with backoff
//! ```
//!
//! # Wire protocol
//!
//! One HTTP/1.1 `POST {server}/push.v1.PusherService/Push` per profile (or per part of a
//! split profile), in the order the collector produced them: a Connect unary call whose
//! body is the protobuf `push.v1.PushRequest` with one `RawProfileSeries` (the series
//! labels) holding one `RawSample` (`raw_profile` = the gzipped pprof, `ID` = a random UUID
//! v4). Field numbers follow `api/push/v1/push.proto` and `api/types/v1/types.proto` of
//! grafana/pyroscope.
//!
//! # Limits
//!
//! A profile over [`PyroscopeLimits`] (samples, uncompressed bytes) is split with
//! [`crate::pprof::split`] into parts that fit, each sent as its own push:
//! Pyroscope v2.2.1 refuses a profile over 16,000 samples or 4 MiB (400), charges each
//! profile's uncompressed size against its ingestion limiter at once (a profile over the
//! 2 MiB burst gets 429 forever), and stores the profiles of one push one by one (so a
//! multi-profile push resent after a partial failure would store some twice).
//!
//! Headers: `Content-Type: application/proto`, `Content-Encoding: gzip`,
//! `Connect-Protocol-Version: 1`, `User-Agent: otel-profiling/<version>`, the credentials
//! (`Authorization: Basic …` or `Bearer …`), `X-Scope-OrgID` when a tenant is set, and any
//! extra headers.
//!
//! **Why the body is gzipped:** Pyroscope registers its Connect handlers with
//! `connectapi.DefaultHandlerOptions()`, which installs a gzip decompressor
//! (`pkg/api/connect/compression.go`, `connect.go`; `pkg/api/api.go` registers the pusher with
//! them), and Connect unary requests name their compression in `Content-Encoding`. The pprof
//! inside is already gzipped (Pyroscope sniffs the gzip header of `raw_profile` itself, see
//! `pkg/pprof/pprof.go`), so the outer gzip saves little; it runs at the fastest level, on the
//! uploader thread, once per profile (retries resend the same bytes), and keeps the request
//! shaped like those of Pyroscope's own SDKs.
//!
//! # Delivery
//!
//! * Series labels: `__name__=process_cpu` (`block` for blocked-in-poll profiles),
//!   `service_name=<application>`, then the extra
//!   labels (a later duplicate replaces an earlier one), sorted by name.
//! * 2xx: sent. 5xx and network errors or timeouts: retried with exponential backoff and
//!   full jitter, up to [`PyroscopeBackoff::max_attempts`] attempts, then dropped. 429:
//!   the push is replaced by two halves (its profile's samples split in two) sent after
//!   the backoff (a `Retry-After` in seconds is honoured, capped by the maximum backoff;
//!   Pyroscope sends none), so a push over the server's burst is never resent as is; a
//!   profile of one sample is retried as is. Any other status (4xx, 3xx: redirects are not
//!   followed) is a permanent failure, not retried; when the answer names one of
//!   Pyroscope's limits, the log line names it and the setting that avoids it.
//! * The queue holds at most [`PyroscopeConfig::max_queue_bytes`] of encoded requests. A
//!   profile that does not fit pushes the oldest queued ones out (the one being sent at that
//!   moment stays); a profile larger than the whole queue is refused. Both count as dropped.
//! * Dropping the exporter (the collector drops its sinks after the last profile) lets the
//!   uploader send what is queued for up to [`PyroscopeConfig::shutdown_timeout`]; then the
//!   rest is dropped and `drop` returns, even if the server never answers (the thread is
//!   then left to finish its last request on its own).
//! * Failures are written to stderr, prefixed `otel-profiling:`: the first one, then at most
//!   one line per minute. Credentials never appear in logs, errors or `Debug` output.
//!
//! # HTTP client
//!
//! Everything but the counters, the profile type and the settings
//! ([`PyroscopeConfig`], which the environment reader builds in every build) needs the
//! `pyroscope` cargo feature (default-on); without it, setup refuses a Pyroscope server
//! naming that feature.
//!
//! [`reqwest`]'s blocking client, created, used and dropped on the uploader thread only, so
//! the exporter works the same inside or outside an async runtime. TLS is rustls with the
//! aws-lc-rs provider (reqwest's `rustls` feature); certificates are checked with the
//! platform's verifier.

// The push client is the only part behind the feature: the counters and the settings stay,
// so `HealthStats` and `EnvConfig` are the same types in every build. The queue, the
// uploader thread and the settings they use are shared with the OTLP profiles exporter
// ([`crate::export::otlp_profiles`]), so they build with either feature.
// Without `pyroscope`, only the parts the OTLP profiles exporter shares are used.
#[cfg_attr(not(feature = "pyroscope"), allow(dead_code))]
mod config;
mod error;
#[cfg(feature = "pyroscope")]
mod exporter;
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
pub(crate) mod pipeline;
// `pub` items, reachable only through `crate::test_support` (feature `test-support`).
#[cfg(feature = "pyroscope")]
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub(crate) mod proto;
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
mod queue;
mod stats;
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
pub(crate) mod uploader;

pub(crate) use config::is_secret_header;
pub use config::{
    PyroscopeAuth, PyroscopeBackoff, PyroscopeConfig, PyroscopeLimits, MAX_LABEL_NAMES,
    MAX_LABEL_VALUE_BYTES,
};
#[cfg(any(feature = "pyroscope", feature = "otlp-http"))]
pub use error::HttpClientError;
pub use error::PyroscopeError;
#[cfg(feature = "pyroscope")]
pub use exporter::{PyroscopeExporter, UPLOADER_THREAD_NAME};
pub use stats::{PyroscopeSnapshot, PyroscopeStats};

/// Value of the `__name__` series label: the profile type's name.
pub const PROFILE_NAME: &str = "process_cpu";

/// The Pyroscope profile type id of the profiles this crate pushes (`__name__`, sample type
/// and period type): what Grafana's `tracesToProfiles.profileTypeId` must be.
pub const PROFILE_TYPE_ID: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Value of the `__name__` series label of blocked-in-poll profiles
/// ([`ProfileKind::Blocked`](crate::collector::ProfileKind::Blocked)): the name of Go's
/// block profile, whose shape they take (sample types `contentions`/`count` and
/// `delay`/`nanoseconds`, period type `contentions`/`count`), so Grafana lists them as
/// "block" with its known units. See `docs/blocked-in-poll.md`.
pub const BLOCK_PROFILE_NAME: &str = "block";

/// Value of the `__name__` series label of allocation profiles
/// ([`ProfileKind::Alloc`](crate::collector::ProfileKind::Alloc)): the name of Go's heap
/// profile, whose allocation sample types they carry (`alloc_objects`/`count`,
/// `alloc_space`/`bytes`, period type `space`/`bytes`; with in-use tracking on,
/// `inuse_objects`/`count` and `inuse_space`/`bytes` too, a snapshot at the profile's
/// end). Pushed with `__delta__="false"`:
/// Pyroscope's ingester otherwise takes `memory` allocation series as cumulative and
/// subtracts each profile from the next (`pkg/pprof` in its source: the delta only a
/// series without that label gets). Span selection (`span_id`) works for every type
/// alike. See `docs/allocations.md`.
pub const ALLOC_PROFILE_NAME: &str = "memory";

/// The profile type id of the bytes allocated.
pub const ALLOC_SPACE_PROFILE_TYPE_ID: &str = "memory:alloc_space:bytes:space:bytes";

/// The profile type id of the allocations made.
pub const ALLOC_OBJECTS_PROFILE_TYPE_ID: &str = "memory:alloc_objects:count:space:bytes";

/// The profile type id of the bytes still held (in-use tracking on: see
/// [`ProfilerBuilder::allocation_inuse`](crate::ProfilerBuilder::allocation_inuse)).
pub const INUSE_SPACE_PROFILE_TYPE_ID: &str = "memory:inuse_space:bytes:space:bytes";

/// The profile type id of the allocations still held (in-use tracking on).
pub const INUSE_OBJECTS_PROFILE_TYPE_ID: &str = "memory:inuse_objects:count:space:bytes";

/// The profile type id of the blocked time (wall nanoseconds blocked inside a poll).
pub const BLOCK_DELAY_PROFILE_TYPE_ID: &str = "block:delay:nanoseconds:contentions:count";

/// The profile type id of the number of blocks seen.
pub const BLOCK_CONTENTIONS_PROFILE_TYPE_ID: &str = "block:contentions:count:contentions:count";
