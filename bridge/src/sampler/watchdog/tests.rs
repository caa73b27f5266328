//! The watchdog against real threads: one blocked in `std::thread::sleep` inside a root,
//! one burning CPU inside a root, one idle outside any root.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceId};

use super::*;
use crate::sampler::{test_turn, Sampler, SamplerConfig};
use crate::span_context::SpanContextGuard;
use crate::symbolize::Symbolizer;
use crate::LocalRoot;

#[test]
fn syscall_lines_parse() {
    assert_eq!(parse_syscall("running\n"), Some(SyscallState::Running));
    assert_eq!(
        parse_syscall("-1 0x7ffd1000 0x401000\n"),
        Some(SyscallState::Blocked {
            sp: 0x7ffd_1000,
            pc: 0x40_1000
        })
    );
    assert_eq!(
        parse_syscall("230 0x1 0x0 0x7f00 0x0 0x0 0x0 0x7ffd2000 0x7f12345\n"),
        Some(SyscallState::InSyscall(Syscall {
            nr: 230,
            arg0: 1,
            sp: 0x7ffd_2000,
            pc: 0x7f1_2345
        }))
    );
    for bad in ["", "x", "230 0x1", "-1 12 0x1", "230 1 2 3 4 5 6 7 8"] {
        assert_eq!(parse_syscall(bad), None, "{bad:?}");
    }
}

#[test]
fn configs_out_of_range_are_refused_naming_the_field() {
    let zero = WatchdogConfig::default().with_threshold(Duration::ZERO);
    assert!(zero
        .validate()
        .unwrap_err()
        .to_string()
        .contains("threshold"));
    let cap = WatchdogConfig::default().with_max_threads_per_tick(0);
    assert!(cap
        .validate()
        .unwrap_err()
        .to_string()
        .contains("max_threads_per_tick"));
    assert!(WatchdogConfig::default().validate().is_ok());
}

#[test]
fn own_memory_copies_fail_cleanly_on_unmapped_addresses() {
    let mut buf = [0u8; 64];
    assert_eq!(copy_own_memory(8, &mut buf), None);
    let data = [7u8; 64];
    assert_eq!(copy_own_memory(data.as_ptr() as u64, &mut buf), Some(64));
    assert_eq!(buf, data);
}

#[inline(never)]
fn watchdog_test_blocks_in_sleep(d: Duration) {
    std::thread::sleep(d);
    std::hint::black_box(());
}

#[inline(never)]
fn watchdog_test_burns_cpu(stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..10_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
    }
    std::hint::black_box(x)
}

fn root(span: u64) -> LocalRoot {
    LocalRoot::new(SpanId::from(span), TraceId::from(0xabc_u128), None)
}

fn names(frames: &[u64], symbolizer: &mut Symbolizer) -> Vec<String> {
    frames
        .iter()
        .enumerate()
        .flat_map(|(i, &a)| symbolizer.frame(a, i > 0).lines)
        .map(|l| l.function.to_string())
        .collect()
}

/// Issue 11 item 3: a root blocked in `std::thread::sleep` is found, its stack names the
/// blocking function under the root's span id, and its looks add up to about the blocked
/// wall time; a CPU-burning root and a thread outside any root give nothing.
#[test]
fn blocked_stacks_name_the_blocking_function() {
    let _turn = test_turn();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    drain_blocked(|_| {});
    let block = Duration::from_millis(300);
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(4));
    let sleeper = {
        let ready = ready.clone();
        std::thread::spawn(move || {
            crate::sampler::register_current_thread().expect("register");
            ready.wait();
            let entered = root(0x51);
            let _root = SpanContextGuard::enter(Some(&entered));
            watchdog_test_blocks_in_sleep(block);
        })
    };
    let burner = {
        let (ready, stop) = (ready.clone(), stop.clone());
        std::thread::spawn(move || {
            crate::sampler::register_current_thread().expect("register");
            ready.wait();
            let entered = root(0xb0);
            let _root = SpanContextGuard::enter(Some(&entered));
            watchdog_test_burns_cpu(&stop)
        })
    };
    let idle = {
        let (ready, stop) = (ready.clone(), stop.clone());
        std::thread::spawn(move || {
            crate::sampler::register_current_thread().expect("register");
            ready.wait();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let config = WatchdogConfig::default();
    let mut scanner = Scanner::new(config.clone());
    ready.wait();
    let started = Instant::now();
    while started.elapsed() < block + Duration::from_millis(100) {
        scanner.tick();
        std::thread::sleep(config.tick());
    }
    stop.store(true, Ordering::Relaxed);
    sleeper.join().expect("sleeper");
    burner.join().expect("burner");
    idle.join().expect("idle");
    let mut records = Vec::new();
    drain_blocked(|r| records.push(r.clone()));
    drop(sampler);

    let mut symbolizer = Symbolizer::new();
    let ours: Vec<&BlockedRecord> = records
        .iter()
        .filter(|r| r.root.and_then(|r| r.span_id()) == Some(SpanId::from(0x51)))
        .collect();
    assert!(
        records
            .iter()
            .all(|r| r.root.and_then(|r| r.span_id()) == Some(SpanId::from(0x51))),
        "only the sleeping root blocks: {records:?}"
    );
    assert!(
        !ours.is_empty(),
        "no blocked look at the sleeper: {:?}",
        stats()
    );
    for record in &ours {
        let stack = names(&record.frames, &mut symbolizer);
        assert!(
            stack
                .iter()
                .any(|f| f.contains("watchdog_test_blocks_in_sleep")),
            "{stack:#?}"
        );
    }
    let delay: u64 = ours.iter().map(|r| r.delay_ns).sum();
    let delay = Duration::from_nanos(delay);
    // Never more than the block; less by the ticks before it could be seen (two when
    // the machine is quiet, more when the watchdog's own ticks are late).
    assert!(
        delay <= block && delay >= block * 6 / 10,
        "blocked {delay:?} of {block:?}: {:?}",
        stats()
    );
    assert_eq!(ours.iter().filter(|r| r.first_look).count(), 1, "one block");
    assert!(
        ours.windows(2)
            .all(|w| std::sync::Arc::ptr_eq(&w[0].frames, &w[1].frames)),
        "one stack taken per block, reused by every later look"
    );
}

/// The frame-pointer candidates are the places holding a frame record — a word followed by
/// a code address — nearest the stack pointer first, whether or not the saved pointer
/// chains (in optimised code the caller of a frame-pointer frame keeps none, so the true
/// record's saved pointer is an arbitrary value); a word not followed by code is none.
/// Each is then tried by unwinding (without them, stacks stop at the first frame that
/// finds its caller through `rbp`, such as `std::thread::sleep`: measured; with only the
/// lowest *chained* record, optimised callers got stale return addresses: measured).
#[cfg(target_arch = "x86_64")]
#[test]
fn frame_pointer_candidates_are_records_nearest_the_stack_pointer_first() {
    let _turn = test_turn();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    let code = names as *const () as u64 + 16;
    let sp = 0x7000_0000u64;
    let mut words = vec![0u64; 32];
    // A lone pointer up the stack followed by a non-code word: not a record.
    words[1] = sp + 8 * 20;
    words[2] = 0x1234;
    // An unchained record: a saved register that is no stack pointer, then code.
    words[6] = 0xdead_beef;
    words[7] = code;
    // Records at words 12 → 18 → 24 → 0 (outermost), each followed by a code address.
    for (at, next) in [(12, sp + 8 * 18), (18, sp + 8 * 24), (24, 0)] {
        words[at] = next;
        words[at + 1] = code;
    }
    let copy: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(
        frame_pointer_candidates(sp, &copy),
        [sp + 8 * 6, sp + 8 * 12, sp + 8 * 18, sp + 8 * 24]
    );
    assert_eq!(guess_frame_pointer(sp, &copy), sp + 8 * 6);
    assert!(frame_pointer_candidates(sp, &[]).is_empty());
    drop(sampler);
}

/// With more blocked threads than the per-tick cap, every one is still looked at (the
/// pass starts where the last one stopped), the rest counted as skipped, and the weights
/// still add up to each block's wall time rather than to the looks taken.
#[test]
fn the_per_tick_cap_rotates_over_blocked_threads() {
    let _turn = test_turn();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    drain_blocked(|_| {});
    let block = Duration::from_millis(400);
    let threads = 6u64;
    let ready = Arc::new(Barrier::new(threads as usize + 1));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let ready = ready.clone();
            std::thread::spawn(move || {
                crate::sampler::register_current_thread().expect("register");
                ready.wait();
                let entered = root(0x100 + i);
                let _root = SpanContextGuard::enter(Some(&entered));
                watchdog_test_blocks_in_sleep(block);
            })
        })
        .collect();
    let config = WatchdogConfig::default().with_max_threads_per_tick(2);
    let mut scanner = Scanner::new(config.clone());
    let skipped_before = stats().skipped;
    ready.wait();
    let started = Instant::now();
    while started.elapsed() < block {
        scanner.tick();
        std::thread::sleep(config.tick());
    }
    for h in handles {
        h.join().expect("sleeper");
    }
    let mut delay = std::collections::HashMap::<u64, u64>::new();
    drain_blocked(|r| {
        let span = r.root.map_or(0, |r| r.span_id_u64());
        *delay.entry(span).or_default() += r.delay_ns;
    });
    drop(sampler);
    assert!(stats().skipped > skipped_before, "the cap was reached");
    for i in 0..threads {
        let d = Duration::from_nanos(delay.get(&(0x100 + i)).copied().unwrap_or(0));
        assert!(
            d <= block && d >= block / 3,
            "thread {i}: {d:?} of {block:?} ({delay:?})"
        );
    }
}

#[inline(never)]
fn watchdog_test_naps_in_a_loop(naps: u32, nap: Duration) {
    for _ in 0..naps {
        std::thread::sleep(nap);
    }
    std::hint::black_box(());
}

/// A poll that blocks in many short calls (a loop of small synchronous reads, say) holds
/// its worker as surely as one long call: each nap is shorter than a tick, so the CPU
/// clock never stands still for a whole tick, but it barely moves. Found, named, and
/// weighted by the wall time minus the CPU time.
#[test]
fn a_loop_of_short_blocking_calls_counts_as_blocked() {
    let _turn = test_turn();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    drain_blocked(|_| {});
    let before = stats();
    let (naps, nap) = (100, Duration::from_millis(3));
    let ready = Arc::new(Barrier::new(2));
    let napper = {
        let ready = ready.clone();
        std::thread::spawn(move || {
            crate::sampler::register_current_thread().expect("register");
            ready.wait();
            let started = Instant::now();
            let entered = root(0x4a);
            let _root = SpanContextGuard::enter(Some(&entered));
            watchdog_test_naps_in_a_loop(naps, nap);
            started.elapsed()
        })
    };
    let config = WatchdogConfig::default();
    let mut scanner = Scanner::new(config.clone());
    ready.wait();
    while !napper.is_finished() {
        scanner.tick();
        std::thread::sleep(config.tick());
    }
    let held = napper.join().expect("napper");
    // The watchdog keeps ticking: the next tick sees the poll over and ends its run.
    scanner.tick();
    // The wake check comes right after the copy, not after the unwind: a thread that
    // wakes every 3 ms is rarely caught waking inside it (with the unwind inside, half
    // the captures or more were discarded; now under one in ten, even under load).
    let after = stats();
    let (taken, discarded) = (
        after.captures - before.captures,
        after.discarded_woke - before.discarded_woke,
    );
    assert!(
        discarded * 2 < taken,
        "{discarded} discarded, {taken} taken"
    );
    let mut records = Vec::new();
    drain_blocked(|r| records.push(r.clone()));
    drop(sampler);
    let ours: Vec<&BlockedRecord> = records
        .iter()
        .filter(|r| r.root.and_then(|r| r.span_id()) == Some(SpanId::from(0x4a)))
        .collect();
    assert!(!ours.is_empty(), "{:?}", stats());
    let delay = Duration::from_nanos(ours.iter().map(|r| r.delay_ns).sum());
    // All of it but the threshold before the first look counts and up to a tick after the
    // last: stacks are taken right after each wake is checked for, and time whose stack
    // could not be taken goes to the run's last stack.
    assert!(
        delay <= held && delay >= held * 7 / 10,
        "blocked {delay:?} of {held:?} held: {:?}",
        stats()
    );
    let mut symbolizer = Symbolizer::new();
    for record in &ours {
        let stack = names(&record.frames, &mut symbolizer);
        assert!(
            stack
                .iter()
                .any(|f| f.contains("watchdog_test_naps_in_a_loop")),
            "{stack:#?}"
        );
    }
}

/// A run of blocked looks ends (the poll is over, or the thread mostly ran): the blocked
/// time it saw but could take no stack for goes to the run's last stack, or, when it took
/// none, is counted as unattributed. Never silently lost.
#[test]
fn a_runs_untaken_time_goes_to_its_last_stack_or_is_counted() {
    let _turn = test_turn();
    drain_blocked(|_| {});
    let taken = Block {
        frames: Arc::from(&[0x1000u64, 0x2000][..]),
        truncated: false,
        syscall: 230,
    };
    let run = |last: Option<Block>| Tracked {
        generation: 1,
        seq: 2,
        root: root(0x5b).label(),
        first_seen: 0,
        cpu: Some(0),
        last_look: 0,
        block: None,
        run: last,
        unattributed: 7_000_000,
        seen: 1,
    };
    let before = stats().unattributed_ns;
    let mut with_stack = run(Some(taken));
    with_stack.end_run();
    let mut without = run(None);
    without.end_run();
    // Ended twice: nothing more.
    without.end_run();
    let mut records = Vec::new();
    drain_blocked(|r| records.push(r.clone()));
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record.root, Some(root(0x5b).label()));
    assert_eq!(record.delay_ns, 7_000_000);
    assert_eq!(&record.frames[..], &[0x1000, 0x2000]);
    assert!(
        !record.first_look,
        "the run's contention was counted at its first look"
    );
    assert_eq!(stats().unattributed_ns - before, 7_000_000);
    assert!(with_stack.run.is_none() && with_stack.unattributed == 0);
}

#[inline(never)]
fn watchdog_test_waits_for_a_lock(lock: &std::sync::Mutex<u64>) -> u64 {
    let value = *lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    std::hint::black_box(value)
}

/// A contended `std::sync::Mutex` inside a poll (blocked in `futex(2)`) is found and its
/// stack names the function waiting for the lock.
#[test]
fn a_contended_mutex_names_the_waiting_function() {
    let _turn = test_turn();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    drain_blocked(|_| {});
    let lock = Arc::new(std::sync::Mutex::new(7u64));
    let held = lock.lock().expect("lock");
    let ready = Arc::new(Barrier::new(2));
    let waiter = {
        let (lock, ready) = (lock.clone(), ready.clone());
        std::thread::spawn(move || {
            crate::sampler::register_current_thread().expect("register");
            ready.wait();
            let entered = root(0x10c);
            let _root = SpanContextGuard::enter(Some(&entered));
            watchdog_test_waits_for_a_lock(&lock)
        })
    };
    let config = WatchdogConfig::default();
    let mut scanner = Scanner::new(config.clone());
    ready.wait();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(200) {
        scanner.tick();
        std::thread::sleep(config.tick());
    }
    drop(held);
    assert_eq!(waiter.join().expect("waiter"), 7);
    let mut records = Vec::new();
    drain_blocked(|r| records.push(r.clone()));
    drop(sampler);
    let ours: Vec<&BlockedRecord> = records
        .iter()
        .filter(|r| r.root.and_then(|r| r.span_id()) == Some(SpanId::from(0x10c)))
        .collect();
    assert!(!ours.is_empty(), "{:?}", stats());
    let mut symbolizer = Symbolizer::new();
    for record in &ours {
        let stack = names(&record.frames, &mut symbolizer);
        assert!(
            stack
                .iter()
                .any(|f| f.contains("watchdog_test_waits_for_a_lock")),
            "{stack:#?}"
        );
    }
}

/// A slot let go by its thread and claimed by another between the tick's read of the
/// record and the look: the tid and CPU clock the look reads are the new owner's, so the
/// old record's "same block" must not be pushed again (it was, once, before the look
/// checked the record after reading the clock).
#[test]
fn a_slot_reclaimed_between_the_read_and_the_look_pushes_nothing() {
    let _turn = test_turn();
    let sampler = Sampler::start(SamplerConfig::default()).expect("sampler");
    // Another test's threads may take the freed slot first: try a few times.
    for _ in 0..20 {
        // The first owner: registers, enters a root, reports what the tick would have
        // read, and exits (its slot is let go).
        let (slot, generation, seq) = std::thread::spawn(move || {
            crate::sampler::register_current_thread().expect("register");
            let entered = root(0x7e);
            let _root = SpanContextGuard::enter(Some(&entered));
            let slot = super::super::current_slot().expect("slot");
            let generation = slot.generation();
            let (seq, _) = slot.read_cell_if_owned(generation).expect("record");
            (slot, generation, seq)
        })
        .join()
        .expect("first owner");
        drain_blocked(|_| {});
        let _ = sampler.drain(|_| {});
        // The second owner, on the same slot if it is the one handed out next.
        let (claimed, go_on) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let second = {
            let (claimed, go_on) = (claimed.clone(), go_on.clone());
            std::thread::spawn(move || {
                crate::sampler::register_current_thread().expect("register");
                let entered = root(0x7f);
                let _root = SpanContextGuard::enter(Some(&entered));
                let same = super::super::current_slot().is_some_and(|s| std::ptr::eq(s, slot));
                claimed.wait();
                go_on.wait();
                same
            })
        };
        claimed.wait();
        let block = Block {
            frames: Arc::from(&[0x1000u64, 0x2000][..]),
            truncated: false,
            syscall: 230,
        };
        // What the watchdog kept of the first owner: blocked, its stack taken, and a CPU
        // clock the second owner's cannot exceed (so "no CPU since" would hold).
        let mut tracked = Tracked {
            generation,
            seq,
            root: root(0x7e).label(),
            first_seen: 0,
            cpu: Some(u64::MAX),
            last_look: 0,
            block: Some(block.clone()),
            run: Some(block),
            unattributed: 0,
            seen: 1,
        };
        let look = Look {
            slot,
            generation,
            seq,
            now: monotonic_ns(),
            threshold: 0,
        };
        let mut scanner = Scanner::new(WatchdogConfig::default());
        look.examine(&mut tracked, &mut scanner.stack, &mut scanner.record);
        go_on.wait();
        let same_slot = second.join().expect("second owner");
        let mut pushed = Vec::new();
        drain_blocked(|r| pushed.push(r.root));
        if !same_slot {
            continue;
        }
        assert!(
            pushed.iter().all(|r| *r != Some(root(0x7e).label())),
            "a look at the reclaimed slot pushed the old root's block: {pushed:?}"
        );
        return;
    }
    panic!("the freed slot was never handed out again to the next thread");
}
