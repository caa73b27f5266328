//! The `axum` feature: tower-http's `TraceLayer` from `otel_profiling::axum::trace_layer()`
//! names each request's root span after its route, for the exported span and for the
//! label CPU samples get, and records the route and status.
#![cfg(feature = "axum")]

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use otel_profiling::{current_local_root, ProfileIdSpanProcessor, ProfilingLayer};
use tower::ServiceExt;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

/// The label a CPU sample taken in the handler would carry.
type Labels = Arc<Mutex<Vec<String>>>;

fn label_here(labels: &Labels) {
    let name = current_local_root()
        .and_then(|root| root.name())
        .map_or_else(|| "<no span>".to_owned(), |n| n.resolve().to_string());
    labels.lock().expect("labels").push(name);
}

fn app(labels: Labels) -> Router {
    let (items, failing) = (labels.clone(), labels);
    Router::new()
        .route(
            "/items/{id}",
            get(move || async move {
                label_here(&items);
                "item"
            }),
        )
        .route(
            "/fail",
            get(move || async move {
                label_here(&failing);
                StatusCode::INTERNAL_SERVER_ERROR
            }),
        )
        .layer(otel_profiling::axum::trace_layer())
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

#[tokio::test]
async fn root_spans_are_named_after_the_route_for_traces_and_profiles() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("axum-test")))
        .with(ProfilingLayer::default());
    let labels = Labels::default();
    let app = app(labels.clone());
    let statuses = async {
        let mut statuses = Vec::new();
        for uri in ["/items/42", "/items/7", "/fail", "/no/such/route"] {
            let request = Request::get(uri).body(Body::empty()).expect("request");
            let response = app.clone().oneshot(request).await.expect("infallible");
            statuses.push(response.status().as_u16());
        }
        statuses
    }
    .with_subscriber(subscriber)
    .await;
    assert_eq!(statuses, [200, 200, 500, 404]);

    // Samples in the handlers are labelled with the route, never the raw path.
    assert_eq!(
        *labels.lock().expect("labels"),
        ["GET /items/{id}", "GET /items/{id}", "GET /fail"]
    );

    let spans = exporter.get_finished_spans().expect("spans");
    let summary: Vec<(String, Option<String>, Option<i64>, String)> = spans
        .iter()
        .map(|s| {
            (
                s.name.to_string(),
                attribute(s, "http.route").map(|v| v.as_str().into_owned()),
                attribute(s, "http.response.status_code").and_then(|v| match v {
                    Value::I64(code) => Some(*code),
                    _ => None,
                }),
                attribute(s, "url.path").map_or_else(String::new, |v| v.as_str().into_owned()),
            )
        })
        .collect();
    let row = |name: &str, route: Option<&str>, status, path: &str| {
        (
            name.to_owned(),
            route.map(str::to_owned),
            Some(status),
            path.to_owned(),
        )
    };
    assert_eq!(
        summary,
        [
            row("GET /items/{id}", Some("/items/{id}"), 200, "/items/42"),
            row("GET /items/{id}", Some("/items/{id}"), 200, "/items/7"),
            row("GET /fail", Some("/fail"), 500, "/fail"),
            // The fallback: no route, so the method alone (bounded cardinality).
            row("GET", None, 404, "/no/such/route"),
        ]
    );
    for span in &spans {
        assert_eq!(span.span_kind, SpanKind::Server, "{}", span.name);
        assert_eq!(
            attribute(span, "http.request.method").map(|v| v.as_str().into_owned()),
            Some("GET".to_owned())
        );
        // Local roots: the profile link is set on them.
        assert!(
            attribute(span, otel_profiling::PROFILE_ID_ATTRIBUTE).is_some(),
            "{}",
            span.name
        );
    }
    // A 5xx is the server span's error; a 404 is not.
    assert!(matches!(spans[2].status, Status::Error { .. }), "{spans:?}");
    assert!(!matches!(spans[3].status, Status::Error { .. }));
}
