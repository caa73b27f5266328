//! Links the `SIGPROF` handler into a binary and takes samples with it.
//!
//! Built by `.ci/run` in the `handler-proof` profile (fat LTO, one codegen unit,
//! `panic = "unwind"`) with the feature `check`, which puts `no_panic` on the handler's
//! body: every panic path the optimiser could not remove from it, or from anything it
//! calls, is then an undefined symbol, and the link fails naming the function. Starting
//! the sampler stores the handler's address in the `SIGPROF` disposition, so the handler is
//! linked whatever LTO removes. The run then checks that the handler, built this way,
//! samples: it burns CPU inside a span until a sample is taken (at most 5 s of CPU).

use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceId};
use otel_profiling::sampler::{Sampler, SamplerConfig};
use otel_profiling::{LocalRoot, SpanContextGuard};

fn main() {
    let sampler = match Sampler::start(SamplerConfig::default().with_frequency_hz(1000)) {
        Ok(sampler) => sampler,
        Err(err) => fail(&format!("the sampler did not start: {err}")),
    };
    if let Err(err) = sampler.register_current_thread() {
        fail(&format!("this thread was not registered: {err}"));
    }
    let root = LocalRoot::new(SpanId::from(7), TraceId::from(9), None);
    let guard = SpanContextGuard::enter(Some(&root));
    let start = Instant::now();
    let mut work = 0u64;
    while sampler.stats().taken < 3 && start.elapsed() < Duration::from_secs(5) {
        for i in 0..100_000u64 {
            work = std::hint::black_box(work.wrapping_mul(31).wrapping_add(i));
        }
    }
    drop(guard);
    let (mut records, mut labelled, mut deepest) = (0usize, 0usize, 0usize);
    sampler.drain(|record| {
        records += 1;
        labelled += usize::from(record.root == Some(root.label()));
        deepest = deepest.max(record.frames().len());
    });
    let stats = sampler.stats();
    println!(
        "handler-proof: {} samples taken, {records} drained ({labelled} under the span, \
         deepest stack {deepest} frames), {} truncated",
        stats.taken, stats.truncated
    );
    if records == 0 || labelled == 0 || deepest < 2 {
        fail("the handler took no labelled sample with a stack");
    }
}

fn fail(why: &str) -> ! {
    eprintln!("handler-proof: {why}");
    std::process::exit(1)
}
