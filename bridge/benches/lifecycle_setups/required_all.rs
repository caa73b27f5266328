//! The required-work floor with everything on: what `required` does (issues 11 and 12), plus
//! what the later issues ask of every root span lifecycle when the sampler runs and the
//! OTEP 4947 thread context is published, each done the cheapest way that keeps the
//! property its issue asks for. A lower bound to measure the bridge's "everything on"
//! against, not an implementation (see "Not here" below).
//!
//! On top of `required`:
//!
//! * **Labels as handles, counters that two live roots never share** (issue 26 and the
//!   soundness issue): the processor claims a slot per local root from a per-thread free
//!   list (a fresh one from a global bump counter when it is empty) and writes the root's
//!   label (ids, name) and its OTEP record (trace id, span id, flags) into it once; the
//!   slot's generation turns odd. The handle (index + generation) is what a transition
//!   publishes: one 64-bit store into the thread's record, instead of `required`'s
//!   sequence-locked copy of the label.
//! * **Counters found by span id at the end**: a direct-mapped table of (span id, slot)
//!   pairs, one compare-and-swap to insert, one load and store to take; a collision goes
//!   to a locked map (never in this bench).
//! * **A stale handle never counts into the slot's next root**: each add checks the
//!   slot's generation first (one load and a compare).
//! * **The OTEP record**: each transition stores the record's address in the thread's
//!   `otel_thread_ctx_v1` pointer (NULL for no span).
//! * **Release**: the processor reads the totals, turns the generation even and pushes the
//!   slot on its thread's free list.
//!
//! Not here (each is something the bridge pays for a property this floor does not keep):
//! a scope stack (nested spans, exits in any order, two layers), cache invalidation for
//! recycled `tracing` ids, an orphan sweep for roots that never end through the processor,
//! the wait before a released record can be rewritten while another thread's pointer may
//! still name it, the counting of adds in flight across a release, fork safety, the
//! watchdog's run delay and the cgroup's throttled time, unsampled roots' name-only labels.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use opentelemetry::trace::{Span as _, TraceContextExt as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};

/// Slots at most (the bench has one root alive at a time).
const SLOTS: usize = 4096;
/// Entries of the span id → slot table.
const BY_ID: usize = 8192;

/// An OTEP 4947 record's header (no attributes: the bridge writes the name only when a
/// slot's last root had another). `required_kept` uses it too.
#[repr(C, align(8))]
pub(super) struct OtepRecord {
    trace_id: [AtomicU64; 2],
    span_id: AtomicU64,
    valid: AtomicU8,
    trace_flags: AtomicU8,
}

impl OtepRecord {
    pub(super) const fn new() -> OtepRecord {
        OtepRecord {
            trace_id: [AtomicU64::new(0), AtomicU64::new(0)],
            span_id: AtomicU64::new(0),
            valid: AtomicU8::new(0),
            trace_flags: AtomicU8::new(0),
        }
    }

    /// Writes the root's ids (in the W3C byte order) and flags, and marks it valid.
    pub(super) fn write(&self, span_id: u64, trace_id: u128, flags: u8) {
        let trace = trace_id.to_be_bytes();
        let (hi, lo) = trace.split_at(8);
        let word = |bytes: &[u8]| {
            let mut out = [0; 8];
            out.copy_from_slice(bytes);
            u64::from_ne_bytes(out)
        };
        self.trace_id[0].store(word(hi), Ordering::Relaxed);
        self.trace_id[1].store(word(lo), Ordering::Relaxed);
        self.span_id
            .store(u64::from_ne_bytes(span_id.to_be_bytes()), Ordering::Relaxed);
        self.trace_flags.store(flags, Ordering::Relaxed);
        self.valid.store(1, Ordering::Relaxed);
    }
}

/// One root's label, counters and OTEP record: what a slot of either floor holds beside
/// its own bookkeeping (`required_kept` uses it too).
pub(super) struct Root {
    span_id: AtomicU64,
    trace_hi: AtomicU64,
    trace_lo: AtomicU64,
    name: AtomicU32,
    pub(super) active: AtomicU64,
    samples: AtomicU64,
    cpu_ns: AtomicU64,
    pub(super) record: OtepRecord,
}

impl Root {
    pub(super) const fn new() -> Root {
        Root {
            span_id: AtomicU64::new(0),
            trace_hi: AtomicU64::new(0),
            trace_lo: AtomicU64::new(0),
            name: AtomicU32::new(0),
            active: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            record: OtepRecord::new(),
        }
    }

    /// Writes the label and the record of the root `span_id` of `trace_id`, and zeroes its
    /// counters.
    pub(super) fn write(&self, span_id: u64, trace_id: u128, flags: u8) {
        self.span_id.store(span_id, Ordering::Relaxed);
        self.trace_hi
            .store((trace_id >> 64) as u64, Ordering::Relaxed);
        self.trace_lo.store(trace_id as u64, Ordering::Relaxed);
        self.name.store(1, Ordering::Relaxed);
        self.active.store(0, Ordering::Relaxed);
        self.samples.store(0, Ordering::Relaxed);
        self.cpu_ns.store(0, Ordering::Relaxed);
        self.record.write(span_id, trace_id, flags);
    }

    /// Adds the three evidence attributes (one by one: `extend` over an array is an
    /// out-of-line loop over a moved copy).
    pub(super) fn add_evidence(&self, attributes: &mut Vec<KeyValue>) {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        attributes.push(KeyValue::new(
            "profiling.cpu.samples",
            int(self.samples.load(Ordering::Relaxed)),
        ));
        attributes.push(KeyValue::new(
            "profiling.cpu.time_ns",
            int(self.cpu_ns.load(Ordering::Relaxed)),
        ));
        attributes.push(KeyValue::new(
            "profiling.wall.active_ns",
            int(self.active.load(Ordering::Relaxed)),
        ));
    }
}

/// One root's slot.
#[repr(C, align(64))]
struct Slot {
    /// Odd while a root owns the slot.
    generation: AtomicU64,
    root: Root,
}

static SLOT_TABLE: [Slot; SLOTS] = [const {
    Slot {
        generation: AtomicU64::new(0),
        root: Root::new(),
    }
}; SLOTS];

/// Slots never handed out yet start here.
static FRESH: AtomicU32 = AtomicU32::new(0);

/// A handle: slot index in the low 16 bits, the generation above (the bench never wraps
/// it; the bridge's split is 23 + 40 with retirement).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Handle(u64);

impl Handle {
    fn new(index: u32, generation: u64) -> Handle {
        Handle(generation << 16 | u64::from(index))
    }

    fn slot(self) -> &'static Slot {
        &SLOT_TABLE[(self.0 & 0xffff) as usize % SLOTS]
    }

    fn generation(self) -> u64 {
        self.0 >> 16
    }
}

struct ByIdEntry {
    span_id: AtomicU64,
    handle: AtomicU64,
}

static BY_ID_TABLE: [ByIdEntry; BY_ID] = [const {
    ByIdEntry {
        span_id: AtomicU64::new(0),
        handle: AtomicU64::new(0),
    }
}; BY_ID];

/// Where colliding span ids go.
static COLLISIONS: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

fn insert_by_id(span_id: u64, handle: Handle) {
    let entry = &BY_ID_TABLE[span_id as usize % BY_ID];
    if entry
        .span_id
        .compare_exchange(0, span_id, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        entry.handle.store(handle.0, Ordering::Release);
        return;
    }
    if let Ok(mut map) = COLLISIONS.lock() {
        map.get_or_insert_with(HashMap::new)
            .insert(span_id, handle.0);
    }
}

fn take_by_id(span_id: u64) -> Option<Handle> {
    let entry = &BY_ID_TABLE[span_id as usize % BY_ID];
    if entry.span_id.load(Ordering::Acquire) == span_id {
        let handle = entry.handle.load(Ordering::Acquire);
        entry.span_id.store(0, Ordering::Release);
        return Some(Handle(handle));
    }
    let mut map = COLLISIONS.lock().ok()?;
    map.as_mut()?.remove(&span_id).map(Handle)
}

/// The thread's state: its record (the published handle), its `otel_thread_ctx_v1`
/// pointer, the one-entry label cache, when the root was entered, the free slots and the
/// slot its processor claimed last (for the layer resolving the root next).
struct Thread {
    word: AtomicU64,
    otel_thread_ctx: AtomicPtr<OtepRecord>,
    cached_id: Cell<u64>,
    cached: Cell<u64>,
    entered_at: Cell<u64>,
    claimed: Cell<(u64, u64)>,
}

thread_local! {
    static THREAD: Thread = const {
        Thread {
            word: AtomicU64::new(0),
            otel_thread_ctx: AtomicPtr::new(std::ptr::null_mut()),
            cached_id: Cell::new(0),
            cached: Cell::new(0),
            entered_at: Cell::new(0),
            claimed: Cell::new((0, 0)),
        }
    };
    static FREE: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Claims a slot for the root `span_id` of `trace_id` and writes its label and record.
fn claim(span_id: u64, trace_id: u128, flags: u8) -> Option<Handle> {
    let index = FREE.with(|free| free.borrow_mut().pop()).or_else(|| {
        let index = FRESH.fetch_add(1, Ordering::Relaxed);
        (index < SLOTS as u32).then_some(index)
    })?;
    let slot = &SLOT_TABLE[index as usize];
    slot.root.write(span_id, trace_id, flags);
    // Even (free) → odd (owned); the release orders the label's stores before it.
    let generation = slot.generation.fetch_add(1, Ordering::AcqRel) + 1;
    Some(Handle::new(index, generation))
}

/// Ends `handle`'s root: even generation, slot back on this thread's free list.
fn release(handle: Handle) {
    handle.slot().generation.fetch_add(1, Ordering::AcqRel);
    let index = (handle.0 & 0xffff) as u32;
    let _ = FREE.try_with(|free| free.borrow_mut().push(index));
}

#[derive(Default)]
pub struct Layer {
    otel: super::OtelContexts,
}

/// The handle a root span's extensions keep.
#[derive(Clone, Copy)]
struct RootHandle(u64);

impl<S> tracing_subscriber::Layer<S> for Layer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        self.otel.register(subscriber);
    }

    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        // Starts the OpenTelemetry span: the processor claims its slot on this thread.
        let Some(cx) = self.otel.of(id) else { return };
        let Some(span) = ctx.span(id) else { return };
        if span.parent().is_some() {
            return;
        }
        let span_id = u64::from_be_bytes(cx.span().span_context().span_id().to_bytes());
        THREAD.with(|thread| {
            let (claimed_id, handle) = thread.claimed.replace((0, 0));
            if claimed_id != span_id || handle == 0 {
                return;
            }
            span.extensions_mut().insert(RootHandle(handle));
            // Spans are mostly first entered where they were made: no lookup then.
            thread.cached_id.set(id.into_u64());
            thread.cached.set(handle);
        });
    }

    fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        THREAD.with(|thread| {
            let handle = if thread.cached_id.get() == id.into_u64() {
                thread.cached.get()
            } else {
                let Some(handle) = ctx
                    .span(id)
                    .and_then(|span| span.extensions().get::<RootHandle>().copied())
                else {
                    return;
                };
                thread.cached_id.set(id.into_u64());
                thread.cached.set(handle.0);
                handle.0
            };
            thread.word.store(handle, Ordering::Relaxed);
            let record = &Handle(handle).slot().root.record as *const OtepRecord;
            thread
                .otel_thread_ctx
                .store(record.cast_mut(), Ordering::Relaxed);
            thread.entered_at.set(super::required::ticks());
        });
    }

    fn on_exit(&self, id: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        THREAD.with(|thread| {
            if thread.cached_id.get() != id.into_u64() {
                return;
            }
            let spent = super::required::ticks().wrapping_sub(thread.entered_at.get());
            let handle = Handle(thread.cached.get());
            let slot = handle.slot();
            if slot.generation.load(Ordering::Acquire) == handle.generation() {
                slot.root.active.fetch_add(spent, Ordering::Relaxed);
            }
            thread.word.store(0, Ordering::Relaxed);
            thread
                .otel_thread_ctx
                .store(std::ptr::null_mut(), Ordering::Relaxed);
        });
    }
}

/// Marks local roots with the id's hex and claims their slot at start, adds the evidence
/// and releases the slot at end.
#[derive(Debug)]
pub struct Processor;

impl SpanProcessor for Processor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        let parent = cx.span().span_context().clone();
        if parent.is_valid() && !parent.is_remote() {
            return;
        }
        let span_context = span.span_context();
        let id = u64::from_be_bytes(span_context.span_id().to_bytes());
        let trace_id = u128::from_be_bytes(span_context.trace_id().to_bytes());
        let flags = span_context.trace_flags().to_u8();
        span.set_attribute(KeyValue::new(
            "pyroscope.profile.id",
            super::required::hex(id),
        ));
        let Some(handle) = claim(id, trace_id, flags) else {
            return;
        };
        insert_by_id(id, handle);
        THREAD.with(|thread| thread.claimed.set((id, handle.0)));
    }

    fn on_end(&self, mut span: SpanData) {
        let id = u64::from_be_bytes(span.span_context.span_id().to_bytes());
        let Some(handle) = take_by_id(id) else {
            black_box(span);
            return;
        };
        handle.slot().root.add_evidence(&mut span.attributes);
        release(handle);
        black_box(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}
