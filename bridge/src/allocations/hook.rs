//! What the allocator runs for each allocation: the countdown (every call) and the
//! sample (one call in many).

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::sampling::{next_countdown, weights, Rng};
use super::{
    DROPPED, DROPPED_BYTES, INSTALLED, LOW_STACK, MEAN, SAMPLES, TRUNCATED, UNREGISTERED,
    UNREGISTERED_BYTES,
};
use crate::root_cpu::{ActiveCounter, OBJECTS_ONE};
use crate::sampler::handler::WALK_STACK_BUDGET;
use crate::sampler::stack::{Registers, StackBounds};
use crate::sampler::unwind::{self, WalkEnd};
use crate::sampler::SampleRecord;

/// Bytes between two looks at the setting: while sampling is off, the hook's cold path
/// runs once a MiB allocated, so a thread starts sampling within a MiB of the profiler's
/// start; a countdown longer than this is counted down a MiB at a time (the rest kept),
/// so a new mean takes effect within a MiB however long the old mean's countdown was.
const RECHECK_BYTES: i64 = 1 << 20;

/// The thread's sampling state besides the countdown.
#[derive(Clone, Copy)]
struct ThreadState {
    rng: Rng,
    /// Whether `rng` was seeded.
    seeded: bool,
    /// The mean the countdown running now was drawn with (0: none was: the next cold
    /// call only draws one, it records nothing).
    armed_with: u64,
    /// Bytes of the countdown not yet in `COUNTDOWN` (which holds at most
    /// [`RECHECK_BYTES`] of it).
    rest: i64,
    /// Set while the hook records a sample: a nested call passes through.
    busy: bool,
    /// One of the crate's own threads: its allocations are the telemetry's, never
    /// sampled.
    own: bool,
}

// The hook runs until a thread's very last allocation, after its other thread-locals'
// destructors: its own state must have none (this fails the build otherwise).
const _: () = assert!(!std::mem::needs_drop::<ThreadState>());

thread_local! {
    /// Bytes until the next sample. `const`, no destructor: one TLS offset, alive as long
    /// as the thread. Starts at 0, so each thread's first allocation takes the cold path.
    static COUNTDOWN: Cell<i64> = const { Cell::new(0) };
    static STATE: Cell<ThreadState> = const {
        Cell::new(ThreadState {
            rng: Rng::new(0),
            seeded: false,
            armed_with: 0,
            rest: 0,
            busy: false,
            own: false,
        })
    };
}

/// The calling thread is one of the crate's own: its allocations are never sampled.
pub(crate) fn exclude_current_thread() {
    let _ = STATE.try_with(|cell| {
        let mut state = cell.get();
        state.own = true;
        cell.set(state);
    });
}

/// Counts `size` bytes allocated on this thread; samples the allocation when the
/// countdown runs out.
#[inline(always)]
pub(super) fn on_alloc(size: usize) {
    let _ = COUNTDOWN.try_with(|left| {
        // `size` is at most isize::MAX (Layout's bound).
        let now = left.get().wrapping_sub(size as i64);
        left.set(now);
        if now <= 0 {
            cold(size as u64, left);
        }
    });
}

#[cold]
#[inline(never)]
fn cold(size: u64, left: &Cell<i64>) {
    let _ = STATE.try_with(|cell| {
        let mut state = cell.get();
        if state.busy || state.own {
            // An allocation inside the hook (none is made; a foreign signal handler's,
            // say): passed through, the countdown left as the outer call sets it.
            if left.get() <= 0 {
                left.set(RECHECK_BYTES);
            }
            return;
        }
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        let mean = MEAN.load(Ordering::Relaxed);
        if mean == 0 {
            state.armed_with = 0;
            state.rest = 0;
            cell.set(state);
            left.set(RECHECK_BYTES);
            return;
        }
        if !state.seeded {
            // Any per-thread value: the cell's address, and a process-wide sequence.
            static SEEDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            let seed = cell as *const _ as u64 ^ SEEDS.fetch_add(1, Ordering::Relaxed) << 48;
            state.rng = Rng::new(seed);
            state.seeded = true;
        }
        let armed_with = state.armed_with;
        // The countdown left, less this allocation's overshoot (`left` ≤ 0): `COUNTDOWN`
        // holds a chunk of it at most, `rest` the others.
        let remaining = state.rest.saturating_add(left.get());
        if armed_with == mean && remaining > 0 {
            // Only a chunk ran out: count down the next one, nothing sampled.
            let chunk = remaining.min(RECHECK_BYTES);
            state.rest = remaining - chunk;
            left.set(chunk);
            cell.set(state);
            return;
        }
        // Sampled when the countdown itself ran out; one drawn with another mean (the
        // setting changed) that had not is dropped, and the new mean's starts here.
        let crossed = armed_with != 0 && remaining <= 0;
        state.armed_with = mean;
        let countdown = next_countdown(&mut state.rng, mean);
        let chunk = countdown.min(RECHECK_BYTES);
        state.rest = countdown - chunk;
        left.set(chunk);
        if crossed && size > 0 {
            state.busy = true;
            cell.set(state);
            record(size, armed_with);
            state.busy = false;
        }
        cell.set(state);
    });
}

/// Takes one allocation sample of `size` bytes, drawn at `mean`.
#[inline(never)]
fn record(size: u64, mean: u64) {
    let (bytes, objects) = weights(size, mean);
    SAMPLES.fetch_add(1, Ordering::Relaxed);
    // The root's totals first: whatever happens to the sample (no ring, a full one),
    // its weight reaches them, so the per-root estimates stay unbiased.
    let root = crate::span_context::current_local_root();
    if let Some(counter) = root.and_then(|root| ActiveCounter::of(root.cpu_raw())) {
        counter.add_alloc(
            bytes.round() as u64,
            (objects * OBJECTS_ONE as f64).round() as u64,
        );
    }
    let Some(slot) = crate::sampler::own_slot() else {
        UNREGISTERED.fetch_add(1, Ordering::Relaxed);
        UNREGISTERED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
        return;
    };
    let dropped = || {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        DROPPED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    };
    // The producer role: this thread alone takes it (the hook is not re-entered), so it
    // fails only on a ring a forked child inherited held.
    let Some(mut producer) = slot.alloc_ring().and_then(|ring| ring.producer()) else {
        dropped();
        return;
    };
    let stack = slot.stack();
    let mut end = WalkEnd::Complete;
    let mut low_stack = false;
    let stored = producer.push_with(|record| {
        record.bytes = bytes;
        record.objects = objects;
        record.stack.root = root;
        record.stack.weight = 1;
        // The hook's own frames stay in the record: the encoder leaves them out by name
        // (`from_the_allocator`), which holds whatever the build inlined.
        (end, low_stack) = walk_here(stack, &mut record.stack);
    });
    drop(producer);
    if !stored {
        dropped();
        return;
    }
    if low_stack {
        LOW_STACK.fetch_add(1, Ordering::Relaxed);
    }
    if end != WalkEnd::Complete {
        TRUNCATED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Walks the calling thread's stack from this function's frame (the hook's frames are
/// the innermost ones of the sample). Returns how the walk ended and whether the stack
/// had too little room left for it.
#[inline(never)]
fn walk_here(stack: StackBounds, record: &mut SampleRecord) -> (WalkEnd, bool) {
    let Some(regs) = registers_here() else {
        record.depth = 0;
        record.truncated = true;
        return (WalkEnd::Truncated, false);
    };
    match stack.headroom(regs.sp) {
        // SAFETY: `stack` is this thread's (its registration's), and `regs` were read on
        // this thread, in this frame, which stays live during the walk.
        Some(left) if left >= WALK_STACK_BUDGET => {
            (unsafe { unwind::walk(&regs, stack, record) }, false)
        }
        left => {
            record.frames[0] = regs.pc;
            record.depth = 1;
            record.truncated = true;
            (WalkEnd::Truncated, left.is_some())
        }
    }
}

/// The registers the walk starts from, read here: one instruction's address, the stack
/// and frame pointers, all in one asm block (so the stack pointer is the one the unwind
/// rules at that address expect).
#[inline(always)]
fn registers_here() -> Option<Registers> {
    #[cfg(target_arch = "x86_64")]
    {
        let (pc, sp, fp): (u64, u64, u64);
        // SAFETY: reads registers only.
        unsafe {
            std::arch::asm!(
                "lea {pc}, [rip]",
                "mov {sp}, rsp",
                "mov {fp}, rbp",
                pc = out(reg) pc,
                sp = out(reg) sp,
                fp = out(reg) fp,
                options(nomem, nostack, preserves_flags),
            );
        }
        Some(Registers { pc, sp, fp })
    }
    #[cfg(target_arch = "aarch64")]
    {
        let (pc, sp, fp, lr): (u64, u64, u64, u64);
        // SAFETY: reads registers only.
        unsafe {
            std::arch::asm!(
                "adr {pc}, .",
                "mov {sp}, sp",
                "mov {fp}, x29",
                "mov {lr}, x30",
                pc = out(reg) pc,
                sp = out(reg) sp,
                fp = out(reg) fp,
                lr = out(reg) lr,
                options(nomem, nostack, preserves_flags),
            );
        }
        Some(Registers { pc, sp, fp, lr })
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}
