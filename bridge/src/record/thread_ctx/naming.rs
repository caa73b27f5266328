//! Which label slots a thread's `otel_thread_ctx_v1` may name, so that a slot's record is
//! rewritten only when none does (out-of-process readers check no generation: a pointer
//! to a rewritten record would give them another root's ids).
//!
//! ```text
//!  publisher (owning thread)               release (last handle)     reclaim (a claim, in batches)
//!  mirror.current = word (Release)         generation += 1           take the whole limbo
//!  light barrier                           record.word = word + 1    heavy barrier
//!  record holds word? (else fill it if       (the release mark)      scan every mirror's current
//!    the root is alive, or publish NULL)   record held a root?       free the slots none names,
//!  otel_thread_ctx_v1 = &record              limbo : free list         the others back to limbo
//! ```
//!
//! Each thread that publishes has a never-freed [`Mirror`] of the word it last named. A
//! thread stores NULL in `otel_thread_ctx_v1` before its mirror moves to another slot, so
//! while the pointer names a slot, the mirror does. This is an asymmetric Dekker: the
//! publisher stores its mirror and loads the record's word; the reclaimer's release stored
//! the record's word and it loads the mirrors. The heavy barrier is
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full barrier on every CPU
//! running one of our threads, so the publisher's side needs only a compiler fence; where
//! `membarrier` is not available both sides use `fence(SeqCst)`. Either the publisher's
//! load sees the release (and publishes NULL) or the reclaimer's scan sees the mirror
//! (and keeps the slot in limbo).
//!
//! The per-poll case — the same root entered again on a thread whose mirror already names
//! it — stores nothing but the pointer: the mirror has named the slot since its barrier.
//! The thread keeps the record it named last beside its word, so that case does not look
//! the record up either.
//!
//! **Fills.** While the thread context is on, a root's record is filled as its label slot
//! is claimed, with plain stores: a slot on the free list is named by no thread and
//! filled by none (`SlotRecord::fill_claimed`). A root claimed while it was off is filled
//! by the first thread to publish it, after checking the root alive. A release replaces
//! the record's word by the root's release mark, over which no fill of that root starts
//! (only a later root's, whose generation is higher), and which makes a fill already
//! started fail at its end. So a record that holds a word holds a
//! root not yet released when it was read, and the per-poll case needs no generation
//! check.

use crate::never_freed::NeverFreed;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::atomic::AtomicUsize;

use super::record::{is_published, SlotRecord};
use crate::label::table::LabelTable;
use crate::label::{slot_index, Label, RootLabel};

/// Records per chunk, as the label slots (a model's table needs a few).
const CHUNK: usize = if cfg!(loom) { 4 } else { 1024 };
const CHUNKS: usize = if cfg!(loom) { 4 } else { 8192 };

/// Mirrors: one per thread that ever published, reused after the thread exits.
const MIRROR_CHUNK: usize = if cfg!(loom) { 2 } else { 64 };
const MIRROR_CHUNKS: usize = if cfg!(loom) { 2 } else { 1024 };

/// The word a thread last named (0: none). Owned by one thread at a time.
pub(crate) struct Mirror {
    current: AtomicU64,
    owned: AtomicBool,
    /// Index + 1 of a released slot a reclaim found this mirror naming (0: none). It
    /// waits here, out of the limbo, until a later reclaim collects it: parked slots
    /// are at most one per mirror, and they never sit on top of the limbo, where every
    /// reclaim would pop them again and free nothing.
    parked: AtomicU32,
}

impl Mirror {
    /// A mirror as [`NeverFreed::fresh`] builds it: owned already, by the one thread
    /// `fresh` will hand it to. Built unowned, it would be listed by `iter` (which lists
    /// every index handed out) before its taker marks it, and a thread leasing then
    /// would take it too: two threads announcing into one mirror, a record freed while
    /// one of them names it.
    fn new() -> Mirror {
        Mirror {
            current: AtomicU64::new(0),
            owned: AtomicBool::new(true),
            parked: AtomicU32::new(0),
        }
    }

    /// Announces that the owning thread is about to name `word`'s slot. When the mirror
    /// already names it, nothing: it has since that store's barrier.
    #[inline]
    pub(crate) fn announce(&self, word: u64) {
        if self.current.load(Ordering::Relaxed) != word {
            self.current.store(word, Ordering::Release);
            barrier::light();
        }
    }

    /// The owning thread names nothing any more and gives the mirror back (at its exit,
    /// after storing NULL in its `otel_thread_ctx_v1`).
    pub(crate) fn give_back(&self) {
        self.current.store(0, Ordering::Release);
        self.owned.store(false, Ordering::Release);
    }
}

/// The label slots' records and the threads' mirrors (one per label table).
pub(crate) struct Naming {
    records: NeverFreed<SlotRecord, CHUNK, CHUNKS>,
    mirrors: NeverFreed<Mirror, MIRROR_CHUNK, MIRROR_CHUNKS>,
    /// The mirror the next [`Naming::collect_parked`] starts at (taken in turns, so
    /// every parked slot is looked at again within mirrors / window reclaims).
    cursor: AtomicUsize,
}

impl Naming {
    crate::sync::const_fn! {
        pub(crate) fn new() -> Naming {
            Naming {
                records: NeverFreed::new(),
                mirrors: NeverFreed::new(),
                cursor: AtomicUsize::new(0),
            }
        }
    }

    /// The record of slot `index`, allocated with its chunk if need be (the thread
    /// context's first publication of a slot in that range).
    #[inline]
    pub(crate) fn record(&self, index: u32) -> Option<&'static SlotRecord> {
        match self.records.get(index) {
            Some(record) => Some(record),
            None => self.allocate(index),
        }
    }

    #[cold]
    #[inline(never)]
    fn allocate(&self, index: u32) -> Option<&'static SlotRecord> {
        self.records.at(index, |_| SlotRecord::new())
    }

    /// A mirror for a thread that is about to publish for the first time (`None`: all
    /// taken, the thread publishes nothing).
    pub(crate) fn lease(&self) -> Option<&'static Mirror> {
        barrier::init();
        let free = self.mirrors.iter().find(|mirror| {
            mirror
                .owned
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        });
        let mirror = free.or_else(|| self.fresh_mirror())?;
        mirror.current.store(0, Ordering::Relaxed);
        Some(mirror)
    }

    /// A mirror never leased before, owned by the caller from the moment `fresh` hands
    /// it out (see [`Mirror::new`]).
    fn fresh_mirror(&self) -> Option<&'static Mirror> {
        self.mirrors
            .fresh(|_| Mirror::new())
            .map(|(_, mirror)| mirror)
    }

    /// Fills the record of slot `index` for `word`, the root the slot is being claimed
    /// for (see [`SlotRecord::fill_claimed`]), when its value has anything to publish.
    /// Every thread that publishes the root then only stores the pointer: the fill's
    /// two compare-and-swaps are saved, and its stores happen where the label's are.
    pub(crate) fn fill_claimed(&self, index: u32, word: u64, value: &RootLabel) {
        if !is_published(value) {
            return;
        }
        if let Some(record) = self.record(index) {
            record.fill_claimed(word, value);
        }
    }

    /// At the release of `word`'s root (after its generation moved on): its record holds
    /// nothing any more. True when a thread may still name the slot (the record held the
    /// root, or a thread was filling it): the slot must wait in limbo. False: no thread
    /// ever named the slot for this root (or the thread context was never on).
    #[inline]
    pub(crate) fn release(&self, word: u64) -> bool {
        // Once the context was ever on, through `record` (which makes the chunk if this
        // thread does not see it yet): a chunk another thread made and filled must be
        // seen here, or the filled record would be freed unmarked. The chunk's
        // compare-and-swap is where the two threads meet.
        let record = if crate::thread_ctx::was_ever_enabled() {
            self.record(slot_index(word))
        } else {
            self.records.get(slot_index(word))
        };
        record.is_some_and(|record| record.forget(word))
    }

    /// The heavy half of the barrier, then the slot indexes some thread's mirror names,
    /// each with the index of a mirror naming it, sorted by slot (`None`: no barrier
    /// could be had, nothing may be freed). Judges only slots released before the call.
    pub(crate) fn named(&self) -> Option<Vec<(u32, u32)>> {
        if !barrier::heavy() {
            return None;
        }
        let mut named: Vec<(u32, u32)> = self
            .mirrors
            .indexed()
            .map(|(at, mirror)| (mirror.current.load(Ordering::Acquire), at))
            .filter(|&(word, _)| word != 0)
            .map(|(word, at)| (slot_index(word), at))
            .collect();
        named.sort_unstable();
        Some(named)
    }

    /// Parks the released slot `slot` in mirror `at`, which named it at a reclaim's scan.
    /// Returns the slot parked there before, if any: it goes back to the limbo (it may
    /// have been parked after that scan's barrier, so that scan cannot judge it).
    pub(crate) fn park(&self, at: u32, slot: u32) -> Option<u32> {
        let Some(mirror) = self.mirrors.get(at) else {
            // No such mirror (never: `at` comes from a scan): the slot goes back itself.
            return Some(slot);
        };
        // AcqRel: the collector that swaps it out sees the slot's release (which came
        // before its parking) before its own barrier.
        let before = mirror.parked.swap(slot + 1, Ordering::AcqRel);
        before.checked_sub(1)
    }

    /// Takes the slots parked in up to `window` mirrors, the next ones in turn (every
    /// mirror when `window` is `None`), handing each to `take`. A reclaim calls it before
    /// its barrier, so each slot's release is ordered before that barrier.
    pub(crate) fn collect_parked(&self, window: Option<usize>, mut take: impl FnMut(u32)) {
        let mirrors = self.mirrors.len();
        if mirrors == 0 {
            return;
        }
        let (start, count) = match window {
            Some(window) => (
                self.cursor.fetch_add(window, Ordering::Relaxed),
                window.min(mirrors),
            ),
            None => (0, mirrors),
        };
        for step in 0..count {
            let at = ((start + step) % mirrors) as u32;
            let Some(mirror) = self.mirrors.get(at) else {
                continue;
            };
            // A load first: most mirrors hold nothing, and a swap would take their line.
            if mirror.parked.load(Ordering::Relaxed) == 0 {
                continue;
            }
            if let Some(slot) = mirror.parked.swap(0, Ordering::AcqRel).checked_sub(1) {
                take(slot);
            }
        }
    }

    /// Mirrors made (never freed: the high-water mark of threads publishing at once).
    pub(crate) fn mirrors(&self) -> u64 {
        self.mirrors.len() as u64
    }

    /// Slots parked in mirrors now (a forked child recounts with it; tests).
    pub(crate) fn parked(&self) -> u64 {
        self.mirrors
            .iter()
            .filter(|mirror| mirror.parked.load(Ordering::Relaxed) != 0)
            .count() as u64
    }

    /// Whether the heavy half of the barrier can run: its form is chosen (by this call,
    /// if no thread has begun to). False while another thread registers `membarrier`.
    pub(crate) fn barrier_ready(&self) -> bool {
        barrier::init();
        barrier::ready()
    }

    /// Sets the flags byte of slot `index`'s record if it holds `word`.
    pub(crate) fn set_flags(&self, index: u32, word: u64, flags: u8) {
        if let Some(record) = self.records.get(index) {
            record.set_flags(word, flags);
        }
    }

    /// In a forked child (one thread): the parent's other threads are gone, and so are
    /// the slots they named. Every mirror but `keep` is given back.
    pub(crate) fn after_fork_in_child(&self, keep: Option<&Mirror>) {
        for mirror in self.mirrors.iter() {
            if !keep.is_some_and(|keep| std::ptr::eq(keep, mirror)) {
                mirror.give_back();
            }
        }
        barrier::after_fork_in_child();
    }
}

/// The record a thread about to run `label`'s root may name, with `mirror` announcing
/// it: `None` when the root ended (or its record is being filled by another thread). A
/// record its claim did not fill is filled by the first thread to publish the root.
#[inline]
pub(crate) fn to_name(
    table: &LabelTable,
    mirror: &Mirror,
    label: Label,
) -> Option<&'static SlotRecord> {
    let word = label.word();
    mirror.announce(word);
    let record = table.naming().record(slot_index(word))?;
    if record.holds(word) {
        return Some(record);
    }
    fill(table, label, record).then_some(record)
}

/// Fills `record` for `label` if the root is alive: true when the record holds it.
#[cold]
#[inline(never)]
fn fill(table: &LabelTable, label: Label, record: &SlotRecord) -> bool {
    let word = label.word();
    // `read` checks the generation: the root is alive after the announcement.
    let Some(value) = table.read(label).filter(is_published) else {
        return false;
    };
    // A release after the read leaves its mark, which the fill does not start over
    // (or which makes its end fail).
    record.fill(word, &value)
}

/// The two halves of the asymmetric barrier (see the module docs).
pub(crate) mod barrier {
    use crate::sync::{fence, Ordering};
    use std::sync::atomic::{compiler_fence, AtomicU8};

    /// No form chosen yet.
    const UNKNOWN: u8 = 0;
    /// One thread is registering `membarrier`. Nobody waits for it (a `fork` in the
    /// middle would leave a waiting child waiting forever): a publisher that finds this
    /// uses a full fence, and a reclaim frees nothing this time.
    const CHOOSING: u8 = 1;
    /// Both halves are `fence(SeqCst)` (no `membarrier`; and under loom, whose models
    /// check this form).
    const FENCE: u8 = 2;
    /// The heavy half is `membarrier`, the light one a compiler fence.
    const MEMBARRIER: u8 = 3;

    /// The form, chosen once per process (and again in a forked child). Every value but
    /// `MEMBARRIER` makes publishers use a full fence; the heavy half runs only on a
    /// final form: a reclaim that read `FENCE` can meet no publisher that read
    /// `MEMBARRIER`, since a process stores one of the two, once.
    pub(crate) struct Barrier {
        mode: AtomicU8,
    }

    static BARRIER: Barrier = Barrier::new();

    #[cfg(all(target_os = "linux", not(loom)))]
    mod membarrier {
        const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

        fn call(cmd: libc::c_long) -> bool {
            // SAFETY: membarrier(2) takes two integers and touches no memory of ours.
            unsafe {
                libc::syscall(
                    libc::SYS_membarrier,
                    cmd,
                    0 as libc::c_long,
                    0 as libc::c_long,
                ) == 0
            }
        }

        pub(super) fn register() -> bool {
            call(REGISTER_PRIVATE_EXPEDITED)
        }

        pub(super) fn run() -> bool {
            call(PRIVATE_EXPEDITED)
        }
    }

    #[cfg(not(all(target_os = "linux", not(loom))))]
    mod membarrier {
        pub(super) fn register() -> bool {
            false
        }

        pub(super) fn run() -> bool {
            false
        }
    }

    impl Barrier {
        pub(crate) const fn new() -> Barrier {
            Barrier {
                mode: AtomicU8::new(UNKNOWN),
            }
        }

        /// Chooses the form if no thread has: the first caller registers `membarrier`;
        /// a caller that finds another one at it returns at once.
        fn init(&self) {
            if self.mode.load(Ordering::Acquire) >= FENCE {
                return;
            }
            if self
                .mode
                .compare_exchange(UNKNOWN, CHOOSING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                let chosen = if membarrier::register() {
                    MEMBARRIER
                } else {
                    FENCE
                };
                self.mode.store(chosen, Ordering::Release);
            }
        }

        #[inline]
        fn light(&self) {
            if self.mode.load(Ordering::Relaxed) == MEMBARRIER {
                compiler_fence(Ordering::SeqCst);
            } else {
                fence(Ordering::SeqCst);
            }
        }

        fn heavy(&self) -> bool {
            self.init();
            match self.mode.load(Ordering::Acquire) {
                MEMBARRIER => membarrier::run(),
                FENCE => {
                    fence(Ordering::SeqCst);
                    true
                }
                // Another thread is choosing: a publisher may be about to read the form
                // it stores, so no heavy half of ours is known to pair with its light one.
                _ => false,
            }
        }

        fn after_fork_in_child(&self) {
            match self.mode.load(Ordering::Relaxed) {
                // The thread that was choosing is not in the child: choose again.
                CHOOSING => self.mode.store(UNKNOWN, Ordering::Relaxed),
                // A new address space registers again, else both halves become fences.
                MEMBARRIER if !membarrier::register() => self.mode.store(FENCE, Ordering::Relaxed),
                _ => {}
            }
        }
    }

    /// Chooses the form, once per process, before the calling thread publishes (every
    /// publisher leases a mirror first, which calls this).
    pub(crate) fn init() {
        BARRIER.init();
    }

    /// The publisher's half: a compiler fence when `membarrier` is the other half.
    #[inline]
    pub(crate) fn light() {
        BARRIER.light();
    }

    /// The reclaimer's half (false: `membarrier` failed or the form is being chosen,
    /// nothing may be freed).
    pub(crate) fn heavy() -> bool {
        BARRIER.heavy()
    }

    /// Whether the form is chosen (a reclaim can free anything).
    pub(crate) fn ready() -> bool {
        BARRIER.mode.load(Ordering::Acquire) >= FENCE
    }

    /// In a forked child (one thread, so no publisher is between its halves).
    pub(crate) fn after_fork_in_child() {
        BARRIER.after_fork_in_child();
    }

    #[cfg(all(test, not(loom)))]
    mod tests {
        use super::*;

        fn chosen(barrier: &Barrier) -> bool {
            matches!(barrier.mode.load(Ordering::SeqCst), FENCE | MEMBARRIER)
        }

        /// The form is chosen once, and the heavy half then runs.
        #[test]
        fn the_first_caller_chooses_the_form() {
            let barrier = Barrier::new();
            barrier.init();
            assert!(chosen(&barrier));
            let mode = barrier.mode.load(Ordering::SeqCst);
            barrier.init();
            assert_eq!(barrier.mode.load(Ordering::SeqCst), mode);
            assert!(barrier.heavy(), "a final form pairs with every publisher");
        }

        /// A thread forked while another was registering `membarrier` finds the choice
        /// in progress and nobody to finish it: nothing waits for it (a `Once` here left
        /// the child's first publisher blocked forever), a reclaim frees nothing until
        /// the form is known, and the child chooses again.
        #[test]
        fn a_fork_in_the_middle_of_the_choice_leaves_the_child_free_to_choose() {
            let barrier = Barrier::new();
            barrier.mode.store(CHOOSING, Ordering::SeqCst);
            barrier.init();
            barrier.light();
            assert!(
                !barrier.heavy(),
                "no heavy half while another thread chooses"
            );
            barrier.after_fork_in_child();
            barrier.init();
            assert!(chosen(&barrier));
            assert!(barrier.heavy());
        }
    }
}

#[cfg(all(test, loom))]
#[path = "naming/loom_model.rs"]
mod loom_model;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A mirror that `fresh` handed to one thread, which has not used it yet, is not
    /// leased to another: the window a pool's workers publishing their first spans
    /// together open (the handed-out index is already listed by `iter`).
    #[test]
    fn a_fresh_mirror_is_leased_to_no_other_thread() {
        static NAMING: Naming = Naming::new();
        let taken = NAMING.fresh_mirror().expect("room");
        let leased = NAMING.lease().expect("room");
        assert!(!std::ptr::eq(taken, leased), "one mirror, two threads");
        let next = NAMING.lease().expect("room");
        assert!(!std::ptr::eq(next, taken) && !std::ptr::eq(next, leased));
        taken.give_back();
        let again = NAMING.lease().expect("room");
        assert!(
            std::ptr::eq(again, taken),
            "a mirror given back is leased again"
        );
    }
}
