//! The handler's own stack: each registered thread gets an alternate signal stack
//! (`sigaltstack`), so a sample never runs on the interrupted thread's stack.
//!
//! On the thread's stack, the kernel's signal frame alone takes 3.4 KB and more (AVX-512
//! state; ~8 KB more with AMX), and the handler's frames come below it: a thread within a
//! few KB of its guard page would die by a sample, whatever check the handler made once it
//! ran. On an alternate stack the frame and the handler use memory of their own.
//!
//! A stack belongs to the thread slot of the same index: allocated (with a guard page) at
//! the slot's first registration, reused by every later owner, never freed, like the
//! slot's ring. A registration installs it unless the thread already has an alternate
//! stack of at least [`ALT_STACK_BYTES`] (someone else's, which is then left alone); it
//! replaces a smaller one, such as the one std gives each thread for its stack-overflow
//! message (std's `SIGSEGV` handler then runs on ours). Letting go of the slot, on the
//! thread itself, puts the previous one back if ours is still installed. A thread std
//! started disables the installed stack (ours) before its thread-locals are destroyed, and
//! a forked child's one thread disables ours in the fork handler (another child thread may
//! be given the same slot and stack), so two threads never share one.

use std::sync::atomic::{AtomicU64, Ordering};

use super::slots::Slot;
use crate::never_freed::NeverFreed;

/// Size of each alternate stack: the handler's measured peak with a cold unwind cache
/// (`handler_stack_use_is_bounded`: 17.4 KB release, 44.1 KB unoptimised, the kernel's
/// frame included) with room for std's `SIGSEGV` handler nested in it.
pub(crate) const ALT_STACK_BYTES: usize = if cfg!(debug_assertions) {
    128 * 1024
} else {
    64 * 1024
};

/// Bytes of an adopted thread's stack its handler copies (from the interrupted `sp`) to
/// walk: its stack bounds are not known, so its stack is copied, never dereferenced
/// (`handler::walk_adopted`). Deeper frames than fit are left out (the sample is
/// truncated at the outer end, the innermost frames kept).
pub(crate) const ADOPTED_COPY_BYTES: usize = 64 * 1024;

/// One slot's stack: its usable range (0..0 until allocated), and for slots that were
/// adopted, the buffer their handler copies the thread's stack into (0: none yet).
struct AltStack {
    lo: AtomicU64,
    hi: AtomicU64,
    copy: AtomicU64,
}

const CHUNK: usize = 256;
const CHUNKS: usize = super::slots::MAX_THREADS.div_ceil(CHUNK);

static STACKS: NeverFreed<AltStack, CHUNK, CHUNKS> = NeverFreed::new();

/// The stack of slot `index`, made (and its chunk allocated) if needed. Not in a handler.
fn stack_of(index: u32) -> Option<&'static AltStack> {
    while STACKS.get(index).is_none() {
        STACKS.fresh(|_| AltStack {
            lo: AtomicU64::new(0),
            hi: AtomicU64::new(0),
            copy: AtomicU64::new(0),
        })?;
    }
    let stack = STACKS.get(index)?;
    if stack.hi.load(Ordering::Acquire) == 0 {
        // Only the slot's holder reaches here for this index (its registering thread, or
        // the scan while it holds an adoption): no race to allocate.
        let page = page_size();
        let base = map_anonymous(ALT_STACK_BYTES + page)?;
        // The guard page: an overflow of the handler faults instead of writing below.
        // SAFETY: the first page of the mapping just made.
        unsafe { libc::mprotect(base, page, libc::PROT_NONE) };
        let lo = base as u64 + page as u64;
        stack.lo.store(lo, Ordering::Relaxed);
        stack
            .hi
            .store(lo + ALT_STACK_BYTES as u64, Ordering::Release);
    }
    Some(stack)
}

/// For the scan that adopts a thread into slot `index`: makes the slot's stack and its
/// copy buffer (never freed, reused by the slot's later adoptions). Not in a handler; only
/// the slot's holder calls it, as for `stack_of`. False if either could not be mapped.
pub(crate) fn prepare_adopted(index: u32) -> bool {
    let Some(stack) = stack_of(index) else {
        return false;
    };
    if stack.copy.load(Ordering::Acquire) != 0 {
        return true;
    }
    let Some(base) = map_anonymous(ADOPTED_COPY_BYTES) else {
        return false;
    };
    stack.copy.store(base as u64, Ordering::Release);
    true
}

/// A fresh private, readable and writable mapping of `len` bytes, reserved lazily (only
/// touched pages are resident). Never unmapped by this module.
fn map_anonymous(len: usize) -> Option<*mut libc::c_void> {
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (base != libc::MAP_FAILED).then_some(base)
}

/// The copy buffer of slot `index` (`ADOPTED_COPY_BYTES` long), if made. Async-signal-safe.
#[inline]
pub(crate) fn copy_buffer(index: u32) -> Option<u64> {
    let copy = STACKS.get(index)?.copy.load(Ordering::Acquire);
    (copy != 0).then_some(copy)
}

/// The top of slot `index`'s stack (16-byte aligned), if made: where a handler that does
/// not run on it may move its walk (`handler::walk_adopted`). Async-signal-safe.
#[inline]
pub(crate) fn top(index: u32) -> Option<u64> {
    let hi = STACKS.get(index)?.hi.load(Ordering::Acquire);
    (hi != 0).then_some(hi & !15)
}

/// In the handler of an adopted thread (once per adoption): a thread with no alternate
/// stack at all (a C library's thread) gets the slot's, so that later signals put the
/// kernel's frame there rather than on a stack whose end is unknown. One with a stack of
/// its own (std's, for its stack-overflow message) keeps it: the handler runs there and
/// moves its walk onto the slot's stack.
///
/// The kernel puts back, when a handler returns, the alternate stack saved in the
/// handler's context at delivery (`rt_sigreturn`), so a `sigaltstack` call here would be
/// undone: the slot's stack is written into the context (`uc_stack`) instead, and the
/// return installs it. One system call (the query), async-signal-safe.
///
/// # Safety
/// `ucontext` must be the handler's context argument (or null).
pub(crate) unsafe fn adopt_in_handler(slot: &Slot, ucontext: *mut libc::c_void) {
    if slot.alt_checked.load(Ordering::Relaxed) || ucontext.is_null() {
        return;
    }
    let Some(now) = current() else { return };
    if now.ss_flags & libc::SS_DISABLE == 0 {
        // One is installed (ours, from an earlier signal, or the thread's own): nothing
        // more to look at. Until then every signal looks again, since a first signal that
        // interrupted a handler of the thread's own has its `uc_stack` put back by that
        // handler's return.
        slot.alt_checked.store(true, Ordering::Relaxed);
        return;
    }
    let Some(stack) = STACKS.get(slot.index()) else {
        return;
    };
    let lo = stack.lo.load(Ordering::Relaxed);
    if stack.hi.load(Ordering::Acquire) == 0 {
        return;
    }
    // SAFETY: the caller passes the kernel's context for this handler, which the kernel
    // reads back at the handler's return. The stack is a mapped, writable range of
    // ALT_STACK_BYTES owned by the slot, which this thread holds until it registers itself
    // (`disable_adopted`) or exits.
    unsafe {
        (*ucontext.cast::<libc::ucontext_t>()).uc_stack = libc::stack_t {
            ss_sp: lo as *mut libc::c_void,
            ss_flags: 0,
            ss_size: ALT_STACK_BYTES,
        };
    }
}

/// On a thread taking its adopted slot back to register itself: disables the slot's
/// stack if the handler installed it, before the slot (and the stack) can go to another
/// thread. `Some(true)`: it was installed and is disabled; `Some(false)`: it was not
/// installed; `None`: it is installed and cannot be disabled now (the thread runs on it,
/// in a handler): the slot must not go to another thread.
pub(crate) fn disable_adopted(index: u32) -> Option<bool> {
    let now = current()?;
    let Some(stack) = STACKS.get(index) else {
        return Some(false);
    };
    if now.ss_flags & libc::SS_DISABLE != 0 || now.ss_sp as u64 != stack.lo.load(Ordering::Relaxed)
    {
        return Some(false);
    }
    if now.ss_flags & libc::SS_ONSTACK != 0 {
        return None;
    }
    let off = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: libc::SS_DISABLE,
        ss_size: 0,
    };
    // SAFETY: disabling the calling thread's alternate stack.
    (unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) } == 0).then_some(true)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// What a registration replaced, to put back when it lets go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Installed {
    ours: u64,
    previous: libc::stack_t,
}

// SAFETY: plain addresses, only used on the thread that installed them.
unsafe impl Send for Installed {}

fn current() -> Option<libc::stack_t> {
    // SAFETY: an out-parameter only.
    let mut now: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: querying the calling thread's alternate stack.
    (unsafe { libc::sigaltstack(std::ptr::null(), &mut now) } == 0).then_some(now)
}

/// On the thread that just claimed `slot`: installs the slot's stack as its alternate
/// signal stack, unless it has a big enough one already. `None`: nothing was installed
/// (the handler then runs where the kernel puts it, and checks its headroom there).
pub(crate) fn install(slot: &Slot) -> Option<Installed> {
    let previous = current()?;
    let disabled = previous.ss_flags & libc::SS_DISABLE != 0;
    if !disabled && previous.ss_size >= ALT_STACK_BYTES {
        return None;
    }
    if previous.ss_flags & libc::SS_ONSTACK != 0 {
        // Running on it now (registering from inside a signal handler): leave it.
        return None;
    }
    let stack = stack_of(slot.index())?;
    let lo = stack.lo.load(Ordering::Relaxed);
    let ours = libc::stack_t {
        ss_sp: lo as *mut libc::c_void,
        ss_flags: 0,
        ss_size: ALT_STACK_BYTES,
    };
    // SAFETY: `ours` is a mapped, writable range of ALT_STACK_BYTES owned by this slot,
    // which this thread holds until `uninstall`.
    (unsafe { libc::sigaltstack(&ours, std::ptr::null_mut()) } == 0)
        .then_some(Installed { ours: lo, previous })
}

/// On the thread letting go of its slot: puts back what [`install`] replaced, if ours is
/// still the thread's alternate stack (std disables it itself before a thread's end).
pub(crate) fn uninstall(installed: Installed) {
    let Some(now) = current() else { return };
    if now.ss_sp as u64 != installed.ours || now.ss_flags & libc::SS_DISABLE != 0 {
        return;
    }
    if now.ss_flags & libc::SS_ONSTACK != 0 {
        // Letting go from a handler running on it (not done by this crate): keep it.
        return;
    }
    let mut previous = installed.previous;
    if previous.ss_flags & libc::SS_DISABLE != 0 {
        previous = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
    }
    // SAFETY: restoring the stack this thread had before (still mapped: its owner would
    // have disabled ours before unmapping it), or disabling.
    unsafe { libc::sigaltstack(&previous, std::ptr::null_mut()) };
}

/// In a forked child's handler: the forking thread's alternate stack, if it is one of
/// ours, is disabled (its slot is free again in the child, and may be given to another
/// thread with the same stack). Only a syscall and atomic loads.
pub(crate) fn after_fork_in_child() {
    let Some(now) = current() else { return };
    if now.ss_flags & libc::SS_DISABLE != 0 || !is_ours(now.ss_sp as u64) {
        return;
    }
    let off = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: libc::SS_DISABLE,
        ss_size: 0,
    };
    // SAFETY: disabling the calling thread's alternate stack.
    unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) };
}

fn is_ours(lo: u64) -> bool {
    // By index, not `iter`: entries are made a chunk at a time for the slot indices that
    // ask (`stack_of`), not handed out one by one; chunks exist from the first on.
    (0..u32::MAX)
        .map_while(|i| STACKS.get(i))
        .any(|s| s.lo.load(Ordering::Relaxed) == lo)
}

/// Bytes left below `sp` if it lies on slot `index`'s alternate stack. Async-signal-safe:
/// atomic loads only.
#[inline]
pub(crate) fn headroom(index: u32, sp: u64) -> Option<u64> {
    let stack = STACKS.get(index)?;
    let (lo, hi) = (
        stack.lo.load(Ordering::Relaxed),
        stack.hi.load(Ordering::Acquire),
    );
    (sp >= lo && sp < hi).then(|| sp - lo)
}

/// Bytes left below `sp` if it lies on the calling thread's alternate stack when that one
/// is not ours (a thread that kept its own: the handler runs there). One `sigaltstack`
/// query, async-signal-safe; reached only on such threads.
pub(crate) fn foreign_headroom(sp: u64) -> Option<u64> {
    let now = current()?;
    let lo = now.ss_sp as u64;
    let hi = lo.checked_add(u64::try_from(now.ss_size).ok()?)?;
    (now.ss_flags & libc::SS_ONSTACK != 0 && sp >= lo && sp < hi).then(|| sp - lo)
}

#[cfg(test)]
/// The usable range of slot `index`'s stack, if made (tests paint it).
pub(crate) fn range_of(index: u32) -> Option<std::ops::Range<u64>> {
    let stack = STACKS.get(index)?;
    let hi = stack.hi.load(Ordering::Acquire);
    (hi != 0).then(|| stack.lo.load(Ordering::Relaxed)..hi)
}
