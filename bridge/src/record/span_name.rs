//! Interned root-span names.
//!
//! The per-thread span context must be writable with a handful of stores, so it holds a
//! small integer instead of a string. Names are interned once per distinct name: each
//! thread keeps a cache, and only a miss in that cache takes the process-wide interner
//! lock (once per name per thread, never per context switch). While a thread exits, a
//! destructor of another thread-local may intern after that thread's cache was destroyed;
//! then every call takes the lock instead.

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
            .try_with(|cache| cache.borrow().get(name).copied())
            .ok()
            .flatten();
        if let Some(id) = cached {
            return id;
        }
        let id = global_intern(name);
        // Err: the cache is gone (see above); the next call asks the global table again.
        let _ = LOCAL_CACHE.try_with(|cache| {
            // The local cache only ever holds names the global table has, so it is bounded
            // by the same limit.
            cache.borrow_mut().insert(Box::from(name), id);
        });
        id
    }

    /// [`SpanName::intern`] for names that live for the whole program (a `tracing`
    /// callsite's name): a per-thread cache keyed by the text's address answers without
    /// hashing the text. Two `'static` texts at the same address and length are the same
    /// text, so a hit is always right.
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
        let id = SpanName::intern(name);
        let _ = STATIC_CACHE.try_with(|cache| cache[index].set((key.0, key.1, id.to_raw())));
        id
    }

    /// The interned text.
    pub fn resolve(self) -> Arc<str> {
        let table = interner();
        table
            .names
            .get(self.index())
            .cloned()
            .unwrap_or_else(|| Arc::from(Self::OVERFLOW_NAME))
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

/// How many names were folded into [`SpanName::OVERFLOW_NAME`] because the table was full.
pub fn span_names_overflowed() -> u64 {
    OVERFLOWED.load(Ordering::Relaxed)
}

#[derive(Default)]
struct Interner {
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, SpanName>,
    overflow: Option<SpanName>,
}

/// Held across `fork` by the forking thread (`crate::fork`): a parent thread interning at
/// the fork would otherwise leave the child's interner locked for ever.
static INTERNER: OnceLock<AtforkMutex<Interner>> = OnceLock::new();

fn interner() -> MutexGuard<'static, Interner> {
    // Before the interner exists, never inside its initialisation (see `evidence::shards`).
    crate::fork::install_handlers();
    interner_lock().lock()
}

fn interner_lock() -> &'static AtforkMutex<Interner> {
    INTERNER.get_or_init(|| AtforkMutex::new(Interner::default()))
}

/// Before `fork`: the forking thread takes the interner (see `crate::fork`).
pub(crate) fn hold_for_fork() {
    interner_lock().hold();
}

/// After `fork`, in the parent and in the child.
pub(crate) fn release_after_fork() {
    interner_lock().release();
}
static OVERFLOWED: AtomicU64 = AtomicU64::new(0);

/// Entries of the per-thread cache of `'static` names (a few hundred bytes a thread).
const STATIC_CACHE_SLOTS: usize = 64;

thread_local! {
    // (address, length, raw id) of `'static` names; `const`, no destructor: usable from
    // any hook, even during thread teardown. Address 0 never matches a real name.
    static STATIC_CACHE: [std::cell::Cell<(usize, usize, u32)>; STATIC_CACHE_SLOTS] =
        const { [const { std::cell::Cell::new((0, 0, 0)) }; STATIC_CACHE_SLOTS] };
    static LOCAL_CACHE: RefCell<HashMap<Box<str>, SpanName>> = RefCell::new(HashMap::new());
}

fn global_intern(name: &str) -> SpanName {
    let mut table = interner();
    if let Some(id) = table.ids.get(name) {
        return *id;
    }
    if table.names.len() >= MAX_SPAN_NAMES {
        OVERFLOWED.fetch_add(1, Ordering::Relaxed);
        if let Some(id) = table.overflow {
            return id;
        }
        let id = push(&mut table, SpanName::OVERFLOW_NAME);
        table.overflow = Some(id);
        return id;
    }
    push(&mut table, name)
}

fn push(table: &mut Interner, name: &str) -> SpanName {
    let text: Arc<str> = Arc::from(name);
    table.names.push(text.clone());
    let raw = u32::try_from(table.names.len()).unwrap_or(u32::MAX);
    let id = SpanName(NonZeroU32::new(raw).unwrap_or(NonZeroU32::MIN));
    crate::thread_ctx::register_name(id.to_raw(), name);
    table.ids.insert(text, id);
    id
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

    #[test]
    fn raw_round_trip() {
        let a = SpanName::intern("span-name-test/raw");
        assert_eq!(SpanName::from_raw(a.to_raw()), Some(a));
        assert_eq!(SpanName::from_raw(0), None);
    }
}
