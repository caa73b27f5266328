//! Architectures without an unwinder here: the handler records at most the
//! interrupted pc, marked truncated, and there are no unwind tables to load.
#![allow(dead_code)] // the same items as `unwind/mod.rs`, not all of them used here

use std::time::Duration;

use super::ring::SampleRecord;
use super::stack::{Registers, StackBounds};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    Complete,
    UnknownPc,
    Truncated,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    No,
    Upto(Duration),
}

/// No registers are read: the context layout is not verified here, so the record stays
/// empty.
#[inline]
pub(crate) fn registers(_: &libc::ucontext_t) -> Option<Registers> {
    None
}

pub(crate) fn refresh(_: Wait) -> bool {
    false
}

pub(crate) fn published_stats() -> (usize, usize, u64) {
    (0, 0, 0)
}

pub(crate) fn before_fork() {}

pub(crate) fn after_fork_in_parent() {}

pub(crate) fn after_fork_in_child() {}

/// Records only the interrupted pc.
///
/// # Safety
/// None needed here; `unsafe` to match the unwinding version.
#[inline]
pub(crate) unsafe fn walk(regs: &Registers, _: StackBounds, record: &mut SampleRecord) -> WalkEnd {
    record.frames[0] = regs.pc;
    record.depth = 1;
    record.truncated = true;
    WalkEnd::Truncated
}

/// Records only the blocked pc.
pub(crate) fn walk_copy(regs: &Registers, _: &[u8], record: &mut SampleRecord) -> WalkEnd {
    record.frames[0] = regs.pc;
    record.depth = 1;
    record.truncated = true;
    WalkEnd::Truncated
}

pub(crate) fn is_known_code(_: u64) -> bool {
    false
}
