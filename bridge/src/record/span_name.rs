//! Interned root-span names.
//!
//! The per-thread span context must be writable with a handful of stores, so it holds a
//! small integer instead of a string. Names are interned once per distinct name in a
//! process-wide table of at most [`MAX_SPAN_NAMES`]; past it every new name is folded
//! into [`SpanName::OVERFLOW_NAME`].
//!
//! Every structure here is bounded (issue 42), and [`stats`] reports each one's size and
//! drops:
//!
//! * The table grows under a lock (an [`AtforkMutex`]) until it is full, and is then
//!   moved, once, into a [`OnceLock`] it is never changed in again: a full table is read
//!   without any lock, so roots with new names (folded) do not queue on a mutex.
//! * Each thread caches the names it interned, so a hit takes no lock (once per name per
//!   thread, never per context switch). The cache holds only names the table has, shares
//!   their text with it (an `Arc`, no copy), and keeps at most [`LOCAL_CACHE_CAP`] of
//!   them: at the cap it is emptied and fills again. A folded name is never cached: a
//!   stream of ids in span names costs no memory per name on any thread.
//! * `'static` names (callsite names) have a second, fixed-size cache keyed by address.
//!
//! While a thread exits, a destructor of another thread-local may intern after that
//! thread's cache was destroyed; then every call asks the table instead.

use std::cell::RefCell;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};

use crate::fork::AtforkMutex;

/// Most distinct root-span names kept. Root span names are normally endpoints (a bounded
/// set); past this bound new names share [`SpanName::OVERFLOW_NAME`] so that a service
/// that puts ids in span names cannot grow memory or label cardinality without bound.
pub const MAX_SPAN_NAMES: usize = 4096;

/// Most names one thread's cache holds (about 25 KiB at the cap: the text is the
/// table's). A thread that cycles through more names than this pays a table lookup per
/// miss, never memory: lock-free once the table is full, and a table that is not full has
/// fewer than [`MAX_SPAN_NAMES`] names in all.
pub(crate) const LOCAL_CACHE_CAP: usize = 512;

/// A handle to an interned root-span name.
///
/// Cheap to copy and compare; [`SpanName::resolve`] gives the text back.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanName(NonZeroU32);

impl SpanName {
    /// The text shared by every name interned after [`MAX_SPAN_NAMES`] was reached.
    pub const OVERFLOW_NAME: &'static str = "<other>";

    /// Interns `name` and returns its handle.
    ///
    /// ```
    /// use otel_profiling::SpanName;
    /// let a = SpanName::intern("GET /report");
    /// assert_eq!(a, SpanName::intern("GET /report"));
    /// assert_eq!(&*a.resolve(), "GET /report");
    /// ```
    pub fn intern(name: &str) -> SpanName {
        // `try_with`, not `with`: this may run from another thread-local's destructor
        // after `LOCAL_CACHE` was destroyed (a span closed while a thread exits), where
        // `with` panics and a panic in a TLS destructor aborts the process. Without the
        // cache the global interner gives the same handle, only with its lock taken.
        let cached = LOCAL_CACHE
            .try_with(|cache| cache.borrow().get(name))
            .ok()
            .flatten();
        if let Some(id) = cached {
            return id;
        }
        let (id, text) = global_intern(name);
        // None: folded into `<other>`, never cached (it would hold the text per thread).
        if let Some(text) = text {
            // Err: the cache is gone (see above); the next call asks the table again.
            let _ = LOCAL_CACHE.try_with(|cache| cache.borrow_mut().insert(text, id));
        }
        id
    }

    /// [`SpanName::intern`] for names that live for the whole program (a `tracing`
    /// callsite's name): a per-thread cache keyed by the text's address answers without
    /// hashing the text. Two `'static` texts at the same address and length are the same
    /// text, so a hit is always right. It is direct-mapped ([`STATIC_CACHE_SLOTS`]
    /// entries, a new name replaces the one in its slot): fixed size, it never grows.
    #[inline]
    pub(crate) fn intern_static(name: &'static str) -> SpanName {
        let key = (name.as_ptr() as usize, name.len());
        // Callsite names are at least byte-aligned and usually far apart: fold the address.
        let index = (key.0 ^ (key.0 >> 7)) % STATIC_CACHE_SLOTS;
        let hit = STATIC_CACHE
            .try_with(|cache| {
                let (ptr, len, raw) = cache[index].get();
                ((ptr, len) == key)
                    .then(|| SpanName::from_raw(raw))
                    .flatten()
            })
            .ok()
            .flatten();
        if let Some(id) = hit {
            return id;
        }
        // A folded name may be cached here: the table never changes once full, and the
        // callsites' names are as many as the program has.
        let id = SpanName::intern(name);
        let _ = STATIC_CACHE.try_with(|cache| cache[index].set((key.0, key.1, id.to_raw())));
        id
    }

    /// The interned text.
    pub fn resolve(self) -> Arc<str> {
        let text = match table() {
            Table::Full(full) => full.names.get(self.index()).cloned(),
            Table::Growing(table) => table.names.get(self.index()).cloned(),
        };
        text.unwrap_or_else(|| Arc::from(Self::OVERFLOW_NAME))
    }

    /// The raw value stored in the per-thread context (never 0).
    pub(crate) fn to_raw(self) -> u32 {
        self.0.get()
    }

    /// Rebuilds a handle from [`SpanName::to_raw`]; 0 means "no name".
    pub(crate) fn from_raw(raw: u32) -> Option<SpanName> {
        NonZeroU32::new(raw).map(SpanName)
    }

    fn index(self) -> usize {
        (self.0.get() - 1) as usize
    }
}

impl std::fmt::Debug for SpanName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SpanName").field(&self.resolve()).finish()
    }
}

/// How many times a name was folded into [`SpanName::OVERFLOW_NAME`] because the table
/// was full (each call that got it, by any thread, counts: a folded name is not cached).
pub fn span_names_overflowed() -> u64 {
    OVERFLOWED.load(Ordering::Relaxed)
}

/// Sizes and drops of the span-name structures (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpanNameStats {
    /// Distinct names in the process-wide table, at most [`MAX_SPAN_NAMES`]
    /// ([`SpanName::OVERFLOW_NAME`] not counted).
    pub(crate) interned: u64,
    /// The table is full: it never changes again, and every new name is folded.
    pub(crate) full: bool,
    /// Interns answered with [`SpanName::OVERFLOW_NAME`] because the table was full (the
    /// same as [`span_names_overflowed`]).
    pub(crate) overflowed: u64,
    /// Names in the caches of all live threads together (each at most
    /// [`LOCAL_CACHE_CAP`]; the text is the table's, shared).
    pub(crate) cached: u64,
    /// Cache entries dropped because their thread's cache reached [`LOCAL_CACHE_CAP`].
    pub(crate) cache_evictions: u64,
}

/// The span-name structures' sizes and drops now (relaxed loads, no lock).
pub(crate) fn stats() -> SpanNameStats {
    SpanNameStats {
        interned: INTERNED.load(Ordering::Relaxed),
        full: FULL.get().is_some(),
        overflowed: OVERFLOWED.load(Ordering::Relaxed),
        cached: CACHED.load(Ordering::Relaxed),
        cache_evictions: CACHE_EVICTIONS.load(Ordering::Relaxed),
    }
}

/// The table while it grows, behind [`INTERNER`]; emptied into [`FULL`] once full.
#[derive(Default)]
struct Interner {
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, SpanName>,
}

/// The table once it is full: never changed again, read without a lock.
struct Full {
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, SpanName>,
    overflow: SpanName,
}

/// Held across `fork` by the forking thread (`crate::fork`): a parent thread interning at
/// the fork would otherwise leave the child's interner locked for ever.
static INTERNER: OnceLock<AtforkMutex<Interner>> = OnceLock::new();

/// Set once, by the thread that fills the table, under [`INTERNER`]'s lock: a fork never
/// finds it half set (the forking thread holds that lock), and its readers need no lock
/// (`OnceLock::get` is an acquire load, after which the table is immutable).
static FULL: OnceLock<Full> = OnceLock::new();

fn interner() -> MutexGuard<'static, Interner> {
    // Before the interner exists, never inside its initialisation (see `evidence::shards`).
    crate::fork::install_handlers();
    interner_lock().lock()
}

fn interner_lock() -> &'static AtforkMutex<Interner> {
    INTERNER.get_or_init(|| AtforkMutex::new(Interner::default()))
}

/// The table as it is now: full (no lock), or growing (locked).
enum Table {
    Full(&'static Full),
    Growing(MutexGuard<'static, Interner>),
}

fn table() -> Table {
    if let Some(full) = FULL.get() {
        return Table::Full(full);
    }
    let table = interner();
    // Asked again under the lock: another thread may have filled (and emptied) the table
    // while this one waited.
    match FULL.get() {
        Some(full) => Table::Full(full),
        None => Table::Growing(table),
    }
}

/// Before `fork`: the forking thread takes the interner (see `crate::fork`).
pub(crate) fn hold_for_fork() {
    interner_lock().hold();
}

/// After `fork`, in the parent and in the child.
pub(crate) fn release_after_fork() {
    interner_lock().release();
}

/// Names in the table (its size, for [`stats`]).
static INTERNED: AtomicU64 = AtomicU64::new(0);
/// Names folded into `<other>` (its drops).
static OVERFLOWED: AtomicU64 = AtomicU64::new(0);
/// Entries of all live threads' caches.
static CACHED: AtomicU64 = AtomicU64::new(0);
/// Entries the thread caches dropped at their cap.
static CACHE_EVICTIONS: AtomicU64 = AtomicU64::new(0);

/// Entries of the per-thread cache of `'static` names (a few hundred bytes a thread).
const STATIC_CACHE_SLOTS: usize = 64;

/// One thread's cache of interned names: the table's own text, at most
/// [`LOCAL_CACHE_CAP`] entries.
#[derive(Default)]
struct LocalCache {
    ids: HashMap<Arc<str>, SpanName>,
}

impl LocalCache {
    #[inline]
    fn get(&self, name: &str) -> Option<SpanName> {
        self.ids.get(name).copied()
    }

    /// Caches `text` (the table's copy) as `id`; at the cap, empties the cache first.
    fn insert(&mut self, text: Arc<str>, id: SpanName) {
        if self.ids.len() >= LOCAL_CACHE_CAP {
            // Emptied whole, not one entry at a time: no order to keep on the hit path,
            // and a thread's usual names are back after one miss each.
            let dropped = self.ids.len() as u64;
            self.ids.clear();
            CACHED.fetch_sub(dropped, Ordering::Relaxed);
            CACHE_EVICTIONS.fetch_add(dropped, Ordering::Relaxed);
        }
        if self.ids.insert(text, id).is_none() {
            CACHED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for LocalCache {
    fn drop(&mut self) {
        CACHED.fetch_sub(self.ids.len() as u64, Ordering::Relaxed);
    }
}

thread_local! {
    // (address, length, raw id) of `'static` names; `const`, no destructor: usable from
    // any hook, even during thread teardown. Address 0 never matches a real name.
    static STATIC_CACHE: [std::cell::Cell<(usize, usize, u32)>; STATIC_CACHE_SLOTS] =
        const { [const { std::cell::Cell::new((0, 0, 0)) }; STATIC_CACHE_SLOTS] };
    static LOCAL_CACHE: RefCell<LocalCache> = RefCell::new(LocalCache::default());
}

/// The handle of `name`, and the table's copy of its text to cache (`None` when it was
/// folded into `<other>`).
fn global_intern(name: &str) -> (SpanName, Option<Arc<str>>) {
    let mut table = match table() {
        Table::Full(full) => return full.intern(name),
        Table::Growing(table) => table,
    };
    if let Some((text, id)) = table.ids.get_key_value(name) {
        return (*id, Some(text.clone()));
    }
    let (id, text) = push(&mut table, name);
    INTERNED.fetch_add(1, Ordering::Relaxed);
    if table.names.len() >= MAX_SPAN_NAMES {
        freeze(&mut table);
    }
    (id, Some(text))
}

/// Moves the full table into [`FULL`], with the handle of `<other>` (the name's own if it
/// was interned as a name). Under the interner lock.
fn freeze(table: &mut Interner) {
    let overflow = match table.ids.get(SpanName::OVERFLOW_NAME) {
        Some(id) => *id,
        None => push(table, SpanName::OVERFLOW_NAME).0,
    };
    let Interner { names, ids } = std::mem::take(table);
    // Only this thread, holding the lock, ever sets it: it was empty.
    let _ = FULL.set(Full {
        names,
        ids,
        overflow,
    });
}

impl Full {
    fn intern(&self, name: &str) -> (SpanName, Option<Arc<str>>) {
        match self.ids.get_key_value(name) {
            Some((text, id)) => (*id, Some(text.clone())),
            None => {
                OVERFLOWED.fetch_add(1, Ordering::Relaxed);
                (self.overflow, None)
            }
        }
    }
}

fn push(table: &mut Interner, name: &str) -> (SpanName, Arc<str>) {
    let text: Arc<str> = Arc::from(name);
    table.names.push(text.clone());
    let raw = u32::try_from(table.names.len()).unwrap_or(u32::MAX);
    let id = SpanName(NonZeroU32::new(raw).unwrap_or(NonZeroU32::MIN));
    crate::thread_ctx::register_name(id.to_raw(), name);
    table.ids.insert(text.clone(), id);
    (id, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_same_handle_across_threads() {
        let a = SpanName::intern("span-name-test/a");
        let b = std::thread::spawn(|| SpanName::intern("span-name-test/a"))
            .join()
            .expect("thread");
        assert_eq!(a, b);
        assert_ne!(a, SpanName::intern("span-name-test/b"));
        assert_eq!(&*a.resolve(), "span-name-test/a");
    }

    /// Interning from a thread-local's destructor that runs after `LOCAL_CACHE` was
    /// destroyed (TLS destructors run in reverse order of registration, so touching
    /// `GUARD` before the first `intern` makes it the later one to be destroyed) must
    /// not panic: a panic in a TLS destructor aborts the process.
    #[test]
    fn interning_from_a_later_thread_local_destructor() {
        use std::sync::mpsc;

        struct InternOnDrop(mpsc::Sender<SpanName>);
        impl Drop for InternOnDrop {
            fn drop(&mut self) {
                let _ = self
                    .0
                    .send(SpanName::intern("span-name-test/from-tls-drop"));
            }
        }
        thread_local! {
            static GUARD: RefCell<Option<InternOnDrop>> = const { RefCell::new(None) };
        }

        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            GUARD.with(|g| *g.borrow_mut() = Some(InternOnDrop(tx)));
            // Registers LOCAL_CACHE's destructor after GUARD's: it runs first.
            SpanName::intern("span-name-test/before-exit");
        })
        .join()
        .expect("thread");
        let id = rx.recv().expect("the destructor interned a name");
        assert_eq!(&*id.resolve(), "span-name-test/from-tls-drop");
        assert_eq!(id, SpanName::intern("span-name-test/from-tls-drop"));
    }

    #[test]
    fn static_names_intern_like_any_other() {
        static A: &str = "span-name-test/static-a";
        let a = SpanName::intern_static(A);
        assert_eq!(a, SpanName::intern("span-name-test/static-a"));
        assert_eq!(SpanName::intern_static(A), a, "cached");
        // The same text at another address, and a prefix at the same address.
        let b = SpanName::intern_static(&A[..14]);
        assert_eq!(&*b.resolve(), "span-name-test");
        assert_ne!(a, b);
        let leaked: &'static str = Box::leak(String::from(A).into_boxed_str());
        assert_eq!(SpanName::intern_static(leaked), a);
    }

    /// The names a thread's cache holds now.
    fn cached_here() -> usize {
        LOCAL_CACHE.with(|cache| cache.borrow().ids.len())
    }

    /// A thread's cache holds at most [`LOCAL_CACHE_CAP`] names, and a name it dropped
    /// still gets its handle (from the table).
    #[test]
    fn a_threads_cache_stops_at_its_cap() {
        std::thread::spawn(|| {
            let names: Vec<String> = (0..=LOCAL_CACHE_CAP)
                .map(|i| format!("span-name-test/cap/{i}"))
                .collect();
            let first = SpanName::intern(&names[0]);
            for name in &names[1..LOCAL_CACHE_CAP] {
                SpanName::intern(name);
            }
            assert_eq!(cached_here(), LOCAL_CACHE_CAP);
            let evictions = stats().cache_evictions;
            SpanName::intern(&names[LOCAL_CACHE_CAP]);
            assert_eq!(cached_here(), 1, "emptied at the cap");
            assert!(stats().cache_evictions >= evictions + LOCAL_CACHE_CAP as u64);
            assert_eq!(SpanName::intern(&names[0]), first, "from the table");
            assert_eq!(cached_here(), 2);
        })
        .join()
        .expect("thread");
    }

    /// Issue 42, in a child process (the table fills for good): once full, the table
    /// answers without its lock, a folded name is counted and never cached, and names
    /// from before still answer themselves.
    #[test]
    fn a_full_table_folds_names_uncached_and_without_its_lock() {
        let before = SpanName::intern("span-name-test/before-full");
        let code = crate::fork::run_in_child(std::time::Duration::from_secs(30), move || {
            let mut i = 0;
            while !stats().full {
                SpanName::intern(&format!("span-name-test/fill/{i}"));
                i += 1;
            }
            let full = stats();
            assert_eq!(full.interned, MAX_SPAN_NAMES as u64);
            // This thread interned thousands: its cache stopped at the cap.
            assert!(cached_here() <= LOCAL_CACHE_CAP);
            // Every path to the table from another thread while this one holds its lock:
            // a full table must not need it.
            let held = interner_lock().lock();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let cached = cached_here();
                let other = SpanName::intern("span-name-test/past-the-cap");
                let again = SpanName::intern("span-name-test/past-the-cap");
                let before_now = SpanName::intern("span-name-test/before-full");
                let newly_cached = cached_here() - cached;
                let _ = tx.send((other, again, newly_cached, before_now, other.resolve()));
            });
            let answer = rx.recv_timeout(std::time::Duration::from_secs(10));
            drop(held);
            let Ok((other, again, newly_cached, before_now, text)) = answer else {
                return 2; // the lock was taken
            };
            assert_eq!(&*text, SpanName::OVERFLOW_NAME);
            assert_eq!(other, again);
            assert_eq!(newly_cached, 1, "only the name from before the cap");
            assert_eq!(before_now, before);
            let after = stats();
            assert_eq!(after.overflowed, full.overflowed + 2, "each fold counts");
            assert_eq!(after.interned, full.interned, "a full table never grows");
            0
        });
        assert_eq!(
            code,
            Some(0),
            "2: the full table took its lock; 101: a check failed"
        );
    }

    #[test]
    fn raw_round_trip() {
        let a = SpanName::intern("span-name-test/raw");
        assert_eq!(SpanName::from_raw(a.to_raw()), Some(a));
        assert_eq!(SpanName::from_raw(0), None);
    }
}
