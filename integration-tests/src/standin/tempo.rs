//! The Tempo half of the stand-in: OTLP/HTTP ingest and the v1 trace-by-id API.

use std::collections::HashMap;

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{json, Value};

/// One stored span with the resource and scope it arrived with.
#[derive(Clone, Debug)]
struct StoredSpan {
    resource: Option<Resource>,
    scope: Option<InstrumentationScope>,
    span: Span,
}

/// Spans by trace id.
#[derive(Debug, Default)]
pub struct TempoStore {
    traces: HashMap<Vec<u8>, Vec<StoredSpan>>,
}

impl TempoStore {
    /// Total spans stored.
    pub fn span_count(&self) -> usize {
        self.traces.values().map(Vec::len).sum()
    }

    /// Decodes a protobuf `ExportTraceServiceRequest` and stores its spans.
    pub fn ingest_protobuf(&mut self, raw: &[u8]) -> Result<(), String> {
        let request = ExportTraceServiceRequest::decode(raw)
            .map_err(|e| format!("bad ExportTraceServiceRequest: {e}"))?;
        for rs in request.resource_spans {
            for ss in rs.scope_spans {
                for span in ss.spans {
                    if span.trace_id.len() != 16 || span.span_id.len() != 8 {
                        return Err("span with an invalid trace or span id".into());
                    }
                    self.traces
                        .entry(span.trace_id.clone())
                        .or_default()
                        .push(StoredSpan {
                            resource: rs.resource.clone(),
                            scope: ss.scope.clone(),
                            span,
                        });
                }
            }
        }
        Ok(())
    }

    /// Tempo's `GET /api/traces/<id>` answer: `Ok(None)` when unknown, `Err` for a
    /// malformed id. Tempo accepts ids shorter than 32 hex digits (left-padded with zeros).
    pub fn trace_json(&self, id: &str) -> Result<Option<Value>, String> {
        if id.is_empty() || id.len() > 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "invalid trace id {id:?}: expected up to 32 hex digits"
            ));
        }
        let padded = format!("{id:0>32}");
        let bytes: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&padded[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        let Some(spans) = self.traces.get(&bytes) else {
            return Ok(None);
        };
        // One batch per (resource, scope) as received, spans in arrival order.
        let mut batches: Vec<Value> = Vec::new();
        for stored in spans {
            batches.push(json!({
                "resource": resource_json(stored.resource.as_ref()),
                "scopeSpans": [{
                    "scope": scope_json(stored.scope.as_ref()),
                    "spans": [span_json(&stored.span)],
                }],
            }));
        }
        Ok(Some(json!({ "batches": batches })))
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn resource_json(resource: Option<&Resource>) -> Value {
    match resource {
        Some(r) => json!({ "attributes": attributes_json(&r.attributes) }),
        None => json!({}),
    }
}

fn scope_json(scope: Option<&InstrumentationScope>) -> Value {
    match scope {
        Some(s) => json!({ "name": s.name, "version": s.version }),
        None => json!({}),
    }
}

fn attributes_json(attributes: &[KeyValue]) -> Value {
    Value::Array(
        attributes
            .iter()
            .map(|kv| json!({ "key": kv.key, "value": any_value_json(kv.value.as_ref()) }))
            .collect(),
    )
}

fn any_value_json(value: Option<&AnyValue>) -> Value {
    match value.and_then(|v| v.value.as_ref()) {
        Some(AnyValueKind::StringValue(s)) => json!({ "stringValue": s }),
        Some(AnyValueKind::BoolValue(b)) => json!({ "boolValue": b }),
        // protobuf JSON writes int64 as a string.
        Some(AnyValueKind::IntValue(i)) => json!({ "intValue": i.to_string() }),
        Some(AnyValueKind::DoubleValue(d)) => json!({ "doubleValue": d }),
        Some(AnyValueKind::BytesValue(b)) => json!({ "bytesValue": b64(b) }),
        Some(AnyValueKind::ArrayValue(a)) => json!({ "arrayValue": {
            "values": a.values.iter().map(|v| any_value_json(Some(v))).collect::<Vec<_>>()
        }}),
        Some(AnyValueKind::KvlistValue(kv)) => {
            json!({ "kvlistValue": { "values": attributes_json(&kv.values) } })
        }
        _ => json!({}),
    }
}

fn span_json(span: &Span) -> Value {
    let mut v = json!({
        "traceId": b64(&span.trace_id),
        "spanId": b64(&span.span_id),
        "name": span.name,
        "kind": span_kind(span.kind),
        "startTimeUnixNano": span.start_time_unix_nano.to_string(),
        "endTimeUnixNano": span.end_time_unix_nano.to_string(),
        "attributes": attributes_json(&span.attributes),
        "status": {},
    });
    if !span.parent_span_id.is_empty() {
        v["parentSpanId"] = json!(b64(&span.parent_span_id));
    }
    v
}

fn span_kind(kind: i32) -> &'static str {
    match kind {
        1 => "SPAN_KIND_INTERNAL",
        2 => "SPAN_KIND_SERVER",
        3 => "SPAN_KIND_CLIENT",
        4 => "SPAN_KIND_PRODUCER",
        5 => "SPAN_KIND_CONSUMER",
        _ => "SPAN_KIND_UNSPECIFIED",
    }
}
