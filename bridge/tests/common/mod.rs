//! Helpers shared by the test binaries that run the (process-wide) profiler.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());

/// The sampler is process-wide (one SIGPROF owner): tests of one binary take turns.
pub fn turn() -> MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// CPU time of the calling thread, so CPU work lasts the same whatever else the machine runs.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain FFI with an out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
