//! The `#[global_allocator]` wrapper.

use std::alloc::{GlobalAlloc, Layout, System};

use super::hook::on_alloc;

/// A global allocator that samples allocations by bytes for the profiler, passing every
/// call to `A` (the system allocator by default; jemalloc, mimalloc or any other works
/// the same way).
///
/// ```
/// #[global_allocator]
/// static ALLOC: otel_profiling::ProfilingAllocator = otel_profiling::ProfilingAllocator::system();
///
/// let v: Vec<u8> = Vec::with_capacity(1 << 20);
/// assert!(otel_profiling::allocations::stats().installed);
/// # drop(v);
/// ```
///
/// Until a profiler is set up (and after it stops, and in a forked child until one is set
/// up there) it only passes calls through, with a thread-local countdown that looks at
/// the setting once a MiB. With a profiler running, each allocation subtracts its size
/// from the thread's countdown; the one that takes it to zero is sampled (its stack and
/// the local root running on the thread) and a new countdown is drawn, exponential with
/// mean [`ProfilerBuilder::allocation_sample_bytes`](crate::ProfilerBuilder::allocation_sample_bytes)
/// (default 512 KiB). `realloc` counts the block's new size when it grows (the bytes a
/// `Vec` doubling asks for), and nothing when it shrinks; `alloc_zeroed` counts as
/// `alloc`; `dealloc` costs nothing. See `docs/allocations.md`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProfilingAllocator<A = System> {
    inner: A,
}

impl<A> ProfilingAllocator<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> ProfilingAllocator<A> {
        ProfilingAllocator { inner }
    }

    /// The wrapped allocator.
    pub const fn inner(&self) -> &A {
        &self.inner
    }
}

impl ProfilingAllocator<System> {
    /// Wraps the system allocator.
    pub const fn system() -> ProfilingAllocator<System> {
        ProfilingAllocator { inner: System }
    }
}

// SAFETY: every call is passed to `inner` with the caller's arguments unchanged and its
// result returned unchanged; the hook only reads and writes thread-locals and atomics,
// and never allocates (see the module docs of `allocations`).
unsafe impl<A: GlobalAlloc> GlobalAlloc for ProfilingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            on_alloc(layout.size());
        }
        ptr
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            on_alloc(layout.size());
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        // A grown block is weighed at its new size: the bytes the program asked for now
        // (a Vec doubling from n to 2n is weighed 2n, as a fresh allocation would be).
        if !new.is_null() && new_size > layout.size() {
            on_alloc(new_size);
        }
        new
    }
}
