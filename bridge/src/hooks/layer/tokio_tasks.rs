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
//! * poll (a task span entered while no task poll is open on the thread, for this layer):
//!   "now − stamp" is held for the poll;
//! * the first span entered inside that poll whose local root has counters gets it as
//!   `profiling.wall.queued_ns` (the root the task works for);
//! * the task span exited: whatever was not handed out is dropped.
//!
//! A task span entered while a poll is open is not a poll of its own: another task's span
//! made current inside this one (`.instrument(Span::current())` in a task), the task's own
//! span entered again, or a task polled inside another's poll (a `LocalSet` run inside a
//! task). It takes no stamp, and until it exits nothing is handed out: a nested task's
//! queued time is not measured rather than given to the wrong root.
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

/// The name and target of tokio's async task spans (spawned, local and `block_on`
/// futures). Blocking tasks have `tokio::task::blocking`: no wakes, and the runtime's own
/// worker threads run inside one for their whole life, so they are not polls.
const TASK_SPAN: &str = "runtime.spawn";
const TASK_TARGET: &str = "tokio::task";
/// The target of tokio's waker events.
const WAKER_TARGET: &str = "tokio::task::waker";

/// What the layer has seen of tokio's instrumentation.
#[derive(Debug, Default)]
pub(super) struct TokioTasks {
    /// A task span's callsite was registered: new spans are checked.
    callsite: AtomicBool,
    /// A task span was created (a filter did not drop it): the enter path looks further.
    spans: AtomicBool,
    /// The waker events' callsite was registered: the event path looks further.
    events: AtomicBool,
    /// A waker event arrived: wakes are being reported.
    wakes: AtomicBool,
}

/// A task's pending wake: monotonic ns of its spawn or first wake since its last poll
/// (0: none), kept in its `runtime.spawn` span's extensions.
pub(super) struct TaskWake(AtomicU64);

/// The task poll open on a thread (32 bytes: copied whole at each task hook).
#[derive(Clone, Copy)]
struct Poll {
    /// The layer (`Owner`) whose task span opened it; 0: no poll open.
    owner: u64,
    task: u64,
    /// Queued ns + 1 not yet handed out (0: none).
    queued: u64,
    /// Task spans entered inside the poll and not yet exited.
    depth: u64,
}

const NO_POLL: Poll = Poll {
    owner: 0,
    task: 0,
    queued: 0,
    depth: 0,
};

thread_local! {
    static POLL: Cell<Poll> = const { Cell::new(NO_POLL) };
}

/// Whether `meta` is a tokio task span.
pub(super) fn is_task_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == TASK_SPAN && meta.target() == TASK_TARGET
}

impl TokioTasks {
    /// Notes a callsite being registered.
    pub(super) fn register(&self, meta: &Metadata<'_>) {
        if is_task_span(meta) {
            self.callsite.store(true, Ordering::Relaxed);
        } else if meta.is_event() && meta.target() == WAKER_TARGET {
            self.events.store(true, Ordering::Relaxed);
        }
    }

    /// Whether tokio's waker events exist in this process (one load: every event).
    #[inline]
    pub(super) fn events(&self) -> bool {
        self.events.load(Ordering::Relaxed)
    }

    /// Whether a tokio task span was ever created here (one load: the enter path).
    #[inline]
    pub(super) fn active(&self) -> bool {
        self.spans.load(Ordering::Relaxed)
    }

    /// The stamp of a new span, if it is a task span: spawned now, runnable until first
    /// polled. Costs one load for every span while no task span callsite exists.
    #[inline]
    pub(super) fn spawned(&self, meta: &Metadata<'_>) -> Option<TaskWake> {
        if !self.callsite.load(Ordering::Relaxed) || !is_task_span(meta) {
            return None;
        }
        self.spans.store(true, Ordering::Relaxed);
        Some(TaskWake(AtomicU64::new(monotonic_ns().max(1))))
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

    /// At an enter of the task span `task` (of the layer `owner`): opens its poll, or,
    /// inside an open poll, counts a nested task span.
    pub(super) fn task_entered(&self, owner: u64, task: &Id, wake: &TaskWake) {
        let _ = POLL.try_with(|cell| {
            let mut poll = cell.get();
            if poll.owner != 0 {
                poll.depth += 1;
                cell.set(poll);
                return;
            }
            let stamp = wake.0.swap(0, Ordering::AcqRel);
            // Without waker events only first polls would be measured, and the root would
            // report a part as the whole.
            let queued = if stamp != 0 && self.wakes.load(Ordering::Relaxed) {
                monotonic_ns().saturating_sub(stamp).saturating_add(1)
            } else {
                0
            };
            cell.set(Poll {
                owner,
                task: task.into_u64(),
                queued,
                ..NO_POLL
            });
        });
    }

    /// At an enter of a span (not a task span) of the layer `owner` whose root has
    /// counters `cpu` (a packed handle, 0: none): hands the open poll's queued time to it.
    #[inline]
    pub(super) fn root_entered(&self, owner: u64, cpu: u128) {
        if cpu == 0 {
            return;
        }
        let _ = POLL.try_with(|cell| {
            let mut poll = cell.get();
            if poll.owner == owner && poll.depth == 0 && poll.queued != 0 {
                root_cpu::add_queued(cpu, poll.queued - 1);
                poll.queued = 0;
                cell.set(poll);
            }
        });
    }

    /// At any exit of the layer `owner`'s span `id` (while task spans exist): ends a
    /// nested task span, or the poll (dropping what it did not hand out). `is_task` says
    /// whether `id` is a task span; it is asked only while a nested one is open.
    #[inline]
    pub(super) fn exited(&self, owner: u64, id: &Id, is_task: impl FnOnce() -> bool) {
        let _ = POLL.try_with(|cell| {
            let mut poll = cell.get();
            if poll.owner == 0 {
                return;
            }
            if poll.depth == 0 {
                if (poll.owner, poll.task) == (owner, id.into_u64()) {
                    cell.set(NO_POLL);
                }
            } else if is_task() {
                poll.depth -= 1;
                cell.set(poll);
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
