//! The interrupted register state and the stack memory the unwinder may read, for the
//! signal handler.
//!
//! The unwinder (`unwind/`) reads saved registers and return addresses from the
//! interrupted thread's stack. Every such read goes through [`StackReader`], which accepts
//! only 8-byte aligned words inside `[interrupted sp, stack top)` of the sampled thread:
//! that range is mapped (it is the live part of the thread's stack), so a corrupt or
//! garbage address ends the walk instead of faulting.

use super::handler::WALK_STACK_BUDGET;

/// Registers the unwind starts from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Registers {
    /// The interrupted instruction.
    pub(crate) pc: u64,
    /// The stack pointer at the interruption.
    pub(crate) sp: u64,
    /// The frame pointer register (`rbp` / `x29`); the walk uses it only where the CFI
    /// computes the frame from it.
    pub(crate) fp: u64,
    /// The link register (`x30`): the return address of a leaf function that has not
    /// saved it yet.
    #[cfg(target_arch = "aarch64")]
    pub(crate) lr: u64,
}

impl Registers {
    /// Reads the interrupted registers from a `SA_SIGINFO` handler's context argument.
    ///
    /// # Safety
    /// `ucontext` must be the third argument the kernel passed to the handler.
    #[inline]
    pub(crate) unsafe fn from_ucontext(ucontext: *const libc::c_void) -> Option<Registers> {
        if ucontext.is_null() {
            return None;
        }
        // SAFETY: the caller passes the kernel-provided, valid `ucontext_t`.
        let uc = unsafe { &*(ucontext as *const libc::ucontext_t) };
        // Where the registers lie is the architecture's: `unwind/x86_64.rs`,
        // `unwind/aarch64.rs` (none elsewhere: see `unwind/unsupported.rs`).
        super::unwind::registers(uc)
    }
}

/// The calling thread's stack, `[lo, hi)`, taken once at registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StackBounds {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

impl StackBounds {
    /// The calling thread's stack as glibc reports it (for the main thread this reads
    /// `/proc/self/maps` and allocates: never call it from the signal handler).
    pub(crate) fn current() -> std::io::Result<StackBounds> {
        // SAFETY: plain FFI with out-parameters; the attr is destroyed before returning.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            let rc = libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            let mut addr: *mut libc::c_void = std::ptr::null_mut();
            let mut size: libc::size_t = 0;
            let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            Ok(StackBounds {
                lo: addr as u64,
                hi: addr as u64 + size as u64,
            })
        }
    }

    /// Bytes of this stack left below `sp`, or `None` when `sp` is not on this stack.
    #[inline]
    pub(crate) fn headroom(&self, sp: u64) -> Option<u64> {
        if sp < self.hi {
            sp.checked_sub(self.lo)
        } else {
            None
        }
    }

    /// A reader for the part of this stack that is live at `sp`, or `None` when `sp` is
    /// not on this stack (an alternate signal stack, a coroutine's own stack): then no
    /// stack word may be read at all.
    #[inline]
    pub(crate) fn reader_from(&self, sp: u64) -> Option<StackReader> {
        (sp >= self.lo && sp < self.hi).then_some(StackReader { sp, hi: self.hi })
    }
}

/// Reads words of the live stack `[sp, hi)` of the interrupted thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StackReader {
    sp: u64,
    hi: u64,
}

impl StackReader {
    /// Whether the 8-byte word at `addr` may be read: aligned and inside `[sp, hi)`.
    #[inline]
    pub(crate) fn is_readable(&self, addr: u64) -> bool {
        addr.is_multiple_of(8)
            && addr >= self.sp
            && addr.checked_add(8).is_some_and(|end| end <= self.hi)
    }

    /// The word at `addr`, or `Err(())` for any address
    /// [`is_readable`](Self::is_readable) refuses. Async-signal-safe; in reach of the
    /// handler's link-time proof, and carrying its own (it is the walk's one memory read).
    #[inline]
    #[cfg_attr(feature = "handler-no-panic-check", no_panic::no_panic)]
    pub(crate) fn read(&self, addr: u64) -> Result<u64, ()> {
        if !self.is_readable(addr) {
            return Err(());
        }
        // SAFETY: `addr` is 8-byte aligned and inside `[sp, hi)`, the live part of the
        // interrupted thread's own stack, which is mapped and readable.
        Ok(unsafe { std::ptr::read_volatile(addr as *const u64) })
    }
}

/// Copies `[addr, addr + buf.len())` of this process into `buf` without dereferencing it:
/// the number of bytes copied (fewer where the range runs into unmapped memory), `None`
/// if nothing could be. Async-signal-safe (two system calls).
pub(crate) fn copy_own_memory(addr: u64, buf: &mut [u8]) -> Option<usize> {
    // Not `copy_stack(addr, buf, false)`: this runs in the signal handler, on std's small
    // alternate stack for an adopted thread, and that one's iovec arrays cost a debug
    // build 0.5 KB more of it (`an_adopted_threads_walk_leaves_stds_small_alternate_stack_alone`).
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which we own; the kernel checks `remote` and fails
    // (EFAULT) instead of faulting when it is not mapped. The calling thread's id names
    // the process as well as its pid does, and stays valid where the main thread has
    // exited (its pid then answers ESRCH).
    let n = unsafe { libc::process_vm_readv(libc::gettid(), &local, 1, &remote, 1, 0) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

/// Why a thread's stack could not be copied.
pub(crate) enum Uncopied {
    /// A page of the walk's budget below the stack pointer could not be read.
    NoRoom,
    /// The system call failed otherwise (refused by a seccomp filter, say).
    Failed,
}

/// Words read below the stack pointer to prove the walk's room: one every 4 KiB of
/// [`WALK_STACK_BUDGET`] and one at its end, so every page of it (4 KiB or larger) is
/// read; one word would not do: below a 4 KiB guard page may lie another mapping.
const ROOM_PROBES: usize = WALK_STACK_BUDGET as usize / 4096 + 1;

/// Copies `[sp, sp + stack.len())` of this process into `stack` without dereferencing
/// it, having read a word in every page of `[sp − WALK_STACK_BUDGET, sp)` first if
/// `prove_room`, in one system call: the bytes copied (fewer where the range runs into
/// unmapped memory). Async-signal-safe (two system calls; `errno` read, not written).
pub(crate) fn copy_stack(sp: u64, stack: &mut [u8], prove_room: bool) -> Result<usize, Uncopied> {
    const WORD: usize = 8;
    let mut probes = [0u8; WORD * ROOM_PROBES];
    let probes_base = probes.as_mut_ptr();
    let mut local = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; ROOM_PROBES + 1];
    let mut remote = local;
    let first = if prove_room { 0 } else { ROOM_PROBES };
    for (i, (local, remote)) in local.iter_mut().zip(remote.iter_mut()).enumerate() {
        let (to, from, len) = if i < ROOM_PROBES {
            // sp − 8, sp − 8 − 4 KiB, ..., and the budget's last word.
            let below = (WORD as u64 + 4096 * i as u64).min(WALK_STACK_BUDGET);
            (
                probes_base.wrapping_add(WORD * i),
                sp.wrapping_sub(below),
                WORD,
            )
        } else {
            (stack.as_mut_ptr(), sp, stack.len())
        };
        *local = libc::iovec {
            iov_base: to.cast(),
            iov_len: len,
        };
        *remote = libc::iovec {
            iov_base: from as usize as *mut libc::c_void,
            iov_len: len,
        };
    }
    let count = (local.len() - first) as libc::c_ulong;
    // SAFETY: `local` describes our own buffers; the kernel checks `remote` and fails
    // (EFAULT) instead of faulting, copying in order and stopping at the first unmapped
    // byte: a result past the probes' bytes means every probe was read whole. The
    // thread's id names the process (its pid does not once the main thread exited).
    let n = unsafe {
        libc::process_vm_readv(
            libc::gettid(),
            local[first..].as_ptr(),
            count,
            remote[first..].as_ptr(),
            count,
            0,
        )
    };
    let probed = if prove_room { probes.len() } else { 0 };
    match usize::try_from(n) {
        Ok(n) if n > probed => Ok(n - probed),
        Ok(n) if n < probed => Err(Uncopied::NoRoom),
        Ok(_) => Err(Uncopied::Failed),
        // SAFETY: reads this thread's errno.
        Err(_) if prove_room && unsafe { *libc::__errno_location() } == libc::EFAULT => {
            Err(Uncopied::NoRoom)
        }
        Err(_) => Err(Uncopied::Failed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_aligned_words_between_sp_and_the_top() {
        let words: Vec<u64> = (0..8).map(|i| 0x1000 + i).collect();
        let base = words.as_ptr() as u64;
        let bounds = StackBounds {
            lo: base,
            hi: base + 64,
        };
        // sp two words up: the words below it are dead stack.
        let reader = bounds.reader_from(base + 16).expect("sp on the stack");
        assert_eq!(reader.read(base + 16), Ok(0x1002));
        assert_eq!(reader.read(base + 56), Ok(0x1007), "last word");
        for bad in [
            base,         // below sp
            base + 8,     // below sp
            base + 20,    // unaligned
            base + 57,    // unaligned, crosses the top
            base + 64,    // at the top
            base + 4096,  // far above
            0,            // null
            u64::MAX - 7, // would wrap
            !7,           // aligned, wraps on + 8
        ] {
            assert!(!reader.is_readable(bad), "{bad:#x}");
            assert_eq!(reader.read(bad), Err(()), "{bad:#x}");
        }
    }

    #[test]
    fn an_sp_off_the_stack_reads_nothing() {
        let bounds = StackBounds {
            lo: 0x10_000,
            hi: 0x20_000,
        };
        assert!(bounds.reader_from(0x0_fff8).is_none());
        assert!(bounds.reader_from(0x20_000).is_none());
        assert!(bounds.reader_from(0).is_none());
        assert!(bounds.reader_from(0x10_000).is_some());
        assert!(bounds.reader_from(0x1f_ff8).is_some());
    }

    #[test]
    fn the_current_thread_has_a_stack_around_its_locals() {
        let bounds = StackBounds::current().expect("stack bounds");
        let local = 0u64;
        let addr = &local as *const u64 as u64;
        assert!(bounds.lo < addr && addr < bounds.hi, "{bounds:?} {addr:#x}");
        let reader = bounds.reader_from(addr & !7).expect("on the stack");
        assert_eq!(reader.read(addr), Ok(0));
    }
}
