//! The host at its most hostile, through the public API, at the highest accepted rate, all
//! at once: many threads and tasks entering the same never-entered spans (tokio tasks,
//! rayon, `thread::scope`), guards dropped out of order, two subscribers, the
//! application's own panic hook set after the profiler started (and panics under it),
//! another library's `SIGPROF` timer, forked children that start and drop their own
//! profiler while parent threads end roots, and the profiler stopped and restarted.
//!
//! Nothing may panic or hang (each child exits within `common::CHILD_LIMIT`, the whole
//! test aborts after two minutes); after the last stop and its final drain every sample
//! taken was drained or counted as dropped, no thread is left registered, and the
//! application's hook saw exactly the panics the test made. (Own test binary: it sets
//! the global subscriber and panic hook, and the counters are process-wide.)

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::sampler::{self, MAX_FREQUENCY_HZ};
use otel_profiling::{CpuEvidenceProcessor, Profiler, ProfilingLayer};
use rayon::prelude::*;
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

const RUN: Duration = Duration::from_secs(20);

/// Profiles are counted and dropped (no disk, no network).
struct CountingSink(Arc<AtomicU64>);

impl ProfileSink for CountingSink {
    fn export(&mut self, _: &EncodedProfile) -> std::io::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn profiler(profiles: &Arc<AtomicU64>) -> Profiler {
    Profiler::builder()
        .frequency_hz(MAX_FREQUENCY_HZ)
        .interval(Duration::from_millis(300))
        .local_files(false)
        .sink(CountingSink(profiles.clone()))
        .start()
        .expect("profiler")
}

/// A little CPU inside whatever span is entered, with guards of two nested spans dropped
/// in the wrong order.
fn work_out_of_order(i: u64) {
    let outer = tracing::info_span!("outer", i);
    let inner = tracing::info_span!("inner");
    let a = outer.enter();
    let b = inner.enter();
    common::burn(Duration::from_micros(200));
    drop(a);
    drop(b);
}

/// One span, never entered, entered at once by `thread::scope` threads, rayon's pool and
/// tokio tasks on two workers.
fn fan_out(round: u64, runtime: &tokio::runtime::Runtime) {
    let span = tracing::info_span!("fan-out", round);
    std::thread::scope(|scope| {
        for t in 0..4 {
            let span = span.clone();
            scope.spawn(move || span.in_scope(|| work_out_of_order(t)));
        }
    });
    let span = tracing::info_span!("fan-out rayon", round);
    (0..32u64)
        .into_par_iter()
        .for_each(|i| span.in_scope(|| work_out_of_order(i)));
    let span = tracing::info_span!("fan-out tokio", round);
    runtime.block_on(async {
        let tasks: Vec<_> = (0..8u64)
            .map(|i| {
                tokio::spawn(
                    async move {
                        for _ in 0..3 {
                            work_out_of_order(i);
                            tokio::task::yield_now().await;
                        }
                    }
                    .instrument(span.clone()),
                )
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
    });
}

#[test]
fn the_host_survives_everything_at_once() {
    let done = common::abort_if_hung("hostile host", Duration::from_secs(120));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CpuEvidenceProcessor::new(common::Discard))
        .build();
    // The application's subscriber, and a second one some threads use instead.
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("hostile")))
            .with(ProfilingLayer::default()),
    )
    .expect("global subscriber");
    let second =
        tracing::Dispatch::new(tracing_subscriber::registry().with(ProfilingLayer::default()));

    let profiles = Arc::new(AtomicU64::new(0));
    let mut profiler = Some(profiler(&profiles));
    let before = sampler::stats();
    // Set after the profiler started, as color-eyre or sentry would be.
    let hook_calls = Arc::new(AtomicU64::new(0));
    {
        let hook_calls = hook_calls.clone();
        std::panic::set_hook(Box::new(move |_| {
            hook_calls.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let foreign = common::foreign_timer();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");

    // Parent threads that end roots all the time: plain-API roots through the evidence
    // processor, tracing roots under the second subscriber, and a panic now and then.
    let stop = Arc::new(AtomicBool::new(false));
    let panics_made = Arc::new(AtomicU64::new(0));
    let enders: Vec<_> = (0..2)
        .map(|w| {
            let (provider, stop, second, panics_made) = (
                provider.clone(),
                stop.clone(),
                second.clone(),
                panics_made.clone(),
            );
            std::thread::spawn(move || {
                let tracer = provider.tracer("enders");
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut root = tracer.start("plain root");
                    root.end();
                    tracing::dispatcher::with_default(&second, || work_out_of_order(i));
                    if i % 500 == w {
                        panics_made.fetch_add(1, Ordering::SeqCst);
                        let caught = std::panic::catch_unwind(|| {
                            tracing::info_span!("panicking").in_scope(|| panic!("on purpose"))
                        });
                        assert!(caught.is_err());
                    }
                    i += 1;
                }
            })
        })
        .collect();

    let end = Instant::now() + RUN;
    let (mut rounds, mut forks, mut restarts) = (0u64, 0u64, 0u64);
    while Instant::now() < end {
        fan_out(rounds, &runtime);
        if rounds % 4 == 1 {
            // A child replaces the inherited profiler with its own, makes a root, and
            // drops it, while the parent's threads go on ending roots.
            let provider = provider.clone();
            let code = common::run_child(|| {
                let inherited = profiler.take();
                let own = self::profiler(&Arc::new(AtomicU64::new(0)));
                drop(inherited);
                let tracer = provider.tracer("child");
                let mut root = tracer.start("child root");
                work_out_of_order(0);
                root.end();
                if own.shutdown(Duration::from_secs(5)) {
                    0
                } else {
                    2
                }
            });
            assert_eq!(
                code,
                Some(0),
                "fork {forks}: 2 = the child's profiler did not stop, None = hung"
            );
            forks += 1;
        }
        if rounds % 10 == 9 {
            drop(profiler.take());
            profiler = Some(self::profiler(&profiles));
            restarts += 1;
        }
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for t in enders {
        t.join().expect("no panic escaped a parent thread");
    }
    drop(runtime);
    // SAFETY: the timer created above.
    unsafe { libc::timer_delete(foreign) };
    // The last stop drains what is left.
    assert!(profiler
        .take()
        .expect("profiler")
        .shutdown(Duration::from_secs(10)));
    let _ = std::panic::take_hook();
    let after = sampler::stats();
    done.store(true, Ordering::Relaxed);
    let taken = after.taken - before.taken;
    let drained = after.drained - before.drained;
    let dropped = after.dropped - before.dropped;
    eprintln!(
        "hostile host: {rounds} rounds, {forks} forks, {restarts} restarts, {} profiles, \
         taken {taken} = drained {drained} + dropped {dropped}, {} panics, {after:?}",
        profiles.load(Ordering::Relaxed),
        panics_made.load(Ordering::SeqCst),
    );
    assert!(
        rounds >= 10 && forks >= 3 && restarts >= 1,
        "{rounds} {forks} {restarts}"
    );
    assert!(taken > 0, "{after:?}");
    assert_eq!(taken, drained + dropped, "{after:?}");
    assert!(after.foreign_signals > before.foreign_signals, "{after:?}");
    assert_eq!(
        hook_calls.load(Ordering::SeqCst),
        panics_made.load(Ordering::SeqCst),
        "the application's hook saw exactly the test's panics"
    );
    assert!(profiles.load(Ordering::Relaxed) > 0);
    assert_eq!(after.threads, 0, "no thread left registered: {after:?}");
}
