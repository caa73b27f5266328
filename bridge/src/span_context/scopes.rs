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

use std::cell::RefCell;

use super::LocalRoot;

/// Entries kept without allocation; deeper nesting is rare and spills to the heap.
const INLINE: usize = 32;

#[derive(Clone, Copy)]
struct Entry {
    key: u64,
    previous: Option<LocalRoot>,
}

const EMPTY: Entry = Entry {
    key: 0,
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
pub(crate) fn enter(key: u64, root: Option<LocalRoot>) {
    push(key, super::replace(root));
}

/// Ends the scope `key` on the calling thread: restores the context from before it if it
/// is the innermost scope, otherwise hands that context to the scope entered after it.
#[inline]
pub(crate) fn exit(key: u64) {
    if let Some(previous) = pop(key) {
        super::replace(previous);
    }
}

/// Records that `key` was entered while `previous` was the thread's context.
#[inline]
fn push(key: u64, previous: Option<LocalRoot>) {
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
fn pop(key: u64) -> Option<Option<LocalRoot>> {
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
            push(span, root(span as u32 - 1));
        }
        // Out of order deep in the spill region and in the inline region.
        assert_eq!(pop(INLINE as u64 + 3), None);
        assert_eq!(pop(5), None);
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
            assert_eq!(pop(span), Some(expected), "span {span}");
        }
        assert_eq!(pop(1), None, "empty");
    }
}
