//! x86_64: framehop's x86_64 unwinder, and the registers a signal context holds.

use framehop::MustNotAllocateDuringUnwind;

use super::Arch;
use crate::sampler::stack::Registers;

/// x86_64: CFA from `rsp`/`rbp` rules; registers `(rip, rsp, rbp)`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct X86_64;

impl Arch for X86_64 {
    type Unwinder = framehop::x86_64::UnwinderX86_64<Vec<u8>, MustNotAllocateDuringUnwind>;
    type Regs = framehop::x86_64::UnwindRegsX86_64;
    type Cache = framehop::x86_64::CacheX86_64<MustNotAllocateDuringUnwind>;
    fn new_unwinder() -> Self::Unwinder {
        Self::Unwinder::new()
    }
    fn new_cache() -> Self::Cache {
        Self::Cache::new_in()
    }
    fn register_mask(_: &Self::Unwinder) -> u64 {
        0
    }
    fn regs(regs: &Registers, _: u64) -> Self::Regs {
        Self::Regs::new(regs.pc, regs.sp, regs.fp)
    }
}

/// Reads `rip`, `rsp` and `rbp` from the context the kernel passed to a `SA_SIGINFO`
/// handler. Async-signal-safe.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn registers(uc: &libc::ucontext_t) -> Option<Registers> {
    let g = &uc.uc_mcontext.gregs;
    Some(Registers {
        pc: g[libc::REG_RIP as usize] as u64,
        sp: g[libc::REG_RSP as usize] as u64,
        fp: g[libc::REG_RBP as usize] as u64,
    })
}
