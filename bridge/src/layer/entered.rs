//! The per-thread stack of entered spans, each with the context that was current before
//! it. Kept in a fixed array in a `const` thread-local with no destructor, so a push or a
//! pop is a plain TLS access; nesting deeper than [`INLINE`] spills into a `Vec`.

use std::cell::RefCell;

use crate::span_context::LocalRoot;

/// Entered spans kept without allocation; deeper nesting is rare and spills to the heap.
const INLINE: usize = 32;

#[derive(Clone, Copy)]
struct Entry {
    span: u64,
    previous: Option<LocalRoot>,
}

const EMPTY: Entry = Entry {
    span: 0,
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

/// Records that `span` was entered while `previous` was the thread's context.
#[inline]
pub(super) fn push(span: u64, previous: Option<LocalRoot>) {
    STACK.with(|stack| {
        let Ok(mut stack) = stack.try_borrow_mut() else {
            return;
        };
        let entry = Entry { span, previous };
        if stack.len < INLINE {
            let len = stack.len;
            stack.inline[len] = entry;
        } else {
            SPILL.with(|s| s.borrow_mut().push(entry));
        }
        stack.len += 1;
    });
}

/// What exiting `span` leaves: `Some(context to restore)` when it was the innermost entered
/// span, `None` when it exited out of order (or was never seen), in which case the span
/// entered after it takes over restoring its `previous` and nothing changes now.
#[inline]
pub(super) fn pop(span: u64) -> Option<Option<LocalRoot>> {
    STACK.with(|stack| {
        let mut stack = stack.try_borrow_mut().ok()?;
        let len = stack.len;
        // Fast path: the innermost span exits, all inline (the usual case).
        if (1..=INLINE).contains(&len) && stack.inline[len - 1].span == span {
            stack.len = len - 1;
            return Some(stack.inline[len - 1].previous);
        }
        let pos = (0..len).rev().find(|&i| stack.get(i).span == span)?;
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
