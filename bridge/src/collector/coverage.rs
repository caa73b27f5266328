//! Whether the profiles hold the process's CPU.
//!
//! A thread is sampled once it has a CPU timer: when it first enters a span, calls
//! [`register_current_thread`](crate::sampler::register_current_thread), or runs the runtime hooks,
//! and otherwise once the profiler's scan adopts it (`sampler::adopt`, each second). What
//! no timer covers (threads that live less than a scan period, threads that block
//! `SIGPROF`, adoption switched off) burns CPU that no profile holds. Without a check that
//! loss is silent: the profiles look whole. So every window (10 s) the
//! collector compares the CPU its samples stand for with what the kernel counts for the
//! process (`getrusage(RUSAGE_SELF)`), minus the CPU of the crate's own threads (collector,
//! encoder, watchdog, uploaders: never sampled, by design, and reported apart). Where the
//! samples hold under [`LOW_COVERAGE_PERMILLE`] of the rest, the window is counted
//! ([`ProfilerStats::cpu_low_coverage_windows`](crate::ProfilerStats)) and a line on stderr
//! says so and what to do (the first at once, then at most once an hour).
//!
//! Threads of other libraries that export spans (the OpenTelemetry SDK's batch processor)
//! count as the process's: their CPU is no span's, and it is missing from the profiles
//! like any unsampled thread's.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::CollectorStats;

/// The length of a window.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// Windows whose samples hold less than this share (per mille) of the process's CPU
/// (the crate's own threads left out) are counted and said.
pub(crate) const LOW_COVERAGE_PERMILLE: u64 = 800;

/// A window is judged only when the process (its own threads left out) used at least
/// this many sampling periods of CPU in it: fewer is sampling noise.
const MIN_PERIODS: u64 = 50;

/// Time between two warnings.
const WARN_EVERY: Duration = Duration::from_secs(3600);

/// Tids of the crate's live threads (0: free).
static OWN: [AtomicI32; 16] = [const { AtomicI32::new(0) }; 16];
/// CPU of the crate's threads that have ended, nanoseconds.
static OWN_ENDED_NS: AtomicU64 = AtomicU64::new(0);

/// Marks the calling thread as one of the crate's own (never sampled, its CPU reported
/// apart) until the guard drops. Past 16 live threads, a thread is not counted as the
/// crate's (its CPU reads as the process's: never more warnings than the truth allows
/// for 16 threads' worth).
pub(crate) fn own_thread() -> OwnThread {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let slot = OWN.iter().position(|slot| {
        slot.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    // Never adopted by the sampler's scan either (past the 16 counted here too), and its
    // allocations are never sampled.
    crate::sampler::adopt::decline_current_thread();
    crate::allocations::exclude_current_thread();
    OwnThread { slot, tid }
}

/// Whether thread `tid` is one of the crate's own (never sampled, never adopted).
pub(crate) fn is_own_thread(tid: libc::pid_t) -> bool {
    OWN.iter().any(|slot| slot.load(Ordering::Acquire) == tid)
}

/// Keeps the calling thread among the crate's own (see [`own_thread`]).
pub(crate) struct OwnThread {
    slot: Option<usize>,
    tid: libc::pid_t,
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            let spent = thread_cpu_ns(self.tid).unwrap_or(0);
            OWN[slot].store(0, Ordering::Release);
            OWN_ENDED_NS.fetch_add(spent, Ordering::Relaxed);
        }
    }
}

/// CPU of the crate's threads so far, live and ended, nanoseconds.
fn own_threads_ns() -> u64 {
    let live: u64 = OWN
        .iter()
        .map(|slot| slot.load(Ordering::Acquire))
        .filter(|&tid| tid != 0)
        .filter_map(thread_cpu_ns)
        .sum();
    OWN_ENDED_NS.load(Ordering::Relaxed) + live
}

use crate::sampler::watchdog::thread_cpu_ns;

/// The process's CPU time (user and system, all threads, live and ended), nanoseconds.
fn process_ns() -> Option<u64> {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-parameter.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    Some(ns(usage.ru_utime) + ns(usage.ru_stime))
}

/// The collector's window in progress.
pub(crate) struct Coverage {
    window: Duration,
    period_ns: u64,
    start: Option<(Instant, u64, u64)>,
    sampled_periods: u64,
    warned: Option<Instant>,
    adopting: bool,
}

impl Coverage {
    /// `adopting`: whether the profiler samples threads that never register
    /// (`sampler::adopt`), which changes what a low share means.
    pub(crate) fn new(window: Duration, period_ns: u64, adopting: bool) -> Coverage {
        Coverage {
            window,
            period_ns: period_ns.max(1),
            start: None,
            sampled_periods: 0,
            warned: None,
            adopting,
        }
    }

    /// Periods of CPU drained from the sampled threads.
    pub(crate) fn add_sampled(&mut self, periods: u64) {
        self.sampled_periods = self.sampled_periods.saturating_add(periods);
    }

    /// At each drain tick: ends the window when it is due, judges it, starts the next.
    pub(crate) fn check(&mut self, stats: &CollectorStats) {
        let now = Instant::now();
        let Some((since, process_at, own_at)) = self.start else {
            self.restart(now);
            return;
        };
        if now.duration_since(since) < self.window {
            return;
        }
        let (Some(process), own) = (process_ns(), own_threads_ns()) else {
            self.restart(now);
            return;
        };
        let process_delta = process.saturating_sub(process_at);
        let own_delta = own.saturating_sub(own_at).min(process_delta);
        let eligible = process_delta - own_delta;
        let sampled = self.sampled_periods.saturating_mul(self.period_ns);
        stats
            .cpu_process_ns
            .fetch_add(process_delta, Ordering::Relaxed);
        stats
            .cpu_own_threads_ns
            .fetch_add(own_delta, Ordering::Relaxed);
        stats.cpu_sampled_ns.fetch_add(sampled, Ordering::Relaxed);
        if eligible >= MIN_PERIODS * self.period_ns {
            let permille = (u128::from(sampled) * 1000 / u128::from(eligible)) as u64;
            stats
                .cpu_coverage_permille
                .store(permille.min(9_999), Ordering::Relaxed);
            if permille < LOW_COVERAGE_PERMILLE {
                stats
                    .cpu_low_coverage_windows
                    .fetch_add(1, Ordering::Relaxed);
                if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    self.warned = Some(now);
                    let why = if self.adopting {
                        "threads are sampled from their first span enter or registration, \
                         others once the profiler's scan finds them (each second), except \
                         threads that block SIGPROF (SamplerStats::adoptions_blocked) or that \
                         could not be adopted (adoptions_failed): threads that live less than \
                         a second and burn CPU are missed; call \
                         otel_profiling::sampler::register_current_thread() at their start, or \
                         give the runtime the hook (otel_profiling::sampler::\
                         tokio_on_thread_start)"
                    } else {
                        "threads that never entered a span are not sampled \
                         (sample_unregistered_threads is off): a spawn_blocking closure run \
                         without the request span, a thread pool of your own, a C library's \
                         threads; switch it on, enter a span in them, call \
                         otel_profiling::sampler::register_current_thread() at their start, or \
                         give the runtime the hook (otel_profiling::sampler::\
                         tokio_on_thread_start)"
                    };
                    eprintln!(
                        "otel-profiling: the profiles hold {}% of the process's CPU over the \
                         last {} s ({:.1} of {:.1} s; the profiler's own threads' {:.1} s left \
                         out): {why}; counted in cpu_low_coverage_windows",
                        permille / 10,
                        now.duration_since(since).as_secs(),
                        sampled as f64 / 1e9,
                        eligible as f64 / 1e9,
                        own_delta as f64 / 1e9,
                    );
                }
            }
        }
        self.start = Some((now, process, own));
        self.sampled_periods = 0;
    }

    fn restart(&mut self, now: Instant) {
        self.start = process_ns().map(|p| (now, p, own_threads_ns()));
        self.sampled_periods = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(d: Duration) {
        let until = Instant::now() + d;
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    /// Burns `d` of the calling thread's own CPU, however busy the machine.
    fn burn(d: Duration) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let until = thread_cpu_ns(tid).unwrap_or(0) + d.as_nanos() as u64;
        while thread_cpu_ns(tid).unwrap_or(u64::MAX) < until {
            spin(Duration::from_millis(1));
        }
    }

    /// The crate's threads' CPU counts while they live and after they end; a thread past
    /// the table's room is simply not counted.
    #[test]
    fn own_threads_cpu_is_counted_live_and_ended() {
        let before = own_threads_ns();
        std::thread::spawn(|| {
            let _own = own_thread();
            burn(Duration::from_millis(60));
        })
        .join()
        .expect("thread");
        let after = own_threads_ns();
        assert!(
            after - before >= 50_000_000,
            "{} ns of an own thread's 60 ms",
            after - before
        );
    }

    /// A window in which unsampled CPU dominates is counted once and its share stored;
    /// the first check only starts a window.
    #[test]
    fn a_window_with_little_sampled_cpu_is_counted() {
        let stats = CollectorStats::default();
        let mut coverage = Coverage::new(Duration::from_millis(100), 1_000_000, true);
        coverage.check(&stats);
        burn(Duration::from_millis(150));
        // A tenth of it sampled.
        coverage.add_sampled(15);
        coverage.check(&stats);
        let permille = stats.cpu_coverage_permille.load(Ordering::Relaxed);
        assert!(permille < LOW_COVERAGE_PERMILLE, "{permille}");
        assert_eq!(stats.cpu_low_coverage_windows.load(Ordering::Relaxed), 1);
        assert!(stats.cpu_process_ns.load(Ordering::Relaxed) >= 140_000_000);
        // All of it sampled (the process's other test threads' CPU too): covered.
        let start = process_ns().expect("getrusage");
        burn(Duration::from_millis(150));
        let used = process_ns().expect("getrusage") - start;
        coverage.add_sampled(used / 1_000_000 + 10);
        coverage.check(&stats);
        assert!(stats.cpu_coverage_permille.load(Ordering::Relaxed) >= LOW_COVERAGE_PERMILLE);
        assert_eq!(stats.cpu_low_coverage_windows.load(Ordering::Relaxed), 1);
    }
}
