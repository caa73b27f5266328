//! Span and trace ids: 8 and 16 bytes, written as 16 and 32 lowercase hex digits (as OTLP
//! JSON and the profiles' `span_id` / `trace_id` labels write them).

use std::fmt;
use std::str::FromStr;

/// A span id: 8 bytes, shown as 16 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId([u8; 8]);

/// A trace id: 16 bytes, shown as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId([u8; 16]);

/// An id that is not the right number of hex digits, naming the field it was read from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {text:?} is not {digits} hex digits")]
pub struct IdError {
    /// Where the text came from (`spanId`, `traceId`, `parentSpanId`, ...).
    pub field: String,
    /// The text as given.
    pub text: String,
    /// The digits an id of this kind has.
    pub digits: usize,
}

/// `text` as `N` bytes from `2 N` hex digits of either case.
fn parse_hex<const N: usize>(text: &str, field: &str) -> Result<[u8; N], IdError> {
    let error = || IdError {
        field: field.to_owned(),
        text: text.to_owned(),
        digits: 2 * N,
    };
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return Err(error());
    }
    let nibble = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => *byte = hi << 4 | lo,
            _ => return Err(error()),
        }
    }
    Ok(out)
}

fn write_hex(bytes: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

macro_rules! id_type {
    ($name:ident, $bytes:literal, $what:literal) => {
        impl $name {
            /// Reads `text` (hex digits of either case), naming `field` in the error.
            pub fn parse(text: &str, field: &str) -> Result<$name, IdError> {
                parse_hex(text, field).map($name)
            }

            /// The id's bytes.
            pub fn to_bytes(self) -> [u8; $bytes] {
                self.0
            }
        }

        impl From<[u8; $bytes]> for $name {
            fn from(bytes: [u8; $bytes]) -> $name {
                $name(bytes)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            /// As [`parse`](Self::parse), the error naming the kind of id.
            fn from_str(text: &str) -> Result<$name, IdError> {
                $name::parse(text, $what)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_hex(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self)
            }
        }
    };
}

id_type!(SpanId, 8, "span id");
id_type!(TraceId, 16, "trace id");

impl From<u64> for SpanId {
    fn from(id: u64) -> SpanId {
        SpanId(id.to_be_bytes())
    }
}

impl From<u128> for TraceId {
    fn from(id: u128) -> TraceId {
        TraceId(id.to_be_bytes())
    }
}

/// A test's span id from a short name (up to 8 bytes; `"a"` is `0000000000000061`).
#[cfg(test)]
pub(crate) fn test_span_id(name: &str) -> SpanId {
    assert!(name.len() <= 8, "{name}");
    SpanId::from(name.bytes().fold(0u64, |id, b| id << 8 | u64::from(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_of_either_case_in_lowercase_out() {
        let id = SpanId::parse("00000000000000AB", "spanId").expect("id");
        assert_eq!(id, SpanId::from(0xab));
        assert_eq!(id.to_string(), "00000000000000ab");
        assert_eq!(format!("{id:?}"), "SpanId(00000000000000ab)");
        let t: TraceId = "0102030405060708090A0B0C0D0E0F10"
            .parse()
            .expect("trace id");
        assert_eq!(t.to_string(), "0102030405060708090a0b0c0d0e0f10");
        assert_eq!(t, TraceId::from(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10));
    }

    #[test]
    fn errors_name_the_field() {
        let err = TraceId::parse("01", "traceId").expect_err("short");
        assert_eq!(err.to_string(), "traceId \"01\" is not 32 hex digits");
        let err = "000000000000000g".parse::<SpanId>().expect_err("not hex");
        assert_eq!(
            err.to_string(),
            "span id \"000000000000000g\" is not 16 hex digits"
        );
        // Multi-byte text of the right byte length is not hex either.
        assert!(SpanId::parse("ééééééé0", "spanId").is_err());
        assert!(SpanId::parse("+000000000000000", "spanId").is_err());
    }
}
