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
//! The stack is a fixed array in a `const` thread-local with no destructor, so an enter or
//! an exit is a plain TLS access with no allocation; nesting deeper than [`INLINE`] spills
//! into a `Vec` (the one thread-local here with a destructor, so it is reached with
//! `try_with`: thread-local destructors may enter and exit scopes after it is gone).
//! Borrows are `try_borrow_mut`. An enter that cannot be recorded changes nothing.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};

use super::LocalRoot;

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

impl Key {
    /// A key for a new guard's scope, different from every other guard's on this thread
    /// (a per-thread count; guards are `!Send`, so they end on this thread).
    #[inline]
    pub(crate) fn next_guard() -> Key {
        thread_local! {
            // 0 is left for the empty entry's key.
            static NEXT_GUARD: Cell<u64> = const { Cell::new(1) };
        }
        let id = NEXT_GUARD.with(|next| {
            let id = next.get();
            next.set(id + 1);
            id
        });
        Key { owner: GUARDS, id }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    key: Key,
    previous: Option<LocalRoot>,
}

const EMPTY: Entry = Entry {
    key: Key {
        owner: GUARDS,
        id: 0,
    },
    previous: None,
};

struct Stack {
    len: usize,
    inline: [Entry; INLINE],
}

thread_local! {
    static STACK: RefCell<Stack> = const { RefCell::new(Stack { len: 0, inline: [EMPTY; INLINE] }) };
    static SPILL: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

impl Stack {
    fn get(&self, i: usize) -> Entry {
        if i < INLINE {
            self.inline[i]
        } else {
            SPILL
                .try_with(|s| s.borrow().get(i - INLINE).copied())
                .ok()
                .flatten()
                .unwrap_or(EMPTY)
        }
    }

    fn set(&mut self, i: usize, entry: Entry) {
        if i < INLINE {
            self.inline[i] = entry;
        } else {
            let _ = SPILL.try_with(|s| {
                if let Some(slot) = s.borrow_mut().get_mut(i - INLINE) {
                    *slot = entry;
                }
            });
        }
    }
}

/// Makes `root` the calling thread's context as the scope `key`, to be ended by
/// [`exit`]`(key)` on this thread.
#[inline]
pub(crate) fn enter(key: Key, root: Option<LocalRoot>) {
    let previous = super::replace(root);
    if !push(key, previous) {
        // Not recorded, so no exit will restore it: leave the context as it was.
        super::replace(previous);
    }
}

/// Ends the scope `key` on the calling thread: restores the context from before it if it
/// is the innermost scope, otherwise hands that context to the scope entered after it.
#[inline]
pub(crate) fn exit(key: Key) {
    if let Some(previous) = pop(key) {
        super::replace(previous);
    }
}

/// Records that `key` was entered while `previous` was the thread's context; false if
/// nothing was recorded: the stack was borrowed (a re-entrant call), or it is deeper than
/// [`INLINE`] and the spill was already destroyed (in a thread-local destructor).
#[inline]
fn push(key: Key, previous: Option<LocalRoot>) -> bool {
    STACK.with(|stack| {
        let Ok(mut stack) = stack.try_borrow_mut() else {
            return false;
        };
        let entry = Entry { key, previous };
        if stack.len < INLINE {
            let len = stack.len;
            stack.inline[len] = entry;
        } else if SPILL.try_with(|s| s.borrow_mut().push(entry)).is_err() {
            // The spill is destroyed: this thread is exiting. Not recorded.
            return false;
        }
        stack.len += 1;
        true
    })
}

/// What exiting `key` leaves: `Some(context to restore)` when it was the innermost scope,
/// `None` when it exited out of order (or was never seen), in which case the scope
/// entered after it takes over restoring its `previous` and nothing changes now.
#[inline]
fn pop(key: Key) -> Option<Option<LocalRoot>> {
    STACK.with(|stack| {
        let mut stack = stack.try_borrow_mut().ok()?;
        let len = stack.len;
        // Fast path: the innermost scope exits, all inline (the usual case).
        if (1..=INLINE).contains(&len) && stack.inline[len - 1].key == key {
            stack.len = len - 1;
            return Some(stack.inline[len - 1].previous);
        }
        let pos = (0..len).rev().find(|&i| stack.get(i).key == key)?;
        let removed = stack.get(pos);
        let restore = if pos + 1 == len {
            Some(removed.previous)
        } else {
            // Splice: shift later entries down; the one just above inherits `previous`.
            let mut above = stack.get(pos + 1);
            above.previous = removed.previous;
            stack.set(pos, above);
            for i in pos + 1..len - 1 {
                let next = stack.get(i + 1);
                stack.set(i, next);
            }
            None
        };
        if len > INLINE {
            let _ = SPILL.try_with(|s| s.borrow_mut().pop());
        }
        stack.len = len - 1;
        restore
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span_name::SpanName;

    fn key(span: u64) -> Key {
        Key { owner: 7, id: span }
    }

    fn root(n: u32) -> Option<LocalRoot> {
        Some(LocalRoot::name_only(SpanName::intern(&format!(
            "entered-test/{n}"
        ))))
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
        fn root(n: u32) -> Option<LocalRoot> {
            let id = SpanId::from(u64::from(n) + 1);
            Some(LocalRoot::new(id, TraceId::from(1), None))
        }
        // 0: destructor did not run; 1: ran and left no context; 2: left one.
        static OUTCOME: AtomicU8 = AtomicU8::new(0);
        struct EndsLate;
        impl Drop for EndsLate {
            fn drop(&mut self) {
                let guards: Vec<_> = (0..INLINE as u32 + 4)
                    .map(|n| crate::SpanContextGuard::enter(root(n)))
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
            let guards: Vec<_> = (0..INLINE as u32 + 1)
                .map(|n| crate::SpanContextGuard::enter(root(n)))
                .collect();
            drop(guards);
        })
        .join()
        .expect("thread");
        assert_eq!(OUTCOME.load(Ordering::SeqCst), 1);
    }
}
