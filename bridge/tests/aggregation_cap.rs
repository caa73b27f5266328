//! One interval's aggregation holds at most `aggregation_max_keys` keys (plus an eighth
//! for unlabelled stacks, plus one): under a root per request every sample was a new key,
//! so the map grew with the traffic (issue 42). Past the cap the samples lose their span
//! labels, never their CPU time, and both are counted. (Own test binary: the sampler is
//! process-wide.)

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId};
use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::{sampler, LocalRoot, Profiler, SpanContextGuard};

/// Keeps every profile it is given.
struct Keep(Arc<Mutex<Vec<EncodedProfile>>>);

impl ProfileSink for Keep {
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(profile.clone());
        Ok(())
    }
}

#[test]
fn past_the_cap_samples_lose_their_labels_not_their_time() {
    const CAP: usize = 8;
    let kept = Arc::new(Mutex::new(Vec::new()));
    let before = sampler::stats();
    let profiler = Profiler::builder()
        .frequency_hz(250)
        .interval(Duration::from_secs(30))
        .aggregation_max_keys(CAP)
        .local_files(false)
        .blocked_watchdog(None)
        .sink(Keep(kept.clone()))
        .start()
        .expect("profiler");
    // 40 roots of ~5 samples each, all in one interval: far more keys than the cap.
    for n in 1..=40u64 {
        let root = LocalRoot::new(SpanId::from(n), TraceId::from(u128::from(n)), None);
        let _entered = SpanContextGuard::enter(Some(&root));
        common::burn(Duration::from_millis(20));
    }
    sampler::unregister_current_thread();
    assert!(profiler.flush(Duration::from_secs(10)), "flush");
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");

    let periods = stats.sampler.periods - before.periods;
    assert!(periods >= 100, "too few samples to test: {stats:?}");
    assert!(
        stats.aggregation_keys as usize <= CAP + CAP / 8 + 1,
        "{stats:?}"
    );
    assert!(stats.aggregation_keys as usize > CAP, "{stats:?}");
    assert!(stats.aggregation_folded > 0, "{stats:?}");
    assert_eq!(
        stats.samples_in_profiles, periods,
        "every period is in the profile, labelled or not: {stats:?}"
    );

    let kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut span_ids, mut unlabelled) = (HashSet::new(), 0i64);
    for encoded in kept.iter() {
        let profile = otel_profiling_pprof::decode(&encoded.gzip_pprof).expect("pprof");
        let s = |i: i64| profile.string_table[i as usize].clone();
        for sample in &profile.sample {
            match sample.label.iter().find(|l| s(l.key) == "span_id") {
                Some(label) => {
                    span_ids.insert(s(label.str));
                }
                None => unlabelled += sample.value[0],
            }
        }
    }
    // At most one root a key; fewer roots than the 40 kept their labels.
    assert!(
        span_ids.len() <= CAP && !span_ids.is_empty(),
        "{span_ids:?}"
    );
    let period_ns = 4_000_000;
    assert!(
        unlabelled / period_ns >= stats.aggregation_folded as i64,
        "the folded periods are in the profile without labels: {unlabelled} ns, {stats:?}"
    );
}
