//! In-use memory by span (issue 43, the optional part): with tracking on, the allocation
//! profiles hold `inuse_objects` / `inuse_space`, and they say what each root's
//! allocations still hold at the hand-over: a root that keeps its allocations shows them
//! (within the sampling's error), one that freed them shows nothing, a `Vec` grown by
//! `realloc` shows its last block, and memory freed later leaves the next profile. The
//! allocator's tracked paths keep every byte: shrinking in place, growing out of a cell,
//! large blocks followed across `realloc`, frees after the profiler stopped.

mod common;

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use common::{function_names, span_label, test_root as root};
use otel_profiling::{ProfilingAllocator, SpanContextGuard};

#[global_allocator]
static ALLOC: ProfilingAllocator = ProfilingAllocator::system();

/// The mean bytes between samples here: small enough for tight estimates in a short test.
const MEAN: u64 = 16 * 1024;

/// `count` blocks of `size` bytes, filled, with a 20 ms pause after each 64 KiB (about
/// 4 samples: the thread's buffer, 64 samples drained every 100 ms, never fills).
#[inline(never)]
fn hold(count: usize, size: usize) -> Vec<Vec<u8>> {
    let mut kept = Vec::with_capacity(count);
    let mut unpaused = 0;
    for i in 0..count {
        kept.push(vec![(i % 251) as u8; size]);
        unpaused += size;
        if unpaused >= 64 * 1024 {
            std::thread::sleep(Duration::from_millis(20));
            unpaused = 0;
        }
    }
    kept
}

/// A `Vec` grown a byte at a time to 3 MB: a chain of `realloc`s (its last block 4 MiB).
#[inline(never)]
fn grow() -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..3_000_000u32 {
        v.push(i as u8);
    }
    v
}

/// In the newest allocation profile of `dir`: per `span_id` label ("" for none),
/// (inuse_objects, inuse_space), and whether `hold` was on every in-use stack of root
/// `0x1`.
fn newest_inuse(dir: &Path) -> HashMap<String, (i64, i64)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with("_alloc.pb.gz"))
        .collect();
    files.sort();
    let path = files.last().expect("an allocation profile");
    let profile =
        otel_profiling_pprof::decode(&std::fs::read(path).expect("read")).expect("valid pprof");
    let s = |i: i64| profile.string_table[i as usize].clone();
    let types: Vec<String> = profile.sample_type.iter().map(|t| s(t.r#type)).collect();
    assert_eq!(
        types,
        [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space"
        ],
        "Go's heap profile layout"
    );
    let mut by_span = HashMap::new();
    for sample in &profile.sample {
        let span = span_label(&profile, sample);
        if span == format!("{:016x}", 1) && sample.value[3] > 0 {
            let stack: Vec<String> = sample
                .location_id
                .iter()
                .flat_map(|&id| function_names(&profile, id))
                .collect();
            assert!(
                stack.iter().any(|f| f.ends_with("alloc_inuse::hold")),
                "held memory is named by the function that allocated it: {stack:?}"
            );
            assert!(
                !stack.iter().any(|f| f.contains("allocations::hook::")),
                "the hook's frames are left out: {stack:?}"
            );
        }
        let total = by_span.entry(span).or_insert((0, 0));
        total.0 += sample.value[2];
        total.1 += sample.value[3];
    }
    by_span
}

fn span(id: u64) -> String {
    format!("{id:016x}")
}

#[test]
fn in_use_memory_is_what_each_root_still_holds() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-inuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let profiler = otel_profiling::Profiler::builder()
        .output_dir(&dir)
        .allocation_sample_bytes(MEAN)
        .allocation_inuse(true)
        .interval(Duration::from_secs(1))
        .start()
        .expect("profiler");
    assert!(otel_profiling::allocations::stats().inuse, "tracking on");

    let (keeper, churner, grower, later) = (
        root(0x1, "GET /keep"),
        root(0x2, "GET /churn"),
        root(0x3, "GET /grow"),
        root(0x4, "GET /later"),
    );
    // Root 1 keeps 4,000 × 256 B (1 MB), 500 × 4 KiB (2 MB) and 20 × 200 kB (4 MB):
    // 7.0 MB in 4,520 objects, on another thread than the one that frees them.
    let kept = {
        let keeper = keeper.clone();
        std::thread::spawn(move || {
            otel_profiling::sampler::register_current_thread().expect("register");
            let _in = SpanContextGuard::enter(Some(&keeper));
            [hold(4_000, 256), hold(500, 4_096), hold(20, 200_000)]
        })
        .join()
        .expect("keeper")
    };
    let kept_bytes: usize = kept.iter().flatten().map(Vec::len).sum();
    // Root 2 allocates the same and frees it all.
    {
        let _in = SpanContextGuard::enter(Some(&churner));
        black_box([hold(4_000, 256), hold(500, 4_096), hold(20, 200_000)]);
    }
    // Root 3 grows a Vec to 3 MB by `realloc`s and keeps it.
    let grown = {
        let _in = SpanContextGuard::enter(Some(&grower));
        grow()
    };
    assert!(profiler.flush(Duration::from_secs(10)), "flushed");
    let stats = otel_profiling::allocations::stats();
    eprintln!("{stats:?}");
    assert!(stats.inuse_tracked > 0, "{stats:?}");
    assert_eq!(stats.inuse_untracked, 0, "room for every sample: {stats:?}");
    assert_eq!(stats.dropped, 0, "paced: no buffer filled: {stats:?}");
    let inuse = newest_inuse(&dir);
    eprintln!("{inuse:?}");

    // Root 1: the 200 kB blocks are all sampled (4 MB exactly), the others about 64 and
    // 128 times: a standard error of about 3 % on the bytes, 12 % on the objects.
    let (objects, bytes) = inuse[&span(1)];
    let error = bytes as f64 / kept_bytes as f64 - 1.0;
    assert!(
        error.abs() < 0.15,
        "root 1 holds {kept_bytes} B, estimated {bytes}"
    );
    let error = objects as f64 / 4_520.0 - 1.0;
    assert!(
        error.abs() < 0.45,
        "root 1 holds 4,520 objects, estimated {objects}"
    );
    // Root 2 freed everything: nothing of it is in use.
    assert_eq!(
        inuse.get(&span(2)).copied().unwrap_or_default(),
        (0, 0),
        "freed memory is not in use"
    );
    // Root 3: its Vec's last block (4 MiB, surely sampled); the blocks it grew out of
    // are gone.
    let (_, bytes) = inuse[&span(3)];
    assert_eq!(grown.capacity(), 4 << 20);
    let error = bytes as f64 / grown.capacity() as f64 - 1.0;
    assert!(error.abs() < 0.05, "root 3 holds 4 MiB, estimated {bytes}");

    // Root 1's memory freed (its contents intact first); root 4 keeps something, so that
    // a new profile is written: root 1 is no longer in use there.
    for (i, block) in kept[0].iter().enumerate() {
        assert!(
            block.iter().all(|&b| b == (i % 251) as u8),
            "block {i} intact"
        );
    }
    drop(kept);
    let later_kept = {
        let _in = SpanContextGuard::enter(Some(&later));
        hold(200, 4_096)
    };
    std::thread::sleep(Duration::from_millis(1_100));
    assert!(profiler.flush(Duration::from_secs(10)), "flushed");
    let inuse = newest_inuse(&dir);
    eprintln!("{inuse:?}");
    assert_eq!(
        inuse.get(&span(1)).copied().unwrap_or_default(),
        (0, 0),
        "root 1's memory was freed"
    );
    assert!(inuse[&span(4)].1 > 0, "root 4 holds memory");
    assert!(inuse[&span(3)].1 > 0, "root 3 still holds its Vec");

    tracked_paths_keep_every_byte(&profiler);

    assert!(profiler.shutdown(Duration::from_secs(10)), "shut down");
    // Freed after the profiler stopped: the cells go back all the same.
    assert!(!otel_profiling::allocations::stats().inuse);
    drop(later_kept);
    drop(grown);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every allocation sampled (a mean of one byte): the allocator's tracked paths, checked
/// by what they keep.
fn tracked_paths_keep_every_byte(profiler: &otel_profiling::Profiler) {
    profiler.set_allocation_sample_bytes(1).expect("mean");
    // A new mean takes effect within a MiB of the thread's allocations.
    for _ in 0..4 {
        black_box(vec![0u8; 512 * 1024]);
    }
    let before = otel_profiling::allocations::stats().inuse_tracked;
    // Small blocks: each in a cell.
    let boxes: Vec<Box<[u8; 100]>> = (0..100).map(|i| Box::new([i as u8; 100])).collect();
    let tracked = otel_profiling::allocations::stats().inuse_tracked;
    assert!(tracked >= before + 100, "{before} → {tracked}");
    // Shrunk in place, then grown out of its cell, contents kept.
    let mut v: Vec<u8> = Vec::with_capacity(1_000);
    v.extend((0..1_000u32).map(|i| i as u8));
    v.truncate(100);
    let at = v.as_ptr();
    v.shrink_to_fit();
    assert_eq!(v.as_ptr(), at, "a cell shrinks in place");
    v.reserve_exact(5_000);
    assert!(
        v.iter().enumerate().all(|(i, &b)| b == i as u8),
        "grown, kept"
    );
    // A large block followed across a shrinking `realloc`, then freed.
    let mut large: Vec<u8> = vec![7; 100_000];
    large.truncate(80_000);
    large.shrink_to_fit();
    assert!(large.iter().all(|&b| b == 7));
    let zeroed = vec![0u64; 1_000];
    assert!(zeroed.iter().all(|&w| w == 0), "a reused cell is zeroed");
    for (i, b) in boxes.iter().enumerate() {
        assert!(b.iter().all(|&x| x == i as u8), "box {i} intact");
    }
    drop((boxes, v, large, zeroed));
    let after = otel_profiling::allocations::stats().inuse_tracked;
    assert!(after + 100 <= tracked + 10, "freed: {tracked} → {after}");
    profiler.set_allocation_sample_bytes(MEAN).expect("mean");
}
