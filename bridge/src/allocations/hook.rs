//! What the allocator runs for each allocation: the countdown (every call) and the
//! sample (one call in many).

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::inuse::Tracked;
use super::sampling::{next_countdown, weights, Rng};
use super::{
    AllocRecord, DROPPED, DROPPED_BYTES, INSTALLED, LOW_STACK, MEAN, SAMPLES, TRUNCATED,
    UNREGISTERED, UNREGISTERED_BYTES,
};
use crate::root_cpu::{ActiveCounter, OBJECTS_ONE};
use crate::sampler::handler::WALK_STACK_BUDGET;
use crate::sampler::stack::{copy_stack, Registers, StackBounds, Uncopied};
use crate::sampler::unwind::{self, WalkEnd};
use crate::sampler::{SampleRecord, MAX_FRAMES};
use crate::span_context::RootLabel;

/// Bytes of stack an unregistered thread's walk copies above its stack pointer at first
/// (most stacks fit; copying costs ~0.1 ns a byte)...
const UNREGISTERED_FIRST_COPY: usize = 16 * 1024;

/// ...and when a walk ran off that copy: the adopted threads' copy, where deep async
/// stacks fit. The copy buffer an unregistered thread's walk borrows is this long.
pub(super) const UNREGISTERED_COPY_BYTES: usize = 64 * 1024;

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

/// Counts `size` bytes allocated on this thread: `true` when the countdown ran out (the
/// caller then asks [`cold`] whether to sample this allocation).
#[inline(always)]
pub(super) fn counts_out(size: usize) -> bool {
    COUNTDOWN
        .try_with(|left| {
            // `size` is at most isize::MAX (Layout's bound).
            let now = left.get().wrapping_sub(size as i64);
            left.set(now);
            now <= 0
        })
        .unwrap_or(false)
}

/// The countdown ran out at an allocation of `size` bytes: draws the next countdown and,
/// when this allocation is sampled, returns it as a [`Pending`] sample (the thread is
/// marked busy until it is recorded or dropped: allocations in between pass through).
#[cold]
#[inline(never)]
pub(super) fn cold(size: usize) -> Option<Pending> {
    let size = size as u64;
    COUNTDOWN
        .try_with(|left| {
            STATE
                .try_with(|cell| decide(size, left, cell))
                .ok()
                .flatten()
        })
        .ok()
        .flatten()
}

fn decide(size: u64, left: &Cell<i64>, cell: &Cell<ThreadState>) -> Option<Pending> {
    let mut state = cell.get();
    if state.busy || state.own {
        // An allocation inside the hook (none is made; a foreign signal handler's,
        // say): passed through, the countdown left as the outer call sets it.
        if left.get() <= 0 {
            left.set(RECHECK_BYTES);
        }
        return None;
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
        return None;
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
        return None;
    }
    // Sampled when the countdown itself ran out; one drawn with another mean (the
    // setting changed) that had not is dropped, and the new mean's starts here.
    let crossed = armed_with != 0 && remaining <= 0;
    state.armed_with = mean;
    let countdown = next_countdown(&mut state.rng, mean);
    let chunk = countdown.min(RECHECK_BYTES);
    state.rest = countdown - chunk;
    left.set(chunk);
    // The scan's rule for CPU: an unregistered thread of the crate's or the SDK's is
    // telemetry, its allocations no sample of the service's.
    let slot = crate::sampler::own_slot();
    let sampled =
        crossed && size > 0 && !(slot.is_none() && crate::sampler::adopt::excluded_here());
    state.busy = sampled;
    cell.set(state);
    sampled.then_some(Pending {
        size,
        mean: armed_with,
    })
}

/// An allocation the countdown picked, to be recorded once it is made (its thread is
/// busy until then: a nested allocation passes through).
pub(super) struct Pending {
    size: u64,
    mean: u64,
}

impl Pending {
    /// Records the sample: its stack from here, the local root running now, and the
    /// object `tracked` if it is tracked for in-use memory.
    #[inline(never)]
    pub(super) fn record(self, tracked: Option<Tracked>) {
        record_sample(self.size, self.mean, tracked);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let _ = STATE.try_with(|cell| {
            let mut state = cell.get();
            state.busy = false;
            cell.set(state);
        });
    }
}

/// Takes one allocation sample of `size` bytes, drawn at `mean` (the hook's entry: the
/// encoder cuts allocation stacks at the allocator's frame, or after this one).
#[inline(never)]
fn record_sample(size: u64, mean: u64, tracked: Option<Tracked>) {
    let slot = crate::sampler::own_slot();
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
    let sample = Sample {
        bytes,
        objects,
        root,
        tracked,
    };
    let Some(slot) = slot else {
        record_unregistered(sample);
        return;
    };
    // The producer role: this thread alone takes it (the hook is not re-entered), so it
    // fails only on a ring a forked child inherited held.
    let Some(mut producer) = slot.alloc_ring().and_then(|ring| ring.producer()) else {
        sample.dropped();
        return;
    };
    let stack = slot.stack();
    let mut walked = (WalkEnd::Complete, false);
    let stored = producer.push_with(|record| {
        // The hook's own frames stay in the record: the encoder leaves them out by name
        // (`from_the_allocator`), which holds whatever the build inlined.
        walked = sample.fill(record, |frames| walk_here(stack, frames));
    });
    drop(producer);
    sample.counted(stored, walked);
}

/// Takes the sample of a thread without a registration into the buffer such threads
/// share, its stack walked over a copy (see `unregistered.rs`).
#[inline(never)]
fn record_unregistered(sample: Sample) {
    UNREGISTERED.fetch_add(1, Ordering::Relaxed);
    UNREGISTERED_BYTES.fetch_add(sample.bytes as u64, Ordering::Relaxed);
    let Some(shared) = super::shared() else {
        sample.dropped();
        return;
    };
    let Some(mut copy) = shared.lend_copy() else {
        sample.dropped();
        return;
    };
    let mut walked = (WalkEnd::Complete, false);
    let stored = copy.with_bytes(|copy, walk_top| {
        shared.samples.push_with(|record: &mut AllocRecord| {
            walked = sample.fill(record, |frames| walk_copied(copy, walk_top, frames));
        })
    });
    drop(copy);
    sample.counted(stored, walked);
}

/// What one allocation sample stands for, and the root it was made in.
#[derive(Clone, Copy)]
struct Sample {
    bytes: f64,
    objects: f64,
    root: Option<RootLabel>,
    tracked: Option<Tracked>,
}

impl Sample {
    /// Writes the sample into `record`, its stack by `walk`; returns how the walk ended
    /// and whether the stack had too little room for it.
    fn fill(
        self,
        record: &mut AllocRecord,
        walk: impl FnOnce(&mut SampleRecord) -> (WalkEnd, bool),
    ) -> (WalkEnd, bool) {
        record.bytes = self.bytes;
        record.objects = self.objects;
        record.tracked = self.tracked;
        record.stack.root = self.root;
        record.stack.weight = 1;
        walk(&mut record.stack)
    }

    /// Counts the sample as dropped from the profile (its root's totals have it).
    fn dropped(self) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        DROPPED_BYTES.fetch_add(self.bytes as u64, Ordering::Relaxed);
    }

    /// Counts what became of the sample: dropped if not `stored`, else how it was
    /// `walked` (its end, and whether room was missing).
    fn counted(self, stored: bool, (end, low_stack): (WalkEnd, bool)) {
        if !stored {
            self.dropped();
            return;
        }
        if low_stack {
            LOW_STACK.fetch_add(1, Ordering::Relaxed);
        }
        if end != WalkEnd::Complete {
            TRUNCATED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The stack an unregistered thread's walk runs on, one per copy buffer (x86_64: the
/// walk runs there, never on a thread whose stack bounds are unknown, which may have no
/// guard page below it to fault on): four times the walk's budget. Elsewhere the walk
/// runs on the thread's stack once the room it needs was proved.
pub(super) const UNREGISTERED_WALK_STACK_BYTES: usize = if cfg!(target_arch = "x86_64") {
    4 * WALK_STACK_BUDGET as usize
} else {
    0
};

/// Walks the calling thread's stack from this function's frame over a copy of it in
/// `buffer`, without knowing its bounds: one `process_vm_readv` copies
/// `[sp, sp + 16 KiB)` (64 KiB if the walk ran off that). The walk runs on the stack at
/// `walk_top` (x86_64); without one, the same system call reads a word in every page of
/// `[sp − budget, sp)` to prove the walk's room on the thread's own stack (a guard page,
/// or the unmapped end of a main thread's stack, fails the read: the sample keeps its
/// pc, `low_stack`). Returns how the walk ended and whether room was missing.
#[inline(never)]
fn walk_copied(buffer: &mut [u8], walk_top: u64, record: &mut SampleRecord) -> (WalkEnd, bool) {
    let Some(regs) = registers_here() else {
        record.depth = 0;
        record.truncated = true;
        return (WalkEnd::Truncated, false);
    };
    let switched = cfg!(target_arch = "x86_64") && walk_top != 0;
    let pc_only = |record: &mut SampleRecord, low_stack: bool| {
        record.frames[0] = regs.pc;
        record.depth = 1;
        record.truncated = true;
        (WalkEnd::Truncated, low_stack)
    };
    let mut end = WalkEnd::Truncated;
    for len in [UNREGISTERED_FIRST_COPY, UNREGISTERED_COPY_BYTES] {
        let Some(stack) = buffer.get_mut(..len) else {
            return pc_only(record, false);
        };
        let copied = match copy_stack(regs.sp, stack, !switched) {
            Ok(copied) => copied,
            Err(Uncopied::NoRoom) => return pc_only(record, true),
            Err(Uncopied::Failed) => return pc_only(record, false),
        };
        let copy = stack.get(..copied).unwrap_or_default();
        end = walk_over(&regs, copy, record, if switched { walk_top } else { 0 });
        // A walk that stopped inside the copy (or at its frame limit), or a stack that
        // ended before the copy did, has nothing more to gain from a longer one.
        if end != WalkEnd::Truncated || copied < len || usize::from(record.depth) >= MAX_FRAMES {
            break;
        }
    }
    (end, false)
}

/// Walks `copy` into `record`, on the stack at `top` if one is given (x86_64).
fn walk_over(regs: &Registers, copy: &[u8], record: &mut SampleRecord, top: u64) -> WalkEnd {
    #[cfg(target_arch = "x86_64")]
    if top != 0 {
        let mut walk = crate::sampler::handler::SwitchedWalk::new(regs, copy, record);
        // SAFETY: `top` is the 16-byte aligned top of the lent copy buffer's walk stack,
        // four times the walk's budget, which no other thread uses while it is lent; the
        // walk returns.
        unsafe { crate::sampler::handler::on_stack(top, &mut walk) };
        return walk.end();
    }
    let _ = top;
    unwind::walk_copy(regs, copy, record)
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
