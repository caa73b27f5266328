//! pprof (as the collector encodes it) → OTLP `ExportProfilesServiceRequest`.
//!
//! The conversion reads the decoded pprof and writes every sample once per sample type, so
//! the values an OTLP reader sums per link are the pprof's values per `span_id` label by
//! construction (for CPU: counts × period, see [`convert`]).

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::pprof::proto as pprof;
use crate::pprof::{SPAN_ID_KEY, TRACE_ID_KEY};

/// Name of the instrumentation scope the profiles are reported under.
pub const SCOPE_NAME: &str = "otel-profiling";

/// Why a pprof could not be converted (it is not one this crate's collector produced, or
/// it is damaged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// An index in the pprof points outside its table.
    #[error("pprof {table} index {index} is out of range")]
    Index {
        /// The table (`string_table`, `location`, `function`, `mapping`).
        table: &'static str,
        /// The index.
        index: u64,
    },
    /// A sample has a different number of values than the profile has sample types.
    #[error("pprof sample has {values} values for {types} sample types")]
    Values {
        /// Values of the sample.
        values: usize,
        /// Sample types of the profile.
        types: usize,
    },
    /// A table grew past what an OTLP `int32` index can address.
    #[error("OTLP {0} table has more than i32::MAX entries")]
    TooLarge(&'static str),
    /// The bytes are not a pprof profile (bad gzip stream, not a `profile.proto` message,
    /// or a table reference out of range); the message says which.
    #[error("{0}")]
    Decode(String),
}

/// Converts one pprof profile, as bytes (gzipped, as [`EncodedProfile::gzip_pprof`]
/// holds it, or plain), into one OTLP `ExportProfilesServiceRequest`, returned as its
/// protobuf encoding: the body the exporter posts (the message type belongs to the
/// development revision of OTLP profiles, so it is not part of this crate's API).
///
/// [`EncodedProfile::gzip_pprof`]: crate::collector::EncodedProfile::gzip_pprof
pub fn convert(pprof_bytes: &[u8], resource: &[(String, String)]) -> Result<Vec<u8>, ConvertError> {
    let profile =
        crate::pprof::decode(pprof_bytes).map_err(|e| ConvertError::Decode(e.to_string()))?;
    convert_profile(&profile, resource).map(|request| prost::Message::encode_to_vec(&request))
}

/// Converts one decoded pprof into one `ExportProfilesServiceRequest`.
///
/// * One `ResourceProfiles` whose `Resource` carries `resource` (string attributes, in
///   order: `service.name`, `service.version`, …), one `ScopeProfiles` (scope
///   [`SCOPE_NAME`] and this crate's version), and one `Profile` per pprof sample type
///   (OTLP profiles of this revision hold a single `sample_type`), all sharing one
///   `ProfilesDictionary`.
/// * `time_unix_nano`, `duration_nano`, `period_type` and `period` are the pprof's.
/// * A CPU profile (sample type `cpu`/`nanoseconds`, period type `cpu`/`nanoseconds`,
///   every value a multiple of the period, as the collector writes it) is sent as the
///   sample type `samples`/`count` with values = value / period: that is the shape Grafana
///   Pyroscope's OTLP converter recognises as `process_cpu` (it multiplies the counts by the
///   period again), and the one the OpenTelemetry eBPF profiler sends. Anything else keeps
///   its pprof sample type and values.
/// * The pprof labels `span_id` (16 hex digits) and `trace_id` (32) become one dictionary
///   `Link {trace_id, span_id}` per distinct pair, the sample's `link_index`; every other
///   label (`span_name`, …) becomes a sample attribute (string, or int with its unit).
///   A malformed id label is kept as an attribute, not guessed at.
/// * Samples carry no `timestamps_unix_nano`: the collector aggregates each interval, so
///   the only times known are the interval's (`time_unix_nano`, `duration_nano`); a sample
///   whose value for a sample type is 0 is left out of that type's profile.
/// * Every dictionary table starts with its zero value (index 0 = "none"), as the proto
///   requires; functions, locations and mappings keep the pprof's (deduplicated) content.
pub(crate) fn convert_profile(
    profile: &pprof::Profile,
    resource: &[(String, String)],
) -> Result<ExportProfilesServiceRequest, ConvertError> {
    let mut dict = Dictionary::new(&profile.string_table);
    let mappings = dict.mappings(profile)?;
    let functions = dict.functions(profile)?;
    let locations = dict.locations(profile, &mappings, &functions)?;

    let types = profile.sample_type.len();
    let period_type = match &profile.period_type {
        Some(vt) => Some(dict.value_type(vt)?),
        None => None,
    };
    // Per sample: (stack, attributes, link), shared by the profiles of every sample type.
    let mut refs = Vec::with_capacity(profile.sample.len());
    for sample in &profile.sample {
        if sample.value.len() != types {
            return Err(ConvertError::Values {
                values: sample.value.len(),
                types,
            });
        }
        let mut stack = Vec::with_capacity(sample.location_id.len());
        for id in &sample.location_id {
            let index = locations.get(id).ok_or(ConvertError::Index {
                table: "location",
                index: *id,
            })?;
            stack.push(*index);
        }
        let stack_index = dict.stack(stack)?;
        let (attributes, link_index) = dict.labels(sample)?;
        refs.push((stack_index, attributes, link_index));
    }

    let cpu_as_counts = is_cpu_in_whole_periods(profile)?;
    let mut profiles = Vec::with_capacity(types);
    for (t, vt) in profile.sample_type.iter().enumerate() {
        let (sample_type, divisor) = if cpu_as_counts {
            (
                ValueType {
                    type_strindex: dict.string("samples")?,
                    unit_strindex: dict.string("count")?,
                },
                profile.period,
            )
        } else {
            (dict.value_type(vt)?, 1)
        };
        let samples = profile
            .sample
            .iter()
            .zip(&refs)
            .filter(|(sample, _)| sample.value[t] != 0)
            .map(|(sample, (stack_index, attributes, link_index))| Sample {
                stack_index: *stack_index,
                attribute_indices: attributes.clone(),
                link_index: *link_index,
                values: vec![sample.value[t] / divisor],
                timestamps_unix_nano: Vec::new(),
            })
            .collect();
        profiles.push(Profile {
            sample_type: Some(sample_type),
            samples,
            time_unix_nano: u64::try_from(profile.time_nanos).unwrap_or(0),
            duration_nano: u64::try_from(profile.duration_nanos).unwrap_or(0),
            period_type,
            period: profile.period,
            ..Profile::default()
        });
    }

    let resource = Resource {
        attributes: resource
            .iter()
            .map(|(key, value)| string_key_value(key, value))
            .collect(),
        ..Resource::default()
    };
    Ok(ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.finish()),
    })
}

/// Whether `profile` is the collector's CPU profile with every value a whole number of
/// periods (then it is sent as counts; see [`convert`]).
fn is_cpu_in_whole_periods(profile: &pprof::Profile) -> Result<bool, ConvertError> {
    let text = |index: i64| string_at(&profile.string_table, index);
    let is_cpu_ns = |vt: &pprof::ValueType| -> Result<bool, ConvertError> {
        Ok(text(vt.r#type)? == "cpu" && text(vt.unit)? == "nanoseconds")
    };
    let [sample_type] = profile.sample_type.as_slice() else {
        return Ok(false);
    };
    let Some(period_type) = &profile.period_type else {
        return Ok(false);
    };
    Ok(is_cpu_ns(sample_type)?
        && is_cpu_ns(period_type)?
        && profile.period > 0
        && profile
            .sample
            .iter()
            .all(|s| s.value.first().is_some_and(|v| v % profile.period == 0)))
}

fn string_at(table: &[String], index: i64) -> Result<&str, ConvertError> {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .map(String::as_str)
        .ok_or(ConvertError::Index {
            table: "string_table",
            index: index as u64,
        })
}

fn string_key_value(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..KeyValue::default()
    }
}

fn index(len: usize, table: &'static str) -> Result<i32, ConvertError> {
    i32::try_from(len).map_err(|_| ConvertError::TooLarge(table))
}

/// The OTLP dictionary being built, with the maps that deduplicate its entries.
struct Dictionary<'a> {
    pprof_strings: &'a [String],
    out: ProfilesDictionary,
    strings: HashMap<String, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    links: HashMap<(Vec<u8>, Vec<u8>), i32>,
    attributes: HashMap<(i32, AttributeValue, i32), i32>,
}

/// A hashable copy of an attribute's value.
#[derive(Clone, PartialEq, Eq, Hash)]
enum AttributeValue {
    Str(String),
    Int(i64),
}

impl<'a> Dictionary<'a> {
    fn new(pprof_strings: &'a [String]) -> Dictionary<'a> {
        let mut strings = HashMap::new();
        strings.insert(String::new(), 0);
        Dictionary {
            pprof_strings,
            out: ProfilesDictionary {
                // Index 0 of every table is its zero value ("unset").
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Link::default()],
                string_table: vec![String::new()],
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings,
            stacks: HashMap::new(),
            links: HashMap::new(),
            attributes: HashMap::new(),
        }
    }

    fn finish(self) -> ProfilesDictionary {
        self.out
    }

    fn string(&mut self, text: &str) -> Result<i32, ConvertError> {
        if let Some(i) = self.strings.get(text) {
            return Ok(*i);
        }
        let i = index(self.out.string_table.len(), "string")?;
        self.out.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), i);
        Ok(i)
    }

    /// The OTLP string index of pprof string `index`.
    fn pprof_string(&mut self, index: i64) -> Result<i32, ConvertError> {
        let text = string_at(self.pprof_strings, index)?;
        self.string(text)
    }

    fn value_type(&mut self, vt: &pprof::ValueType) -> Result<ValueType, ConvertError> {
        Ok(ValueType {
            type_strindex: self.pprof_string(vt.r#type)?,
            unit_strindex: self.pprof_string(vt.unit)?,
        })
    }

    /// pprof mapping id → OTLP mapping index.
    fn mappings(&mut self, profile: &pprof::Profile) -> Result<HashMap<u64, i32>, ConvertError> {
        let mut ids = HashMap::new();
        for m in &profile.mapping {
            let filename_strindex = self.pprof_string(m.filename)?;
            let i = index(self.out.mapping_table.len(), "mapping")?;
            self.out.mapping_table.push(Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename_strindex,
                attribute_indices: Vec::new(),
            });
            ids.insert(m.id, i);
        }
        Ok(ids)
    }

    /// pprof function id → OTLP function index.
    fn functions(&mut self, profile: &pprof::Profile) -> Result<HashMap<u64, i32>, ConvertError> {
        let mut ids = HashMap::new();
        for f in &profile.function {
            let function = Function {
                name_strindex: self.pprof_string(f.name)?,
                system_name_strindex: self.pprof_string(f.system_name)?,
                filename_strindex: self.pprof_string(f.filename)?,
                start_line: f.start_line,
            };
            let i = index(self.out.function_table.len(), "function")?;
            self.out.function_table.push(function);
            ids.insert(f.id, i);
        }
        Ok(ids)
    }

    /// pprof location id → OTLP location index.
    fn locations(
        &mut self,
        profile: &pprof::Profile,
        mappings: &HashMap<u64, i32>,
        functions: &HashMap<u64, i32>,
    ) -> Result<HashMap<u64, i32>, ConvertError> {
        let mut ids = HashMap::new();
        for l in &profile.location {
            let mapping_index = match l.mapping_id {
                0 => 0,
                id => *mappings.get(&id).ok_or(ConvertError::Index {
                    table: "mapping",
                    index: id,
                })?,
            };
            let mut lines = Vec::with_capacity(l.line.len());
            for line in &l.line {
                let function_index =
                    *functions
                        .get(&line.function_id)
                        .ok_or(ConvertError::Index {
                            table: "function",
                            index: line.function_id,
                        })?;
                lines.push(Line {
                    function_index,
                    line: line.line,
                    column: line.column,
                });
            }
            let i = index(self.out.location_table.len(), "location")?;
            self.out.location_table.push(Location {
                mapping_index,
                address: l.address,
                lines,
                attribute_indices: Vec::new(),
            });
            ids.insert(l.id, i);
        }
        Ok(ids)
    }

    fn stack(&mut self, locations: Vec<i32>) -> Result<i32, ConvertError> {
        if let Some(i) = self.stacks.get(&locations) {
            return Ok(*i);
        }
        let i = index(self.out.stack_table.len(), "stack")?;
        self.out.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        Ok(i)
    }

    fn link(&mut self, trace_id: Vec<u8>, span_id: Vec<u8>) -> Result<i32, ConvertError> {
        let key = (trace_id, span_id);
        if let Some(i) = self.links.get(&key) {
            return Ok(*i);
        }
        let i = index(self.out.link_table.len(), "link")?;
        self.out.link_table.push(Link {
            trace_id: key.0.clone(),
            span_id: key.1.clone(),
        });
        self.links.insert(key, i);
        Ok(i)
    }

    fn attribute(
        &mut self,
        key: &str,
        value: AttributeValue,
        unit: &str,
    ) -> Result<i32, ConvertError> {
        let key_strindex = self.string(key)?;
        let unit_strindex = self.string(unit)?;
        let dedup = (key_strindex, value, unit_strindex);
        if let Some(i) = self.attributes.get(&dedup) {
            return Ok(*i);
        }
        let any = match &dedup.1 {
            AttributeValue::Str(s) => any_value::Value::StringValue(s.clone()),
            AttributeValue::Int(n) => any_value::Value::IntValue(*n),
        };
        let i = index(self.out.attribute_table.len(), "attribute")?;
        self.out.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue { value: Some(any) }),
            unit_strindex,
        });
        self.attributes.insert(dedup, i);
        Ok(i)
    }

    /// A sample's attributes and link (0: none).
    fn labels(&mut self, sample: &pprof::Sample) -> Result<(Vec<i32>, i32), ConvertError> {
        let mut span_id = None;
        let mut trace_id = None;
        let mut attributes = Vec::new();
        for label in &sample.label {
            let key = string_at(self.pprof_strings, label.key)?;
            if label.str != 0 {
                let value = string_at(self.pprof_strings, label.str)?;
                if key == SPAN_ID_KEY {
                    if let Some(bytes) = hex_bytes::<8>(value) {
                        span_id = Some(bytes);
                        continue;
                    }
                } else if key == TRACE_ID_KEY {
                    if let Some(bytes) = hex_bytes::<16>(value) {
                        trace_id = Some(bytes);
                        continue;
                    }
                }
                attributes.push(self.attribute(key, AttributeValue::Str(value.into()), "")?);
            } else {
                let unit = string_at(self.pprof_strings, label.num_unit)?;
                attributes.push(self.attribute(key, AttributeValue::Int(label.num), unit)?);
            }
        }
        let link_index = match (trace_id, span_id) {
            (trace, Some(span)) => {
                self.link(trace.map(|t| t.to_vec()).unwrap_or_default(), span.to_vec())?
            }
            (Some(trace), None) => {
                // A trace without a span: keep the id as an attribute, not as half a link.
                let text = hex(&trace);
                attributes.push(self.attribute(TRACE_ID_KEY, AttributeValue::Str(text), "")?);
                0
            }
            (None, None) => 0,
        };
        Ok((attributes, link_index))
    }
}

/// `N` bytes from exactly `2N` lowercase or uppercase hex digits.
fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        let high = (pair[0] as char).to_digit(16)?;
        let low = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(high << 4 | low).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
    use prost::Message;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    fn frame(address: u64, function: &str) -> SymbolizedFrame {
        SymbolizedFrame {
            address,
            lines: vec![FrameLine {
                function: Arc::from(function),
                file: Some(Arc::from("src/main.rs")),
                line: Some(7),
            }],
        }
    }

    fn labels(span: u64, trace: u128, name: &str) -> SampleLabels {
        SampleLabels {
            span_id: Some(span),
            trace_id: Some(trace),
            span_name: Some(Arc::from(name)),
        }
    }

    fn resource() -> Vec<(String, String)> {
        vec![
            ("service.name".into(), "checkout".into()),
            ("service.version".into(), "1.2".into()),
        ]
    }

    /// Sum of values per (trace id, span id).
    type LinkSums = HashMap<(Vec<u8>, Vec<u8>), i64>;

    /// Sum of values per (trace id, span id) of the profile at `p`, with its sample type.
    fn sums(request: &ExportProfilesServiceRequest, p: usize) -> (String, LinkSums) {
        let dict = request.dictionary.as_ref().expect("dictionary");
        let profile = &request.resource_profiles[0].scope_profiles[0].profiles[p];
        let st = profile.sample_type.as_ref().expect("sample type");
        let name = format!(
            "{}/{}",
            dict.string_table[st.type_strindex as usize],
            dict.string_table[st.unit_strindex as usize]
        );
        let mut out = HashMap::new();
        for s in &profile.samples {
            let link = &dict.link_table[s.link_index as usize];
            *out.entry((link.trace_id.clone(), link.span_id.clone()))
                .or_default() += s.values.iter().sum::<i64>();
        }
        (name, out)
    }

    #[test]
    fn cpu_profile_becomes_links_counts_and_a_dictionary() {
        let period = 10_000_000;
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut b = ProfileBuilder::new(period, start, Duration::from_secs(10));
        let stack_a = [frame(0x10, "app::hot"), frame(0x20, "app::main")];
        let stack_b = [frame(0x30, "app::cold"), frame(0x20, "app::main")];
        b.add_sample(&stack_a, &labels(0xaa, 0x1111, "GET /a"), 3);
        b.add_sample(&stack_b, &labels(0xaa, 0x1111, "GET /a"), 2);
        b.add_sample(&stack_a, &labels(0xbb, 0x2222, "GET /b"), 5);
        b.add_sample(&stack_b, &SampleLabels::default(), 1);
        let pprof = b.build_proto();
        let request = convert_profile(&pprof, &resource()).expect("converts");

        // The bytes decode as the proto's message again (field numbers are prost's own).
        let bytes = request.encode_to_vec();
        let back = ExportProfilesServiceRequest::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(back, request);

        let dict = request.dictionary.as_ref().expect("dictionary");
        assert_eq!(dict.string_table[0], "");
        assert_eq!(dict.link_table[0], Link::default());
        assert_eq!(dict.link_table.len(), 3, "zero link + two spans");
        let span_a = (
            0x1111u128.to_be_bytes().to_vec(),
            0xaau64.to_be_bytes().to_vec(),
        );
        let (kind, per_link) = sums(&request, 0);
        assert_eq!(kind, "samples/count");
        assert_eq!(per_link[&span_a], 5);
        assert_eq!(
            per_link[&(
                0x2222u128.to_be_bytes().to_vec(),
                0xbbu64.to_be_bytes().to_vec()
            )],
            5
        );
        assert_eq!(per_link[&(Vec::new(), Vec::new())], 1, "unlabelled sample");
        let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
        assert_eq!(profile.period, period);
        assert_eq!(profile.time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(profile.duration_nano, 10_000_000_000);
        let pt = profile.period_type.as_ref().expect("period type");
        assert_eq!(dict.string_table[pt.type_strindex as usize], "cpu");
        // span_name is a sample attribute; the ids are not.
        let names: Vec<(&str, String)> = profile
            .samples
            .iter()
            .flat_map(|s| s.attribute_indices.iter())
            .map(|i| {
                let a = &dict.attribute_table[*i as usize];
                let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("unexpected value {other:?}"),
                };
                (dict.string_table[a.key_strindex as usize].as_str(), value)
            })
            .collect();
        assert!(names.iter().all(|(k, _)| *k == "span_name"), "{names:?}");
        assert!(names.contains(&("span_name", "GET /b".into())));
        // Known functions are in the dictionary, stacks leaf first.
        let function_names: Vec<&str> = dict
            .function_table
            .iter()
            .map(|f| dict.string_table[f.name_strindex as usize].as_str())
            .collect();
        for f in ["app::hot", "app::cold", "app::main"] {
            assert!(function_names.contains(&f), "{function_names:?}");
        }
        // Span b ran only `stack_a`: its sample's stack is hot <- main, leaf first.
        let span_b_sample = profile
            .samples
            .iter()
            .find(|s| dict.link_table[s.link_index as usize].span_id == 0xbbu64.to_be_bytes())
            .expect("span b's sample");
        let stack = &dict.stack_table[span_b_sample.stack_index as usize];
        let frames: Vec<&str> = stack
            .location_indices
            .iter()
            .map(|l| {
                let line = &dict.location_table[*l as usize].lines[0];
                let function = &dict.function_table[line.function_index as usize];
                dict.string_table[function.name_strindex as usize].as_str()
            })
            .collect();
        assert_eq!(frames, ["app::hot", "app::main"]);
        let attrs = &request.resource_profiles[0]
            .resource
            .as_ref()
            .expect("resource")
            .attributes;
        assert_eq!(attrs[0].key, "service.name");
    }

    #[test]
    fn blocked_profile_becomes_one_profile_per_sample_type() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut b = ProfileBuilder::blocked(start, Duration::from_secs(10));
        let stack = [frame(0x10, "app::wait")];
        b.add_blocked(&stack, &labels(0xaa, 0x1111, "GET /sleep"), 1, 50_000_000);
        b.add_blocked(&stack, &labels(0xbb, 0x2222, "GET /sleep"), 0, 7_000_000);
        let request = convert_profile(&b.build_proto(), &resource()).expect("converts");
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let (kind, contentions) = sums(&request, 0);
        assert_eq!(kind, "contentions/count");
        assert_eq!(contentions.values().sum::<i64>(), 1);
        assert_eq!(profiles[0].samples.len(), 1, "zero values are left out");
        let (kind, delay) = sums(&request, 1);
        assert_eq!(kind, "delay/nanoseconds");
        assert_eq!(delay.values().sum::<i64>(), 57_000_000);
    }

    #[test]
    fn allocation_profile_becomes_one_profile_per_sample_type() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut b = ProfileBuilder::allocations(524_288, start, Duration::from_secs(10));
        let stack = [frame(0x10, "app::parse")];
        b.add_allocations(
            &stack,
            &labels(0xaa, 0x1111, "POST /json"),
            9_000,
            4_718_592,
        );
        b.add_allocations(&stack, &labels(0xbb, 0x2222, "POST /json"), 1, 8_388_608);
        let request = convert_profile(&b.build_proto(), &resource()).expect("converts");
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let (kind, objects) = sums(&request, 0);
        assert_eq!(kind, "alloc_objects/count");
        assert_eq!(objects.values().sum::<i64>(), 9_001);
        let (kind, space) = sums(&request, 1);
        assert_eq!(kind, "alloc_space/bytes");
        assert_eq!(space.values().sum::<i64>(), 13_107_200);
    }

    /// In-use tracking on: Go's heap layout, four profiles; the in-use ones hold what
    /// each span's allocations still hold.
    #[test]
    fn heap_profile_becomes_four_profiles() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut b = ProfileBuilder::heap(524_288, start, Duration::from_secs(10));
        let stack = [frame(0x10, "app::cache")];
        b.add_allocations(&stack, &labels(0xaa, 0x1111, "GET /"), 9_000, 4_718_592);
        b.add_inuse(&stack, &labels(0xaa, 0x1111, "GET /"), 10, 1_048_576);
        b.add_inuse(&stack, &labels(0xbb, 0x2222, "GET /"), 1, 8_388_608);
        let request = convert_profile(&b.build_proto(), &resource()).expect("converts");
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 4);
        let (kind, objects) = sums(&request, 2);
        assert_eq!(kind, "inuse_objects/count");
        assert_eq!(objects.values().sum::<i64>(), 11);
        let (kind, space) = sums(&request, 3);
        assert_eq!(kind, "inuse_space/bytes");
        assert_eq!(space.values().sum::<i64>(), 9_437_184);
        let (_, allocated) = sums(&request, 1);
        assert_eq!(allocated.values().sum::<i64>(), 4_718_592);
    }

    #[test]
    fn bad_indices_are_errors_not_panics() {
        let mut pprof = ProfileBuilder::new(1, UNIX_EPOCH, Duration::from_secs(1)).build_proto();
        pprof.sample.push(pprof::Sample {
            location_id: vec![99],
            value: vec![1],
            label: Vec::new(),
        });
        assert_eq!(
            convert_profile(&pprof, &[]),
            Err(ConvertError::Index {
                table: "location",
                index: 99
            })
        );
        assert_eq!(hex_bytes::<2>("0aFf"), Some([0x0a, 0xff]));
        assert_eq!(hex_bytes::<2>("0aF"), None);
        assert_eq!(hex_bytes::<2>("0aFg"), None);
    }
}
