//! What `fork` does to this crate's state: one set of `pthread_atfork` handlers for every
//! process-wide lock a child could otherwise inherit held, and the rule that a thread
//! handle belongs to the process that started the thread. The whole inventory (each lock,
//! thread and file descriptor, and how a child gets it) is in `docs/signal-path.md`.
//!
//! A child has only the forking thread. A `std::sync::Mutex` another parent thread held
//! at the fork stays locked forever in the child, so each process-wide lock the span
//! hooks, processors or setup take is an [`AtforkMutex`]: the forking thread takes it
//! before the fork (prepare) and lets go of it after, in the parent and in the child,
//! whose copy is then unlocked and consistent. They are leaf locks (nothing of ours is
//! locked while one is held), so taking them in one fixed order cannot deadlock. The
//! sampler's own locks are `ForkSafeLock`s, reset in the child instead.

use std::cell::UnsafeCell;
use std::mem::ManuallyDrop;
use std::sync::{Mutex, MutexGuard, Once, PoisonError};

static HANDLERS: Once = Once::new();

/// Registers the crate's fork handlers (once per process; every owner of an
/// [`AtforkMutex`] calls it before its lock can be taken).
pub(crate) fn install_handlers() {
    HANDLERS.call_once(|| {
        // SAFETY: three `extern "C" fn()` valid for the program's life. They take and
        // release our locks and store to atomics; nothing else.
        unsafe { libc::pthread_atfork(Some(prepare), Some(in_parent), Some(in_child)) };
    });
}

/// Before `fork`, on the forking thread: every lock a child may need, in one order.
extern "C" fn prepare() {
    crate::evidence::hold_for_fork();
    crate::span_name::hold_for_fork();
    crate::thread_ctx::hold_for_fork();
    crate::sampler::before_fork();
}

/// After `fork`, in the parent: the same locks, released in the reverse order.
extern "C" fn in_parent() {
    crate::sampler::after_fork_in_parent();
    crate::thread_ctx::release_after_fork();
    crate::span_name::release_after_fork();
    crate::evidence::release_after_fork();
}

/// After `fork`, in the child (one thread, the forking one): the sampler forgets the
/// parent's threads, then the locks are released.
extern "C" fn in_child() {
    crate::sampler::after_fork_in_child();
    crate::allocations::after_fork_in_child();
    crate::thread_ctx::after_fork_in_child();
    crate::span_context::own_clocks::after_fork_in_child();
    crate::thread_ctx::release_after_fork();
    crate::span_name::release_after_fork();
    crate::evidence::release_after_fork();
}

/// A process-wide mutex that the thread calling `fork` holds across it (see the module
/// docs), so no child inherits it locked by a thread that does not exist there.
pub(crate) struct AtforkMutex<T: 'static> {
    lock: Mutex<T>,
    /// The guard of the forking thread, from prepare until the parent or child handler.
    held: UnsafeCell<Option<MutexGuard<'static, T>>>,
}

// SAFETY: `held` is only touched by `hold` and `release`, by the thread that holds `lock`
// (`hold` writes it after locking; `release` takes it out before the unlock): the lock
// itself serialises them, even when two threads fork at once. The guard is only dropped
// by the thread that took it (the forking thread; the child's copy of it).
unsafe impl<T: Send> Sync for AtforkMutex<T> {}
// SAFETY: `held` is `Some` only while borrowed for `'static` (`hold` takes `&'static
// self`), when the value cannot be moved; otherwise it is a `Mutex<T>` and a `None`.
unsafe impl<T: Send> Send for AtforkMutex<T> {}

impl<T> AtforkMutex<T> {
    pub(crate) const fn new(value: T) -> AtforkMutex<T> {
        AtforkMutex {
            lock: Mutex::new(value),
            held: UnsafeCell::new(None),
        }
    }

    /// Locks (a poisoned lock is taken as is: its data are kept consistent without
    /// unwinding).
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks if no one holds the lock now (a poisoned lock is taken as is), never
    /// waiting: for a thread that already holds another such lock.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.lock.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// In the prepare handler: takes the lock and keeps it until [`Self::release`].
    pub(crate) fn hold(&'static self) {
        let guard = self.lock();
        // SAFETY: we hold `lock` (see the `Sync` impl).
        unsafe { *self.held.get() = Some(guard) };
    }

    /// In the parent and child handlers: lets go of the lock [`Self::hold`] took.
    pub(crate) fn release(&'static self) {
        // SAFETY: only after `hold` on this thread (the handlers run in pairs), which
        // still holds `lock`.
        let guard = unsafe { (*self.held.get()).take() };
        drop(guard);
    }
}

/// A value that belongs to the process that made it: a thread handle, the channel to
/// that thread, a queue it drains. A forked child inherits a copy, but not the thread
/// behind it: there the value is never used and never dropped (dropping a `JoinHandle`
/// detaches a `pthread_t` that may by then name one of the child's own threads; joining
/// waits for a thread that does not exist; a channel's or queue's lock may be held by it).
pub(crate) struct ProcessBound<T> {
    value: ManuallyDrop<T>,
    pid: u32,
}

impl<T> ProcessBound<T> {
    pub(crate) fn new(value: T) -> ProcessBound<T> {
        ProcessBound {
            value: ManuallyDrop::new(value),
            pid: std::process::id(),
        }
    }

    /// Whether this is a forked child's inherited copy.
    pub(crate) fn is_inherited(&self) -> bool {
        self.pid != std::process::id()
    }

    /// The value, in the process that made it.
    pub(crate) fn get(&self) -> Option<&T> {
        (!self.is_inherited()).then_some(&*self.value)
    }

    /// The value, in the process that made it.
    pub(crate) fn get_mut(&mut self) -> Option<&mut T> {
        if self.is_inherited() {
            return None;
        }
        Some(&mut *self.value)
    }
}

impl<T> Drop for ProcessBound<T> {
    fn drop(&mut self) {
        if !self.is_inherited() {
            // SAFETY: dropped once, here; never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) };
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ProcessBound<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.get() {
            Some(value) => value.fmt(f),
            None => f.write_str("<inherited through fork>"),
        }
    }
}

#[cfg(test)]
/// Runs `child` in a forked child and returns its exit code (`None`: killed after
/// `limit`, it hung).
pub(crate) fn run_in_child(limit: std::time::Duration, child: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child runs `child` (fork-safe paths of this crate) and `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // A panic must not unwind into the test harness's copy of the thread (its
        // end would exit the child with status 0).
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: leaving the child without the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let deadline = std::time::Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: our own child.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A lock another thread holds at the fork is free and consistent in the child.
    /// Without the handlers (a plain `Mutex`) the child hangs on it.
    #[test]
    fn a_lock_held_by_another_thread_at_fork_is_free_in_the_child() {
        static LOCK: AtforkMutex<Vec<u32>> = AtforkMutex::new(Vec::new());
        static HELD: AtomicUsize = AtomicUsize::new(0);
        install_handlers();
        // A parent thread that takes the lock in a loop, keeping it for a while each time.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let holder = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut v = LOCK.lock();
                    v.push(1);
                    HELD.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    v.pop();
                }
            })
        };
        while HELD.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        // `hold`/`release` are what the registered handlers do for the crate's own
        // locks; here for this test's lock, around the fork.
        for _ in 0..20 {
            LOCK.hold();
            // SAFETY: the child only locks `LOCK` and `_exit`s.
            let pid = unsafe { libc::fork() };
            LOCK.release();
            assert!(pid >= 0);
            if pid == 0 {
                let ok = LOCK.lock().is_empty();
                // SAFETY: leaving the child.
                unsafe { libc::_exit(if ok { 0 } else { 2 }) };
            }
            let mut status = 0;
            // SAFETY: our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        }
        stop.store(true, Ordering::Relaxed);
        holder.join().expect("holder");
    }

    #[test]
    fn an_inherited_value_is_neither_used_nor_dropped_in_the_child() {
        struct CountsDrops(Arc<AtomicUsize>);
        impl Drop for CountsDrops {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let drops = Arc::new(AtomicUsize::new(0));
        let bound = ProcessBound::new(CountsDrops(drops.clone()));
        assert!(bound.get().is_some() && !bound.is_inherited());
        let code = run_in_child(std::time::Duration::from_secs(10), move || {
            let unusable = bound.get().is_none() && bound.is_inherited();
            drop(bound);
            // 0: unusable and not dropped.
            match (unusable, drops.load(Ordering::SeqCst)) {
                (true, 0) => 0,
                (false, _) => 2,
                _ => 3,
            }
        });
        assert_eq!(code, Some(0));
    }
}
