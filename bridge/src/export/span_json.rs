//! Finished spans as one OTLP JSON `ExportTraceServiceRequest`, written straight from the
//! SDK's [`SpanData`] into a reused buffer.
//!
//! Why not `opentelemetry-proto`'s serde types: that path converts every span into the
//! message structs first (ids into `Vec`s, every attribute's key and value into new
//! `String`s, each event and link), then serialises them, formatting each id through a
//! temporary hex `String`. On a service that writes its spans to the local directory the
//! batch exporter did this for every span, on the same cores as the requests: the
//! `span_file` bench measures both paths in one run (docs/local-files.md).
//!
//! The output is the protobuf JSON mapping the OpenTelemetry Collector's file exporter
//! writes: lowerCamelCase names, ids as lowercase hex, 64-bit integers as strings, enums
//! as numbers, and fields holding their default value (`""`, `0`, empty lists) left out,
//! as the mapping allows (readers take them as the default). Doubles that JSON has no
//! number for are written as the mapping's strings `"NaN"`, `"Infinity"`, `"-Infinity"`.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

/// OTLP `SpanFlags`: the span context says whether the parent is remote.
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
/// OTLP `SpanFlags`: the parent is remote.
const FLAG_IS_REMOTE: u32 = 0x200;

/// Writes batches of spans as OTLP JSON lines.
#[derive(Debug, Clone)]
pub(crate) struct SpanJson {
    /// `"resource":{…}` and the resource's `"schemaUrl"`, encoded once.
    resource: Vec<u8>,
    schema_url: Vec<u8>,
}

impl Default for SpanJson {
    fn default() -> SpanJson {
        SpanJson::new(&Resource::builder_empty().build())
    }
}

impl SpanJson {
    /// An encoder for spans of `resource`.
    pub(crate) fn new(resource: &Resource) -> SpanJson {
        let mut encoded = Vec::new();
        encoded.extend_from_slice(br#""resource":{"#);
        let mut fields = Fields::new(&mut encoded);
        fields.key_values("attributes", resource.iter());
        encoded.push(b'}');
        let mut schema_url = Vec::new();
        if let Some(url) = resource.schema_url().filter(|u| !u.is_empty()) {
            schema_url.extend_from_slice(br#","schemaUrl":"#);
            string(&mut schema_url, url);
        }
        SpanJson {
            resource: encoded,
            schema_url,
        }
    }

    /// Appends `batch` to `out` as one request and a newline; nothing for an empty batch.
    /// Spans are grouped by instrumentation scope in the order the scopes first appear.
    pub(crate) fn write_line(&self, batch: &[SpanData], out: &mut Vec<u8>) {
        if batch.is_empty() {
            return;
        }
        // Batches hold one scope or a few: a linear search beats hashing them.
        let mut scopes: Vec<&InstrumentationScope> = Vec::new();
        for span in batch {
            if !scopes.contains(&&span.instrumentation_scope) {
                scopes.push(&span.instrumentation_scope);
            }
        }
        out.extend_from_slice(br#"{"resourceSpans":[{"#);
        out.extend_from_slice(&self.resource);
        out.extend_from_slice(br#","scopeSpans":["#);
        for (i, scope) in scopes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_scope_spans(scope, batch, out);
        }
        out.push(b']');
        out.extend_from_slice(&self.schema_url);
        out.extend_from_slice(b"}]}\n");
    }
}

/// One `ScopeSpans`: `scope`, then every span of `batch` under it.
fn write_scope_spans(scope: &InstrumentationScope, batch: &[SpanData], out: &mut Vec<u8>) {
    out.extend_from_slice(br#"{"scope":{"#);
    let mut fields = Fields::new(out);
    fields.string("name", scope.name());
    fields.string("version", scope.version().unwrap_or_default());
    fields.key_values("attributes", scope.attributes());
    out.extend_from_slice(br#"},"spans":["#);
    let mut first = true;
    for span in batch.iter().filter(|s| &s.instrumentation_scope == scope) {
        if !first {
            out.push(b',');
        }
        first = false;
        write_span(span, out);
    }
    out.push(b']');
    if let Some(url) = scope.schema_url().filter(|u| !u.is_empty()) {
        out.extend_from_slice(br#","schemaUrl":"#);
        string(out, url);
    }
    out.push(b'}');
}

fn write_span(span: &SpanData, out: &mut Vec<u8>) {
    let context = &span.span_context;
    out.push(b'{');
    let mut fields = Fields::new(out);
    fields.hex("traceId", &context.trace_id().to_bytes());
    fields.hex("spanId", &context.span_id().to_bytes());
    fields.string("traceState", &context.trace_state().header());
    if span.parent_span_id != SpanId::INVALID {
        fields.hex("parentSpanId", &span.parent_span_id.to_bytes());
    }
    fields.number(
        "flags",
        u64::from(span_flags(
            span.parent_span_is_remote,
            context.trace_flags().to_u8(),
        )),
    );
    fields.string("name", &span.name);
    fields.number("kind", kind(&span.span_kind));
    fields.nanos("startTimeUnixNano", span.start_time);
    fields.nanos("endTimeUnixNano", span.end_time);
    fields.key_values("attributes", span.attributes.iter());
    fields.number(
        "droppedAttributesCount",
        u64::from(span.dropped_attributes_count),
    );
    if !span.events.events.is_empty() {
        fields.key("events");
        fields.out.push(b'[');
        list(fields.out, &span.events.events, |out, event| {
            out.push(b'{');
            let mut event_fields = Fields::new(out);
            event_fields.nanos("timeUnixNano", event.timestamp);
            event_fields.string("name", &event.name);
            event_fields.key_values("attributes", event.attributes.iter());
            event_fields.number(
                "droppedAttributesCount",
                u64::from(event.dropped_attributes_count),
            );
            out.push(b'}');
        });
        fields.out.push(b']');
    }
    fields.number("droppedEventsCount", u64::from(span.events.dropped_count));
    if !span.links.links.is_empty() {
        fields.key("links");
        fields.out.push(b'[');
        list(fields.out, &span.links.links, |out, link| {
            let linked = &link.span_context;
            out.push(b'{');
            let mut link_fields = Fields::new(out);
            link_fields.hex("traceId", &linked.trace_id().to_bytes());
            link_fields.hex("spanId", &linked.span_id().to_bytes());
            link_fields.string("traceState", &linked.trace_state().header());
            link_fields.key_values("attributes", link.attributes.iter());
            link_fields.number(
                "droppedAttributesCount",
                u64::from(link.dropped_attributes_count),
            );
            link_fields.number(
                "flags",
                u64::from(span_flags(linked.is_remote(), linked.trace_flags().to_u8())),
            );
            out.push(b'}');
        });
        fields.out.push(b']');
    }
    fields.number("droppedLinksCount", u64::from(span.links.dropped_count));
    fields.key("status");
    fields.out.push(b'{');
    let mut status_fields = Fields::new(fields.out);
    match &span.status {
        Status::Unset => {}
        Status::Ok => status_fields.number("code", 1),
        Status::Error { description } => {
            status_fields.string("message", description);
            status_fields.number("code", 2);
        }
    }
    fields.out.push(b'}');
    out.push(b'}');
}

/// OTLP's `SpanFlags`: the W3C trace flags in the low byte, and whether the parent is
/// remote (always stated: the SDK knows).
fn span_flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    let remote = if parent_is_remote { FLAG_IS_REMOTE } else { 0 };
    u32::from(trace_flags) | FLAG_HAS_IS_REMOTE | remote
}

/// OTLP's `Span.SpanKind` number.
fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// The members of one JSON object, written in order; a member holding its field's
/// default value is left out.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Fields<'a> {
    fn new(out: &'a mut Vec<u8>) -> Fields<'a> {
        Fields { out, first: true }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        // Keys are this module's own names: nothing to escape.
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn string(&mut self, key: &str, value: &str) {
        if !value.is_empty() {
            self.key(key);
            string(self.out, value);
        }
    }

    fn number(&mut self, key: &str, value: u64) {
        if value != 0 {
            self.key(key);
            decimal(self.out, value);
        }
    }

    /// A 64-bit field: a decimal string, as the mapping writes them.
    fn nanos(&mut self, key: &str, at: SystemTime) {
        let nanos = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        if nanos != 0 {
            self.key(key);
            self.out.push(b'"');
            decimal(self.out, nanos);
            self.out.push(b'"');
        }
    }

    fn hex(&mut self, key: &str, bytes: &[u8]) {
        self.key(key);
        self.out.push(b'"');
        for &b in bytes {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            self.out.push(DIGITS[usize::from(b >> 4)]);
            self.out.push(DIGITS[usize::from(b & 0xf)]);
        }
        self.out.push(b'"');
    }

    fn key_values<'k, P: AsPair<'k>>(&mut self, key: &str, pairs: impl IntoIterator<Item = P>) {
        let mut pairs = pairs.into_iter().map(AsPair::pair).peekable();
        if pairs.peek().is_none() {
            return;
        }
        self.key(key);
        self.out.push(b'[');
        for (i, (k, v)) in pairs.enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.extend_from_slice(br#"{"key":"#);
            string(self.out, k);
            self.out.extend_from_slice(br#","value":"#);
            any_value(self.out, v);
            self.out.push(b'}');
        }
        self.out.push(b']');
    }
}

/// A key and value however the SDK holds them (a `KeyValue`, or a resource's pair).
type KvRef<'k> = (&'k str, &'k Value);

/// An attribute as a pair: the SDK hands them over as `&KeyValue` (spans, events, links,
/// scopes) or as `(&Key, &Value)` (a resource).
trait AsPair<'k> {
    fn pair(self) -> KvRef<'k>;
}

impl<'k> AsPair<'k> for &'k KeyValue {
    fn pair(self) -> KvRef<'k> {
        (self.key.as_str(), &self.value)
    }
}

impl<'k> AsPair<'k> for (&'k opentelemetry::Key, &'k Value) {
    fn pair(self) -> KvRef<'k> {
        (self.0.as_str(), self.1)
    }
}

/// An `AnyValue`: `{"stringValue":…}` and so on; arrays as `{"arrayValue":{"values":[…]}}`.
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => {
            out.extend_from_slice(br#"{"boolValue":"#);
            out.extend_from_slice(if *b { b"true" } else { b"false" });
            out.push(b'}');
        }
        Value::I64(i) => {
            out.extend_from_slice(br#"{"intValue":""#);
            signed(out, *i);
            out.extend_from_slice(b"\"}");
        }
        Value::F64(f) => {
            out.extend_from_slice(br#"{"doubleValue":"#);
            double(out, *f);
            out.push(b'}');
        }
        Value::String(s) => {
            out.extend_from_slice(br#"{"stringValue":"#);
            string(out, s.as_str());
            out.push(b'}');
        }
        Value::Array(array) => {
            out.extend_from_slice(br#"{"arrayValue":{"values":["#);
            match array {
                Array::Bool(values) => list(out, values, |out, v| any_value(out, &Value::Bool(*v))),
                Array::I64(values) => list(out, values, |out, v| any_value(out, &Value::I64(*v))),
                Array::F64(values) => list(out, values, |out, v| any_value(out, &Value::F64(*v))),
                Array::String(values) => list(out, values, |out, v| {
                    out.extend_from_slice(br#"{"stringValue":"#);
                    string(out, v.as_str());
                    out.push(b'}');
                }),
                // A kind of array a later `opentelemetry` adds: its text, rather than
                // losing the attribute.
                other => list(out, &[other], |out, v| {
                    out.extend_from_slice(br#"{"stringValue":"#);
                    string(out, &v.to_string());
                    out.push(b'}');
                }),
            }
            out.extend_from_slice(b"]}}");
        }
        // A kind of value a later `opentelemetry` adds: its text, as above.
        other => {
            out.extend_from_slice(br#"{"stringValue":"#);
            string(out, &other.as_str());
            out.push(b'}');
        }
    }
}

fn list<T>(out: &mut Vec<u8>, values: &[T], mut each: impl FnMut(&mut Vec<u8>, &T)) {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        each(out, v);
    }
}

/// A JSON string, escaped as JSON requires: `"`, `\\` and the control characters, and
/// nothing else (as serde_json escapes). Span text rarely holds any, so the usual string
/// is one copy.
fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut from = 0;
    for (at, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => {
                out.extend_from_slice(&bytes[from..at]);
                const DIGITS: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(DIGITS[usize::from(b >> 4)]);
                out.push(DIGITS[usize::from(b & 0xf)]);
                from = at + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[from..at]);
        out.extend_from_slice(escape);
        from = at + 1;
    }
    out.extend_from_slice(&bytes[from..]);
    out.push(b'"');
}

fn decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

fn signed(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    decimal(out, n.unsigned_abs());
}

fn double(out: &mut Vec<u8>, f: f64) {
    if f.is_nan() {
        out.extend_from_slice(br#""NaN""#);
    } else if f.is_infinite() {
        out.extend_from_slice(if f > 0.0 {
            br#""Infinity""#.as_slice()
        } else {
            br#""-Infinity""#.as_slice()
        });
    } else {
        // serde_json writes a finite f64 as the shortest text that reads back the same,
        // always as a float ("1.0", never "1").
        let _ = serde_json::to_writer(&mut *out, &f);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId, TraceState};
    use opentelemetry::StringValue;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use serde_json::Value as Json;

    use super::*;

    fn at(nanos: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(nanos)
    }

    fn context(trace: u128, span: u64, remote: bool, state: &str) -> SpanContext {
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            remote,
            TraceState::from_key_value([("vendor", state)]).expect("a trace state"),
        )
    }

    /// Every kind of value, and strings JSON must escape.
    fn attributes() -> Vec<KeyValue> {
        vec![
            KeyValue::new(
                "text",
                "quote \" backslash \\ newline \n tab \t nul \u{0} é 😀",
            ),
            KeyValue::new("empty", ""),
            KeyValue::new("yes", true),
            KeyValue::new("no", false),
            KeyValue::new("int", -9_007_199_254_740_993_i64),
            KeyValue::new("zero", 0_i64),
            KeyValue::new("max", i64::MAX),
            KeyValue::new("double", 0.1_f64),
            KeyValue::new("whole double", 3.0_f64),
            KeyValue::new("tiny", 1e-300_f64),
            KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new("ints", Value::Array(Array::I64(vec![1, -2]))),
            KeyValue::new("doubles", Value::Array(Array::F64(vec![1.5, -0.0]))),
            KeyValue::new(
                "strings",
                Value::Array(Array::String(vec![StringValue::from("a"), "\"b\"".into()])),
            ),
        ]
    }

    fn span(scope: &InstrumentationScope, n: u64) -> SpanData {
        let mut events = SpanEvents::default();
        let mut links = SpanLinks::default();
        if n % 2 == 1 {
            events.events.push(Event::new(
                "retry",
                at(1_700_000_000_000_000_123),
                attributes(),
                1,
            ));
            events
                .events
                .push(Event::new("done", at(1_700_000_000_000_000_456), vec![], 0));
            events.dropped_count = 3;
            links
                .links
                .push(Link::new(context(7, 8, true, "x"), attributes(), 2));
            links.dropped_count = 1;
        }
        SpanData {
            span_context: context(
                0x0123_4567_89ab_cdef_0123_4567_89ab_cdef + u128::from(n),
                0xfe + n,
                false,
                "s",
            ),
            parent_span_id: if n == 0 {
                SpanId::INVALID
            } else {
                SpanId::from(n)
            },
            parent_span_is_remote: n == 2,
            span_kind: [
                SpanKind::Internal,
                SpanKind::Server,
                SpanKind::Client,
                SpanKind::Producer,
                SpanKind::Consumer,
            ][n as usize % 5]
                .clone(),
            name: format!("GET /items/{n} \"quoted\"").into(),
            start_time: at(1_700_000_000_000_000_000 + n),
            end_time: at(1_700_000_000_500_000_000 + n),
            attributes: attributes(),
            dropped_attributes_count: n as u32,
            events,
            links,
            status: match n % 3 {
                0 => Status::Unset,
                1 => Status::Ok,
                _ => Status::error("boom \"x\""),
            },
            instrumentation_scope: scope.clone(),
        }
    }

    /// The reference's JSON with the fields holding their default value left out, as the
    /// JSON mapping allows; a value's own member (`"stringValue":""`, `"boolValue":false`)
    /// is never a default: it says which kind the value is.
    fn without_defaults(json: Json) -> Json {
        const VALUE_MEMBERS: [&str; 5] = [
            "stringValue",
            "boolValue",
            "intValue",
            "doubleValue",
            "bytesValue",
        ];
        match json {
            Json::Object(map) => Json::Object(
                map.into_iter()
                    .filter_map(|(k, v)| {
                        if VALUE_MEMBERS.contains(&k.as_str()) {
                            return Some((k, v));
                        }
                        let v = without_defaults(v);
                        let default = match &v {
                            Json::String(s) => s.is_empty(),
                            Json::Number(n) => n.as_f64() == Some(0.0),
                            Json::Array(a) => a.is_empty(),
                            Json::Null => true,
                            _ => false,
                        };
                        (!default).then_some((k, v))
                    })
                    .collect(),
            ),
            Json::Array(items) => Json::Array(items.into_iter().map(without_defaults).collect()),
            other => other,
        }
    }

    /// What `opentelemetry-proto`'s message types and serde write for the same batch.
    fn reference(batch: &[SpanData], resource: &Resource) -> Json {
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                batch.to_vec(),
                &ResourceAttributesWithSchema::from(resource),
            ),
        };
        without_defaults(serde_json::to_value(&request).expect("the reference encodes"))
    }

    fn ours(batch: &[SpanData], resource: &Resource) -> Json {
        let mut line = Vec::new();
        SpanJson::new(resource).write_line(batch, &mut line);
        assert_eq!(line.last(), Some(&b'\n'), "one line");
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        serde_json::from_slice(&line).expect("valid JSON")
    }

    /// Field for field what the OTLP message types say, for every kind of value, events,
    /// links, statuses, remote parents, trace state and two scopes in one batch.
    #[test]
    fn writes_what_the_otlp_message_types_write() {
        let plain = InstrumentationScope::builder("tracing-opentelemetry").build();
        let full = InstrumentationScope::builder("orders")
            .with_version("1.2.3")
            .with_schema_url("https://opentelemetry.io/schemas/1.30.0")
            .with_attributes([KeyValue::new("scope.attr", 5_i64)])
            .build();
        let batch: Vec<SpanData> = (0..6)
            .map(|n| span(if n % 2 == 0 { &plain } else { &full }, n))
            .collect();
        let resource = Resource::builder_empty()
            .with_schema_url(
                [
                    KeyValue::new("service.name", "checkout"),
                    KeyValue::new("service.version", "2.0.0"),
                ],
                "https://opentelemetry.io/schemas/1.30.0",
            )
            .build();
        assert_eq!(ours(&batch, &resource), reference(&batch, &resource));
        let bare = Resource::builder_empty().build();
        assert_eq!(ours(&batch[..1], &bare), reference(&batch[..1], &bare));
    }

    /// Doubles JSON has no number for are the mapping's strings, and the line stays JSON
    /// (the message types' serde wrote `null`, which reads back as no value).
    #[test]
    fn non_finite_doubles_are_the_mappings_strings() {
        let scope = InstrumentationScope::builder("s").build();
        let mut one = span(&scope, 0);
        one.attributes = vec![
            KeyValue::new("nan", f64::NAN),
            KeyValue::new("up", f64::INFINITY),
            KeyValue::new("down", f64::NEG_INFINITY),
        ];
        let json = ours(&[one], &Resource::builder_empty().build());
        let attributes = &json["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"];
        let values: Vec<&Json> = (0..3)
            .map(|i| &attributes[i]["value"]["doubleValue"])
            .collect();
        assert_eq!(
            values,
            [
                &Json::from("NaN"),
                &Json::from("Infinity"),
                &Json::from("-Infinity")
            ]
        );
    }

    /// Every ASCII character, alone and amid text, and some beyond: escaped exactly as
    /// serde_json escapes them.
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut texts: Vec<String> = (0u8..128).map(|b| char::from(b).to_string()).collect();
        texts.extend((0u8..128).map(|b| format!("ab{}cd\"e", char::from(b))));
        texts.extend(["", "é😀\u{7f}\u{2028}", "\\\\\"\"\n"].map(String::from));
        for text in texts {
            let mut ours = Vec::new();
            string(&mut ours, &text);
            let theirs = serde_json::to_vec(&text).expect("encodes");
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let mut line = Vec::new();
        SpanJson::default().write_line(&[], &mut line);
        assert!(line.is_empty());
    }
}
