//! The per-thread scope stack: every scope that set the thread's span context and has not
//! ended, innermost last, each with the context that was current when it began.
//!
//! Who pushes and who pops. One stack per thread serves both kinds of scope:
//!
//! * a `tracing` span entered through a [`ProfilingLayer`](crate::ProfilingLayer):
//!   `on_enter` calls [`enter`] with the key (that layer's [`Owner`], span id), `on_exit`
//!   calls [`exit`] with the same key;
//! * a [`SpanContextGuard`](super::SpanContextGuard) (and so every
//!   `ProfilingContext::in_scope` call and `ProfiledFuture` poll):
//!   `SpanContextGuard::enter` calls [`enter`] with a key no other guard on the thread has,
//!   its `Drop` calls [`exit`] with it.
//!
//! [`enter`]`(key, root)` writes `root` into the thread's cell and pushes (`key`, the
//! context it replaced). [`exit`]`(key)` removes the topmost entry with that key:
//!
//! * the innermost entry (LIFO, the usual case): its `previous` is written back;
//! * an entry below others (out of order: futures joined on one thread, a guard dropped
//!   while a span entered after it is still entered, or the reverse): the cell is left
//!   alone, since the scope above still runs, and the entry just above inherits the
//!   removed one's `previous`;
//! * no entry (never entered, or its enter could not be recorded): nothing.
//!
//! So each entry's `previous` is always the context of the live scope below it (nothing
//! for the bottom one), and the cell always holds the innermost live scope's context: an
//! exit never clears a live scope and never brings back one that ended.
//!
//! A [`Key`] is (owner, id unique within the owner). `tracing` span ids are only unique
//! within one subscriber (they are slab indices: two subscribers' first spans get the
//! same one), so each `ProfilingLayer` instance is its own [`Owner`]; guards share one
//! owner and number themselves per thread.
//!
//! The stack is a fixed array of `Cell`s in the thread's one `const` thread-local (beside
//! the record, see `PerThread`), with no destructor, so an enter or an exit is one plain TLS
//! access with no allocation and no borrow flag: an entry is a key and one label word (24
//! bytes). Nesting deeper than [`INLINE`] spills into a `VecDeque` (the one thread-local
//! here with a destructor, so it is reached with `try_with`: thread-local destructors may
//! enter and exit scopes after it is gone, and borrowed with `try_borrow_mut`). An enter
//! that cannot be recorded changes nothing.
//!
//! **The spill's bound.** Enters never exited (a guard or a `tracing` `Entered` given to
//! `mem::forget`, an exit the layer never sees) stay on the stack; without a bound a
//! long-lived thread's spill grew by 24 bytes per leak, forever. It holds at most
//! [`SPILL_CAP`] entries. An enter past it is recorded (so it, and every scope after it,
//! still labels its samples) and the oldest spilled entry is dropped as if its scope had
//! exited out of order: the entry above it inherits its `previous`, and the cell is not
//! touched. Leaked enters are the oldest, so they go first. A live scope dropped that way
//! (only under nesting 4,128 deep) has no entry left at its exit, which changes nothing
//! and pops no other scope: exits come innermost first, so an entry above it with its
//! key (a `tracing` span entered again inside itself) is gone by then. (Refusing the
//! newest enter instead would leave every later scope on the thread unlabelled, and its
//! exit would pop such an outer entry.) The one cost: the scope above it, ending, restores
//! the context from below the dropped scope, so the dropped scope's own time after that
//! is labelled as its parent's. Counted in [`ScopeStats::evicted`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::label::{word_of, Label};

/// Entries kept without allocation; deeper nesting is rare and spills to the heap.
const INLINE: usize = 32;

/// Most entries one thread's spill holds (96 KiB): nesting 4,128 deep in all. Real
/// nesting is a request's layers of spans (tens deep; the inline 32 hold it) or a
/// recursive instrumented function (hundreds at most), so two orders of magnitude above
/// it a full spill is leaked enters. At least 2: the entry dropped is never the newest.
pub(crate) const SPILL_CAP: usize = 4096;
const _: () = assert!(SPILL_CAP >= 2);

/// The scope stacks' counters, process-wide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScopeStats {
    /// Heap bytes every live thread's spill holds now (24 per entry of capacity; a spill
    /// keeps its capacity until its thread exits, at most 96 KiB).
    pub(crate) spill_bytes: u64,
    /// The most scopes one thread's spill held at once since the process started (at most
    /// [`SPILL_CAP`]).
    pub(crate) spilled_max: u64,
    /// The cap on one thread's spill, [`SPILL_CAP`].
    pub(crate) spill_cap: u64,
    /// Oldest spilled scopes dropped to record an enter past the cap (each as if it had
    /// exited out of order; almost always a leaked enter).
    pub(crate) evicted: u64,
    /// Enters not recorded at all (their scope does not set the thread's context): the
    /// spill was borrowed (a re-entrant call) or already destroyed (in a thread-local
    /// destructor).
    pub(crate) refused: u64,
}

static SPILL_BYTES: AtomicU64 = AtomicU64::new(0);
static SPILLED_MAX: AtomicU64 = AtomicU64::new(0);
static EVICTED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// The scope stacks' counters.
pub(crate) fn scope_stats() -> ScopeStats {
    ScopeStats {
        spill_bytes: SPILL_BYTES.load(Ordering::Relaxed),
        spilled_max: SPILLED_MAX.load(Ordering::Relaxed),
        spill_cap: SPILL_CAP as u64,
        evicted: EVICTED.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
    }
}

/// The owner of every [`SpanContextGuard`](super::SpanContextGuard)'s scope; layer owners
/// start at 1.
const GUARDS: u64 = 0;

/// Whose ids a scope's id is: each `ProfilingLayer` instance is one owner (and guards,
/// together, another).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Owner(u64);

impl Owner {
    /// An owner different from every other one made in this process, and from the guards'.
    pub(crate) fn unique() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The owner as a number (layers start at 1).
    #[inline]
    pub(crate) fn raw(self) -> u64 {
        self.0
    }

    /// The key of this owner's scope `id`.
    #[inline]
    pub(crate) fn key(self, id: u64) -> Key {
        Key { owner: self.0, id }
    }
}

/// What names one scope on the stack: (owner, id within the owner).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Key {
    owner: u64,
    id: u64,
}

#[derive(Clone, Copy)]
struct Entry {
    key: Key,
    previous: Option<Label>,
}

const EMPTY: Entry = Entry {
    key: Key {
        owner: GUARDS,
        id: 0,
    },
    previous: None,
};

/// One thread's scope stack (in `PerThread`): entries below [`INLINE`] here, deeper ones
/// in [`SPILL`]. Only its own thread touches it.
pub(crate) struct Stack {
    len: Cell<usize>,
    /// The next guard's id on this thread (0 is left for the empty entry's key).
    next_guard: Cell<u64>,
    inline: [Slot; INLINE],
}

/// One inline entry, a `Cell` per word: an entry is written as three 8-byte stores and
/// read as three loads (a whole-`Entry` cell is built on the stack and copied with a
/// 16-byte load of two 8-byte stores, a store-forwarding stall of ~12 cycles per push).
struct Slot {
    owner: Cell<u64>,
    id: Cell<u64>,
    previous: Cell<u64>,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            owner: Cell::new(GUARDS),
            id: Cell::new(0),
            previous: Cell::new(0),
        }
    }

    #[inline]
    fn get(&self) -> Entry {
        Entry {
            key: Key {
                owner: self.owner.get(),
                id: self.id.get(),
            },
            previous: Label::from_raw(self.previous.get()),
        }
    }

    #[inline]
    fn set(&self, entry: Entry) {
        self.owner.set(entry.key.owner);
        self.id.set(entry.key.id);
        self.previous.set(crate::label::word_of(entry.previous));
    }
}

/// One thread's entries past [`INLINE`], oldest first, at most [`SPILL_CAP`].
struct Spill {
    entries: VecDeque<Entry>,
}

impl Spill {
    fn get(&self, i: usize) -> Option<Entry> {
        self.entries.get(i).copied()
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Entry> {
        self.entries.get_mut(i)
    }

    /// Pushes `entry`; true if that dropped the oldest entry to stay under the cap.
    fn push(&mut self, entry: Entry) -> bool {
        if self.entries.len() >= SPILL_CAP {
            // As an out-of-order exit of the oldest: the one above it inherits what it
            // found (`SPILL_CAP >= 2`, so there is one above).
            if let Some(oldest) = self.entries.pop_front() {
                if let Some(next) = self.entries.front_mut() {
                    next.previous = oldest.previous;
                }
            }
            self.entries.push_back(entry);
            EVICTED.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let capacity = self.entries.capacity();
        self.entries.push_back(entry);
        // Counted when the capacity grows (a few times per thread), not per entry: no
        // shared write on every spilled enter.
        if self.entries.capacity() != capacity {
            let grown = self.entries.capacity().saturating_sub(capacity) * ENTRY_BYTES;
            SPILL_BYTES.fetch_add(grown as u64, Ordering::Relaxed);
        }
        let len = self.entries.len() as u64;
        if len > SPILLED_MAX.load(Ordering::Relaxed) {
            SPILLED_MAX.fetch_max(len, Ordering::Relaxed);
        }
        false
    }

    fn pop(&mut self) {
        self.entries.pop_back();
    }

    #[cfg(test)]
    fn clear(&mut self) {
        self.entries.clear();
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        let bytes = self.entries.capacity() * ENTRY_BYTES;
        SPILL_BYTES.fetch_sub(bytes as u64, Ordering::Relaxed);
    }
}

const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();

thread_local! {
    static SPILL: RefCell<Spill> = const {
        RefCell::new(Spill { entries: VecDeque::new() })
    };
}

impl Stack {
    pub(crate) const fn new() -> Stack {
        Stack {
            len: Cell::new(0),
            next_guard: Cell::new(1),
            inline: [const { Slot::new() }; INLINE],
        }
    }

    fn get(&self, i: usize) -> Entry {
        if i < INLINE {
            self.inline[i].get()
        } else {
            SPILL
                .try_with(|s| s.try_borrow().ok()?.get(i - INLINE))
                .ok()
                .flatten()
                .unwrap_or(EMPTY)
        }
    }

    fn set(&self, i: usize, entry: Entry) {
        if i < INLINE {
            self.inline[i].set(entry);
        } else {
            let _ = SPILL.try_with(|s| {
                if let Some(slot) = s
                    .try_borrow_mut()
                    .ok()
                    .as_mut()
                    .and_then(|s| s.get_mut(i - INLINE))
                {
                    *slot = entry;
                }
            });
        }
    }

    /// Records that `key` was entered while `previous` was the thread's context; false if
    /// nothing was recorded: deeper than [`INLINE`] and the spill is borrowed (a
    /// re-entrant call) or already destroyed (in a thread-local destructor). At the
    /// spill's cap the oldest spilled entry makes room.
    #[cfg(test)]
    fn push(&self, key: Key, previous: Option<Label>) -> bool {
        self.push_inline(key, previous) || self.push_spilled(key, previous)
    }

    /// [`Stack::push`] when the stack is shallower than [`INLINE`] (the usual case);
    /// false, having recorded nothing, when it is not.
    #[inline(always)]
    fn push_inline(&self, key: Key, previous: Option<Label>) -> bool {
        let len = self.len.get();
        let Some(slot) = self.inline.get(len) else {
            return false;
        };
        slot.owner.set(key.owner);
        slot.id.set(key.id);
        slot.previous.set(crate::label::word_of(previous));
        self.len.set(len + 1);
        true
    }

    /// [`Stack::push`] on a stack [`INLINE`] deep or more.
    fn push_spilled(&self, key: Key, previous: Option<Label>) -> bool {
        match spill_push(Entry { key, previous }) {
            None => {
                REFUSED.fetch_add(1, Ordering::Relaxed);
                false
            }
            // One in, the oldest out: as deep as before.
            Some(true) => true,
            Some(false) => {
                self.len.set(self.len.get() + 1);
                true
            }
        }
    }

    /// What exiting `key` leaves: `Some(context to restore)` when it was the innermost
    /// scope, `None` when it exited out of order (or was never seen), in which case the
    /// scope entered after it takes over restoring its `previous` and nothing changes now.
    #[cfg(test)]
    fn pop(&self, key: Key) -> Option<Option<Label>> {
        self.pop_top(key).or_else(|| self.pop_slow(key))
    }

    /// [`Stack::pop`] when `key` is the innermost scope and inline (the usual case);
    /// `None`, having changed nothing, otherwise.
    #[inline(always)]
    fn pop_top(&self, key: Key) -> Option<Option<Label>> {
        let len = self.len.get();
        if !(1..=INLINE).contains(&len) {
            return None;
        }
        let top = &self.inline[len - 1];
        if top.owner.get() != key.owner || top.id.get() != key.id {
            return None;
        }
        self.len.set(len - 1);
        Some(Label::from_raw(top.previous.get()))
    }

    /// [`Stack::pop`] past [`Stack::pop_top`]: out of order, spilled, or never entered.
    fn pop_slow(&self, key: Key) -> Option<Option<Label>> {
        let len = self.len.get();
        let pos = (0..len).rev().find(|&i| self.get(i).key == key)?;
        let removed = self.get(pos);
        let restore = if pos + 1 == len {
            Some(removed.previous)
        } else {
            // Splice: shift later entries down; the one just above inherits `previous`.
            let mut above = self.get(pos + 1);
            above.previous = removed.previous;
            self.set(pos, above);
            for i in pos + 1..len - 1 {
                let next = self.get(i + 1);
                self.set(i, next);
            }
            None
        };
        if len > INLINE {
            let _ = SPILL.try_with(|s| s.try_borrow_mut().map(|mut s| s.pop()));
        }
        self.len.set(len - 1);
        restore
    }
}

impl Stack {
    /// Forgets every scope (tests that leave guards behind on purpose).
    #[cfg(test)]
    pub(crate) fn clear_for_test(&self) {
        self.len.set(0);
        let _ = SPILL.try_with(|s| s.borrow_mut().clear());
    }
}

/// Pushes `entry` on the spill: whether that dropped its oldest entry (see [`SPILL_CAP`]),
/// `None` if it is borrowed or destroyed.
#[cold]
#[inline(never)]
fn spill_push(entry: Entry) -> Option<bool> {
    SPILL
        .try_with(|s| s.try_borrow_mut().ok().map(|mut s| s.push(entry)))
        .ok()
        .flatten()
}

/// Makes `root` the calling thread's context as the scope `key`, to be ended by
/// [`exit`]`(key)` on this thread.
#[inline]
pub(crate) fn enter(key: Key, root: Option<Label>) {
    super::with_thread(|t| enter_on(t, key, root));
}

/// The whole enter. Every branch off the usual path (a stack [`INLINE`] deep) ends in a
/// call that finishes the enter itself, so the usual path keeps nothing across a call and
/// needs no saved register: its one call, the switch, is its last instruction.
#[inline(always)]
fn enter_on(t: &super::PerThread, key: Key, root: Option<Label>) {
    let previous = t.cell.own_word();
    if !t.scopes.push_inline(key, previous) {
        return enter_spilled(t, key, root);
    }
    // The raw words: one compare, where `Option<Label>`'s `!=` compiles to a test of each
    // side and a compare.
    if word_of(previous) != word_of(root) {
        t.cell.switch(previous, root);
    }
}

/// [`enter_on`] on a stack [`INLINE`] deep or more.
#[cold]
#[inline(never)]
fn enter_spilled(t: &super::PerThread, key: Key, root: Option<Label>) {
    let previous = t.cell.own_word();
    // Not recorded: no exit will restore it, so the context stays as it was.
    if t.scopes.push_spilled(key, previous) && previous != root {
        t.cell.switch(previous, root);
    }
}

/// Enters a new guard's scope (a key no other guard on the thread has: guards are `!Send`,
/// so they end on this thread) and returns its key. One TLS access.
#[inline]
pub(crate) fn enter_guard(root: Option<Label>) -> Key {
    super::with_thread(|t| {
        let id = t.scopes.next_guard.get();
        t.scopes.next_guard.set(id + 1);
        let key = Key { owner: GUARDS, id };
        enter_on(t, key, root);
        key
    })
}

/// Ends the scope `key` on the calling thread: restores the context from before it if it
/// is the innermost scope, otherwise hands that context to the scope entered after it.
#[inline]
pub(crate) fn exit(key: Key) {
    super::with_thread(|t| match t.scopes.pop_top(key) {
        Some(previous) => restore(t, previous),
        // As in `enter_on`: the other cases finish in a call of their own.
        None => exit_slow(t, key),
    });
}

/// Makes `previous` the thread's context again, the scope above it having ended.
#[inline(always)]
fn restore(t: &super::PerThread, previous: Option<Label>) {
    let current = t.cell.own_word();
    if word_of(current) != word_of(previous) {
        t.cell.switch(current, previous);
    }
}

/// [`exit`] of a scope that is not the innermost inline one.
#[cold]
#[inline(never)]
fn exit_slow(t: &super::PerThread, key: Key) {
    if let Some(previous) = t.scopes.pop_slow(key) {
        restore(t, previous);
    }
}

/// [`Stack::push`] on the calling thread's stack (tests).
#[cfg(test)]
fn push(key: Key, previous: Option<Label>) -> bool {
    super::THREAD.with(|t| t.scopes.push(key, previous))
}

/// [`Stack::pop`] on the calling thread's stack (tests).
#[cfg(test)]
fn pop(key: Key) -> Option<Option<Label>> {
    super::THREAD.with(|t| t.scopes.pop(key))
}

/// The calling thread's scopes, inline and spilled (tests).
#[cfg(test)]
fn depth() -> usize {
    super::THREAD.with(|t| t.scopes.len.get())
}

/// The calling thread's spilled scopes and the spill's capacity (tests).
#[cfg(test)]
fn spill_len_and_capacity() -> (usize, usize) {
    SPILL.with(|s| {
        let s = s.borrow();
        (s.entries.len(), s.entries.capacity())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalRoot;

    fn key(span: u64) -> Key {
        Key { owner: 7, id: span }
    }

    /// A distinct word per `n` (the stack only compares words).
    fn root(n: u32) -> Option<Label> {
        Label::from_raw(u64::from(n) * 2 + 1)
    }

    /// Deep nesting crosses into the spill region and out-of-order exits splice correctly
    /// on both sides of the boundary.
    #[test]
    fn deep_stack_with_out_of_order_exits() {
        let depth = INLINE as u64 + 10;
        for span in 1..=depth {
            push(key(span), root(span as u32 - 1));
        }
        // Out of order deep in the spill region and in the inline region.
        assert_eq!(pop(key(INLINE as u64 + 3)), None);
        assert_eq!(pop(key(5)), None);
        // Innermost pops restore what each found, skipping the removed ones.
        for span in (1..=depth).rev() {
            if span == INLINE as u64 + 3 || span == 5 {
                continue;
            }
            let expected = if span == INLINE as u64 + 4 || span == 6 {
                root(span as u32 - 2)
            } else {
                root(span as u32 - 1)
            };
            assert_eq!(pop(key(span)), Some(expected), "span {span}");
        }
        assert_eq!(pop(key(1)), None, "empty");
    }

    /// The same id under two owners names two scopes: exiting one never takes the other's
    /// entry.
    #[test]
    fn same_id_under_two_owners_is_two_scopes() {
        let (a, b) = (Owner::unique(), Owner::unique());
        assert_ne!(a, b);
        push(a.key(1), None);
        push(b.key(1), root(1));
        assert_eq!(pop(a.key(1)), None, "a's scope is not the innermost");
        assert_eq!(pop(b.key(1)), Some(None), "b inherited what a found");
        assert_eq!(pop(a.key(1)), None, "empty");
    }

    /// Guards entered and dropped, deeper than the inline depth, by a thread-local's
    /// destructor that runs after the spill `Vec`'s own was destroyed (thread-local
    /// destructors run in reverse order of first use): no panic, which would abort the
    /// process there, and the thread ends with no context.
    #[test]
    fn deep_scopes_in_a_late_thread_local_destructor() {
        use opentelemetry::trace::{SpanId, TraceId};
        use std::sync::atomic::AtomicU8;
        // No names: interning uses a thread-local of its own, gone by then too.
        fn root(n: u32) -> LocalRoot {
            let id = SpanId::from(u64::from(n) + 1);
            LocalRoot::new(id, TraceId::from(1), None)
        }
        // 0: destructor did not run; 1: ran and left no context; 2: left one.
        static OUTCOME: AtomicU8 = AtomicU8::new(0);
        struct EndsLate;
        impl Drop for EndsLate {
            fn drop(&mut self) {
                let roots: Vec<_> = (0..INLINE as u32 + 4).map(root).collect();
                let guards: Vec<_> = roots
                    .iter()
                    .map(|root| crate::SpanContextGuard::enter(Some(root)))
                    .collect();
                // Front to back: every drop but the last is out of order.
                drop(guards);
                let left = crate::current_local_root().is_some();
                OUTCOME.store(1 + u8::from(left), Ordering::SeqCst);
            }
        }
        thread_local! {
            static LATE: EndsLate = const { EndsLate };
        }
        let refused = scope_stats().refused;
        std::thread::spawn(|| {
            // First used first: destroyed after the spill, which is first used below.
            LATE.with(|_| {});
            let roots: Vec<_> = (0..INLINE as u32 + 1).map(root).collect();
            let guards: Vec<_> = roots
                .iter()
                .map(|root| crate::SpanContextGuard::enter(Some(root)))
                .collect();
            drop(guards);
        })
        .join()
        .expect("thread");
        assert_eq!(OUTCOME.load(Ordering::SeqCst), 1);
        // The four past the inline entries could not be recorded (no spill any more).
        assert!(scope_stats().refused - refused >= 4, "{:?}", scope_stats());
    }

    /// Tests that fill a spill take turns: the count of dropped entries is process-wide.
    fn cap_turn() -> std::sync::MutexGuard<'static, ()> {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        TURN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An enter past the spill's cap drops the oldest spilled entry as an out-of-order
    /// exit would: the entry above it inherits the context it found, the others keep
    /// theirs, and the dropped one's exit finds nothing.
    #[test]
    fn an_enter_past_the_cap_drops_the_oldest_spilled_entry() {
        let _turn = cap_turn();
        std::thread::spawn(|| {
            let full = (INLINE + SPILL_CAP) as u64;
            for span in 1..=full + 1 {
                assert!(push(key(span), root(span as u32 - 1)));
            }
            assert_eq!(depth(), INLINE + SPILL_CAP);
            let oldest = INLINE as u64 + 1;
            for span in (1..=full + 1).rev() {
                let found = match span {
                    s if s == oldest => continue,
                    // What the dropped one found.
                    s if s == oldest + 1 => root(oldest as u32 - 1),
                    s => root(s as u32 - 1),
                };
                assert_eq!(pop(key(span)), Some(found), "span {span}");
            }
            assert_eq!(depth(), 0);
            assert_eq!(pop(key(oldest)), None, "dropped");
        })
        .join()
        .expect("thread");
    }

    /// Issue 42 (audit U3): 100,000 guards given to `mem::forget` on one thread leave its
    /// spill at the cap (96 KiB; before, 100,001 entries in 3 MiB, measured), the oldest
    /// entries dropped and counted; the scopes entered after them still label the thread
    /// and restore what they found, in order and out of order; and the exit of a live
    /// scope whose entry was dropped pops no other scope, not even one with its key (a
    /// `tracing` span entered again inside itself).
    #[test]
    fn forgotten_guards_keep_the_spill_at_its_cap_and_later_scopes_label() {
        use crate::{current_local_root, SpanContextGuard};
        use opentelemetry::trace::{SpanId, TraceId};
        const LEAKS: usize = 100_000;
        const FULL: usize = INLINE + SPILL_CAP;
        let _turn = cap_turn();
        let before = scope_stats();
        std::thread::spawn(move || {
            let root = |n: u64| LocalRoot::new(SpanId::from(n), TraceId::from(3), None);
            let (a, b, c, d) = (root(1), root(2), root(3), root(4));
            let leaked = |i: usize| if i.is_multiple_of(2) { &a } else { &b };
            let evicted = || scope_stats().evicted - before.evicted;
            for i in 0..INLINE {
                std::mem::forget(SpanContextGuard::enter(Some(leaked(i))));
            }
            // A layer's span, live, at the bottom of the spill: the first entry dropped.
            let span = Owner::unique().key(9);
            enter(span, c.word());
            for i in 0..LEAKS {
                std::mem::forget(SpanContextGuard::enter(Some(leaked(i))));
            }
            let (spilled, capacity) = spill_len_and_capacity();
            assert_eq!(spilled, SPILL_CAP);
            assert!(capacity <= SPILL_CAP, "{capacity}");
            // Other tests' threads spill a few hundred bytes meanwhile, at most.
            let held = i128::from(scope_stats().spill_bytes) - i128::from(before.spill_bytes);
            let ours = (capacity * ENTRY_BYTES) as i128;
            assert!(
                (held - ours).abs() < 4096,
                "{held} bytes counted for a spill of {ours}"
            );
            assert_eq!(depth(), FULL);
            let dropped = (1 + LEAKS - SPILL_CAP) as u64;
            assert_eq!(evicted(), dropped);
            let last = Some(leaked(LEAKS - 1).label());
            assert_eq!(current_local_root(), last);

            // The span entered again inside itself: recorded (one more old entry dropped),
            // and its exit pops that entry.
            enter(span, d.word());
            assert_eq!(current_local_root(), Some(d.label()));
            assert_eq!(evicted(), dropped + 1);
            exit(span);
            assert_eq!(current_local_root(), last);
            assert_eq!(depth(), FULL - 1);
            // The outer one's entry is gone: its exit changes nothing and pops nothing.
            exit(span);
            assert_eq!(current_local_root(), last);
            assert_eq!(depth(), FULL - 1);

            // In order, reaching the cap again (the inner enter drops one more).
            {
                let _c = SpanContextGuard::enter(Some(&c));
                assert_eq!(current_local_root(), Some(c.label()));
                {
                    let _d = SpanContextGuard::enter(Some(&d));
                    assert_eq!(current_local_root(), Some(d.label()));
                    assert_eq!(evicted(), dropped + 2);
                }
                assert_eq!(current_local_root(), Some(c.label()));
            }
            assert_eq!(current_local_root(), last);
            // Out of order, from two below the cap.
            assert_eq!(depth(), FULL - 2);
            let gc = SpanContextGuard::enter(Some(&c));
            let gd = SpanContextGuard::enter(Some(&d));
            drop(gc);
            assert_eq!(current_local_root(), Some(d.label()));
            drop(gd);
            assert_eq!(current_local_root(), last);
            // Two below the cap again: no entry dropped.
            assert_eq!(depth(), FULL - 2);
            assert_eq!(evicted(), dropped + 2);
            super::super::forget_scopes_for_test();
        })
        .join()
        .expect("thread");
        let after = scope_stats();
        assert_eq!(after.spilled_max, SPILL_CAP as u64);
        // The spill's heap is given back with its thread.
        assert!(
            after.spill_bytes < 4 * 1024,
            "{} bytes held after the thread exited",
            after.spill_bytes
        );
    }
}
