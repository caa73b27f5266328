//! The table of per-thread sampler state: slots that are recycled, never freed, and named
//! to the kernel by index and generation, never by address.
//!
//! ```text
//!  FREE ──claim (thread T)──► LIVE ──release (T itself)──► RETIRING ──last drain──► FREE
//!        tid, stack, ring,           timer deleted,              (collector, under   │
//!        generation += 1 (odd)       generation += 1 (even)       the drain lock)    │
//!                                                    generation = 2⁴⁰: RETIRED ◄──────┘
//! ```
//!
//! **What the handler trusts.** A timer's `si_value` is [`TimerValue`]: a tag, the slot
//! index and the slot's generation (40 bits, see below). The handler accepts a signal only if the tag matches,
//! the index names an allocated slot (chunks are never freed), the slot's generation
//! equals the value's (odd: owned) and the slot's owner is the receiving thread
//! (`gettid`). Anything else, such as another library's `SIGPROF` timer, a forged
//! `SI_TIMER` signal, or a signal queued for a thread that has since let its slot go, is
//! ignored and counted. Only the owner bumps the generation away from odd, on its own
//! thread: a handler running on it has finished by then, and a later one reads the new
//! generation. So the ring a handler uses belongs to its thread alone.
//!
//! **Who touches what.** The owner writes the slot's fields while claiming it (before the
//! generation is published with a release store) and never changes them while it is
//! LIVE. The collector drains LIVE and RETIRING slots under the drain lock and alone
//! moves RETIRING to FREE, so a slot's ring is never replaced while a drain may read it.
//! Timer ids are swapped out atomically, so stop and the owner never both delete one.
//!
//! **Generations never repeat.** The value fits one pointer-sized `sigval` with the tag
//! and the index, so the generation has 40 bits (the split is argued at [`TimerValue`]).
//! Instead of wrapping, a slot whose generation reaches 2⁴⁰ (its 2³⁹th release) is
//! retired once drained: it is never claimed again, its ring is freed,
//! and only the slot itself (a few hundred bytes) stays. So a value is never accepted by a
//! later owner of its slot, however long a signal or a `Tracked` view kept it.
//!
//! **Memory.** A slot keeps its ring when it is recycled, so a new thread
//! usually claims a slot that is ready (no allocation, no page faults), and memory tracks
//! the peak number of threads alive at once, not the number ever created.
//!
//! **Fork.** The child has one thread and none of the parent's timers: `reset_in_child`
//! forgets every timer id, empties every ring, zeroes the counters and frees every slot. A
//! ring whose producer or consumer role a parent thread held at the fork stays held (that
//! thread does not exist in the child): it holds none of the child's records, and the
//! next claim of its slot gives the slot a new ring (the old one is leaked, not freed).
//!
//! **Where the table lives.** The process's table is part of the sampler's state
//! (`SamplerState`), the one static the signal handler reads; a [`SlotTable`] is a plain
//! value, so tests of the free list, the drain and the read handshake build their own.

use crate::sync::{
    fence, spin_loop, yield_now, AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8,
    Ordering,
};

use super::cpu_ledger::CpuLedger;
use super::ring::{Ring, RingRecord};
use super::stack::StackBounds;
use crate::allocations::AllocRecord;
use crate::never_freed::NeverFreed;
use crate::span_context::SpanContextCell;

/// Slots per chunk (a model's table needs a few: loom's cost grows with its atomics).
const CHUNK: usize = if cfg!(loom) { 4 } else { 64 };
/// Chunks at most: 65,536 threads registered at once.
const MAX_CHUNKS: usize = 1024;
/// Most slots the table can hold.
pub(crate) const MAX_THREADS: usize = NeverFreed::<Slot, CHUNK, MAX_CHUNKS>::CAPACITY;

const FREE: u8 = 0;
const LIVE: u8 = 1;
const RETIRING: u8 = 2;
/// Its generation used up: never claimed again (see the module docs).
const RETIRED: u8 = 3;

/// Bits of the generation a [`TimerValue`] carries.
const GENERATION_BITS: u32 = 40;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
/// The generation a slot is retired at: the next claim would give it a value's
/// generation 1 again.
const RETIRED_AT: u64 = 1 << GENERATION_BITS;

/// Per-thread counters, monotonic for the life of the process (not reset on reuse).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) taken: AtomicU64,
    pub(crate) periods: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) truncated: AtomicU64,
    pub(crate) unknown_pc: AtomicU64,
    pub(crate) low_stack: AtomicU64,
}

/// One thread's sampler state.
pub(crate) struct Slot {
    index: u32,
    /// Odd while a thread owns the slot; below 2⁴⁰ unless RETIRED.
    generation: AtomicU64,
    phase: AtomicU8,
    /// The owner's kernel thread id.
    tid: AtomicI32,
    /// The owner's span context record (a `const` thread-local: lives as long as it).
    cell: AtomicPtr<SpanContextCell>,
    stack_lo: AtomicU64,
    stack_hi: AtomicU64,
    /// Replaced only while FREE (capacity change), never freed while LIVE or RETIRING.
    ring: AtomicPtr<Ring>,
    /// The owner's allocation samples (`allocations`: its producer is the owner thread in
    /// the allocator's hook, never the signal handler); null while allocations are not
    /// profiled. Managed as `ring` is.
    alloc_ring: AtomicPtr<Ring<AllocRecord>>,
    /// The owner's timer id + 1 (0: none).
    timer: AtomicU64,
    /// Set while the owner's handler runs (for the panic guard).
    pub(crate) in_handler: AtomicBool,
    /// Readers of the owner's span context record from other threads (the blocked-thread
    /// watchdog) in progress: the owner waits for none before letting go of the slot
    /// (and, soon after, of the thread-local the record lives in). See
    /// [`Slot::read_cell_if_owned`].
    watching: AtomicU32,
    pub(crate) counters: Counters,
    /// The owner's CPU time given to roots so far (see `cpu_ledger`).
    pub(crate) cpu: CpuLedger,
    /// Free list link: index + 1 of the next free slot (0: none).
    next_free: AtomicU32,
    /// [`NOT_ADOPTED`], [`ADOPTING`], [`ADOPTED`] or [`ADOPTION_TAKEN`] (see `adopt`).
    adopted: AtomicU8,
    /// The owner's handler found an alternate stack installed (adopted slots: see
    /// `altstack::adopt_in_handler`).
    pub(crate) alt_checked: AtomicBool,
}

/// The slot's thread registered itself (or the slot is free).
const NOT_ADOPTED: u8 = 0;
/// Held by the collector's scan while it claims the slot for a thread or changes its
/// timer: a thread registering itself does not take it back meanwhile (it would free a
/// slot whose timer the scan is about to arm), and looks again after the scan lets go.
const ADOPTING: u8 = 1;
/// The scan's adoption of a thread that never registered (`adopt`), not held.
const ADOPTED: u8 = 2;
/// An adopted slot being let go: by its thread registering itself, or by the scan once
/// the thread is gone. Exactly one of them wins [`Slot::take_adopted`].
const ADOPTION_TAKEN: u8 = 3;

impl Slot {
    fn new(index: u32) -> Slot {
        Slot {
            index,
            generation: AtomicU64::new(0),
            phase: AtomicU8::new(FREE),
            tid: AtomicI32::new(0),
            cell: AtomicPtr::new(std::ptr::null_mut()),
            stack_lo: AtomicU64::new(0),
            stack_hi: AtomicU64::new(0),
            ring: AtomicPtr::new(std::ptr::null_mut()),
            alloc_ring: AtomicPtr::new(std::ptr::null_mut()),
            timer: AtomicU64::new(0),
            in_handler: AtomicBool::new(false),
            watching: AtomicU32::new(0),
            counters: Counters::default(),
            cpu: CpuLedger::default(),
            next_free: AtomicU32::new(0),
            adopted: AtomicU8::new(NOT_ADOPTED),
            alt_checked: AtomicBool::new(false),
        }
    }

    /// Whether the slot was claimed for a thread by the collector's scan (`adopt`), not
    /// by the thread itself. Async-signal-safe.
    #[inline]
    pub(crate) fn is_adopted(&self) -> bool {
        self.adopted.load(Ordering::Acquire) != NOT_ADOPTED
    }

    /// Whether a thread owns the slot now (the generation is odd and the phase LIVE).
    pub(crate) fn is_live(&self) -> bool {
        self.phase.load(Ordering::SeqCst) == LIVE && self.generation.load(Ordering::SeqCst) & 1 == 1
    }

    /// Takes an adopted slot to let it go: true for exactly one caller (the thread
    /// registering itself, or the scan that found the thread gone), which then deletes
    /// its timer and releases it (see `adopt` for why either may). A slot the scan holds
    /// ([`Slot::hold_adoption`]) is not taken.
    pub(crate) fn take_adopted(&self) -> bool {
        self.adopted
            .compare_exchange(ADOPTED, ADOPTION_TAKEN, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Puts back an adoption taken with [`Slot::take_adopted`] that could not be let go
    /// (its alternate stack is in use): the scan releases it once its thread is gone.
    pub(crate) fn untake_adopted(&self) {
        let _ = self.adopted.compare_exchange(
            ADOPTION_TAKEN,
            ADOPTED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// The scan holds an adoption while it changes its timer: true if the slot was an
    /// adoption not taken (and is held now). See [`ADOPTING`].
    pub(crate) fn hold_adoption(&self) -> bool {
        self.adopted
            .compare_exchange(ADOPTED, ADOPTING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The scan lets go of an adoption it holds (claimed, or held with
    /// [`Slot::hold_adoption`]); the caller then fences and looks for the thread's own
    /// slot (`adopt::publish_adoption`).
    pub(crate) fn let_go_of_adoption(&self) {
        let _ =
            self.adopted
                .compare_exchange(ADOPTING, ADOPTED, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether the slot is a live adoption of the thread `tid` (not yet taken).
    pub(crate) fn is_adoption_of(&self, tid: libc::pid_t) -> bool {
        self.adopted.load(Ordering::SeqCst) == ADOPTED
            && self.is_live()
            && self.tid.load(Ordering::SeqCst) == tid
    }

    /// The slot's timer is armed now.
    pub(crate) fn has_timer(&self) -> bool {
        self.timer.load(Ordering::SeqCst) != 0
    }

    /// The value this slot's current owner gives its timer.
    pub(crate) fn timer_value(&self) -> TimerValue {
        TimerValue::new(self.index, self.generation.load(Ordering::Relaxed))
    }

    /// Whether a signal carrying `value` may use this slot on this thread. Async-signal-safe.
    #[inline]
    fn accepts(&self, value: TimerValue) -> bool {
        self.generation.load(Ordering::Acquire) == value.generation()
            && value.generation() & 1 == 1
            // SAFETY: gettid has no preconditions and is async-signal-safe.
            && self.tid.load(Ordering::Relaxed) == unsafe { libc::gettid() }
    }

    /// The slot's generation (odd while owned): tells one owner from the next, and never
    /// comes back to a value it had (see the module docs).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The slot's index in the table.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    /// Reads the owner's span context record from another thread, if the slot still
    /// belongs to the owner of `generation`: `(sequence, label word)` as
    /// [`SpanContextCell::snapshot_word`] gives them, `None` when the owner let go or the
    /// read raced a write. The word's label is read after (`Label::read`): label slots are
    /// never freed, so that read needs no handshake.
    ///
    /// The record is a thread-local of the owner, freed when it exits. A handshake keeps it
    /// alive for the read: this counts itself into `watching`, then checks the generation;
    /// `release` bumps the generation, then waits until `watching` is zero (all SeqCst, with
    /// a `fence(SeqCst)` between the store and the load on each side, the form loom checks).
    /// Whichever goes second sees the other: either this finds the generation changed and
    /// reads nothing, or the owner waits the few nanoseconds of the read before exiting.
    pub(crate) fn read_cell_if_owned(
        &self,
        generation: u64,
    ) -> Option<(u64, Option<crate::label::Label>)> {
        self.watching.fetch_add(1, Ordering::SeqCst);
        // The store-load order of the handshake, stated as fences (loom checks them; it
        // takes SeqCst accesses for AcqRel), paired with the one in `release`.
        fence(Ordering::SeqCst);
        let result = if self.generation.load(Ordering::SeqCst) == generation && generation & 1 == 1
        {
            // SAFETY: the owner of `generation` still holds the slot, so its thread (and
            // its `const` thread-local record) lives until `watching` is cleared below.
            unsafe { self.cell().as_ref() }.and_then(SpanContextCell::snapshot_word)
        } else {
            None
        };
        self.watching.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// The owner's kernel thread id.
    pub(crate) fn owner_tid(&self) -> libc::pid_t {
        self.tid.load(Ordering::Relaxed)
    }

    /// The owner's span context record. Valid while the owner lives (handler use only, on
    /// the owner thread).
    #[inline]
    pub(crate) fn cell(&self) -> *const SpanContextCell {
        self.cell.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn stack(&self) -> StackBounds {
        StackBounds {
            lo: self.stack_lo.load(Ordering::Relaxed),
            hi: self.stack_hi.load(Ordering::Relaxed),
        }
    }

    /// The ring, for the owner's handler (which takes its producer role), the drainer
    /// (its consumer role, under the drain lock) or the owner letting go of the slot.
    #[inline]
    pub(crate) fn ring(&self) -> Option<&Ring> {
        // SAFETY: rings are replaced and freed only while the slot is FREE, by the thread
        // claiming it (see module docs), or when it is retired (`put_back`, under the drain
        // lock, after its last drain); callers are the owner's handler (slot LIVE,
        // checked), the owner in `release` (LIVE until it stores the phase), the drainer
        // (which skips FREE and RETIRED slots and alone frees RETIRING ones) and a forked
        // child's one thread.
        unsafe { self.ring.load(Ordering::Acquire).as_ref() }
    }

    /// The allocation ring, for the owner's allocator hook (its producer), the drainer
    /// (its consumer) or the owner letting go of the slot; as [`Slot::ring`].
    #[inline]
    pub(crate) fn alloc_ring(&self) -> Option<&Ring<AllocRecord>> {
        // SAFETY: as in `ring`: replaced and freed only while the slot is FREE or retired.
        unsafe { self.alloc_ring.load(Ordering::Acquire).as_ref() }
    }

    /// Whether neither ring holds a record (exact when no producer runs).
    fn rings_empty(&self) -> bool {
        self.ring().is_none_or(Ring::is_empty) && self.alloc_ring().is_none_or(Ring::is_empty)
    }

    /// Whether a thread owns the slot and has a timer armed now.
    pub(crate) fn is_sampling(&self) -> bool {
        self.phase.load(Ordering::Acquire) == LIVE && self.timer.load(Ordering::Acquire) != 0
    }

    /// Publishes the owner's armed timer (SeqCst: pairs with the stop sequence).
    pub(crate) fn set_timer(&self, timer: libc::timer_t) {
        self.timer
            .store(timer as usize as u64 + 1, Ordering::SeqCst);
    }

    /// Deletes the slot's timer if it still has one; exactly one caller deletes it.
    pub(crate) fn delete_timer(&self) {
        let raw = self.timer.swap(0, Ordering::SeqCst);
        if raw != 0 {
            // SAFETY: the id came from timer_create in this process (the child of a fork
            // forgets ids, see `reset_in_child`) and the swap hands it to one caller.
            unsafe { libc::timer_delete((raw - 1) as usize as libc::timer_t) };
        }
    }
}

/// A timer's `si_value`: tag (8 bits) | index (16 bits) | generation (40 bits).
///
/// The split, for one 64-bit `sigval`:
/// * **index, 16 bits**: [`MAX_THREADS`] is 65,536.
/// * **generation, 40 bits**: 2³⁹ reuses of a slot before it is retired. A reuse is a
///   registration and its end: `timer_create`, `timer_settime`, `timer_delete`,
///   `sigprocmask` and `gettid`, five system calls (3 µs measured, well over 100 ns
///   each anywhere), so one slot is reused at most 10⁷ times a second (assumed). At that
///   rate a slot retires every 15 hours: 5,740 slots in 10 years of one slot churning
///   flat out (the table holds 65,536); at the measured cost, one every 19 days.
/// * **tag, 8 bits**: only a first filter (a foreign value passes it 1 time in 256; the
///   index, the 40-bit generation and the owner's tid are checked after it). It is
///   neither 0x00 nor 0xff, the top byte of user and kernel addresses.
///
/// 32 bits of generation (the split before) wrapped after 2³¹ reuses, minutes at that
/// rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimerValue(u64);

const TAG: u64 = 0xb7;
const TAG_SHIFT: u32 = 56;
const INDEX_SHIFT: u32 = GENERATION_BITS;
// The index field holds every index, and no more (a loom build's table is smaller: its
// chunks are, see `CHUNK`).
const _: () = assert!(if cfg!(loom) {
    MAX_THREADS <= 1 << (TAG_SHIFT - INDEX_SHIFT)
} else {
    MAX_THREADS == 1 << (TAG_SHIFT - INDEX_SHIFT)
});

impl TimerValue {
    fn new(index: u32, generation: u64) -> TimerValue {
        TimerValue(
            TAG << TAG_SHIFT
                | u64::from(index & 0xffff) << INDEX_SHIFT
                | (generation & GENERATION_MASK),
        )
    }

    pub(crate) fn from_sival(sival: *mut libc::c_void) -> TimerValue {
        TimerValue(sival as usize as u64)
    }

    pub(crate) fn to_sival(self) -> *mut libc::c_void {
        self.0 as usize as *mut libc::c_void
    }

    fn index(self) -> Option<u32> {
        (self.0 >> TAG_SHIFT == TAG).then_some((self.0 >> INDEX_SHIFT) as u32 & 0xffff)
    }

    fn generation(self) -> u64 {
        self.0 & GENERATION_MASK
    }
}

/// A lock that a forked child can reset: the thread that held it in the parent does not
/// exist in the child, so a `std::sync::Mutex` held at `fork` would stay locked forever.
/// Waiters yield; hold it only for short, non-blocking work or rare operations.
pub(crate) struct ForkSafeLock(AtomicBool);

/// Held [`ForkSafeLock`]; unlocks on drop.
pub(crate) struct ForkSafeGuard<'a>(&'a ForkSafeLock);

impl ForkSafeLock {
    crate::sync::const_fn! {
        pub(crate) fn new() -> ForkSafeLock {
            ForkSafeLock(AtomicBool::new(false))
        }
    }

    pub(crate) fn lock(&self) -> ForkSafeGuard<'_> {
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            yield_now();
        }
        ForkSafeGuard(self)
    }

    pub(crate) fn try_lock(&self) -> Option<ForkSafeGuard<'_>> {
        self.0
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(ForkSafeGuard(self))
    }

    /// Unlocks unconditionally: only in a forked child, whose one thread holds nothing.
    pub(crate) fn reset_in_child(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

impl Drop for ForkSafeGuard<'_> {
    fn drop(&mut self) {
        (self.0).0.store(false, Ordering::Release);
    }
}

/// Bits of the free list head naming the top slot (index + 1, up to [`MAX_THREADS`]).
const HEAD_INDEX_BITS: u32 = 17;
const HEAD_INDEX_MASK: u64 = (1 << HEAD_INDEX_BITS) - 1;
const _: () = assert!(MAX_THREADS < 1 << HEAD_INDEX_BITS);

/// The free list head after one push or pop onto `top` (index + 1, 0: empty): the ABA
/// tag, the other 47 bits, counts every push and pop. A pop that read the head is fooled
/// only if the head is back to the same tag and top when it compares, which takes 2⁴⁷
/// pushes and pops while it stands between its load and its compare-exchange: 81 days at
/// the 10⁷ reuses a second a slot can see (two operations each), a whole process would
/// have to run that long around one stopped thread. The tag wraps (no panic).
fn next_head(head: u64, top: u32) -> u64 {
    ((head >> HEAD_INDEX_BITS).wrapping_add(1)) << HEAD_INDEX_BITS | u64::from(top)
}

/// The table of thread slots with its free list and drain lock. The process has one, in
/// the sampler's state (the signal handler reaches it there); tests build their own.
pub(crate) struct SlotTable {
    slots: NeverFreed<Slot, CHUNK, MAX_CHUNKS>,
    /// Free list head: (ABA tag << 17) | (index + 1); 0 in the low 17 bits: empty (see
    /// [`next_head`]).
    free_head: AtomicU64,
    /// Held by the one drainer; fork-safe (see [`ForkSafeLock`]).
    draining: ForkSafeLock,
    /// Slots retired so far.
    retired: AtomicU64,
    /// Records of every ring allocated and not freed (leaked ones included).
    ring_records: std::sync::atomic::AtomicU64,
    /// The same, for allocation rings.
    alloc_records: std::sync::atomic::AtomicU64,
    /// Claims refused: every slot taken.
    refused: std::sync::atomic::AtomicU64,
}

impl SlotTable {
    crate::sync::const_fn! {
        pub(crate) fn new() -> SlotTable {
            SlotTable {
                slots: NeverFreed::new(),
                free_head: AtomicU64::new(0),
                draining: ForkSafeLock::new(),
                retired: AtomicU64::new(0),
                ring_records: std::sync::atomic::AtomicU64::new(0),
                alloc_records: std::sync::atomic::AtomicU64::new(0),
                refused: std::sync::atomic::AtomicU64::new(0),
            }
        }
    }

    /// Slots the table holds (never freed: the high-water mark of threads registered at
    /// once, plus exited threads whose samples were not drained yet).
    pub(crate) fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Bytes of the rings the slots hold (a free slot keeps its ring for the next
    /// thread: the high-water mark too).
    pub(crate) fn ring_bytes(&self) -> u64 {
        self.ring_records.load(std::sync::atomic::Ordering::Relaxed)
            * std::mem::size_of::<super::ring::SampleRecord>() as u64
    }

    /// Bytes of every allocation ring allocated and not freed.
    pub(crate) fn alloc_ring_bytes(&self) -> u64 {
        self.alloc_records
            .load(std::sync::atomic::Ordering::Relaxed)
            * std::mem::size_of::<AllocRecord>() as u64
    }

    /// Claims refused because every slot was taken.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The slot at `index`, if allocated. Async-signal-safe.
    #[inline]
    fn slot(&self, index: u32) -> Option<&'static Slot> {
        self.slots.get(index)
    }

    /// The slot a signal carrying `value` belongs to, if it is one of ours for this
    /// thread. Async-signal-safe.
    #[inline]
    pub(crate) fn for_signal(&self, value: TimerValue) -> Option<&'static Slot> {
        let slot = self.slot(value.index()?)?;
        slot.accepts(value).then_some(slot)
    }

    /// Every slot allocated so far (including free ones).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &'static Slot> + '_ {
        self.slots.iter()
    }

    fn pop_free(&self) -> Option<&'static Slot> {
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            let top = (head & HEAD_INDEX_MASK) as u32;
            let slot = self.slot(top.checked_sub(1)?)?;
            let next = slot.next_free.load(Ordering::Acquire);
            let new = next_head(head, next);
            match self.free_head.compare_exchange_weak(
                head,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(slot),
                Err(actual) => head = actual,
            }
        }
    }

    fn push_free(&self, slot: &Slot) {
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            slot.next_free
                .store((head & HEAD_INDEX_MASK) as u32, Ordering::Release);
            let new = next_head(head, slot.index + 1);
            match self.free_head.compare_exchange_weak(
                head,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    fn fresh(&self) -> Option<&'static Slot> {
        self.slots.fresh(Slot::new).map(|(_, slot)| slot)
    }

    /// Claims a slot for the calling thread: a recycled one when there is one (its ring
    /// is reused), a new one otherwise. `None` when [`MAX_THREADS`] are
    /// registered.
    pub(crate) fn claim(&self, owner: Owner) -> Option<&'static Slot> {
        let Some(slot) = self.pop_free().or_else(|| self.fresh()) else {
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        };
        slot.tid.store(owner.tid, Ordering::Relaxed);
        slot.adopted.store(
            // Held by the scan until its timer is armed (see `ADOPTING`).
            if owner.adopted { ADOPTING } else { NOT_ADOPTED },
            Ordering::Relaxed,
        );
        slot.alt_checked.store(false, Ordering::Relaxed);
        slot.cell.store(owner.cell as *mut _, Ordering::Relaxed);
        slot.stack_lo.store(owner.stack.lo, Ordering::Relaxed);
        slot.stack_hi.store(owner.stack.hi, Ordering::Relaxed);
        slot.cpu.reset(owner.cpu_ns);
        // SAFETY (both): the slot is FREE and ours: no handler accepts it (even
        // generation) and no drainer reads it (drains skip FREE slots), so its rings are
        // not replaced or freed by anyone else.
        unsafe {
            self.refresh_ring(&slot.ring, owner.ring_capacity, &self.ring_records);
            if owner.alloc_capacity > 0 {
                self.refresh_ring(&slot.alloc_ring, owner.alloc_capacity, &self.alloc_records);
            }
        }
        // Even → odd, publishing the fields above to any handler that sees the generation.
        slot.generation.fetch_add(1, Ordering::AcqRel);
        slot.phase.store(LIVE, Ordering::Release);
        Some(slot)
    }

    /// Gives a claimed slot's ring `ring` room for `capacity` records: the one it has,
    /// emptied, or a new one.
    ///
    /// # Safety
    /// The slot is FREE and the caller's (see `claim`).
    unsafe fn refresh_ring<T: RingRecord + Send>(
        &self,
        ring: &AtomicPtr<Ring<T>>,
        capacity: usize,
        records: &std::sync::atomic::AtomicU64,
    ) {
        let raw = ring.load(Ordering::Relaxed);
        // SAFETY: the caller's: nobody else replaces or frees it now.
        let old = unsafe { raw.as_ref() };
        // The last drain emptied it; the reset clears a forked child's copy. A ring whose
        // role a parent thread held at a fork stays held in the child: replaced below.
        if old.is_some_and(|r| r.capacity() == capacity && r.reset()) {
            return;
        }
        let new = Box::into_raw(Box::new(Ring::<T>::new(capacity)));
        count_records(records, capacity, true);
        ring.store(new, Ordering::Release);
        // Free the old ring unless a role on it is still held (in a forked child, by a
        // thread that does not exist there, or by a producer that never returned: then it
        // is leaked, once per such ring).
        if old.is_some_and(Ring::reset) {
            count_records(records, old.map_or(0, Ring::capacity), false);
            // SAFETY: came from Box::into_raw; nothing else can reach it (see above), and
            // no role on it is held.
            drop(unsafe { Box::from_raw(raw) });
        }
    }

    /// Ends the owner's use of `slot`. Only the owner thread may call this, with a slot
    /// it claimed from this table; for an adopted slot, whoever took it
    /// ([`Slot::take_adopted`]): the thread itself, or the scan once the thread is gone
    /// (no handler can run on a thread that has exited).
    ///
    /// A slot with nothing left to drain goes straight back to the free list when no drain
    /// is running (so threads that come and go faster than the drain period reuse slots
    /// instead of piling up); otherwise the next drain takes its records and frees it.
    pub(crate) fn release(&self, slot: &Slot) {
        slot.delete_timer();
        // Odd → even: a signal still queued for this thread finds a generation mismatch.
        slot.generation.fetch_add(1, Ordering::SeqCst);
        // Paired with the fence in `read_cell_if_owned`.
        fence(Ordering::SeqCst);
        // A watchdog read of this thread's record that began before the bump ends first
        // (see `read_cell_if_owned`): it holds no lock and makes no syscall.
        let mut spins = 0u32;
        while slot.watching.load(Ordering::SeqCst) != 0 {
            // A reader preempted inside its read would otherwise be spun against.
            spins += 1;
            if spins < 64 {
                spin_loop();
            } else {
                yield_now();
            }
        }
        if let Some(_drain) = self.draining.try_lock() {
            // No drainer can be reading this ring now, and no handler will write it.
            if slot.rings_empty() {
                self.put_back(slot);
                return;
            }
        }
        slot.phase.store(RETIRING, Ordering::Release);
    }

    /// A slot whose owner let go and whose ring is drained: back on the free list, or
    /// retired when its generation is used up. The caller holds the drain lock and the
    /// slot is not LIVE: no handler accepts it (its generation is even) and no drainer
    /// reads it.
    fn put_back(&self, slot: &Slot) {
        if slot.generation.load(Ordering::Acquire) < RETIRED_AT {
            slot.phase.store(FREE, Ordering::Release);
            self.push_free(slot);
            return;
        }
        slot.phase.store(RETIRED, Ordering::Release);
        // Nothing reaches the rings of a retired slot again: free them, unless a role on
        // one is still held (see `claim`); then it is leaked.
        free_ring(&slot.ring, &self.ring_records);
        free_ring(&slot.alloc_ring, &self.alloc_records);
        self.retired.fetch_add(1, Ordering::Relaxed);
    }

    /// Slots retired because their generation was used up.
    #[cfg(test)]
    pub(crate) fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Drains every LIVE and RETIRING slot into `f` and frees the RETIRING ones: the one
    /// consumer of every ring (the drain lock), and the only mover of RETIRING to FREE.
    /// Waits for a drain in progress.
    pub(crate) fn drain(
        &self,
        f: &mut dyn FnMut(&super::SampleRecord),
        allocations: &mut dyn FnMut(&AllocRecord),
    ) -> usize {
        let _drain = self.draining.lock();
        let mut total = 0;
        for slot in self.iter() {
            // Read before draining: every record of a RETIRING slot was pushed before its
            // phase was stored, so this drain is its last.
            let phase = slot.phase.load(Ordering::Acquire);
            if phase == FREE || phase == RETIRED {
                continue;
            }
            // Under the drain lock nobody else consumes: the role is free (a forked
            // child's copy of a ring its parent was draining stays held: it holds none of
            // the child's records, see `claim`).
            if let Some(mut consumer) = slot.ring().and_then(Ring::consumer) {
                total += consumer.drain(&mut *f);
            }
            if let Some(mut consumer) = slot.alloc_ring().and_then(Ring::consumer) {
                consumer.drain(&mut *allocations);
            }
            // A compare-exchange, not a store: if `f` forked and this is the child
            // carrying on, `reset_in_child` already freed (and listed) every slot, and a
            // second push would put this one on the free list twice.
            if phase == RETIRING
                && slot
                    .phase
                    .compare_exchange(RETIRING, FREE, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // FREE for a moment: it is on no list yet, and nothing claims it.
                self.put_back(slot);
            }
        }
        total
    }

    /// Holds the drain lock (tests: a drain in progress).
    #[cfg(test)]
    pub(crate) fn hold_drain(&self) -> ForkSafeGuard<'_> {
        self.draining.lock()
    }

    /// In a forked child: forget the parent's timers and threads, empty the rings, zero
    /// the counters, free every slot. Only atomics: runs in the `pthread_atfork` child
    /// handler.
    pub(crate) fn reset_in_child(&self) {
        self.draining.reset_in_child();
        self.free_head.store(0, Ordering::Relaxed);
        for slot in self.iter() {
            if slot.phase.load(Ordering::Relaxed) == RETIRED {
                continue;
            }
            slot.timer.store(0, Ordering::Relaxed);
            if slot.generation.load(Ordering::Relaxed) & 1 == 1 {
                slot.generation.fetch_add(1, Ordering::Relaxed);
            }
            slot.in_handler.store(false, Ordering::Relaxed);
            slot.watching.store(0, Ordering::Relaxed);
            slot.adopted.store(NOT_ADOPTED, Ordering::Relaxed);
            slot.alt_checked.store(false, Ordering::Relaxed);
            if let Some(ring) = slot.ring() {
                // Fails only for a ring a parent thread was using at the fork; the next
                // claim of the slot replaces it.
                let _ = ring.reset();
            }
            if let Some(ring) = slot.alloc_ring() {
                let _ = ring.reset();
            }
            let c = &slot.counters;
            for counter in [
                &c.taken,
                &c.periods,
                &c.dropped,
                &c.truncated,
                &c.unknown_pc,
                &c.low_stack,
            ] {
                counter.store(0, Ordering::Relaxed);
            }
            if slot.generation.load(Ordering::Relaxed) >= RETIRED_AT {
                // Used up (its ring is leaked: only atomics here).
                slot.phase.store(RETIRED, Ordering::Relaxed);
                self.retired.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            slot.phase.store(FREE, Ordering::Relaxed);
            self.push_free(slot);
        }
    }
}

/// Adds (`made`) or takes away a ring's `capacity` from a count of records allocated.
fn count_records(records: &std::sync::atomic::AtomicU64, capacity: usize, made: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    if made {
        records.fetch_add(capacity as u64, Relaxed);
    } else {
        records.fetch_sub(capacity as u64, Relaxed);
    }
}

/// Frees a retired slot's ring, unless a role on it is held (then it is leaked).
fn free_ring<T: RingRecord>(ring: &AtomicPtr<Ring<T>>, records: &std::sync::atomic::AtomicU64) {
    let raw = ring.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: the slot is retired: nothing else reaches the ring; it came from
    // Box::into_raw.
    let old = unsafe { raw.as_ref() };
    if old.is_some_and(Ring::reset) {
        count_records(records, old.map_or(0, Ring::capacity), false);
        // SAFETY: no role on it is held, and nothing else can reach it.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// What a new owner installs in its slot.
pub(crate) struct Owner {
    pub(crate) tid: libc::pid_t,
    pub(crate) cell: *const SpanContextCell,
    pub(crate) stack: StackBounds,
    pub(crate) ring_capacity: usize,
    /// Records of the allocation ring (0: none is made; one the slot has is kept).
    pub(crate) alloc_capacity: usize,
    /// The owner's CPU clock at the claim (`cpu_ledger::thread_cpu_ns`).
    pub(crate) cpu_ns: u64,
    /// Claimed by the collector's scan for a thread that never registered (`adopt`):
    /// no span context record, stack bounds unknown.
    pub(crate) adopted: bool,
}

#[cfg(all(test, loom))]
pub(super) mod loom_model;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_values_round_trip_and_foreign_values_name_no_slot() {
        let v = TimerValue::new(513, 7);
        assert_eq!(v.index(), Some(513));
        assert_eq!(v.generation(), 7);
        assert_eq!(TimerValue::from_sival(v.to_sival()), v);
        let last = TimerValue::new(MAX_THREADS as u32 - 1, RETIRED_AT - 1);
        assert_eq!(last.index(), Some(MAX_THREADS as u32 - 1));
        assert_eq!(last.generation(), RETIRED_AT - 1, "all 40 bits");
        assert_eq!(TimerValue::from_sival(last.to_sival()), last);
        // The process's table (only read) and a table of this test's own.
        let own = SlotTable::new();
        for foreign in [0x1234usize, 0, usize::MAX, 0x7fff_dead_beef] {
            let v = TimerValue::from_sival(foreign as *mut libc::c_void);
            assert_eq!(v.index(), None, "{foreign:#x}");
            assert!(super::super::SamplerState::global()
                .slots()
                .for_signal(v)
                .is_none());
            assert!(own.for_signal(v).is_none());
        }
    }

    fn own_thread() -> Owner {
        Owner {
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() },
            cell: std::ptr::null(),
            stack: StackBounds { lo: 0, hi: 0 },
            ring_capacity: 2,
            alloc_capacity: 0,
            cpu_ns: 0,
            adopted: false,
        }
    }

    /// Sets a free (even) slot's generation: tests drive it next to its end, 2³⁹ thread
    /// registrations being out of a test's reach.
    fn set_generation(slot: &Slot, generation: u64) {
        assert_eq!(generation & 1, 0, "a free slot's generation is even");
        slot.generation.store(generation, Ordering::SeqCst);
    }

    /// A slot's generation at the end of a timer value's 40 bits: its last owner's release
    /// retires it, so no later owner carries generation 1 (a value from 2³⁹ owners
    /// earlier) and neither that value nor the last owner's is ever accepted again; the
    /// retired slot is never claimed and its ring is freed. Also through the
    /// drain (a slot released with records left) and a fork. On a table of its own.
    #[test]
    fn a_slot_whose_generation_is_used_up_is_retired_never_reused() {
        let table = SlotTable::new();
        let first = table.claim(own_thread()).expect("slot");
        let index = first.index;
        let early = first.timer_value();
        assert_eq!(early.generation(), 1);
        table.release(first);
        set_generation(first, RETIRED_AT - 2);
        let last = table.claim(own_thread()).expect("slot");
        assert_eq!(last.index, index, "the free list is LIFO");
        let value = last.timer_value();
        assert_eq!(value.generation(), RETIRED_AT - 1);
        assert!(
            table.for_signal(value).is_some(),
            "its last owner is sampled"
        );
        table.release(last);
        assert_eq!(table.retired(), 1);
        assert_eq!(last.phase.load(Ordering::Relaxed), RETIRED);
        assert!(last.ring().is_none(), "buffers freed");
        for stale in [value, early, TimerValue::new(index, 1)] {
            assert!(table.for_signal(stale).is_none(), "{stale:?}");
        }
        for _ in 0..10 {
            let other = table.claim(own_thread()).expect("slot");
            assert_ne!(other.index, index, "a retired slot is never claimed");
            table.release(other);
        }

        // Released with a record left: the drain that takes it retires the slot.
        let other = table.claim(own_thread()).expect("slot");
        table.release(other);
        set_generation(other, RETIRED_AT - 2);
        let draining = table.claim(own_thread()).expect("slot");
        assert_eq!(draining.index, other.index);
        assert!(draining
            .ring()
            .and_then(Ring::producer)
            .expect("producer")
            .push_with(|r| r.depth = 5));
        table.release(draining);
        assert_eq!(table.retired(), 1, "records left: retiring");
        let mut depths = Vec::new();
        table.drain(&mut |r| depths.push(r.depth), &mut |_| {});
        assert_eq!(depths, [5], "its last records are still drained");
        assert_eq!(table.retired(), 2);
        assert_eq!(draining.phase.load(Ordering::Relaxed), RETIRED);
        assert_eq!(table.drain(&mut |_| {}, &mut |_| {}), 0);

        // Owned at a fork: the child's reset retires it, and leaves retired slots out.
        let forked = table.claim(own_thread()).expect("slot");
        table.release(forked);
        set_generation(forked, RETIRED_AT - 2);
        let forked = table.claim(own_thread()).expect("slot");
        table.reset_in_child();
        assert_eq!(table.retired(), 3);
        assert_eq!(forked.generation(), RETIRED_AT);
        let mut claimed = Vec::new();
        while let Some(slot) = table.claim(own_thread()) {
            claimed.push(slot.index);
            if claimed.len() > 64 {
                break;
            }
        }
        for retired in [index, draining.index, forked.index] {
            assert!(!claimed.contains(&retired), "slot {retired} claimed again");
        }
    }

    /// The table reports what it holds: its slots, its rings' bytes (a free slot keeps
    /// its ring; a ring replaced for another capacity is freed) and, once every slot is
    /// taken, the claims it refuses.
    #[test]
    fn slots_rings_and_refusals_are_counted() {
        let table = SlotTable::new();
        let record = std::mem::size_of::<super::super::ring::SampleRecord>() as u64;
        let a = table.claim(own_thread()).expect("slot");
        let ring = own_thread().ring_capacity as u64;
        assert_eq!((table.len(), table.ring_bytes()), (1, ring * record));
        table.release(a);
        let b = table.claim(own_thread()).expect("slot");
        assert_eq!(b.index, a.index);
        assert_eq!(table.ring_bytes(), ring * record, "the ring was reused");
        table.release(b);
        let c = table
            .claim(Owner {
                ring_capacity: 9,
                alloc_capacity: 0,
                ..own_thread()
            })
            .expect("slot");
        assert_eq!(table.ring_bytes(), 9 * record, "the old ring freed");
        table.release(c);
        while table.fresh().is_some() {}
        assert_eq!(table.len(), MAX_THREADS as u64);
        let _ = table.pop_free();
        assert!(table.claim(own_thread()).is_none(), "every slot taken");
        assert_eq!(table.refused(), 1);
    }

    /// The free list head's ABA tag wraps (after 2⁴⁷ pushes and pops) without a panic
    /// and without losing the list.
    #[test]
    fn the_free_list_tag_wraps_cleanly() {
        let table = SlotTable::new();
        let a = table.fresh().expect("slot");
        let b = table.fresh().expect("slot");
        let top_tag = (1u64 << (64 - HEAD_INDEX_BITS)) - 1;
        table
            .free_head
            .store(top_tag << HEAD_INDEX_BITS, Ordering::SeqCst);
        table.push_free(a);
        assert_eq!(table.free_head.load(Ordering::SeqCst) >> HEAD_INDEX_BITS, 0);
        table.push_free(b);
        assert_eq!(table.pop_free().map(|s| s.index), Some(b.index));
        assert_eq!(table.pop_free().map(|s| s.index), Some(a.index));
        assert!(table.pop_free().is_none());
    }

    /// On a table of its own: no other test's slots, no turn on the process's sampler.
    #[test]
    fn the_free_list_hands_each_slot_to_one_claimer() {
        let table = SlotTable::new();
        let slots: Vec<&'static Slot> = (0..64).filter_map(|_| table.fresh()).collect();
        assert_eq!(slots.len(), 64);
        for s in &slots {
            table.push_free(s);
        }
        let popped: Vec<Vec<u32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        while let Some(s) = table.pop_free() {
                            mine.push(s.index);
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("popper"))
                .collect()
        });
        let mut all: Vec<u32> = popped.into_iter().flatten().collect();
        all.sort_unstable();
        let before = all.len();
        all.dedup();
        assert_eq!(all.len(), before, "a slot was handed out twice");
        for s in &slots {
            assert!(all.contains(&s.index));
        }
    }

    /// The watchdog's handshake: a thread letting go of its slot waits while a reader of
    /// its span record is in progress, and a reader that starts after the generation
    /// moved reads nothing. On a table of its own (no timer: the handshake involves no
    /// signal), so it needs no turn on the process's sampler.
    #[test]
    fn letting_go_of_a_slot_waits_for_a_reader_of_its_record() {
        let table = SlotTable::new();
        std::thread::scope(|scope| {
            let (owned, slot_of) = std::sync::mpsc::channel();
            let (go, release) = std::sync::mpsc::channel::<()>();
            let table = &table;
            let owner = scope.spawn(move || {
                let slot = table
                    .claim(Owner {
                        // SAFETY: gettid has no preconditions.
                        tid: unsafe { libc::gettid() },
                        cell: crate::span_context::thread_cell(),
                        stack: StackBounds::current().expect("stack"),
                        ring_capacity: 4,
                        alloc_capacity: 0,
                        cpu_ns: 0,
                        adopted: false,
                    })
                    .expect("slot");
                owned.send((slot.index, slot.generation())).expect("send");
                release.recv().expect("go");
                table.release(slot);
            });
            let (index, generation) = slot_of.recv().expect("slot");
            let slot = table.slot(index).expect("allocated");
            assert!(
                slot.read_cell_if_owned(generation).is_some(),
                "owned: readable"
            );
            // A reader in progress.
            slot.watching.fetch_add(1, Ordering::SeqCst);
            go.send(()).expect("go");
            let moved = std::time::Instant::now();
            while slot.generation() == generation {
                assert!(moved.elapsed() < std::time::Duration::from_secs(5));
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!owner.is_finished(), "release waits for the reader");
            assert!(
                slot.read_cell_if_owned(generation).is_none(),
                "a reader after the generation moved reads nothing"
            );
            slot.watching.fetch_sub(1, Ordering::SeqCst);
            owner.join().expect("owner");
        });
    }

    /// A slot released while a drain runs is left RETIRING for that drain's successor,
    /// which takes its records and frees it; one released with nothing to drain and no
    /// drain running is free at once. On a table of its own.
    #[test]
    fn a_released_slot_is_freed_by_the_next_drain_or_at_once() {
        let table = SlotTable::new();
        let owner = || Owner {
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() },
            cell: std::ptr::null(),
            stack: StackBounds { lo: 0, hi: 0 },
            ring_capacity: 2,
            alloc_capacity: 0,
            cpu_ns: 0,
            adopted: false,
        };
        let slot = table.claim(owner()).expect("slot");
        assert!(slot
            .ring()
            .and_then(Ring::producer)
            .expect("producer")
            .push_with(|r| r.depth = 3));
        table.release(slot);
        assert!(table.pop_free().is_none(), "records left: retiring");
        let mut depths = Vec::new();
        assert_eq!(table.drain(&mut |r| depths.push(r.depth), &mut |_| {}), 1);
        assert_eq!(depths, [3]);
        let again = table.claim(owner()).expect("slot");
        assert_eq!(again.index, slot.index, "freed by the drain, reused");
        {
            let _drain = table.hold_drain();
            table.release(again);
        }
        assert!(
            table.pop_free().is_none(),
            "released during a drain: retiring"
        );
        assert_eq!(table.drain(&mut |_| {}, &mut |_| {}), 0);
        let third = table.claim(owner()).expect("slot");
        assert_eq!(third.index, slot.index);
        table.release(third);
        assert_eq!(
            table.pop_free().map(|s| s.index),
            Some(slot.index),
            "nothing to drain, no drain: free at once"
        );
    }
}
