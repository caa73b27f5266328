//! aarch64: framehop's aarch64 unwinder with pointer-authentication stripping, and the
//! registers a signal context holds.

use framehop::{MustNotAllocateDuringUnwind, Unwinder};

use super::Arch;
use crate::sampler::stack::Registers;

/// aarch64: registers `(lr, sp, fp)` (note the order), the pc passed separately. Return
/// addresses signed with pointer authentication are stripped with a mask guessed from
/// the highest known code address.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) struct Aarch64;

impl Arch for Aarch64 {
    type Unwinder = framehop::aarch64::UnwinderAarch64<Vec<u8>, MustNotAllocateDuringUnwind>;
    type Regs = framehop::aarch64::UnwindRegsAarch64;
    type Cache = framehop::aarch64::CacheAarch64<MustNotAllocateDuringUnwind>;
    fn new_unwinder() -> Self::Unwinder {
        Self::Unwinder::new()
    }
    fn new_cache() -> Self::Cache {
        Self::Cache::new_in()
    }
    fn register_mask(unwinder: &Self::Unwinder) -> u64 {
        framehop::aarch64::PtrAuthMask::from_max_known_address(unwinder.max_known_code_address()).0
    }
    fn regs(regs: &Registers, mask: u64) -> Self::Regs {
        #[cfg(target_arch = "aarch64")]
        let lr = regs.lr;
        // Never used off aarch64; kept compiling so the aarch64 path is type-checked here.
        #[cfg(not(target_arch = "aarch64"))]
        let lr = 0;
        Self::Regs::new_with_ptr_auth_mask(
            framehop::aarch64::PtrAuthMask(mask),
            lr,
            regs.sp,
            regs.fp,
        )
    }
}

/// Reads `pc`, `sp`, `x29` (fp) and `x30` (lr) from the context the kernel passed to a
/// `SA_SIGINFO` handler. Async-signal-safe.
#[cfg(target_arch = "aarch64")]
#[inline]
pub(crate) fn registers(uc: &libc::ucontext_t) -> Option<Registers> {
    let m = &uc.uc_mcontext;
    Some(Registers {
        pc: m.pc,
        sp: m.sp,
        fp: m.regs[29],
        lr: m.regs[30],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::unwind::tests::build;

    /// The aarch64 path builds and yields stripped registers (it cannot run here).
    #[test]
    fn the_aarch64_unwinder_builds() {
        let snapshot = build::<Aarch64>();
        let mask = snapshot.register_mask;
        assert_eq!(
            mask,
            u64::MAX >> snapshot.unwinder.max_known_code_address().leading_zeros()
        );
        let regs = Registers {
            pc: 0x1000,
            sp: 0x2000,
            fp: 0x3000,
            #[cfg(target_arch = "aarch64")]
            lr: 0x4000,
        };
        let r = Aarch64::regs(&regs, mask);
        assert_eq!((r.sp(), r.fp()), (0x2000, 0x3000));
    }
}
