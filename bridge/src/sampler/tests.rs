//! The signal path against hostile and unlucky conditions: foreign and forged `SIGPROF`
//! signals, stale slots, stop racing registration, blocked signals, small stacks, fork,
//! a replaced handler, the panic guard, and thread churn. Each of those takes the
//! process-wide sampler in turn ([`test_turn`]): they need its `SIGPROF` handler, its
//! timers or its registrations. What involves no signal runs on a state of its own.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::altstack;
use super::slots::TimerValue;
use super::*;

/// Thread CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain FFI with an out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Burns `d` of the calling thread's CPU time.
#[inline(never)]
fn burn(d: Duration) -> u64 {
    let start = thread_cpu();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    while thread_cpu() - start < d {
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    std::hint::black_box(x)
}

/// Burns CPU until `done`, or until `cap` of this thread's CPU: for checks that wait for
/// signals, since a loaded machine folds late timer expirations into fewer of them.
fn burn_until(cap: Duration, mut done: impl FnMut() -> bool) {
    let start = thread_cpu();
    while !done() && thread_cpu() - start < cap {
        burn(Duration::from_millis(10));
    }
}

/// Sends the calling thread a `SIGPROF` that looks like a timer expiry carrying `value`
/// and `overrun`; it is delivered before this returns.
fn forge_timer_signal(value: *mut libc::c_void, overrun: i32) {
    // Linux siginfo_t on 64-bit targets: signo, errno, code, (pad), then the timer
    // fields: si_tid (16), si_overrun (20), si_value (24).
    let mut info = [0u8; 128];
    info[0..4].copy_from_slice(&libc::SIGPROF.to_ne_bytes());
    info[8..12].copy_from_slice(&libc::SI_TIMER.to_ne_bytes());
    info[20..24].copy_from_slice(&overrun.to_ne_bytes());
    info[24..32].copy_from_slice(&(value as usize as u64).to_ne_bytes());
    // SAFETY: queueing a signal to this very thread with a fully initialised siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_tgsigqueueinfo,
            libc::getpid(),
            libc::gettid(),
            libc::SIGPROF,
            info.as_ptr(),
        )
    };
    assert_eq!(
        rc,
        0,
        "rt_tgsigqueueinfo: {}",
        std::io::Error::last_os_error()
    );
}

/// SIGPROF timers of this process the kernel still has (`/proc/self/timers`).
fn sigprof_timers() -> usize {
    std::fs::read_to_string("/proc/self/timers")
        .map(|t| t.lines().filter(|l| l.starts_with("signal: 27/")).count())
        .unwrap_or(0)
}

fn start(hz: u32) -> Sampler {
    Sampler::start(SamplerConfig::default().with_frequency_hz(hz)).expect("sampler")
}

/// The counters of a state of the test's own (slots claimed on its table, records pushed
/// and drained, no signal): its stats add them up, and they are a `Copy` snapshot. No turn
/// on the process's sampler.
#[test]
fn stats_add_up_the_counters_of_their_own_state() {
    fn snapshot_is_copy<T: Copy>(t: T) -> (T, T) {
        (t, t)
    }
    let state = SamplerState::new();
    let owner = || Owner {
        // SAFETY: gettid has no preconditions.
        tid: unsafe { libc::gettid() },
        cell: std::ptr::null(),
        stack: StackBounds { lo: 0, hi: 0 },
        ring_capacity: 4,
        alloc_capacity: 0,
        cpu_ns: 0,
        adopted: false,
    };
    let slots = [
        state.slots.claim(owner()).expect("slot"),
        state.slots.claim(owner()).expect("slot"),
    ];
    for (slot, (taken, periods, dropped)) in slots.iter().zip([(3, 5, 1), (2, 2, 0)]) {
        let c = &slot.counters;
        c.taken.fetch_add(taken, Ordering::Relaxed);
        c.periods.fetch_add(periods, Ordering::Relaxed);
        c.dropped.fetch_add(dropped, Ordering::Relaxed);
        c.truncated.fetch_add(1, Ordering::Relaxed);
        let mut producer = slot.ring().and_then(|r| r.producer()).expect("producer");
        for _ in 0..taken - dropped {
            assert!(producer.push_with(|r| r.depth = 1));
        }
    }
    state.foreign.fetch_add(7, Ordering::Relaxed);
    assert_eq!(state.drain_into(|r| assert_eq!(r.depth, 1)), 4);
    let (stats, copy) = snapshot_is_copy(state.stats());
    assert_eq!(stats, copy);
    assert_eq!(
        (stats.taken, stats.periods, stats.dropped, stats.drained),
        (5, 7, 1, 4)
    );
    assert_eq!(stats.taken, stats.drained + stats.dropped);
    assert_eq!((stats.truncated, stats.foreign_signals), (2, 7));
    assert_eq!(stats.threads, 0, "no timer armed: none sampled");
    assert!(!state.is_running());
    for slot in slots {
        state.slots.release(slot);
    }
}

/// A `Sampler` holds `&'static SamplerState` now: it keeps the auto traits it had as two
/// integers (it can be sent, shared, and held across a `catch_unwind`).
#[test]
fn the_handle_keeps_its_auto_traits() {
    fn check<T: Send + Sync + Unpin + std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    check::<Sampler>();
}

/// Issue 9 item 1: another library's SIGPROF timer (any `si_value`) and forged timer
/// signals naming a stale slot, another thread's slot or garbage are ignored and counted;
/// the thread's own samples go on. (The old handler read `magic` through any SI_TIMER
/// payload and died of SIGSEGV within a second.)
#[test]
fn foreign_and_forged_sigprof_signals_are_ignored_and_counted() {
    let _turn = test_turn();
    let sampler = start(1000);
    sampler.register_current_thread().expect("register");
    let own = current_slot().expect("slot").timer_value();

    // A slot that a thread used and let go of.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        register_current_thread().expect("register");
        tx.send(current_slot().expect("slot").timer_value())
            .expect("send");
    })
    .join()
    .expect("thread");
    let released = rx.recv().expect("value");
    // A live slot of another thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        register_current_thread().expect("register");
        tx.send(current_slot().expect("slot").timer_value())
            .expect("send");
        let _ = stop_rx.recv();
    });
    let others = rx.recv().expect("value");

    // Another library's timer: CLOCK_MONOTONIC, SIGPROF, sival_ptr 0x1234, every 1 ms.
    // SAFETY: plain FFI with initialised arguments; deleted below.
    let foreign = unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_SIGNAL;
        sev.sigev_signo = libc::SIGPROF;
        sev.sigev_value = libc::sigval {
            sival_ptr: 0x1234 as *mut libc::c_void,
        };
        let mut timer: libc::timer_t = std::mem::zeroed();
        assert_eq!(
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer),
            0
        );
        let ms = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        let spec = libc::itimerspec {
            it_interval: ms,
            it_value: ms,
        };
        assert_eq!(
            libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()),
            0
        );
        timer
    };
    let before = stats();
    // 300 ms of this thread's CPU (a busy machine gives it less per wall second).
    let cpu_start = thread_cpu();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut forged = 0u64;
    while thread_cpu() - cpu_start < Duration::from_millis(300) && Instant::now() < deadline {
        burn(Duration::from_millis(5));
        let stale_own = TimerValue::from_sival(own.to_sival());
        for value in [
            released.to_sival(),
            others.to_sival(),
            // Our own slot with a generation that is not the live one.
            (own.to_sival() as usize ^ 2) as *mut libc::c_void,
            0x1234 as *mut libc::c_void,
            usize::MAX as *mut libc::c_void,
        ] {
            forge_timer_signal(value, 0);
            forged += 1;
        }
        assert_eq!(stale_own, own);
    }
    // SAFETY: the foreign timer created above.
    unsafe { libc::timer_delete(foreign) };
    let after = stats();
    let _ = stop_tx.send(());
    other.join().expect("other thread");
    let foreign_seen = after.foreign_signals - before.foreign_signals;
    eprintln!(
        "foreign: {foreign_seen} ignored ({forged} forged), own samples {}",
        after.taken - before.taken
    );
    assert!(
        foreign_seen > forged,
        "forged and foreign-timer signals are counted: {foreign_seen} vs {forged} forged"
    );
    // Periods, not signals: a loaded machine folds late expirations into fewer signals
    // (seen: 11 signals standing for 146 periods).
    assert!(
        after.taken > before.taken && after.periods >= before.periods + 10,
        "own samples go on: {after:?}"
    );
    // A forged signal with our own live value is a sample like any other: counted under
    // the root this thread runs (other tests' threads may be sampled meanwhile, so not
    // the global count). The real timer may fire in between too, once per 1 ms of this
    // thread's CPU at 1000 Hz.
    let mut lists = crate::root_cpu::SlotLists::default();
    let handle = lists.claim().expect("counters");
    let root = crate::LocalRoot::claim(
        crate::RootLabel::name_only(crate::SpanName::intern("forged-own")).with_cpu(handle),
        None,
    );
    let cpu = thread_cpu();
    {
        let _scope = crate::SpanContextGuard::enter(Some(&root));
        forge_timer_signal(own.to_sival(), 0);
    }
    let real_at_most = 1 + (thread_cpu() - cpu).as_millis() as u64;
    let samples = lists.release(handle).samples;
    assert!(
        (1..=1 + real_at_most).contains(&samples),
        "the forged own signal is one sample: {samples} counted, of which at most \
         {real_at_most} from the real timer"
    );
    drop(sampler);
}

/// A signal that stands for `1 + si_overrun` periods gives its stack that weight, and
/// the CPU time its samples stand for is what the thread's clock moved since the last
/// charge (40 ms here, set through the ledger), not the periods the kernel counted. (The
/// root's CPU time is its stretches', `span_context::active`; the samples' is the
/// fallback where those cannot be read.)
#[test]
fn overrun_weights_the_stack_and_the_span_gets_the_measured_cpu_time() {
    let _turn = test_turn();
    const LENT: u64 = 40_000_000;
    let cpu_now = || super::cpu_ledger::thread_cpu_ns().expect("thread CPU clock");
    // A clock (before the timer runs) with 40 ms behind it to lend.
    while cpu_now() < LENT {
        std::hint::black_box((0..10_000u64).sum::<u64>());
    }
    let sampler = start(100);
    sampler.register_current_thread().expect("register");
    SamplerState::global().drain_into(|_| {});
    let slot = current_slot().expect("slot");
    let own = slot.timer_value();
    let mut lists = crate::root_cpu::SlotLists::default();
    let handle = lists.claim().expect("counters");
    let root = crate::LocalRoot::claim(
        crate::RootLabel::name_only(crate::SpanName::intern("overrun-test")).with_cpu(handle),
        None,
    );
    let before = stats();
    let start_cpu = cpu_now();
    {
        let _scope = crate::SpanContextGuard::enter(Some(&root));
        slot.cpu.reset(start_cpu - LENT);
        forge_timer_signal(own.to_sival(), 3);
    }
    let end_cpu = cpu_now();
    let after = stats();
    assert_eq!(after.taken - before.taken, 1);
    assert_eq!(after.periods - before.periods, 4);
    let mut weights = Vec::new();
    SamplerState::global().drain_into(|r| {
        if r.root == Some(root.label()) {
            weights.push(r.weight)
        }
    });
    assert_eq!(weights, [4]);
    let totals = lists.release(handle);
    assert_eq!(totals.samples, 1);
    assert!(
        (LENT..=LENT + (end_cpu - start_cpu)).contains(&totals.sampled_cpu_ns),
        "{} ns given, {LENT} ns lent plus at most {} ns run",
        totals.sampled_cpu_ns,
        end_cpu - start_cpu
    );
    drop(sampler);
}

/// Item 2: a `LocalRoot` kept past its span and entered again counts nothing, not even
/// into the next root that reuses its counters. (The old label carried the address of
/// freed `RootCpu` counters; the allocator handed the same memory to the next root, which
/// then reported CPU it never used.)
#[test]
fn a_local_root_kept_past_its_span_counts_for_no_span() {
    let _turn = test_turn();
    let sampler = start(1000);
    sampler.register_current_thread().expect("register");
    let mut lists = crate::root_cpu::SlotLists::default();
    let name = crate::SpanName::intern("kept-root-test");
    let old = lists.claim().expect("counters");
    let kept = crate::LocalRoot::claim(crate::RootLabel::name_only(name).with_cpu(old), None);
    lists.release(old);
    // The next root gets the same slot (nothing in flight) and never runs.
    let new = lists.claim().expect("counters");
    let stale_before = stats().stale_roots;
    {
        let _scope = crate::SpanContextGuard::enter(Some(&kept));
        // Until five signals came (about 50 ms of CPU on a quiet machine), at most 5 s.
        burn_until(Duration::from_secs(5), || {
            stats().stale_roots >= stale_before + 5
        });
    }
    let totals = lists.release(new);
    assert_eq!(totals.samples, 0, "the new root ran nothing");
    assert_eq!(totals.active_ticks, 0, "nor was it ever entered");
    assert!(stats().stale_roots >= stale_before + 5, "{:?}", stats());
    drop(sampler);
}

/// Item 8: a registration that armed its timer while the sampler was being stopped does
/// not leave a timer firing after the stop.
#[test]
fn a_registration_racing_stop_leaves_no_timer() {
    let _turn = test_turn();
    let sampler = start(250);
    let timers_before = sigprof_timers();
    let (resume, pause) = std::sync::mpsc::channel();
    *SamplerState::global()
        .registration_pause
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(pause);
    let (armed_tx, armed_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let result = register_current_thread();
        armed_tx.send(sigprof_timers()).expect("send");
        let _ = done_rx.recv();
        result
    });
    // The thread is paused between arming and publishing its timer: stop now.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(sigprof_timers(), timers_before + 1, "armed, not published");
    drop(sampler);
    resume.send(()).expect("resume");
    let after_registration = armed_rx.recv().expect("count");
    let _ = done_tx.send(());
    let result = thread.join().expect("thread");
    assert!(
        matches!(result, Err(SamplerError::NotRunning)),
        "{result:?}"
    );
    assert_eq!(
        after_registration, timers_before,
        "the timer armed across the stop was deleted"
    );
}

/// Item 9: a thread that blocks SIGPROF is refused with a clear error and counted once,
/// not retried on every span enter.
#[test]
fn a_thread_blocking_sigprof_is_refused_and_counted() {
    let _turn = test_turn();
    let sampler = start(100);
    let before = stats().blocked_threads;
    let result = std::thread::spawn(|| {
        // SAFETY: blocking a signal on this thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPROF);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        let explicit = register_current_thread();
        for _ in 0..100 {
            on_span_enter();
        }
        explicit
    })
    .join()
    .expect("thread");
    let err = result.expect_err("refused");
    assert!(matches!(err, SamplerError::SigprofBlocked), "{err:?}");
    assert!(err.to_string().contains("blocks SIGPROF"), "{err}");
    assert_eq!(stats().blocked_threads, before + 1, "counted once");
    drop(sampler);
}

/// Item 13: another component replacing the handler is noticed, counted once and
/// reported; the install itself never overwrites someone else's handler.
#[test]
fn a_replaced_handler_is_noticed_and_a_foreign_one_is_never_overwritten() {
    let _turn = test_turn();
    extern "C" fn other(_: libc::c_int) {}
    let sampler = start(100);
    assert!(check_handler());
    // SAFETY: swapping SIGPROF's disposition and putting ours back below.
    let ours = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = other as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut action.sa_mask);
        let mut ours: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGPROF, &action, &mut ours);
        ours
    };
    let before = stats().handler_replaced;
    assert!(!check_handler());
    assert!(!check_handler());
    assert_eq!(stats().handler_replaced, before + 1, "counted once");
    // Installing now refuses and leaves the other handler in place.
    assert!(matches!(
        handler::install(SamplerState::global()),
        Err(SamplerError::SigprofTaken)
    ));
    assert!(!handler::is_installed());
    // SAFETY: restoring our handler.
    unsafe { libc::sigaction(libc::SIGPROF, &ours, std::ptr::null_mut()) };
    assert!(check_handler());
    drop(sampler);
}

/// Item 4: the handler's peak stack use, measured by painting the
/// thread's alternate signal stack (where the kernel puts its frame and the handler runs);
/// the walk's budget and the stack's size cover it with a margin, and the interrupted
/// stack is not written at all.
#[test]
fn handler_stack_use_is_bounded() {
    let _turn = test_turn();
    // 1 Hz: the timer itself does not fire during the measurement.
    let sampler = start(1);
    let (peak, on_thread_stack) = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            register_current_thread().expect("register");
            let slot = current_slot().expect("slot");
            let alt = altstack::range_of(slot.index()).expect("the slot's alternate stack");
            measure_handler_stack(slot.timer_value(), alt)
        })
        .expect("spawn")
        .join()
        .expect("thread");
    eprintln!(
        "handler peak stack use (incl. the kernel's signal frame): {peak} bytes; budget {WALK_STACK}, alternate stack {ALT}",
        WALK_STACK = handler::WALK_STACK_BUDGET,
        ALT = altstack::ALT_STACK_BYTES,
    );
    assert!(peak > 1024, "the measurement saw the handler: {peak}");
    assert!(
        (peak as u64) < handler::WALK_STACK_BUDGET && peak < altstack::ALT_STACK_BYTES / 2,
        "the walk's budget and the stack must cover its peak: {peak}"
    );
    assert_eq!(
        on_thread_stack, 0,
        "nothing written on the interrupted stack"
    );
    drop(sampler);
}

const PAINT: u64 = 0x5a5a_a5a5_5a5a_a5a5;
/// Bytes painted below the measuring frame.
const PAINT_BYTES: usize = 64 * 1024;
/// Bytes left unpainted just below the measuring frame (its own calls use them).
const PAINT_GAP: usize = 4 * 1024;

/// Paints the alternate stack `alt` and the thread's stack below this frame, takes one
/// forged sample, and returns how deep the handler (and the kernel's signal frame) wrote
/// into `alt`, and how many painted bytes of the thread's stack were written.
#[inline(never)]
fn measure_handler_stack(value: TimerValue, alt: std::ops::Range<u64>) -> (usize, usize) {
    let marker = 0u8;
    let top = std::ptr::addr_of!(marker) as usize & !7;
    let hi = top - PAINT_GAP;
    let lo = hi - PAINT_BYTES;
    let paint = |range: std::ops::Range<usize>| {
        for addr in range.step_by(8) {
            // SAFETY: unused stack memory of this thread (below live frames, or its
            // alternate signal stack while no signal runs on it).
            unsafe { std::ptr::write_volatile(addr as *mut u64, PAINT) };
        }
    };
    let (alt_lo, alt_hi) = (alt.start as usize, alt.end as usize);
    paint(lo..hi);
    paint(alt_lo..alt_hi);
    forge_timer_signal(value.to_sival(), 0);
    // SAFETY: as above; reading what the handler left.
    let written = |addr: &usize| unsafe { std::ptr::read_volatile(*addr as *const u64) } != PAINT;
    let deepest = (alt_lo..alt_hi).step_by(8).find(written).unwrap_or(alt_hi);
    let on_thread_stack = (lo..hi).step_by(8).filter(written).count() * 8;
    std::hint::black_box(&marker);
    (alt_hi - deepest, on_thread_stack)
}

/// Item 4 and issue 22: threads recursing to less than one signal frame (3 KiB) of the end
/// of their (256 KiB) stacks are sampled at the highest rate without a crash, with whole
/// stacks: the handler runs on the thread's alternate stack. Before, the kernel's frame
/// (3.4 KB and more with AVX-512) and the handler went below the guard page. (The stack
/// is bigger than the 64 KiB this test once used because a first registration on a fresh
/// slot builds the 33 KB unwind cache on the registering thread's stack in unoptimised
/// builds: that, not the handler, overflowed 64 KiB when this test ran alone.)
#[test]
fn small_stacks_recursing_to_their_limit_are_sampled_without_a_crash() {
    let _turn = test_turn();
    let sampler = start(MAX_FREQUENCY_HZ);
    let before = stats();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(|| {
                    register_current_thread().expect("register");
                    let bounds = StackBounds::current().expect("bounds");
                    recurse_until(bounds.lo + 3 * 1024, Duration::from_millis(300))
                })
                .expect("spawn")
        })
        .collect();
    for t in threads {
        t.join().expect("small-stack thread");
    }
    let after = stats();
    eprintln!("small stacks: {after:?}");
    assert!(after.taken > before.taken, "sampled: {after:?}");
    assert_eq!(
        after.low_stack, before.low_stack,
        "every sample had room for its walk: {after:?}"
    );
    drop(sampler);
}

/// Recurses until the stack pointer is below `limit`, then burns `d` of CPU there.
#[inline(never)]
fn recurse_until(limit: u64, d: Duration) -> u64 {
    let pad = [0u8; 256];
    let here = std::hint::black_box(&pad).as_ptr() as u64;
    let x = if here > limit {
        recurse_until(limit, d)
    } else {
        let start = thread_cpu();
        let mut x = 1u64;
        // No calls but the clock read: stays at this depth.
        while thread_cpu() - start < d {
            for _ in 0..1000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        x
    };
    std::hint::black_box(pad[0] as u64 + x)
}

/// Item 10: threads that come and go reuse slots: the table grows with the threads alive
/// at once, not with the threads ever created.
#[test]
fn short_lived_threads_reuse_slots() {
    let _turn = test_turn();
    let sampler = start(100);
    SamplerState::global().drain_into(|_| {});
    let allocated_before = SamplerState::global().slots().iter().count();
    for round in 0..50 {
        let threads: Vec<_> = (0..20)
            .map(|_| {
                std::thread::spawn(|| {
                    on_span_enter();
                    assert!(current_slot().is_some());
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        SamplerState::global().drain_into(|_| {});
        let grown = SamplerState::global().slots().iter().count() - allocated_before;
        assert!(
            grown <= 64,
            "round {round}: {grown} new slots for 20 live threads"
        );
    }
    assert_eq!(stats().threads, 0, "{:?}", stats());
    // Threads that leave nothing to drain give their slot back at once, without waiting
    // for a drain: one after another, they keep reusing a handful of slots.
    let allocated = SamplerState::global().slots().iter().count();
    for _ in 0..200 {
        std::thread::spawn(|| {
            on_span_enter();
            assert!(current_slot().is_some());
        })
        .join()
        .expect("thread");
    }
    let grown = SamplerState::global().slots().iter().count() - allocated;
    assert!(
        grown <= 4,
        "{grown} new slots for one thread at a time, no drain"
    );
    drop(sampler);
}

/// Item 3: a child forked while the collector holds the drain lock and timers run starts
/// clean: it can start its own sampler, drop the parent's handle without stopping it,
/// sample its main thread, drain, read stats and stop — no deadlock, no stale timer ids.
#[test]
fn a_forked_child_starts_clean() {
    let _turn = test_turn();
    let sampler = start(250);
    sampler.register_current_thread().expect("register");
    burn(Duration::from_millis(20));
    // A module refresh in progress at the fork too (the publisher lock held).
    let refreshing = std::thread::spawn(|| {
        unwind::hold_publisher_for_test(Duration::from_millis(200));
    });
    std::thread::sleep(Duration::from_millis(20));
    let draining = Arc::new(AtomicBool::new(false));
    let drainer = {
        let draining = draining.clone();
        std::thread::spawn(move || {
            // Until a record comes (the closure runs only for records): then hold the
            // drain for 300 ms, across the fork.
            while !draining.load(Ordering::SeqCst) {
                SamplerState::global().drain_into(|_| {
                    if !draining.swap(true, Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                });
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    while !draining.load(Ordering::SeqCst) {
        burn(Duration::from_millis(5));
    }
    // SAFETY: the child only uses this crate's fork-safe paths and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: a watchdog: a deadlock kills the child instead of hanging the test.
        unsafe { libc::alarm(20) };
        let code = child_after_fork(sampler);
        // SAFETY: leaving without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    drainer.join().expect("drainer");
    refreshing.join().expect("refresher");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x} (exit code {})",
        libc::WEXITSTATUS(status)
    );
    // The parent goes on sampling: a signal comes within 2 s of CPU (one every 4 ms on a
    // quiet machine).
    let taken = stats().taken;
    burn_until(Duration::from_secs(2), || stats().taken > taken);
    assert!(stats().taken > taken, "{:?}", stats());
}

fn child_after_fork(inherited: Sampler) -> i32 {
    if is_running() || stats().taken != 0 {
        return 10;
    }
    if !unwind::publisher_is_free() {
        return 16;
    }
    let Ok(own) = Sampler::start(SamplerConfig::default().with_frequency_hz(250)) else {
        return 11;
    };
    if own.register_current_thread().is_err() {
        return 12;
    }
    // The parent's handle must not stop the child's sampler or delete its timers.
    drop(inherited);
    if !is_running() || stats().threads != 1 {
        return 13;
    }
    burn(Duration::from_millis(200));
    // Stop first, so no sample lands between the drain and the count.
    drop(own);
    if is_running() {
        return 15;
    }
    let (mut drained, mut periods) = (0u64, 0u64);
    SamplerState::global().drain_into(|r| {
        drained += 1;
        periods += u64::from(r.weight);
    });
    let s = stats();
    // Periods, not signals: on a loaded machine the kernel folds late expirations into one
    // signal's `si_overrun` (seen: 2 signals standing for 49 of the 50 periods burned).
    if periods < 5 || drained != s.taken {
        return 14;
    }
    0
}

/// The slot whose handler the `SIGUSR2` handler below pretends to be.
static PRETEND_IN_HANDLER: std::sync::atomic::AtomicPtr<Slot> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// A signal handler that panics while its thread's slot says "inside the SIGPROF
/// handler", as a panic in the real handler would (the real one has no panic path: the
/// link-time proof of `.ci/run`, so the panic is made here, out of its reach).
extern "C" fn panic_as_if_in_the_handler(_: libc::c_int) {
    // SAFETY: the test stores a `&'static Slot` before raising the signal.
    if let Some(slot) = unsafe { PRETEND_IN_HANDLER.load(Ordering::SeqCst).as_ref() } {
        slot.in_handler.store(true, Ordering::Relaxed);
    }
    panic!("a panic while the handler runs");
}

/// Item 14, kept as defence in depth: a panic while a thread is inside the handler
/// aborts at once with a fixed line and no allocation, instead of running the panic hooks
/// (which format and lock) in the signal. The application's hook, set before the sampler
/// started, must not run. Runs in a child process (the test binary again, on this test
/// alone).
#[test]
fn a_panic_in_the_handler_aborts_without_the_panic_hook() {
    const CHILD: &str = "OTEL_PROFILING_PANIC_CHILD";
    if std::env::var_os(CHILD).is_some() {
        std::panic::set_hook(Box::new(|_| eprintln!("the application's panic hook ran")));
        let sampler = start(1000);
        sampler.register_current_thread().expect("register");
        let slot = current_slot().expect("registered");
        PRETEND_IN_HANDLER.store(slot as *const Slot as *mut Slot, Ordering::SeqCst);
        // SAFETY: installing a handler for a signal only this child raises.
        unsafe {
            libc::signal(
                libc::SIGUSR2,
                panic_as_if_in_the_handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
            libc::raise(libc::SIGUSR2);
        }
        std::process::exit(0);
    }
    let _turn = test_turn();
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "sampler::tests::a_panic_in_the_handler_aborts_without_the_panic_hook",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("child");
    let stderr = String::from_utf8_lossy(&output.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGABRT),
        "aborted: {:?}\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains("otel-profiling: panic inside the SIGPROF handler"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("a panic while the handler runs")
            && !stderr.contains("the application's panic hook ran"),
        "a panic hook ran inside the signal handler:\n{stderr}"
    );
}

/// A registered thread runs its handler on the slot's alternate stack; letting go puts
/// back what it had; a forked child's one thread does not keep ours (its slot is free in
/// the child, and the next thread registering there would be given the same stack).
#[test]
fn the_alternate_stack_is_the_slots_and_not_inherited() {
    let _turn = test_turn();
    let sampler = start(100);
    std::thread::spawn(move || {
        let before = current_alt_stack();
        register_current_thread().expect("register");
        let slot = current_slot().expect("slot");
        let ours = altstack::range_of(slot.index()).expect("made at registration");
        assert_eq!(current_alt_stack().0, ours.start, "installed");
        // SAFETY: the child only queries its alternate stack and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let (sp, disabled) = current_alt_stack();
            let code = if disabled || sp != ours.start { 0 } else { 2 };
            // SAFETY: leaving the child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child kept the parent's slot stack: {status:#x}"
        );
        unregister_current_thread();
        assert_eq!(current_alt_stack(), before, "what it had is back");
    })
    .join()
    .expect("thread");
    drop(sampler);
}

/// The calling thread's alternate stack: its base and whether it is disabled.
fn current_alt_stack() -> (u64, bool) {
    // SAFETY: an out-parameter only.
    let mut now: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: querying the calling thread's alternate stack.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut now) };
    (now.ss_sp as u64, now.ss_flags & libc::SS_DISABLE != 0)
}

/// A span enter checks one cached (run, epoch) pair: it must never keep a thread out of
/// the sampler. A thread that unregistered is registered again at its next enter, and a
/// thread settled under one run is registered again under the next.
#[test]
fn the_settled_cache_never_keeps_a_thread_out() {
    let _turn = test_turn();
    std::thread::spawn(|| {
        let sampler = start(100);
        on_span_enter();
        assert!(current_slot().is_some(), "registered at its first enter");
        on_span_enter();
        unregister_current_thread();
        assert!(current_slot().is_none());
        on_span_enter();
        assert!(
            current_slot().is_some(),
            "registered again after unregistering"
        );
        drop(sampler);
        let sampler = start(100);
        let run = SamplerState::global().running_run().expect("running");
        let registered_run = || REGISTRATION.with(|r| r.borrow().as_ref().map(|r| r.run));
        assert_ne!(
            registered_run(),
            Some(run),
            "still the last run's registration"
        );
        on_span_enter();
        assert_eq!(registered_run(), Some(run), "registered under the new run");
        assert!(current_slot().is_some());
        drop(sampler);
    })
    .join()
    .expect("thread");
}

/// Burns `d` of CPU in a function of its own, whose frames the adoption tests look for.
#[inline(never)]
fn burn_unregistered(d: Duration) -> u64 {
    std::hint::black_box(burn(d))
}

/// Whether `record` holds a frame in [`burn_unregistered`] (its code is well under 4 KiB).
fn in_burn_unregistered(record: &SampleRecord) -> bool {
    let start = burn_unregistered as fn(Duration) -> u64 as usize as u64;
    record.frames()[1..]
        .iter()
        .any(|&ret| ret > start && ret <= start + 4096)
}

/// The adoptions live now of thread `tid`, and whether any has a timer.
fn adoptions_of(tid: libc::pid_t) -> (usize, bool) {
    let slots = SamplerState::global().slots();
    let live: Vec<_> = slots.iter().filter(|s| s.is_adoption_of(tid)).collect();
    (live.len(), live.iter().any(|s| s.has_timer()))
}

/// Issue 40: a thread that never registers (here: with std's small alternate stack, and
/// with none at all, as a C library's thread) is found by the scan and sampled with whole
/// stacks, walked from a copy on the slot's stack; the thread without an alternate stack
/// gets the slot's; when the thread registers itself it takes the adoption back (never
/// two timers), and once a thread is gone the scan releases its slot.
#[test]
fn threads_that_never_register_are_adopted_sampled_and_let_go() {
    let _turn = test_turn();
    let sampler = start(250);
    SamplerState::global().drain_into(|_| {});
    for without_alt_stack in [false, true] {
        let (to_thread, go) = std::sync::mpsc::channel::<()>();
        let (to_test, reply) = std::sync::mpsc::channel::<(libc::pid_t, u64, u64)>();
        let thread = std::thread::spawn(move || {
            if without_alt_stack {
                let off = libc::stack_t {
                    ss_sp: std::ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                // SAFETY: disabling the calling thread's alternate stack.
                unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) };
            }
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            to_test.send((tid, 0, 0)).expect("test");
            go.recv().expect("adopted");
            let before = thread_cpu();
            burn_unregistered(Duration::from_millis(600));
            let burnt = (thread_cpu() - before).as_nanos() as u64;
            to_test
                .send((tid, burnt, current_alt_stack().0))
                .expect("test");
            go.recv().expect("registers");
            register_current_thread().expect("register");
            to_test.send((tid, 0, 0)).expect("test");
            go.recv().expect("ends");
        });
        let (tid, _, _) = reply.recv().expect("thread");
        let scan = adopt::Adopter::new().scan();
        assert!(scan.adopted >= 1, "{scan:?}");
        assert_eq!(adoptions_of(tid), (1, true), "adopted, with a timer");
        assert!(stats().adopted_threads >= 1, "{:?}", stats());
        to_thread.send(()).expect("thread");
        let (mut periods, mut whole, mut records) = (0u64, 0u64, 0u64);
        let mut drain = || {
            SamplerState::global().drain_into(|record| {
                if in_burn_unregistered(record) {
                    records += 1;
                    periods += u64::from(record.weight.max(1));
                    // The walk went on past the test's frames, to the thread's start.
                    if !record.truncated {
                        whole += 1;
                    }
                }
            })
        };
        // Drained as the collector would, so that the thread's ring never fills.
        let (_, burnt, alt) = loop {
            match reply.recv_timeout(Duration::from_millis(50)) {
                Ok(burnt) => break burnt,
                Err(_) => {
                    drain();
                }
            }
        };
        drain();
        let period = 1_000_000_000 / 250;
        eprintln!(
            "adopted (alt stack {}): {records} samples, {periods} periods of {burnt} ns burnt, \
             {whole} whole stacks",
            if without_alt_stack { "none" } else { "std's" }
        );
        assert!(
            periods * period >= burnt * 8 / 10,
            "the adopted thread's CPU is in its samples: {periods} periods of {burnt} ns"
        );
        assert!(
            whole * 10 >= records * 9,
            "{whole} of {records} stacks whole"
        );
        if without_alt_stack {
            let slot_stack = SamplerState::global()
                .slots()
                .iter()
                .find(|s| s.is_adoption_of(tid))
                .and_then(|s| altstack::range_of(s.index()))
                .expect("the adoption's stack");
            assert_eq!(alt, slot_stack.start, "the slot's stack was installed");
        }
        // The thread registers itself: its adoption gives way.
        to_thread.send(()).expect("thread");
        reply.recv().expect("registered");
        assert_eq!(adoptions_of(tid), (0, false), "taken back");
        let scan = adopt::Adopter::new().scan();
        assert_eq!(adoptions_of(tid), (0, false), "not adopted again: {scan:?}");
        to_thread.send(()).expect("thread");
        thread.join().expect("thread");
    }
    // A thread adopted and gone: the next scan releases its slot.
    let (to_test, reply) = std::sync::mpsc::channel();
    let (to_thread, go) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        to_test.send(unsafe { libc::gettid() }).expect("test");
        go.recv().expect("end");
    });
    let tid = reply.recv().expect("tid");
    let mut adopter = adopt::Adopter::new();
    adopter.scan();
    assert_eq!(adoptions_of(tid), (1, true));
    // A listing that misses the live thread (as one can while others exit) releases
    // nothing: absence from a listing is no proof that a thread is gone.
    let scan = adopter.scan_listed(|| {
        let mut listed = adopt::threads()?;
        assert!(listed.remove(&tid), "listed");
        Some(listed)
    });
    assert_eq!(scan.released, 0, "{scan:?}");
    assert_eq!(adoptions_of(tid), (1, true), "kept, timer and all");
    to_thread.send(()).expect("thread");
    thread.join().expect("thread");
    let scan = adopter.scan();
    assert!(scan.released >= 1, "{scan:?}");
    assert_eq!(adoptions_of(tid), (0, false));
    drop(sampler);
    // Every adoption the test process still has loses its timer with the sampler.
    assert_eq!(stats().adopted_threads, 0, "{:?}", stats());
}

/// A thread that blocks `SIGPROF` is not adopted, and is counted once.
#[test]
fn a_thread_blocking_sigprof_is_not_adopted() {
    let _turn = test_turn();
    let sampler = start(100);
    let (to_test, reply) = std::sync::mpsc::channel();
    let (to_thread, go) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        // SAFETY: blocking SIGPROF on this thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPROF);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        // SAFETY: gettid has no preconditions.
        to_test.send(unsafe { libc::gettid() }).expect("test");
        go.recv().expect("end");
    });
    let tid = reply.recv().expect("tid");
    let before = stats().adoptions_blocked;
    let mut adopter = adopt::Adopter::new();
    adopter.scan();
    assert_eq!(adopter.blocking_sightings(tid), 1);
    adopter.scan();
    adopter.scan();
    assert_eq!(adoptions_of(tid), (0, false));
    // Counted at its second sighting only; the process-wide counter may also count other
    // tests' threads seen while they start (every signal blocked until they run).
    assert_eq!(adopter.blocking_sightings(tid), 3);
    assert!(stats().adoptions_blocked > before, "counted: {:?}", stats());
    to_thread.send(()).expect("thread");
    thread.join().expect("thread");
    drop(sampler);
}

/// An adopted thread's handler runs on std's small alternate stack (8 KiB): only the
/// kernel's frame and the handler's own frames land there, the walk is moved onto the
/// slot's stack, and the sample has its whole stack.
#[test]
fn an_adopted_threads_walk_leaves_stds_small_alternate_stack_alone() {
    let _turn = test_turn();
    let sampler = start(1);
    SamplerState::global().drain_into(|_| {});
    let (to_test, reply) = std::sync::mpsc::channel();
    let (to_thread, go) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        to_test.send(unsafe { libc::gettid() }).expect("test");
        go.recv().expect("adopted");
        // SAFETY: an out-parameter only.
        let mut alt: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: querying this thread's alternate stack (std's).
        unsafe { libc::sigaltstack(std::ptr::null(), &mut alt) };
        assert_eq!(
            alt.ss_flags & libc::SS_DISABLE,
            0,
            "std gave the thread one"
        );
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let slot = SamplerState::global()
            .slots()
            .iter()
            .find(|s| s.is_adoption_of(tid))
            .expect("the adoption");
        let (lo, hi) = (alt.ss_sp as usize, alt.ss_sp as usize + alt.ss_size);
        let ours = altstack::range_of(slot.index()).expect("the adoption's stack");
        let (ours_lo, ours_hi) = (ours.start as usize, ours.end as usize);
        for addr in (lo..hi).step_by(8).chain((ours_lo..ours_hi).step_by(8)) {
            // SAFETY: this thread's alternate stack and the slot's, which no signal runs
            // on now.
            unsafe { std::ptr::write_volatile(addr as *mut u64, PAINT) };
        }
        forge_timer_signal(slot.timer_value().to_sival(), 0);
        // SAFETY: as above; reading what the handler left.
        let written =
            |addr: &usize| unsafe { std::ptr::read_volatile(*addr as *const u64) } != PAINT;
        let deepest = (lo..hi).step_by(8).find(written).unwrap_or(hi);
        let walked = (ours_lo..ours_hi)
            .step_by(8)
            .find(written)
            .unwrap_or(ours_hi);
        (hi - deepest, alt.ss_size, ours_hi - walked)
    });
    let tid = reply.recv().expect("tid");
    adopt::Adopter::new().scan();
    assert_eq!(adoptions_of(tid).0, 1);
    to_thread.send(()).expect("thread");
    let (used, size, walked) = thread.join().expect("thread");
    let mut depths = Vec::new();
    SamplerState::global().drain_into(|record| depths.push((record.depth, record.truncated)));
    eprintln!(
        "adopted, on std's alternate stack of {size} bytes: {used} bytes used there, {walked} \
         on the slot's stack; {depths:?}"
    );
    assert!(
        walked > 64,
        "the walk ran on the slot's stack: {walked} bytes"
    );
    // The kernel's frame (1.5–3.4 KB, more with AVX-512) and the handler's frames before
    // the switch (about 1 KB optimised, 3 KB not).
    let budget = if cfg!(debug_assertions) {
        6 * 1024
    } else {
        4 * 1024
    };
    assert!(
        used < budget,
        "more than the kernel's frame and the handler's own frames: {used} bytes"
    );
    assert!(
        depths
            .iter()
            .any(|&(depth, truncated)| depth > 3 && !truncated),
        "the walk ran, on the slot's stack: {depths:?}"
    );
    drop(sampler);
}

/// Past the 64 declined threads the table holds, a thread that declines is counted (it
/// will be adopted unless its name says otherwise); the scan forgets declined threads
/// that are gone, so the table does not stay full.
#[test]
fn declines_past_the_table_are_counted_and_gone_ones_forgotten() {
    let _turn = test_turn();
    let sampler = start(100);
    // Above any pid_max (2^22): no thread has these tids, so tgkill says ESRCH.
    let fake = |i: i32| (1 << 22) + 1 + i;
    let before = stats().declined_unrecorded;
    for i in 0..70 {
        adopt::decline(fake(i));
    }
    let unrecorded = stats().declined_unrecorded - before;
    // Other tests' declined threads may hold entries too: at least 6 went unrecorded.
    assert!((6..=70).contains(&unrecorded), "{unrecorded}");
    assert!(adopt::declined(fake(0)));
    assert!(!adopt::declined(fake(69)));
    adopt::Adopter::new().scan();
    assert!(
        (0..70).all(|i| !adopt::declined(fake(i))),
        "gone ones forgotten"
    );
    let before = stats().declined_unrecorded;
    adopt::decline(fake(100));
    assert!(adopt::declined(fake(100)), "room again");
    assert_eq!(stats().declined_unrecorded, before);
    adopt::Adopter::new().scan();
    drop(sampler);
}
