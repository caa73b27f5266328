//! x86_64: DWARF register numbers, the PLT's CFA expression, and the registers a signal
//! context holds.

use super::rules::{Cfa, RuleArch};
use super::Arch;
use crate::sampler::stack::Registers;

/// x86_64: CFA from `rsp`/`rbp` rules; registers `(rip, rsp, rbp)`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct X86_64;

impl RuleArch for X86_64 {
    const SP: gimli::Register = gimli::X86_64::RSP;
    const FP: gimli::Register = gimli::X86_64::RBP;
    const RA: gimli::Register = gimli::X86_64::RA;
    const LINK_REGISTER: bool = false;

    /// The expression of lazy-binding PLT entries, as GNU ld and lld emit it:
    /// `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<k>;
    /// DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`, that is
    /// `rsp + 8 + ((rip & 15) >= k) << 3` (k is 11, or 10 in entries with `endbr64`).
    fn expression_cfa(expression: &[u8]) -> Option<Cfa> {
        match expression {
            [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22]
                if (0x30..=0x3f).contains(lit) =>
            {
                Some(Cfa::Plt(lit - 0x30))
            }
            _ => None,
        }
    }
}

impl Arch for X86_64 {
    fn return_address_mask(_: u64) -> u64 {
        u64::MAX
    }
    fn link_register(_: &Registers) -> Option<u64> {
        None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plt_expression_is_recognised_and_others_are_not() {
        let plt = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(X86_64::expression_cfa(&plt), Some(Cfa::Plt(11)));
        let mut ibt = plt;
        ibt[6] = 0x3a;
        assert_eq!(X86_64::expression_cfa(&ibt), Some(Cfa::Plt(10)));
        let mut other = plt;
        other[1] = 0x10;
        assert_eq!(X86_64::expression_cfa(&other), None);
        assert_eq!(X86_64::expression_cfa(&[]), None);
    }
}
