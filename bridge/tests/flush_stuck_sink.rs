//! `flush()` while a sink is stuck keeps nothing per call: each call used to leave a
//! channel in the collector until its interval reached the sinks, that is forever while
//! the sink never returned (issue 42, one `Sender` a call). Flushes now take a ticket on
//! one board, and one interval answers every flush asked before it ended. Measured on a
//! counting allocator (live heap bytes), not on RSS. (Own test binary: the allocator and
//! the sampler are process-wide.)

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use otel_profiling::collector::{EncodedProfile, ProfileSink};
use otel_profiling::Profiler;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Blocks in `export` until released, saying when it is stuck.
struct StuckSink {
    stuck: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
}

impl ProfileSink for StuckSink {
    fn export(&mut self, _: &EncodedProfile) -> std::io::Result<()> {
        self.stuck.store(true, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }
}

#[test]
fn flushes_against_a_stuck_sink_keep_nothing_and_share_one_answer() {
    let (stuck, release) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let profiler = Arc::new(
        Profiler::builder()
            .interval(Duration::from_secs(60))
            .local_files(false)
            .blocked_watchdog(None)
            .sink(StuckSink {
                stuck: stuck.clone(),
                release: release.clone(),
            })
            .start()
            .expect("profiler"),
    );
    // A profile with samples (an empty one goes to no sink), then the sink is stuck.
    let start = Instant::now();
    while !stuck.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20) {
        common::burn(Duration::from_millis(50));
        let _ = profiler.flush(Duration::from_millis(1));
    }
    assert!(stuck.load(Ordering::SeqCst), "no profile reached the sink");
    // One interval queued behind it, one held: the encoder takes no more.
    for _ in 0..2 {
        common::burn(Duration::from_millis(20));
        assert!(
            !profiler.flush(Duration::from_millis(50)),
            "the sink is stuck"
        );
    }

    let calls = 20_000;
    let settle = || {
        assert!(!profiler.flush(Duration::from_millis(100)));
        std::thread::sleep(Duration::from_millis(300));
    };
    settle();
    let before = LIVE.load(Ordering::SeqCst);
    for _ in 0..calls {
        assert!(!profiler.flush(Duration::ZERO), "the sink is stuck");
    }
    settle();
    let grown = LIVE.load(Ordering::SeqCst).saturating_sub(before);
    eprintln!("{calls} flushes against a stuck sink: {grown} live bytes more");
    // The old channel a call kept about 540 bytes: 10.8 MB here (112 bytes now).
    assert!(
        grown < 256 << 10,
        "{grown} bytes kept by {calls} flushes of a stuck sink"
    );

    // Waiters with time to spare all hear when the sink comes back.
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let profiler = profiler.clone();
            std::thread::spawn(move || profiler.flush(Duration::from_secs(20)))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    release.store(true, Ordering::SeqCst);
    for waiter in waiters {
        assert!(waiter.join().expect("waiter"), "a waiter was not told");
    }
    let stats = profiler.stats();
    assert_eq!(stats.profiles_failed, 0, "{stats:?}");
}
