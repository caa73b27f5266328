//! Trace and span ids as the backends write them: hex, or base64 in Tempo's JSON.

use base64::Engine as _;

/// Lowercase hex of `bytes`.
///
/// ```
/// assert_eq!(otel_profiling_query::ids::to_hex(&[0x0a, 0xff]), "0aff");
/// ```
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses hex into bytes (`None` when malformed).
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// An id as Tempo's JSON writes it (base64 of the bytes) or as OTLP/JSON writes it (hex),
/// as lowercase hex of `len` bytes.
///
/// ```
/// use otel_profiling_query::ids::id_to_hex;
/// assert_eq!(id_to_hex("AQIDBAUGBwg=", 8).as_deref(), Some("0102030405060708"));
/// assert_eq!(id_to_hex("0102030405060708", 8).as_deref(), Some("0102030405060708"));
/// ```
pub fn id_to_hex(s: &str, len: usize) -> Option<String> {
    if s.len() == 2 * len {
        if let Some(bytes) = from_hex(s) {
            return Some(to_hex(&bytes));
        }
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    (bytes.len() == len).then(|| to_hex(&bytes))
}

/// A hex id of up to `2 * len` digits (Tempo's search drops leading zeros of trace ids),
/// left-padded to `2 * len` lowercase digits; `None` when not hex or too long.
///
/// ```
/// use otel_profiling_query::ids::pad_hex;
/// assert_eq!(pad_hex("abc", 2).as_deref(), Some("0abc"));
/// ```
pub fn pad_hex(s: &str, len: usize) -> Option<String> {
    let s = s.trim();
    (!s.is_empty() && s.len() <= 2 * len && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("{:0>width$}", s.to_ascii_lowercase(), width = 2 * len))
}
