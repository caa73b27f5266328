//! Splitting one profile into several, each within a sample count and an encoded size, so
//! that a server with per-profile limits (Pyroscope: 16,000 samples, 4 MiB uncompressed)
//! accepts every part.
//!
//! Every sample goes to exactly one part, unchanged (same stack, values and labels); each
//! part carries only the locations, functions, mappings and strings its samples use, and
//! the whole profile's header (sample types, period, time and duration), so merging the
//! parts gives back the original profile. Samples are taken in the order of their stacks
//! from the outermost frame (so parts share as few tables as possible) and a sample is put
//! in a new part when adding it (with whatever tables it brings) would pass either limit.
//! A single sample larger than the byte limit still gets a part of its own.

use std::collections::HashMap;

use prost::Message;

use crate::proto::{Function, Label, Location, Mapping, Profile, Sample, ValueType};

/// Limits each part must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitLimits {
    /// Samples per part at most (`len(sample)`).
    pub max_samples: usize,
    /// Encoded (uncompressed) bytes per part at most.
    pub max_bytes: usize,
}

impl SplitLimits {
    /// Whether `profile` already fits.
    pub fn fits(&self, profile: &Profile) -> bool {
        profile.sample.len() <= self.max_samples && profile.encoded_len() <= self.max_bytes
    }
}

/// Splits `profile` into parts within `limits` (one part, a copy, if it fits already).
pub fn split(profile: &Profile, limits: SplitLimits) -> Vec<Profile> {
    if limits.fits(profile) {
        return vec![profile.clone()];
    }
    let source = Source::new(profile);
    // Samples with the same outer frames go together, so each part repeats as few
    // locations, functions and strings as possible (stacks are innermost first).
    let mut order: Vec<&Sample> = profile.sample.iter().collect();
    order.sort_by(|a, b| a.location_id.iter().rev().cmp(b.location_id.iter().rev()));
    let mut parts = Vec::new();
    let mut part = Part::new(&source);
    for sample in order {
        let cost = part.cost_of(sample, &source);
        let full =
            part.samples() + 1 > limits.max_samples.max(1) || part.bytes + cost > limits.max_bytes;
        if full && part.samples() > 0 {
            parts.push(std::mem::replace(&mut part, Part::new(&source)).finish());
        }
        part.add(sample, &source);
    }
    if part.samples() > 0 || parts.is_empty() {
        parts.push(part.finish());
    }
    parts
}

/// The source profile's tables, indexed by id.
struct Source<'a> {
    profile: &'a Profile,
    locations: HashMap<u64, &'a Location>,
    functions: HashMap<u64, &'a Function>,
    mappings: HashMap<u64, &'a Mapping>,
}

impl<'a> Source<'a> {
    fn new(profile: &'a Profile) -> Source<'a> {
        Source {
            profile,
            locations: profile.location.iter().map(|l| (l.id, l)).collect(),
            functions: profile.function.iter().map(|f| (f.id, f)).collect(),
            mappings: profile.mapping.iter().map(|m| (m.id, m)).collect(),
        }
    }

    fn string(&self, index: i64) -> &'a str {
        let profile: &'a Profile = self.profile;
        usize::try_from(index)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("", String::as_str)
    }
}

/// One part being built: tables re-numbered from 1 (strings from 0, `""` first).
struct Part {
    profile: Profile,
    strings: HashMap<String, i64>,
    locations: HashMap<u64, u64>,
    functions: HashMap<u64, u64>,
    mappings: HashMap<u64, u64>,
    /// Encoded size so far (an upper bound: field keys and lengths included).
    bytes: usize,
}

/// Bytes a length-delimited field adds besides its payload (key + length varint).
fn framed(payload: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(payload as u64) + payload
}

impl Part {
    fn new(source_view: &Source<'_>) -> Part {
        let source = source_view.profile;
        let mut part = Part {
            profile: Profile {
                time_nanos: source.time_nanos,
                duration_nanos: source.duration_nanos,
                period: source.period,
                default_sample_type: source.default_sample_type,
                ..Profile::default()
            },
            strings: HashMap::new(),
            locations: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            bytes: 0,
        };
        part.string("");
        let value_type = |part: &mut Part, vt: &ValueType| ValueType {
            r#type: part.string(source_view.string(vt.r#type)),
            unit: part.string(source_view.string(vt.unit)),
        };
        part.profile.sample_type = source
            .sample_type
            .iter()
            .map(|vt| value_type(&mut part, vt))
            .collect();
        part.profile.period_type = source
            .period_type
            .as_ref()
            .map(|vt| value_type(&mut part, vt));
        part.profile.comment = source
            .comment
            .iter()
            .map(|&c| part.string(source_view.string(c)))
            .collect();
        part.profile.drop_frames = part.string(source_view.string(source.drop_frames));
        part.profile.keep_frames = part.string(source_view.string(source.keep_frames));
        part.profile.doc_url = part.string(source_view.string(source.doc_url));
        part.bytes = part.profile.encoded_len();
        part
    }

    fn samples(&self) -> usize {
        self.profile.sample.len()
    }

    /// Index of `text` in this part's string table, added (and counted) if new.
    fn string(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.bytes += framed(text.len());
        self.profile.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), i);
        i
    }

    /// Bytes adding `sample` would add, tables included (an upper bound).
    fn cost_of<'a>(&self, sample: &Sample, source: &Source<'a>) -> usize {
        let mut bytes = framed(sample.encoded_len() + 8);
        let mut new_strings: Vec<&str> = Vec::new();
        let mut string = |text: &'a str, bytes: &mut usize| {
            if !self.strings.contains_key(text) && !new_strings.contains(&text) {
                new_strings.push(text);
                *bytes += framed(text.len());
            }
        };
        for label in &sample.label {
            string(source.string(label.key), &mut bytes);
            string(source.string(label.str), &mut bytes);
        }
        let mut seen_functions: Vec<u64> = Vec::new();
        for id in &sample.location_id {
            if self.locations.contains_key(id) {
                continue;
            }
            let Some(location) = source.locations.get(id) else {
                continue;
            };
            bytes += framed(location.encoded_len() + 8);
            for line in &location.line {
                if self.functions.contains_key(&line.function_id)
                    || seen_functions.contains(&line.function_id)
                {
                    continue;
                }
                seen_functions.push(line.function_id);
                if let Some(function) = source.functions.get(&line.function_id) {
                    bytes += framed(function.encoded_len() + 8);
                    string(source.string(function.name), &mut bytes);
                    string(source.string(function.system_name), &mut bytes);
                    string(source.string(function.filename), &mut bytes);
                }
            }
            if !self.mappings.contains_key(&location.mapping_id) {
                if let Some(mapping) = source.mappings.get(&location.mapping_id) {
                    bytes += framed(mapping.encoded_len() + 8);
                    string(source.string(mapping.filename), &mut bytes);
                    string(source.string(mapping.build_id), &mut bytes);
                }
            }
        }
        bytes
    }

    fn add(&mut self, sample: &Sample, source: &Source<'_>) {
        let location_id = sample
            .location_id
            .iter()
            .map(|id| self.location(*id, source))
            .collect();
        let label = sample
            .label
            .iter()
            .map(|l| Label {
                key: self.string(source.string(l.key)),
                str: self.string(source.string(l.str)),
                num: l.num,
                num_unit: self.string(source.string(l.num_unit)),
            })
            .collect();
        let sample = Sample {
            location_id,
            value: sample.value.clone(),
            label,
        };
        self.bytes += framed(sample.encoded_len());
        self.profile.sample.push(sample);
    }

    fn location(&mut self, id: u64, source: &Source<'_>) -> u64 {
        if let Some(&new) = self.locations.get(&id) {
            return new;
        }
        let new = self.profile.location.len() as u64 + 1;
        self.locations.insert(id, new);
        let Some(location) = source.locations.get(&id) else {
            return new;
        };
        let mapping_id = if location.mapping_id == 0 {
            0
        } else {
            self.mapping(location.mapping_id, source)
        };
        let line = location
            .line
            .iter()
            .map(|line| {
                let mut line = line.clone();
                line.function_id = self.function(line.function_id, source);
                line
            })
            .collect();
        let location = Location {
            id: new,
            mapping_id,
            address: location.address,
            line,
            is_folded: location.is_folded,
        };
        self.bytes += framed(location.encoded_len());
        self.profile.location.push(location);
        new
    }

    fn function(&mut self, id: u64, source: &Source<'_>) -> u64 {
        if let Some(&new) = self.functions.get(&id) {
            return new;
        }
        let new = self.profile.function.len() as u64 + 1;
        self.functions.insert(id, new);
        let Some(function) = source.functions.get(&id) else {
            return new;
        };
        let function = Function {
            id: new,
            name: self.string(source.string(function.name)),
            system_name: self.string(source.string(function.system_name)),
            filename: self.string(source.string(function.filename)),
            start_line: function.start_line,
        };
        self.bytes += framed(function.encoded_len());
        self.profile.function.push(function);
        new
    }

    fn mapping(&mut self, id: u64, source: &Source<'_>) -> u64 {
        if let Some(&new) = self.mappings.get(&id) {
            return new;
        }
        let new = self.profile.mapping.len() as u64 + 1;
        self.mappings.insert(id, new);
        let Some(mapping) = source.mappings.get(&id) else {
            return new;
        };
        let mut mapping = (*mapping).clone();
        mapping.id = new;
        mapping.filename = self.string(source.string(mapping.filename));
        mapping.build_id = self.string(source.string(mapping.build_id));
        self.bytes += framed(mapping.encoded_len());
        self.profile.mapping.push(mapping);
        new
    }

    fn finish(self) -> Profile {
        self.profile
    }
}
