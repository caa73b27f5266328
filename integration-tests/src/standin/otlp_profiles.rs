//! Pyroscope's OTLP profiles intake, as the stand-in does it: `POST /v1development/profiles`
//! with a protobuf `ExportProfilesServiceRequest` (opentelemetry-proto v1.10.0), converted
//! into pprof profiles and series labels that then take the push path's steps (limits,
//! validation, span columns) unchanged.
//!
//! The conversion follows what grafana/pyroscope `pkg/ingester/otlp/ingest_handler.go` and
//! `convert.go` do (facts, not their code):
//!
//! * a request without a dictionary or without resource profiles is refused (400);
//! * each `Profile` becomes one pprof with its single sample type; its series labels are
//!   `__delta__=false`, `__otel__=true`, `__name__` (below), every string (or int) resource
//!   attribute and then scope attribute under its own key (the first of a key wins; dots
//!   are made underscores by the label validation, as Pyroscope's sanitisation does), and
//!   `service_name` = the resource's `service.name`, else `unknown_service` (with
//!   `:<process.executable.name>` when that is set);
//! * the name: sample type `samples`/`count` with period type `cpu`/`nanoseconds` is
//!   `process_cpu` and its values are multiplied by the period into `cpu`/`nanoseconds`;
//!   `off_cpu`/`nanoseconds` without a period type is `off_cpu`; otherwise the third part of
//!   `type:unit:period_type:period_unit` (the period type), `process_cpu` when there is none;
//! * a sample's attributes become string labels (`service.name` excepted); a `link_index`
//!   ≠ 0 adds `span_id` = hex of the link's span id and, when the trace id has 16 bytes,
//!   `trace_id` = its hex — which the push path then moves into the per-sample span columns;
//! * a sample without values counts its timestamps (value = their number).
//!
//! Samples are not split per sample-level `service.name` (this crate never sets one).

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Profile as OtlpProfile, ProfilesDictionary,
};
use otel_profiling_pprof::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// A converted profile and its series labels.
pub(crate) type Converted = (Vec<(String, String)>, Profile);

/// Converts a request into pprof profiles with their series labels; `Err` is the message
/// of a 400.
pub(crate) fn convert_request(
    request: &ExportProfilesServiceRequest,
) -> Result<Vec<Converted>, String> {
    let dict = request
        .dictionary
        .as_ref()
        .ok_or("missing profile metadata dictionary")?;
    if request.resource_profiles.is_empty() {
        return Err("missing resource profiles".into());
    }
    let mut out = Vec::new();
    for rp in &request.resource_profiles {
        let resource_attrs: &[KeyValue] = rp
            .resource
            .as_ref()
            .map_or(&[], |r| r.attributes.as_slice());
        let service = service_name(resource_attrs);
        for sp in &rp.scope_profiles {
            let scope_attrs: &[KeyValue] =
                sp.scope.as_ref().map_or(&[], |s| s.attributes.as_slice());
            for p in &sp.profiles {
                let (name, profile) = convert_profile(p, dict)?;
                let mut labels = vec![
                    ("__delta__".to_string(), "false".to_string()),
                    ("__otel__".to_string(), "true".to_string()),
                    ("__name__".to_string(), name),
                ];
                for kv in resource_attrs.iter().chain(scope_attrs) {
                    let value = any_text(kv.value.as_ref());
                    if !value.is_empty() && !labels.iter().any(|(k, _)| *k == kv.key) {
                        labels.push((kv.key.clone(), value));
                    }
                }
                labels.push(("service_name".into(), service.clone()));
                out.push((labels, profile));
            }
        }
    }
    Ok(out)
}

fn service_name(attrs: &[KeyValue]) -> String {
    let mut fallback = "unknown_service".to_string();
    for kv in attrs {
        let value = any_text(kv.value.as_ref());
        if kv.key == "service.name" && !value.is_empty() {
            return value;
        }
        if kv.key == "process.executable.name" && !value.is_empty() {
            fallback = format!("{fallback}:{value}");
        }
    }
    fallback
}

/// A string or int value as text (an array of one such value too), else empty.
fn any_text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(any_value::Value::ArrayValue(a)) if a.values.len() == 1 => any_text(a.values.first()),
        _ => String::new(),
    }
}

fn at<'a, T>(table: &'a [T], index: i32, what: &str) -> Result<&'a T, String> {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .ok_or_else(|| format!("{what} index {index} out of bounds"))
}

/// The pprof being built, with its string table.
struct Builder {
    profile: Profile,
    strings: std::collections::HashMap<String, i64>,
    functions: std::collections::HashMap<i32, u64>,
    locations: std::collections::HashMap<i32, u64>,
}

impl Builder {
    fn string(&mut self, text: &str) -> i64 {
        if let Some(i) = self.strings.get(text) {
            return *i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        i
    }
}

fn convert_profile(
    p: &OtlpProfile,
    dict: &ProfilesDictionary,
) -> Result<(String, Profile), String> {
    let text = |i: i32| at(&dict.string_table, i, "string").cloned();
    let st = p.sample_type.as_ref().ok_or("sample type is missing")?;
    let (mut st_type, mut st_unit) = (text(st.type_strindex)?, text(st.unit_strindex)?);
    let (pt_type, pt_unit) = match &p.period_type {
        Some(pt) if p.period != 0 => (text(pt.type_strindex)?, text(pt.unit_strindex)?),
        _ => (String::new(), String::new()),
    };
    let profile_type = format!("{st_type}:{st_unit}:{pt_type}:{pt_unit}");
    let mut multiply = 1;
    let name = if profile_type == "samples:count:cpu:nanoseconds" {
        st_type = "cpu".into();
        st_unit = "nanoseconds".into();
        multiply = p.period;
        "process_cpu".to_string()
    } else if profile_type == "off_cpu:nanoseconds::" {
        "off_cpu".to_string()
    } else {
        match profile_type.split(':').nth(2) {
            Some(third) => third.to_string(),
            None => "process_cpu".to_string(),
        }
    };
    let mut b = Builder {
        profile: Profile {
            time_nanos: i64::try_from(p.time_unix_nano).unwrap_or(0),
            duration_nanos: i64::try_from(p.duration_nano).unwrap_or(0),
            period: p.period,
            ..Profile::default()
        },
        strings: Default::default(),
        functions: Default::default(),
        locations: Default::default(),
    };
    b.string("");
    b.profile.sample_type = vec![ValueType {
        r#type: b.string(&st_type),
        unit: b.string(&st_unit),
    }];
    if let Some(pt) = &p.period_type {
        b.profile.period_type = Some(ValueType {
            r#type: b.string(&text(pt.type_strindex)?),
            unit: b.string(&text(pt.unit_strindex)?),
        });
    }
    // One mapping for everything (the stand-in does not symbolize).
    b.profile.mapping.push(Mapping {
        id: 1,
        has_functions: true,
        ..Mapping::default()
    });
    for s in &p.samples {
        let mut value: Vec<i64> = s.values.clone();
        if value.is_empty() && !s.timestamps_unix_nano.is_empty() {
            value = vec![s.timestamps_unix_nano.len() as i64];
        }
        if value.is_empty() {
            return Err("sample value is required".into());
        }
        for v in &mut value {
            *v *= multiply;
        }
        let mut labels = Vec::new();
        for i in &s.attribute_indices {
            let a = at(&dict.attribute_table, *i, "attribute")?;
            let key = text(a.key_strindex)?;
            let value = any_text(a.value.as_ref());
            if key == "service.name" || value.is_empty() {
                continue;
            }
            labels.push(Label {
                key: b.string(&key),
                str: b.string(&value),
                ..Label::default()
            });
        }
        if s.link_index != 0 {
            let link = at(&dict.link_table, s.link_index, "link")?;
            let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
            labels.push(Label {
                key: b.string("span_id"),
                str: b.string(&hex(&link.span_id)),
                ..Label::default()
            });
            if link.trace_id.len() == 16 {
                labels.push(Label {
                    key: b.string("trace_id"),
                    str: b.string(&hex(&link.trace_id)),
                    ..Label::default()
                });
            }
        }
        let stack = at(&dict.stack_table, s.stack_index, "stack")?;
        let mut location_id = Vec::with_capacity(stack.location_indices.len());
        for li in &stack.location_indices {
            location_id.push(location(&mut b, dict, *li)?);
        }
        b.profile.sample.push(Sample {
            location_id,
            value,
            label: labels,
        });
    }
    Ok((name, b.profile))
}

/// The pprof location id of OTLP location `index` (added on first use).
fn location(b: &mut Builder, dict: &ProfilesDictionary, index: i32) -> Result<u64, String> {
    if let Some(id) = b.locations.get(&index) {
        return Ok(*id);
    }
    let loc = at(&dict.location_table, index, "location")?;
    let mut lines = Vec::with_capacity(loc.lines.len());
    for line in &loc.lines {
        let function_id = match b.functions.get(&line.function_index) {
            Some(id) => *id,
            None => {
                let f = at(&dict.function_table, line.function_index, "function")?;
                let name = at(&dict.string_table, f.name_strindex, "string")?.clone();
                let system = at(&dict.string_table, f.system_name_strindex, "string")?.clone();
                let file = at(&dict.string_table, f.filename_strindex, "string")?.clone();
                let id = b.profile.function.len() as u64 + 1;
                let function = Function {
                    id,
                    name: b.string(&name),
                    system_name: b.string(&system),
                    filename: b.string(&file),
                    start_line: f.start_line,
                };
                b.profile.function.push(function);
                b.functions.insert(line.function_index, id);
                id
            }
        };
        lines.push(Line {
            function_id,
            line: line.line,
            column: line.column,
        });
    }
    let id = b.profile.location.len() as u64 + 1;
    b.profile.location.push(Location {
        id,
        mapping_id: 1,
        address: loc.address,
        line: lines,
        is_folded: false,
    });
    b.locations.insert(index, id);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use otel_profiling::export::otlp_profiles::convert::convert;
    use otel_profiling::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
    use std::time::{Duration, UNIX_EPOCH};

    /// The crate's own conversion read back the Pyroscope way: process_cpu, values × period,
    /// links as span_id/trace_id labels, span_name kept, resource attributes as labels.
    #[test]
    fn our_otlp_profiles_come_back_as_pyroscope_would_store_them() {
        let mut b = ProfileBuilder::new(
            10_000_000,
            UNIX_EPOCH + Duration::from_secs(5),
            Duration::from_secs(10),
        );
        let frame = SymbolizedFrame {
            address: 0x10,
            lines: vec![FrameLine {
                function: "app::hot".into(),
                file: None,
                line: None,
            }],
        };
        let labels = SampleLabels {
            span_id: Some(0xabc),
            trace_id: Some(0x123),
            span_name: Some("GET /x".into()),
        };
        b.add_sample(&[frame], &labels, 3);
        let request = convert(
            &b.build().encode_gzip().expect("encodes"),
            &[
                ("service.name".into(), "svc".into()),
                ("service.version".into(), "1.0".into()),
            ],
        )
        .expect("converts");
        let request = <ExportProfilesServiceRequest as prost::Message>::decode(request.as_slice())
            .expect("an ExportProfilesServiceRequest");
        let converted = convert_request(&request).expect("accepted");
        let [(labels, profile)] = converted.as_slice() else {
            panic!("one profile: {converted:?}");
        };
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("__name__"), Some("process_cpu"));
        assert_eq!(get("service_name"), Some("svc"));
        assert_eq!(get("service.version"), Some("1.0"));
        let s = |i: i64| profile.string_table[i as usize].as_str();
        assert_eq!(s(profile.sample_type[0].r#type), "cpu");
        assert_eq!(profile.sample[0].value, vec![30_000_000]);
        let label = |k: &str| {
            profile.sample[0]
                .label
                .iter()
                .find(|l| s(l.key) == k)
                .map(|l| s(l.str))
        };
        assert_eq!(label("span_id"), Some("0000000000000abc"));
        assert_eq!(label("trace_id"), Some("00000000000000000000000000000123"));
        assert_eq!(label("span_name"), Some("GET /x"));
        let f = &profile.function[0];
        assert_eq!(s(f.name), "app::hot");

        let mut no_dict = request.clone();
        no_dict.dictionary = None;
        assert!(convert_request(&no_dict).is_err());
    }
}
