//! Nanoseconds per root span lifecycle (create, 4 polls, close) for the set-ups of
//! `span_lifecycle_instructions`, timed in alternating rounds in one process.
//!
//! Criterion times one set-up after the other, so on a shared machine a change of load
//! between two set-ups' runs becomes a difference between them (its ratios here moved by
//! ±30 % from run to run). This bench interleaves instead: every round times a short
//! batch of lifecycles of each set-up, in an order rotated by one each round, and the
//! ratio to the baseline is taken within the round, so each ratio compares two batches
//! that ran a millisecond apart. The median over rounds, with the quartiles beside it, is
//! what is printed.
//!
//! The sampler runs at 100 Hz with the thread registered for the whole run, so every
//! set-up, the baseline too, takes the same signals; `processor` (which only differs from
//! `bridge` by having no sampler) is left out. The OTEP 4947 thread context is turned on
//! only around `bridge-threadctx`'s batches.
//!
//! Run: `cargo bench -p otel-profiling --bench span_lifecycle_interleaved`
//! (`SPAN_LIFECYCLE_ROUNDS`, default 400, sets the number of rounds;
//! `SPAN_LIFECYCLE_SETUPS=otel,layer` times only the set-ups named, for a profiler).

mod lifecycle_setups;

use std::time::Instant;

use lifecycle_setups::{baseline_of, needs_sampler, needs_thread_ctx, Setup, SETUPS};
use otel_profiling::sampler::{Sampler, SamplerConfig};

/// Lifecycles per set-up per round: about a millisecond, long enough that the clock
/// reads and the switch of subscriber are noise, short enough that load changes little
/// within a round.
const PER_ROUND: u32 = 400;
const DEFAULT_ROUNDS: usize = 400;

fn median(sorted: &[f64]) -> f64 {
    quantile(sorted, 0.5)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it too: only time when
    // benchmarking.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds = std::env::var("SPAN_LIFECYCLE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS)
        .max(1);
    let sampler = Sampler::start(SamplerConfig::default().with_frequency_hz(100))
        .and_then(|sampler| sampler.register_current_thread().map(|()| sampler));
    let sampler = match sampler {
        Ok(sampler) => Some(sampler),
        Err(err) => {
            println!("the sampler did not start ({err}): the bridge set-ups are skipped");
            None
        }
    };
    let only = std::env::var("SPAN_LIFECYCLE_SETUPS").ok();
    let chosen = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    let thread_ctx = otel_profiling::thread_ctx::enable().is_ok();
    otel_profiling::thread_ctx::disable();
    let names: Vec<&str> = SETUPS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| *name != "processor" && chosen(name))
        .filter(|name| sampler.is_some() || !needs_sampler(name))
        .filter(|name| thread_ctx || !needs_thread_ctx(name))
        .collect();
    let setups: Vec<Setup> = names.iter().map(|name| Setup::new(name)).collect();

    let time = |i: usize| -> f64 {
        let threadctx = needs_thread_ctx(names[i]);
        if threadctx {
            let _ = otel_profiling::thread_ctx::enable();
        }
        let start = Instant::now();
        setups[i].run(PER_ROUND);
        let ns = start.elapsed().as_nanos() as f64 / f64::from(PER_ROUND);
        if threadctx {
            otel_profiling::thread_ctx::disable();
        }
        ns
    };
    // Warm-up: caches, the registries' slabs, the SDK's id generators.
    for _ in 0..5 {
        for i in 0..setups.len() {
            time(i);
        }
    }
    let mut ns = vec![Vec::with_capacity(rounds); setups.len()];
    for round in 0..rounds {
        for k in 0..setups.len() {
            let i = (round + k) % setups.len();
            ns[i].push(time(i));
        }
    }
    drop(sampler);

    println!(
        "ns per root span lifecycle (create, 4 polls, close), {rounds} interleaved rounds \
         of {PER_ROUND}; ratio = median over rounds of (set-up / baseline in the same round)"
    );
    println!(
        "  {:<17} {:>9} {:>8} {:>17}",
        "set-up", "median ns", "ratio", "ratio p25..p75"
    );
    for (i, name) in names.iter().enumerate() {
        let base = names.iter().position(|n| *n == baseline_of(name));
        let ratios = sorted(match base {
            Some(b) => ns[i].iter().zip(&ns[b]).map(|(o, b)| o / b).collect(),
            None => Vec::new(),
        });
        let what = SETUPS
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, what)| *what);
        println!(
            "  {name:<17} {:>9.0} {:>7.3}x {:>8.3}..{:<8.3} {what}",
            median(&sorted(ns[i].clone())),
            median(&ratios),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        );
    }
}
