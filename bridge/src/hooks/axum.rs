//! axum + tower-http: server spans named after the matched route (feature `axum`).
//!
//! tower-http's default `TraceLayer` names every span `request`, so every endpoint lands
//! in one row of the span report and under one `span_name` label in the profiles. The
//! [`trace_layer`] here names each request's root span `{METHOD} {route}` (e.g.
//! `GET /items/{id}`) as the HTTP semantic conventions ask, from axum's [`MatchedPath`]:
//! that name is both the exported span's name (`otel.name`) and the `span_name` label of
//! the CPU samples taken while it runs.
//!
//! Add it with [`Router::layer`](::axum::Router::layer), not around the router: axum sets
//! `MatchedPath` while routing, so a layer outside the router sees no route and every span
//! is named after the method alone. Requests no route matched (the fallback) are named
//! after the method alone too: never the raw path, which would give one name per id.
//!
//! The spans are `INFO` spans of target `otel_profiling::http`: a global filter (e.g. an
//! `EnvFilter` added with `.with(..)` to the whole registry) must let them through, or
//! they are neither traced nor profiled.
//!
//! ```
//! use axum::{routing::get, Router};
//!
//! let app: Router = Router::new()
//!     .route("/items/{id}", get(|| async { "item" }))
//!     .layer(otel_profiling::axum::trace_layer());
//! ```

use std::time::Duration;

use ::axum::extract::MatchedPath;
use ::axum::http::{Method, Request, Response};
use tower_http::trace::{
    DefaultOnBodyChunk, DefaultOnEos, DefaultOnFailure, DefaultOnRequest, HttpMakeClassifier,
    MakeSpan, OnResponse, TraceLayer,
};
use tracing::field::Empty;
use tracing::Span;

/// The `tracing` target of the spans [`RouteSpan`] makes.
pub const SPAN_TARGET: &str = "otel_profiling::http";

/// tower-http's `TraceLayer` with [`RouteSpan`] and [`RecordStatus`] and its other
/// defaults (server errors are failures).
pub type RouteTraceLayer = TraceLayer<
    HttpMakeClassifier,
    RouteSpan,
    DefaultOnRequest,
    RecordStatus,
    DefaultOnBodyChunk,
    DefaultOnEos,
    DefaultOnFailure,
>;

/// `TraceLayer::new_for_http()` with route-named server spans ([`RouteSpan`]) and the
/// response status recorded on them ([`RecordStatus`]).
pub fn trace_layer() -> RouteTraceLayer {
    TraceLayer::new_for_http()
        .make_span_with(RouteSpan)
        .on_response(RecordStatus)
}

/// A tower-http [`MakeSpan`] for axum: an `INFO` span with `otel.name = "{METHOD} {route}"`,
/// `otel.kind = "server"`, `http.request.method`, `http.route` and `url.path`, and empty
/// `http.response.status_code` and `otel.status_code` for [`RecordStatus`] to fill.
#[derive(Clone, Copy, Debug, Default)]
pub struct RouteSpan;

impl<B> MakeSpan<B> for RouteSpan {
    fn make_span(&mut self, request: &Request<B>) -> Span {
        route_span(request)
    }
}

/// The span [`RouteSpan`] makes, for a hand-written `make_span_with`.
pub fn route_span<B>(request: &Request<B>) -> Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let method = request.method();
    let name = span_name(method, route);
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        "HTTP request",
        otel.name = name.as_str(),
        otel.kind = "server",
        http.request.method = method_attribute(method),
        http.request.method_original = Empty,
        http.route = route,
        url.path = request.uri().path(),
        http.response.status_code = Empty,
        otel.status_code = Empty,
    );
    if method_attribute(method) == OTHER_METHOD {
        // A non-standard method's text, where the conventions keep it.
        span.record("http.request.method_original", method.as_str());
    }
    span
}

/// `{METHOD} {route}`, or `{METHOD}` without a route; a method outside the standard set
/// is `HTTP` (semantic conventions: names stay low-cardinality).
pub fn span_name(method: &Method, route: Option<&str>) -> String {
    let method = match method_attribute(method) {
        OTHER_METHOD => "HTTP",
        known => known,
    };
    match route {
        Some(route) => format!("{method} {route}"),
        None => method.to_owned(),
    }
}

const OTHER_METHOD: &str = "_OTHER";

/// `http.request.method`: one of the methods of RFC 9110 and PATCH, else `_OTHER`.
fn method_attribute(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => OTHER_METHOD,
    }
}

/// A tower-http [`OnResponse`] that records `http.response.status_code` on the span, and
/// `otel.status_code = "ERROR"` for a 5xx (a 4xx is the client's error, not the server
/// span's, per the conventions).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordStatus;

impl<B> OnResponse<B> for RecordStatus {
    fn on_response(self, response: &Response<B>, _latency: Duration, span: &Span) {
        let status = response.status();
        // i64: tracing-opentelemetry exports unsigned integers as text.
        span.record("http.response.status_code", i64::from(status.as_u16()));
        if status.is_server_error() {
            span.record("otel.status_code", "ERROR");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_semantic_conventions() {
        assert_eq!(
            span_name(&Method::GET, Some("/items/{id}")),
            "GET /items/{id}"
        );
        assert_eq!(span_name(&Method::POST, None), "POST");
        let custom = Method::from_bytes(b"PURGE").expect("method");
        assert_eq!(span_name(&custom, Some("/cache")), "HTTP /cache");
        assert_eq!(method_attribute(&custom), "_OTHER");
    }
}
