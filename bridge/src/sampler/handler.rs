//! The `SIGPROF` handler, its installation, and the guards around it.
//!
//! **What runs in the handler.** Atomics, `gettid`, a DWARF walk with preallocated state
//! and bounds-checked stack reads, a copy into the thread's preallocated ring. No
//! allocation, no lock, no thread-local; `errno` is preserved.
//!
//! **Whose signals.** Only signals whose `si_value` names a live slot owned by the
//! receiving thread are sampled (see `slots`). Every other `SIGPROF` (another library's
//! timer, a forged or stale signal, `kill`) is ignored and counted in
//! [`SamplerStats::foreign_signals`](super::SamplerStats::foreign_signals).
//!
//! **Stack.** The handler runs on the registered thread's own alternate signal stack
//! (`altstack`: the kernel's signal frame, 3.4 KB and more with AVX-512 state, goes there
//! too), so a thread near the end of its stack is not pushed over it by a sample. The walk
//! runs in its own non-inlined function, and only with at least [`WALK_STACK_BUDGET`]
//! bytes left below the handler's frame on the stack it runs on (the interrupted stack,
//! for a thread that kept an alternate stack of its own that turns out too small);
//! otherwise the sample keeps its pc only and counts in `low_stack`. The budget is the
//! measured peak of the walk (`handler_stack_use_is_bounded` test) with a margin.
//!
//! **Panics.** The handler has no panic path, and the build proves it.
//! [`handle_signal`], the whole body after the `extern "C"` entry, stack walk included,
//! carries `no_panic` under the feature `handler-no-panic-check`; `.ci/run` links it in the
//! `handler-proof` profile (fat LTO, one codegen unit, `panic = "unwind"`, this crate's
//! overflow checks and debug assertions on), so any panic path the optimiser could not
//! remove from it, or from anything it calls, is an undefined symbol and fails the link;
//! and a build with a deliberate panic path (`handler-no-panic-selftest`) must fail it.
//! Indexing, arithmetic and `unwrap`s in reach are checked, saturating or wrapping, so a
//! debug build cannot panic there either. The walk follows unwind rules compiled from the
//! CFI when objects are loaded (`unwind/rules.rs`): no CFI is evaluated in the handler.
//! See docs/signal-path.md, "No panic in the handler".
//!
//! Defence in depth, never the proof: the sampler installs, once, a panic hook in front of
//! the existing one; when the panicking thread is inside our handler it writes one fixed
//! line to stderr and aborts, with no allocation and no lock. A hook the application sets
//! later (`std::panic::set_hook`) replaces it, and std holds its hook lock while it calls
//! any hook, so it cannot be what keeps a panic out of the signal.
//!
//! **Ownership of `SIGPROF`.** Installing swaps our handler in with one `sigaction` call
//! and puts the previous one back if it was someone else's, so there is no window in
//! which two installers both believe they own it. The collector checks periodically that
//! the handler is still ours ([`is_installed`]); another component replacing it is
//! counted and reported once.

use std::sync::atomic::Ordering;

use super::altstack;
use super::cpu_ledger;
use super::ring::SampleRecord;
use super::slots::{Slot, TimerValue};
use super::stack::{copy_own_memory, Registers};
use super::unwind::{self, WalkEnd};
use super::{SamplerError, SamplerState};
use crate::root_cpu;

/// Bytes of stack the interrupted thread must have left for the walk to run. Measured
/// peak of the handler, the kernel's signal frame included (`handler_stack_use_is_bounded`,
/// x86_64 with AVX-512 state): 3.2 KB in release builds, 5.5 KB in unoptimised ones (the
/// walk applies compiled rules: no CFI evaluation and its temporaries in the handler); the
/// budgets keep a margin of more than twice, and the alternate stack the handler runs on
/// holds many times either.
pub(crate) const WALK_STACK_BUDGET: u64 = if cfg!(debug_assertions) {
    16 * 1024
} else {
    8 * 1024
};

/// About where the stack pointer is now: the address of a local of this frame (the walk
/// is entered from here, so what lies below it is what the walk can use).
#[inline(always)]
fn current_sp() -> u64 {
    let here = 0u8;
    std::hint::black_box(&here) as *const u8 as u64
}

fn ours() -> usize {
    on_sigprof as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) as usize
}

/// Installs the handler unless another one is there (then nothing changes). The handler
/// reads `state`, which must be [`SamplerState::global`] (it can reach no other).
pub(super) fn install(state: &'static SamplerState) -> Result<(), SamplerError> {
    debug_assert!(std::ptr::eq(state, SamplerState::global()));
    // SAFETY: installing a disposition with a fully initialised sigaction; the handler is
    // async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ours();
        // SA_ONSTACK: on the registered thread's own alternate stack (`altstack`).
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        // Every signal blocked while it runs: no handler nests on top of it, so the walk
        // an adopted thread's handler moves to the slot's stack (`walk_adopted`) is never
        // under a nested handler the kernel starts at the top of the alternate stack the
        // handler came from. Other signals wait the few microseconds of a sample.
        libc::sigfillset(&mut action.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        // One swap: whoever installs concurrently, exactly one sees SIG_DFL/SIG_IGN.
        if libc::sigaction(libc::SIGPROF, &action, &mut old) != 0 {
            return Err(SamplerError::last_os("sigaction"));
        }
        let previous = old.sa_sigaction;
        if previous != ours() && previous != libc::SIG_DFL && previous != libc::SIG_IGN {
            // Someone else's: give it back untouched. (A signal in between reached our
            // handler, which ignores what is not ours.)
            libc::sigaction(libc::SIGPROF, &old, std::ptr::null_mut());
            return Err(SamplerError::SigprofTaken);
        }
    }
    install_panic_guard(state);
    Ok(())
}

/// Whether our handler is still the one installed; counts (once per discovery) when not.
pub(super) fn is_installed() -> bool {
    // SAFETY: reading the disposition into an out-parameter.
    let current = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut old) != 0 {
            return true;
        }
        old.sa_sigaction
    };
    current == ours()
}

/// Whether `SIGPROF` is blocked on the calling thread (its timer would sample nothing).
pub(super) fn blocked_here() -> bool {
    // SAFETY: reading the calling thread's signal mask into an out-parameter.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) != 0 {
            return false;
        }
        libc::sigismember(&set, libc::SIGPROF) == 1
    }
}

/// Puts the in-handler panic check in front of the current panic hook (once).
fn install_panic_guard(state: &SamplerState) {
    state.panic_guard.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            abort_if_in_handler();
            previous(info);
        }));
    });
}

/// Called from the panic hook: if this thread is inside our signal handler, write a fixed
/// line and abort, allocating nothing. Async-signal-safe.
fn abort_if_in_handler() {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let state = SamplerState::global();
    if !state
        .slots
        .iter()
        .any(|s| s.in_handler.load(Ordering::Relaxed) && s.owner_tid() == tid)
    {
        return;
    }
    const MESSAGE: &[u8] =
        b"otel-profiling: panic inside the SIGPROF handler; aborting (no allocation)\n";
    // SAFETY: write(2) and abort(3) are async-signal-safe; the buffer is static.
    unsafe {
        libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
        libc::abort();
    }
}

/// The `SIGPROF` handler. It reaches the sampler's state through the one static,
/// [`SamplerState::global`] (a handler gets no `&self`).
extern "C" fn on_sigprof(_: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
    // SAFETY: the kernel's handler arguments, on the thread the signal interrupted.
    unsafe { handle_signal(info, ucontext) }
}

/// Everything the handler does. Under the feature `handler-no-panic-check` (the CI's
/// `handler-proof` build) `no_panic` makes any panic path left in this body, or in
/// anything it calls, the stack walk included, fail the link.
///
/// # Safety
/// Only as the `SIGPROF` handler, with the kernel's `siginfo` and `ucontext` arguments.
#[cfg_attr(feature = "handler-no-panic-check", no_panic::no_panic)]
unsafe fn handle_signal(info: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
    let state = SamplerState::global();
    // SAFETY: __errno_location is async-signal-safe and returns this thread's errno.
    let errno_slot = unsafe { libc::__errno_location() };
    // SAFETY: valid pointer to this thread's errno.
    let saved_errno = unsafe { *errno_slot };
    // SAFETY: the kernel passes a valid siginfo (checked for null).
    match unsafe { info.as_ref() } {
        Some(info) if info.si_code == libc::SI_TIMER => {
            // SAFETY: SI_TIMER signals carry the timer fields.
            let (sival, overrun) = unsafe { (info.si_value().sival_ptr, info.si_overrun()) };
            match state.slots.for_signal(TimerValue::from_sival(sival)) {
                Some(slot) => {
                    if state.enabled.load(Ordering::Relaxed) {
                        slot.in_handler.store(true, Ordering::Relaxed);
                        sample(state, slot, overrun, ucontext);
                        slot.in_handler.store(false, Ordering::Relaxed);
                    } else if let Some(now) = cpu_ledger::thread_cpu_ns() {
                        // Paused: this CPU time belongs to no root.
                        slot.cpu.advance(now);
                    }
                }
                None => {
                    state.foreign.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        _ => {
            state.foreign.fetch_add(1, Ordering::Relaxed);
        }
    }
    #[cfg(feature = "handler-no-panic-selftest")]
    if std::hint::black_box(saved_errno) == i32::MIN {
        // A panic path the check must find (`.ci/run` asserts that this build fails).
        panic!("handler-no-panic-selftest");
    }
    // SAFETY: as above.
    unsafe { *errno_slot = saved_errno };
}

/// Takes one sample on the slot's owner thread.
#[inline]
fn sample(state: &SamplerState, slot: &Slot, overrun: libc::c_int, ucontext: *mut libc::c_void) {
    let counters = &slot.counters;
    // Expirations the kernel could not deliver separately (rates above its tick).
    let weight = u32::try_from(overrun).unwrap_or(0).saturating_add(1);
    counters.taken.fetch_add(1, Ordering::Relaxed);
    counters
        .periods
        .fetch_add(u64::from(weight), Ordering::Relaxed);
    let cell = slot.cell();
    // SAFETY: `cell` is the owner's `const` thread-local record, and this runs on the
    // owner (the slot accepted the signal only after comparing tids).
    let root = unsafe { cell.as_ref() }.and_then(|c| c.read());
    // The CPU time since the last charge (measured: signals can lag far behind the
    // periods they stand for under CPU contention, see `cpu_ledger`), or, where the
    // thread's clock cannot be read, the periods the kernel says this signal stands for.
    let time = match cpu_ledger::thread_cpu_ns() {
        Some(now) => slot.cpu.advance(now),
        None => state
            .period_ns
            .load(Ordering::Relaxed)
            .saturating_mul(u64::from(weight)),
    };
    if let Some(root) = &root {
        root_cpu::record(root.cpu_raw(), time);
    }
    let Some(ring) = slot.ring() else {
        return;
    };
    // The ring's one producer: the slot accepted this signal only on its owner thread,
    // and SIGPROF is blocked while the handler runs, so it is always free here; were it
    // not, the sample is lost like one that finds the ring full.
    let Some(mut producer) = ring.producer() else {
        counters.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    // A thread the collector's scan adopted: no stack bounds, maybe no alternate stack.
    let adopted = slot.is_adopted();
    if adopted {
        // SAFETY: the kernel's context argument of this handler.
        unsafe { altstack::adopt_in_handler(slot, ucontext) };
    }
    // SAFETY: `ucontext` is the kernel's handler argument.
    let regs = unsafe { Registers::from_ucontext(ucontext) };
    let stack = slot.stack();
    let mut end = WalkEnd::Truncated;
    let mut low_stack = false;
    let stored = producer.push_with(|record| {
        record.root = root;
        record.weight = weight;
        match regs {
            None => {
                record.depth = 0;
                record.truncated = true;
            }
            // Measured from here, on the stack the handler runs on (the thread's own
            // alternate stack, or, where it has none of ours, the interrupted stack, where
            // the kernel's signal frame and this handler's frame already lie below the
            // interrupted `sp`).
            Some(regs) if adopted => {
                (end, low_stack) = walk_adopted(slot, &regs, record);
            }
            Some(regs) => match altstack::headroom(slot.index(), current_sp())
                .or_else(|| stack.headroom(current_sp()))
                .or_else(|| altstack::foreign_headroom(current_sp()))
            {
                Some(left) if left >= WALK_STACK_BUDGET => {
                    // SAFETY: this is the SIGPROF handler on the thread that owns the
                    // slot (the slot accepted the signal only after comparing tids), so
                    // `stack` is its stack.
                    end = unsafe { unwind::walk(&regs, stack, record) };
                }
                left => {
                    // Too close to the end of the stack for the walk's frames (or off
                    // the thread's stack): keep the interrupted pc, which alone names
                    // the function.
                    low_stack = left.is_some();
                    record.frames[0] = regs.pc;
                    record.depth = 1;
                    record.truncated = true;
                }
            },
        }
    });
    drop(producer);
    if !stored {
        counters.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if low_stack {
        counters.low_stack.fetch_add(1, Ordering::Relaxed);
    }
    if end != WalkEnd::Complete {
        counters.truncated.fetch_add(1, Ordering::Relaxed);
        if end == WalkEnd::UnknownPc {
            counters.unknown_pc.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The walk of an adopted thread (one the collector's scan gave a timer, see `adopt`): its
/// stack's bounds are unknown, so the stack is copied from the interrupted `sp`
/// (`process_vm_readv`, which fails instead of faulting at the end of the mapping) into
/// the slot's buffer, and the copy is walked. The walk runs on the slot's stack: where the
/// handler already runs there (the kernel put it there: the thread had no alternate stack
/// and the first signal installed it), in place; elsewhere (std's small alternate stack,
/// or the thread's own) it is moved there on x86_64, and elsewhere it runs in place only
/// with [`WALK_STACK_BUDGET`] left. Returns how the walk ended and whether it was left out
/// for lack of stack.
fn walk_adopted(slot: &Slot, regs: &Registers, record: &mut SampleRecord) -> (WalkEnd, bool) {
    let pc_only = |record: &mut SampleRecord| {
        record.frames[0] = regs.pc;
        record.depth = 1;
        record.truncated = true;
    };
    let Some(buffer) = altstack::copy_buffer(slot.index()) else {
        pc_only(record);
        return (WalkEnd::Truncated, false);
    };
    // SAFETY: the slot's buffer, mapped for good; only the slot owner's handler uses it,
    // one signal at a time (SIGPROF is blocked while the handler runs).
    let copy = unsafe {
        std::slice::from_raw_parts_mut(buffer as usize as *mut u8, altstack::ADOPTED_COPY_BYTES)
    };
    let Some(copied) = copy_own_memory(regs.sp, copy) else {
        pc_only(record);
        return (WalkEnd::Truncated, false);
    };
    let copy = copy.get(..copied).unwrap_or_default();
    let here = current_sp();
    if altstack::headroom(slot.index(), here).is_some_and(|left| left >= WALK_STACK_BUDGET) {
        return (unwind::walk_copy(regs, copy, record), false);
    }
    #[cfg(target_arch = "x86_64")]
    if altstack::headroom(slot.index(), here).is_none() {
        if let Some(top) = altstack::top(slot.index()) {
            let mut walk = SwitchedWalk::new(regs, copy, record);
            // SAFETY: `top` is the top of the slot's stack, which nothing runs on now (the
            // handler is elsewhere, and no other thread holds the slot); the walk returns.
            unsafe { on_stack(top, &mut walk) };
            return (walk.end, false);
        }
    }
    match altstack::foreign_headroom(here) {
        Some(left) if left >= WALK_STACK_BUDGET => (unwind::walk_copy(regs, copy, record), false),
        left => {
            pc_only(record);
            (WalkEnd::Truncated, left.is_some())
        }
    }
}

/// What the walk moved onto another stack takes and gives back.
#[cfg(target_arch = "x86_64")]
pub(crate) struct SwitchedWalk<'a> {
    regs: &'a Registers,
    copy: &'a [u8],
    record: &'a mut SampleRecord,
    end: WalkEnd,
}

#[cfg(target_arch = "x86_64")]
impl<'a> SwitchedWalk<'a> {
    /// A walk of `copy` (the bytes at `[regs.sp, regs.sp + copy.len())`) into `record`.
    pub(crate) fn new(
        regs: &'a Registers,
        copy: &'a [u8],
        record: &'a mut SampleRecord,
    ) -> SwitchedWalk<'a> {
        SwitchedWalk {
            regs,
            copy,
            record,
            end: WalkEnd::Truncated,
        }
    }

    /// How the walk ended (after [`on_stack`]).
    pub(crate) fn end(&self) -> WalkEnd {
        self.end
    }
}

/// Runs the walk described by `walk` with the stack pointer at `top`, and comes back.
///
/// # Safety
/// `top` must be the 16-byte aligned top of mapped, writable memory that nothing else uses
/// while this runs, with room for the walk and a signal frame on top of it: several times
/// [`WALK_STACK_BUDGET`] (the slots' stacks give `altstack::ALT_STACK_BYTES`, the
/// allocation hook's copy buffers four budgets).
#[cfg(target_arch = "x86_64")]
#[inline(never)]
pub(crate) unsafe fn on_stack(top: u64, walk: &mut SwitchedWalk<'_>) {
    extern "C" fn run(walk: *mut SwitchedWalk<'_>) {
        // SAFETY: the pointer `on_stack` passed, valid for the call.
        if let Some(walk) = unsafe { walk.as_mut() } {
            walk.end = unwind::walk_copy(walk.regs, walk.copy, walk.record);
        }
    }
    let entry: extern "C" fn(*mut SwitchedWalk<'_>) = run;
    // SAFETY: the caller's contract. `r12` (callee-saved, so kept by `run`) holds the
    // old stack pointer across the call; `top` is 16-byte aligned, so `run` starts with
    // the ABI's alignment after the call pushes its return address. Every register the C
    // ABI lets `run` change is declared clobbered.
    unsafe {
        std::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {top}",
            "call {entry}",
            "mov rsp, r12",
            top = in(reg) top,
            entry = in(reg) entry,
            in("rdi") walk as *mut SwitchedWalk<'_>,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}
