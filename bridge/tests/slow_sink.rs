//! A sink that blocks (a slow disk, a stalled network write inside a user's sink) costs
//! late profiles, never samples: the collector keeps draining the threads' buffers while
//! the encoder waits on the sink. Before the encoder thread, one 1.5 s stall filled every
//! busy thread's buffer (45 records at 100 Hz) and dropped about 100 samples.
//! (Own test binary: the sampler's counters are process-wide.)

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::{sampler, Profiler};

const STALL: Duration = Duration::from_millis(1500);

/// Blocks on its first profile for [`STALL`], then counts the samples it is given.
struct StallingSink {
    stalled: Arc<AtomicBool>,
    samples: Arc<AtomicU64>,
}

impl ProfileSink for StallingSink {
    fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
        if !self.stalled.swap(true, Ordering::SeqCst) {
            std::thread::sleep(STALL);
        }
        self.samples.fetch_add(profile.samples, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_stalled_sink_drops_no_sample() {
    let stalled = Arc::new(AtomicBool::new(false));
    let exported = Arc::new(AtomicU64::new(0));
    let profiler = Profiler::builder()
        .frequency_hz(100)
        .interval(Duration::from_millis(200))
        .local_files(false)
        .sink(StallingSink {
            stalled: stalled.clone(),
            samples: exported.clone(),
        })
        .start()
        .expect("profiler");
    sampler::register_current_thread().expect("registered");
    // Busy through the first interval, the whole stall and a little after it.
    let start = Instant::now();
    while !stalled.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
        common::burn(Duration::from_millis(20));
    }
    assert!(
        stalled.load(Ordering::SeqCst),
        "no profile reached the sink"
    );
    common::burn(STALL + Duration::from_millis(300));
    sampler::unregister_current_thread();
    let stats = profiler.stats();
    assert!(profiler.shutdown(Duration::from_secs(10)), "shutdown");

    let sampler = stats.sampler;
    // At 100 Hz the stall alone is ~150 periods of this thread's CPU: three buffers' worth.
    assert!(sampler.taken >= 100, "too few samples to test: {sampler:?}");
    assert_eq!(
        sampler.dropped, 0,
        "samples dropped while the sink stalled: {sampler:?}"
    );
    // And they all reached the (late) profiles.
    let after = otel_profiling::sampler::stats();
    assert_eq!(after.dropped, 0, "{after:?}");
    assert!(
        exported.load(Ordering::SeqCst) >= sampler.taken,
        "profiles hold {} samples of {} taken",
        exported.load(Ordering::SeqCst),
        sampler.taken
    );
}
