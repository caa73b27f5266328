//! A sink that blocks (a slow disk, a stalled network write inside a user's sink) costs
//! late profiles, never samples: the collector keeps draining the threads' buffers while
//! the encoder waits on the sink. Before the encoder thread, one 1.5 s stall filled every
//! busy thread's buffer (45 records at 100 Hz) and dropped about 100 samples.
//!
//! A sink that stalls for longer than three intervals costs the samples after that, so
//! that memory stays bounded; they are drained all the same and counted, never lost
//! unseen. (Own test binary: the sampler's counters are process-wide.)

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::{sampler, Profiler, ProfilerStats};

/// Blocks on its first profile for `stall`, then counts the samples it is given.
struct StallingSink {
    stall: Duration,
    stalled: Arc<AtomicBool>,
    samples: Arc<AtomicU64>,
}

impl ProfileSink for StallingSink {
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        if !self.stalled.swap(true, Ordering::SeqCst) {
            std::thread::sleep(self.stall);
        }
        self.samples.fetch_add(profile.samples, Ordering::SeqCst);
        Ok(())
    }
}

/// Busy on a sampled thread through the first profile, a sink stall of `stall` and a
/// little after; returns the counters once every sample reached the profiles, and the
/// samples the sink was given.
fn busy_through_a_stall(interval: Duration, stall: Duration) -> (ProfilerStats, u64) {
    let stalled = Arc::new(AtomicBool::new(false));
    let exported = Arc::new(AtomicU64::new(0));
    let profiler = Profiler::builder()
        .frequency_hz(100)
        .interval(interval)
        .local_files(false)
        .sink(StallingSink {
            stall,
            stalled: stalled.clone(),
            samples: exported.clone(),
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
    common::burn(stall + Duration::from_millis(300));
    sampler::unregister_current_thread();
    assert!(profiler.flush(Duration::from_secs(10)), "flush");
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");
    (stats, exported.load(Ordering::SeqCst))
}

#[test]
fn a_stalled_sink_drops_no_sample() {
    let _turn = common::turn();
    let before = sampler::stats();
    // The stall (1.5 s) is shorter than three intervals: everything is kept.
    let (stats, exported) =
        busy_through_a_stall(Duration::from_secs(1), Duration::from_millis(1500));
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
fn a_sink_stalled_past_three_intervals_costs_counted_samples_and_bounded_memory() {
    let _turn = common::turn();
    let before = sampler::stats();
    // Intervals of 200 ms: the interval in progress is held for 600 ms, then what is
    // drained is counted and dropped until the sink returns (2 s after it stalled).
    let (stats, exported) =
        busy_through_a_stall(Duration::from_millis(200), Duration::from_secs(2));
    let periods = stats.sampler.periods - before.periods;
    assert_eq!(
        stats.sampler.dropped - before.dropped,
        0,
        "the buffers were still emptied: {stats:?}"
    );
    // About 1.4 s of this thread's 100 Hz samples (144 in a run on 2 idle cores).
    assert!(
        stats.dropped_encoder_busy >= 50,
        "a stall of ten intervals drops: {stats:?}"
    );
    assert!(exported > 0 && stats.samples_in_profiles == exported);
    assert_eq!(
        exported + stats.dropped_encoder_busy,
        periods,
        "every period is in a profile or counted as dropped: {stats:?}"
    );
}
