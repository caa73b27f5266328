//! Queued time of tokio tasks, seen through tokio's own `tracing` instrumentation.
//!
//! Built with `--cfg tokio_unstable` and its `tracing` feature, tokio (the instrumentation
//! tokio-console reads) wraps every spawned task in a `runtime.spawn` span (target
//! `tokio::task`), entered around each poll, and emits an event (target
//! `tokio::task::waker`) for each waker operation, with `op` (`waker.wake`,
//! `waker.wake_by_ref`, ...) and `task.id`, the id of the task's `runtime.spawn` span.
//! From those, the layer measures what the plain-API wrapper measures with its own waker:
//! the time from a task's wake (or its spawn) to its next poll, when it was runnable and
//! waited for a worker. No `tokio_unstable`, no events: nothing here runs, and the enter
//! path pays one relaxed load.
//!
//! * spawn (`runtime.spawn` created): the task's stamp is the creation time;
//! * wake: the first wake since the last poll stamps the time;
//! * poll (the task span entered): "now − stamp" is held for the poll;
//! * the first span entered inside that poll whose local root has counters gets it as
//!   `profiling.wall.queued_ns` (the root the task works for);
//! * the task span exited: whatever was not handed out is dropped.
//!
//! Until a waker event has been seen nothing is measured (a filter may let the spans
//! through but drop the events, and spawn-to-first-poll alone would be reported as the
//! whole): "not measured" is never reported as 0.

use std::cell::Cell;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing_core::field::{Field, Visit};
use tracing_core::span::Id;
use tracing_core::{Event, Metadata};

use crate::clock::monotonic_ns;
use crate::root_cpu;

/// The name and target (prefix) of tokio's task spans.
const TASK_SPAN: &str = "runtime.spawn";
const TASK_TARGET: &str = "tokio::task";
/// The target of tokio's waker events.
const WAKER_TARGET: &str = "tokio::task::waker";

/// What the layer has seen of tokio's instrumentation.
#[derive(Debug, Default)]
pub(super) struct TokioTasks {
    /// A task span's callsite was registered: the enter path looks further.
    spans: AtomicBool,
    /// The waker events' callsite was registered: the event path looks further.
    events: AtomicBool,
    /// A waker event arrived: wakes are being reported.
    wakes: AtomicBool,
}

/// A task's pending wake: monotonic ns of its spawn or first wake since its last poll
/// (0: none), kept in its `runtime.spawn` span's extensions.
pub(super) struct TaskWake(AtomicU64);

thread_local! {
    /// The queued time of the task being polled on this thread: (its span id, ns + 1);
    /// 0 in the second field when there is none.
    static PENDING: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Whether `meta` is a tokio task span.
pub(super) fn is_task_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == TASK_SPAN && meta.target().starts_with(TASK_TARGET)
}

impl TokioTasks {
    /// Notes a callsite being registered.
    pub(super) fn register(&self, meta: &Metadata<'_>) {
        if is_task_span(meta) {
            self.spans.store(true, Ordering::Relaxed);
        } else if meta.is_event() && meta.target() == WAKER_TARGET {
            self.events.store(true, Ordering::Relaxed);
        }
    }

    /// Whether tokio's waker events exist in this process (one load: every event).
    #[inline]
    pub(super) fn events(&self) -> bool {
        self.events.load(Ordering::Relaxed)
    }

    /// Whether any tokio task span exists in this process (one load: the enter path).
    #[inline]
    pub(super) fn active(&self) -> bool {
        self.spans.load(Ordering::Relaxed)
    }

    /// The stamp of a new task span: spawned now, runnable until first polled.
    pub(super) fn spawned(&self) -> TaskWake {
        TaskWake(AtomicU64::new(monotonic_ns().max(1)))
    }

    /// The task id a waker event wakes, if `event` is one that wakes a task.
    pub(super) fn woken_task(&self, event: &Event<'_>) -> Option<Id> {
        if event.metadata().target() != WAKER_TARGET {
            return None;
        }
        self.wakes.store(true, Ordering::Relaxed);
        let mut visit = WakerVisit::default();
        event.record(&mut visit);
        if !visit.wakes {
            return None;
        }
        NonZeroU64::new(visit.task?).map(Id::from_non_zero_u64)
    }

    /// At a task span's enter (its poll begins): holds the time since its stamp for the
    /// first root entered inside the poll.
    pub(super) fn poll_begins(&self, task: &Id, wake: &TaskWake) {
        let stamp = wake.0.swap(0, Ordering::AcqRel);
        // Without waker events only first polls would be measured, and the root would
        // report a part as the whole.
        if stamp == 0 || !self.wakes.load(Ordering::Relaxed) {
            return;
        }
        let queued = monotonic_ns().saturating_sub(stamp);
        PENDING.with(|p| p.set((task.into_u64(), queued.saturating_add(1))));
    }

    /// At any enter of a span whose root has counters `cpu` (a packed handle, 0: none):
    /// hands the polled task's queued time to that root.
    #[inline]
    pub(super) fn root_entered(&self, cpu: u64) {
        if cpu == 0 {
            return;
        }
        PENDING.with(|p| {
            let (task, queued) = p.get();
            if queued != 0 {
                root_cpu::add_queued(cpu, queued - 1);
                p.set((task, 0));
            }
        });
    }

    /// At a task span's exit (or any exit when tokio tasks exist): drops what the poll
    /// did not hand out.
    #[inline]
    pub(super) fn exited(&self, id: &Id) {
        PENDING.with(|p| {
            if p.get().0 == id.into_u64() {
                p.set((0, 0));
            }
        });
    }

    /// At a waker event for `wake`'s task: the first wake since the last poll stamps.
    pub(super) fn woken(&self, wake: &TaskWake) {
        let _ = wake.0.compare_exchange(
            0,
            monotonic_ns().max(1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// Reads `op` and `task.id` of a waker event.
#[derive(Default)]
struct WakerVisit {
    wakes: bool,
    task: Option<u64>,
}

impl WakerVisit {
    fn op(&mut self, op: &str) {
        self.wakes = matches!(op, "waker.wake" | "waker.wake_by_ref");
    }
}

impl Visit for WakerVisit {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "task.id" {
            self.task = Some(value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "task.id" {
            self.task = u64::try_from(value).ok();
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "op" {
            self.op(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "op" {
            // `op = %value` arrives as Display through `record_debug`.
            self.op(format!("{value:?}").trim_matches('"'));
        }
    }
}
