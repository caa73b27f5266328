//! Pyroscope's querier API: span profiles, workload profiles, label values.

use std::collections::BTreeMap;
use std::time::Duration;

use otel_profiling::export::pyroscope::PROFILE_TYPE_ID;
use otel_profiling::RESOURCE_SERIES_LABELS;
use serde_json::{json, Value};

use crate::http::Backend;
use crate::{Auth, FlameGraph, QueryError, TraceSpan};

/// `SelectMergeSpanProfileRequest` (with an empty span selector: a
/// `SelectMergeStacktracesRequest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanProfileQuery {
    /// e.g. `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
    pub profile_type_id: String,
    /// Prometheus-style label selector.
    pub label_selector: String,
    /// Span ids (16 hex).
    pub span_selector: Vec<String>,
    /// Start, ms since the Unix epoch.
    pub start_ms: i64,
    /// End, ms since the Unix epoch.
    pub end_ms: i64,
}

/// The label selector Grafana builds for "Profiles for this span": the span's resource
/// attributes mapped to series labels per [`RESOURCE_SERIES_LABELS`] (the provisioned
/// `tracesToProfiles.tags`), in that order, `=` matchers.
pub fn grafana_label_selector(resource: &BTreeMap<String, String>) -> String {
    let mut labels: Vec<(&str, &str)> = Vec::new();
    for (key, label) in RESOURCE_SERIES_LABELS {
        if let Some(value) = resource.get(*key) {
            labels.retain(|(l, _)| l != label);
            labels.push((label, value));
        }
    }
    let terms: Vec<String> = labels
        .iter()
        .map(|(l, v)| format!("{l}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", terms.join(","))
}

impl SpanProfileQuery {
    /// The same query for profile type `id` (e.g. the blocked-in-poll type).
    pub fn with_profile_type(mut self, id: &str) -> SpanProfileQuery {
        self.profile_type_id = id.to_owned();
        self
    }

    /// The same query over `[start_ms, end_ms]`.
    pub fn with_interval(mut self, start_ms: i64, end_ms: i64) -> SpanProfileQuery {
        self.start_ms = start_ms;
        self.end_ms = end_ms;
        self
    }

    /// The query Grafana runs for a span: label selector from its resource, profile type
    /// [`PROFILE_TYPE_ID`], span selector = its span id, time range = the span ±60 s.
    pub fn for_span(span: &TraceSpan) -> SpanProfileQuery {
        let start_ms = (span.start_unix_nano / 1_000_000) as i64 - 60_000;
        let end_ms = span.end_unix_nano.div_ceil(1_000_000) as i64 + 60_000;
        SpanProfileQuery {
            profile_type_id: PROFILE_TYPE_ID.to_string(),
            label_selector: grafana_label_selector(&span.resource),
            span_selector: vec![span.span_id.clone()],
            start_ms,
            end_ms,
        }
    }
}

/// Client of Pyroscope's HTTP API (`http://host:4040`).
#[derive(Debug, Clone)]
pub struct PyroscopeClient {
    backend: Backend,
}

impl PyroscopeClient {
    /// A client for Pyroscope at `base`.
    ///
    /// # Errors
    /// `base` is not an http(s) URL ([`QueryError::Setting`] naming `PYROSCOPE_URL`).
    pub fn new(base: &str) -> Result<PyroscopeClient, QueryError> {
        Ok(PyroscopeClient {
            backend: Backend::new(base, "PYROSCOPE_URL")?,
        })
    }

    /// Sends `auth` with every request.
    pub fn with_auth(mut self, auth: Auth) -> PyroscopeClient {
        self.backend.set_auth(auth);
        self
    }

    /// Bounds every request by `timeout` (default 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Result<PyroscopeClient, QueryError> {
        self.backend.set_timeout(timeout)?;
        Ok(self)
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        self.backend.base()
    }

    /// `SelectMergeSpanProfile` (Connect JSON): the samples of `query`'s span ids merged
    /// into a flame graph, the call Grafana's "Profiles for this span" makes. Function
    /// names only.
    pub fn select_merge_span_profile(
        &self,
        query: &SpanProfileQuery,
    ) -> Result<FlameGraph, QueryError> {
        let body = json!({
            "profileTypeID": query.profile_type_id,
            "labelSelector": query.label_selector,
            "spanSelector": query.span_selector,
            "start": query.start_ms.to_string(),
            "end": query.end_ms.to_string(),
        });
        self.flame_graph("querier.v1.QuerierService/SelectMergeSpanProfile", &body)
    }

    /// `SelectMergeStacktraces` (Connect JSON): every sample of `query`'s profile type and
    /// series over its interval, whichever span it ran in (its span selector is ignored).
    pub fn select_merge_stacktraces(
        &self,
        query: &SpanProfileQuery,
    ) -> Result<FlameGraph, QueryError> {
        let body = json!({
            "profileTypeID": query.profile_type_id,
            "labelSelector": query.label_selector,
            "start": query.start_ms.to_string(),
            "end": query.end_ms.to_string(),
        });
        self.flame_graph("querier.v1.QuerierService/SelectMergeStacktraces", &body)
    }

    /// `LabelValues`: the values of label `name` (e.g. `__profile_type__`) among the series
    /// matching `matcher` (a selector, `{}` for all) over `[start_ms, end_ms]`.
    pub fn label_values(
        &self,
        name: &str,
        matcher: &str,
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<String>, QueryError> {
        let path = "querier.v1.QuerierService/LabelValues";
        let body = json!({
            "name": name,
            "matchers": [matcher],
            "start": start_ms.to_string(),
            "end": end_ms.to_string(),
        });
        let answer = self.backend.post_connect_json(path, &body)?;
        let names = answer.get("names").and_then(Value::as_array);
        Ok(names
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect())
    }

    fn flame_graph(&self, path: &str, body: &Value) -> Result<FlameGraph, QueryError> {
        let answer = self.backend.post_connect_json(path, body)?;
        FlameGraph::from_json(answer.get("flamegraph").unwrap_or(&Value::Null)).map_err(|message| {
            QueryError::Decode {
                request: format!("POST {}/{path}", self.base()),
                message,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_maps_the_resource_as_the_provisioned_link_does() {
        let resource: BTreeMap<String, String> = [
            ("service.name", "api"),
            ("service.version", "1.5.0"),
            ("deployment.environment.name", "prod \"eu\""),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let selector = grafana_label_selector(&resource);
        assert!(selector.starts_with("{service_name=\"api\""), "{selector}");
        assert!(selector.contains("service_version=\"1.5.0\""), "{selector}");
        assert!(selector.contains(r#"\"eu\""#), "{selector}");
    }
}
