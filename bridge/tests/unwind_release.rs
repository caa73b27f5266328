//! Complete stacks whatever the build: the sampler unwinds with `.eh_frame` call-frame
//! information, so it needs no frame pointers. The check does not depend on how this
//! test is built; run it in release too (`cargo test --release --test unwind_release`),
//! where rustc keeps no frame pointers. Also: no allocation in the signal handler, and a
//! library `dlopen`ed while sampling is unwound after `refresh_modules`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use otel_profiling::sampler::{self, Sampler, SamplerConfig};

/// Counts the allocations and frees of each thread, signal handlers included.
struct CountingAllocator;

thread_local! {
    // `const`, no destructor: a plain TLS slot, safe to touch from a signal handler.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_allocation() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller's layout is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_allocation();
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The innermost function: spins on the CPU without calls in its hot loop.
#[inline(never)]
fn inner_c(duration: Duration) -> u64 {
    let start = common::thread_cpu_time();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    loop {
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        x = std::hint::black_box(x);
        if common::thread_cpu_time() - start >= duration {
            return x;
        }
    }
}

/// Uses its callee's result after the call, so the call is not a tail call.
#[inline(never)]
fn middle_b(duration: Duration) -> u64 {
    std::hint::black_box(inner_c(std::hint::black_box(duration))).rotate_left(3)
}

#[inline(never)]
fn outer_a(duration: Duration) -> u64 {
    std::hint::black_box(middle_b(std::hint::black_box(duration))) ^ 0x5555
}

/// The function an address belongs to; `addr` is a lookup address (return addresses
/// minus one).
fn function_of(addr: u64, cache: &mut HashMap<u64, String>) -> String {
    cache
        .entry(addr)
        .or_insert_with(|| {
            let mut name = String::new();
            backtrace::resolve(addr as *mut c_void, |symbol| {
                if name.is_empty() {
                    name = symbol.name().map(|n| n.to_string()).unwrap_or_default();
                }
            });
            name
        })
        .clone()
}

/// Symbolized frames of a record: entry 0 as is, return addresses minus one.
fn symbolize(frames: &[u64], cache: &mut HashMap<u64, String>) -> Vec<String> {
    frames
        .iter()
        .enumerate()
        .map(|(i, &a)| function_of(if i == 0 { a } else { a - 1 }, cache))
        .collect()
}

/// Whether `names` holds each needle, in this order, after entry 0.
fn has_callers_in_order(names: &[String], needles: &[&str]) -> bool {
    let mut at = 1;
    for needle in needles {
        match names[at.min(names.len())..]
            .iter()
            .position(|n| n.contains(needle))
        {
            Some(i) => at += i + 1,
            None => return false,
        }
    }
    true
}

#[test]
#[inline(never)] // its own frame, checked below
fn complete_stacks_without_frame_pointers() {
    let _turn = common::turn();
    let started = Instant::now();
    let sampler = Sampler::start(
        SamplerConfig::default()
            .with_frequency_hz(sampler::MAX_FREQUENCY_HZ)
            .with_ring_capacity(4096),
    )
    .expect("start");
    eprintln!(
        "Sampler::start took {:?} ({:?})",
        started.elapsed(),
        sampler::module_stats()
    );
    sampler.register_current_thread().expect("register");
    sampler.drain(|_| {});
    let taken_before = sampler.stats().taken;
    // Rounds of 400 ms of CPU until at least 60 samples landed in inner_c (at most 6 s):
    // on a loaded machine the kernel delivers fewer of the timer's signals to that frame
    // (49 of 189 in one 1.2 s run of a loaded CI machine).
    let mut cache = HashMap::new();
    let mut records = Vec::new();
    let (mut result, mut allocations) = (0, 0);
    for _ in 0..15 {
        // Only the spins count: the drains and names below allocate on purpose.
        let allocations_before = ALLOCATIONS.with(Cell::get);
        result ^= outer_a(Duration::from_millis(400));
        allocations += ALLOCATIONS.with(Cell::get) - allocations_before;
        sampler.drain(|r| records.push((r.frames().to_vec(), r.truncated)));
        let landed = records
            .iter()
            .filter(|(frames, _)| {
                frames
                    .first()
                    .is_some_and(|pc| function_of(*pc, &mut cache).contains("inner_c"))
            })
            .count();
        if landed >= 60 {
            break;
        }
    }
    let stats = sampler.stats();
    drop(sampler);
    std::hint::black_box(result);

    let this_test = "complete_stacks_without_frame_pointers";
    let (mut in_inner, mut complete, mut untruncated) = (0u64, 0u64, 0u64);
    let mut example = None;
    let mut failures = Vec::new();
    for (frames, truncated) in &records {
        let names = symbolize(frames, &mut cache);
        if !names[0].contains("inner_c") {
            continue;
        }
        in_inner += 1;
        if !truncated {
            untruncated += 1;
        }
        if has_callers_in_order(&names, &["middle_b", "outer_a", this_test]) {
            complete += 1;
            example.get_or_insert(names);
        } else if failures.len() < 3 {
            failures.push((names, *truncated));
        }
    }
    eprintln!(
        "unwind: {} records, {in_inner} in inner_c, {complete} with middle_b/outer_a/test \
         ({:.1} %), {untruncated} reached the outermost frame; {} samples during the spin, \
         {allocations} allocations on this thread meanwhile; {stats:?}; {:?}",
        records.len(),
        100.0 * complete as f64 / in_inner.max(1) as f64,
        stats.taken - taken_before,
        sampler::module_stats(),
    );
    eprintln!("example stack: {example:#?}");
    if !failures.is_empty() {
        eprintln!("incomplete examples: {failures:#?}");
    }
    assert!(in_inner >= 50, "too few samples in inner_c: {in_inner}");
    assert!(
        complete * 10 >= in_inner * 9,
        "under 90 % complete: {complete} of {in_inner}"
    );
    assert!(
        untruncated * 10 >= in_inner * 9,
        "under 90 % reached the outermost frame: {untruncated} of {in_inner}"
    );
    // The handler ran on this thread during the spin and allocated nothing.
    assert!(stats.taken - taken_before >= 50);
    assert_eq!(allocations, 0, "allocations on the sampled thread");
}

/// Calls `f` (a libm function) in a loop for `duration` of CPU time.
#[inline(never)]
fn call_libm(f: extern "C" fn(f64) -> f64, duration: Duration) -> f64 {
    let start = common::thread_cpu_time();
    let mut acc = 0.5f64;
    loop {
        for i in 0..10_000 {
            acc = f(std::hint::black_box(acc + f64::from(i)));
        }
        if common::thread_cpu_time() - start >= duration {
            return acc;
        }
    }
}

/// The file of the loaded object that holds `addr`.
fn object_of(addr: u64) -> String {
    // SAFETY: plain FFI with an out-parameter; the name is copied before returning.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    }
}

#[test]
#[inline(never)]
fn a_library_loaded_while_sampling_is_unwound_after_refresh() {
    let _turn = common::turn();
    let libm = c"libm.so.6";
    // SAFETY: RTLD_NOLOAD only looks the library up.
    let preloaded = unsafe {
        let h = libc::dlopen(libm.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    };
    let started = Instant::now();
    let sampler = Sampler::start(
        SamplerConfig::default()
            .with_frequency_hz(sampler::MAX_FREQUENCY_HZ)
            .with_ring_capacity(4096),
    )
    .expect("start");
    eprintln!(
        "Sampler::start took {:?} ({:?})",
        started.elapsed(),
        sampler::module_stats()
    );
    sampler.register_current_thread().expect("register");
    let before = sampler::module_stats();
    // SAFETY: loading a system library and looking up `cos`, whose C signature is
    // `double cos(double)`.
    let (handle, cos) = unsafe {
        let handle = libc::dlopen(libm.as_ptr(), libc::RTLD_NOW);
        assert!(!handle.is_null(), "dlopen libm");
        let sym = libc::dlsym(handle, c"cos".as_ptr());
        assert!(!sym.is_null(), "dlsym cos");
        (
            handle,
            std::mem::transmute::<*mut c_void, extern "C" fn(f64) -> f64>(sym),
        )
    };

    // Not refreshed yet: samples in libm stop at their first frame and are counted.
    let stale = sampler.stats();
    std::hint::black_box(call_libm(cos, Duration::from_millis(200)));
    let unrefreshed = sampler.stats();
    sampler.drain(|_| {});
    let refresh_started = Instant::now();
    let refreshed = sampler::refresh_modules();
    let refresh_time = refresh_started.elapsed();
    let after = sampler::module_stats();
    let no_change = Instant::now();
    let refreshed_again = sampler::refresh_modules();
    let no_change = no_change.elapsed();

    std::hint::black_box(call_libm(cos, Duration::from_millis(500)));
    let mut records = Vec::new();
    sampler.drain(|r| records.push((r.frames().to_vec(), r.truncated)));
    let final_stats = sampler.stats();

    // Judged while libm is still mapped.
    let mut cache = HashMap::new();
    let (mut in_libm, mut complete) = (0u64, 0u64);
    for (frames, _) in &records {
        if !object_of(frames[0]).contains("libm") {
            continue;
        }
        in_libm += 1;
        let names = symbolize(frames, &mut cache);
        if has_callers_in_order(
            &names,
            &[
                "call_libm",
                "a_library_loaded_while_sampling_is_unwound_after_refresh",
            ],
        ) {
            complete += 1;
        }
    }
    // SAFETY: `cos` is not called after this.
    unsafe { libc::dlclose(handle) };
    let unloaded = sampler::refresh_modules();
    let after_unload = sampler::module_stats();
    drop(sampler);
    eprintln!(
        "dlopen: libm preloaded {preloaded}; unknown_pc {} -> {} before refresh; refresh \
         published {refreshed} in {refresh_time:?} ({before:?} -> {after:?}), again {refreshed_again} \
         in {no_change:?}; after refresh {complete} of {in_libm} libm samples complete; \
         {final_stats:?}; after dlclose {unloaded} {after_unload:?}",
        stale.unknown_pc, unrefreshed.unknown_pc,
    );
    if !preloaded {
        assert!(
            unrefreshed.unknown_pc > stale.unknown_pc,
            "libm code is unknown before the refresh"
        );
        assert!(refreshed, "the refresh sees libm");
        assert_eq!(after.objects, before.objects + 1);
        assert!(after.published > before.published);
        if unloaded {
            assert_eq!(after_unload.objects, before.objects, "libm was removed");
        }
    }
    assert!(!refreshed_again, "nothing changed since the last refresh");
    assert!(in_libm >= 20, "too few samples in libm: {in_libm}");
    assert!(
        complete * 10 >= in_libm * 9,
        "under 90 % complete: {complete} of {in_libm}"
    );
}
