//! A sink that blocks (a slow disk, a stalled network write inside a user's sink) costs
//! late profiles, never samples: the collector keeps draining the threads' buffers while
//! the encoder waits on the sink. Before the encoder thread, one 1.5 s stall filled every
//! busy thread's buffer (45 records at 100 Hz) and dropped about 100 samples.
//!
//! A sink that stalls for longer than two intervals past a profile's due hand-over costs
//! the samples after that, so that memory stays bounded; they are drained all the same
//! and counted, never lost unseen. (Own test binary: the sampler's counters are
//! process-wide.)

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::{sampler, Profiler, ProfilerStats};

/// Blocks on its first profile until released or `stall` passed, then counts the samples
/// it is given.
struct StallingSink {
    stall: Duration,
    stalled: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
    samples: Arc<AtomicU64>,
    /// The longest profile's duration, in nanoseconds.
    longest_ns: Arc<AtomicU64>,
}

impl ProfileSink for StallingSink {
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        if !self.stalled.swap(true, Ordering::SeqCst) {
            let start = Instant::now();
            while !self.release.load(Ordering::SeqCst) && start.elapsed() < self.stall {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.samples.fetch_add(profile.samples, Ordering::SeqCst);
        let ns = u64::try_from(profile.duration.as_nanos()).unwrap_or(u64::MAX);
        self.longest_ns.fetch_max(ns, Ordering::SeqCst);
        Ok(())
    }
}

/// Busy on a sampled thread through the first profile and a sink stall (up to `stall`,
/// or until `release_when` says so), and a little after; returns the counters once every
/// sample reached the profiles, the samples the sink was given and the longest profile.
fn busy_through_a_stall(
    interval: Duration,
    stall: Duration,
    release_when: impl Fn(&ProfilerStats) -> bool,
) -> (ProfilerStats, u64, Duration) {
    let (stalled, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (exported, longest_ns) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let profiler = Profiler::builder()
        .frequency_hz(100)
        .interval(interval)
        .local_files(false)
        .sink(StallingSink {
            stall,
            stalled: stalled.clone(),
            release: release.clone(),
            samples: exported.clone(),
            longest_ns: longest_ns.clone(),
        })
        .start()
        .expect("profiler");
    sampler::register_current_thread().expect("registered");
    let start = Instant::now();
    while !stalled.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
        common::burn(Duration::from_millis(20));
    }
    assert!(
        stalled.load(Ordering::SeqCst),
        "no profile reached the sink"
    );
    let stall_start = Instant::now();
    while stall_start.elapsed() < stall && !release_when(&profiler.stats()) {
        common::burn(Duration::from_millis(20));
    }
    release.store(true, Ordering::SeqCst);
    common::burn(Duration::from_millis(300));
    sampler::unregister_current_thread();
    assert!(profiler.flush(Duration::from_secs(10)), "flush");
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");
    let longest = Duration::from_nanos(longest_ns.load(Ordering::SeqCst));
    (stats, exported.load(Ordering::SeqCst), longest)
}

#[test]
fn a_stalled_sink_drops_no_sample() {
    let _turn = common::turn();
    let before = sampler::stats();
    // The stall (1.5 s) is well within two intervals (2 s each) past the held profile's
    // due time, even with a slow first naming pass: everything is kept.
    let (stats, exported, _) =
        busy_through_a_stall(Duration::from_secs(2), Duration::from_millis(1500), |_| {
            false
        });
    let (taken, dropped) = (
        stats.sampler.taken - before.taken,
        stats.sampler.dropped - before.dropped,
    );
    // At 100 Hz the stall alone is ~150 periods of this thread's CPU: three buffers' worth.
    assert!(taken >= 100, "too few samples to test: {stats:?}");
    assert_eq!(
        dropped, 0,
        "samples dropped while the sink stalled: {stats:?}"
    );
    assert_eq!(stats.dropped_encoder_busy, 0, "{stats:?}");
    assert_eq!(stats.samples_in_profiles, exported);
    assert_eq!(
        exported,
        stats.sampler.periods - before.periods,
        "every period sampled reached the profiles: {stats:?}"
    );
}

#[test]
fn a_sink_stalled_past_two_intervals_costs_counted_samples_and_bounded_memory() {
    let _turn = common::turn();
    let before = sampler::stats();
    // Intervals of 200 ms: the profile in progress is held for 400 ms past its due time,
    // then what is drained is counted and dropped; the sink is released once 80 periods
    // (0.8 s of this thread's CPU) were.
    let (stats, exported, longest) =
        busy_through_a_stall(Duration::from_millis(200), Duration::from_secs(20), |s| {
            s.dropped_encoder_busy >= 80
        });
    let periods = stats.sampler.periods - before.periods;
    assert_eq!(
        stats.sampler.dropped - before.dropped,
        0,
        "the buffers were still emptied: {stats:?}"
    );
    assert!(stats.dropped_encoder_busy >= 80, "{stats:?}");
    // The held profile ends where it stopped taking samples (~0.6-0.7 s after it began),
    // not at its late hand-over (1.4 s and more): the gap is the dropped count's.
    assert!(
        longest < Duration::from_millis(1000),
        "the held profile claims {longest:?}"
    );
    assert!(exported > 0 && stats.samples_in_profiles == exported);
    assert_eq!(
        exported + stats.dropped_encoder_busy,
        periods,
        "every period is in a profile or counted as dropped: {stats:?}"
    );
}
