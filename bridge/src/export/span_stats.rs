//! Counting what the span exporters deliver and lose, and saying so.
//!
//! The batch span processor hands each batch to its exporter and, on failure, only emits
//! an internal OpenTelemetry diagnostic: an unreachable trace backend was silent and
//! uncounted while Pyroscope failures were logged and counted. [`CountingSpanExporter`]
//! wraps any exporter: every batch is counted as sent or failed (with its spans), and
//! failures are written to stderr, prefixed `otel-profiling:`, the first at once and then
//! at most one line a minute.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::log_limiter::LogLimiter;

/// Counters of one span exporter.
#[derive(Debug, Default)]
pub struct SpanExportStats {
    spans_ended: AtomicU64,
    batches_sent: AtomicU64,
    spans_sent: AtomicU64,
    batches_failed: AtomicU64,
    spans_failed: AtomicU64,
    last_error: Mutex<Option<String>>,
    log: Mutex<LogLimiter>,
}

/// A copy of [`SpanExportStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpanExportSnapshot {
    /// Batches the backend accepted.
    pub batches_sent: u64,
    /// Spans in them.
    pub spans_sent: u64,
    /// Batches whose export failed (lost: the batch processor does not retry).
    pub batches_failed: u64,
    /// Spans in them.
    pub spans_failed: u64,
    /// Spans handed to the exporter's batch processor (sampled spans that ended): those
    /// neither sent nor failed are still queued, or were lost at shutdown.
    pub spans_ended: u64,
}

impl SpanExportStats {
    /// The counters now.
    pub fn snapshot(&self) -> SpanExportSnapshot {
        SpanExportSnapshot {
            batches_sent: self.batches_sent.load(Ordering::Relaxed),
            spans_sent: self.spans_sent.load(Ordering::Relaxed),
            batches_failed: self.batches_failed.load(Ordering::Relaxed),
            spans_failed: self.spans_failed.load(Ordering::Relaxed),
            spans_ended: self.spans_ended.load(Ordering::Relaxed),
        }
    }

    /// One more span handed to the batch processor.
    pub(crate) fn note_ended(&self) {
        self.spans_ended.fetch_add(1, Ordering::Relaxed);
    }

    /// The last export error, if any export failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, what: &str, spans: usize, result: &OTelSdkResult) {
        let (batches, counted) = match result {
            Ok(()) => (&self.batches_sent, &self.spans_sent),
            Err(_) => (&self.batches_failed, &self.spans_failed),
        };
        batches.fetch_add(1, Ordering::Relaxed);
        counted.fetch_add(spans as u64, Ordering::Relaxed);
        let Err(error) = result else { return };
        let message = format!("{what}: exporting {spans} span(s) failed: {error}");
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(message.clone());
        let permit = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .permit(Instant::now());
        if let Some(suppressed) = permit {
            let tail = if suppressed > 0 {
                format!(" [{suppressed} similar message(s) suppressed]")
            } else {
                String::new()
            };
            eprintln!("otel-profiling: {message}{tail}");
        }
    }
}

/// Wraps a span exporter and counts (and logs, rate-limited) what it delivers and loses.
#[derive(Debug)]
pub struct CountingSpanExporter<E> {
    inner: E,
    what: Arc<str>,
    stats: Arc<SpanExportStats>,
}

impl<E: SpanExporter> CountingSpanExporter<E> {
    /// Wraps `inner`; `what` names it, and where it sends, in log lines (e.g.
    /// `"otlp http/protobuf to http://…/v1/traces"`).
    pub fn new(inner: E, what: impl Into<Arc<str>>) -> CountingSpanExporter<E> {
        CountingSpanExporter {
            inner,
            what: what.into(),
            stats: Arc::default(),
        }
    }

    /// The counters, shared: keep a clone before handing the exporter to a processor.
    pub fn stats(&self) -> Arc<SpanExportStats> {
        self.stats.clone()
    }
}

impl<E: SpanExporter> SpanExporter for CountingSpanExporter<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let spans = batch.len();
        let export = self.inner.export(batch);
        let stats = self.stats.clone();
        let what = self.what.clone();
        async move {
            let result = export.await;
            stats.record(&what, spans, &result);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::error::OTelSdkError;

    #[derive(Debug)]
    struct Fails(bool);

    impl SpanExporter for Fails {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            if self.0 {
                Err(OTelSdkError::InternalFailure("connection refused".into()))
            } else {
                Ok(())
            }
        }
    }

    fn batch(n: usize) -> Vec<SpanData> {
        use opentelemetry::trace::{SpanContext, SpanKind, Status};
        (0..n)
            .map(|_| SpanData {
                span_context: SpanContext::empty_context(),
                parent_span_id: opentelemetry::trace::SpanId::INVALID,
                parent_span_is_remote: false,
                span_kind: SpanKind::Internal,
                name: "s".into(),
                start_time: std::time::SystemTime::now(),
                end_time: std::time::SystemTime::now(),
                attributes: Vec::new(),
                dropped_attributes_count: 0,
                events: Default::default(),
                links: Default::default(),
                status: Status::Unset,
                instrumentation_scope: Default::default(),
            })
            .collect()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        futures_executor_lite(f)
    }

    /// A minimal executor for a future that is ready without waking (the test exporters).
    fn futures_executor_lite<F: std::future::Future>(f: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    #[test]
    fn batches_are_counted_as_sent_or_failed_with_their_spans() {
        let ok = CountingSpanExporter::new(Fails(false), "test");
        assert!(block_on(ok.export(batch(3))).is_ok());
        assert_eq!(
            ok.stats().snapshot(),
            SpanExportSnapshot {
                batches_sent: 1,
                spans_sent: 3,
                ..SpanExportSnapshot::default()
            }
        );
        let failing = CountingSpanExporter::new(Fails(true), "test");
        assert!(block_on(failing.export(batch(2))).is_err());
        assert!(block_on(failing.export(batch(5))).is_err());
        let s = failing.stats().snapshot();
        assert_eq!((s.batches_failed, s.spans_failed, s.spans_sent), (2, 7, 0));
        let last = failing.stats().last_error().expect("last error");
        assert!(
            last.contains("exporting 5 span(s) failed") && last.contains("connection refused"),
            "{last}"
        );
    }
}
