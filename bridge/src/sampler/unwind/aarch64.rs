//! aarch64: DWARF register numbers, the link register, pointer-authentication bits, and
//! the registers a signal context holds.

use super::rules::{Cfa, RuleArch};
use super::Arch;
use crate::sampler::stack::Registers;

/// aarch64: CFA from `sp`/`x29` rules, return address in `x30` (the link register) until
/// a function saves it. Return addresses signed with pointer authentication are stripped
/// with a mask derived from the highest known code address.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) struct Aarch64;

impl RuleArch for Aarch64 {
    const SP: gimli::Register = gimli::AArch64::SP;
    const FP: gimli::Register = gimli::AArch64::X29;
    const RA: gimli::Register = gimli::AArch64::X30;
    const LINK_REGISTER: bool = true;

    fn expression_cfa(_: &[u8]) -> Option<Cfa> {
        None
    }
}

impl Arch for Aarch64 {
    /// Every bit up to the highest set bit of the highest code address: the signature
    /// bits above it are cleared.
    fn return_address_mask(max_code_address: u64) -> u64 {
        u64::MAX
            .checked_shr(max_code_address.leading_zeros())
            .unwrap_or(0)
    }
    fn link_register(regs: &Registers) -> Option<u64> {
        #[cfg(target_arch = "aarch64")]
        return Some(regs.lr);
        // Never used off aarch64; kept compiling so the aarch64 path is type-checked here.
        #[cfg(not(target_arch = "aarch64"))]
        {
            let _ = regs;
            Some(0)
        }
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

    #[test]
    fn signed_return_addresses_keep_only_their_address_bits() {
        let mask = Aarch64::return_address_mask(0x0000_ffff_a000_0000);
        assert_eq!(mask, 0x0000_ffff_ffff_ffff);
        assert_eq!(0x002a_ffff_a000_1234 & mask, 0x0000_ffff_a000_1234);
        assert_eq!(Aarch64::return_address_mask(0), 0);
    }
}
