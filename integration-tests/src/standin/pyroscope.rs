//! The Pyroscope half of the stand-in: the Connect push API and the span profile query,
//! with Pyroscope's ingest limits and its rules for span labels.
//!
//! A push mirrors grafana/pyroscope v2.2.1 `pkg/distributor/distributor.go`
//! (`Distributor.Push`, `pushSeries`, `visitSampleSeries`, `rateLimit`). Each profile (one
//! `RawSample` of a series) is handled on its own, in this order:
//!
//! 1. decompressed with the size limit (`pprof.RawFromBytesWithLimit`): over it → 400
//!    `uncompressed profile payload size exceeds limit of 4.2 MB`; bytes that are not
//!    gzip/pprof → 500 `unknown` (Pyroscope does not classify that error);
//! 2. `service_name=unknown_service` added when the series has none; the labels sorted;
//! 3. rate limited: the profile costs its series labels' bytes plus its decompressed size,
//!    taken from a token bucket at once (4 MiB/s, burst 2 MiB) → 429
//!    `resource_exhausted`; a profile costing more than the burst is refused every time;
//! 4. `validation.ValidateProfile` (`pkg/validation/validate.go`): samples (`len(Sample)`),
//!    size, labels per sample, structure → 400;
//! 5. `Normalize` (`pkg/pprof/pprof.go`): numeric labels and samples whose values are all
//!    zero (or any negative) dropped;
//! 6. split per series (`pkg/model/pprofsplit/pprof_split.go`, `VisitSampleSeries`):
//!    `profile_id` is renamed `span_id`; samples are grouped by their labels other than
//!    `span_id`/`trace_id`; each group's series labels are the push labels plus its sample
//!    labels, **a series label winning over a sample label of the same name**; every series
//!    is validated (`ValidateLabels`: label count, name/value length, syntax) and **one
//!    failing series rejects the whole profile** (400);
//! 7. stored: `span_id` is kept out of the labels as a per-sample column when it is 16 hex
//!    characters, else the sample is stored with span 0 (`None`), not rejected
//!    (`pkg/pprof/pprof.go`, `spanIDFromLabels`); `trace_id` likewise with 32 hex.
//!
//! Profiles of one push are independent, as in Pyroscope's `PushBatch`: valid ones are
//! stored even when another one fails; the answer is then the first failure's status,
//! code and message (Connect error JSON, `{"code": ..., "message": ...}`), without a
//! `Retry-After` header (Pyroscope sends none). The ingestion time window
//! (`validation.reject-older-than`/`-newer-than`) is not applied.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use otel_profiling_pprof::{Profile, Sample};
// push.v1: the bridge's own message types, the workspace's one codec of them.
use otel_profiling::test_support::push_v1::PushRequest;
use prost::Message;
use serde_json::{json, Value};

use super::limits::{humanize_iec, humanize_si, Limits, PushCounters, TokenBucket};
use super::selector::{parse_selector, Matcher};
use super::validate::{validate_labels, validate_profile, PushRejection};

/// One stored pprof sample, as Pyroscope splits it: series labels, per-sample span columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSample {
    /// Profile type id, e.g. `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
    pub profile_type: String,
    /// Series labels: the push's series labels (sanitized by `ValidateLabels`) plus the
    /// sample's ordinary labels (e.g. `span_name`) that the series did not already have.
    pub labels: BTreeMap<String, String>,
    /// `span_id` sample label (16 hex, lowercased), kept out of the series labels; `None`
    /// is span 0: no label, or one that is not 16 hex characters.
    pub span_id: Option<String>,
    /// `trace_id` sample label (32 hex, lowercased), kept out of the series labels; `None`
    /// when absent or not 32 hex characters.
    pub trace_id: Option<String>,
    /// Profile timestamp, ms since the Unix epoch.
    pub time_ms: i64,
    /// Function names, root first.
    pub stack: Vec<String>,
    /// Sample value (nanoseconds for CPU).
    pub value: i64,
}

/// Accepted samples, the limits they were checked against, the rate limiter's bucket and
/// the counters of accepted and refused profiles.
#[derive(Debug)]
pub struct PyroscopeStore {
    samples: Vec<StoredSample>,
    limits: Limits,
    bucket: TokenBucket,
    counters: PushCounters,
}

impl Default for PyroscopeStore {
    fn default() -> Self {
        PyroscopeStore::with_limits(Limits::default())
    }
}

/// A Connect error response (`{"code": ..., "message": ...}`).
pub fn connect_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        [("content-type", "application/json")],
        json!({ "code": code, "message": message }).to_string(),
    )
        .into_response()
}

/// Pyroscope's `decodeSpanID` (and its trace id twin): exactly `len` hex digits, either
/// case.
fn valid_hex_id(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The decompressed pprof bytes, gzip or plain (`pprof.RawFromBytesWithLimit`): reading
/// stops one byte past `limit` (0 = none), so a bomb is not inflated whole.
fn decompress(raw: &[u8], limit: usize) -> Result<Vec<u8>, PushRejection> {
    let cap = if limit == 0 {
        u64::MAX
    } else {
        limit as u64 + 1
    };
    let mut out = Vec::new();
    if raw.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(raw)
            .take(cap)
            .read_to_end(&mut out)
            .map_err(|e| PushRejection::unknown(format!("gzip: {e}")))?;
    } else {
        out.extend_from_slice(&raw[..raw.len().min(cap as usize)]);
    }
    if limit != 0 && out.len() > limit {
        return Err(PushRejection::invalid(
            Some(super::limits::Reason::ProfileSizeLimit),
            format!(
                "uncompressed profile payload size exceeds limit of {}",
                humanize_si(limit as u64)
            ),
        ));
    }
    Ok(out)
}

impl PyroscopeStore {
    /// An empty store enforcing `limits`.
    pub fn with_limits(limits: Limits) -> PyroscopeStore {
        PyroscopeStore {
            samples: Vec::new(),
            bucket: TokenBucket::new(limits.ingestion_rate_bytes, limits.ingestion_burst_bytes),
            limits,
            counters: PushCounters::default(),
        }
    }

    /// Replaces the limits; the rate limiter starts again with a full bucket.
    pub fn set_limits(&mut self, limits: Limits) {
        self.bucket = TokenBucket::new(limits.ingestion_rate_bytes, limits.ingestion_burst_bytes);
        self.limits = limits;
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Accepted samples.
    pub fn samples(&self) -> &[StoredSample] {
        &self.samples
    }

    /// Counters of accepted and refused profiles.
    pub fn counters(&self) -> &PushCounters {
        &self.counters
    }

    /// Decodes and ingests a protobuf `PushRequest` now; see the module docs.
    pub fn push_protobuf(&mut self, raw: &[u8]) -> Result<(), PushRejection> {
        self.push_protobuf_at(raw, Instant::now())
    }

    /// [`PyroscopeStore::push_protobuf`] with the rate limiter's clock reading `now`.
    pub fn push_protobuf_at(&mut self, raw: &[u8], now: Instant) -> Result<(), PushRejection> {
        let request = PushRequest::decode(raw)
            .map_err(|e| PushRejection::invalid(None, format!("bad PushRequest protobuf: {e}")))?;
        let mut first_error = None;
        let mut profiles = 0;
        for series in &request.series {
            let labels: Vec<(String, String)> = series
                .labels
                .iter()
                .map(|p| (p.name.clone(), p.value.clone()))
                .collect();
            for raw_sample in &series.samples {
                profiles += 1;
                match self.push_profile(labels.clone(), &raw_sample.raw_profile, now) {
                    Ok(()) => self.counters.accepted_profiles += 1,
                    Err(e) => {
                        if let Some(reason) = e.reason {
                            self.counters.reject(reason);
                        }
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        if profiles == 0 {
            return Err(PushRejection::invalid(None, "no profiles received".into()));
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Decodes and ingests an OTLP `ExportProfilesServiceRequest` (protobuf) now: each
    /// profile converted the way Pyroscope's OTLP intake does (see
    /// `super::otlp_profiles`), then steps 1–7 of the module docs as for a push.
    pub fn push_otlp(&mut self, raw: &[u8]) -> Result<(), PushRejection> {
        use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
        let request = ExportProfilesServiceRequest::decode(raw).map_err(|e| {
            PushRejection::invalid(None, format!("Failed to parse protobuf request: {e}"))
        })?;
        self.push_otlp_request(&request)
    }

    /// [`PyroscopeStore::push_otlp`] of a decoded request (the gRPC intake).
    pub fn push_otlp_request(
        &mut self,
        request: &opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest,
    ) -> Result<(), PushRejection> {
        let now = Instant::now();
        let converted = super::otlp_profiles::convert_request(request).map_err(|e| {
            PushRejection::invalid(None, format!("failed to convert otel profile: {e}"))
        })?;
        let mut first_error = None;
        for (labels, profile) in converted {
            match self.push_profile(labels, &profile.encode_to_vec(), now) {
                Ok(()) => self.counters.accepted_profiles += 1,
                Err(e) => {
                    if let Some(reason) = e.reason {
                        self.counters.reject(reason);
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One profile of a push: steps 1–7 of the module docs; nothing is stored unless every
    /// step passes.
    fn push_profile(
        &mut self,
        mut labels: Vec<(String, String)>,
        raw_profile: &[u8],
        now: Instant,
    ) -> Result<(), PushRejection> {
        let plain = decompress(raw_profile, self.limits.max_profile_size_bytes)?;
        let mut profile = Profile::decode(&plain[..])
            .map_err(|e| PushRejection::unknown(format!("bad pprof: {e}")))?;

        let has_service = labels
            .iter()
            .find(|(n, _)| n == "service_name")
            .is_some_and(|(_, v)| !v.is_empty());
        if !has_service {
            labels.push(("service_name".into(), "unknown_service".into()));
        }
        labels.sort_by(|a, b| a.0.cmp(&b.0));

        let cost = labels
            .iter()
            .map(|(n, v)| (n.len() + v.len()) as u64)
            .sum::<u64>()
            + plain.len() as u64;
        if !self.bucket.allow(now, cost) {
            return Err(PushRejection::rate_limited(format!(
                "push rate limit ({}) exceeded while adding {}",
                humanize_iec(self.limits.ingestion_rate_bytes.max(0.0) as u64),
                humanize_iec(cost)
            )));
        }

        validate_profile(&self.limits, &profile, &labels, plain.len(), &plain)?;
        normalize(&mut profile);
        let stored = split_profile(&self.limits, &profile, &labels)?;
        for s in &stored.samples {
            self.counters.span_ids_zeroed += u64::from(s.zeroed_span);
            self.counters.trace_ids_zeroed += u64::from(s.zeroed_trace);
        }
        self.samples
            .extend(stored.samples.into_iter().map(|s| s.sample));
        Ok(())
    }

    /// `SelectMergeSpanProfile`: merges the samples of the given profile type, label
    /// selector, span ids and time range into Pyroscope's flame graph.
    pub fn select_merge_span_profile(&self, request: &Value) -> Result<Value, String> {
        let selection = Selection::from_request(request)?;
        let spans: BTreeSet<String> = request
            .get("spanSelector")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_ascii_lowercase)
                    .collect()
            })
            .unwrap_or_default();
        Ok(self.merge(&selection, |sample| {
            sample.span_id.as_ref().is_some_and(|s| spans.contains(s))
        }))
    }

    /// `SelectMergeStacktraces`: merges every sample of the given profile type, label
    /// selector and time range, whichever span (if any) it ran in, into Pyroscope's flame
    /// graph.
    pub fn select_merge_stacktraces(&self, request: &Value) -> Result<Value, String> {
        let selection = Selection::from_request(request)?;
        Ok(self.merge(&selection, |_| true))
    }

    /// `{"flamegraph": ...}` of the samples `selection` and `keep` both select.
    fn merge(&self, selection: &Selection, keep: impl Fn(&StoredSample) -> bool) -> Value {
        let mut tree = Tree::default();
        for sample in self
            .samples
            .iter()
            .filter(|s| selection.selects(s) && keep(s))
        {
            tree.add(&sample.stack, sample.value);
        }
        json!({ "flamegraph": tree.flame_graph(selection.max_nodes) })
    }

    /// `LabelValues`: the sorted distinct values of label `name` (`__profile_type__`: the
    /// profile type id) among the samples matching any of `matchers` (none: all) within
    /// `[start, end]` (ms; each bound only when given). Samples without the label add
    /// nothing, as Pyroscope returns no empty value.
    pub fn label_values(&self, request: &Value) -> Result<Value, String> {
        let name = request
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or("name is required")?;
        let matchers: Vec<Vec<Matcher>> = match request.get("matchers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|m| {
                    m.as_str()
                        .ok_or_else(|| "matchers must be strings".to_string())
                        .and_then(parse_selector)
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("matchers must be an array of selectors".into()),
        };
        let (start, end) = optional_range(request)?;
        let values: BTreeSet<&str> = self
            .samples
            .iter()
            .filter(|s| start.is_none_or(|t| s.time_ms >= t) && end.is_none_or(|t| s.time_ms <= t))
            .filter(|s| {
                matchers.is_empty()
                    || matchers
                        .iter()
                        .any(|set| set.iter().all(|m| m.matches(&s.labels)))
            })
            .filter_map(|s| match name {
                "__profile_type__" => Some(s.profile_type.as_str()),
                _ => s.labels.get(name).map(String::as_str),
            })
            .filter(|v| !v.is_empty())
            .collect();
        Ok(json!({ "names": values }))
    }

    /// `ProfileTypes`: the profile types of the stored samples (within `[start, end]`, ms,
    /// when given), sorted by id, each split into its five parts
    /// (`name:sampleType:sampleUnit:periodType:periodUnit`).
    pub fn profile_types(&self, request: &Value) -> Result<Value, String> {
        let (start, end) = optional_range(request)?;
        let ids: BTreeSet<&str> = self
            .samples
            .iter()
            .filter(|s| start.is_none_or(|t| s.time_ms >= t) && end.is_none_or(|t| s.time_ms <= t))
            .map(|s| s.profile_type.as_str())
            .collect();
        let types: Vec<Value> = ids
            .into_iter()
            .map(|id| {
                let mut parts = id.splitn(5, ':');
                let mut part = || parts.next().unwrap_or("");
                json!({
                    "ID": id,
                    "name": part(),
                    "sampleType": part(),
                    "sampleUnit": part(),
                    "periodType": part(),
                    "periodUnit": part(),
                })
            })
            .collect();
        Ok(json!({ "profileTypes": types }))
    }
}

/// Pyroscope's default `max_nodes` of a flame graph query
/// (`querier.max-flamegraph-nodes-default`), used when the request has none or 0.
pub const DEFAULT_MAX_NODES: i64 = 8_192;

/// The largest `max_nodes` accepted (`querier.max-flamegraph-nodes-max`).
pub const MAX_MAX_NODES: i64 = 1_048_576;

/// What the select calls share: a profile type, a label selector, a time range (ms, both
/// bounds required and inclusive) and the most flame graph nodes to answer with.
struct Selection {
    profile_type: String,
    matchers: Vec<Matcher>,
    start: i64,
    end: i64,
    max_nodes: usize,
}

impl Selection {
    fn from_request(request: &Value) -> Result<Selection, String> {
        let profile_type = request
            .get("profileTypeID")
            .and_then(Value::as_str)
            .ok_or("profileTypeID is required")?;
        let selector = request
            .get("labelSelector")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        let matchers = parse_selector(selector)?;
        let start = json_i64(request.get("start")).ok_or("start (ms) is required")?;
        let end = json_i64(request.get("end")).ok_or("end (ms) is required")?;
        if end < start {
            return Err("end is before start".into());
        }
        let max_nodes = match request.get("maxNodes") {
            None | Some(Value::Null) => DEFAULT_MAX_NODES,
            v => json_i64(v).ok_or("maxNodes must be an integer")?,
        };
        let max_nodes = match max_nodes {
            0 => DEFAULT_MAX_NODES,
            n if n < 0 => return Err(format!("max_nodes must be positive, got {n}")),
            n if n > MAX_MAX_NODES => {
                return Err(format!(
                    "max_nodes {n} is greater than the limit of {MAX_MAX_NODES}"
                ))
            }
            n => n,
        };
        Ok(Selection {
            profile_type: profile_type.to_string(),
            matchers,
            start,
            end,
            // At most MAX_MAX_NODES: fits any usize.
            max_nodes: usize::try_from(max_nodes).unwrap_or(usize::MAX),
        })
    }

    fn selects(&self, sample: &StoredSample) -> bool {
        sample.profile_type == self.profile_type
            && self.matchers.iter().all(|m| m.matches(&sample.labels))
            && sample.time_ms >= self.start
            && sample.time_ms <= self.end
    }
}

/// The optional `start`/`end` (ms) of `LabelValues` and `ProfileTypes`.
fn optional_range(request: &Value) -> Result<(Option<i64>, Option<i64>), String> {
    let bound = |key: &str| match request.get(key) {
        None | Some(Value::Null) => Ok(None),
        v => json_i64(v)
            .map(Some)
            .ok_or_else(|| format!("{key} (ms) must be an integer")),
    };
    Ok((bound("start")?, bound("end")?))
}

fn json_i64(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// One sample to store, with whether its span or trace id was invalid and so zeroed.
struct SplitSample {
    sample: StoredSample,
    zeroed_span: bool,
    zeroed_trace: bool,
}

/// A profile split into series, every series validated.
struct Split {
    samples: Vec<SplitSample>,
}

/// The part of Pyroscope's `Profile.Normalize` that changes what is stored or validated:
/// numeric labels are dropped, and samples with a negative value or only zeros.
fn normalize(profile: &mut Profile) {
    for s in &mut profile.sample {
        s.label.retain(|l| l.str != 0);
    }
    profile
        .sample
        .retain(|s| s.value.iter().all(|v| *v >= 0) && s.value.iter().any(|v| *v > 0));
}

/// Keys kept out of the series labels (`pprofsplit.VisitSampleSeries`; `profile_id` is
/// the legacy name of `span_id`).
fn is_id_key(key: &str) -> bool {
    matches!(key, "span_id" | "profile_id" | "trace_id")
}

/// Splits a validated, normalized profile into stored samples per series, validating each
/// series' labels; the first invalid series rejects the whole profile.
fn split_profile(
    limits: &Limits,
    profile: &Profile,
    series: &[(String, String)],
) -> Result<Split, PushRejection> {
    let s = |i: i64| -> &str {
        profile
            .string_table
            .get(usize::try_from(i).unwrap_or(usize::MAX))
            .map(String::as_str)
            .unwrap_or("")
    };
    let series_map: BTreeMap<String, String> = series.iter().cloned().collect();
    // Series labels of each sample: a series label wins over a sample label of the same
    // name (`addSampleLabelsToLabelsBuilder` only sets names that are empty so far).
    let label_sets: Vec<BTreeMap<String, String>> = profile
        .sample
        .iter()
        .map(|sample| {
            let mut labels = series_map.clone();
            for l in &sample.label {
                let key = s(l.key);
                if is_id_key(key) || l.str <= 0 {
                    continue;
                }
                if labels.get(key).is_none_or(|v| v.is_empty()) {
                    labels.insert(key.to_string(), s(l.str).to_string());
                }
            }
            labels
        })
        .collect();
    // Validate each distinct series once, in order of first appearance.
    let mut validated: HashMap<&BTreeMap<String, String>, BTreeMap<String, String>> =
        HashMap::new();
    for set in &label_sets {
        if validated.contains_key(set) {
            continue;
        }
        let pairs: Vec<(String, String)> =
            set.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        let ok = validate_labels(limits, pairs)?;
        validated.insert(set, ok.into_iter().collect());
    }

    let name = series_map.get("__name__").map(String::as_str).unwrap_or("");
    let (period_type, period_unit) = profile
        .period_type
        .as_ref()
        .map(|p| (s(p.r#type), s(p.unit)))
        .unwrap_or(("", ""));
    let type_ids: Vec<String> = profile
        .sample_type
        .iter()
        .map(|t| {
            format!(
                "{name}:{}:{}:{period_type}:{period_unit}",
                s(t.r#type),
                s(t.unit)
            )
        })
        .collect();
    let functions: HashMap<u64, &str> =
        profile.function.iter().map(|f| (f.id, s(f.name))).collect();
    let locations: HashMap<u64, Vec<&str>> = profile
        .location
        .iter()
        .map(|l| {
            // Lines are innermost first; a root-first stack wants them reversed.
            let names = l
                .line
                .iter()
                .rev()
                .map(|line| functions.get(&line.function_id).copied().unwrap_or("?"))
                .collect();
            (l.id, names)
        })
        .collect();
    let time_ms = if profile.time_nanos > 0 {
        profile.time_nanos / 1_000_000
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    };
    let mut out = Vec::new();
    for (sample, set) in profile.sample.iter().zip(&label_sets) {
        let labels = validated.get(set).cloned().unwrap_or_default();
        let (span_id, zeroed_span) = id_label(sample, &s, &["span_id", "profile_id"], 16);
        let (trace_id, zeroed_trace) = id_label(sample, &s, &["trace_id"], 32);
        let mut stack: Vec<String> = Vec::new();
        for id in sample.location_id.iter().rev() {
            if let Some(names) = locations.get(id) {
                stack.extend(names.iter().map(|n| n.to_string()));
            }
        }
        for (i, type_id) in type_ids.iter().enumerate() {
            let value = sample.value.get(i).copied().unwrap_or(0);
            if value == 0 {
                continue;
            }
            out.push(SplitSample {
                sample: StoredSample {
                    profile_type: type_id.clone(),
                    labels: labels.clone(),
                    span_id: span_id.clone(),
                    trace_id: trace_id.clone(),
                    time_ms,
                    stack: stack.clone(),
                    value,
                },
                zeroed_span,
                zeroed_trace,
            });
        }
    }
    Ok(Split { samples: out })
}

/// The first valid `len`-hex value of a label named one of `keys` (lowercased), and
/// whether such a label was present but invalid, which Pyroscope stores as id 0
/// (`spanIDFromLabels`, `traceIDFromLabels` in `pkg/pprof/pprof.go`).
fn id_label<'a>(
    sample: &Sample,
    s: &impl Fn(i64) -> &'a str,
    keys: &[&str],
    len: usize,
) -> (Option<String>, bool) {
    let mut present = false;
    for l in &sample.label {
        if !keys.contains(&s(l.key)) {
            continue;
        }
        present = true;
        let value = s(l.str);
        if valid_hex_id(value, len) {
            return (Some(value.to_ascii_lowercase()), false);
        }
    }
    (None, present)
}

#[derive(Debug, Default)]
struct Node {
    name: String,
    total: i64,
    self_value: i64,
    children: BTreeMap<String, usize>,
}

/// A call tree merged from root-first stacks; node 0 is "total".
#[derive(Debug)]
struct Tree {
    nodes: Vec<Node>,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            nodes: vec![Node {
                name: "total".into(),
                ..Node::default()
            }],
        }
    }
}

impl Tree {
    fn add(&mut self, stack: &[String], value: i64) {
        let mut current = 0;
        self.nodes[0].total += value;
        for name in stack {
            let next = match self.nodes[current].children.get(name) {
                Some(&i) => i,
                None => {
                    let i = self.nodes.len();
                    self.nodes.push(Node {
                        name: name.clone(),
                        ..Node::default()
                    });
                    self.nodes[current].children.insert(name.clone(), i);
                    i
                }
            };
            self.nodes[next].total += value;
            current = next;
        }
        self.nodes[current].self_value += value;
    }

    /// The smallest total a node may have to be drawn when at most `max_nodes` are: the
    /// `max_nodes`-th largest total (0 when the tree is small enough, so nothing goes).
    fn min_total(&self, max_nodes: usize) -> i64 {
        let mut totals: Vec<i64> = self.nodes[1..].iter().map(|n| n.total).collect();
        if max_nodes == 0 || totals.len() <= max_nodes {
            return 0;
        }
        totals.sort_unstable_by(|a, b| b.cmp(a));
        totals[max_nodes - 1]
    }

    /// Pyroscope's `FlameGraph`: `names`, `levels[].values` as quadruplets
    /// `[x offset relative to the previous node's end on the level, total, self, name
    /// index]`, `total`, `maxSelf`; int64 fields as JSON strings (Connect/protobuf JSON).
    ///
    /// Over `max_nodes` nodes, the children below the [`Tree::min_total`] of each node are
    /// drawn as one `other` child of their summed total (all of it self), as Pyroscope's
    /// `NewFlameGraph` truncates.
    fn flame_graph(&self, max_nodes: usize) -> Value {
        let min_total = self.min_total(max_nodes);
        let mut names: Vec<String> = Vec::new();
        let mut name_index: HashMap<String, usize> = HashMap::new();
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut level_end: Vec<i64> = Vec::new();
        let mut max_self = 0;
        // The "other" node of a truncated level: not in the tree, so kept aside.
        let other = Node {
            name: "other".into(),
            ..Node::default()
        };
        // Depth-first, children in name order, "other" last: (node, depth, absolute x,
        // the total of an "other" node).
        let mut stack = vec![(Some(0usize), 0usize, 0i64, 0i64)];
        while let Some((id, depth, x, other_total)) = stack.pop() {
            let (node, total, self_value) = match id {
                Some(id) => (
                    &self.nodes[id],
                    self.nodes[id].total,
                    self.nodes[id].self_value,
                ),
                None => (&other, other_total, other_total),
            };
            if levels.len() <= depth {
                levels.push(Vec::new());
                level_end.push(0);
            }
            let idx = *name_index.entry(node.name.clone()).or_insert_with(|| {
                names.push(node.name.clone());
                names.len() - 1
            });
            levels[depth].extend([x - level_end[depth], total, self_value, idx as i64]);
            level_end[depth] = x + total;
            max_self = max_self.max(self_value);
            let mut child_x = x;
            let mut children = Vec::new();
            let mut dropped = 0;
            for &child in node.children.values() {
                let child_total = self.nodes[child].total;
                if child_total < min_total {
                    dropped += child_total;
                    continue;
                }
                children.push((Some(child), depth + 1, child_x, 0));
                child_x += child_total;
            }
            if dropped > 0 {
                children.push((None, depth + 1, child_x, dropped));
            }
            stack.extend(children.into_iter().rev());
        }
        json!({
            "names": names,
            "levels": levels.iter().map(|values| json!({
                "values": values.iter().map(|v| v.to_string()).collect::<Vec<_>>()
            })).collect::<Vec<_>>(),
            "total": self.nodes[0].total.to_string(),
            "maxSelf": max_self.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use otel_profiling::test_support::push_v1::{LabelPair, RawProfileSeries, RawSample};
    use otel_profiling_pprof::{Function, Label, Line, Location, ValueType};

    use super::super::limits::Reason;
    use super::*;

    const SPAN: &str = "0123456789abcdef";
    const TRACE: &str = "0123456789abcdef0123456789abcdef";

    /// A CPU profile of `n` samples of `main`; `labels(i)` gives sample i's labels.
    fn profile<'a>(n: usize, labels: impl Fn(usize) -> Vec<(&'a str, String)>) -> Profile {
        let mut strings: Vec<String> = ["", "cpu", "nanoseconds", "main"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut intern = |s: &str| match strings.iter().position(|x| x == s) {
            Some(i) => i as i64,
            None => {
                strings.push(s.to_string());
                strings.len() as i64 - 1
            }
        };
        let sample = (0..n)
            .map(|i| Sample {
                location_id: vec![1],
                value: vec![10_000_000],
                label: labels(i)
                    .iter()
                    .map(|(k, v)| Label {
                        key: intern(k),
                        str: intern(v),
                        ..Label::default()
                    })
                    .collect(),
            })
            .collect();
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            period_type: Some(ValueType { r#type: 1, unit: 2 }),
            period: 10_000_000,
            sample,
            function: vec![Function {
                id: 1,
                name: 3,
                ..Function::default()
            }],
            location: vec![Location {
                id: 1,
                line: vec![Line {
                    function_id: 1,
                    line: 0,
                    ..Line::default()
                }],
                ..Location::default()
            }],
            string_table: strings,
            time_nanos: 1_700_000_000_000_000_000,
            ..Profile::default()
        }
    }

    fn spans(span: &str, name: &str) -> Vec<(&'static str, String)> {
        vec![
            ("span_id", span.to_string()),
            ("trace_id", TRACE.to_string()),
            ("span_name", name.to_string()),
        ]
    }

    fn series(extra: &[(&str, &str)]) -> Vec<LabelPair> {
        [("__name__", "process_cpu"), ("service_name", "svc")]
            .iter()
            .chain(extra)
            .map(|(n, v)| LabelPair {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    /// A push of one series per `(labels, profiles)`; profiles gzipped as the bridge does.
    fn push_body(parts: Vec<(Vec<LabelPair>, Vec<Profile>)>) -> Vec<u8> {
        PushRequest {
            series: parts
                .into_iter()
                .map(|(labels, profiles)| RawProfileSeries {
                    labels,
                    samples: profiles
                        .iter()
                        .map(|p| RawSample {
                            raw_profile: otel_profiling_pprof::encode_gzip(p).unwrap(),
                            id: String::new(),
                        })
                        .collect(),
                })
                .collect(),
        }
        .encode_to_vec()
    }

    fn one(labels: Vec<LabelPair>, p: Profile) -> Vec<u8> {
        push_body(vec![(labels, vec![p])])
    }

    #[test]
    fn sixteen_thousand_samples_pass_one_more_is_a_400() {
        let mut store = PyroscopeStore::default();
        let now = Instant::now();
        store
            .push_protobuf_at(&one(series(&[]), profile(16_000, |_| vec![])), now)
            .unwrap();
        let e = store
            .push_protobuf_at(&one(series(&[]), profile(16_001, |_| vec![])), now)
            .unwrap_err();
        assert_eq!((e.status, e.code), (400, "invalid_argument"));
        assert_eq!(e.reason, Some(Reason::SamplesLimit));
        assert_eq!(
            e.message,
            "the profile with labels '{__name__=\"process_cpu\", service_name=\"svc\"}' exceeds \
             the samples count limit (max_profile_stacktrace_samples, actual: 16001, limit: 16000)"
        );
        assert_eq!(store.samples().len(), 16_000);
        assert_eq!(store.counters().rejected(Reason::SamplesLimit), 1);
        assert_eq!(store.counters().accepted_profiles, 1);
    }

    #[test]
    fn a_lowered_sample_limit_counts_samples_not_values() {
        let mut store = PyroscopeStore::with_limits(Limits::default().with_max_profile_samples(3));
        assert!(store
            .push_protobuf(&one(series(&[]), profile(3, |_| vec![])))
            .is_ok());
        let e = store
            .push_protobuf(&one(series(&[]), profile(4, |_| vec![])))
            .unwrap_err();
        assert_eq!(e.reason, Some(Reason::SamplesLimit));
    }

    #[test]
    fn over_4_mib_uncompressed_is_a_400_before_the_rate_limiter() {
        let mut store = PyroscopeStore::default();
        let mut p = profile(1, |_| vec![]);
        // A symbol this long compresses to almost nothing: the limit is on inflated bytes.
        p.string_table[3] = "x".repeat(4 * 1024 * 1024);
        let e = store.push_protobuf(&one(series(&[]), p)).unwrap_err();
        assert_eq!((e.status, e.reason), (400, Some(Reason::ProfileSizeLimit)));
        assert_eq!(
            e.message,
            "uncompressed profile payload size exceeds limit of 4.2 MB"
        );
        assert_eq!(store.counters().rejected(Reason::RateLimited), 0);
    }

    #[test]
    fn a_lowered_size_limit_applies_to_plain_and_gzipped_profiles() {
        let p = profile(50, |i| spans(SPAN, &format!("span {i}")));
        let size = p.encode_to_vec().len();
        for limit in [size, size - 1] {
            let mut store =
                PyroscopeStore::with_limits(Limits::default().with_max_profile_size_bytes(limit));
            let gz = store.push_protobuf(&one(series(&[]), p.clone()));
            let plain = PushRequest {
                series: vec![RawProfileSeries {
                    labels: series(&[]),
                    samples: vec![RawSample {
                        raw_profile: p.encode_to_vec(),
                        id: String::new(),
                    }],
                }],
            };
            let plain = store.push_protobuf(&plain.encode_to_vec());
            assert_eq!(gz.is_ok(), limit == size, "{gz:?}");
            assert_eq!(plain.is_ok(), limit == size, "{plain:?}");
        }
    }

    #[test]
    fn a_profile_over_the_burst_is_a_429_every_time() {
        // 2 MiB burst by default: a ~3 MiB profile can never pass, however long one waits.
        let mut store = PyroscopeStore::default();
        let mut p = profile(1, |_| vec![]);
        p.string_table[3] = "x".repeat(3 * 1024 * 1024);
        let body = one(series(&[]), p);
        let t0 = Instant::now();
        for wait in [0, 1, 60, 3_600] {
            let e = store
                .push_protobuf_at(&body, t0 + Duration::from_secs(wait))
                .unwrap_err();
            assert_eq!((e.status, e.code), (429, "resource_exhausted"));
            assert!(
                e.message
                    .starts_with("push rate limit (4.0 MiB) exceeded while adding 3.0 MiB"),
                "{e:?}"
            );
        }
        assert_eq!(store.counters().rejected(Reason::RateLimited), 4);
        assert!(store.samples().is_empty());
    }

    #[test]
    fn the_bucket_drains_and_refills_at_the_rate() {
        let body = one(series(&[]), profile(20, |_| vec![]));
        let request = PushRequest::decode(&body[..]).unwrap();
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&request.series[0].samples[0].raw_profile[..])
            .read_to_end(&mut plain)
            .unwrap();
        // Cost = label bytes + inflated pprof bytes.
        let cost = ("__name__process_cpuservice_namesvc".len() + plain.len()) as u64;
        let limits = Limits::default().with_ingestion_rate(cost as f64, 2 * cost);
        let mut store = PyroscopeStore::with_limits(limits);
        let t0 = Instant::now();
        assert!(store.push_protobuf_at(&body, t0).is_ok());
        assert!(store.push_protobuf_at(&body, t0).is_ok());
        let e = store.push_protobuf_at(&body, t0).unwrap_err();
        assert_eq!(e.status, 429);
        assert!(store
            .push_protobuf_at(&body, t0 + Duration::from_millis(500))
            .is_err());
        assert!(store
            .push_protobuf_at(&body, t0 + Duration::from_millis(1_001))
            .is_ok());
    }

    #[test]
    fn a_span_name_over_2048_bytes_rejects_the_whole_profile() {
        let mut store = PyroscopeStore::default();
        let long = "n".repeat(2049);
        let p = profile(10, |i| spans(SPAN, if i == 9 { &long } else { "GET /" }));
        let e = store.push_protobuf(&one(series(&[]), p)).unwrap_err();
        assert_eq!((e.status, e.reason), (400, Some(Reason::LabelValueTooLong)));
        assert!(
            e.message.contains("has label value too long: 'nnn"),
            "{e:?}"
        );
        assert!(store.samples().is_empty(), "one bad series, nothing stored");
        // 2048 bytes is still fine.
        let ok = "n".repeat(2048);
        let p = profile(10, |i| spans(SPAN, if i == 9 { &ok } else { "GET /" }));
        assert!(store.push_protobuf(&one(series(&[]), p)).is_ok());
        assert_eq!(store.samples().len(), 10);
    }

    #[test]
    fn span_name_counts_towards_thirty_label_names() {
        let names: Vec<String> = (0..28).map(|i| format!("tag{i:02}")).collect();
        let extra: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        let mut store = PyroscopeStore::default();
        // 30 series labels and samples without span_name: accepted.
        assert!(store
            .push_protobuf(&one(
                series(&extra),
                profile(2, |_| vec![("span_id", SPAN.into())])
            ))
            .is_ok());
        // One sample with span_name makes its series 31 names: the whole profile goes.
        let p = profile(2, |i| {
            if i == 1 {
                spans(SPAN, "GET /")
            } else {
                vec![("span_id", SPAN.into())]
            }
        });
        let e = store.push_protobuf(&one(series(&extra), p)).unwrap_err();
        assert_eq!(e.reason, Some(Reason::MaxLabelNamesPerSeries));
        assert!(e.message.ends_with("has 31 label names; limit 30"), "{e:?}");
        assert_eq!(store.samples().len(), 2);
        assert_eq!(store.counters().rejected(Reason::MaxLabelNamesPerSeries), 1);
    }

    #[test]
    fn a_span_id_that_is_not_16_hex_is_stored_as_span_0() {
        let mut store = PyroscopeStore::default();
        let p = profile(5, |i| {
            let span = match i {
                0 => "123456789abcdef".to_string(),   // 15 hex
                1 => "0123456789abcdeg".to_string(),  // not hex
                2 => "0123456789ABCDEF".to_string(),  // upper case is hex
                3 => "0123456789abcdef0".to_string(), // 17
                _ => SPAN.to_string(),
            };
            spans(&span, "GET /")
        });
        store.push_protobuf(&one(series(&[]), p)).unwrap();
        let ids: Vec<Option<&str>> = store
            .samples()
            .iter()
            .map(|s| s.span_id.as_deref())
            .collect();
        assert_eq!(ids, [None, None, Some(SPAN), None, Some(SPAN)]);
        assert_eq!(store.counters().span_ids_zeroed, 3);
        assert_eq!(store.counters().total_rejected(), 0);
        assert!(store
            .samples()
            .iter()
            .all(|s| !s.labels.contains_key("span_id")));
    }

    #[test]
    fn profile_id_is_span_id_and_a_bad_trace_id_is_stored_as_0() {
        let mut store = PyroscopeStore::default();
        let p = profile(1, |_| {
            vec![
                ("profile_id", SPAN.to_string()),
                ("trace_id", "abc".to_string()),
            ]
        });
        store.push_protobuf(&one(series(&[]), p)).unwrap();
        let s = &store.samples()[0];
        assert_eq!(s.span_id.as_deref(), Some(SPAN));
        assert_eq!(s.trace_id, None);
        assert_eq!(store.counters().trace_ids_zeroed, 1);
        assert!(!s.labels.contains_key("profile_id") && !s.labels.contains_key("trace_id"));
    }

    #[test]
    fn a_series_label_wins_over_a_sample_label_of_the_same_name() {
        let mut store = PyroscopeStore::default();
        let p = profile(1, |_| {
            vec![
                ("span_name", "from sample".to_string()),
                ("env", "sample".to_string()),
            ]
        });
        store
            .push_protobuf(&one(series(&[("span_name", "from series")]), p))
            .unwrap();
        let labels = &store.samples()[0].labels;
        assert_eq!(labels["span_name"], "from series");
        assert_eq!(labels["env"], "sample", "other sample labels still join");
    }

    #[test]
    fn profiles_of_one_push_are_judged_one_by_one() {
        let mut store = PyroscopeStore::default();
        let good = profile(3, |_| spans(SPAN, "GET /"));
        let bad = profile(3, |_| spans(SPAN, &"n".repeat(3000)));
        let body = push_body(vec![
            (series(&[]), vec![good.clone(), bad]),
            (series(&[("env", "b")]), vec![good]),
        ]);
        let e = store.push_protobuf(&body).unwrap_err();
        assert_eq!((e.status, e.reason), (400, Some(Reason::LabelValueTooLong)));
        assert_eq!(store.samples().len(), 6, "both good profiles stored");
        assert_eq!(store.counters().accepted_profiles, 2);
        assert_eq!(store.counters().total_rejected(), 1);
    }

    #[test]
    fn service_name_defaults_and_name_is_required() {
        let mut store = PyroscopeStore::default();
        let labels = vec![LabelPair {
            name: "__name__".into(),
            value: "process_cpu".into(),
        }];
        store
            .push_protobuf(&one(labels, profile(1, |_| vec![])))
            .unwrap();
        assert_eq!(store.samples()[0].labels["service_name"], "unknown_service");
        let labels = vec![LabelPair {
            name: "service_name".into(),
            value: "svc".into(),
        }];
        let e = store
            .push_protobuf(&one(labels, profile(1, |_| vec![])))
            .unwrap_err();
        assert_eq!((e.status, e.reason), (400, Some(Reason::InvalidLabels)));
    }

    #[test]
    fn too_many_labels_on_one_sample_is_a_400() {
        let mut store = PyroscopeStore::with_limits(Limits::default().with_max_sample_labels(2));
        let e = store
            .push_protobuf(&one(series(&[]), profile(1, |_| spans(SPAN, "x"))))
            .unwrap_err();
        assert_eq!(e.reason, Some(Reason::SampleLabelsLimit));
    }

    #[test]
    fn bytes_that_are_not_pprof_are_a_500_and_an_empty_push_a_400() {
        let mut store = PyroscopeStore::default();
        let body = PushRequest {
            series: vec![RawProfileSeries {
                labels: series(&[]),
                samples: vec![RawSample {
                    raw_profile: vec![0xff; 7],
                    id: String::new(),
                }],
            }],
        };
        let e = store.push_protobuf(&body.encode_to_vec()).unwrap_err();
        assert_eq!((e.status, e.code), (500, "unknown"));
        let e = store
            .push_protobuf(&PushRequest { series: vec![] }.encode_to_vec())
            .unwrap_err();
        assert_eq!(
            (e.status, e.message.as_str()),
            (400, "no profiles received")
        );
    }

    /// A stored sample of `stack` (`;`-separated), `value` ns, at `time_ms`.
    fn stored(
        profile_type: &str,
        labels: &[(&str, &str)],
        span: Option<&str>,
        time_ms: i64,
        stack: &str,
        value: i64,
    ) -> StoredSample {
        StoredSample {
            profile_type: profile_type.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            span_id: span.map(str::to_string),
            trace_id: None,
            time_ms,
            stack: stack.split(';').map(str::to_string).collect(),
            value,
        }
    }

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    const BLOCKED: &str = "blocked_in_poll:wall:nanoseconds:wall:nanoseconds";

    fn query_store() -> PyroscopeStore {
        let mut store = PyroscopeStore::default();
        let api = [
            ("__name__", "process_cpu"),
            ("service_name", "api"),
            ("service_version", "1.4.0"),
        ];
        let api2 = [
            ("__name__", "process_cpu"),
            ("service_name", "api"),
            ("service_version", "1.5.0"),
        ];
        let db = [
            ("__name__", "process_cpu"),
            ("service_name", "db"),
            ("env", ""),
        ];
        store.samples = vec![
            stored(CPU, &api, Some(SPAN), 1_000, "main;report", 10),
            stored(CPU, &api, None, 2_000, "main;idle", 5),
            stored(
                CPU,
                &api2,
                Some("00000000000000ff"),
                3_000,
                "main;report;paginate",
                7,
            ),
            stored(CPU, &db, None, 4_000, "main;query", 1),
            stored(BLOCKED, &api, Some(SPAN), 1_500, "main;poll", 3),
        ];
        store
    }

    /// (name, total, self) per node of a flame graph answer, level by level.
    fn nodes(answer: &Value) -> Vec<(String, i64, i64)> {
        let fg = &answer["flamegraph"];
        let names: Vec<&str> = fg["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let mut out = Vec::new();
        for level in fg["levels"].as_array().unwrap() {
            let values: Vec<i64> = level["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().parse().unwrap())
                .collect();
            for q in values.chunks(4) {
                out.push((names[q[3] as usize].to_string(), q[1], q[2]));
            }
        }
        out
    }

    #[test]
    fn select_merge_stacktraces_merges_every_span_and_none() {
        let store = query_store();
        let request = json!({
            "profileTypeID": CPU,
            "labelSelector": "{service_name=\"api\"}",
            "start": "0",
            "end": 2_500,
        });
        let answer = store.select_merge_stacktraces(&request).unwrap();
        assert_eq!(answer["flamegraph"]["total"], "15");
        assert_eq!(
            nodes(&answer),
            [
                ("total".to_string(), 15, 0),
                ("main".to_string(), 15, 0),
                ("idle".to_string(), 5, 5),
                ("report".to_string(), 10, 10),
            ]
        );
        // The same samples through the span query: only the one with the span.
        let mut with_span = request.clone();
        with_span["spanSelector"] = json!([SPAN]);
        let spans = store.select_merge_span_profile(&with_span).unwrap();
        assert_eq!(spans["flamegraph"]["total"], "10");
        // The whole range, both versions; the other type and service stay out.
        let all = json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"api\"}", "start": 0, "end": 10_000});
        assert_eq!(
            store.select_merge_stacktraces(&all).unwrap()["flamegraph"]["total"],
            "22"
        );
        for bad in [
            json!({"labelSelector": "{}", "start": 0, "end": 1}),
            json!({"profileTypeID": CPU, "start": 0}),
            json!({"profileTypeID": CPU, "start": 5, "end": 1}),
            json!({"profileTypeID": CPU, "labelSelector": "{a=~\"x\"}", "start": 0, "end": 1}),
            json!({"profileTypeID": CPU, "start": 0, "end": 1, "maxNodes": -1}),
            json!({"profileTypeID": CPU, "start": 0, "end": 1, "maxNodes": "x"}),
        ] {
            assert!(store.select_merge_stacktraces(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn max_nodes_folds_the_smallest_children_into_other() {
        let store = PyroscopeStore {
            samples: vec![
                stored(CPU, &[], None, 0, "main;big", 100),
                stored(CPU, &[], None, 0, "main;small1", 2),
                stored(CPU, &[], None, 0, "main;small2", 3),
            ],
            ..PyroscopeStore::default()
        };
        let request = |max_nodes: Value| json!({"profileTypeID": CPU, "start": 0, "end": 0, "maxNodes": max_nodes});
        let truncated = store
            .select_merge_stacktraces(&request(json!("2")))
            .unwrap();
        assert_eq!(
            nodes(&truncated),
            [
                ("total".to_string(), 105, 0),
                ("main".to_string(), 105, 0),
                ("big".to_string(), 100, 100),
                ("other".to_string(), 5, 5),
            ]
        );
        assert_eq!(truncated["flamegraph"]["maxSelf"], "100");
        // Absent or 0: Pyroscope's default of 8192, far above these four nodes.
        for n in [Value::Null, json!(0), json!(4)] {
            let full = store.select_merge_stacktraces(&request(n)).unwrap();
            assert_eq!(nodes(&full).len(), 5);
        }
    }

    #[test]
    fn label_values_are_sorted_distinct_and_filtered() {
        let store = query_store();
        let values = |request: Value| store.label_values(&request).unwrap()["names"].clone();
        assert_eq!(
            values(json!({"name": "__profile_type__"})),
            json!([BLOCKED, CPU])
        );
        assert_eq!(
            values(json!({"name": "service_name", "matchers": [], "start": "0", "end": "10000"})),
            json!(["api", "db"])
        );
        // Any of the matchers; `env` is empty where present: no value.
        assert_eq!(
            values(
                json!({"name": "service_version", "matchers": ["{service_name=\"db\"}", "{service_version=\"1.5.0\"}"]})
            ),
            json!(["1.5.0"])
        );
        assert_eq!(values(json!({"name": "env"})), json!([]));
        // The time range, inclusive.
        assert_eq!(
            values(json!({"name": "service_version", "start": 2_000, "end": 3_000})),
            json!(["1.4.0", "1.5.0"])
        );
        assert_eq!(
            values(json!({"name": "__profile_type__", "start": 1_200, "end": 1_600})),
            json!([BLOCKED])
        );
        assert!(store.label_values(&json!({"matchers": []})).is_err());
        assert!(store
            .label_values(&json!({"name": "x", "matchers": ["nope"]}))
            .is_err());
        assert!(store
            .label_values(&json!({"name": "x", "matchers": "{}"}))
            .is_err());
    }

    #[test]
    fn profile_types_split_the_stored_ids() {
        let store = query_store();
        let answer = store.profile_types(&json!({})).unwrap();
        assert_eq!(
            answer["profileTypes"][1],
            json!({
                "ID": CPU,
                "name": "process_cpu",
                "sampleType": "cpu",
                "sampleUnit": "nanoseconds",
                "periodType": "cpu",
                "periodUnit": "nanoseconds",
            })
        );
        assert_eq!(answer["profileTypes"][0]["name"], "blocked_in_poll");
        let late = store.profile_types(&json!({"start": 2_000})).unwrap();
        assert_eq!(late["profileTypes"].as_array().map(Vec::len), Some(1));
    }
}
