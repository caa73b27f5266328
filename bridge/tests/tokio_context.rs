//! The thread's span context under a multi-threaded tokio runtime: hundreds of tasks that
//! yield, migrate between workers and interleave on each, read their context at many
//! points and must always find their own local root.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use opentelemetry::trace::{Span as _, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use otel_profiling::{
    current_local_root, ProfileIdSpanProcessor, ProfilingContext, ProfilingFutureExt,
    ProfilingLayer, RootLabel, PROFILE_ID_ATTRIBUTE,
};
use tracing::instrument::WithSubscriber;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const TASKS: usize = 400;
const STEPS: usize = 25;

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .expect("runtime")
}

fn provider() -> (SdkTracerProvider, InMemorySpanExporter) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(ProfileIdSpanProcessor::default())
        .with_simple_exporter(exporter.clone())
        .build();
    (provider, exporter)
}

/// Everything a task observed: mismatches, and the threads it ran on.
#[derive(Default)]
struct Observations {
    checks: usize,
    wrong: Vec<String>,
    threads: HashMap<usize, HashSet<ThreadId>>,
}

type Shared = Arc<Mutex<Observations>>;

fn check(obs: &Shared, task: usize, expected: Option<RootLabel>, at: &str) {
    let seen = current_local_root();
    let mut obs = obs.lock().expect("observations");
    obs.checks += 1;
    obs.threads
        .entry(task)
        .or_default()
        .insert(std::thread::current().id());
    if seen.map(|r| r.span_id()) != expected.map(|r| r.span_id()) || seen.is_none() {
        obs.wrong.push(format!(
            "task {task} at {at}: saw {seen:?}, expected {expected:?}"
        ));
    }
}

#[inline(never)]
fn spin(n: u64) -> u64 {
    (0..n).fold(0u64, |acc, x| acc.wrapping_mul(31).wrapping_add(x))
}

fn assert_observations(obs: &Shared) {
    let obs = obs.lock().expect("observations");
    assert!(
        obs.wrong.is_empty(),
        "{} wrong of {}: {:#?}",
        obs.wrong.len(),
        obs.checks,
        &obs.wrong[..obs.wrong.len().min(10)]
    );
    assert!(
        obs.checks >= TASKS * STEPS * 3,
        "only {} checks ran",
        obs.checks
    );
    let migrated = obs.threads.values().filter(|t| t.len() > 1).count();
    assert!(
        migrated > 0,
        "no task ran on two threads: the test did not exercise migration"
    );
}

#[test]
fn tracing_spans_follow_tasks_across_workers() {
    let (provider, exporter) = provider();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("tokio")))
        .with(ProfilingLayer::default());
    let dispatch = tracing::Dispatch::new(subscriber);
    let obs: Shared = Arc::default();
    let rt = runtime(2);
    // The dispatcher must be the default on the worker threads too.
    let _default = tracing::dispatcher::set_default(&dispatch);
    let ids: Vec<String> = rt.block_on(async {
        let mut handles = Vec::new();
        for task in 0..TASKS {
            let obs = obs.clone();
            let blocking_dispatch = dispatch.clone();
            let root = tracing::info_span!(parent: None, "request", task);
            let fut = async move {
                let me = current_local_root();
                let own_id = tracing::Span::current()
                    .context()
                    .span()
                    .span_context()
                    .span_id();
                assert_eq!(me.and_then(|r| r.span_id()), Some(own_id), "task {task}");
                for step in 0..STEPS {
                    check(&obs, task, me, "root");
                    tokio::task::yield_now().await;
                    spin(200 + (task as u64 % 7) * 50);
                    async {
                        check(&obs, task, me, "child");
                        tokio::task::yield_now().await;
                        check(&obs, task, me, "child after yield");
                    }
                    .instrument(tracing::info_span!("child", step))
                    .await;
                    check(&obs, task, me, "after child");
                    if step % 10 == 0 {
                        let span = tracing::Span::current();
                        let obs2 = obs.clone();
                        let dispatch = blocking_dispatch.clone();
                        tokio::task::spawn_blocking(move || {
                            tracing::dispatcher::with_default(&dispatch, || {
                                span.in_scope(|| check(&obs2, task, me, "spawn_blocking"));
                                // Leaving the span on the blocking thread leaves nothing.
                                assert_eq!(current_local_root(), None);
                            })
                        })
                        .await
                        .expect("blocking");
                    }
                }
                own_id.to_string()
            }
            .instrument(root);
            handles.push(tokio::spawn(fut.with_subscriber(dispatch.clone())));
        }
        let mut ids = Vec::new();
        for h in handles {
            ids.push(h.await.expect("task"));
        }
        ids
    });
    assert_observations(&obs);
    let spans = exporter.get_finished_spans().expect("spans");
    let marked: HashSet<String> = spans
        .iter()
        .filter(|s| s.name == "request")
        .filter_map(|s| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == PROFILE_ID_ATTRIBUTE)
                .map(|kv| kv.value.to_string())
        })
        .collect();
    assert_eq!(marked.len(), TASKS);
    assert_eq!(
        marked,
        ids.into_iter().collect::<HashSet<_>>(),
        "labels are the marked ids"
    );
}

#[test]
fn plain_api_wrappers_follow_tasks_across_workers() {
    let (provider, exporter) = provider();
    let tracer = provider.tracer("plain");
    let obs: Shared = Arc::default();
    let rt = runtime(2);
    let ids: Vec<String> = rt.block_on(async {
        let mut handles = Vec::new();
        for task in 0..TASKS {
            let obs = obs.clone();
            let tracer = tracer.clone();
            let root = tracer.start("request");
            let root_id = root.span_context().span_id();
            let pcx = ProfilingContext::new(Context::current_with_span(root), "request");
            let expected = pcx.local_root().map(|r| r.label());
            assert_eq!(expected.and_then(|r| r.span_id()), Some(root_id));
            let fut = async move {
                for step in 0..STEPS {
                    check(&obs, task, expected, "root");
                    tokio::task::yield_now().await;
                    // A child started from the current context inherits the root.
                    let child = tracer.start(format!("child-{step}"));
                    let ccx = ProfilingContext::inherit(Context::current_with_span(child));
                    let obs2 = obs.clone();
                    async move {
                        check(&obs2, task, expected, "child");
                        tokio::task::yield_now().await;
                        check(&obs2, task, expected, "child after yield");
                    }
                    .with_profiling_context(ccx)
                    .await;
                    ProfilingContext::inherit(Context::current())
                        .in_scope(|| check(&obs, task, expected, "closure"));
                }
                Context::current().span().end();
                root_id.to_string()
            }
            .with_profiling_context(pcx);
            handles.push(tokio::spawn(fut));
        }
        let mut ids = Vec::new();
        for h in handles {
            ids.push(h.await.expect("task"));
        }
        ids
    });
    assert_observations(&obs);
    assert_eq!(current_local_root(), None);
    let spans = exporter.get_finished_spans().expect("spans");
    let marked: HashSet<String> = spans
        .iter()
        .filter_map(|s| {
            s.attributes
                .iter()
                .find(|kv| kv.key.as_str() == PROFILE_ID_ATTRIBUTE)
                .map(|kv| kv.value.to_string())
        })
        .collect();
    assert_eq!(marked, ids.into_iter().collect::<HashSet<_>>());
}

#[test]
fn interleaving_on_one_thread_keeps_each_tasks_root() {
    let (provider, _exporter) = provider();
    let subscriber = tracing_subscriber::registry()
        .with(ProfilingLayer::default())
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("local")));
    let _default = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let wrong = rt.block_on(async {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let mut handles = Vec::new();
                for task in 0..200u64 {
                    handles.push(tokio::task::spawn_local(
                        async move {
                            let me = current_local_root();
                            let mut wrong = 0;
                            for _ in 0..STEPS {
                                tokio::task::yield_now().await;
                                wrong += usize::from(current_local_root() != me || me.is_none());
                            }
                            wrong
                        }
                        .instrument(tracing::info_span!(parent: None, "request", task)),
                    ));
                }
                let mut wrong = 0;
                for h in handles {
                    wrong += h.await.expect("task");
                }
                assert_eq!(current_local_root(), None, "between polls nothing is set");
                wrong
            })
            .await
    });
    assert_eq!(wrong, 0);
}

#[tracing::instrument(skip(obs))]
async fn instrumented_request(task: usize, obs: Shared) -> Option<RootLabel> {
    let me = current_local_root();
    for _ in 0..STEPS {
        check(&obs, task, me, "#[instrument] fn");
        instrumented_child(task, obs.clone(), me).await;
        check(&obs, task, me, "after #[instrument] child");
    }
    me
}

#[tracing::instrument(skip(obs, me))]
async fn instrumented_child(task: usize, obs: Shared, me: Option<RootLabel>) {
    tokio::task::yield_now().await;
    check(&obs, task, me, "#[instrument] child");
}

#[test]
fn instrument_attribute_async_fns_follow_tasks() {
    let (provider, _exporter) = provider();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(ProfilingLayer::default())
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("instrument"))),
    );
    let obs: Shared = Arc::default();
    let rt = runtime(2);
    let roots = rt.block_on(async {
        let handles: Vec<_> = (0..TASKS)
            .map(|task| {
                tokio::spawn(
                    instrumented_request(task, obs.clone()).with_subscriber(dispatch.clone()),
                )
            })
            .collect();
        let mut roots = HashSet::new();
        for h in handles {
            roots.insert(
                h.await
                    .expect("task")
                    .and_then(|r| r.span_id())
                    .expect("labelled"),
            );
        }
        roots
    });
    assert_eq!(roots.len(), TASKS, "each request is its own local root");
    let obs = obs.lock().expect("observations");
    assert!(
        obs.wrong.is_empty(),
        "{:#?}",
        &obs.wrong[..obs.wrong.len().min(10)]
    );
    assert!(obs.checks >= TASKS * STEPS * 3);
}
