//! The set-ups of the span-lifecycle benchmarks (`span_lifecycle_instructions` counts
//! their instructions under callgrind, `span_lifecycle_interleaved` times them in
//! alternating rounds): the same code measured two ways.

use std::hint::black_box;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use otel_profiling::{CpuEvidenceProcessor, ProfileIdScope, ProfilingLayer};
use tracing_subscriber::layer::SubscriberExt;

/// (name, what it is) of each set-up, the baselines first in their groups.
pub const SETUPS: &[(&str, &str)] = &[
    ("otel", "tracing-opentelemetry alone (no-op processor)"),
    (
        "floor",
        "+ the least any span-labelling bridge pays (see `FloorLayer`)",
    ),
    (
        "api-floor",
        "+ only the public calls any bridge needs (see `ApiFloorLayer`)",
    ),
    (
        "required",
        "+ what issues 11 and 12 require, at the least (see `required`)",
    ),
    (
        "required-all",
        "+ what everything on requires, at the least (see `required_all`)",
    ),
    (
        "required-kept",
        "+ the properties issue 26 keeps, at the least (see `required_kept`)",
    ),
    ("layer", "+ ProfilingLayer"),
    ("processor", "+ CpuEvidenceProcessor with the profile id"),
    ("bridge", "+ sampler running (counters, active time)"),
    (
        "bridge-threadctx",
        "+ the OTEP 4947 thread context published",
    ),
    (
        "otel-batch",
        "tracing-opentelemetry alone, SDK batch processor",
    ),
    ("bridge-batch", "everything, SDK batch processor"),
];

/// The baseline `setup` is compared with.
pub fn baseline_of(setup: &str) -> &'static str {
    if setup.ends_with("-batch") {
        "otel-batch"
    } else {
        "otel"
    }
}

/// Whether `setup` runs with the sampler started and the measuring thread registered.
pub fn needs_sampler(setup: &str) -> bool {
    setup.starts_with("bridge")
}

/// Whether `setup` runs with the OTEP 4947 thread context published.
pub fn needs_thread_ctx(setup: &str) -> bool {
    setup.ends_with("threadctx")
}

/// One set-up's subscriber and tracer provider (the sampler and the thread context are
/// process-wide: the caller starts them, see [`needs_sampler`] and [`needs_thread_ctx`]).
pub struct Setup {
    pub dispatch: tracing::Dispatch,
    provider: SdkTracerProvider,
}

impl Setup {
    pub fn new(setup: &str) -> Setup {
        let batch = setup.ends_with("-batch");
        let bridged = !matches!(
            setup,
            "otel"
                | "layer"
                | "otel-batch"
                | "floor"
                | "api-floor"
                | "required"
                | "required-all"
                | "required-kept"
        );
        let builder = SdkTracerProvider::builder();
        let provider = match (setup, batch, bridged) {
            ("floor" | "api-floor", _, _) => builder.with_span_processor(Discard(true)),
            ("required", _, _) => builder.with_span_processor(required::Processor),
            ("required-all", _, _) => builder.with_span_processor(required_all::Processor),
            ("required-kept", _, _) => builder.with_span_processor(required_kept::Processor),
            (_, false, false) => builder.with_span_processor(Discard(false)),
            (_, false, true) => builder.with_span_processor(
                CpuEvidenceProcessor::new(Discard(false))
                    .with_profile_id(ProfileIdScope::LocalRoots),
            ),
            (_, true, false) => {
                builder.with_span_processor(BatchSpanProcessor::builder(DropExporter).build())
            }
            (_, true, true) => builder.with_span_processor(
                CpuEvidenceProcessor::new(BatchSpanProcessor::builder(DropExporter).build())
                    .with_profile_id(ProfileIdScope::LocalRoots),
            ),
        }
        .build();
        let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("bench"));
        let registry = tracing_subscriber::registry().with(otel);
        let dispatch = match setup {
            "floor" => tracing::Dispatch::new(registry.with(FloorLayer)),
            "api-floor" => tracing::Dispatch::new(registry.with(ApiFloorLayer::default())),
            "required" => tracing::Dispatch::new(registry.with(required::Layer::default())),
            "required-all" => tracing::Dispatch::new(registry.with(required_all::Layer::default())),
            "required-kept" => {
                tracing::Dispatch::new(registry.with(required_kept::Layer::default()))
            }
            "otel" | "otel-batch" => tracing::Dispatch::new(registry),
            _ => tracing::Dispatch::new(registry.with(ProfilingLayer::default())),
        };
        Setup { dispatch, provider }
    }

    /// Runs `n` lifecycles with this set-up's subscriber as the thread's default.
    pub fn run(&self, n: u32) {
        tracing::dispatcher::with_default(&self.dispatch, || lifecycles(n));
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// The batch processor's exporter: drops each batch (so memory stays flat however long
/// the benchmark runs).
#[derive(Debug)]
struct DropExporter;

impl SpanExporter for DropExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        drop(black_box(batch));
        Ok(())
    }
}

/// The exporting end of the pipeline: takes each span and drops it. `Discard(true)` is
/// also the floor's processor (see `FloorLayer`): one constant attribute on local roots.
#[derive(Debug)]
pub struct Discard(pub bool);

impl SpanProcessor for Discard {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        use opentelemetry::trace::{Span as _, TraceContextExt as _};
        // Nothing at all when not the floor: the baseline must stay the baseline.
        if !self.0 {
            return;
        }
        let parent = cx.span().span_context().clone();
        if !parent.is_valid() || parent.is_remote() {
            span.set_attribute(opentelemetry::KeyValue::new(
                "pyroscope.profile.id",
                "0123456789abcdef",
            ));
        }
    }
    fn on_end(&self, span: SpanData) {
        black_box(span);
    }
    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The floor: what any bridge that labels samples by span must at least do beside
/// `tracing-opentelemetry`, and nothing of what this crate does — on each enter, find the
/// span in the registry and read one value of its own from the span's extensions (the
/// label; here a marker put there when the span was made); and on each local root, one
/// attribute (`pyroscope.profile.id`, here a constant of the same length, not even the
/// id's hex). No record write, no scope stack, no clock, no counters, no evidence.
#[derive(Default)]
pub struct FloorLayer;

struct FloorMarker(u64);

impl<S> tracing_subscriber::Layer<S> for FloorLayer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        _: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(FloorMarker(id.into_u64()));
        }
    }

    fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            black_box(span.extensions().get::<FloorMarker>().map(|m| m.0));
        }
    }
}

/// A span's OpenTelemetry context, asked of the subscriber's OpenTelemetry layer: the
/// only public way to learn a `tracing` span's ids.
#[derive(Default)]
pub struct OtelContexts {
    dispatch: std::sync::OnceLock<tracing::dispatcher::WeakDispatch>,
}

impl OtelContexts {
    pub fn register(&self, subscriber: &tracing::Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    pub fn of(&self, id: &tracing::span::Id) -> Option<opentelemetry::Context> {
        let dispatch = self.dispatch.get()?.upgrade()?;
        tracing_opentelemetry::get_otel_context(id, &dispatch)
    }
}

/// The other floor: the calls to the public APIs of `tracing-subscriber`,
/// `tracing-opentelemetry` and the SDK that a bridge meeting issue 11 and 12 cannot avoid,
/// and no per-poll work at all: being a layer (every callback of the span's lifecycle
/// dispatched to it, each doing nothing), learning each span's OpenTelemetry ids once
/// (`get_otel_context`, the only public way; here on creation), and one constant
/// attribute on local roots (`Discard(true)`). No label lookup, record write, clock,
/// counters, evidence or thread context: what is left of the budget above this is what
/// all of those may cost together.
#[derive(Default)]
pub struct ApiFloorLayer {
    otel: OtelContexts,
}

impl<S> tracing_subscriber::Layer<S> for ApiFloorLayer
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
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        use opentelemetry::trace::TraceContextExt as _;
        if let Some(cx) = self.otel.of(id) {
            black_box(cx.span().span_context().span_id());
        }
    }

    fn on_enter(&self, id: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(id);
    }

    fn on_exit(&self, id: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(id);
    }

    fn on_close(&self, id: tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
        black_box(id);
    }
}

/// What callgrind counts: `n` lifecycles of a root span, as a tokio task's span lives.
#[inline(never)]
pub fn lifecycles(n: u32) {
    for _ in 0..n {
        let span = tracing::info_span!("GET /report");
        for _ in 0..4 {
            drop(black_box(span.enter()));
        }
        drop(black_box(span));
    }
}

pub mod required_all;
pub mod required_kept;

/// The required-work floor: what issues 11 and 12 ask of every root span lifecycle, done
/// the cheapest way the public APIs allow, and nothing a general implementation needs on
/// top (so it is a lower bound, not an implementation: it is wrong as soon as spans nest,
/// exit out of order, are entered by two layers, or recycle an id while cached).
///
/// * creation (as `ApiFloorLayer`): the span's OpenTelemetry ids, once; for a root, its
///   counters claimed (one store into a direct-mapped table) and the label kept in the
///   span's extensions, the only per-span storage another thread can reach;
/// * every enter: the label from a one-entry thread-local cache, filled when the span is
///   made (the registry on a miss),
///   the thread's record written as a sequence lock (what a signal handler can read), the
///   active-time clock read (the TSC);
/// * every exit: the clock read again, the stretch added to the root's counter (one atomic
///   add), the record cleared;
/// * the processor: `pyroscope.profile.id` with the id's hex at start; the three evidence
///   attributes from the counters at end.
///
/// No scope stack, no label-cache invalidation, no evidence table with orphan sweeping,
/// no thread context, no tokio hand-off, no sampler check.
pub mod required {
    use std::cell::Cell;
    use std::hint::black_box;
    use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    use std::time::Duration;

    use opentelemetry::trace::{Span as _, TraceContextExt as _};
    use opentelemetry::KeyValue;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanProcessor};

    const SLOTS: usize = 1024;

    struct Counters {
        active: AtomicU64,
        samples: AtomicU64,
        cpu_ns: AtomicU64,
    }

    static COUNTERS: [Counters; SLOTS] = [const {
        Counters {
            active: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
        }
    }; SLOTS];

    fn slot(span_id: u64) -> &'static Counters {
        &COUNTERS[span_id as usize % SLOTS]
    }

    #[derive(Clone, Copy, Default)]
    struct Label {
        span_id: u64,
        trace_hi: u64,
        trace_lo: u64,
        name: u32,
    }

    /// The thread's record, as a signal handler would read it.
    struct Record {
        seq: AtomicU32,
        name: AtomicU32,
        span_id: AtomicU64,
        trace_hi: AtomicU64,
        trace_lo: AtomicU64,
    }

    impl Record {
        #[inline]
        fn write(&self, label: Label) {
            let seq = self.seq.load(Ordering::Relaxed);
            self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
            fence(Ordering::Release);
            self.name.store(label.name, Ordering::Relaxed);
            self.span_id.store(label.span_id, Ordering::Relaxed);
            self.trace_hi.store(label.trace_hi, Ordering::Relaxed);
            self.trace_lo.store(label.trace_lo, Ordering::Relaxed);
            self.seq.store(seq.wrapping_add(2), Ordering::Release);
        }
    }

    /// The thread's state: the record, the one-entry label cache, when the root was entered.
    struct Thread {
        record: Record,
        cached_id: Cell<u64>,
        cached: Cell<Label>,
        entered_at: Cell<u64>,
    }

    thread_local! {
        static THREAD: Thread = const {
            Thread {
                record: Record {
                    seq: AtomicU32::new(0),
                    name: AtomicU32::new(0),
                    span_id: AtomicU64::new(0),
                    trace_hi: AtomicU64::new(0),
                    trace_lo: AtomicU64::new(0),
                },
                cached_id: Cell::new(0),
                cached: Cell::new(Label { span_id: 0, trace_hi: 0, trace_lo: 0, name: 0 }),
                entered_at: Cell::new(0),
            }
        };
    }

    /// The active-time clock (the TSC on x86-64).
    #[inline]
    pub fn ticks() -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `rdtsc` has no preconditions on x86-64.
            unsafe { std::arch::x86_64::_rdtsc() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            START
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_nanos() as u64
        }
    }

    #[derive(Default)]
    pub struct Layer {
        otel: super::OtelContexts,
    }

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
            let Some(cx) = self.otel.of(id) else { return };
            let Some(span) = ctx.span(id) else { return };
            if span.parent().is_some() {
                return;
            }
            let otel = cx.span();
            let span_context = otel.span_context();
            let span_id = u64::from_be_bytes(span_context.span_id().to_bytes());
            let trace_id = u128::from_be_bytes(span_context.trace_id().to_bytes());
            slot(span_id).active.store(0, Ordering::Relaxed);
            let label = Label {
                span_id,
                trace_hi: (trace_id >> 64) as u64,
                trace_lo: trace_id as u64,
                name: 1,
            };
            span.extensions_mut().insert(label);
            // Spans are mostly first entered where they were made: no lookup then.
            THREAD.with(|thread| {
                thread.cached_id.set(id.into_u64());
                thread.cached.set(label);
            });
        }

        fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
            THREAD.with(|thread| {
                let label = if thread.cached_id.get() == id.into_u64() {
                    thread.cached.get()
                } else {
                    let Some(label) = ctx
                        .span(id)
                        .and_then(|span| span.extensions().get::<Label>().copied())
                    else {
                        return;
                    };
                    thread.cached_id.set(id.into_u64());
                    thread.cached.set(label);
                    label
                };
                thread.record.write(label);
                thread.entered_at.set(ticks());
            });
        }

        fn on_exit(&self, id: &tracing::span::Id, _: tracing_subscriber::layer::Context<'_, S>) {
            THREAD.with(|thread| {
                if thread.cached_id.get() != id.into_u64() {
                    return;
                }
                let spent = ticks().wrapping_sub(thread.entered_at.get());
                slot(thread.cached.get().span_id)
                    .active
                    .fetch_add(spent, Ordering::Relaxed);
                thread.record.write(Label::default());
            });
        }
    }

    /// Marks local roots with the id's hex at start, adds the evidence at end.
    #[derive(Debug)]
    pub struct Processor;

    pub fn hex(id: u64) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(16);
        for shift in (0..16).rev() {
            out.push(char::from(DIGITS[((id >> (shift * 4)) & 0xf) as usize]));
        }
        out
    }

    impl SpanProcessor for Processor {
        fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
            let parent = cx.span().span_context().clone();
            if !parent.is_valid() || parent.is_remote() {
                let id = u64::from_be_bytes(span.span_context().span_id().to_bytes());
                span.set_attribute(KeyValue::new("pyroscope.profile.id", hex(id)));
            }
        }

        fn on_end(&self, mut span: SpanData) {
            if !span.parent_span_id.to_bytes().iter().all(|b| *b == 0) {
                black_box(span);
                return;
            }
            let counters = slot(u64::from_be_bytes(span.span_context.span_id().to_bytes()));
            let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            span.attributes.extend([
                KeyValue::new(
                    "profiling.cpu.samples",
                    int(counters.samples.load(Ordering::Relaxed)),
                ),
                KeyValue::new(
                    "profiling.cpu.time_ns",
                    int(counters.cpu_ns.load(Ordering::Relaxed)),
                ),
                KeyValue::new(
                    "profiling.wall.active_ns",
                    int(counters.active.load(Ordering::Relaxed)),
                ),
            ]);
            black_box(span);
        }

        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }

        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }
}
