//! The clocks the span hooks read, chosen for their cost.
//!
//! * [`monotonic_ns`]: `CLOCK_MONOTONIC` (the clock `Instant` reads), ~25 ns a read through
//!   the vDSO on the project's VM.
//! * [`coarse_monotonic_ns`]: `CLOCK_MONOTONIC_COARSE`, ~6 ns, advancing once per kernel
//!   tick (1–10 ms): for ages compared with minutes, never for durations of polls.
//! * [`ticks`]: the clock of `profiling.wall.active_ns`, read twice per root transition
//!   (the busiest clock in the crate: a span polled 4 times reads it 8 times). Where the
//!   kernel itself keeps time with the CPU's time-stamp counter (x86-64, clocksource
//!   `tsc`: the kernel checked it is invariant and synchronised across CPUs, and switches
//!   away from it if it ever stops being so), it is the TSC, ~10 ns a read; elsewhere it
//!   is `CLOCK_MONOTONIC` in nanoseconds. [`ticks_to_ns`] converts differences, with the
//!   TSC's rate measured against `CLOCK_MONOTONIC` since [`init_ticks`] (the error is the
//!   two clocks' read jitter over that interval: below 10⁻⁴ after 1 ms, and the rate is
//!   fixed once a second has passed).
//!
//! The source of [`ticks`] is decided once, by [`init_ticks`] when a sampler starts (before
//! any root has counters, so before any stretch of active time is open), and never changes:
//! a stretch is always opened and closed on the same clock.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// `clock_gettime(clock)` in nanoseconds.
#[inline]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks used here exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock `Instant` reads, without its wrapper).
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: cheap, but it only advances at kernel ticks.
#[inline]
pub(crate) fn coarse_monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// [`ticks`] reads `CLOCK_MONOTONIC` (the source before [`init_ticks`], and wherever the
/// TSC is not the kernel's clock).
const MONOTONIC: u8 = 0;
/// [`ticks`] reads the time-stamp counter.
const TSC: u8 = 1;

static SOURCE: AtomicU8 = AtomicU8::new(MONOTONIC);
/// `init_ticks` ran (the source is final).
static DECIDED: AtomicU8 = AtomicU8::new(0);
/// Where the TSC's rate is measured from: (TSC, `CLOCK_MONOTONIC` ns) at `init_ticks`.
static ORIGIN_TICKS: AtomicU64 = AtomicU64::new(0);
static ORIGIN_NS: AtomicU64 = AtomicU64::new(0);
/// Nanoseconds per tick as a 32.32 fixed-point number, once measured over a second (0:
/// not yet).
static NS_PER_TICK_FIXED: AtomicU64 = AtomicU64::new(0);
/// How long the rate is measured before it is kept.
const RATE_SETTLES_NS: u64 = 1_000_000_000;

/// Decides [`ticks`]' source, once per process. Call before any root's counters exist.
pub(crate) fn init_ticks() {
    if DECIDED.swap(1, Ordering::SeqCst) == 1 {
        return;
    }
    if tsc_is_the_kernel_clock() {
        ORIGIN_TICKS.store(read_tsc(), Ordering::SeqCst);
        ORIGIN_NS.store(monotonic_ns(), Ordering::SeqCst);
        SOURCE.store(TSC, Ordering::SeqCst);
    }
}

/// Whether the kernel keeps `CLOCK_MONOTONIC` with the TSC, which it does only after
/// checking that the counter is invariant and synchronised across CPUs.
fn tsc_is_the_kernel_clock() -> bool {
    cfg!(target_arch = "x86_64")
        && std::env::var_os("OTEL_PROFILING_NO_TSC").is_none()
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|source| source.trim() == "tsc")
}

#[inline]
fn read_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions; it is only chosen where the kernel uses it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

/// The active-time clock: TSC ticks or nanoseconds (see the module docs). Only
/// differences of two reads mean anything; convert them with [`ticks_to_ns`].
#[inline]
pub(crate) fn ticks() -> u64 {
    if SOURCE.load(Ordering::Relaxed) == TSC {
        read_tsc()
    } else {
        monotonic_ns()
    }
}

/// [`ticks`] when it is the TSC, `None` when it is the monotonic clock: a span switch's
/// usual path reads the counter inline and leaves the clock's call to its slow path.
#[inline(always)]
pub(crate) fn tsc_ticks() -> Option<u64> {
    (SOURCE.load(Ordering::Relaxed) == TSC).then(read_tsc)
}

/// Converts a difference of [`ticks`] to nanoseconds: a multiply once the TSC's rate is
/// fixed (a second after the sampler started); before, [`ticks_to_ns_unsettled`] reads
/// both clocks.
#[inline]
pub(crate) fn ticks_to_ns(ticks: u64) -> u64 {
    match (
        SOURCE.load(Ordering::Relaxed),
        NS_PER_TICK_FIXED.load(Ordering::Relaxed),
    ) {
        (TSC, 0) => ticks_to_ns_unsettled(ticks),
        (TSC, fixed) => scale(ticks, fixed),
        _ => ticks,
    }
}

/// `ticks` × `fixed` (nanoseconds per tick, 32.32 fixed point), saturating.
#[inline]
fn scale(ticks: u64, fixed: u64) -> u64 {
    ((u128::from(ticks) * u128::from(fixed)) >> 32).min(u128::from(u64::MAX)) as u64
}

/// [`ticks_to_ns`] of the TSC before its rate is fixed.
#[cold]
#[inline(never)]
fn ticks_to_ns_unsettled(ticks: u64) -> u64 {
    let fixed = match NS_PER_TICK_FIXED.load(Ordering::Relaxed) {
        0 => {
            let (t0, n0) = (
                ORIGIN_TICKS.load(Ordering::Relaxed),
                ORIGIN_NS.load(Ordering::Relaxed),
            );
            let (t1, n1) = (read_tsc(), monotonic_ns());
            let (dt, dn) = (t1.saturating_sub(t0).max(1), n1.saturating_sub(n0));
            let fixed = ((u128::from(dn) << 32) / u128::from(dt)).min(u128::from(u64::MAX)) as u64;
            if dn >= RATE_SETTLES_NS {
                NS_PER_TICK_FIXED.store(fixed.max(1), Ordering::Relaxed);
            }
            fixed
        }
        fixed => fixed,
    };
    scale(ticks, fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_measure_wall_time_in_nanoseconds() {
        init_ticks();
        let (t0, n0) = (ticks(), monotonic_ns());
        std::thread::sleep(std::time::Duration::from_millis(30));
        let (t1, n1) = (ticks(), monotonic_ns());
        let measured = ticks_to_ns(t1 - t0) as f64;
        let truth = (n1 - n0) as f64;
        assert!(
            (measured - truth).abs() / truth < 0.01,
            "ticks say {measured} ns, CLOCK_MONOTONIC {truth} ns (source {})",
            SOURCE.load(Ordering::Relaxed)
        );
    }

    #[test]
    fn coarse_clock_is_close_to_the_fine_one() {
        let fine = monotonic_ns();
        let coarse = coarse_monotonic_ns();
        // One kernel tick at most (HZ ≥ 100), either way.
        assert!(fine.abs_diff(coarse) < 20_000_000, "{fine} vs {coarse}");
    }
}
