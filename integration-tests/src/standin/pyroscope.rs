//! The Pyroscope half of the stand-in: the Connect push API and the span profile query,
//! with Pyroscope's ingest rules for span labels.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use otel_profiling::pprof::proto::Profile;
use prost::Message;
use serde_json::{json, Value};

use super::selector::{parse_selector, Matcher};

/// `push.v1.PushRequest` (field numbers of grafana/pyroscope `api/push/v1/push.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    /// Series.
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// `push.v1.RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    /// Series labels.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    /// Profiles of the series.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `push.v1.RawSample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    /// pprof bytes, plain or gzipped.
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    /// Client-chosen id.
    #[prost(string, tag = "2")]
    pub id: String,
}

/// One stored pprof sample, as Pyroscope splits it: series labels, per-sample span columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSample {
    /// Profile type id, e.g. `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
    pub profile_type: String,
    /// Series labels (push series labels plus ordinary sample labels, e.g. `span_name`).
    pub labels: BTreeMap<String, String>,
    /// `span_id` sample label (16 lowercase hex), kept out of the series labels.
    pub span_id: Option<String>,
    /// `trace_id` sample label (32 lowercase hex), kept out of the series labels.
    pub trace_id: Option<String>,
    /// Profile timestamp, ms since the Unix epoch.
    pub time_ms: i64,
    /// Function names, root first.
    pub stack: Vec<String>,
    /// Sample value (nanoseconds for CPU).
    pub value: i64,
}

/// All accepted samples.
#[derive(Debug, Default)]
pub struct PyroscopeStore {
    samples: Vec<StoredSample>,
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

fn is_lower_or_upper_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl PyroscopeStore {
    /// Accepted samples.
    pub fn samples(&self) -> &[StoredSample] {
        &self.samples
    }

    /// Decodes and stores a protobuf `PushRequest`; the whole push is rejected on the first
    /// invalid profile (nothing of it is stored).
    pub fn push_protobuf(&mut self, raw: &[u8]) -> Result<(), String> {
        let request =
            PushRequest::decode(raw).map_err(|e| format!("bad PushRequest protobuf: {e}"))?;
        let mut accepted = Vec::new();
        for series in &request.series {
            let mut labels: BTreeMap<String, String> = BTreeMap::new();
            for pair in &series.labels {
                labels.insert(pair.name.clone(), pair.value.clone());
            }
            let name = labels
                .get("__name__")
                .cloned()
                .ok_or("series without a __name__ label")?;
            for raw_sample in &series.samples {
                let profile = otel_profiling::pprof::decode(&raw_sample.raw_profile)
                    .map_err(|e| format!("bad pprof: {e}"))?;
                split_profile(&profile, &name, &labels, &mut accepted)?;
            }
        }
        self.samples.extend(accepted);
        Ok(())
    }

    /// `SelectMergeSpanProfile`: merges the samples of the given profile type, label
    /// selector, span ids and time range into Pyroscope's flame graph.
    pub fn select_merge_span_profile(&self, request: &Value) -> Result<Value, String> {
        let profile_type = request
            .get("profileTypeID")
            .and_then(Value::as_str)
            .ok_or("profileTypeID is required")?;
        let selector = request
            .get("labelSelector")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        let matchers: Vec<Matcher> = parse_selector(selector)?;
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
        let start = json_i64(request.get("start")).ok_or("start (ms) is required")?;
        let end = json_i64(request.get("end")).ok_or("end (ms) is required")?;
        if end < start {
            return Err("end is before start".into());
        }
        let mut tree = Tree::default();
        for sample in &self.samples {
            let selected = sample.profile_type == profile_type
                && matchers.iter().all(|m| m.matches(&sample.labels))
                && sample.span_id.as_ref().is_some_and(|s| spans.contains(s))
                && sample.time_ms >= start
                && sample.time_ms <= end;
            if selected {
                tree.add(&sample.stack, sample.value);
            }
        }
        Ok(json!({ "flamegraph": tree.flame_graph() }))
    }
}

fn json_i64(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Splits one pprof profile into stored samples, applying Pyroscope's label rules.
fn split_profile(
    profile: &Profile,
    name: &str,
    series: &BTreeMap<String, String>,
    out: &mut Vec<StoredSample>,
) -> Result<(), String> {
    let s = |i: i64| -> &str {
        profile
            .string_table
            .get(usize::try_from(i).unwrap_or(usize::MAX))
            .map(String::as_str)
            .unwrap_or("")
    };
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
    for sample in &profile.sample {
        let mut labels = series.clone();
        let mut span_id = None;
        let mut trace_id = None;
        for label in &sample.label {
            let key = s(label.key);
            let value = s(label.str);
            match key {
                // `profile_id` is the legacy name of `span_id`.
                "span_id" | "profile_id" => {
                    if value.len() != 16 {
                        return Err("invalid span id length".into());
                    }
                    if !is_lower_or_upper_hex(value) {
                        return Err("invalid span id".into());
                    }
                    span_id = Some(value.to_ascii_lowercase());
                }
                "trace_id" => {
                    if value.len() != 32 {
                        return Err("invalid trace id length".into());
                    }
                    if !is_lower_or_upper_hex(value) {
                        return Err("invalid trace id".into());
                    }
                    trace_id = Some(value.to_ascii_lowercase());
                }
                _ if label.str != 0 => {
                    labels.insert(key.to_string(), value.to_string());
                }
                _ => {}
            }
        }
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
            out.push(StoredSample {
                profile_type: type_id.clone(),
                labels: labels.clone(),
                span_id: span_id.clone(),
                trace_id: trace_id.clone(),
                time_ms,
                stack: stack.clone(),
                value,
            });
        }
    }
    Ok(())
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

    /// Pyroscope's `FlameGraph`: `names`, `levels[].values` as quadruplets
    /// `[x offset relative to the previous node's end on the level, total, self, name
    /// index]`, `total`, `maxSelf`; int64 fields as JSON strings (Connect/protobuf JSON).
    fn flame_graph(&self) -> Value {
        let mut names: Vec<String> = Vec::new();
        let mut name_index: HashMap<String, usize> = HashMap::new();
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut level_end: Vec<i64> = Vec::new();
        let mut max_self = 0;
        // Depth-first, children in name order: (node, depth, absolute x).
        let mut stack = vec![(0usize, 0usize, 0i64)];
        while let Some((id, depth, x)) = stack.pop() {
            let node = &self.nodes[id];
            if levels.len() <= depth {
                levels.push(Vec::new());
                level_end.push(0);
            }
            let idx = *name_index.entry(node.name.clone()).or_insert_with(|| {
                names.push(node.name.clone());
                names.len() - 1
            });
            levels[depth].extend([
                x - level_end[depth],
                node.total,
                node.self_value,
                idx as i64,
            ]);
            level_end[depth] = x + node.total;
            max_self = max_self.max(node.self_value);
            let mut child_x = x;
            let mut children = Vec::new();
            for &child in node.children.values() {
                children.push((child, depth + 1, child_x));
                child_x += self.nodes[child].total;
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
