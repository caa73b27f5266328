//! Google's pprof `profile.proto` wire types, with the gzip encoding and the decoding (and
//! structural checks) of `otel-profiling`'s profiles, and the splitting of one profile into
//! parts within a server's limits.
//!
//! `otel-profiling` builds profiles with these types internally and hands out only their
//! bytes (gzipped pprof, e.g. `EncodedProfile::gzip_pprof`); this crate is for the programs
//! that read those bytes back (the span report tool, tests, a stand-in server), so the
//! bridge's public API does not expose `prost` messages.
#![warn(missing_docs, unreachable_pub)]

mod proto;
pub mod source;
pub mod split;

use std::io::{self, Read, Write};

use prost::Message;

pub use proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// How a profile's comment begins when the executable it names has no debug info
/// (`debug = 0`, stripped); the executable's path follows. Its inlined functions are then
/// counted in their callers, which the span report says once.
pub const NO_INLINE_INFO_COMMENT: &str = "otel-profiling: no debug info, so no inlined frames, in ";

/// Serialized, gzip-compressed profile bytes (what Pyroscope and `go tool pprof` read).
pub fn encode_gzip(profile: &proto::Profile) -> io::Result<Vec<u8>> {
    let raw = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 4 + 64),
        flate2::Compression::default(),
    );
    gz.write_all(&raw)?;
    gz.finish()
}

/// Decodes plain or gzipped pprof bytes (for tests and the report tool); errors are
/// `io::ErrorKind::InvalidData` with a message.
///
/// Besides the protobuf decoding, checks what readers would otherwise index blindly:
/// `string_table[0] == ""`, every string index in range, and every location, function
/// and mapping id referenced is defined.
pub fn decode(bytes: &[u8]) -> io::Result<proto::Profile> {
    let inflated;
    let raw = if bytes.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::new();
        // Multi-member, as Go's gzip reader (and so `go tool pprof`) accepts.
        flate2::read::MultiGzDecoder::new(bytes)
            .read_to_end(&mut out)
            .map_err(|e| invalid(format!("pprof: bad gzip stream: {e}")))?;
        inflated = out;
        &inflated[..]
    } else {
        bytes
    };
    let profile = proto::Profile::decode(raw)
        .map_err(|e| invalid(format!("pprof: not a profile.proto message: {e}")))?;
    validate(&profile).map_err(|e| invalid(format!("pprof: malformed profile: {e}")))?;
    Ok(profile)
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Structural checks of a decoded profile; the message names the first problem found.
fn validate(p: &proto::Profile) -> Result<(), String> {
    if let Some(first) = p.string_table.first() {
        if !first.is_empty() {
            return Err(format!("string_table[0] is {first:?}, must be \"\""));
        }
    }
    let strings = p.string_table.len();
    let check = |what: &str, index: i64| -> Result<(), String> {
        // Index 0 is "" and allowed even in an empty table (all fields default to 0).
        match usize::try_from(index) {
            Ok(i) if i == 0 || i < strings => Ok(()),
            _ => Err(format!(
                "{what} string index {index} outside table of {strings}"
            )),
        }
    };
    for v in p.sample_type.iter().chain(&p.period_type) {
        check("value type", v.r#type)?;
        check("value type unit", v.unit)?;
    }
    for &i in [
        p.drop_frames,
        p.keep_frames,
        p.default_sample_type,
        p.doc_url,
    ]
    .iter()
    .chain(&p.comment)
    {
        check("profile", i)?;
    }
    for m in &p.mapping {
        check("mapping filename", m.filename)?;
        check("mapping build id", m.build_id)?;
    }
    for f in &p.function {
        check("function name", f.name)?;
        check("function system name", f.system_name)?;
        check("function filename", f.filename)?;
    }
    let mappings: std::collections::HashSet<u64> = p.mapping.iter().map(|m| m.id).collect();
    let functions: std::collections::HashSet<u64> = p.function.iter().map(|f| f.id).collect();
    let locations: std::collections::HashSet<u64> = p.location.iter().map(|l| l.id).collect();
    for l in &p.location {
        if l.mapping_id != 0 && !mappings.contains(&l.mapping_id) {
            return Err(format!(
                "location {} has unknown mapping {}",
                l.id, l.mapping_id
            ));
        }
        if let Some(line) = l
            .line
            .iter()
            .find(|ln| !functions.contains(&ln.function_id))
        {
            return Err(format!(
                "location {} has unknown function {}",
                l.id, line.function_id
            ));
        }
    }
    for s in &p.sample {
        if let Some(id) = s.location_id.iter().find(|id| !locations.contains(id)) {
            return Err(format!("sample refers to unknown location {id}"));
        }
        if s.value.len() != p.sample_type.len() {
            return Err(format!(
                "sample has {} values for {} sample types",
                s.value.len(),
                p.sample_type.len()
            ));
        }
        for label in &s.label {
            check("label key", label.key)?;
            check("label value", label.str)?;
            check("label unit", label.num_unit)?;
        }
    }
    Ok(())
}
