//! The per-thread stack of scopes that set the thread's span context, innermost last, each
//! with the context that was current before it. Kept in a fixed array in a `const`
//! thread-local with no destructor, so an enter or an exit is a plain TLS access; nesting
//! deeper than [`INLINE`] spills into a `Vec`.
//!
//! [`enter`] makes a scope's context current and pushes (its key, the context it replaced);
//! [`exit`] removes the topmost entry with that key. When that entry is the innermost, its
//! `previous` is written back. When it is not (exits in non-LIFO order), nothing changes
//! now and the entry just above inherits its `previous`, so a scope ending never clears
//! the context of one still running above it.
//!
//! A scope's [`Key`] is its owner and an id unique within that owner. A `tracing` span id
//! is only unique within its subscriber (it is a slab index, and two subscribers' first
//! spans get the same one), so each `ProfilingLayer` is its own [`Owner`].

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::LocalRoot;

/// Entries kept without allocation; deeper nesting is rare and spills to the heap.
const INLINE: usize = 32;

/// Whose ids a scope's id is: each `ProfilingLayer` instance is one owner.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Owner(u64);

impl Owner {
    /// An owner different from every other one made in this process. Never 0, the owner
    /// of no scope (the empty entry's).
    pub(crate) fn unique() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
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
    previous: Option<LocalRoot>,
}

const EMPTY: Entry = Entry {
    key: Key { owner: 0, id: 0 },
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
            SPILL.with(|s| s.borrow().get(i - INLINE).copied().unwrap_or(EMPTY))
        }
    }

    fn set(&mut self, i: usize, entry: Entry) {
        if i < INLINE {
            self.inline[i] = entry;
        } else {
            SPILL.with(|s| {
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
    push(key, super::replace(root));
}

/// Ends the scope `key` on the calling thread: restores the context from before it if it
/// is the innermost scope, otherwise hands that context to the scope entered after it.
#[inline]
pub(crate) fn exit(key: Key) {
    if let Some(previous) = pop(key) {
        super::replace(previous);
    }
}

/// Records that `key` was entered while `previous` was the thread's context.
#[inline]
fn push(key: Key, previous: Option<LocalRoot>) {
    STACK.with(|stack| {
        let Ok(mut stack) = stack.try_borrow_mut() else {
            return;
        };
        let entry = Entry { key, previous };
        if stack.len < INLINE {
            let len = stack.len;
            stack.inline[len] = entry;
        } else {
            SPILL.with(|s| s.borrow_mut().push(entry));
        }
        stack.len += 1;
    });
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
            SPILL.with(|s| s.borrow_mut().pop());
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
}
