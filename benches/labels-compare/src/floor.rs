//! The least a switch must do to keep what `SpanContextGuard` keeps, written here apart
//! from the crate so that the guard can be measured against it.
//!
//! A pointer swap keeps the previous value in its caller: it is right only for scopes that
//! end in reverse order, and publishes nothing another thread can check. The guard must
//! also be right when scopes end in any order (futures joined on one thread, a guard
//! dropped while a `tracing` span entered after it still runs) and publish the thread's
//! word under a sequence number, so that the blocked-thread watchdog can tell "still in the
//! same poll" from another thread. The least that does both, with nothing else:
//!
//! * a per-thread stack of (key, previous word) entries: an enter pushes one, an exit of
//!   the innermost restores its previous word, an exit of one below hands its previous
//!   word to the entry above (a splice, off the usual path). A key is (owner, id): span
//!   ids are unique only within one `tracing` subscriber, so two subscribers' layers (and
//!   guards, a third owner) need the owner to tell their scopes apart;
//! * the word written between two stores of a sequence number (odd while it changes),
//!   with the fences a reader on another thread needs.
//!
//! No spill past the fixed depth (an enter past it records nothing, as the guard's does
//! when its spill is unavailable), no CPU counters, no OTEP record, no
//! hooks: what the guard adds on top of this floor is what those cost on its usual path.
//! `SEQUENCE = false` leaves the sequence out, to show what it costs.

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicU64, Ordering};

const DEPTH: usize = 32;

struct Entry {
    owner: Cell<u64>,
    id: Cell<u64>,
    previous: Cell<u64>,
}

struct Thread {
    seq: AtomicU64,
    word: AtomicU64,
    len: Cell<usize>,
    next: Cell<u64>,
    entries: [Entry; DEPTH],
}

thread_local! {
    static THREAD: Thread = const {
        Thread {
            seq: AtomicU64::new(0),
            word: AtomicU64::new(0),
            len: Cell::new(0),
            next: Cell::new(1),
            entries: [const { Entry { owner: Cell::new(0), id: Cell::new(0), previous: Cell::new(0) } }; DEPTH],
        }
    };
}

/// A scope of the floor, ended by [`exit`]: (owner, id within the owner).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Key(u64, u64);

/// The owner of the floor's guard-like scopes (a layer would be another).
const GUARDS: u64 = 0;

impl Entry {
    fn key(&self) -> Key {
        Key(self.owner.get(), self.id.get())
    }
}

impl Thread {
    #[inline(always)]
    fn publish<const SEQUENCE: bool>(&self, word: u64) {
        if SEQUENCE {
            let seq = self.seq.load(Ordering::Relaxed);
            self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
            fence(Ordering::Release);
            self.word.store(word, Ordering::Relaxed);
            self.seq.store(seq.wrapping_add(2), Ordering::Release);
        } else {
            self.word.store(word, Ordering::Relaxed);
        }
    }
}

/// Makes `word` the thread's word until [`exit`] of the returned key.
#[inline(always)]
pub fn enter<const SEQUENCE: bool>(word: u64) -> Key {
    THREAD.with(|t| {
        let id = t.next.get();
        t.next.set(id + 1);
        let previous = t.word.load(Ordering::Relaxed);
        let len = t.len.get();
        let Some(entry) = t.entries.get(len) else {
            // Not recorded: no exit will restore it, so the word stays as it was.
            return Key(GUARDS, id);
        };
        entry.owner.set(GUARDS);
        entry.id.set(id);
        entry.previous.set(previous);
        t.len.set(len + 1);
        if previous != word {
            t.publish::<SEQUENCE>(word);
        }
        Key(GUARDS, id)
    })
}

/// Ends the scope `key`: restores the word from before it if it is the innermost scope,
/// otherwise hands that word to the scope entered after it.
#[inline(always)]
pub fn exit<const SEQUENCE: bool>(key: Key) {
    THREAD.with(|t| {
        let len = t.len.get();
        let top = len.wrapping_sub(1);
        match t.entries.get(top) {
            Some(entry) if entry.owner.get() == key.0 && entry.id.get() == key.1 => {
                t.len.set(top);
                let previous = entry.previous.get();
                if t.word.load(Ordering::Relaxed) != previous {
                    t.publish::<SEQUENCE>(previous);
                }
            }
            _ => splice(t, key),
        }
    })
}

/// [`exit`] of a scope below the innermost (or never recorded).
#[cold]
#[inline(never)]
fn splice(t: &Thread, key: Key) {
    let len = t.len.get();
    let Some(pos) = (0..len).rev().find(|&i| t.entries[i].key() == key) else {
        return;
    };
    // `pos` is below the top (the top was checked): the entry above inherits `previous`.
    t.entries[pos + 1]
        .previous
        .set(t.entries[pos].previous.get());
    for i in pos..len - 1 {
        t.entries[i].owner.set(t.entries[i + 1].owner.get());
        t.entries[i].id.set(t.entries[i + 1].id.get());
        t.entries[i].previous.set(t.entries[i + 1].previous.get());
    }
    t.len.set(len - 1);
}

/// The calling thread's word.
pub fn current() -> u64 {
    THREAD.with(|t| t.word.load(Ordering::Relaxed))
}

/// Checks, before anything is measured, that the floor is right where a pointer swap is
/// not: scopes ended in any order leave the word of the innermost live one, and the
/// sequence moves by two per change. Panics otherwise (a floor that is wrong measures
/// nothing).
pub fn check() {
    let before = THREAD.with(|t| t.seq.load(Ordering::Relaxed));
    let a = enter::<true>(1);
    let b = enter::<true>(2);
    let c = enter::<true>(3);
    assert_eq!(current(), 3);
    exit::<true>(a); // below two live scopes: nothing changes now
    assert_eq!(current(), 3);
    exit::<true>(c); // innermost: back to b's
    assert_eq!(current(), 2);
    exit::<true>(b); // b inherited a's previous
    assert_eq!(current(), 0);
    assert_eq!(
        THREAD.with(|t| t.seq.load(Ordering::Relaxed)) - before,
        2 * 5
    );
    let d = enter::<false>(4);
    let e = enter::<false>(4);
    exit::<false>(d);
    assert_eq!(current(), 4, "e still runs");
    exit::<false>(e);
    assert_eq!(current(), 0);
}
