//! Where a root span's elapsed time went, on a 2-worker tokio runtime: a root that burns
//! CPU, one that blocks inside its poll (`std::thread::sleep`), one that awaits a timer,
//! and one whose work runs on a blocking-pool thread. `profiling.wall.active_ns` (time a
//! thread was inside the root) must tell them apart together with CPU and duration.

mod common;

use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::{
    CpuEvidenceProcessor, ProfilingContext, ProfilingFutureExt, CPU_TIME_ATTRIBUTE,
    WALL_ACTIVE_ATTRIBUTE, WALL_QUEUED_ATTRIBUTE,
};

const STRETCH: Duration = Duration::from_millis(300);

struct Split {
    duration: Duration,
    cpu: Duration,
    active: Duration,
}

use common::{burn, ns_attribute as ns};

/// Spans exported with their evidence, a sampler at 100 Hz and a runtime of `workers`.
struct Setup {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    sampler: Sampler,
    runtime: tokio::runtime::Runtime,
}

impl Setup {
    fn new(workers: usize) -> Setup {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(
                exporter.clone(),
            )))
            .build();
        let sampler =
            Sampler::start(SamplerConfig::default().with_frequency_hz(100)).expect("sampler");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .expect("runtime");
        Setup {
            exporter,
            provider,
            sampler,
            runtime,
        }
    }
}

#[test]
fn cpu_blocked_in_poll_and_awaiting_are_told_apart() {
    let _turn = common::turn();
    let Setup {
        exporter,
        provider,
        sampler,
        runtime,
    } = Setup::new(2);
    let tracer = provider.tracer("elapsed");

    let root = |name: &'static str| {
        let span = tracer.start(name);
        ProfilingContext::new(Context::current_with_span(span), name)
    };
    let cpu = root("cpu");
    let blocked = root("blocked");
    let awaiting = root("awaiting");
    let offloaded = root("offloaded");
    let offloaded_cx = offloaded.clone();

    let burned = runtime.block_on(async {
        let cpu_task = tokio::spawn(
            async {
                // Six polls of 50 ms CPU each, yielding between them.
                let start = common::thread_cpu_time();
                for _ in 0..6 {
                    burn(STRETCH / 6);
                    tokio::task::yield_now().await;
                }
                common::thread_cpu_time() - start
            }
            .with_profiling_context(cpu.clone()),
        );
        let blocked_task = tokio::spawn(
            async {
                tokio::task::yield_now().await;
                std::thread::sleep(STRETCH);
            }
            .with_profiling_context(blocked.clone()),
        );
        let awaiting_task = tokio::spawn(
            async {
                tokio::time::sleep(STRETCH).await;
            }
            .with_profiling_context(awaiting.clone()),
        );
        let offloaded_task = tokio::spawn(
            async move {
                // The work runs on a blocking-pool thread under the same root; the task
                // itself only awaits it.
                tokio::task::spawn_blocking(move || {
                    offloaded_cx.in_scope(|| std::thread::sleep(STRETCH))
                })
                .await
            }
            .with_profiling_context(offloaded.clone()),
        );
        let (burned, _, _, _) = tokio::join!(cpu_task, blocked_task, awaiting_task, offloaded_task);
        burned.expect("cpu task")
    });
    for cx in [&cpu, &blocked, &awaiting, &offloaded] {
        cx.context().span().end();
    }
    drop(runtime);
    drop(sampler);

    let spans = exporter.get_finished_spans().expect("spans");
    let split = |name: &str| {
        let span = spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} exported"));
        Split {
            duration: span
                .end_time
                .duration_since(span.start_time)
                .unwrap_or_default(),
            cpu: ns(span, CPU_TIME_ATTRIBUTE),
            active: ns(span, WALL_ACTIVE_ATTRIBUTE),
        }
    };
    let show = |name: &str, s: &Split| {
        eprintln!(
            "{name:>9}: duration {:>4} ms, active {:>4} ms, cpu {:>4} ms",
            s.duration.as_millis(),
            s.active.as_millis(),
            s.cpu.as_millis()
        )
    };
    let (c, b, a, o) = (
        split("cpu"),
        split("blocked"),
        split("awaiting"),
        split("offloaded"),
    );
    for (name, s) in [
        ("cpu", &c),
        ("blocked", &b),
        ("awaiting", &a),
        ("offloaded", &o),
    ] {
        show(name, s);
        assert!(
            s.active <= s.duration,
            "{name}: active within the span's duration"
        );
    }
    let ms = Duration::from_millis;
    // CPU-bound: a thread was inside the root at least as long as it burned CPU, and the
    // sampled CPU matches the burned CPU within a few sampling periods.
    assert!(
        c.active >= burned.mul_f64(0.95),
        "cpu: active {:?} vs burned {burned:?}",
        c.active
    );
    assert!(
        c.cpu >= burned.mul_f64(0.7),
        "cpu: sampled {:?} vs burned {burned:?}",
        c.cpu
    );
    // Blocked in its poll: the thread was held the whole sleep, with almost no CPU.
    assert!(
        b.active >= STRETCH.mul_f64(0.95),
        "blocked: active {:?}",
        b.active
    );
    assert!(b.cpu <= ms(50), "blocked: cpu {:?}", b.cpu);
    // Awaiting a timer: no thread was inside the root for (nearly) all of it.
    assert!(a.duration >= STRETCH, "awaiting: duration {:?}", a.duration);
    assert!(a.active <= ms(60), "awaiting: active {:?}", a.active);
    // Offloaded: the blocking-pool thread's stretch counts for the root too.
    assert!(
        o.active >= STRETCH.mul_f64(0.95),
        "offloaded: active {:?}",
        o.active
    );
    // The timer's root was woken and polled by a free worker: next to no queued time.
    let queued = spans
        .iter()
        .find(|s| s.name == "awaiting")
        .map(|s| ns(s, WALL_QUEUED_ATTRIBUTE))
        .expect("awaiting");
    assert!(queued <= ms(60), "awaiting: queued {queued:?}");
}

/// Queued is not waiting: a root woken while the only worker is busy with other CPU work
/// waits for the worker, and `profiling.wall.queued_ns` says so, apart from the time it
/// really awaited.
#[test]
fn time_woken_but_not_polled_is_queued_not_awaiting() {
    let _turn = common::turn();
    let Setup {
        exporter,
        provider,
        sampler,
        runtime,
    } = Setup::new(1);
    let tracer = provider.tracer("queued");
    let span = tracer.start("queued");
    let queued = ProfilingContext::new(Context::current_with_span(span), "queued");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let awaited = Duration::from_millis(50);
    let waiter_cx = queued.clone();
    runtime.block_on(async move {
        // Polled first: it waits for a message another thread sends after 50 ms.
        let waiter = tokio::spawn(
            async move {
                let _ = rx.await;
            }
            .with_profiling_context(waiter_cx),
        );
        tokio::task::yield_now().await;
        std::thread::spawn(move || {
            std::thread::sleep(awaited);
            let _ = tx.send(());
        });
        // Then the only worker burns 300 ms of CPU without yielding: the waiter, woken at
        // 50 ms, is polled only after it.
        let hog = tokio::spawn(async { burn(STRETCH) });
        let _ = hog.await;
        let _ = waiter.await;
    });
    queued.context().span().end();
    drop(runtime);
    drop(sampler);
    let spans = exporter.get_finished_spans().expect("spans");
    let span = spans.iter().find(|s| s.name == "queued").expect("exported");
    let queued = ns(span, WALL_QUEUED_ATTRIBUTE);
    let active = ns(span, WALL_ACTIVE_ATTRIBUTE);
    eprintln!("queued root: queued {queued:?}, active {active:?}");
    // Woken at ~50 ms, polled after the hog's 300 ms of CPU (longer on a loaded machine).
    assert!(queued >= Duration::from_millis(200), "queued {queued:?}");
    assert!(active <= Duration::from_millis(60), "active {active:?}");
}

/// Runs `replay` (spans and events as tokio's instrumentation emits them) under a
/// `tracing-opentelemetry` + `ProfilingLayer` subscriber with a running sampler; returns
/// the exported spans.
fn replay_tokio_events(replay: impl FnOnce()) -> Vec<opentelemetry_sdk::trace::SpanData> {
    use otel_profiling::ProfilingLayer;
    use tracing_subscriber::layer::SubscriberExt;

    let _turn = common::turn();
    let Setup {
        exporter,
        provider,
        sampler,
        runtime,
    } = Setup::new(1);
    drop(runtime);
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("tokio")))
        .with(ProfilingLayer::default());
    tracing::subscriber::with_default(subscriber, replay);
    drop(sampler);
    exporter.get_finished_spans().expect("spans")
}

/// Queued time of a `tracing`-instrumented tokio task, from tokio's own instrumentation
/// (what it emits under `--cfg tokio_unstable`, replayed here event for event): the task's
/// `runtime.spawn` span, entered around each poll, and its waker events. The root entered
/// inside the task's polls gets spawn → first poll and wake → next poll, never the time
/// the task waited without being woken. (`tests/tokio_unstable_queued.rs` runs the real
/// runtime when built with the flag.)
#[test]
fn tokio_task_instrumentation_measures_a_tracing_roots_queued_time() {
    let ms = Duration::from_millis;
    let spans = replay_tokio_events(|| {
        // Any waker event says wakes are reported (tokio emits `waker.clone` constantly).
        tracing::trace!(target: "tokio::task::waker", op = "waker.clone", task.id = 1u64);
        let task = tracing::trace_span!(
            target: "tokio::task",
            parent: None,
            "runtime.spawn",
            kind = %"task",
            task.id = 7u64,
        );
        let task_id = task.id().expect("enabled").into_u64();
        let root = tracing::info_span!(parent: None, "handler");
        // Spawned, then 40 ms before a worker polls it.
        std::thread::sleep(ms(40));
        task.in_scope(|| root.in_scope(|| ()));
        // Awaiting for 150 ms (nobody woke it): not queued.
        std::thread::sleep(ms(150));
        tracing::trace!(target: "tokio::task::waker", op = "waker.wake_by_ref", task.id = task_id);
        // A second wake before the poll does not restart the stretch.
        std::thread::sleep(ms(20));
        tracing::trace!(target: "tokio::task::waker", op = "waker.wake", task.id = task_id);
        std::thread::sleep(ms(20));
        task.in_scope(|| root.in_scope(|| ()));
        // Woken, polled without entering the root: handed to nobody, then dropped.
        tracing::trace!(target: "tokio::task::waker", op = "waker.wake", task.id = task_id);
        std::thread::sleep(ms(100));
        task.in_scope(|| ());
        root.in_scope(|| ());
    });
    let span = spans
        .iter()
        .find(|s| s.name == "handler")
        .expect("exported");
    let queued = ns(span, WALL_QUEUED_ATTRIBUTE);
    eprintln!("tracing root in a tokio task: queued {queued:?}");
    // 40 + 40 ms queued; the 150 ms awaited and the 100 ms of the poll without the root
    // are not (a loaded machine only stretches the sleeps, never shortens them).
    assert!(queued >= ms(80), "queued {queued:?}");
    assert!(queued < ms(80 + 100), "queued {queued:?}");
}

/// A task span entered inside another task's poll is not a poll of its own: another
/// task's span made current inside a task (`.instrument(Span::current())`), or a task
/// polled inside another's poll (a `LocalSet` run in a task). Its wake is kept for its own
/// next poll, and the open poll's queued time goes to no root of the nested one.
#[test]
fn a_task_span_entered_inside_another_tasks_poll_takes_nothing() {
    let ms = Duration::from_millis;
    let task_span = |n: u64| tracing::trace_span!(target: "tokio::task", parent: None, "runtime.spawn", task.id = n);
    let wake = |task: &tracing::Span| {
        let id = task.id().expect("enabled").into_u64();
        tracing::trace!(target: "tokio::task::waker", op = "waker.wake", task.id = id);
    };
    let spans = replay_tokio_events(|| {
        let (t1, t2) = (task_span(1), task_span(2));
        let (r1, r2) = (
            tracing::info_span!(parent: None, "outer-root"),
            tracing::info_span!(parent: None, "nested-root"),
        );
        // First polls (spawn stamps are not measured before the first waker event).
        t1.in_scope(|| r1.in_scope(|| ()));
        t2.in_scope(|| r2.in_scope(|| ()));
        // Both woken; t1 waits 120 ms, t2 40 ms before its poll.
        wake(&t1);
        std::thread::sleep(ms(80));
        wake(&t2);
        std::thread::sleep(ms(40));
        // t2's poll: t1's span entered inside it (made current there), then t2's root.
        t2.in_scope(|| t1.in_scope(|| r2.in_scope(|| ())));
        // t1's own poll, inside which t2 is polled again (nested, woken just before).
        wake(&t2);
        t1.in_scope(|| {
            t2.in_scope(|| r2.in_scope(|| ()));
            r1.in_scope(|| ());
        });
    });
    let queued = |name: &str| {
        let span = spans.iter().find(|s| s.name == name).expect("exported");
        let measured = span
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == WALL_QUEUED_ATTRIBUTE);
        measured.then(|| ns(span, WALL_QUEUED_ATTRIBUTE))
    };
    let outer = queued("outer-root").expect("outer-root's queued time measured");
    // Not measured at all is right too: t2's only measured poll was nested.
    let nested = queued("nested-root").unwrap_or_default();
    eprintln!("outer-root queued {outer:?}, nested-root queued {nested:?}");
    // t1's wake → its own poll (120 ms), not to the root entered under its span in t2's
    // poll; t2's queued time is not measured inside t2's own poll nested in t1's, and t1's
    // poll's queued time did not go to the nested task's root.
    assert!(outer >= ms(120), "outer-root queued {outer:?}");
    assert!(
        nested < ms(80),
        "nested-root got another task's queued time: {nested:?}"
    );
}

/// Task spans nested deep inside a poll, each doing work under a span of its own: only
/// task spans' exits end the nesting, so once they have all exited the poll's own root
/// gets its queued time (and nothing went to the root entered at the bottom of the nest).
#[test]
fn deeply_nested_task_spans_end_only_with_their_own_exits() {
    let ms = Duration::from_millis;
    let task_span = |n: u64| tracing::trace_span!(target: "tokio::task", parent: None, "runtime.spawn", task.id = n);
    fn nest(tasks: &[tracing::Span], bottom: &tracing::Span) {
        match tasks.split_first() {
            None => bottom.in_scope(|| ()),
            Some((task, rest)) => task.in_scope(|| {
                tracing::info_span!("work").in_scope(|| ());
                nest(rest, bottom);
                tracing::info_span!("more work").in_scope(|| ());
            }),
        }
    }
    let spans = replay_tokio_events(|| {
        let outer = task_span(1);
        let (r1, r2) = (
            tracing::info_span!(parent: None, "outer-root"),
            tracing::info_span!(parent: None, "nested-root"),
        );
        outer.in_scope(|| r1.in_scope(|| ()));
        let id = outer.id().expect("enabled").into_u64();
        tracing::trace!(target: "tokio::task::waker", op = "waker.wake", task.id = id);
        std::thread::sleep(ms(60));
        let nested: Vec<_> = (20..32).map(task_span).collect();
        outer.in_scope(|| {
            nest(&nested, &r2);
            r1.in_scope(|| ());
        });
    });
    let queued = |name: &str| {
        let span = spans.iter().find(|s| s.name == name).expect("exported");
        span.attributes
            .iter()
            .any(|kv| kv.key.as_str() == WALL_QUEUED_ATTRIBUTE)
            .then(|| ns(span, WALL_QUEUED_ATTRIBUTE))
    };
    let outer = queued("outer-root").expect("outer-root's queued time measured");
    let nested = queued("nested-root").unwrap_or_default();
    assert!(outer >= ms(60), "outer-root queued {outer:?}");
    assert!(
        nested < ms(60),
        "nested-root got the poll's queued time: {nested:?}"
    );
}
