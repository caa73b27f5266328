//! CPU reported for a span equals the thread CPU it burned, at every rate — also above
//! the kernel tick, where one signal stands for several periods (`si_overrun`). Before
//! samples were weighted, 500 Hz reported half and 1000 Hz a quarter of the CPU.

mod common;

use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::{CpuEvidenceProcessor, ProfilingContext, CPU_TIME_ATTRIBUTE};

#[inline(never)]
fn burn(d: Duration) -> u64 {
    let start = common::thread_cpu_time();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    while common::thread_cpu_time() - start < d {
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    std::hint::black_box(x)
}

#[test]
fn span_cpu_is_within_5_percent_of_the_thread_cpu_at_every_rate() {
    let _turn = common::turn();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(CpuEvidenceProcessor::new(SimpleSpanProcessor::new(
            exporter.clone(),
        )))
        .build();
    let tracer = provider.tracer("accuracy");
    let mut report = Vec::new();
    for hz in [20u32, 100, 250, 400, 500, 1000] {
        // Drained once at the end here: room for every record of the run.
        let config = SamplerConfig::default()
            .with_frequency_hz(hz)
            .with_ring_capacity(4096);
        let sampler = Sampler::start(config).expect("start");
        sampler.register_current_thread().expect("register");
        sampler.drain(|_| {});
        let before = sampler.stats();
        // At least 40 periods, so one period of phase error is under 2.5 %.
        let work = Duration::from_secs(1).max(Duration::from_secs(40) / hz);
        let name = format!("burn at {hz} Hz");
        let span = tracer.start(name.clone());
        let cx = ProfilingContext::new(Context::current_with_span(span), &name);
        let burned = cx.in_scope(|| {
            let start = common::thread_cpu_time();
            burn(work);
            common::thread_cpu_time() - start
        });
        cx.context().span().end();
        let after = sampler.stats();
        let mut weighted = 0u64;
        sampler.drain(|r| weighted += u64::from(r.weight));
        drop(sampler);
        let spans = exporter.get_finished_spans().expect("spans");
        let span = spans
            .iter()
            .find(|s| s.name == name)
            .expect("span exported");
        let reported = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == CPU_TIME_ATTRIBUTE)
            .and_then(|kv| match kv.value {
                opentelemetry::Value::I64(v) => Some(v as f64 / 1e9),
                _ => None,
            })
            .expect("cpu time attribute");
        let burned = burned.as_secs_f64();
        let period = 1.0 / f64::from(hz);
        let signals = after.taken - before.taken;
        let periods = after.periods - before.periods;
        report.push(format!(
            "{hz:>4} Hz: burned {burned:.3} s, span reports {reported:.3} s ({:+.1} %), {signals} signals for {periods} periods, drained weight {:.3} s",
            (reported / burned - 1.0) * 100.0,
            weighted as f64 * period
        ));
        assert!(
            (reported - burned).abs() <= burned * 0.05,
            "{hz} Hz: span reports {reported:.3} s for {burned:.3} s burned\n{}",
            report.join("\n")
        );
        assert!(
            (weighted as f64 * period - burned).abs() <= burned * 0.05,
            "{hz} Hz: profile weight {weighted} periods for {burned:.3} s"
        );
    }
    eprintln!("{}", report.join("\n"));
}
