use super::*;
use crate::LocalRoot;
use crate::{current_local_root, ProfileIdSpanProcessor, PROFILE_ID_ATTRIBUTE};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, Sampler, SdkTracerProvider, SpanData};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Clone, Copy, Debug)]
enum Order {
    OtelFirst,
    ProfilingFirst,
}

struct Setup {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    dispatch: tracing::Dispatch,
}

fn setup(order: Order, sampler: Sampler, layer: ProfilingLayer) -> Setup {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("test");
    let dispatch = match order {
        Order::OtelFirst => tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(tracer))
                .with(layer),
        ),
        Order::ProfilingFirst => tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(layer)
                .with(tracing_opentelemetry::layer().with_tracer(tracer)),
        ),
    };
    Setup {
        exporter,
        _provider: provider,
        dispatch,
    }
}

fn exported(setup: &Setup, name: &str) -> SpanData {
    setup
        .exporter
        .get_finished_spans()
        .expect("spans")
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("span {name} not exported"))
}

fn profile_id(span: &SpanData) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == PROFILE_ID_ATTRIBUTE)
        .map(|kv| kv.value.to_string())
}

fn seen_id() -> Option<String> {
    current_local_root()
        .and_then(|r| r.span_id())
        .map(|id| id.to_string())
}

#[test]
fn nested_spans_carry_the_local_root_in_either_order() {
    for order in [Order::OtelFirst, Order::ProfilingFirst] {
        let setup = setup(order, Sampler::AlwaysOn, ProfilingLayer::default());
        let mut seen = Vec::new();
        tracing::dispatcher::with_default(&setup.dispatch, || {
            let root = tracing::info_span!("root");
            let _r = root.enter();
            seen.push(current_local_root());
            let child = tracing::info_span!("child");
            child.in_scope(|| {
                seen.push(current_local_root());
                tracing::info_span!("grandchild").in_scope(|| seen.push(current_local_root()));
                seen.push(current_local_root());
            });
            drop(child);
            // The child ended (closed): the parent's context is still there.
            seen.push(current_local_root());
        });
        assert_eq!(current_local_root(), None, "{order:?}: left a value behind");
        let root = exported(&setup, "root");
        let id = profile_id(&root).expect("root marked");
        for value in &seen {
            let value = value.expect("inside a span");
            assert_eq!(
                value.span_id().map(|s| s.to_string()),
                Some(id.clone()),
                "{order:?}"
            );
            assert_eq!(value.trace_id(), Some(root.span_context.trace_id()));
            assert_eq!(&*value.name().expect("name").resolve(), "root");
        }
        assert_eq!(profile_id(&exported(&setup, "child")), None);
    }
}

#[test]
fn exits_out_of_order_leave_the_right_value() {
    let setup = setup(
        Order::OtelFirst,
        Sampler::AlwaysOn,
        ProfilingLayer::default(),
    );
    tracing::dispatcher::with_default(&setup.dispatch, || {
        let a = tracing::info_span!("a");
        let b = tracing::info_span!(parent: None, "b");
        let c = tracing::info_span!(parent: None, "c");
        let ga = a.enter();
        let id_a = seen_id();
        let gb = b.enter();
        let id_b = seen_id();
        let gc = c.enter();
        let id_c = seen_id();
        assert!(id_a.is_some() && id_b.is_some() && id_c.is_some());
        assert_ne!(id_a, id_b);
        drop(gb); // out of order: c is still entered
        assert_eq!(seen_id(), id_c);
        drop(gc); // c restores what b found: a
        assert_eq!(seen_id(), id_a);
        let again = b.enter(); // re-entering works after the splice
        assert_eq!(seen_id(), id_b);
        drop(ga); // out of order again
        assert_eq!(seen_id(), id_b);
        drop(again);
        assert_eq!(seen_id(), None);
    });
}

#[test]
fn same_span_entered_twice_restores_step_by_step() {
    let setup = setup(
        Order::OtelFirst,
        Sampler::AlwaysOn,
        ProfilingLayer::default(),
    );
    tracing::dispatcher::with_default(&setup.dispatch, || {
        let a = tracing::info_span!("a");
        let outer = a.enter();
        let id = seen_id();
        let inner = a.enter();
        drop(inner);
        assert_eq!(seen_id(), id);
        drop(outer);
        assert_eq!(seen_id(), None);
    });
}

#[test]
fn remote_parent_starts_a_new_local_root() {
    let setup = setup(
        Order::ProfilingFirst,
        Sampler::AlwaysOn,
        ProfilingLayer::default(),
    );
    // Sampled and the W3C random-trace-id bit: the root inherits both.
    let remote = SpanContext::new(
        TraceId::from(0xabc_u128),
        SpanId::from(0xdef_u64),
        TraceFlags::new(0x03),
        true,
        TraceState::default(),
    );
    let mut seen = None;
    let mut outer_seen = None;
    tracing::dispatcher::with_default(&setup.dispatch, || {
        let outer = tracing::info_span!("outer");
        let _o = outer.enter();
        outer_seen = current_local_root();
        let server = tracing::info_span!("server");
        let _ = server.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
        server.in_scope(|| seen = current_local_root());
    });
    let server = exported(&setup, "server");
    let seen = seen.expect("inside server");
    assert_eq!(seen.trace_id(), Some(TraceId::from(0xabc_u128)));
    assert_eq!(seen.span_id(), Some(server.span_context.span_id()));
    assert_eq!(
        seen.trace_flags(),
        TraceFlags::new(0x03),
        "the span's own flags"
    );
    assert_eq!(seen.trace_flags(), server.span_context.trace_flags());
    assert_eq!(
        profile_id(&server),
        Some(server.span_context.span_id().to_string())
    );
    assert_ne!(outer_seen, Some(seen));
}

#[test]
fn otel_name_field_names_the_root() {
    let setup = setup(
        Order::OtelFirst,
        Sampler::AlwaysOn,
        ProfilingLayer::default(),
    );
    tracing::dispatcher::with_default(&setup.dispatch, || {
        let span = tracing::info_span!("request", otel.name = "GET /report");
        span.in_scope(|| {
            let name = current_local_root().and_then(|r| r.name()).expect("name");
            assert_eq!(&*name.resolve(), "GET /report");
        });
        let later = tracing::info_span!("request", otel.name = tracing::field::Empty);
        later.record("otel.name", "POST /upload");
        later.in_scope(|| {
            let name = current_local_root().and_then(|r| r.name()).expect("name");
            assert_eq!(&*name.resolve(), "POST /upload");
        });
    });
}

#[test]
fn unsampled_traces_keep_the_name_or_nothing() {
    let keep = setup(
        Order::OtelFirst,
        Sampler::AlwaysOff,
        ProfilingLayer::default(),
    );
    tracing::dispatcher::with_default(&keep.dispatch, || {
        tracing::info_span!("unsampled").in_scope(|| {
            tracing::info_span!("child").in_scope(|| {
                let root = current_local_root().expect("name kept");
                assert_eq!((root.span_id(), root.trace_id()), (None, None));
                assert_eq!(&*root.name().expect("name").resolve(), "unsampled");
            })
        });
    });
    let ignore = setup(
        Order::OtelFirst,
        Sampler::AlwaysOff,
        ProfilingLayer::new().with_unsampled(UnsampledTraces::Ignore),
    );
    tracing::dispatcher::with_default(&ignore.dispatch, || {
        tracing::info_span!("unsampled").in_scope(|| assert_eq!(current_local_root(), None));
    });
    assert!(keep
        .exporter
        .get_finished_spans()
        .expect("spans")
        .is_empty());
}

#[test]
fn without_an_opentelemetry_layer_names_are_still_labelled() {
    let dispatch =
        tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::default()));
    tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("plain").in_scope(|| {
            tracing::info_span!("inner").in_scope(|| {
                let root = current_local_root().expect("labelled");
                assert_eq!(root.span_id(), None);
                assert_eq!(&*root.name().expect("name").resolve(), "plain");
            })
        });
    });
}

#[test]
fn tracing_root_under_a_plain_api_root_inherits_it() {
    use crate::ProfilingContext;
    use opentelemetry::trace::{Span as _, TraceContextExt, Tracer};
    let setup = setup(
        Order::OtelFirst,
        Sampler::AlwaysOn,
        ProfilingLayer::default(),
    );
    let tracer = setup._provider.tracer("plain");
    let root = tracer.start("plain-root");
    let root_id = root.span_context().span_id();
    let pcx = ProfilingContext::new(
        opentelemetry::Context::current_with_span(root),
        "plain-root",
    );
    tracing::dispatcher::with_default(&setup.dispatch, || {
        pcx.in_scope(|| {
            tracing::info_span!("tracing-child").in_scope(|| {
                assert_eq!(
                    current_local_root().and_then(|r| r.span_id()),
                    Some(root_id)
                );
            });
        });
    });
    drop(pcx);
    assert_eq!(exported(&setup, "tracing-child").parent_span_id, root_id);
}

fn label_name() -> Option<String> {
    current_local_root()
        .and_then(|r| r.name())
        .map(|n| n.resolve().to_string())
}

/// Span ids are per subscriber: the first span of two fresh registries gets the same id.
/// A subscriber set with `with_default` over another must not take, on an exit, the entry
/// of the other's span with that id, in any exit order.
#[test]
fn two_subscribers_with_colliding_span_ids_restore_their_own_scope() {
    let outer =
        tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::default()));
    tracing::dispatcher::with_default(&outer, || {
        let x = tracing::info_span!("x");
        let inner = tracing_subscriber::registry().with(ProfilingLayer::default());
        tracing::subscriber::with_default(inner, || {
            let y = tracing::info_span!("y");
            assert!(x.id().is_some());
            assert_eq!(x.id(), y.id(), "the test needs the two ids to collide");
            let (x_name, y_name) = (Some("x".to_string()), Some("y".to_string()));

            // The outer subscriber's span exits first.
            let gx = x.enter();
            let gy = y.enter();
            assert_eq!(label_name(), y_name);
            drop(gx);
            assert_eq!(label_name(), y_name, "x's exit took y's entry");
            drop(gy);
            assert_eq!(label_name(), None, "y's exit restored what x found");

            // The inner subscriber's span exits first.
            let gy = y.enter();
            let gx = x.enter();
            assert_eq!(label_name(), x_name);
            drop(gy);
            assert_eq!(label_name(), x_name, "y's exit took x's entry");
            drop(gx);
            assert_eq!(label_name(), None, "x's exit restored what y found");

            // In order.
            let gx = x.enter();
            let gy = y.enter();
            drop(gy);
            assert_eq!(label_name(), x_name);
            drop(gx);
            assert_eq!(label_name(), None);
        });
    });
}

/// Guards and the layer's spans are scopes of one stack: a guard dropped while a span
/// entered after it is live keeps the span's context, a span exiting while a guard set
/// after it is live keeps the guard's, and whichever ends last restores what was there
/// before both.
#[test]
fn guards_and_layer_exits_mixed_in_any_order() {
    use crate::SpanContextGuard;
    let dispatch =
        tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::default()));
    let g = LocalRoot::name_only(SpanName::intern("guard"));
    let (g_name, s_name) = (Some("guard".to_string()), Some("s".to_string()));
    tracing::dispatcher::with_default(&dispatch, || {
        let s = tracing::info_span!("s");

        // Guard first, dropped first.
        let guard = SpanContextGuard::enter(Some(&g));
        let entered = s.enter();
        assert_eq!(label_name(), s_name);
        drop(guard);
        assert_eq!(
            label_name(),
            s_name,
            "the guard's drop cleared the live span"
        );
        drop(entered);
        assert_eq!(
            label_name(),
            None,
            "the span's exit brought back the ended guard"
        );

        // Span first, exits first.
        let entered = s.enter();
        let guard = SpanContextGuard::enter(Some(&g));
        assert_eq!(label_name(), g_name);
        drop(entered);
        assert_eq!(
            label_name(),
            g_name,
            "the span's exit cleared the live guard"
        );
        drop(guard);
        assert_eq!(
            label_name(),
            None,
            "the guard's drop brought back the ended span"
        );

        // In order, both ways round.
        let guard = SpanContextGuard::enter(Some(&g));
        let entered = s.enter();
        drop(entered);
        assert_eq!(label_name(), g_name);
        drop(guard);
        assert_eq!(label_name(), None);
        let entered = s.enter();
        let guard = SpanContextGuard::enter(Some(&g));
        drop(guard);
        assert_eq!(label_name(), s_name);
        drop(entered);
        assert_eq!(label_name(), None);
    });
}

/// The registry hands a span id out again once its slot's generation wraps (8,192 reuses
/// with `tracing-subscriber`'s slab), which a busy thread reaches in milliseconds. The
/// label cached on the thread for the old span must not label the new one.
#[test]
fn a_recycled_span_id_gets_its_own_label_not_the_cached_one() {
    let dispatch =
        tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::default()));
    tracing::dispatcher::with_default(&dispatch, || {
        let old = tracing::info_span!("old-root");
        let old_id = old.id().expect("enabled");
        // Entered twice: the second enter is served from the thread's cache.
        for _ in 0..2 {
            old.in_scope(|| assert_eq!(label_name().as_deref(), Some("old-root")));
        }
        drop(old);
        let mut reuses = 0;
        let recycled = loop {
            let span = tracing::info_span!("new-root");
            if span.id().as_ref() == Some(&old_id) {
                break span;
            }
            reuses += 1;
            assert!(reuses < 1_000_000, "the id never came back");
        };
        recycled.in_scope(|| assert_eq!(label_name().as_deref(), Some("new-root")));
        recycled.in_scope(|| assert_eq!(label_name().as_deref(), Some("new-root")));
    });
}

/// Fan-out: a span created (not yet entered) and handed to several threads, which all
/// enter it for the first time at once. Each must resolve the same root without a panic,
/// and the span's extensions lock must stay usable (a panic while holding it poisons the
/// registry slot for every later span there, and tracing-opentelemetry's `on_close` then
/// panics inside `Span::drop`). Fails with the get-then-insert `root_of`: `insert` asserts
/// the value is absent, and the losing thread panics.
#[test]
fn threads_entering_a_new_span_at_once_agree_without_a_panic() {
    const THREADS: usize = 4;
    for order in [Order::OtelFirst, Order::ProfilingFirst] {
        let setup = setup(order, Sampler::AlwaysOn, ProfilingLayer::default());
        tracing::dispatcher::with_default(&setup.dispatch, || {
            for round in 0..200 {
                let span = tracing::info_span!("fan-out");
                let start = std::sync::Barrier::new(THREADS);
                let seen: Vec<Option<String>> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..THREADS)
                        .map(|_| {
                            let span = span.clone();
                            let start = &start;
                            let dispatch = setup.dispatch.clone();
                            scope.spawn(move || {
                                tracing::dispatcher::with_default(&dispatch, || {
                                    start.wait();
                                    span.in_scope(|| tracing::info_span!("child").in_scope(seen_id))
                                })
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("no panic in span.enter()"))
                        .collect()
                });
                let expected = span.context().span().span_context().span_id().to_string();
                for id in seen {
                    assert_eq!(id.as_deref(), Some(&*expected), "round {round} ({order:?})");
                }
            }
        });
    }
}
