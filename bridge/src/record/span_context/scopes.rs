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
//! bytes). Nesting deeper than [`INLINE`] spills into a `Vec` (the one thread-local here
//! with a destructor, so it is reached with `try_with`: thread-local destructors may enter
//! and exit scopes after it is gone, and borrowed with `try_borrow_mut`). An enter that
//! cannot be recorded changes nothing.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::label::{word_of, Label};

/// Entries kept without allocation; deeper nesting is rare and spills to the heap.
const INLINE: usize = 32;

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

thread_local! {
    static SPILL: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
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
                .try_with(|s| s.try_borrow().ok()?.get(i - INLINE).copied())
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
    /// re-entrant call) or already destroyed (in a thread-local destructor).
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
        if !spill_push(Entry { key, previous }) {
            return false;
        }
        self.len.set(self.len.get() + 1);
        true
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

/// Pushes `entry` on the spill; false if it is borrowed or destroyed.
#[cold]
#[inline(never)]
fn spill_push(entry: Entry) -> bool {
    SPILL
        .try_with(|s| s.try_borrow_mut().map(|mut s| s.push(entry)).is_ok())
        .unwrap_or(false)
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
    }
}
