//! The sizes of the process-wide tables the span record keeps, and what they refused:
//! counters a test or a dashboard can watch instead of RSS (docs/bounds.md lists every
//! structure, its bound and its counter).

use crate::label::table::{LabelTableStats, MAX_LABEL_SLOTS};
use crate::label::LABELS;

/// The span record's tables: a snapshot ([`record_stats`], also in
/// [`HealthStats::record`](crate::HealthStats::record)).
///
/// ```
/// let stats = otel_profiling::record_stats();
/// assert!(stats.label_slots <= stats.label_slots_cap);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordStats {
    /// Label slots the process holds (one per local root alive, plus slots released but
    /// not yet reusable; 384 bytes each with the thread context's record). Never freed:
    /// the high-water mark of the roots alive at once, plus O(threads).
    pub label_slots: u64,
    /// The most label slots the process may hold ([`set_max_live_roots`]).
    pub label_slots_cap: u64,
    /// Released label slots waiting for a reclaim (a thread's OTEP 4947 context may
    /// still name them).
    pub label_slots_in_limbo: u64,
    /// Released label slots parked with a thread that still names them (at most one per
    /// thread that publishes).
    pub label_slots_parked: u64,
    /// Reclaims of released label slots run (one `membarrier` each).
    pub label_reclaims: u64,
    /// The OTEP 4947 thread context's mirrors, one per thread that publishes (reused
    /// after the thread exits; never freed: the high-water mark of threads at once).
    pub thread_context_mirrors: u64,
    /// Local roots that got no label: the table held its cap, none free. Their samples
    /// carry no span labels (also [`SamplerStats::unlabelled_roots`](crate::sampler::SamplerStats)).
    pub labels_refused: u64,
    /// Distinct span names interned, at most [`MAX_SPAN_NAMES`](crate::MAX_SPAN_NAMES);
    /// never freed.
    pub span_names: u64,
    /// Interns answered with [`SpanName::OVERFLOW_NAME`](crate::SpanName::OVERFLOW_NAME)
    /// because the table was full (as [`span_names_overflowed`](crate::span_names_overflowed)).
    pub span_names_folded: u64,
    /// Names in the per-thread name caches of all live threads together (each capped).
    pub span_name_cache_entries: u64,
    /// Per-thread name cache entries dropped at their cap.
    pub span_name_cache_evictions: u64,
    /// CPU counter slots of local roots (one per root followed while a sampler runs,
    /// 48 bytes each). Never freed: their high-water mark.
    pub root_counter_slots: u64,
    /// Local roots alive with evidence counters (the evidence processor's entries).
    pub evidence_entries: u64,
    /// Local roots refused evidence counters at the cap: their spans carry no
    /// `profiling.*` attributes.
    pub evidence_refused: u64,
    /// Heap bytes of the scope stacks' spills (scopes nested past 32 on a thread; at
    /// most 96 KiB a thread, given back when it exits).
    pub scope_spill_bytes: u64,
    /// The most scopes one thread's spill held (at most 4,096).
    pub scope_spill_max: u64,
    /// Oldest spilled scopes dropped at the spill's cap (almost always enters never
    /// exited: a forgotten guard).
    pub scopes_evicted: u64,
    /// Enters not recorded (re-entrant, or in a thread-local destructor).
    pub scopes_refused: u64,
    /// `/proc/thread-self/schedstat` files the span hooks keep open (a gauge): one per
    /// thread that ended a stretch of 1 ms or more with counters, read for its run delay
    /// there, closed when the thread exits; at most 256 at once (past it a reading opens
    /// and closes the file).
    pub schedstat_files_open: u64,
}

/// The span record's tables now.
pub fn record_stats() -> RecordStats {
    let labels: LabelTableStats = LABELS.stats();
    let names = crate::span_name::stats();
    let counters = crate::root_cpu::stats();
    let scopes = crate::span_context::scopes::scope_stats();
    RecordStats {
        label_slots: labels.slots,
        label_slots_cap: labels.cap,
        label_slots_in_limbo: labels.in_limbo,
        label_slots_parked: labels.parked,
        label_reclaims: labels.reclaims,
        labels_refused: labels.capped,
        thread_context_mirrors: labels.mirrors,
        span_names: names.interned,
        span_names_folded: names.overflowed,
        span_name_cache_entries: names.cached,
        span_name_cache_evictions: names.cache_evictions,
        root_counter_slots: counters.slots,
        evidence_entries: crate::evidence::entries(),
        evidence_refused: counters.refused,
        scope_spill_bytes: scopes.spill_bytes,
        scope_spill_max: scopes.spilled_max,
        scopes_evicted: scopes.evicted,
        scopes_refused: scopes.refused,
        schedstat_files_open: crate::span_context::own_clocks::kept(),
    }
}

/// The default of [`set_max_live_roots`]: 262,144.
pub const DEFAULT_MAX_LIVE_ROOTS: u64 = crate::label::table::DEFAULT_MAX_LABEL_SLOTS;

/// The most local roots labelled at once: past it a new root's samples carry no span
/// labels (counted in [`RecordStats::labels_refused`]) and its span no evidence
/// (counted in [`RecordStats::evidence_refused`]), and the label and counter tables,
/// which are never freed, stop growing. Default [`DEFAULT_MAX_LIVE_ROOTS`] (96 MiB of labels at
/// the cap with the thread context on: 64 bytes of label and 320 of OTEP 4947 record per
/// root). Values above 8,388,608 (what a label word can index) are taken as that.
/// [`Telemetry::max_live_roots`](crate::Telemetry::max_live_roots) and
/// `OTEL_PROFILING_MAX_LIVE_ROOTS` set it at setup.
///
/// ```
/// otel_profiling::set_max_live_roots(100_000);
/// assert_eq!(otel_profiling::record_stats().label_slots_cap, 100_000);
/// # otel_profiling::set_max_live_roots(otel_profiling::DEFAULT_MAX_LIVE_ROOTS);
/// ```
pub fn set_max_live_roots(max: u64) {
    let max = max.min(MAX_LABEL_SLOTS);
    LABELS.set_cap(max);
    crate::root_cpu::set_cap(max);
}
