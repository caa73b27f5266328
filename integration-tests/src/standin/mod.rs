//! An in-process **stand-in for Tempo and Pyroscope, for tests — not a backend**.
//!
//! It speaks the same HTTP protocols as the real services, so the clients in
//! [`crate::clients`] and the bridge's exporters cannot tell the difference for what the
//! checklist needs:
//!
//! * OTLP/HTTP ingest: `POST /v1/traces` (protobuf `ExportTraceServiceRequest`);
//! * Tempo's trace APIs: `GET /api/traces/<trace id hex>` → OTLP JSON `{"batches": [...]}`,
//!   and `GET /api/v2/traces/<id>` → `{"trace": {"resourceSpans": [...]}}`
//!   (ids base64-encoded, as Tempo's protobuf JSON marshalling writes them), 404 when unknown,
//!   400 for a malformed id;
//! * Pyroscope's push: `POST /push.v1.PusherService/Push` (Connect unary, protobuf, optionally
//!   `Content-Encoding: gzip`), with Pyroscope's ingest limits ([`Limits`], defaults of
//!   Pyroscope v2.2.1, lowerable per test), its 429 rate limiter, its per-series label
//!   validation and its rules for the `span_id` / `trace_id` sample labels (see the
//!   `pyroscope` module for the order of the checks); refusals are counted per reason
//!   ([`StandIn::push_counters`]);
//! * Pyroscope's OTLP profiles intake: `POST /v1development/profiles` (protobuf
//!   `ExportProfilesServiceRequest`, optionally gzipped), converted as Pyroscope does
//!   (links → `span_id`/`trace_id`, `service.name` → `service_name`, `process_cpu` from
//!   `samples`/`count` over `cpu`/`nanoseconds`; see the `otlp_profiles` module) into the
//!   same store the push feeds, under the same limits; the same over OTLP/gRPC
//!   (`ProfilesService/Export`, h2c on the same port, as Pyroscope serves it), a refusal
//!   answered with the gRPC code Pyroscope gives (`InvalidArgument`, `ResourceExhausted`
//!   for its 429, `Internal`);
//! * Tempo's OTLP/gRPC intake: `TraceService/Export` (h2c on the same port, gzip accepted);
//! * Tempo's TraceQL search: `GET /api/search?q=&start=&end=&limit=&spss=` answering
//!   Tempo v3's shape (`traces[].spanSets[]`, `metrics.inspectedTraces`) for the subset of
//!   TraceQL in the `traceql` module (one spanset filter of `&&`-joined comparisons, an
//!   optional `| select(...)`); anything else is a plain-text 400 starting `the stand-in
//!   supports only`;
//! * Tempo's TraceQL metrics: `GET /api/metrics/query_range?q=&start=&end=&step=` for
//!   `<spanset filter> | quantile_over_time(duration, <q>, ...) [by (<attr>)]` only (the
//!   filter as the search takes it), answering Tempo v3's `QueryRangeResponse` JSON
//!   (`series[].labels` with `p` and the `by` attribute, `samples[]` of bucket start and
//!   seconds, every step of the window present and those without spans lacking `value`,
//!   `promLabels`, `metrics.inspectedSpans`); quantiles estimated as Tempo 3 does, from
//!   log2 duration buckets (approximate within a factor of two, as Tempo's are); `step`
//!   defaults to `(end - start) / 100` (at least
//!   1 s), at most 1000 buckets; any other metrics query is a plain-text 400 starting `the
//!   stand-in supports only`;
//! * Pyroscope's querier (Connect unary, JSON; int64 accepted as strings or numbers,
//!   answered as strings; a bad request is a Connect `invalid_argument`):
//!   * `POST /querier.v1.QuerierService/SelectMergeSpanProfile`: the samples of some span
//!     ids merged into Pyroscope's flame graph shape;
//!   * `POST /querier.v1.QuerierService/SelectMergeStacktraces`: every sample of a profile
//!     type, selector and time range, whichever span, in the same shape (both honour
//!     `maxNodes`, Pyroscope's default 8192, the rest folded into `other` nodes);
//!   * `POST /querier.v1.QuerierService/LabelValues`: the values of a series label or of
//!     `__profile_type__`;
//!   * `POST /querier.v1.QuerierService/ProfileTypes`: the stored profile types.
//!
//! Everything is kept in memory; nothing is compacted, downsampled or persisted. It binds
//! `127.0.0.1:0` ([`StandIn::start`]) or a given port ([`StandIn::start_on`], the
//! `otel-profiling-standin` binary) and stops when dropped.

mod limits;
mod otlp_profiles;
mod pyroscope;
mod selector;
mod tempo;
mod traceql;
mod validate;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use limits::{Limits, PushCounters, Reason};
pub use pyroscope::{
    connect_error, PyroscopeStore, StoredSample, DEFAULT_MAX_NODES, MAX_MAX_NODES,
};
pub use selector::{parse_selector, MatchOp, Matcher};
pub use tempo::{
    MetricsRequest, SearchRequest, TempoStore, DEFAULT_SEARCH_LIMIT, DEFAULT_SPANS_PER_SET,
    MAX_METRICS_BUCKETS, MAX_SEARCH_LIMIT, MAX_SPANS_PER_SET,
};
pub use traceql::{
    parse_metrics_query, parse_traceql, Attribute, CompareOp, Condition, Literal, MetricsQuery,
    TraceQuery,
};
pub use validate::PushRejection;

/// Shared state of the stand-in.
struct Stores {
    tempo: Mutex<TempoStore>,
    pyroscope: Mutex<PyroscopeStore>,
    /// Intake requests that arrived gzipped, and plain (HTTP `Content-Encoding`, gRPC
    /// `grpc-encoding`).
    encodings: [std::sync::atomic::AtomicUsize; 2],
}

impl Stores {
    fn note_encoding(&self, gzip: bool) {
        self.encodings[usize::from(!gzip)].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Whether `headers` say gzip under `name`.
fn says_gzip(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("gzip"))
}

/// A running stand-in (Tempo + OTLP receiver + Pyroscope on one loopback port).
pub struct StandIn {
    addr: SocketAddr,
    stores: Arc<Stores>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandIn").field("addr", &self.addr).finish()
    }
}

impl StandIn {
    /// Starts the stand-in on `127.0.0.1:0` with Pyroscope's default limits.
    pub fn start() -> std::io::Result<StandIn> {
        StandIn::start_with_limits(Limits::default())
    }

    /// Starts the stand-in on `127.0.0.1:0`; its Pyroscope push enforces `limits`.
    pub fn start_with_limits(limits: Limits) -> std::io::Result<StandIn> {
        StandIn::start_on(0, limits)
    }

    /// Starts the stand-in on `127.0.0.1:port` (0: any free port); its Pyroscope push
    /// enforces `limits`. A bind failure keeps its [`std::io::ErrorKind`] (e.g.
    /// `AddrInUse`) and names the address.
    pub fn start_on(port: u16, limits: Limits) -> std::io::Result<StandIn> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot listen on 127.0.0.1:{port}: {e}"))
        })?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stores = Arc::new(Stores {
            tempo: Mutex::default(),
            pyroscope: Mutex::new(PyroscopeStore::with_limits(limits)),
            encodings: Default::default(),
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("standin")
            .enable_io()
            .build()?;
        let app = Router::new()
            .route("/v1/traces", post(otlp_traces))
            .route("/api/traces/{id}", get(tempo_trace))
            .route("/api/v2/traces/{id}", get(tempo_trace_v2))
            .route("/api/search", get(tempo_search))
            .route("/api/metrics/query_range", get(tempo_query_range))
            .route("/push.v1.PusherService/Push", post(pyroscope_push))
            .route("/v1development/profiles", post(pyroscope_otlp_profiles))
            .route_service(
                "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
                opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::ProfilesServiceServer::new(
                    GrpcProfiles(stores.clone()),
                )
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
            )
            .route_service(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer::new(
                    GrpcTraces(stores.clone()),
                )
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
            )
            .route(
                "/querier.v1.QuerierService/SelectMergeSpanProfile",
                post(|State(s): State<Arc<Stores>>, body: Bytes| async move {
                    pyroscope_query(&s, &body, PyroscopeStore::select_merge_span_profile)
                }),
            )
            .route(
                "/querier.v1.QuerierService/SelectMergeStacktraces",
                post(|State(s): State<Arc<Stores>>, body: Bytes| async move {
                    pyroscope_query(&s, &body, PyroscopeStore::select_merge_stacktraces)
                }),
            )
            .route(
                "/querier.v1.QuerierService/LabelValues",
                post(|State(s): State<Arc<Stores>>, body: Bytes| async move {
                    pyroscope_query(&s, &body, PyroscopeStore::label_values)
                }),
            )
            .route(
                "/querier.v1.QuerierService/ProfileTypes",
                post(|State(s): State<Arc<Stores>>, body: Bytes| async move {
                    pyroscope_query(&s, &body, PyroscopeStore::profile_types)
                }),
            )
            .route("/ready", get(|| async { "ready" }))
            .with_state(stores.clone());
        let thread = std::thread::Builder::new()
            .name("standin-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("stand-in: {e}");
                            return;
                        }
                    };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = rx.await;
                        })
                        .await;
                });
            })?;
        Ok(StandIn {
            addr,
            stores,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`: the Tempo API, the OTLP/HTTP endpoint and Pyroscope.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The port it listens on (the one chosen when started on port 0).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many intake requests (traces, pushes, OTLP profiles; HTTP and gRPC) arrived
    /// gzipped, and how many plain.
    pub fn request_encodings(&self) -> (usize, usize) {
        let [gzip, plain] = &self.stores.encodings;
        (
            gzip.load(std::sync::atomic::Ordering::SeqCst),
            plain.load(std::sync::atomic::Ordering::SeqCst),
        )
    }

    /// Number of spans received over OTLP.
    pub fn span_count(&self) -> usize {
        self.stores
            .tempo
            .lock()
            .map(|t| t.span_count())
            .unwrap_or(0)
    }

    /// Number of profile samples accepted by the push endpoint.
    pub fn sample_count(&self) -> usize {
        self.stores
            .pyroscope
            .lock()
            .map(|p| p.samples().len())
            .unwrap_or(0)
    }

    /// Replaces the push limits (the rate limiter restarts with a full bucket).
    pub fn set_limits(&self, limits: Limits) {
        if let Ok(mut p) = self.stores.pyroscope.lock() {
            p.set_limits(limits);
        }
    }

    /// The push limits in force.
    pub fn limits(&self) -> Limits {
        self.stores
            .pyroscope
            .lock()
            .map(|p| p.limits().clone())
            .unwrap_or_default()
    }

    /// Profiles accepted, refused per [`Reason`], and span/trace ids stored as 0 (a copy).
    pub fn push_counters(&self) -> PushCounters {
        self.stores
            .pyroscope
            .lock()
            .map(|p| p.counters().clone())
            .unwrap_or_default()
    }

    /// Stored profile samples (copies), for assertions on the stored shape.
    pub fn samples(&self) -> Vec<StoredSample> {
        self.stores
            .pyroscope
            .lock()
            .map(|p| p.samples().to_vec())
            .unwrap_or_default()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Decompresses the body per `Content-Encoding` (identity or gzip).
fn body_bytes(headers: &HeaderMap, body: &Bytes) -> Result<Vec<u8>, String> {
    let encoding = headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "" | "identity" => Ok(body.to_vec()),
        "gzip" => {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(&body[..])
                .read_to_end(&mut out)
                .map_err(|e| format!("bad gzip body: {e}"))?;
            Ok(out)
        }
        other => Err(format!("unsupported content-encoding {other:?}")),
    }
}

async fn otlp_traces(
    State(stores): State<Arc<Stores>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let raw = match body_bytes(&headers, &body) {
        Ok(raw) => {
            stores.note_encoding(says_gzip(&headers, "content-encoding"));
            raw
        }
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let mut tempo = match stores.tempo.lock() {
        Ok(t) => t,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    match tempo.ingest_protobuf(&raw) {
        // An empty ExportTraceServiceResponse (no partial success).
        Ok(()) => (
            StatusCode::OK,
            [("content-type", "application/x-protobuf")],
            Vec::<u8>::new(),
        )
            .into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

async fn tempo_trace(State(stores): State<Arc<Stores>>, Path(id): Path<String>) -> Response {
    trace_answer(&stores, &id, |batches| batches)
}

/// Tempo v2's trace API: the v1 answer's batches as `{"trace": {"resourceSpans": [...]},
/// "metrics": {"inspectedBytes": "<n>"}}` (the stand-in's bytes: the spans' JSON).
async fn tempo_trace_v2(State(stores): State<Arc<Stores>>, Path(id): Path<String>) -> Response {
    trace_answer(&stores, &id, |v1| {
        let bytes = v1["batches"].to_string().len();
        serde_json::json!({
            "trace": { "resourceSpans": v1["batches"] },
            "metrics": { "inspectedBytes": bytes.to_string() },
        })
    })
}

fn trace_answer(
    stores: &Stores,
    id: &str,
    shape: impl FnOnce(serde_json::Value) -> serde_json::Value,
) -> Response {
    let tempo = match stores.tempo.lock() {
        Ok(t) => t,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    match tempo.trace_json(id).map(|found| found.map(shape)) {
        Ok(Some(json)) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            json.to_string(),
        )
            .into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "trace not found").into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

async fn pyroscope_push(
    State(stores): State<Arc<Stores>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let raw = match body_bytes(&headers, &body) {
        Ok(raw) => {
            stores.note_encoding(says_gzip(&headers, "content-encoding"));
            raw
        }
        Err(e) => return connect_error(StatusCode::BAD_REQUEST, "invalid_argument", &e),
    };
    let mut store = match stores.pyroscope.lock() {
        Ok(s) => s,
        Err(_) => return connect_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "poisoned"),
    };
    match store.push_protobuf(&raw) {
        Ok(()) => (
            StatusCode::OK,
            [("content-type", "application/proto")],
            Vec::<u8>::new(),
        )
            .into_response(),
        Err(e) => connect_error(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            e.code,
            &e.message,
        ),
    }
}

/// Pyroscope's OTLP/gRPC profiles intake.
struct GrpcProfiles(Arc<Stores>);

/// Tempo's OTLP/gRPC intake (`TraceService/Export`, h2c on the same port, gzip accepted).
struct GrpcTraces(Arc<Stores>);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for GrpcTraces
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        use prost::Message;
        self.0
            .note_encoding(says_gzip(request.metadata().as_ref(), "grpc-encoding"));
        let raw = request.into_inner().encode_to_vec();
        let mut tempo = self
            .0
            .tempo
            .lock()
            .map_err(|_| tonic::Status::internal("poisoned"))?;
        tempo
            .ingest_protobuf(&raw)
            .map_err(tonic::Status::invalid_argument)?;
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_server::ProfilesService
    for GrpcProfiles
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceResponse,
        >,
        tonic::Status,
    > {
        self.0
            .note_encoding(says_gzip(request.metadata().as_ref(), "grpc-encoding"));
        let request = request.into_inner();
        let mut store = self
            .0
            .pyroscope
            .lock()
            .map_err(|_| tonic::Status::internal("poisoned"))?;
        match store.push_otlp_request(&request) {
            Ok(()) => Ok(tonic::Response::new(Default::default())),
            Err(e) => Err(match e.status {
                400 => tonic::Status::invalid_argument(e.message),
                429 => tonic::Status::resource_exhausted(e.message),
                _ => tonic::Status::internal(e.message),
            }),
        }
    }
}

/// Pyroscope's OTLP/HTTP profiles intake: 200 with an empty `ExportProfilesServiceResponse`,
/// else the status Pyroscope's handler gives (400 invalid, 429 over the ingestion limit,
/// 500 otherwise) with the message as text.
async fn pyroscope_otlp_profiles(
    State(stores): State<Arc<Stores>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |status: StatusCode, message: String| {
        (
            status,
            [("content-type", "text/plain; charset=utf-8")],
            message,
        )
            .into_response()
    };
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type != "application/x-protobuf" && content_type != "application/protobuf" {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Unsupported Content-Type: {content_type}"),
        );
    }
    let raw = match body_bytes(&headers, &body) {
        Ok(raw) => {
            stores.note_encoding(says_gzip(&headers, "content-encoding"));
            raw
        }
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let mut store = match stores.pyroscope.lock() {
        Ok(s) => s,
        Err(_) => return text(StatusCode::INTERNAL_SERVER_ERROR, "poisoned".into()),
    };
    match store.push_otlp(&raw) {
        // An empty ExportProfilesServiceResponse encodes as no bytes.
        Ok(()) => (
            StatusCode::OK,
            [("content-type", "application/x-protobuf")],
            Vec::<u8>::new(),
        )
            .into_response(),
        Err(e) => text(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            e.message,
        ),
    }
}

/// Tempo's `GET /api/search`: a malformed or unsupported request is a plain-text 400, as
/// Tempo answers a bad query.
async fn tempo_search(State(stores): State<Arc<Stores>>, uri: Uri) -> Response {
    tempo_query(&stores, &uri, SearchRequest::from_query_string, |t, r| {
        t.search(r)
    })
}

/// Tempo's `GET /api/metrics/query_range`: a malformed or unsupported request is a
/// plain-text 400, as for the search.
async fn tempo_query_range(State(stores): State<Arc<Stores>>, uri: Uri) -> Response {
    tempo_query(&stores, &uri, MetricsRequest::from_query_string, |t, r| {
        t.query_range(r)
    })
}

/// A Tempo query API call: the query string parsed by `parse` (its error a plain-text
/// 400), answered by `answer` as JSON.
fn tempo_query<R>(
    stores: &Stores,
    uri: &Uri,
    parse: fn(&str) -> Result<R, String>,
    answer: fn(&TempoStore, &R) -> serde_json::Value,
) -> Response {
    let request = match parse(uri.query().unwrap_or("")) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let tempo = match stores.tempo.lock() {
        Ok(t) => t,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        answer(&tempo, &request).to_string(),
    )
        .into_response()
}

/// A Pyroscope querier call (Connect unary, JSON): the body parsed (an empty one is `{}`,
/// as Connect sends a message without fields), answered by `call` on the store; a bad
/// request is a Connect `invalid_argument`.
fn pyroscope_query(
    stores: &Stores,
    body: &Bytes,
    call: fn(&PyroscopeStore, &serde_json::Value) -> Result<serde_json::Value, String>,
) -> Response {
    let request: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return connect_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    &format!("bad JSON request: {e}"),
                )
            }
        }
    };
    let store = match stores.pyroscope.lock() {
        Ok(s) => s,
        Err(_) => return connect_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "poisoned"),
    };
    match call(&store, &request) {
        Ok(json) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            json.to_string(),
        )
            .into_response(),
        Err(message) => connect_error(StatusCode::BAD_REQUEST, "invalid_argument", &message),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use otel_profiling::pprof::{self, FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};

    use super::*;
    use crate::clients::PushClient;

    fn gz_profile(samples: u64) -> Vec<u8> {
        let mut b = ProfileBuilder::new(
            10_000_000,
            SystemTime::now(),
            std::time::Duration::from_secs(1),
        );
        for i in 0..samples {
            let frame = SymbolizedFrame {
                address: 0x1000 + i,
                lines: vec![FrameLine {
                    function: format!("f{i}").into(),
                    file: None,
                    line: None,
                }],
            };
            b.add_sample(&[frame], &SampleLabels::default(), 1);
        }
        pprof::encode_gzip(&b.build()).expect("encode")
    }

    #[test]
    fn refusals_reach_the_wire_as_pyroscopes_connect_errors() {
        // Room in the bucket for one 5-sample profile (labels + inflated pprof), then none:
        // the 6-sample one is charged too, since the limiter runs before validation.
        let cost = |n| {
            let p = otel_profiling_pprof::decode(&gz_profile(n)).expect("decode");
            ("__name__process_cpuservice_namesvc".len() + prost::Message::encoded_len(&p)) as u64
        };
        let limits = Limits::default()
            .with_max_profile_samples(5)
            .with_ingestion_rate(1.0, cost(6) + cost(5));
        let standin = StandIn::start_with_limits(limits).expect("stand-in starts");
        let client = PushClient::new(&standin.url());
        let labels = [("__name__", "process_cpu"), ("service_name", "svc")];

        let e = client
            .push(&labels, &gz_profile(6))
            .expect_err("6 > 5 samples");
        assert_eq!(
            (e.status, e.code.as_str()),
            (400, "invalid_argument"),
            "{e:?}"
        );
        assert!(
            e.message.contains("max_profile_stacktrace_samples"),
            "{e:?}"
        );

        client
            .push(&labels, &gz_profile(5))
            .expect("5 samples pass");
        let e = client
            .push(&labels, &gz_profile(5))
            .expect_err("rate limited");
        assert_eq!(
            (e.status, e.code.as_str()),
            (429, "resource_exhausted"),
            "{e:?}"
        );

        let c = standin.push_counters();
        assert_eq!(c.accepted_profiles, 1);
        assert_eq!(c.rejected(Reason::SamplesLimit), 1);
        assert_eq!(c.rejected(Reason::RateLimited), 1);
        assert_eq!(standin.sample_count(), 5);

        // Raised again at run time: the bucket starts full.
        standin.set_limits(Limits::default());
        client
            .push(&labels, &gz_profile(6))
            .expect("defaults accept it");
        assert_eq!(standin.limits(), Limits::default());
    }

    #[test]
    fn the_query_routes_answer_and_refuse_as_the_services_do() {
        let standin = StandIn::start().expect("stand-in starts");
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let post = |call: &str, body: &str| {
            let r = http
                .post(format!(
                    "{}/querier.v1.QuerierService/{call}",
                    standin.url()
                ))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .expect("POST");
            let status = r.status().as_u16();
            let json: serde_json::Value =
                serde_json::from_str(&r.text().expect("body")).expect("JSON");
            (status, json)
        };
        assert_eq!(
            post("ProfileTypes", ""),
            (200, serde_json::json!({"profileTypes": []}))
        );
        assert_eq!(
            post(
                "LabelValues",
                r#"{"name":"service_name","matchers":["{}"]}"#
            ),
            (200, serde_json::json!({"names": []}))
        );
        let (status, json) = post(
            "SelectMergeStacktraces",
            r#"{"profileTypeID":"a:b:c:d:e","labelSelector":"{}","start":"0","end":1}"#,
        );
        assert_eq!(
            (status, &json["flamegraph"]["total"]),
            (200, &serde_json::json!("0"))
        );
        let (status, json) = post("LabelValues", "{}");
        assert_eq!(
            (status, &json["code"]),
            (400, &serde_json::json!("invalid_argument"))
        );
        let (status, _) = post("SelectMergeStacktraces", "not json");
        assert_eq!(status, 400);

        let r = http
            .get(format!(
                "{}/api/search?q=%7Bname%3D%22a%22%20%7C%7C%20name%3D%22b%22%7D",
                standin.url()
            ))
            .send()
            .expect("GET");
        assert_eq!(r.status().as_u16(), 400);
        assert!(r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/plain")));
        let text = r.text().expect("body");
        assert!(
            text.starts_with("the stand-in supports only") && text.contains("`||`"),
            "{text}"
        );
        let r = http
            .get(format!("{}/api/search", standin.url()))
            .send()
            .expect("GET");
        assert_eq!(r.status().as_u16(), 200);
        let json: serde_json::Value = serde_json::from_str(&r.text().expect("body")).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"traces": [], "metrics": {"inspectedTraces": 0}})
        );
    }

    /// Every key path (`traces[].spanSet.spans[].durationNanos`) of `json`, and the JSON
    /// type at it.
    fn key_paths(json: &serde_json::Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
        use serde_json::Value;
        match json {
            Value::Object(map) => {
                for (k, v) in map {
                    key_paths(v, &format!("{at}.{k}"), out);
                }
            }
            Value::Array(items) => items
                .iter()
                .for_each(|v| key_paths(v, &format!("{at}[]"), out)),
            Value::String(_) => drop(out.insert(format!("{at}: string"))),
            Value::Number(_) => drop(out.insert(format!("{at}: number"))),
            Value::Bool(_) => drop(out.insert(format!("{at}: bool"))),
            Value::Null => drop(out.insert(format!("{at}: null"))),
        }
    }

    /// The stand-in answers the queries investigate makes with the keys, nesting and value
    /// types a real Tempo 3.0.3 answered them with (its captured answers, in
    /// `query/tests/data/tempo-3.0.3/`), for the same kind of spans.
    #[test]
    fn answers_have_the_shape_of_a_real_tempo_3s() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{
            any_value, AnyValue, InstrumentationScope, KeyValue,
        };
        use opentelemetry_proto::tonic::resource::v1::Resource;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

        let captured = |name: &str| -> serde_json::Value {
            let path = format!(
                "{}/../query/tests/data/tempo-3.0.3/{name}",
                env!("CARGO_MANIFEST_DIR")
            );
            serde_json::from_str(&std::fs::read_to_string(&path).expect("captured answer"))
                .expect("JSON")
        };
        let paths = |json: &serde_json::Value| {
            let mut out = std::collections::BTreeSet::new();
            key_paths(json, "", &mut out);
            out
        };
        let standin = StandIn::start().expect("stand-in starts");
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let kv = |key: &str, value: &str| KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            ..KeyValue::default()
        };
        let now_s = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        // The demo's kind of root span, as the captured answers were of.
        let span = Span {
            trace_id: vec![
                0, 0x8b, 0x2e, 0xa3, 0xe5, 0xbf, 0, 0xaa, 0x94, 0xeb, 0xed, 0xcc, 0x97, 0x15, 0xb8,
                0x53,
            ],
            span_id: vec![0x17, 0x18, 0xa1, 0xf2, 0x50, 0xda, 0x11, 0x39],
            name: "GET /report".into(),
            kind: 2,
            start_time_unix_nano: (now_s - 100) * 1_000_000_000,
            end_time_unix_nano: (now_s - 100) * 1_000_000_000 + 687_607_017,
            attributes: vec![
                kv("code.module.name", "otel_profiling_examples::service"),
                kv("pyroscope.profile.id", "1718a1f250da1139"),
                KeyValue {
                    key: "thread.id".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::IntValue(10)),
                    }),
                    ..KeyValue::default()
                },
            ],
            ..Span::default()
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        kv("service.version", "1.5.0"),
                        kv("service.name", "report-service"),
                    ],
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "otel-profiling".into(),
                        ..InstrumentationScope::default()
                    }),
                    spans: vec![span],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        let r = http
            .post(format!("{}/v1/traces", standin.url()))
            .header("content-type", "application/x-protobuf")
            .body(prost::Message::encode_to_vec(&request))
            .send()
            .expect("POST");
        assert_eq!(r.status().as_u16(), 200);
        let get = |path_and_query: &str| -> serde_json::Value {
            let r = http
                .get(format!("{}{path_and_query}", standin.url()))
                .send()
                .expect("GET");
            assert_eq!(r.status().as_u16(), 200, "{path_and_query}");
            serde_json::from_str(&r.text().expect("body")).expect("JSON")
        };
        let window = format!("start={}&end={}", now_s - 3600, now_s + 60);
        let search = get(&format!(
            "/api/search?q=%7B+resource.service.name+%3D+%22report-service%22+%26%26+name+%3D+\
             %22GET+%2Freport%22+%7D+%7C+select(resource.service.version)&limit=3&{window}"
        ));
        let trace_v1 = get("/api/traces/008b2ea3e5bf00aa94ebedcc9715b853");
        let trace_v2 = get("/api/v2/traces/008b2ea3e5bf00aa94ebedcc9715b853");
        let metrics = get(&format!(
            "/api/metrics/query_range?q=%7B+name+%3D+%22GET+%2Freport%22+%7D+%7C+\
             quantile_over_time(duration%2C+.5%2C+.95)+by+(resource.service.version)\
             &step=60s&{window}"
        ));
        for (name, ours, skip) in [
            // Tempo's search metrics count jobs and bytes the stand-in has none of.
            ("search-select.json", &search, ".metrics."),
            ("trace-v1.json", &trace_v1, "\u{0}"),
            ("trace-v2.json", &trace_v2, "\u{0}"),
            ("query-range-quantiles.json", &metrics, ".metrics"),
        ] {
            let theirs: std::collections::BTreeSet<String> = paths(&captured(name))
                .into_iter()
                .filter(|p| !p.starts_with(skip))
                .collect();
            let ours = paths(ours);
            let missing: Vec<&String> = theirs.difference(&ours).collect();
            assert!(
                missing.is_empty(),
                "{name}: the stand-in lacks {missing:#?}\nit answers {ours:#?}"
            );
        }
    }

    #[test]
    fn query_range_answers_tempos_shape_over_http() {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
        use opentelemetry_proto::tonic::resource::v1::Resource;
        use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

        const S: u64 = 1_000_000_000;
        let standin = StandIn::start().expect("stand-in starts");
        let http = reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let kv = |key: &str, value: &str| KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            ..KeyValue::default()
        };
        // Spans of 1.25 s and 0.25 s at 1000 s and 1010 s, and one at 1070 s of 2 s.
        let spans = [(1, 1_000, 1_250), (2, 1_010, 250), (3, 1_070, 2_000)]
            .map(|(id, start_s, ms)| Span {
                trace_id: vec![7; 16],
                span_id: vec![0, 0, 0, 0, 0, 0, 0, id],
                name: "GET /x".into(),
                start_time_unix_nano: start_s * S,
                end_time_unix_nano: start_s * S + ms * 1_000_000,
                ..Span::default()
            })
            .to_vec();
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "api"), kv("service.version", "1.5.0")],
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        let r = http
            .post(format!("{}/v1/traces", standin.url()))
            .header("content-type", "application/x-protobuf")
            .body(prost::Message::encode_to_vec(&request))
            .send()
            .expect("POST");
        assert_eq!(r.status().as_u16(), 200);

        let get = |query: &str| {
            let r = http
                .get(format!("{}/api/metrics/query_range?{query}", standin.url()))
                .send()
                .expect("GET");
            (r.status().as_u16(), r.text().expect("body"))
        };
        let q = "q=%7B+resource.service.name+%3D+%22api%22+%7D+%7C+quantile_over_time\
                 (duration%2C+0.95)+by+(resource.service.version)";
        let (status, body) = get(&format!("{q}&start=1000&end=1120&step=60s"));
        assert_eq!(status, 200, "{body}");
        let mut json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let exemplars = json["series"][0]
            .as_object_mut()
            .and_then(|s| s.remove("exemplars"));
        assert_eq!(
            exemplars.and_then(|e| e.as_array().map(Vec::len)),
            Some(3),
            "the three spans as exemplars"
        );
        assert_eq!(
            json,
            serde_json::json!({
                "series": [{
                    "labels": [
                        {"key": "resource.service.version", "value": {"stringValue": "1.5.0"}},
                        {"key": "p", "value": {"doubleValue": 0.95}},
                    ],
                    // Tempo's log2 estimates: both 2^31 ns.
                    "samples": [
                        {"timestampMs": "1000000", "value": 2.147483648},
                        {"timestampMs": "1060000", "value": 2.147483648},
                    ],
                    "promLabels": "{p=\"0.95\", resource.service.version=\"1.5.0\"}",
                }],
                "metrics": {"inspectedSpans": "3"},
            })
        );

        for (query, says) in [
            (
                "q=%7B%7D+%7C+rate()&start=1000&end=1120".to_string(),
                "`rate`",
            ),
            ("start=1000&end=1120".to_string(), "q (the TraceQL"),
            (
                format!("{q}&start=1120&end=1000"),
                "start must be before end",
            ),
            (format!("{q}&start=0&end=2000&step=1"), "limit of 1000"),
        ] {
            let (status, body) = get(&query);
            assert_eq!(status, 400, "{query}: {body}");
            assert!(body.contains(says), "{query}: {body}");
        }
    }
}
