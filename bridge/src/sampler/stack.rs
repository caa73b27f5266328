//! Stack capture from the interrupted register state, for the signal handler.
//!
//! Walks the frame-pointer chain. Every read is validated against the thread's stack
//! bounds (taken once at registration) and alignment before it happens, and frames must
//! move strictly outward, so a corrupt or absent chain ends the walk instead of faulting.
//! Binaries built without frame pointers give the interrupted instruction plus whatever
//! valid-looking chain `rbp` leads to; the DWARF (`.eh_frame`) unwinder replaces this walk
//! in a later step (see `docs/unwinding-notes.md`).

use super::ring::{SampleRecord, MAX_FRAMES};

/// Registers the walk starts from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Registers {
    pub(crate) pc: u64,
    pub(crate) sp: u64,
    pub(crate) fp: u64,
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
        #[cfg(target_arch = "x86_64")]
        {
            let g = &uc.uc_mcontext.gregs;
            Some(Registers {
                pc: g[libc::REG_RIP as usize] as u64,
                sp: g[libc::REG_RSP as usize] as u64,
                fp: g[libc::REG_RBP as usize] as u64,
            })
        }
        #[cfg(target_arch = "aarch64")]
        {
            let m = &uc.uc_mcontext;
            Some(Registers {
                pc: m.pc,
                sp: m.sp,
                fp: m.regs[29],
            })
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = uc;
            None
        }
    }
}

/// Fills `record` with the stack starting at `regs`, reading only inside
/// `[regs.sp, stack_hi)`. Async-signal-safe: no allocation, no calls.
#[inline]
pub(crate) fn walk(regs: Registers, stack_hi: u64, record: &mut SampleRecord) {
    let mut depth = 0usize;
    record.frames[depth] = regs.pc;
    depth += 1;
    let mut fp = regs.fp;
    let mut truncated = true;
    while depth < MAX_FRAMES {
        // A frame record is [saved fp, return address]; both words must be on this stack.
        let in_bounds = fp >= regs.sp && fp.checked_add(16).is_some_and(|end| end <= stack_hi);
        if !in_bounds || fp % 8 != 0 {
            // The outermost frame has fp = 0: a clean end, not a truncation.
            truncated = fp != 0;
            break;
        }
        // SAFETY: `fp` and `fp + 8` were just checked to lie inside this thread's stack,
        // which is mapped, and to be 8-byte aligned.
        let (next_fp, ret) = unsafe { (*(fp as *const u64), *((fp + 8) as *const u64)) };
        if ret == 0 {
            truncated = false;
            break;
        }
        record.frames[depth] = ret;
        depth += 1;
        if next_fp <= fp {
            truncated = next_fp != 0;
            break;
        }
        fp = next_fp;
    }
    record.depth = depth as u16;
    record.truncated = truncated;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake stack whose words are written through the same raw pointer the walk reads.
    struct FakeStack {
        words: Vec<u64>,
    }

    impl FakeStack {
        fn new(len: usize) -> FakeStack {
            FakeStack {
                words: vec![0; len],
            }
        }
        fn at(&mut self, i: usize) -> u64 {
            self.words.as_mut_ptr() as u64 + 8 * i as u64
        }
        fn set(&mut self, i: usize, value: u64) {
            self.words[i] = value;
        }
        fn top(&mut self) -> u64 {
            let len = self.words.len();
            self.at(len)
        }
    }

    /// Three frame records chained outward, then a zero frame pointer.
    #[test]
    fn walks_a_synthetic_chain_and_stops_cleanly() {
        let mut stack = FakeStack::new(16);
        let (f6, f10) = (stack.at(6), stack.at(10));
        stack.set(2, f6);
        stack.set(3, 0x1111);
        stack.set(6, f10);
        stack.set(7, 0x2222);
        stack.set(10, 0);
        stack.set(11, 0x3333);
        let regs = Registers {
            pc: 0x9999,
            sp: stack.at(0),
            fp: stack.at(2),
        };
        let mut record = SampleRecord::EMPTY;
        walk(regs, stack.top(), &mut record);
        assert_eq!(record.frames(), &[0x9999, 0x1111, 0x2222, 0x3333]);
        assert!(!record.truncated);
    }

    #[test]
    fn never_reads_outside_the_stack() {
        let mut stack = FakeStack::new(4);
        let (base, top) = (stack.at(0), stack.top());
        for fp in [0x10, base - 8, stack.at(3), base + 3, u64::MAX - 4] {
            let mut record = SampleRecord::EMPTY;
            walk(
                Registers {
                    pc: 1,
                    sp: base,
                    fp,
                },
                top,
                &mut record,
            );
            assert_eq!(record.frames(), &[1], "fp {fp:#x}");
        }
    }

    #[test]
    fn a_loop_in_the_chain_ends_the_walk() {
        let mut stack = FakeStack::new(8);
        let f2 = stack.at(2);
        stack.set(2, f2); // points at itself
        stack.set(3, 0x42);
        let mut record = SampleRecord::EMPTY;
        walk(
            Registers {
                pc: 1,
                sp: stack.at(0),
                fp: f2,
            },
            stack.top(),
            &mut record,
        );
        assert_eq!(record.frames(), &[1, 0x42]);
        assert!(record.truncated);
    }
}
