//! How much of a thread's CPU time its samples stand for: one word per thread slot, so
//! that each sample carries the CPU time since the last one, measured, not counted.
//!
//! Why not `period × (1 + si_overrun)` per signal: under CPU contention Linux checks a
//! thread's CPU timer only at ticks where the thread is current, and (measured on 6.18,
//! 2 cores, 4 busy threads) a thread can run 100–170 ms of CPU between two signals. The
//! overrun count makes the *next* signal carry the missed periods, so process totals stay
//! right, but per sample the weight is off.
//!
//! So the ledger holds the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`, nanoseconds
//! since the thread started) up to which CPU time has been given to samples; the owner's
//! handler reads the clock at every signal (one async-signal-safe syscall, about 0.2 µs,
//! at most the sampling rate per thread) and moves the ledger forward to its reading.
//! A root's own CPU time is not the samples': the span hooks read it where its stretches
//! end (`record/span_context/active.rs`); the samples' is its fallback where those cannot
//! be read. The ledger only moves forward (compare-and-swap to a larger value), so a
//! reading that lags gives nothing.

use crate::sync::{AtomicU64, Ordering};

/// One thread slot's ledger. Reset by the slot's owner when it claims the slot (before
/// its timer is armed); moved forward by the owner's handler and by the watchdog.
#[derive(Debug, Default)]
pub(crate) struct CpuLedger {
    given_ns: AtomicU64,
}

impl CpuLedger {
    /// Starts the ledger at the calling (owner) thread's CPU clock: CPU time it spent
    /// before registering belongs to no root.
    pub(crate) fn reset(&self, now_ns: u64) {
        self.given_ns.store(now_ns, Ordering::Release);
    }

    /// Moves the ledger to `now_ns` if that is ahead of it and returns how far it moved
    /// (0 otherwise). Async-signal-safe: a compare-and-swap loop on one word.
    #[inline]
    pub(crate) fn advance(&self, now_ns: u64) -> u64 {
        let mut given = self.given_ns.load(Ordering::Acquire);
        loop {
            if now_ns <= given {
                return 0;
            }
            match self.given_ns.compare_exchange_weak(
                given,
                now_ns,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return now_ns - given,
                Err(seen) => given = seen,
            }
        }
    }
}

/// The calling thread's CPU clock in nanoseconds, or `None` if it cannot be read (a
/// seccomp profile refusing `clock_gettime` for CPU clocks). Async-signal-safe.
#[inline]
pub(crate) fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe; `ts` is a valid out-parameter.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_nanosecond_is_given_once_and_the_ledger_never_moves_back() {
        let ledger = CpuLedger::default();
        ledger.reset(1_000);
        assert_eq!(ledger.advance(1_500), 500);
        // A lagging reading gives nothing.
        assert_eq!(ledger.advance(1_200), 0);
        assert_eq!(ledger.advance(1_500), 0);
        assert_eq!(ledger.advance(2_000), 500);
    }

    #[test]
    fn racing_chargers_give_exactly_the_clocks_advance() {
        let ledger = std::sync::Arc::new(CpuLedger::default());
        ledger.reset(0);
        let given: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    let ledger = &ledger;
                    s.spawn(move || {
                        (0..10_000u64)
                            .map(|i| ledger.advance(i * 4 + t))
                            .sum::<u64>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("worker")).sum()
        });
        // The largest reading is 9_999 · 4 + 3; from 0, each nanosecond given once.
        assert_eq!(given, 39_999);
    }

    #[test]
    fn this_threads_clock_reads_and_moves_forward() {
        let before = thread_cpu_ns().expect("thread CPU clock");
        let mut x = 1u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(i | 1));
        }
        let after = thread_cpu_ns().expect("thread CPU clock");
        assert!(after > before, "{before} → {after}");
    }
}
