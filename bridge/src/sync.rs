//! The atomics, fences, cells and spin hints of the signal path's protocols, from one
//! place, so that a `--cfg loom` build runs the very same code under the loom model
//! checker (see `docs/signal-path.md`, "Proof").
//!
//! A normal build gets `std`'s items, re-exported as they are: nothing changes there but
//! the path they are imported from. [`UnsafeCell`] is the one exception, a transparent
//! wrapper of `std`'s with loom's closure-based access (`with`, `with_mut`), so that loom
//! can see every access to a record slot.
//!
//! Under `cfg(loom)` the atomics are loom's, each with a switch a model may turn on to
//! weaken all of its orderings to `Relaxed`, and [`fence`] can be switched off for a
//! closure ([`without_fences`]): the models' broken variants, which must fail. loom's
//! atomics have no `const` constructor, so the few `const fn`s that build them are plain
//! `fn`s there ([`const_fn!`](crate::sync::const_fn)) and the statics holding them are
//! built on first use ([`lazy_static_value!`](crate::sync::lazy_static_value)); a model
//! never touches those statics (loom objects live for one execution): it builds the
//! protocol's value itself.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::{hint::spin_loop, thread::yield_now};

#[cfg(loom)]
pub(crate) use loom::{hint::spin_loop, thread::yield_now};
#[cfg(all(loom, test))]
pub(crate) use model::without_fences;
#[cfg(loom)]
pub(crate) use model::{
    fence, AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// `std::cell::UnsafeCell` with loom's access API: every access is a closure given the
/// raw pointer, so that under loom each one is checked against the others.
#[cfg(not(loom))]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a pointer for reading.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a pointer for writing.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// Starts loading the cache line at `ptr` into L1, so that a miss overlaps the work done
/// before the line is used. A hint only: it reads nothing the program sees and never
/// faults, whatever the address (a dangling or unmapped one included), so it needs no
/// validity from the caller. Nothing on targets other than x86-64 (aarch64's `prfm`
/// intrinsic is not stable yet).
#[inline(always)]
pub(crate) fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86-64 baseline, and `prefetcht0` neither reads for the
    // program nor faults on any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// A `const fn` in a normal build, a plain `fn` under loom (whose atomics have no `const`
/// constructor).
macro_rules! const_fn {
    ($(#[$attr:meta])* $vis:vis fn $($rest:tt)*) => {
        #[cfg(not(loom))]
        $(#[$attr])*
        $vis const fn $($rest)*
        #[cfg(loom)]
        $(#[$attr])*
        $vis fn $($rest)*
    };
}
pub(crate) use const_fn;

/// A `static` with a `const` initialiser in a normal build; under loom, built on first use
/// (never by a model: see the module docs).
macro_rules! lazy_static_value {
    ($(#[$attr:meta])* $vis:vis static $name:ident: $ty:ty = $init:expr;) => {
        #[cfg(not(loom))]
        $(#[$attr])*
        $vis static $name: $ty = $init;
        #[cfg(loom)]
        $(#[$attr])*
        $vis static $name: std::sync::LazyLock<$ty> = std::sync::LazyLock::new(|| $init);
    };
}
pub(crate) use lazy_static_value;

#[cfg(loom)]
// Every method a shimmed type may call, whether or not the build at hand calls it.
#[allow(dead_code)]
mod model {
    use std::cell::Cell;

    pub(crate) use std::sync::atomic::Ordering;

    thread_local! {
        // loom runs a model's threads on the OS thread that called it, so this is one
        // test's switch.
        static NO_FENCES: Cell<bool> = const { Cell::new(false) };
    }

    /// loom's fence, or nothing inside [`without_fences`].
    #[track_caller]
    pub(crate) fn fence(order: Ordering) {
        if !NO_FENCES.with(Cell::get) {
            loom::sync::atomic::fence(order);
        }
    }

    /// Runs `f` (a model) with every [`fence`] of the shimmed code left out: a broken
    /// variant of the protocols whose correctness rests on their fences.
    #[cfg(test)]
    pub(crate) fn without_fences<R>(f: impl FnOnce() -> R) -> R {
        struct Restore;
        impl Drop for Restore {
            fn drop(&mut self) {
                NO_FENCES.with(|off| off.set(false));
            }
        }
        NO_FENCES.with(|off| off.set(true));
        let _restore = Restore;
        f()
    }

    /// What loom's scheduler needs to see every race on an atomic.
    ///
    /// loom's partial-order reduction remembers one last access per atomic, and a load
    /// never races a load: when thread A loads, then thread B loads and stores, B's store is
    /// compared with B's own load only, and the order "B's store, then A's load" is never
    /// tried. (A ring's consumer loading `head` before the producer's load and store of it
    /// is exactly that: loom never let the consumer see a record.) So every operation on a
    /// shimmed atomic first stores to a companion atomic that nothing loads: all accesses
    /// to the atomic race there, each interleaving is tried, and as nothing reads the
    /// companion it orders nothing (a relaxed store synchronises with no one).
    #[derive(Debug, Default)]
    struct Dpor(loom::sync::atomic::AtomicBool);

    impl Dpor {
        #[track_caller]
        fn new() -> Dpor {
            Dpor(loom::sync::atomic::AtomicBool::new(false))
        }

        #[track_caller]
        fn access(&self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Whether an atomic's stores run as swaps (off unless a model turns it on).
    ///
    /// loom 0.7.3 does not keep a plain store out of the span of a read-modify-write of
    /// the same atomic by another thread (tokio-rs/loom#254): when the RMW runs first and
    /// the store's thread has not seen its value, loom may place the store between the
    /// RMW's read and its write in modification order, and a later load of the store's
    /// thread may then return the RMW's value over its own store, which no execution of
    /// the real program can (an RMW's write follows its read at once in modification
    /// order, so the store comes after both). A `swap` in place of the store reads the
    /// newest value first, so loom orders it after the RMW. The swap is stronger than the
    /// store in one way only: it continues the release sequence of the store it reads, so
    /// an acquire load of its value also synchronises with that store's thread. A model
    /// that turns this on says why its property does not rest on that edge.
    #[derive(Debug, Default)]
    struct Stores(std::sync::atomic::AtomicBool);

    /// The common methods of loom's atomics, each ordering weakened to `Relaxed` once the
    /// instance's `relaxed` switch is on.
    macro_rules! forward {
        ($value:ty) => {
            #[track_caller]
            fn order(&self, order: Ordering) -> Ordering {
                self.dpor.access();
                if self.relaxed.load(Ordering::Relaxed) {
                    Ordering::Relaxed
                } else {
                    order
                }
            }

            /// `order` without an access (the failure ordering of a compare-exchange).
            fn weakened(&self, order: Ordering) -> Ordering {
                if self.relaxed.load(Ordering::Relaxed) {
                    Ordering::Relaxed
                } else {
                    order
                }
            }

            /// A model's broken variant: every later operation on this atomic is `Relaxed`.
            #[cfg(test)]
            pub(crate) fn relax_for_model(&self) {
                self.relaxed.store(true, Ordering::Relaxed);
            }

            /// Every later store to this atomic is run as a `swap` with the store's
            /// ordering: the workaround for loom's false report when a plain store races a
            /// read-modify-write of the same atomic (see [`Stores`]).
            #[cfg(test)]
            pub(crate) fn stores_as_swaps_for_model(&self) {
                self.stores.0.store(true, Ordering::Relaxed);
            }

            #[track_caller]
            pub(crate) fn load(&self, order: Ordering) -> $value {
                self.inner.load(self.order(order))
            }

            #[track_caller]
            pub(crate) fn store(&self, value: $value, order: Ordering) {
                let order = self.order(order);
                if self.stores.0.load(Ordering::Relaxed) {
                    self.inner.swap(value, order);
                } else {
                    self.inner.store(value, order)
                }
            }

            #[track_caller]
            pub(crate) fn swap(&self, value: $value, order: Ordering) -> $value {
                self.inner.swap(value, self.order(order))
            }

            #[track_caller]
            pub(crate) fn compare_exchange(
                &self,
                current: $value,
                new: $value,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$value, $value> {
                let (success, failure) = (self.order(success), self.weakened(failure));
                self.inner.compare_exchange(current, new, success, failure)
            }

            #[track_caller]
            pub(crate) fn compare_exchange_weak(
                &self,
                current: $value,
                new: $value,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$value, $value> {
                let (success, failure) = (self.order(success), self.weakened(failure));
                self.inner
                    .compare_exchange_weak(current, new, success, failure)
            }
        };
    }

    macro_rules! atomic_int {
        ($($name:ident: $int:ty),* $(,)?) => {$(
            /// loom's atomic of the same name, with a switch for broken variants.
            #[derive(Debug, Default)]
            pub(crate) struct $name {
                inner: loom::sync::atomic::$name,
                relaxed: std::sync::atomic::AtomicBool,
                stores: Stores,
                dpor: Dpor,
            }

            impl $name {
                #[track_caller]
                pub(crate) fn new(value: $int) -> $name {
                    $name {
                        inner: loom::sync::atomic::$name::new(value),
                        relaxed: std::sync::atomic::AtomicBool::new(false),
                        stores: Stores::default(),
                        dpor: Dpor::new(),
                    }
                }

                forward!($int);

                #[track_caller]
                pub(crate) fn fetch_add(&self, value: $int, order: Ordering) -> $int {
                    self.inner.fetch_add(value, self.order(order))
                }

                #[track_caller]
                pub(crate) fn fetch_sub(&self, value: $int, order: Ordering) -> $int {
                    self.inner.fetch_sub(value, self.order(order))
                }

                #[track_caller]
                pub(crate) fn fetch_or(&self, value: $int, order: Ordering) -> $int {
                    self.inner.fetch_or(value, self.order(order))
                }
            }
        )*};
    }

    atomic_int!(
        AtomicU8: u8,
        AtomicI32: i32,
        AtomicU32: u32,
        AtomicU64: u64,
        AtomicUsize: usize,
    );

    /// loom's `AtomicBool`, with a switch for broken variants.
    #[derive(Debug, Default)]
    pub(crate) struct AtomicBool {
        inner: loom::sync::atomic::AtomicBool,
        relaxed: std::sync::atomic::AtomicBool,
        stores: Stores,
        dpor: Dpor,
    }

    impl AtomicBool {
        #[track_caller]
        pub(crate) fn new(value: bool) -> AtomicBool {
            AtomicBool {
                inner: loom::sync::atomic::AtomicBool::new(value),
                relaxed: std::sync::atomic::AtomicBool::new(false),
                stores: Stores::default(),
                dpor: Dpor::new(),
            }
        }

        forward!(bool);
    }

    /// loom's `AtomicPtr`, with a switch for broken variants.
    #[derive(Debug)]
    pub(crate) struct AtomicPtr<T> {
        inner: loom::sync::atomic::AtomicPtr<T>,
        relaxed: std::sync::atomic::AtomicBool,
        stores: Stores,
        dpor: Dpor,
    }

    impl<T> AtomicPtr<T> {
        #[track_caller]
        pub(crate) fn new(value: *mut T) -> AtomicPtr<T> {
            AtomicPtr {
                inner: loom::sync::atomic::AtomicPtr::new(value),
                relaxed: std::sync::atomic::AtomicBool::new(false),
                stores: Stores::default(),
                dpor: Dpor::new(),
            }
        }

        forward!(*mut T);
    }
}

/// Runs the model `f` under loom, exploring every interleaving with at most `preemptions`
/// preemptions (`LOOM_MAX_PREEMPTIONS` overrides it), and prints its run time.
#[cfg(all(loom, test))]
pub(crate) fn check(name: &str, preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    let preemptions = *builder.preemption_bound.get_or_insert(preemptions);
    let started = std::time::Instant::now();
    builder.check(f);
    eprintln!(
        "loom model {name}: {:.2?} (at most {preemptions} preemptions)",
        started.elapsed()
    );
}
