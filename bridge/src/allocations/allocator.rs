//! The `#[global_allocator]` wrapper.

use std::alloc::{GlobalAlloc, Layout, System};

use super::hook::{cold, counts_out};
use super::inuse;

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
/// `alloc`; `dealloc` costs one address comparison. With in-use tracking on
/// ([`ProfilerBuilder::allocation_inuse`](crate::ProfilerBuilder::allocation_inuse)),
/// sampled objects up to 64 KiB are served from a reserved arena, so that their frees
/// are known by address. See `docs/allocations.md`.
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
// result returned unchanged, except for sampled objects tracked for in-use memory, which
// are served from cells of the in-use arena (`inuse.rs`: a private mapping, each cell
// held by one object at a time, sized and aligned for it) and given back to it by
// `dealloc` and `realloc`, which recognise them by address. The hook only reads and
// writes thread-locals and atomics, and never allocates (see the module docs).
unsafe impl<A: GlobalAlloc> GlobalAlloc for ProfilingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counts_out(layout.size()) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.alloc_sampled(layout, false) };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if counts_out(layout.size()) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.alloc_sampled(layout, true) };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // The one check every free pays, tracking on or off: a tracked object's cell.
        if inuse::in_arena(ptr) {
            inuse::free_cell(ptr);
            return;
        }
        if layout.size() > inuse::CELL_MAX && inuse::large_tracked() {
            inuse::forget_large(ptr);
        }
        // SAFETY: the caller's contract, passed on (not a cell: the inner allocator's).
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if inuse::in_arena(ptr) || (layout.size() > inuse::CELL_MAX && inuse::large_tracked()) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.realloc_tracked(ptr, layout, new_size) };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.realloc_untracked(ptr, layout, new_size) }
    }
}

impl<A: GlobalAlloc> ProfilingAllocator<A> {
    /// An allocation the countdown ran out at: sampled or not (the hook decides), and
    /// when sampled and tracked, served from a cell of the in-use arena.
    ///
    /// # Safety
    /// `GlobalAlloc::alloc`'s contract.
    #[cold]
    #[inline(never)]
    unsafe fn alloc_sampled(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let Some(pending) = cold(layout.size()) else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.inner_alloc(layout, zeroed) };
        };
        if let Some((cell, tracked)) = inuse::take_cell(layout.size(), layout.align(), zeroed) {
            pending.record(Some(tracked));
            return cell;
        }
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner_alloc(layout, zeroed) };
        if !ptr.is_null() {
            pending.record(inuse::track_if_large(ptr, layout.size()));
        }
        ptr
    }

    /// # Safety
    /// `GlobalAlloc::alloc`'s contract.
    unsafe fn inner_alloc(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if zeroed {
                self.inner.alloc_zeroed(layout)
            } else {
                self.inner.alloc(layout)
            }
        }
    }

    /// A `realloc` of a block that is not tracked: a grown one is weighed at its new
    /// size, as a fresh allocation would be (the bytes a `Vec` doubling from n to 2n
    /// asks for are 2n); a shrunk one weighs nothing.
    ///
    /// # Safety
    /// `GlobalAlloc::realloc`'s contract; `ptr` is the inner allocator's.
    #[inline]
    unsafe fn realloc_untracked(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && counts_out(new_size) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.realloc_sampled(ptr, layout, new_size) };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }

    /// A grown block the countdown ran out at: when sampled and tracked, moved into a
    /// cell (or, over a cell's size, tracked where the inner allocator puts it).
    ///
    /// # Safety
    /// `GlobalAlloc::realloc`'s contract; `ptr` is the inner allocator's.
    #[cold]
    #[inline(never)]
    unsafe fn realloc_sampled(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(pending) = cold(new_size) else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.inner.realloc(ptr, layout, new_size) };
        };
        if let Some((cell, tracked)) = inuse::take_cell(new_size, layout.align(), false) {
            // SAFETY: the cell holds `new_size` > `layout.size()` bytes and is no other
            // object's; `ptr` is valid for `layout.size()` bytes and freed once copied.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, cell, layout.size());
                self.inner.dealloc(ptr, layout);
            }
            pending.record(Some(tracked));
            return cell;
        }
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            pending.record(inuse::track_if_large(new, new_size));
        }
        new
    }

    /// A `realloc` of a block in a cell, or of a large one that may be tracked.
    ///
    /// A tracked object shrunk stays tracked at its sampled weight (in place in its cell,
    /// or followed where the inner allocator moves it while it stays over a cell's
    /// size). One grown is a new allocation, weighed and maybe sampled as any other: the
    /// old object's tracking ends (a `Vec` that keeps growing is tracked as its last
    /// sampled block).
    ///
    /// # Safety
    /// `GlobalAlloc::realloc`'s contract.
    #[cold]
    #[inline(never)]
    unsafe fn realloc_tracked(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if inuse::in_arena(ptr) {
            if new_size <= layout.size() {
                return ptr;
            }
            // SAFETY: `new_size`, rounded up to `layout.align()`, does not overflow
            // `isize` (the caller's contract).
            let grown = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            let new = if counts_out(new_size) {
                // SAFETY: a valid, non-zero layout.
                unsafe { self.alloc_sampled(grown, false) }
            } else {
                // SAFETY: as above.
                unsafe { self.inner.alloc(grown) }
            };
            if !new.is_null() {
                let keep = layout.size().min(inuse::cell_capacity(ptr));
                // SAFETY: `new` holds `new_size` > `keep` bytes, a distinct block from the
                // cell, which is ours and valid for `layout.size()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(ptr, new, keep) };
                inuse::free_cell(ptr);
            }
            return new;
        }
        let Some(slot) = inuse::find_large(ptr) else {
            // SAFETY: the caller's contract, passed on.
            return unsafe { self.realloc_untracked(ptr, layout, new_size) };
        };
        // The inner allocator may free `ptr` before it returns, and another thread take
        // that address and free it: meanwhile the slot names no address.
        inuse::moving_large(slot);
        let stays_tracked = new_size <= layout.size() && new_size > inuse::CELL_MAX;
        let new = if stays_tracked {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.inner.realloc(ptr, layout, new_size) }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.realloc_untracked(ptr, layout, new_size) }
        };
        if new.is_null() {
            // The old block stays, tracked.
            inuse::move_large(slot, ptr);
        } else if stays_tracked {
            inuse::move_large(slot, new);
        } else {
            inuse::release_large(slot);
        }
        new
    }
}
