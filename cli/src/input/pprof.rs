//! `*_cpu.pb.gz` files: pprof profiles resolved into stacks of function names with labels.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use otel_profiling::pprof::{SPAN_ID_KEY, SPAN_NAME_KEY, TRACE_ID_KEY};
use otel_profiling_pprof as proto;

use crate::error::ReportError;
use crate::ids::{SpanId, TraceId};

/// One pprof sample, resolved: its stack as function names and its span labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Function names, innermost first (inlined functions expanded, innermost first).
    pub frames: Vec<Arc<str>>,
    /// CPU time this sample stands for (the sample's `cpu` value: count × period).
    pub cpu_ns: u64,
    /// Number of samples taken (the value divided by the profile's period).
    pub count: u64,
    /// The `span_id` label, when present. The bridge always writes 16 hex digits; a value
    /// that is not a span id is read as no label.
    pub span_id: Option<SpanId>,
    /// The `trace_id` label, when present (32 hex digits; otherwise read as no label).
    pub trace_id: Option<TraceId>,
    /// The `span_name` label, when present.
    pub span_name: Option<Arc<str>>,
    /// The time its profile covers, `[start, end)` in ns since the Unix epoch (`None` when
    /// the profile does not say): when within it the sample was taken is not recorded.
    pub window: Option<(u64, u64)>,
}

/// A decoded profile file.
#[derive(Clone, Debug, Default)]
pub struct ProfileFile {
    /// Sampling period in nanoseconds (0 when the profile does not say).
    pub period_ns: u64,
    /// Its samples.
    pub samples: Vec<Sample>,
    /// The source file of each function that has one (from the function table).
    pub sources: HashMap<Arc<str>, Arc<str>>,
    /// Executables the profile says have no debug info (see
    /// [`proto::NO_INLINE_INFO_COMMENT`]): their inlined functions count in their callers.
    pub without_debug_info: Vec<String>,
    /// The time the profile covers, `[start, end)` in ns since the Unix epoch, when it
    /// says: a sampler ran over it, samples or not.
    pub window: Option<(u64, u64)>,
}

/// Reads and resolves one gzipped (or plain) pprof file.
pub fn read_profile(path: &Path) -> Result<ProfileFile, ReportError> {
    read_profile_value(path, "cpu")
}

/// Reads one pprof file, taking each sample's value of sample type `value` (the first one
/// when none has that name) into [`Sample::cpu_ns`].
pub fn read_profile_value(path: &Path, value: &str) -> Result<ProfileFile, ReportError> {
    Ok(resolve_value(&decode_file(path)?, value))
}

/// The profile in the pprof file at `path` (gzipped or not).
pub fn decode_file(path: &Path) -> Result<proto::Profile, ReportError> {
    let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    proto::decode(&bytes).map_err(|e| ReportError::CorruptProfile {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Whether `profile` has a sample type named `value`.
pub fn has_value(profile: &proto::Profile, value: &str) -> bool {
    profile.sample_type.iter().any(|t| {
        usize::try_from(t.r#type)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .is_some_and(|name| name == value)
    })
}

/// Turns location and function ids into names, and label string indexes into strings.
pub fn resolve(profile: &proto::Profile) -> ProfileFile {
    resolve_value(profile, "cpu")
}

/// [`resolve`], taking the values of sample type `value`.
pub fn resolve_value(profile: &proto::Profile, value: &str) -> ProfileFile {
    let strings = &profile.string_table;
    let string = |index: i64| -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| strings.get(i))
            .map_or("", String::as_str)
    };
    let functions: HashMap<u64, Arc<str>> = profile
        .function
        .iter()
        .map(|f| (f.id, Arc::from(string(f.name))))
        .collect();
    let sources: HashMap<Arc<str>, Arc<str>> = profile
        .function
        .iter()
        .filter(|f| !string(f.filename).is_empty() && !string(f.name).is_empty())
        .map(|f| (Arc::from(string(f.name)), Arc::from(string(f.filename))))
        .collect();
    let locations: HashMap<u64, Vec<Arc<str>>> = profile
        .location
        .iter()
        .map(|l| {
            let unknown = || Arc::<str>::from(format!("0x{:x}", l.address));
            let names = if l.line.is_empty() {
                vec![unknown()]
            } else {
                l.line
                    .iter()
                    .map(|line| match functions.get(&line.function_id) {
                        Some(name) if !name.is_empty() => name.clone(),
                        _ => unknown(),
                    })
                    .collect()
            };
            (l.id, names)
        })
        .collect();
    let value_index = profile
        .sample_type
        .iter()
        .position(|t| string(t.r#type) == value)
        .unwrap_or(0);
    let cpu_index = profile
        .sample_type
        .iter()
        .position(|t| string(t.r#type) == "cpu")
        .unwrap_or(0);
    let period_ns = u64::try_from(profile.period).unwrap_or(0);
    let window = match (
        u64::try_from(profile.time_nanos),
        u64::try_from(profile.duration_nanos),
    ) {
        (Ok(start), Ok(duration)) if start > 0 && duration > 0 => {
            Some((start, start.saturating_add(duration)))
        }
        _ => None,
    };
    // Label values repeat across samples: share one allocation per distinct string.
    let mut interned: HashMap<i64, Arc<str>> = HashMap::new();
    let mut label = |index: i64| -> Arc<str> {
        interned
            .entry(index)
            .or_insert_with(|| Arc::from(string(index)))
            .clone()
    };
    let samples = profile
        .sample
        .iter()
        .map(|s| {
            let cpu_ns = s
                .value
                .get(value_index)
                .and_then(|&v| u64::try_from(v).ok())
                .unwrap_or(0);
            let mut sample = Sample {
                frames: s
                    .location_id
                    .iter()
                    .filter_map(|id| locations.get(id))
                    .flatten()
                    .cloned()
                    .collect(),
                cpu_ns,
                // CPU: samples = value / period. Another profile type counts its events in
                // its first value (a blocked profile's `contentions`).
                count: if value_index == cpu_index {
                    cpu_ns.checked_div(period_ns).unwrap_or(1)
                } else {
                    s.value
                        .first()
                        .and_then(|&v| u64::try_from(v).ok())
                        .unwrap_or(1)
                },
                span_id: None,
                trace_id: None,
                span_name: None,
                window,
            };
            for l in &s.label {
                match string(l.key) {
                    SPAN_ID_KEY => sample.span_id = string(l.str).parse().ok(),
                    TRACE_ID_KEY => sample.trace_id = string(l.str).parse().ok(),
                    SPAN_NAME_KEY => sample.span_name = Some(label(l.str)),
                    _ => {}
                }
            }
            sample
        })
        .collect();
    let without_debug_info = profile
        .comment
        .iter()
        .filter_map(|&c| string(c).strip_prefix(proto::NO_INLINE_INFO_COMMENT))
        .map(str::to_owned)
        .collect();
    ProfileFile {
        period_ns,
        samples,
        sources,
        without_debug_info,
        window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_without_lines_are_named_by_address() {
        let profile = proto::Profile {
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
            string_table: vec![
                "".into(),
                "cpu".into(),
                "nanoseconds".into(),
                "span_id".into(),
                "00000000000000ff".into(),
                "f".into(),
            ],
            function: vec![proto::Function {
                id: 1,
                name: 5,
                ..Default::default()
            }],
            location: vec![
                proto::Location {
                    id: 1,
                    address: 0xabc,
                    ..Default::default()
                },
                proto::Location {
                    id: 2,
                    line: vec![proto::Line {
                        function_id: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            sample: vec![proto::Sample {
                location_id: vec![1, 2],
                value: vec![30],
                label: vec![proto::Label {
                    key: 3,
                    str: 4,
                    ..Default::default()
                }],
            }],
            period: 10,
            ..Default::default()
        };
        let resolved = resolve(&profile);
        assert_eq!(resolved.period_ns, 10);
        let sample = &resolved.samples[0];
        let frames: Vec<&str> = sample.frames.iter().map(|f| &**f).collect();
        assert_eq!(frames, ["0xabc", "f"]);
        assert_eq!((sample.cpu_ns, sample.count), (30, 3));
        assert_eq!(sample.span_id, Some(SpanId::from(0xff)));
        assert_eq!(sample.span_name, None);
    }
}
