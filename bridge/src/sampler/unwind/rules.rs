//! Unwind rules compiled ahead of the signal handler: every row of every object's
//! `.eh_frame` call-frame information, evaluated once with gimli when the object is
//! loaded, into a sorted table the handler only searches.
//!
//! Why not evaluate the CFI in the handler (as framehop does, with a per-thread rule
//! cache): CFI evaluation is an interpreter over bytes from the object, and the one we
//! used keeps panic paths (indexing, `unwrap`, `unreachable!`) that no build can prove
//! away, so a panic inside `SIGPROF` stayed possible. Compiled ahead, what the handler
//! does per frame is a binary search and a few checked additions and stack reads: all of
//! it in reach of the link-time `no_panic` proof. It also drops the 33 KB rule cache per
//! thread and the cold first walk of a thread (30–40 µs).
//!
//! **A rule** says where the caller's registers are, relative to the canonical frame
//! address (CFA, the stack pointer before the call): the CFA as `sp` or `fp` plus an
//! offset (or the x86_64 lazy-binding PLT expression, the one CFA expression compilers
//! emit), the return address at an offset from the CFA (or, on aarch64, still in the
//! link register at a function's first instructions, or undefined: the outermost frame),
//! and the caller's frame pointer at an offset from the CFA or unchanged. Rows using
//! anything else (other CFA registers, other expressions, registers saved in registers)
//! are kept as "no rule": the walk ends there, marked truncated, as it does for code
//! without CFI. Identical rules share one entry of a per-object palette, so a row costs
//! 10 bytes (its start address and a palette index).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, NativeEndian, RegisterRule, UnwindContext,
    UnwindSection as _,
};

use super::super::modules::UnwindTables;

/// Where the CFA is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Cfa {
    /// `sp + offset`.
    Sp(i32),
    /// `fp + offset`.
    Fp(i32),
    /// x86_64 lazy-binding PLT entries (16 bytes each): `rsp + 8`, and 8 more once the
    /// entry's `push` ran, which is when `rip & 15 >= k`.
    Plt(u8),
}

/// Where the return address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ReturnAddress {
    /// In the word at `CFA + offset`.
    At(i32),
    /// Still in the link register (aarch64, before a function saved it): only true of
    /// the interrupted frame.
    InLinkRegister,
    /// None: the outermost frame (`_start`, a thread's start routine).
    Undefined,
}

/// Where the caller's frame pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SavedFp {
    /// Not changed by this function (yet).
    Unchanged,
    /// In the word at `CFA + offset`.
    At(i32),
}

/// How to find the caller's frame at one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Rule {
    pub(crate) cfa: Cfa,
    pub(crate) return_address: ReturnAddress,
    pub(crate) fp: SavedFp,
}

/// What differs per architecture in compiling and applying rules.
pub(crate) trait RuleArch {
    /// DWARF register numbers of the stack pointer, the frame pointer and the return
    /// address column.
    const SP: gimli::Register;
    const FP: gimli::Register;
    const RA: gimli::Register;
    /// Whether the return address column is a link register (its default rule, "same
    /// value", then means the return address is still in it).
    const LINK_REGISTER: bool;
    /// A CFA given by a DWARF expression, when it is one this architecture's compilers
    /// emit and the walk understands.
    fn expression_cfa(expression: &[u8]) -> Option<Cfa>;
}

/// Palette index of "no rule".
const NO_RULE: u16 = u16::MAX;

/// One object's compiled rules: `starts[i]` (runtime addresses, sorted) begins a range
/// that runs to `starts[i + 1]` and follows `palette[rules[i]]`, or no rule.
///
/// `pages[p]` is the first row starting at or after `base + p · PAGE`, so a lookup
/// searches only the rows of one page (a handful) instead of the whole table (a binary
/// search over 200,000 rows touched 18 cache lines per frame: 2.9 µs per stack).
#[derive(Debug, Default)]
pub(crate) struct ModuleRules {
    starts: Vec<u64>,
    rules: Vec<u16>,
    palette: Vec<Rule>,
    base: u64,
    pages: Vec<u32>,
}

/// Bytes of code per entry of [`ModuleRules::pages`].
const PAGE_SHIFT: u32 = 12;

impl ModuleRules {
    /// Compiles every row of `tables.eh_frame` (copied from memory, so its pointers are
    /// runtime addresses once the section base is `eh_frame_avma`). Rows outside `code`
    /// are dropped; entries gimli cannot parse are skipped. Not for signal handlers.
    pub(crate) fn compile<A: RuleArch>(tables: &UnwindTables, code: &Range<u64>) -> ModuleRules {
        let eh_frame = EhFrame::new(&tables.eh_frame, NativeEndian);
        let mut bases = BaseAddresses::default()
            .set_eh_frame(tables.eh_frame_avma)
            .set_text(code.start);
        if tables.eh_frame_hdr.is_some() {
            bases = bases.set_eh_frame_hdr(tables.eh_frame_hdr_avma);
        }
        let mut ctx = UnwindContext::new();
        let mut rows = Rows::default();
        let mut entries = eh_frame.entries(&bases);
        // An error in the entry list leaves the rest unreadable: keep what was read.
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
                continue;
            };
            let Ok(mut table) = fde.rows(&eh_frame, &bases, &mut ctx) else {
                continue;
            };
            // A bad instruction ends this entry's rows; the rows before it stand.
            while let Ok(Some(row)) = table.next_row() {
                let (start, end) = (row.start_address(), row.end_address());
                if start >= end || start < code.start || end > code.end {
                    continue;
                }
                rows.add(start, end, rule_of::<A>(row, &eh_frame));
            }
        }
        rows.into_table()
    }

    /// Builds the table from `(start, end, rule)` rows in any order (see
    /// [`Rows::into_table`]).
    #[cfg(test)]
    fn from_rows(rows: Vec<(u64, u64, Option<Rule>)>) -> ModuleRules {
        let mut compact = Rows::default();
        for (start, end, rule) in rows {
            compact.add(start, end, rule);
        }
        compact.into_table()
    }

    /// Fills [`pages`](Self::pages) for the range the rows cover.
    fn index_pages(&mut self) {
        let (Some(&first), Some(&last)) = (self.starts.first(), self.starts.last()) else {
            return;
        };
        self.base = first;
        let pages = ((last - first) >> PAGE_SHIFT) + 1;
        // Tables too big to index by u32 stay unindexed (searched whole).
        if self.starts.len() >= u32::MAX as usize || pages > 1 << 24 {
            return;
        }
        let mut row = 0usize;
        self.pages = (0..=pages)
            .map(|p| {
                let page_start = first + (p << PAGE_SHIFT);
                while row < self.starts.len() && self.starts[row] < page_start {
                    row += 1;
                }
                row as u32
            })
            .collect();
    }

    fn push(&mut self, start: u64, id: u16) {
        if self.rules.last() == Some(&id) {
            return;
        }
        if self.starts.last() == Some(&start) {
            // A later row starting at the same address takes over.
            self.rules.pop();
            self.starts.pop();
            if self.rules.last() == Some(&id) {
                return;
            }
        }
        self.starts.push(start);
        self.rules.push(id);
    }

    /// The rule at `addr`, if one covers it. Async-signal-safe: a binary search and
    /// checked indexing.
    #[inline]
    pub(crate) fn rule_at(&self, addr: u64) -> Option<Rule> {
        let page = usize::try_from(addr.checked_sub(self.base)? >> PAGE_SHIFT).ok()?;
        // Rows starting in this page, and the one before them (it may cover the page's
        // start); the whole table when there is no page index.
        let (lo, hi) = match (self.pages.get(page), self.pages.get(page.wrapping_add(1))) {
            (Some(&lo), Some(&hi)) => ((lo as usize).saturating_sub(1), hi as usize),
            _ if self.pages.is_empty() => (0, self.starts.len()),
            _ => return None,
        };
        let candidates = self.starts.get(lo..hi)?;
        let after = candidates.partition_point(|&start| start <= addr);
        let id = *self.rules.get(lo.checked_add(after.checked_sub(1)?)?)?;
        self.palette.get(usize::from(id)).copied()
    }

    /// Rows kept (after merging), and the heap bytes they take.
    pub(crate) fn size(&self) -> (usize, usize) {
        (
            self.starts.len(),
            self.starts.len() * 8
                + self.rules.len() * 2
                + self.pages.len() * 4
                + self.palette.len() * std::mem::size_of::<Rule>(),
        )
    }
}

/// The rows of one object as they are read: 16 bytes each, the rule already an index
/// into the palette (a big object has 200,000+ rows; kept whole with their rules, they
/// were most of the sampler's start-up memory).
#[derive(Default)]
struct Rows {
    rows: Vec<Row>,
    palette: Vec<Rule>,
    index: HashMap<Rule, u16, BuildHasherDefault<RuleHasher>>,
}

#[derive(Clone, Copy)]
struct Row {
    start: u64,
    /// `end - start`; a row longer than 4 GiB (no function is) keeps its first 4 GiB.
    len: u32,
    id: u16,
}

impl Rows {
    fn add(&mut self, start: u64, end: u64, rule: Option<Rule>) {
        let id = rule.map_or(NO_RULE, |rule| self.id_of(rule));
        let len = u32::try_from(end.saturating_sub(start)).unwrap_or(u32::MAX);
        self.rows.push(Row { start, len, id });
    }

    /// The palette index of `rule` (`NO_RULE` once the palette is full).
    fn id_of(&mut self, rule: Rule) -> u16 {
        if let Some(&id) = self.index.get(&rule) {
            return id;
        }
        if self.palette.len() >= usize::from(NO_RULE) {
            return NO_RULE;
        }
        let id = self.palette.len() as u16;
        self.palette.push(rule);
        self.index.insert(rule, id);
        id
    }

    /// The table of these rows: gaps between rows get "no rule", a row overlapping an
    /// earlier one takes over from its start, and neighbours with the same rule merge.
    fn into_table(self) -> ModuleRules {
        let Rows {
            mut rows, palette, ..
        } = self;
        // Stable: of two rows starting at one address, the later read takes over.
        rows.sort_by_key(|row| row.start);
        let mut table = ModuleRules {
            palette,
            ..ModuleRules::default()
        };
        let mut reached = 0u64;
        for row in rows {
            if !table.starts.is_empty() && row.start > reached {
                table.push(reached, NO_RULE);
            }
            table.push(row.start, row.id);
            reached = reached.max(row.start.saturating_add(u64::from(row.len)));
        }
        if !table.starts.is_empty() {
            table.push(reached, NO_RULE);
        }
        table.starts.shrink_to_fit();
        table.rules.shrink_to_fit();
        table.index_pages();
        table
    }
}

/// Hashes rules for the palette (a few words each, hashed once per row: SipHash was a
/// sixth of the compile).
#[derive(Default)]
struct RuleHasher(u64);

impl RuleHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for RuleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.mix(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.mix(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

/// One row's rule, `None` where it uses anything the walk does not follow.
fn rule_of<A: RuleArch>(
    row: &gimli::UnwindTableRow<usize>,
    eh_frame: &EhFrame<gimli::EndianSlice<'_, NativeEndian>>,
) -> Option<Rule> {
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let offset = i32::try_from(*offset).ok()?;
            if *register == A::SP {
                Cfa::Sp(offset)
            } else if *register == A::FP {
                Cfa::Fp(offset)
            } else {
                return None;
            }
        }
        CfaRule::Expression(expression) => {
            let expression = expression.get(eh_frame).ok()?;
            A::expression_cfa(expression.0.slice())?
        }
    };
    let return_address = match row.register(A::RA) {
        Some(RegisterRule::Offset(offset)) => ReturnAddress::At(i32::try_from(offset).ok()?),
        Some(RegisterRule::Undefined) => ReturnAddress::Undefined,
        None | Some(RegisterRule::SameValue) if A::LINK_REGISTER => ReturnAddress::InLinkRegister,
        _ => return None,
    };
    let fp = match row.register(A::FP) {
        None | Some(RegisterRule::SameValue) => SavedFp::Unchanged,
        Some(RegisterRule::Offset(offset)) => SavedFp::At(i32::try_from(offset).ok()?),
        _ => return None,
    };
    Some(Rule {
        cfa,
        return_address,
        fp,
    })
}

/// The registers a walk carries from frame to frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) pc: u64,
    pub(crate) sp: u64,
    pub(crate) fp: u64,
}

/// One step of a walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The caller's frame (its `pc` is the return address, unmasked).
    Caller(Frame),
    /// This was the outermost frame.
    Outermost,
    /// The rule cannot be followed from here: a stack read failed, an address
    /// overflowed, or the stack did not grow towards the caller.
    Stuck,
}

impl Rule {
    /// Applies the rule to `frame`. `link_register` is the interrupted frame's link
    /// register (`None` for every later frame, and on x86_64). Async-signal-safe: checked
    /// arithmetic and `read`, nothing else.
    #[inline]
    pub(crate) fn step(
        &self,
        frame: Frame,
        link_register: Option<u64>,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Step {
        let cfa = match self.cfa {
            Cfa::Sp(offset) => frame.sp.checked_add_signed(i64::from(offset)),
            Cfa::Fp(offset) => frame.fp.checked_add_signed(i64::from(offset)),
            Cfa::Plt(k) => frame
                .sp
                .checked_add(if frame.pc & 15 >= u64::from(k) { 16 } else { 8 }),
        };
        let Some(cfa) = cfa else {
            return Step::Stuck;
        };
        // The CFA is the stack pointer before the call: above the interrupted one, and
        // strictly above a caller's (else the walk could loop).
        if cfa < frame.sp || (cfa == frame.sp && link_register.is_none()) {
            return Step::Stuck;
        }
        let at = |offset: i32| cfa.checked_add_signed(i64::from(offset));
        let return_address = match self.return_address {
            ReturnAddress::Undefined => return Step::Outermost,
            ReturnAddress::InLinkRegister => match link_register {
                Some(lr) => lr,
                None => return Step::Stuck,
            },
            ReturnAddress::At(offset) => match at(offset).map(&mut *read) {
                Some(Ok(word)) => word,
                _ => return Step::Stuck,
            },
        };
        let fp = match self.fp {
            SavedFp::Unchanged => frame.fp,
            // In an epilogue after `pop rbp` compilers keep the save's rule, which then
            // names a word below the stack pointer: popped, so the register already holds
            // the caller's value (and the word may be overwritten, by this very signal's
            // frame among others).
            SavedFp::At(offset) => match at(offset) {
                Some(addr) if addr < frame.sp => frame.fp,
                Some(addr) => match read(addr) {
                    Ok(word) => word,
                    Err(()) => return Step::Stuck,
                },
                None => return Step::Stuck,
            },
        };
        Step::Caller(Frame {
            pc: return_address,
            sp: cfa,
            fp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SP8: Rule = Rule {
        cfa: Cfa::Sp(8),
        return_address: ReturnAddress::At(-8),
        fp: SavedFp::Unchanged,
    };
    const FP16: Rule = Rule {
        cfa: Cfa::Fp(16),
        return_address: ReturnAddress::At(-8),
        fp: SavedFp::At(-16),
    };

    #[test]
    fn rows_become_ranges_with_gaps_overlaps_and_merges() {
        let table = ModuleRules::from_rows(vec![
            (0x30, 0x40, Some(FP16)),
            (0x10, 0x20, Some(SP8)),
            (0x20, 0x28, Some(SP8)),
            (0x38, 0x50, None),
        ]);
        assert_eq!(table.rule_at(0x0f), None);
        assert_eq!(table.rule_at(0x10), Some(SP8));
        assert_eq!(table.rule_at(0x27), Some(SP8));
        // The gap between 0x28 and 0x30 has no rule.
        assert_eq!(table.rule_at(0x28), None);
        assert_eq!(table.rule_at(0x30), Some(FP16));
        assert_eq!(table.rule_at(0x37), Some(FP16));
        // The later row takes over from its start.
        assert_eq!(table.rule_at(0x38), None);
        assert_eq!(table.rule_at(0x50), None);
        assert_eq!(table.rule_at(u64::MAX), None);
        // 0x10 and 0x20 merged; two rules in the palette.
        assert_eq!(table.palette.len(), 2);
        assert_eq!(table.starts, [0x10, 0x28, 0x30, 0x38]);
        assert!(ModuleRules::default().rule_at(0x10).is_none());
    }

    /// The page index finds what a search of the whole table finds, for rows spread
    /// over many pages, gaps of several pages, and addresses on every side of them.
    #[test]
    fn the_page_index_agrees_with_a_whole_table_search() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let rules = [SP8, FP16];
        let mut rows = Vec::new();
        let mut at = 0x40_0000u64;
        for _ in 0..3000 {
            let len = 1 + next(300);
            let rule = (next(5) > 0).then(|| rules[next(2) as usize]);
            rows.push((at, at + len, rule));
            // Mostly adjacent, sometimes a gap of up to three pages.
            at += len + if next(10) == 0 { next(3 << 12) } else { 0 };
        }
        let table = ModuleRules::from_rows(rows);
        assert!(table.pages.len() > 100, "{} pages", table.pages.len());
        let whole = |addr: u64| {
            let after = table.starts.partition_point(|&s| s <= addr);
            let id = *table.rules.get(after.checked_sub(1)?)?;
            table.palette.get(usize::from(id)).copied()
        };
        let end = *table.starts.last().expect("rows");
        for addr in (0x3f_f000..end + 0x2000).step_by(7) {
            assert_eq!(table.rule_at(addr), whole(addr), "{addr:#x}");
        }
        assert_eq!(table.rule_at(0), None);
        assert_eq!(table.rule_at(u64::MAX), None);
    }

    fn stack(words: &[(u64, u64)]) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
        move |addr| {
            words
                .iter()
                .find(|&&(a, _)| a == addr)
                .map(|&(_, w)| w)
                .ok_or(())
        }
    }

    #[test]
    fn rules_find_the_callers_registers() {
        let frame = Frame {
            pc: 0x1000,
            sp: 0x7000,
            fp: 0x7100,
        };
        let mut read = stack(&[(0x7000, 0xaaaa), (0x7108, 0xbbbb), (0x7100, 0x7200)]);
        assert_eq!(
            SP8.step(frame, None, &mut read),
            Step::Caller(Frame {
                pc: 0xaaaa,
                sp: 0x7008,
                fp: 0x7100
            })
        );
        assert_eq!(
            FP16.step(frame, None, &mut read),
            Step::Caller(Frame {
                pc: 0xbbbb,
                sp: 0x7110,
                fp: 0x7200
            })
        );
        // An unreadable word, an overflow, a stack that does not grow: stuck.
        let far = Rule {
            cfa: Cfa::Sp(0x100),
            ..SP8
        };
        assert_eq!(far.step(frame, None, &mut read), Step::Stuck);
        let top = Frame {
            sp: u64::MAX - 4,
            ..frame
        };
        assert_eq!(SP8.step(top, None, &mut read), Step::Stuck);
        let down = Rule {
            cfa: Cfa::Sp(-8),
            ..SP8
        };
        assert_eq!(down.step(frame, None, &mut read), Step::Stuck);
        let outermost = Rule {
            return_address: ReturnAddress::Undefined,
            ..SP8
        };
        assert_eq!(outermost.step(frame, None, &mut read), Step::Outermost);
    }

    #[test]
    fn a_frame_pointer_saved_below_the_stack_pointer_was_popped_already() {
        // At `ret` after `pop rbp`: CFA = rsp + 8, rbp's rule still CFA − 16 (below rsp).
        let epilogue = Rule {
            cfa: Cfa::Sp(8),
            return_address: ReturnAddress::At(-8),
            fp: SavedFp::At(-16),
        };
        let frame = Frame {
            pc: 0x1000,
            sp: 0x7000,
            fp: 0x7300,
        };
        let mut read = stack(&[(0x7000, 0xaaaa)]);
        assert_eq!(
            epilogue.step(frame, None, &mut read),
            Step::Caller(Frame {
                pc: 0xaaaa,
                sp: 0x7008,
                fp: 0x7300
            })
        );
    }

    #[test]
    fn a_leaf_returns_through_its_link_register_only_when_interrupted() {
        let leaf = Rule {
            cfa: Cfa::Sp(0),
            return_address: ReturnAddress::InLinkRegister,
            fp: SavedFp::Unchanged,
        };
        let frame = Frame {
            pc: 0x1000,
            sp: 0x7000,
            fp: 0x7100,
        };
        let mut read = stack(&[]);
        assert_eq!(
            leaf.step(frame, Some(0xcccc), &mut read),
            Step::Caller(Frame {
                pc: 0xcccc,
                sp: 0x7000,
                fp: 0x7100
            })
        );
        assert_eq!(leaf.step(frame, None, &mut read), Step::Stuck);
    }

    #[test]
    fn a_plt_entry_adds_its_push_once_it_ran() {
        let plt = Rule {
            cfa: Cfa::Plt(11),
            ..SP8
        };
        let mut read = stack(&[(0x7000, 0x1), (0x7008, 0x2)]);
        let at = |pc| Frame {
            pc,
            sp: 0x7000,
            fp: 0,
        };
        let caller = |step| match step {
            Step::Caller(f) => f.pc,
            other => panic!("{other:?}"),
        };
        assert_eq!(caller(plt.step(at(0x4020), None, &mut read)), 0x1);
        assert_eq!(caller(plt.step(at(0x402a), None, &mut read)), 0x1);
        assert_eq!(caller(plt.step(at(0x402b), None, &mut read)), 0x2);
    }
}
