//! Production-sized profiles against the stand-in enforcing Pyroscope's limits: nothing
//! refused for good, nothing lost.
//!
//! * A real run (2 busy threads, hundreds of distinct root spans, 250 Hz) against the
//!   stand-in with every limit lowered 10x: its interval holds more samples than a profile
//!   may, so the exporter must split; every sample taken arrives.
//! * A 40,000-sample interval (5.5 MB uncompressed: over both of Pyroscope's per-profile
//!   limits) through the exporter into the stand-in at Pyroscope's real limits.
//!
//! At the kernel's ~100 CPU-timer signals per second per thread here, a real interval of
//! more than 16,000 samples would take minutes; the real run therefore uses the lowered
//! limits (and runs until its interval holds 1.5x the samples a profile may), and the
//! synthetic interval covers the real ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::trace::SdkTracerProvider;
use otel_profiling::collector::{EncodedProfile, ProfileKind, ProfileSink};
use otel_profiling::export::pyroscope::{PyroscopeConfig, PyroscopeExporter, PyroscopeLimits};
use otel_profiling::pprof::{self, FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
use otel_profiling::{Profiler, ProfilingContext};
use otel_profiling_integration_tests::standin::{Limits, StandIn};

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain FFI with an out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One request's CPU work, in its own function so the stacks name it.
#[inline(never)]
fn handle_request(cpu: Duration) -> u64 {
    let start = thread_cpu();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    while thread_cpu() - start < cpu {
        for _ in 0..1_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    std::hint::black_box(x)
}

#[test]
fn a_real_run_over_a_tenth_of_pyroscopes_limits_arrives_whole() {
    let limits = Limits::scaled_down(10);
    let standin = StandIn::start_with_limits(limits.clone()).expect("stand-in");
    let ours = PyroscopeLimits::default()
        .with_max_samples_per_profile(PyroscopeLimits::default().max_samples_per_profile / 10)
        .with_max_profile_bytes(PyroscopeLimits::default().max_profile_bytes / 10)
        .with_max_push_bytes(PyroscopeLimits::default().max_push_bytes / 10);
    let enough = (ours.max_samples_per_profile as u64) * 3 / 2;
    let exporter = PyroscopeExporter::new(
        PyroscopeConfig::new(standin.url(), "scale-test")
            .with_limits(ours)
            .with_shutdown_timeout(Duration::from_secs(60)),
    )
    .expect("exporter");
    let exporter_stats = exporter.stats();
    let mut profiler = Some(
        Profiler::builder()
            .frequency_hz(250)
            .interval(Duration::from_secs(60))
            .local_files(false)
            .sink(exporter)
            .start()
            .expect("profiler"),
    );
    let provider = SdkTracerProvider::builder().build();
    let tracer = provider.tracer("scale");
    // Until the interval holds half again the samples a profile may (one signal is one
    // distinct sample: every request is its own root), at most 90 s. About 11 s on a
    // quiet machine; a loaded one folds late timer expirations into fewer signals, so a
    // fixed duration could leave the interval under the limits.
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let tracer = tracer.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let _ = otel_profiling::sampler::register_current_thread();
                let mut requests = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("GET /items/{}", requests % 200);
                    let span = tracer.start(name.clone());
                    let cx = ProfilingContext::new(Context::current_with_span(span), &name);
                    cx.in_scope(|| handle_request(Duration::from_millis(3 + w)));
                    cx.context().span().end();
                    requests += 1;
                }
                requests
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    while profiler.as_ref().map_or(0, |p| p.stats().sampler.taken) < enough
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let requests: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    // Stop sampling and write the interval's profile; then let the exporter send it all.
    let profiler = profiler.take().expect("profiler");
    let sampler = profiler.stats().sampler;
    let stats = profiler.shutdown(Duration::from_secs(60));
    let sampler_end = otel_profiling::sampler::stats();
    let exported = exporter_stats.snapshot();
    let received: i64 = standin.samples().iter().map(|s| s.value).sum();
    let period = 1_000_000_000 / 250;
    let counters = standin.push_counters();
    eprintln!(
        "{requests} requests; sampler {sampler:?} → {sampler_end:?}; profiler {stats:?}; \
         exporter {exported:?}; stand-in: {} samples stored, {counters:?}",
        standin.sample_count()
    );
    assert!(
        requests >= 200,
        "hundreds of distinct root spans: {requests}"
    );
    assert_eq!(sampler_end.dropped, 0, "{sampler_end:?}");
    assert!(
        exported.profiles_split >= 1,
        "an interval over the limits was split: {exported:?}"
    );
    assert_eq!(
        (
            exported.profiles_dropped,
            exported.profiles_failed,
            exported.profiles_queued
        ),
        (0, 0, 0),
        "every push accepted in the end: {exported:?}"
    );
    assert_eq!(
        received / period,
        sampler_end.periods as i64,
        "samples received == samples taken (weighted), none dropped"
    );
}

/// A 40,000-sample interval (over Pyroscope's sample and size limits) into the stand-in at
/// Pyroscope's real limits: accepted whole.
#[test]
fn a_large_interval_is_accepted_whole_at_pyroscopes_limits() {
    let standin = StandIn::start().expect("stand-in");
    let mut exporter = PyroscopeExporter::new(
        PyroscopeConfig::new(standin.url(), "scale-test")
            .with_shutdown_timeout(Duration::from_secs(60))
            .with_max_queue_bytes(64 << 20),
    )
    .expect("exporter");
    let stats = exporter.stats();
    let start = SystemTime::now();
    let mut builder = ProfileBuilder::new(4_000_000, start, Duration::from_secs(10));
    let mut total = 0i64;
    for i in 0..40_000u64 {
        let stack: Vec<SymbolizedFrame> = (0..20u64)
            .map(|d| {
                let f = (i % 251) * 32 + d;
                SymbolizedFrame {
                    address: 0x10_0000 + f * 16,
                    lines: vec![FrameLine {
                        function: format!("service::module_{}::function_{f}", f % 17).into(),
                        file: Some("src/service.rs".into()),
                        line: Some(f as u32),
                    }],
                }
            })
            .collect();
        let count = 1 + i % 4;
        total += count as i64 * 4_000_000;
        builder.add_sample(
            &stack,
            &SampleLabels {
                span_id: Some(0x1_0000 + i),
                trace_id: Some(u128::from(i) << 64 | 1),
                span_name: Some(format!("GET /items/{}", i % 40).into()),
            },
            count,
        );
    }
    let profile = builder.build();
    let profile = EncodedProfile {
        kind: ProfileKind::Cpu,
        start,
        duration: Duration::from_secs(10),
        samples: 40_000,
        gzip_pprof: pprof::encode_gzip(&profile).expect("encode"),
    };
    exporter.export(&profile).expect("export");
    drop(exporter);
    let s = stats.snapshot();
    let received: i64 = standin.samples().iter().map(|s| s.value).sum();
    eprintln!("{s:?}; stand-in {:?}", standin.push_counters());
    assert_eq!((s.profiles_dropped, s.profiles_failed), (0, 0), "{s:?}");
    assert!(s.profiles_split == 1 && s.split_parts >= 3, "{s:?}");
    assert_eq!(standin.sample_count(), 40_000);
    assert_eq!(received, total, "every sample's value arrived");
}
