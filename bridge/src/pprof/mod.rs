//! pprof profile encoding: symbolized CPU samples in, a `profile.proto` message out.
//!
//! [`ProfileBuilder`] collects symbolized stacks with their span labels and produces the
//! shape Grafana Pyroscope expects from a CPU profile:
//!
//! * one sample type and period type, `cpu`/`nanoseconds`, each value = samples × period;
//! * string labels `span_id` (16 lowercase hex digits), `trace_id` (32) and `span_name`,
//!   each only when known;
//! * functions, locations and identical samples deduplicated, one mapping covering all
//!   addresses (the stacks arrive already symbolized, so viewers must not re-symbolize);
//! * samples in a fixed order (labels, then stack), so the same samples encode to the
//!   same bytes whatever order they were added in.
//!
//! [`ProfileBuilder::blocked`] builds the second profile type instead, blocked-in-poll
//! stacks in the shape of Go's block profile: sample types `contentions`/`count` and
//! `delay`/`nanoseconds`, period type `contentions`/`count`, period 1 (see
//! `docs/blocked-in-poll.md`).
//!
//! [`Profile::encode_gzip`] gives the bytes Pyroscope's ingest endpoint and `go tool pprof`
//! read. The protobuf messages themselves are not part of this API: programs that read the
//! bytes back decode them with the `otel-profiling-pprof` crate (or any pprof reader).

#[cfg(test)]
mod tests;

// The wire types, their decoding and the splitting within a server's limits live in the
// `otel-profiling-pprof` crate; inside this crate they are `pprof::proto`, `pprof::decode`
// and `pprof::split`.
pub(crate) use otel_profiling_pprof as proto;
pub(crate) use otel_profiling_pprof::decode;
// The push and OTLP profile exporters split (features `pyroscope`, `otlp-http`).
#[cfg_attr(
    not(any(test, feature = "pyroscope", feature = "otlp-http")),
    allow(unused_imports)
)]
pub(crate) use otel_profiling_pprof::split;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// One source-level frame of a symbolized address (an address can expand to several when
/// functions were inlined; innermost first).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrameLine {
    /// Demangled function name.
    pub function: Arc<str>,
    /// Source file, when debug info had it.
    pub file: Option<Arc<str>>,
    /// Line number, when debug info had it.
    pub line: Option<u32>,
}

/// A symbolized address.
#[derive(Clone, Debug)]
pub struct SymbolizedFrame {
    /// Instruction address.
    pub address: u64,
    /// The source frames of this address, innermost (most deeply inlined) first.
    pub lines: Vec<FrameLine>,
}

/// Labels of one sample. Ordered (span id, trace id, span name; absent first): the order
/// of samples in a built profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SampleLabels {
    /// Span id of the local root span, written as 16 lowercase hex digits.
    pub span_id: Option<u64>,
    /// Trace id, written as 32 lowercase hex digits.
    pub trace_id: Option<u128>,
    /// Span name, written as is.
    pub span_name: Option<Arc<str>>,
}

/// Label key of the span id: the one Pyroscope joins with `pyroscope.profile.id`.
pub const SPAN_ID_KEY: &str = "span_id";
/// Label key of the trace id.
pub const TRACE_ID_KEY: &str = "trace_id";
/// Label key of the span name.
pub const SPAN_NAME_KEY: &str = "span_name";

/// Collects symbolized samples into one pprof CPU profile.
///
/// Stacks are interned as they arrive, so memory grows with the number of distinct
/// stacks × labels, not with the number of samples.
#[derive(Debug)]
pub struct ProfileBuilder {
    /// Which profile: its sample types and how its values are written.
    shape: Shape,
    period_ns: i64,
    time_nanos: i64,
    duration_nanos: i64,
    /// Functions by provisional id − 1, as (name, file).
    functions: Vec<(Arc<str>, Option<Arc<str>>)>,
    function_ids: HashMap<(Arc<str>, Option<Arc<str>>), u64>,
    /// Locations by provisional id − 1.
    locations: Vec<PendingLocation>,
    location_ids: HashMap<u64, u64>,
    samples: Vec<PendingSample>,
    sample_index: HashMap<(Vec<u64>, SampleLabels), usize>,
    has_filenames: bool,
    has_line_numbers: bool,
    has_inline_frames: bool,
    comments: Vec<String>,
}

/// The kinds of profile a [`ProfileBuilder`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `cpu`/`nanoseconds`: counts of periods, multiplied by the period.
    Cpu,
    /// `contentions`/`count`, `delay`/`nanoseconds` (Go's block profile).
    Blocked,
    /// `alloc_objects`/`count`, `alloc_space`/`bytes`, period type `space`/`bytes` (the
    /// allocation half of Go's heap profile).
    Alloc,
    /// Go's whole heap profile: `Alloc`'s two types, then `inuse_objects`/`count`,
    /// `inuse_space`/`bytes`.
    Heap,
}

/// A deduplicated sample: values are multiplied by the period only in `build`.
#[derive(Debug)]
struct PendingSample {
    /// Provisional location ids (arrival order), renumbered in `build`.
    location_ids: Vec<u64>,
    labels: SampleLabels,
    count: u64,
    /// Blocked nanoseconds (blocked profiles), bytes (allocation profiles).
    delay_ns: u64,
    /// In-use (objects, bytes) (heap profiles).
    inuse: (u64, u64),
}

/// A location before `build` numbers it: its address and (provisional function id, line)
/// per source frame, innermost first.
#[derive(Debug)]
struct PendingLocation {
    address: u64,
    lines: Vec<(u64, i64)>,
}

impl ProfileBuilder {
    /// Starts an empty profile.
    ///
    /// `period_ns` = 1e9 / sampling rate (Hz); `start` and `duration` describe the
    /// interval the samples were taken in.
    pub fn new(period_ns: i64, start: SystemTime, duration: Duration) -> ProfileBuilder {
        ProfileBuilder {
            shape: Shape::Cpu,
            period_ns,
            time_nanos: unix_nanos(start),
            duration_nanos: saturating_nanos(duration),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            samples: Vec::new(),
            sample_index: HashMap::new(),
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
            comments: Vec::new(),
        }
    }

    /// Starts an empty blocked-in-poll profile (values: blocks seen, blocked nanoseconds).
    pub fn blocked(start: SystemTime, duration: Duration) -> ProfileBuilder {
        ProfileBuilder {
            shape: Shape::Blocked,
            ..ProfileBuilder::new(1, start, duration)
        }
    }

    /// Starts an empty allocation profile (values: allocations, bytes, both estimates),
    /// sampled every `mean_bytes` on average (the profile's period).
    pub fn allocations(mean_bytes: i64, start: SystemTime, duration: Duration) -> ProfileBuilder {
        ProfileBuilder {
            shape: Shape::Alloc,
            ..ProfileBuilder::new(mean_bytes, start, duration)
        }
    }

    /// Starts an empty heap profile: an allocation profile that also holds in-use memory
    /// (Go's heap profile: `alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`).
    ///
    /// ```
    /// use otel_profiling::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
    /// use std::time::{Duration, SystemTime};
    ///
    /// let mut heap = ProfileBuilder::heap(512 * 1024, SystemTime::now(), Duration::from_secs(10));
    /// let line = FrameLine { function: "shop::cache::fill".into(), file: None, line: None };
    /// let stack = [SymbolizedFrame { address: 0x1000, lines: vec![line] }];
    /// let labels = SampleLabels { span_id: Some(7), ..SampleLabels::default() };
    /// heap.add_allocations(&stack, &labels, 4, 4096);
    /// // Still held: the same sample, its in-use values set.
    /// heap.add_inuse(&stack, &labels, 1, 1024);
    /// assert_eq!(heap.build().sample_count(), 1);
    /// ```
    pub fn heap(mean_bytes: i64, start: SystemTime, duration: Duration) -> ProfileBuilder {
        ProfileBuilder {
            shape: Shape::Heap,
            ..ProfileBuilder::new(mean_bytes, start, duration)
        }
    }

    /// Adds `objects` sampled allocations of `bytes` in all, still alive, under `stack` to
    /// a heap profile. Nothing is added when both are zero.
    pub fn add_inuse(
        &mut self,
        stack: &[SymbolizedFrame],
        labels: &SampleLabels,
        objects: u64,
        bytes: u64,
    ) {
        if objects == 0 && bytes == 0 {
            return;
        }
        self.add_values(stack, labels, 0, 0, (objects, bytes));
    }

    /// Adds `objects` allocations of `bytes` in all under `stack` to an allocation
    /// profile. Nothing is added when both are zero.
    pub fn add_allocations(
        &mut self,
        stack: &[SymbolizedFrame],
        labels: &SampleLabels,
        objects: u64,
        bytes: u64,
    ) {
        if objects == 0 && bytes == 0 {
            return;
        }
        self.add(stack, labels, objects, bytes);
    }

    /// Adds a free-form comment (the profile's `comment` field; `go tool pprof -comments`
    /// prints them).
    pub fn comment(&mut self, text: impl Into<String>) {
        self.comments.push(text.into());
    }

    /// Adds `count` samples of `stack` (innermost frame first) carrying `labels`.
    ///
    /// Samples with the same stack and labels are merged. An address seen before keeps
    /// the lines it was first added with. `count == 0` adds nothing.
    pub fn add_sample(&mut self, stack: &[SymbolizedFrame], labels: &SampleLabels, count: u64) {
        if count == 0 {
            return;
        }
        self.add(stack, labels, count, 0);
    }

    /// Adds blocked time to a blocked-in-poll profile: `contentions` blocks (0 when this
    /// continues a block already counted) and `delay_ns` blocked nanoseconds of `stack`.
    /// Nothing is added when both are zero.
    pub fn add_blocked(
        &mut self,
        stack: &[SymbolizedFrame],
        labels: &SampleLabels,
        contentions: u64,
        delay_ns: u64,
    ) {
        if contentions == 0 && delay_ns == 0 {
            return;
        }
        self.add(stack, labels, contentions, delay_ns);
    }

    fn add(&mut self, stack: &[SymbolizedFrame], labels: &SampleLabels, count: u64, delay: u64) {
        self.add_values(stack, labels, count, delay, (0, 0));
    }

    fn add_values(
        &mut self,
        stack: &[SymbolizedFrame],
        labels: &SampleLabels,
        count: u64,
        delay: u64,
        inuse: (u64, u64),
    ) {
        let location_ids: Vec<u64> = stack.iter().map(|f| self.location_id(f)).collect();
        match self.sample_index.entry((location_ids, labels.clone())) {
            Entry::Occupied(entry) => {
                let sample = &mut self.samples[*entry.get()];
                sample.count = sample.count.saturating_add(count);
                sample.delay_ns = sample.delay_ns.saturating_add(delay);
                sample.inuse.0 = sample.inuse.0.saturating_add(inuse.0);
                sample.inuse.1 = sample.inuse.1.saturating_add(inuse.1);
            }
            Entry::Vacant(entry) => {
                let (location_ids, labels) = entry.key().clone();
                entry.insert(self.samples.len());
                self.samples.push(PendingSample {
                    location_ids,
                    labels,
                    count,
                    delay_ns: delay,
                    inuse,
                });
            }
        }
    }

    /// Finishes the profile.
    ///
    /// The result depends only on the samples added, not on the order they arrived in
    /// (the collector hands them over in hash-map order): samples are sorted by (labels,
    /// stack addresses); locations are numbered in the order the sorted samples first
    /// use them, functions in the order those locations first use them, and strings in
    /// the order the fields below are written. The same samples give the same bytes.
    pub fn build(self) -> Profile {
        Profile(self.build_proto())
    }

    /// [`build`](Self::build), as the wire message (for the collector and the exporters).
    pub(crate) fn build_proto(mut self) -> proto::Profile {
        let mut strings = StringTable::new();
        let mut value_type = |kind: &str, unit: &str| proto::ValueType {
            r#type: strings.intern(kind),
            unit: strings.intern(unit),
        };
        let (sample_type, period_type) = match self.shape {
            Shape::Blocked => {
                // Go's block profile: Pyroscope and Grafana know its two series.
                let contentions = value_type("contentions", "count");
                let delay = value_type("delay", "nanoseconds");
                (vec![contentions.clone(), delay], contentions)
            }
            Shape::Alloc | Shape::Heap => {
                // Go's heap profile (its allocation half without in-use tracking), as
                // Pyroscope names its series (`memory:alloc_space:bytes:space:bytes`,
                // `memory:inuse_space:bytes:space:bytes`).
                let mut types = vec![
                    value_type("alloc_objects", "count"),
                    value_type("alloc_space", "bytes"),
                ];
                if self.shape == Shape::Heap {
                    types.push(value_type("inuse_objects", "count"));
                    types.push(value_type("inuse_space", "bytes"));
                }
                (types, value_type("space", "bytes"))
            }
            Shape::Cpu => {
                let cpu = value_type("cpu", "nanoseconds");
                (vec![cpu.clone()], cpu)
            }
        };
        let mut samples = std::mem::take(&mut self.samples);
        let pending = std::mem::take(&mut self.locations);
        // (labels, stack) is unique after deduplication, so the order is total.
        samples.sort_unstable_by(|a, b| {
            let address = |id: &u64| pending[slot(*id)].address;
            a.labels.cmp(&b.labels).then_with(|| {
                a.location_ids
                    .iter()
                    .map(address)
                    .cmp(b.location_ids.iter().map(address))
            })
        });
        // Provisional id − 1 → final id (0: not numbered yet).
        let mut location_ids = vec![0u64; pending.len()];
        let mut location_order: Vec<usize> = Vec::with_capacity(pending.len());
        for sample in &mut samples {
            for id in &mut sample.location_ids {
                *id = renumber(&mut location_ids, &mut location_order, *id);
            }
        }
        let mut function_ids = vec![0u64; self.functions.len()];
        let mut function_order: Vec<usize> = Vec::with_capacity(self.functions.len());
        let location = location_order
            .iter()
            .zip(1u64..)
            .map(|(&old, id)| {
                let pending = &pending[old];
                proto::Location {
                    id,
                    mapping_id: MAPPING_ID,
                    address: pending.address,
                    line: pending
                        .lines
                        .iter()
                        .map(|&(function, line)| proto::Line {
                            function_id: renumber(&mut function_ids, &mut function_order, function),
                            line,
                            column: 0,
                        })
                        .collect(),
                    is_folded: false,
                }
            })
            .collect();
        let function = function_order
            .iter()
            .zip(1u64..)
            .map(|(&old, id)| {
                let (name, file) = &self.functions[old];
                let name = strings.intern(name);
                proto::Function {
                    id,
                    name,
                    // Names arrive demangled and the mangled form is gone by then.
                    system_name: name,
                    filename: strings.intern(file.as_deref().unwrap_or("")),
                    start_line: 0,
                }
            })
            .collect();
        let sample = samples
            .into_iter()
            .map(|s| proto::Sample {
                value: match self.shape {
                    Shape::Blocked | Shape::Alloc => vec![
                        i64::try_from(s.count).unwrap_or(i64::MAX),
                        i64::try_from(s.delay_ns).unwrap_or(i64::MAX),
                    ],
                    Shape::Heap => [s.count, s.delay_ns, s.inuse.0, s.inuse.1]
                        .iter()
                        .map(|&v| i64::try_from(v).unwrap_or(i64::MAX))
                        .collect(),
                    Shape::Cpu => vec![sample_value(s.count, self.period_ns)],
                },
                label: labels(&mut strings, &s.labels),
                location_id: s.location_ids,
            })
            .collect();
        // Without an executable path the mapping is still needed: it is what carries
        // has_functions, which tells pprof the locations are already symbolized.
        let exe = std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mapping = proto::Mapping {
            id: MAPPING_ID,
            memory_start: 0,
            memory_limit: u64::MAX,
            file_offset: 0,
            filename: strings.intern(&exe),
            build_id: 0,
            has_functions: true,
            has_filenames: self.has_filenames,
            has_line_numbers: self.has_line_numbers,
            has_inline_frames: self.has_inline_frames,
        };
        let comment = self.comments.iter().map(|c| strings.intern(c)).collect();
        proto::Profile {
            sample_type,
            sample,
            mapping: vec![mapping],
            location,
            function,
            string_table: strings.strings,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos: self.time_nanos,
            duration_nanos: self.duration_nanos,
            period_type: Some(period_type),
            period: self.period_ns,
            comment,
            default_sample_type: 0,
            doc_url: 0,
        }
    }

    /// Provisional id of the location of `frame.address`, created on first sight.
    fn location_id(&mut self, frame: &SymbolizedFrame) -> u64 {
        if let Some(&id) = self.location_ids.get(&frame.address) {
            return id;
        }
        let lines = frame
            .lines
            .iter()
            .map(|l| (self.function_id(l), l.line.map_or(0, i64::from)))
            .collect();
        self.has_inline_frames |= frame.lines.len() > 1;
        let id = self.locations.len() as u64 + 1;
        self.locations.push(PendingLocation {
            address: frame.address,
            lines,
        });
        self.location_ids.insert(frame.address, id);
        id
    }

    /// Provisional id of the function of (`line.function`, `line.file`), created on first
    /// sight.
    fn function_id(&mut self, line: &FrameLine) -> u64 {
        self.has_filenames |= line.file.is_some();
        self.has_line_numbers |= line.line.is_some();
        let key = (line.function.clone(), line.file.clone());
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(key.clone());
        self.function_ids.insert(key, id);
        id
    }
}

/// Index of the provisional id `id` (ids start at 1).
fn slot(id: u64) -> usize {
    usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX)
}

/// The final id of provisional id `id`: the next one in `order` when first seen.
fn renumber(ids: &mut [u64], order: &mut Vec<usize>, id: u64) -> u64 {
    let index = slot(id);
    if ids[index] == 0 {
        order.push(index);
        ids[index] = order.len() as u64;
    }
    ids[index]
}

/// The pprof labels of `labels`, in a fixed order.
fn labels(strings: &mut StringTable, labels: &SampleLabels) -> Vec<proto::Label> {
    let mut out = Vec::with_capacity(3);
    if let Some(span_id) = labels.span_id {
        out.push(string_label(
            strings,
            SPAN_ID_KEY,
            &format!("{span_id:016x}"),
        ));
    }
    if let Some(trace_id) = labels.trace_id {
        out.push(string_label(
            strings,
            TRACE_ID_KEY,
            &format!("{trace_id:032x}"),
        ));
    }
    if let Some(name) = &labels.span_name {
        out.push(string_label(strings, SPAN_NAME_KEY, name));
    }
    out
}

fn string_label(strings: &mut StringTable, key: &str, value: &str) -> proto::Label {
    proto::Label {
        key: strings.intern(key),
        str: strings.intern(value),
        num: 0,
        num_unit: 0,
    }
}

/// The single mapping every location points at.
const MAPPING_ID: u64 = 1;

/// A finished pprof profile ([`ProfileBuilder::build`]), ready to encode.
///
/// Its content is read back from the encoded bytes (e.g. with the `otel-profiling-pprof`
/// crate, or `go tool pprof`); this type does not expose the protobuf messages.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile(proto::Profile);

impl Profile {
    /// Serialized, gzip-compressed profile bytes (what Pyroscope and `go tool pprof` read).
    pub fn encode_gzip(&self) -> io::Result<Vec<u8>> {
        proto::encode_gzip(&self.0)
    }

    /// Serialized profile bytes, not compressed (a `profile.proto` message).
    pub fn encode(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(&self.0)
    }

    /// Samples in the profile (distinct stack and labels; each carries its count).
    pub fn sample_count(&self) -> usize {
        self.0.sample.len()
    }
}

/// Serialized, gzip-compressed profile bytes (what Pyroscope and `go tool pprof` read);
/// the same as [`Profile::encode_gzip`].
pub fn encode_gzip(profile: &Profile) -> io::Result<Vec<u8>> {
    profile.encode_gzip()
}

/// The string table under construction: entry 0 is always "".
#[derive(Debug)]
struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, i64>,
}

impl StringTable {
    fn new() -> StringTable {
        StringTable {
            strings: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// Nanoseconds since the Unix epoch, negative before it, saturating at the i64 range.
fn unix_nanos(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => saturating_nanos(after),
        Err(before) => saturating_nanos(before.duration()).saturating_neg(),
    }
}

fn saturating_nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `count` × `period_ns`, saturating rather than wrapping on absurd inputs.
fn sample_value(count: u64, period_ns: i64) -> i64 {
    i64::try_from(count)
        .unwrap_or(i64::MAX)
        .saturating_mul(period_ns)
}
