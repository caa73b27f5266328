//! A forked child of a process sampling allocations with the crate's allocator: the
//! allocator passes through in the child (the parent's threads, rings and shared buffer
//! are not the child's) until a profiler is set up there, which samples again, through
//! registered and unregistered threads alike. Children are forked while parent threads
//! are inside the hook, registered and not; each is given 10 s (a hang fails the test).
//! The parent tracks in-use memory: a child frees the parent's tracked blocks (arena
//! cells, by address, as in the parent) with their contents intact, and tracks its own
//! once its profiler asks it to.

mod common;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use otel_profiling::{Profiler, ProfilingAllocator};

#[global_allocator]
static ALLOC: ProfilingAllocator = ProfilingAllocator::system();

/// A small mean: parent threads are in the hook's sampled path often at the fork.
const MEAN: u64 = 4 * 1024;

/// The child's mean: its ~64 samples fit the buffers, so none is dropped.
const CHILD_MEAN: u64 = 64 * 1024;

fn profiler(dir: &std::path::Path, mean: u64) -> Profiler {
    Profiler::builder()
        .output_dir(dir)
        .allocation_sample_bytes(mean)
        .allocation_inuse(true)
        .interval(Duration::from_millis(200))
        .start()
        .expect("profiler")
}

/// 2 MB in 4 KiB allocations, each freed at once.
fn allocate() {
    for _ in 0..500 {
        black_box(vec![1u8; 4_096]);
    }
}

/// What a child checks; its exit code says which check failed.
fn child(dir: &std::path::Path, held: Vec<Vec<u8>>) -> i32 {
    let before = otel_profiling::allocations::stats();
    if before.sample_bytes != 0 {
        return 2; // the inherited mean still in effect
    }
    if before.inuse {
        return 9; // tracking inherited
    }
    // The parent's blocks, many of them tracked in cells: intact, and freed here.
    if !held
        .iter()
        .enumerate()
        .all(|(i, b)| b.iter().all(|&x| x == i as u8))
    {
        return 10;
    }
    drop(held);
    allocate();
    let after = otel_profiling::allocations::stats();
    if after.samples != before.samples {
        return 3; // sampled before a profiler was set up here
    }
    let profiler = profiler(dir, CHILD_MEAN);
    allocate();
    std::thread::spawn(allocate).join().expect("thread");
    // Taken before the flush: each must be in its profiles after it (samples of the
    // flush's own allocations may come on top).
    let taken = otel_profiling::allocations::stats().samples - after.samples;
    if !profiler.flush(Duration::from_secs(5)) {
        return 4;
    }
    let in_profiles = profiler.stats().alloc_samples_in_profiles;
    if !profiler.shutdown(Duration::from_secs(5)) {
        return 4;
    }
    let now = otel_profiling::allocations::stats();
    // 4 MB at a 64 KiB mean: ~64 samples, half of them on the unregistered thread.
    if now.samples < after.samples + 30 {
        return 5;
    }
    if now.unregistered < after.unregistered + 12 {
        return 6; // the shared buffer or copy buffers held by parent threads
    }
    if now.dropped != after.dropped {
        return 7;
    }
    if in_profiles < taken || in_profiles > now.samples - after.samples {
        return 8;
    }
    // Its own tracked blocks: some kept now.
    let kept: Vec<Vec<u8>> = (0..100).map(|_| vec![1u8; 4_096]).collect();
    let tracked = otel_profiling::allocations::stats().inuse_tracked;
    drop(kept);
    if tracked == 0 {
        return 11;
    }
    0
}

#[test]
fn children_pass_through_until_they_profile_again() {
    let _turn = common::turn();
    let dir =
        std::env::temp_dir().join(format!("otel-profiling-alloc-fork-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let parent = profiler(&dir.join("parent"), MEAN);
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = [true, false]
        .into_iter()
        .map(|registered| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                if registered {
                    otel_profiling::sampler::register_current_thread().expect("register");
                }
                while !stop.load(Ordering::Relaxed) {
                    allocate();
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // 400 KiB the parent keeps, about a hundred blocks of it tracked.
    let held: Vec<Vec<u8>> = (0..100).map(|i| vec![i as u8; 4_096]).collect();
    assert!(otel_profiling::allocations::stats().inuse_tracked > 0);
    for i in 0..8 {
        let dir = dir.join(format!("child-{i}"));
        let held = &held;
        let code = common::run_child(move || {
            // SAFETY: the child's own copy of the parent's `held`, taken over here: the
            // child never touches the original again (it leaves with `_exit`).
            let held = unsafe { std::ptr::read(held) };
            child(&dir, held)
        });
        assert_eq!(
            code,
            Some(0),
            "child {i}: 2 inherited mean, 3 sampled before setup, 4 shutdown failed, 5 too few \
             samples, 6 unregistered thread not sampled, 7 dropped, 8 not all in profiles, 9 \
             tracking inherited, 10 a parent's block damaged, 11 nothing tracked, None hung"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for thread in busy {
        thread.join().expect("allocating thread");
    }
    assert!(parent.shutdown(Duration::from_secs(5)));
    let stats = otel_profiling::allocations::stats();
    assert!(stats.unregistered > 0, "{stats:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
