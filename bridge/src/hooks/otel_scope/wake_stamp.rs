//! Queued time of a plain-API future: from the moment it is woken to the moment it is
//! polled again, it waits for a worker, not for anything it awaits.
//!
//! [`ProfiledFuture`](super::ProfiledFuture) hands the future it wraps a waker of its own,
//! one [`WakeStamp`] allocated once per future (never per poll). A wake records the
//! monotonic time (the first wake since the last poll wins) and passes the wake on to the
//! task's real waker; the next poll adds "now − woken" to the root's queued time
//! (`root_cpu::add_queued`). Only the outermost wrapper of a root measures: a wrapper
//! polled while its thread already runs the same root is nested in another one, whose wake
//! is the same wake.
//!
//! What it cannot see: the delay before the first poll (spawn to start), and queueing of
//! futures the wrapper does not wrap (`tracing`-instrumented futures; tokio's own task
//! hooks are unstable). The waker's identity is stable across polls (one `Arc`), so
//! `Waker::will_wake` in the wrapped future keeps working.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use atomic_waker::AtomicWaker;

use crate::clock::monotonic_ns;
use crate::root_cpu;

/// One wrapped future's wake time and the task's current waker.
#[derive(Debug, Default)]
pub(super) struct WakeStamp {
    /// Monotonic ns of the first wake since the last poll; 0: not woken.
    woken_at: AtomicU64,
    /// The waker of the task polling the wrapper, registered on every poll and taken by
    /// the first wake after it. Atomics, no lock: a fork cannot leave it held, and a wake
    /// never waits for a poll.
    task: AtomicWaker,
}

impl WakeStamp {
    /// A stamp for a future of the root `cpu`, marking the root's queued time as measured
    /// (a future polled once and ready at once was queued for 0 ns, not "unknown").
    pub(super) fn new(cpu: u128) -> Arc<WakeStamp> {
        root_cpu::add_queued(cpu, 0);
        Arc::new(WakeStamp::default())
    }

    /// At the start of a poll under the root `cpu` (a packed counter handle): closes the
    /// queued stretch opened by the last wake, keeps the task's waker, and returns the
    /// waker to hand the wrapped future.
    pub(super) fn before_poll(self: &Arc<Self>, cpu: u128, task: &Waker) -> Waker {
        let woken = self.woken_at.swap(0, Ordering::AcqRel);
        if woken != 0 {
            root_cpu::add_queued(cpu, monotonic_ns().saturating_sub(woken));
        }
        self.task.register(task);
        Waker::from(Arc::clone(self))
    }
}

impl Wake for WakeStamp {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.woken_at.compare_exchange(
            0,
            monotonic_ns().max(1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        // Takes the registered waker and wakes it (more wakes before the next poll find
        // none: the task is already scheduled, and its poll registers again).
        self.task.wake();
    }
}
