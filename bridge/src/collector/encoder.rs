//! The encoder thread: names the stacks of each finished interval, builds its pprof
//! profiles, compresses them and hands them to the sinks.
//!
//! It runs beside the collector thread, not on it: naming can take long (the first pass
//! over a large binary builds its debug-info index; a pass over many new addresses parses
//! many units), and a sink can block (a slow disk). The collector keeps draining the
//! per-thread buffers meanwhile, so none of that turns into samples dropped for a full
//! buffer.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::{
    inuse::InuseTotals, sample_labels, AllocTotals, BlockedTotals, CollectorConfig, CollectorStats,
    EncodedProfile, FlushBoard, LabelKey, ProfileKind, ProfileSink, Totals, AGGREGATION_FULL_FRAME,
    AGGREGATION_FULL_STACK, ALLOCATION_NOT_WALKED_FRAME, NO_SPANS_WARNING,
};
use crate::pprof::{self, FrameLine, ProfileBuilder, SymbolizedFrame};
use crate::sampler::MAX_FRAMES;
use crate::span_name::SpanName;
use crate::symbolize::Symbolizer;
use crate::symbolize::MAX_NAMED_ADDRESSES;

/// One finished interval, as the collector aggregated it.
pub(super) struct Interval {
    pub(super) start: SystemTime,
    pub(super) duration: Duration,
    /// CPU periods by (stack, labels).
    pub(super) counts: Totals<u64>,
    /// Blocked-in-poll looks by (stack, labels).
    pub(super) blocked: Totals<BlockedTotals>,
    /// Allocation samples by (stack, labels).
    pub(super) allocs: Totals<AllocTotals>,
    /// In-use memory at the hand-over by (stack, labels) (`None`: not tracked; the
    /// allocation profile keeps its two types).
    pub(super) inuse: Option<Totals<InuseTotals>>,
    /// The last flush ticket this interval answers (0: none), written once its
    /// profiles reached the sinks.
    pub(super) flush: u64,
}

pub(super) struct Encoder {
    config: CollectorConfig,
    period_ns: i64,
    sinks: Vec<Box<dyn ProfileSink>>,
    stats: Arc<CollectorStats>,
    /// Where flushes wait: told of each interval written, and closed when the encoder
    /// ends (its `Drop`, a sink's panic included), so that no flush waits for nothing.
    flushes: Arc<FlushBoard>,
    /// Whether some span reached the hooks was checked (and warned about if not).
    span_check_done: bool,
    /// Span callsites had been registered when the last interval ended.
    span_callsites_before: bool,
    /// Created on first use, so starting costs nothing.
    symbolizer: Option<Symbolizer>,
}

/// Distinct addresses one naming pass takes at most: a probe per address (the frame
/// itself, or the call before a return address) and one more stack's frames past the
/// count still fit each file's names cache, so every frame of a batch is a cache hit and
/// no pass names past the cap however large the interval.
pub(super) const BATCH_ADDRESSES: usize = MAX_NAMED_ADDRESSES / 2 - MAX_FRAMES;

/// An interval's total under one key: a CPU count or blocked-in-poll totals.
enum Totalled {
    Cpu(u64),
    Blocked(BlockedTotals),
    Alloc(AllocTotals),
    Inuse(InuseTotals),
}

/// Names the stacks of `totals` and gives each to `each`, in batches of at most
/// [`BATCH_ADDRESSES`] distinct addresses: one pass per file per batch (one in all for
/// most intervals), then cache hits.
fn name_in_batches<V>(
    symbolizer: &mut Symbolizer,
    totals: impl IntoIterator<Item = ((Box<[u64]>, LabelKey), V)>,
    mut each: impl FnMut(&[SymbolizedFrame], &LabelKey, V),
) {
    let mut totals = totals.into_iter();
    let (mut batch, mut addresses, mut stack) = (Vec::new(), HashSet::new(), Vec::new());
    loop {
        while addresses.len() < BATCH_ADDRESSES {
            let Some(entry) = totals.next() else {
                break;
            };
            let ((frames, _), _) = &entry;
            if **frames != AGGREGATION_FULL_STACK {
                addresses.extend(frames.iter().copied());
            }
            batch.push(entry);
        }
        if batch.is_empty() {
            return;
        }
        symbolizer.prepare(
            batch
                .iter()
                .filter(|((frames, _), _)| **frames != AGGREGATION_FULL_STACK)
                .flat_map(|((frames, _), _)| frames.iter().enumerate().map(|(i, &a)| (a, i > 0))),
        );
        for ((frames, key), value) in batch.drain(..) {
            stack.clear();
            if *frames == AGGREGATION_FULL_STACK {
                stack.push(aggregation_full_frame());
            } else {
                for (i, &address) in frames.iter().enumerate() {
                    stack.push(symbolizer.frame(address, i > 0));
                }
            }
            each(&stack, &key, value);
        }
        addresses.clear();
    }
}

/// An allocation sample's stack from the allocator's frame out: the hook's own frames
/// (the sampling, the walk, inlined or not, which differ between builds) are left out,
/// so the innermost frame is `ProfilingAllocator`'s `alloc`, `alloc_zeroed` or
/// `realloc`; without inlined names (no debug info), the `__rust_alloc` family that
/// calls it, or else the first frame out of the hook's entry (`record_sample`) and the
/// allocator's own out-of-line paths (the allocator and its callers inlined into it).
/// A stack where none of these is named is kept whole.
fn from_the_allocator(stack: &[SymbolizedFrame]) -> Vec<SymbolizedFrame> {
    // Its name with full debug info, and as `line-tables-only` names it inlined (the
    // module path and the bare method name, see `symbolize/qualify.rs`).
    let is_wrapper = |f: &str| {
        (f.starts_with("<otel_profiling::allocations::allocator::ProfilingAllocator")
            && f.contains("GlobalAlloc>::"))
            || ["alloc", "alloc_zeroed", "realloc"]
                .iter()
                .any(|m| f.strip_prefix("otel_profiling::allocations::allocator::") == Some(m))
    };
    let is_shim = |f: &str| {
        ["__rust_alloc", "__rust_alloc_zeroed", "__rust_realloc"]
            .iter()
            .any(|shim| f.ends_with(shim))
    };
    // The hook's entry, a function of its own in every build (`#[inline(never)]`).
    let hook = "otel_profiling::allocations::hook::record_sample";
    // The allocator's out-of-line paths (`alloc_sampled`, ...) and the hook's frames
    // between its entry and them.
    let is_ours = |frame: &SymbolizedFrame| {
        frame.lines.iter().all(|l| {
            l.function.starts_with("otel_profiling::allocations::")
                || l.function
                    .starts_with("<otel_profiling::allocations::allocator::ProfilingAllocator")
        })
    };
    for is_cut in [&is_wrapper as &dyn Fn(&str) -> bool, &is_shim] {
        for (i, frame) in stack.iter().enumerate() {
            if let Some(j) = frame.lines.iter().position(|l| is_cut(&l.function)) {
                let mut out = Vec::with_capacity(stack.len() - i);
                out.push(SymbolizedFrame {
                    address: frame.address,
                    lines: frame.lines[j..].to_vec(),
                });
                out.extend_from_slice(&stack[i + 1..]);
                return out;
            }
        }
    }
    match stack
        .iter()
        .position(|frame| frame.lines.iter().any(|l| &*l.function == hook))
    {
        Some(i) if stack[i + 1..].iter().any(|f| !is_ours(f)) => stack[i + 1..]
            .iter()
            .skip_while(|f| is_ours(f))
            .cloned()
            .collect(),
        // Only the hook's own frames: the sample's pc, kept when the stack could not be
        // walked (too little left, the copy refused, no unwinder yet).
        _ if !stack.is_empty()
            && stack.iter().all(|frame| {
                frame.lines.iter().all(|l| {
                    l.function
                        .starts_with("otel_profiling::allocations::hook::")
                })
            }) =>
        {
            vec![SymbolizedFrame {
                address: stack[0].address,
                lines: vec![FrameLine {
                    function: Arc::from(ALLOCATION_NOT_WALKED_FRAME),
                    file: None,
                    line: None,
                }],
            }]
        }
        _ => stack.to_vec(),
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        self.flushes.close();
    }
}

/// The frame samples past the aggregation cap are put under when their stack found no
/// room either. Its address is the stack key's, which no sampled frame holds, so its
/// location is its own.
fn aggregation_full_frame() -> SymbolizedFrame {
    SymbolizedFrame {
        address: AGGREGATION_FULL_STACK[0],
        lines: vec![FrameLine {
            function: Arc::from(AGGREGATION_FULL_FRAME),
            file: None,
            line: None,
        }],
    }
}

impl Encoder {
    pub(super) fn new(
        config: CollectorConfig,
        period_ns: i64,
        sinks: Vec<Box<dyn ProfileSink>>,
        stats: Arc<CollectorStats>,
        flushes: Arc<FlushBoard>,
    ) -> Encoder {
        Encoder {
            config,
            period_ns,
            sinks,
            stats,
            flushes,
            span_check_done: false,
            span_callsites_before: false,
            symbolizer: None,
        }
    }

    /// Writes each interval the collector sends, until it closes the channel.
    pub(super) fn run(mut self, intervals: Receiver<Interval>) {
        for interval in intervals {
            let flush = self.encode(interval);
            if flush > 0 {
                self.flushes.written(flush);
            }
        }
    }

    /// Names, builds and exports one interval's profiles; returns its flush ticket.
    fn encode(&mut self, interval: Interval) -> u64 {
        let Interval {
            start,
            duration,
            counts,
            blocked,
            allocs,
            inuse,
            flush,
        } = interval;
        let naming = Instant::now();
        let symbolizer = self.symbolizer.get_or_insert_with(Symbolizer::new);
        // Modules loaded since the last interval (dlopen) become nameable.
        symbolizer.refresh();
        let mut names: HashMap<SpanName, Arc<str>> = HashMap::new();
        let mut cpu = ProfileBuilder::new(self.period_ns, start, duration);
        let mut block = ProfileBuilder::blocked(start, duration);
        let mean = crate::allocations::last_mean();
        let mean = i64::try_from(mean).unwrap_or(i64::MAX);
        let mut alloc = match inuse {
            Some(_) => ProfileBuilder::heap(mean, start, duration),
            None => ProfileBuilder::allocations(mean, start, duration),
        };
        let (mut samples, mut looks, mut alloc_samples, mut held) = (0u64, 0u64, 0u64, 0u64);
        let all = counts
            .into_iter()
            .map(|(key, count)| (key, Totalled::Cpu(count)))
            .chain(
                blocked
                    .into_iter()
                    .map(|(key, totals)| (key, Totalled::Blocked(totals))),
            )
            .chain(
                allocs
                    .into_iter()
                    .map(|(key, totals)| (key, Totalled::Alloc(totals))),
            )
            .chain(
                inuse
                    .into_iter()
                    .flatten()
                    .map(|(key, totals)| (key, Totalled::Inuse(totals))),
            );
        let config = &self.config;
        name_in_batches(symbolizer, all, |stack, key, value| {
            let labels = sample_labels(config, key, &mut names);
            match value {
                Totalled::Cpu(count) => {
                    cpu.add_sample(stack, &labels, count);
                    samples += count;
                }
                Totalled::Blocked((contentions, delay_ns)) => {
                    block.add_blocked(stack, &labels, contentions, delay_ns);
                    looks += 1;
                }
                Totalled::Alloc(totals) => {
                    // Rounded once per stack and labels: the estimates stay unbiased
                    // within half an allocation and half a byte a sample key.
                    let objects = totals.objects.round() as u64;
                    let bytes = totals.bytes.round() as u64;
                    let stack = from_the_allocator(stack);
                    alloc.add_allocations(&stack, &labels, objects, bytes);
                    alloc_samples += totals.samples;
                }
                Totalled::Inuse(totals) => {
                    let objects = totals.objects.round() as u64;
                    let bytes = totals.bytes.round() as u64;
                    alloc.add_inuse(&from_the_allocator(stack), &labels, objects, bytes);
                    held += 1;
                }
            }
        });
        if let Some(exe) = symbolizer.executable_without_debug_info() {
            let note = crate::pprof::proto::NO_INLINE_INFO_COMMENT;
            cpu.comment(format!("{note}{}", exe.display()));
        }
        let (named, clears) = symbolizer.cache_stats();
        let gauge = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        self.stats
            .symbol_cache_entries
            .store(gauge(named), Ordering::Relaxed);
        self.stats
            .symbol_cache_clears
            .store(clears, Ordering::Relaxed);
        let naming = u64::try_from(naming.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats
            .symbolize_nanos
            .fetch_add(naming, Ordering::Relaxed);
        self.stats
            .symbolize_nanos_max
            .fetch_max(naming, Ordering::Relaxed);
        self.check_spans_seen(samples);
        // Nothing ran on a sampled thread (nothing blocked): no file, no upload.
        if samples > 0 {
            self.export(ProfileKind::Cpu, cpu, start, duration, samples);
            self.stats
                .samples_in_profiles
                .fetch_add(samples, Ordering::Relaxed);
        }
        if looks > 0 {
            self.export(ProfileKind::Blocked, block, start, duration, looks);
            self.stats
                .blocked_in_profiles
                .fetch_add(looks, Ordering::Relaxed);
        }
        // In-use memory is reported while it is held, even in an interval that sampled
        // no allocation.
        if alloc_samples > 0 || held > 0 {
            self.export(ProfileKind::Alloc, alloc, start, duration, alloc_samples);
            self.stats
                .alloc_samples_in_profiles
                .fetch_add(alloc_samples, Ordering::Relaxed);
        }
        flush
    }

    /// Once: samples, or spans created an interval ago, and no span ever reached the hooks
    /// (a span's callsite is registered just before the span is made, hence the
    /// interval's grace) — say so.
    fn check_spans_seen(&mut self, samples: u64) {
        if self.span_check_done {
            return;
        }
        let tried = crate::span_context::span_callsite_seen();
        if crate::span_context::span_seen() {
            self.span_check_done = true;
        } else if samples > 0 || self.span_callsites_before {
            self.span_check_done = true;
            eprintln!("{NO_SPANS_WARNING}");
        }
        self.span_callsites_before = tried;
    }

    fn export(
        &mut self,
        kind: ProfileKind,
        builder: ProfileBuilder,
        start: SystemTime,
        duration: Duration,
        samples: u64,
    ) {
        let gzip_pprof = match pprof::encode_gzip(&builder.build()) {
            Ok(bytes) => bytes,
            Err(_) => {
                self.stats.profiles_failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let encoded = EncodedProfile {
            kind,
            start,
            duration,
            samples,
            gzip_pprof,
        };
        for sink in &mut self.sinks {
            match sink.export(&encoded) {
                Ok(()) => self.stats.profiles_exported.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.stats.profiles_failed.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::LabelKey;
    use std::sync::Mutex;

    /// Keeps what it is given.
    struct Keep(Arc<Mutex<Vec<EncodedProfile>>>);

    impl ProfileSink for Keep {
        fn export(&mut self, profile: &EncodedProfile) -> std::io::Result<()> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(profile.clone());
            Ok(())
        }
    }

    /// The hook's frames leave allocation stacks whatever the build named them: the
    /// wrapper's frame is the innermost when a name says it is the wrapper (full debug
    /// info, or `line-tables-only`'s module path and bare method), else the allocator
    /// shim's; the inlined hook lines inside that frame go too.
    #[test]
    fn allocation_stacks_start_at_the_allocator() {
        let frame = |address: u64, names: &[&str]| SymbolizedFrame {
            address,
            lines: names
                .iter()
                .map(|n| crate::pprof::FrameLine {
                    function: Arc::from(*n),
                    file: None,
                    line: None,
                })
                .collect(),
        };
        let names = |stack: &[SymbolizedFrame]| -> Vec<Vec<String>> {
            stack
                .iter()
                .map(|f| f.lines.iter().map(|l| l.function.to_string()).collect())
                .collect()
        };
        let hook = frame(
            1,
            &[
                "otel_profiling::allocations::hook::walk_here",
                "otel_profiling::allocations::hook::record_sample",
            ],
        );
        let pending = frame(4, &["otel_profiling::allocations::hook::Pending::record"]);
        let sampled_path = frame(
            5,
            &["<otel_profiling::allocations::allocator::ProfilingAllocator<A>>::alloc_sampled"],
        );
        let caller = frame(3, &["shop::render"]);
        for wrapper in [
            "<otel_profiling::allocations::allocator::ProfilingAllocator<A> as core::alloc::global::GlobalAlloc>::realloc",
            "otel_profiling::allocations::allocator::realloc",
        ] {
            let shim = frame(
                2,
                &[wrapper, "__rustc::__rust_realloc"],
            );
            let kept = from_the_allocator(&[
                hook.clone(),
                pending.clone(),
                sampled_path.clone(),
                shim,
                caller.clone(),
            ]);
            assert_eq!(
                names(&kept),
                [vec![wrapper.to_owned(), "__rustc::__rust_realloc".to_owned()], vec!["shop::render".to_owned()]]
            );
        }
        // No wrapper name at all (no debug info): from the shim.
        let shim = frame(2, &["__rustc::__rust_alloc"]);
        let kept = from_the_allocator(&[hook.clone(), shim, caller.clone()]);
        assert_eq!(
            names(&kept),
            [
                vec!["__rustc::__rust_alloc".to_owned()],
                vec!["shop::render".to_owned()]
            ]
        );
        // Only the hook's frames (a sample keeping its pc): one frame saying so.
        let kept = from_the_allocator(&[frame(
            1,
            &["otel_profiling::allocations::hook::walk_copied"],
        )]);
        assert_eq!(names(&kept), [vec![ALLOCATION_NOT_WALKED_FRAME.to_owned()]]);
        // Neither: what follows the hook's entry and the allocator's own paths.
        let kept = from_the_allocator(&[
            hook,
            pending,
            sampled_path,
            frame(2, &["alloc::alloc::alloc"]),
            caller,
        ]);
        assert_eq!(
            names(&kept),
            [
                vec!["alloc::alloc::alloc".to_owned()],
                vec!["shop::render".to_owned()]
            ]
        );
    }

    /// Audit U10: one naming pass took every new address of the interval, so a huge
    /// interval left a file's names far past their cap. Batches keep each pass within it,
    /// and every frame of a batch is then a cache hit: without them, the frames past the
    /// cap are named one pass each (87,000 passes here; each a DWARF unit parsed).
    #[test]
    fn a_huge_interval_is_named_in_batches_within_the_cache_cap() {
        let base = 0x7000_0000_0000u64;
        let mut symbolizer = Symbolizer::vdso_only_over(base..base + (1 << 20));
        let stacks = 30_000u64;
        let totals = (0..stacks).map(|i| {
            let frames: Box<[u64]> = (0..4).map(|j| base + 8 * (4 * i + j)).collect();
            ((frames, LabelKey::NONE), i)
        });
        let (mut seen, mut sum) = (0u64, 0u64);
        name_in_batches(&mut symbolizer, totals, |stack, _, value| {
            assert_eq!(stack.len(), 4);
            seen += 1;
            sum += value;
        });
        assert_eq!((seen, sum), (stacks, stacks * (stacks - 1) / 2));
        let (named, clears) = symbolizer.cache_stats();
        assert!(named <= MAX_NAMED_ADDRESSES, "{named}");
        // 120,000 addresses in batches of about 16,000: a pass a batch, a clear every
        // other batch.
        let passes = symbolizer.passes();
        assert!((7..=9).contains(&passes), "{passes} passes");
        assert!((1..=8).contains(&clears), "{clears} clears");
    }

    /// What went past the aggregation cap with no room even for its stack is still in
    /// the profile's total, under one frame that says why.
    #[test]
    fn the_full_key_is_one_named_frame_holding_its_time() {
        let kept = Arc::new(Mutex::new(Vec::new()));
        let stats = Arc::new(CollectorStats::default());
        let mut encoder = Encoder::new(
            CollectorConfig::default(),
            10_000_000,
            vec![Box::new(Keep(kept.clone()))],
            stats.clone(),
            Arc::new(FlushBoard::default()),
        );
        let mut counts = Totals::default();
        counts.insert((Box::from(&AGGREGATION_FULL_STACK[..]), LabelKey::NONE), 7);
        counts.insert((Box::from(&[0x10u64][..]), LabelKey::NONE), 3);
        let flush = encoder.encode(Interval {
            start: SystemTime::now(),
            duration: Duration::from_secs(1),
            counts,
            blocked: Totals::default(),
            allocs: Totals::default(),
            inuse: None,
            flush: 0,
        });
        assert_eq!(flush, 0);
        assert_eq!(stats.samples_in_profiles.load(Ordering::Relaxed), 10);
        let kept = kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let profile = pprof::proto::decode(&kept[0].gzip_pprof).expect("pprof");
        let name = |i: i64| profile.string_table[i as usize].as_str();
        let function = profile
            .function
            .iter()
            .find(|f| name(f.name) == AGGREGATION_FULL_FRAME)
            .expect("the full key's frame");
        let location = profile
            .location
            .iter()
            .find(|l| l.line.iter().any(|line| line.function_id == function.id))
            .expect("its location");
        let values: Vec<i64> = profile
            .sample
            .iter()
            .filter(|s| s.location_id == [location.id])
            .map(|s| s.value[0])
            .collect();
        assert_eq!(values, [7 * 10_000_000]);
    }
}
