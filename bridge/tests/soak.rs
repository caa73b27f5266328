//! A bounded soak of the signal path at the highest rate, everything hostile at once in
//! one process: thread churn, allocation storms, forks, another library's `SIGPROF`
//! timer, out-of-order guards and a `LocalRoot` kept past its span. Nothing may crash or
//! deadlock (a watchdog aborts after two minutes), every sample is drained or counted as
//! dropped, and the foreign signals and stale roots are counted. (Own test binary: the
//! counters are process-wide.)

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use otel_profiling::sampler::{self, Sampler, SamplerConfig};
use otel_profiling::{CpuEvidenceProcessor, LocalRoot, ProfilingContext, SpanContextGuard};

const SOAK: Duration = Duration::from_secs(15);

/// Allocates and frees in a storm, under out-of-order guards of two roots and the kept one.
fn worker(i: usize, roots: [LocalRoot; 3], until: Instant) -> usize {
    let mut keep: Vec<Vec<u8>> = Vec::new();
    let mut n = 0;
    while Instant::now() < until {
        let a = SpanContextGuard::enter(Some(&roots[i % 3]));
        let b = SpanContextGuard::enter(Some(&roots[(i + 1) % 3]));
        for _ in 0..64 {
            keep.push(vec![i as u8; 1 + (n * 97) % 4096]);
            n += 1;
        }
        if keep.len() > 512 {
            keep.clear();
        }
        // Out of order on purpose.
        drop(a);
        drop(b);
    }
    n
}

#[test]
fn soak_everything_at_once_at_the_highest_rate() {
    let _turn = common::turn();
    let done = common::abort_if_hung("soak", Duration::from_secs(120));
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(
            exporter.clone(),
        )))
        .build();
    let tracer = provider.tracer("soak");
    let sampler = Sampler::start(
        SamplerConfig::default()
            .with_frequency_hz(sampler::MAX_FREQUENCY_HZ)
            .with_ring_capacity(2),
    )
    .expect("start");
    let before = sampler.stats();
    let root = |name: &str| {
        let span = tracer.start(name.to_owned());
        ProfilingContext::new(Context::current_with_span(span), name)
    };
    let (live_a, live_b, ended) = (root("soak-a"), root("soak-b"), root("soak-ended"));
    let kept = ended.local_root().expect("label");
    ended.context().span().end();
    let roots = [
        live_a.local_root().expect("label"),
        live_b.local_root().expect("label"),
        kept,
    ];

    let sampler = Arc::new(sampler);
    let drained = Arc::new(AtomicU64::new(0));
    let collector = {
        let (drained, done, sampler) = (drained.clone(), done.clone(), sampler.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let n = sampler.drain(|_| {}) as u64;
                drained.fetch_add(n, Ordering::Relaxed);
            }
        })
    };
    let foreign = common::foreign_timer();
    let end = Instant::now() + SOAK;
    let mut generations = 0u64;
    let mut forks = 0u64;
    let mut next_fork = Instant::now();
    while Instant::now() < end {
        let until = Instant::now() + Duration::from_millis(60);
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let roots = roots.clone();
                std::thread::spawn(move || {
                    let _ = sampler::register_current_thread();
                    worker(i, roots, until)
                })
            })
            .collect();
        if Instant::now() >= next_fork {
            next_fork = Instant::now() + Duration::from_millis(500);
            // SAFETY: the child uses the crate's fork-safe paths and leaves with _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // SAFETY: watchdog for the child, then leaving without destructors.
                unsafe { libc::alarm(20) };
                let code = match Sampler::start(SamplerConfig::default()) {
                    Ok(s) => {
                        let _ = s.register_current_thread();
                        let start = common::thread_cpu_time();
                        while common::thread_cpu_time() - start < Duration::from_millis(20) {}
                        s.drain(|_| {});
                        0
                    }
                    Err(_) => 3,
                };
                // SAFETY: as above.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child status {status:#x}"
            );
            forks += 1;
        }
        for t in threads {
            t.join().expect("worker");
        }
        generations += 1;
    }
    // SAFETY: the timer created above.
    unsafe { libc::timer_delete(foreign) };
    done.store(true, Ordering::Relaxed);
    collector.join().expect("collector");
    // Every worker has exited and this thread is not sampled: nothing is taken between
    // this last drain and the stop.
    sampler::unregister_current_thread();
    std::thread::sleep(Duration::from_millis(20));
    let last = sampler.drain(|_| {}) as u64;
    drop(sampler);
    let drained = drained.load(Ordering::Relaxed) + last;
    let after = sampler::stats();
    live_a.context().span().end();
    live_b.context().span().end();
    let taken = after.taken - before.taken;
    let dropped = after.dropped - before.dropped;
    eprintln!(
        "soak: {generations} generations, {forks} forks, taken {taken}, drained {drained}, \
         dropped {dropped}, {after:?}"
    );
    assert!(generations >= 50 && forks >= 10, "{generations} {forks}");
    assert!(taken > 1000, "{after:?}");
    assert_eq!(taken, drained + dropped, "{after:?}");
    assert!(after.foreign_signals > 0, "{after:?}");
    assert!(
        after.stale_roots > 0,
        "the kept root was entered: {after:?}"
    );
    assert_eq!(after.threads, 0, "{after:?}");
}

#[path = "support/soak_mix.rs"]
mod soak_mix;

/// Issue 42's gate: the realistic mix (docs/bounds.md) for 60 s; after 20 s of warm-up no
/// structure that grows with what the host does grows any more, beyond what its bound
/// allows in flight. (The long run of the same mix, with the RSS slope, is
/// `benches/soak.rs`; figures in docs/bounds.md.)
#[test]
fn every_structure_is_flat_after_warm_up_under_the_realistic_mix() {
    let _turn = common::turn();
    let done = common::abort_if_hung("soak mix", Duration::from_secs(180));
    let dir = soak_mix::fresh_dir("soak-mix");
    let mix = soak_mix::Mix::start(&dir, Duration::from_micros(500));
    std::thread::sleep(Duration::from_secs(20));
    let warm = mix.snapshot();
    eprintln!("{}", warm.line());
    let mut last = warm.clone();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_secs(10));
        last = mix.snapshot();
        eprintln!("{}", last.line());
    }
    let (forks, bad_forks, uploads) = (
        mix.forks.load(Ordering::Relaxed),
        mix.bad_forks.load(Ordering::Relaxed),
        mix.uploads(),
    );
    mix.stop();
    done.store(true, Ordering::Relaxed);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(last.roots - warm.roots > 10_000, "the mix ran: {last:?}");
    assert!(
        forks >= 10 && bad_forks == 0,
        "{forks} forks, {bad_forks} bad"
    );
    assert!(uploads > 0, "profiles reached the stand-in");
    // What each may still move by after warm-up: label slots by a reclaim batch per
    // thread that holds one (72), the counter table by its shards' free lists meeting
    // (a few per shard), thread slots and mirrors by the churned threads alive at once;
    // the rest must not move beyond what is in flight.
    let allowed = |name: &str| -> u64 {
        match name {
            "label_slots" => soak_mix::LABEL_THREADS * 72,
            "counter_slots" => 64 * 4,
            "thread_slots" | "mirrors" => soak_mix::CHURN_THREADS,
            "in_limbo" | "parked" | "evidence" => u64::MAX, // in flight: bounded by the above
            "name_cache" => 512 * (soak_mix::LABEL_THREADS + 1),
            "ring_kib" => soak_mix::CHURN_THREADS * 64,
            // Per interval or in flight, each capped (docs/bounds.md).
            "schedstat_fds" | "agg_keys" | "queue_kib" | "scope_spill" => u64::MAX,
            // Named addresses grow with the code reached, at most 32,768 a file.
            "symbol_cache" => u64::MAX,
            _ => 0,
        }
    };
    for ((name, before), (_, after)) in warm.sizes().into_iter().zip(last.sizes()) {
        assert!(
            after <= before.saturating_add(allowed(name)),
            "{name} grew after warm-up: {before} -> {after}\n{}\n{}",
            warm.line(),
            last.line()
        );
    }
    assert_eq!(last.health.record.labels_refused, 0);
    assert_eq!(
        last.health.record.span_names,
        otel_profiling::MAX_SPAN_NAMES as u64
    );
}

/// The soak bench's slope: exact on a line, and on a random walk (each point the last
/// plus noise, as RSS read every few seconds is) the interval that allows for correlated
/// points is the wider one.
#[test]
fn the_rss_slope_and_its_intervals() {
    let line: Vec<(f64, f64)> = (0..100).map(|i| (i as f64, 3.0 + 0.5 * i as f64)).collect();
    let fit = soak_mix::slope_ci(&line).expect("a fit");
    assert!((fit.slope - 0.5).abs() < 1e-9 && fit.ols_half < 1e-6);

    // A deterministic walk: steps of ±1 from a linear congruential generator.
    let mut state = 12_345_u64;
    let mut y = 0.0;
    let walk: Vec<(f64, f64)> = (0..600)
        .map(|i| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            y += if state >> 63 == 0 { 1.0 } else { -1.0 };
            (i as f64, y)
        })
        .collect();
    let fit = soak_mix::slope_ci(&walk).expect("a fit");
    assert!(fit.lag >= 1);
    assert!(
        fit.hac_half > 2.0 * fit.ols_half,
        "correlated points widen the interval: {fit:?}"
    );

    // Net of a cache filling ever more slowly (√t entries of 0.25 each) beside a real
    // growth of 0.1 an hour: the fit finds both, where the plain slope blames time for all.
    let filling: Vec<(f64, f64, f64)> = (0..500)
        .map(|i| {
            let t = 1.0 + i as f64 / 100.0;
            let entries = 1_000.0 * t.sqrt();
            (t, 20.0 + 0.1 * t + 0.25 * entries, entries)
        })
        .collect();
    let plain =
        soak_mix::slope_ci(&filling.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>()).expect("a fit");
    let (net, per_entry) = soak_mix::slope_net_of(&filling).expect("a fit");
    assert!(plain.slope > 10.0, "{plain:?}");
    assert!((net.slope - 0.1).abs() < 1e-6, "{net:?}");
    assert!((per_entry - 0.25).abs() < 1e-6, "{per_entry}");
}
