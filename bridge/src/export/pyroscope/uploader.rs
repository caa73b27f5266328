//! The uploader thread: takes requests off the queue in order and posts them.

use std::io::{Read, Write};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::StatusCode;

use std::borrow::Cow;

use reqwest::header::HeaderMap;
use reqwest::Url;

use super::super::log_limiter::LogLimiter;
use super::config::PyroscopeBackoff;
use super::queue::{Outcome, Shared, Take};
use super::stats::PyroscopeStats;

/// How much of an error response is read (for the message) or drained (for reuse).
const MAX_RESPONSE_READ: u64 = 64 * 1024;

/// Longest error message kept in the counters and logs.
const MAX_MESSAGE: usize = 512;

/// What the uploader needs to know of where and how requests go, whatever the protocol.
#[derive(Debug, Clone)]
pub(crate) struct UploadSettings {
    /// The URL every request is posted to.
    pub(crate) endpoint: Url,
    /// Headers of every request (credentials marked sensitive).
    pub(crate) headers: HeaderMap,
    /// Timeout of one request, connecting included.
    pub(crate) request_timeout: Duration,
    /// Retry policy.
    pub(crate) backoff: PyroscopeBackoff,
    /// How requests travel.
    pub(crate) transport: Transport,
    /// Whether request bodies are gzipped (HTTP: the body; gRPC: the message).
    pub(crate) gzip: bool,
    /// Client TLS of an `https://` endpoint.
    #[cfg_attr(not(any(feature = "tls", feature = "otlp-grpc")), allow(dead_code))]
    pub(crate) tls: crate::config::ClientTls,
}

/// How requests travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// HTTP/1.1 POST (reqwest's blocking client), the body gzipped unless turned off.
    Http,
    /// OTLP/gRPC `ProfilesService/Export` (tonic, on a runtime of the uploader thread's own).
    #[cfg(feature = "otlp-grpc")]
    Grpc,
}

/// The client of one transport, living on the uploader thread.
enum Client {
    Http(reqwest::blocking::Client),
    #[cfg(feature = "otlp-grpc")]
    Grpc(Box<crate::export::otlp_profiles::grpc::GrpcClient>),
}

/// Why the client could not be built.
#[derive(Debug)]
pub(crate) enum ClientError {
    /// reqwest's (TLS setup).
    Http(reqwest::Error),
    /// The TLS files were refused by the TLS stack (the message names the setting).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    Tls(String),
    /// tonic's (bad endpoint, runtime).
    #[cfg_attr(not(feature = "otlp-grpc"), allow(dead_code))]
    Grpc(String),
}

/// How an HTTP status is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusClass {
    /// Rate limited (429): retried after the backoff (or `Retry-After`), split if possible.
    RateLimited,
    /// A server error worth retrying.
    Retryable,
    /// Refused for good.
    Permanent,
}

/// What differs between the protocols one uploader can speak (Pyroscope's push API, OTLP
/// profiles over HTTP): the queue, the thread, the backoff, the counters and the logging
/// are the same for all.
pub(crate) trait Protocol: Send + 'static {
    /// What a request is, for log lines: `pyroscope push`, `OTLP profiles export`.
    fn what(&self) -> &'static str;
    /// How a non-2xx status is treated.
    fn classify(&self, status: StatusCode) -> StatusClass;
    /// `: <detail>` of an error answer's body (empty when there is nothing to say).
    fn error_detail(&self, body: &[u8]) -> String;
    /// The setting that avoids the server limit a refusal names, if any.
    fn limit_hint(&self, _message: &str) -> Option<&'static str> {
        None
    }
    /// Two requests carrying together what `plain` (an uncompressed request) carries, to
    /// replace a request answered 429; `None` when it cannot be made smaller.
    fn split(&self, plain: &[u8]) -> Option<[Vec<u8>; 2]>;
    /// Reads a 2xx answer's body: `Some(message)` when the server accepted only part of
    /// the request (counted in `partial_success` and logged).
    fn partial_success(&self, _body: &[u8]) -> Option<String> {
        None
    }
}

/// Runs on the uploader thread until the exporter shuts it down.
///
/// Reports on `ready` whether the HTTP client could be built, and on `done` that it has
/// finished, as its very last step (after the client and its connections are gone).
pub(crate) fn run(
    config: UploadSettings,
    protocol: Box<dyn Protocol>,
    shared: Arc<Shared>,
    ready: SyncSender<Result<(), ClientError>>,
    done: SyncSender<()>,
) {
    // For the thread's life (see `collector.rs`): the push's HTTP calls make no spans or
    // profiles of their own.
    let _suppressed = opentelemetry::Context::enter_telemetry_suppressed_scope();
    let exit = ExitGuard {
        shared: shared.clone(),
        done,
    };
    let client = match build_client(&config) {
        Ok(client) => client,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    drop(ready);
    let mut uploader = Uploader {
        config,
        protocol,
        client,
        shared,
        log: LogLimiter::default(),
        jitter: Jitter::new(),
    };
    uploader.run();
    drop(uploader);
    drop(exit);
}

/// Marks the queue stopped and signals `done` when the thread ends, even by a panic.
struct ExitGuard {
    shared: Arc<Shared>,
    done: SyncSender<()>,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.shared.mark_stopped();
        let _ = self.done.try_send(());
    }
}

/// The HTTP client.
///
/// reqwest 0.13 without default features: HTTP/1.1 only, rustls (aws-lc-rs provider, the
/// `rustls` feature) for `https`, platform certificate verification unless the settings
/// name the trusted certificates. Redirects are not followed: a push answered with a
/// redirect is a misconfigured address, and following it could hand the credentials to
/// another host.
fn build_client(config: &UploadSettings) -> Result<Client, ClientError> {
    match config.transport {
        Transport::Http => {
            let builder = reqwest::blocking::Client::builder()
                .user_agent(concat!("otel-profiling/", env!("CARGO_PKG_VERSION")))
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(config.request_timeout)
                .timeout(config.request_timeout);
            #[cfg(feature = "tls")]
            let builder = if config.endpoint.scheme() == "https" {
                config
                    .tls
                    .apply_reqwest(builder)
                    .map_err(ClientError::Tls)?
            } else {
                builder
            };
            // Its request thread is the telemetry's: never sampled.
            crate::sampler::adopt::declining_client_threads(|| builder.build())
                .map(Client::Http)
                .map_err(ClientError::Http)
        }
        #[cfg(feature = "otlp-grpc")]
        Transport::Grpc => crate::export::otlp_profiles::grpc::GrpcClient::new(
            &config.endpoint,
            &config.headers,
            config.request_timeout,
            config.gzip,
            &config.tls,
        )
        .map(|client| Client::Grpc(Box::new(client)))
        .map_err(ClientError::Grpc),
    }
}

/// Why an attempt failed.
#[derive(Debug)]
enum Failure {
    /// Not worth retrying (4xx other than 429, 3xx).
    Permanent(String),
    /// Accepted with a partial success (OTLP): sent, never retried (the OTLP spec), logged.
    Partial(String),
    /// 5xx, 429, network error or timeout.
    Retryable {
        message: String,
        retry_after: Option<Duration>,
        /// The answer was 429.
        rate_limited: bool,
    },
}

struct Uploader {
    config: UploadSettings,
    protocol: Box<dyn Protocol>,
    client: Client,
    shared: Arc<Shared>,
    log: LogLimiter,
    jitter: Jitter,
}

impl Uploader {
    fn run(&mut self) {
        loop {
            let (body, compressed, attempts, deadline) = match self.shared.take() {
                Take::Exit { dropped } => {
                    if dropped > 0 {
                        eprintln!(
                            "otel-profiling: {}: {dropped} profile(s) still queued at the \
                             end of the shutdown timeout were dropped",
                            self.protocol.what()
                        );
                    }
                    return;
                }
                Take::Send {
                    body,
                    compressed,
                    attempts,
                    deadline,
                } => (body, compressed, attempts, deadline),
            };
            // The uncompressed request, kept for a split if the server answers 429.
            let plain = (!compressed).then(|| body.clone());
            // gRPC frames the message itself: its body stays as queued.
            let (body, gzipped) =
                if compressed || self.config.transport != Transport::Http || !self.config.gzip {
                    (body, None)
                } else {
                    match gzip(&body) {
                        Ok(gz) => {
                            let gz = Bytes::from(gz);
                            (gz.clone(), Some(gz))
                        }
                        Err(e) => {
                            self.report(&format!("cannot compress the request: {e}"));
                            self.shared.complete(Outcome::Failed, None);
                            continue;
                        }
                    }
                };
            let mut timeout = self.config.request_timeout;
            if let Some(deadline) = deadline {
                timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
            }
            let timeout = timeout.max(Duration::from_millis(1));
            let body_for_split = body.clone();
            let outcome = match self.attempt(body, timeout) {
                Ok(()) => Outcome::Sent,
                Err(Failure::Permanent(message)) => {
                    self.report(&format!("{message} (not retried; profile dropped)"));
                    Outcome::Failed
                }
                Err(Failure::Partial(message)) => {
                    self.report(&format!("partial success: {message} (not retried)"));
                    Outcome::Sent
                }
                Err(Failure::Retryable {
                    message,
                    retry_after,
                    rate_limited,
                }) => {
                    let made = attempts.saturating_add(1);
                    let delay = match retry_after {
                        Some(asked) => asked.min(self.config.backoff.max),
                        None => self.jitter.up_to(self.config.backoff.cap(made)),
                    };
                    // A push larger than the server's ingestion burst gets 429 every time:
                    // never resend it as is, send two halves instead (until they fit, or
                    // until a profile of one sample is left).
                    let split = if rate_limited && made < self.config.backoff.max_attempts {
                        plain
                            .as_deref()
                            .map(Cow::Borrowed)
                            .or_else(|| gunzip(&body_for_split).ok().map(Cow::Owned))
                            .and_then(|plain| self.protocol.split(&plain))
                    } else {
                        None
                    };
                    if let Some([first, second]) = split {
                        self.report(&format!(
                            "{message} (attempt {made}; split into two smaller pushes, sent in \
                             {} ms)",
                            delay.as_millis()
                        ));
                        Outcome::Split(vec![first, second], Instant::now() + delay)
                    } else if made >= self.config.backoff.max_attempts {
                        self.report(&format!(
                            "{message} (attempt {made} of {made}; profile dropped)"
                        ));
                        Outcome::GaveUp
                    } else {
                        self.report(&format!(
                            "{message} (attempt {made} of {}; retrying in {} ms)",
                            self.config.backoff.max_attempts,
                            delay.as_millis()
                        ));
                        Outcome::Retry(Instant::now() + delay)
                    }
                }
            };
            self.shared.complete(outcome, gzipped);
        }
    }

    /// One attempt to send `body` (gzipped for HTTP, plain for gRPC).
    fn attempt(&mut self, body: Bytes, timeout: Duration) -> Result<(), Failure> {
        // One arm when gRPC is compiled out.
        #[allow(clippy::infallible_destructuring_match)]
        let client = match &mut self.client {
            Client::Http(client) => client,
            #[cfg(feature = "otlp-grpc")]
            Client::Grpc(client) => {
                let answer = client.export(&body, timeout);
                return self.grpc_outcome(answer);
            }
        };
        let response = client
            .post(self.config.endpoint.clone())
            .headers(self.config.headers.clone())
            .timeout(timeout)
            .body(body)
            .send();
        let mut response = match response {
            Ok(response) => response,
            Err(e) => {
                PyroscopeStats::add(&self.shared.stats.network_errors, 1);
                return Err(Failure::Retryable {
                    message: describe(&e, timeout),
                    retry_after: None,
                    rate_limited: false,
                });
            }
        };
        let status = response.status();
        if status.is_success() {
            // Read the answer (so the connection can be reused): OTLP may report a
            // partial success in it.
            let mut answer = Vec::new();
            let _ = (&mut response)
                .take(MAX_RESPONSE_READ)
                .read_to_end(&mut answer);
            if let Some(message) = self.protocol.partial_success(&answer) {
                PyroscopeStats::add(&self.shared.stats.partial_successes, 1);
                return Err(Failure::Partial(truncate(message)));
            }
            return Ok(());
        }
        let retry_after = if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after)
        } else {
            None
        };
        let mut text = Vec::new();
        let _ = (&mut response)
            .take(MAX_RESPONSE_READ)
            .read_to_end(&mut text);
        let message = truncate(format!(
            "HTTP {status}{}",
            self.protocol.error_detail(&text)
        ));
        let stats = &self.shared.stats;
        let class = self.protocol.classify(status);
        let rate_limited = class == StatusClass::RateLimited;
        if class != StatusClass::Permanent {
            let counter = if rate_limited {
                &stats.rate_limited
            } else {
                &stats.server_errors
            };
            PyroscopeStats::add(counter, 1);
            Err(Failure::Retryable {
                message,
                retry_after,
                rate_limited,
            })
        } else {
            PyroscopeStats::add(&stats.rejected, 1);
            let hint = self
                .protocol
                .limit_hint(&message)
                .map_or(String::new(), |h| format!(" [{h}]"));
            Err(Failure::Permanent(format!("{message}{hint}")))
        }
    }

    /// The failure of a gRPC answer, counted like the HTTP ones. Retryable per the OTLP
    /// spec: CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS;
    /// RESOURCE_EXHAUSTED is Pyroscope's ingestion limit (its HTTP 429), treated like a 429.
    #[cfg(feature = "otlp-grpc")]
    fn grpc_outcome(
        &mut self,
        answer: Result<Option<String>, (tonic::Code, String)>,
    ) -> Result<(), Failure> {
        use tonic::Code;
        let stats = &self.shared.stats;
        match answer {
            Ok(None) => Ok(()),
            Ok(Some(partial)) => {
                PyroscopeStats::add(&stats.partial_successes, 1);
                Err(Failure::Partial(truncate(partial)))
            }
            Err((code, message)) => {
                let message = truncate(format!("gRPC {code:?}: {message}"));
                match code {
                    Code::ResourceExhausted => {
                        PyroscopeStats::add(&stats.rate_limited, 1);
                        Err(Failure::Retryable {
                            message,
                            retry_after: None,
                            rate_limited: true,
                        })
                    }
                    Code::Unavailable | Code::DeadlineExceeded => {
                        PyroscopeStats::add(&stats.network_errors, 1);
                        Err(Failure::Retryable {
                            message,
                            retry_after: None,
                            rate_limited: false,
                        })
                    }
                    Code::Cancelled | Code::Aborted | Code::OutOfRange | Code::DataLoss => {
                        PyroscopeStats::add(&stats.server_errors, 1);
                        Err(Failure::Retryable {
                            message,
                            retry_after: None,
                            rate_limited: false,
                        })
                    }
                    _ => {
                        PyroscopeStats::add(&stats.rejected, 1);
                        Err(Failure::Permanent(message))
                    }
                }
            }
        }
    }

    /// Records `message` as the last error and logs it, rate-limited.
    fn report(&mut self, message: &str) {
        self.shared.stats.set_last_error(message);
        if let Some(suppressed) = self.log.permit(Instant::now()) {
            let tail = if suppressed > 0 {
                format!(" [{suppressed} similar message(s) suppressed]")
            } else {
                String::new()
            };
            eprintln!(
                "otel-profiling: {} to {} failed: {message}{tail}",
                self.protocol.what(),
                self.config.endpoint
            );
        }
    }
}

/// Which of Pyroscope's limits a refusal names, and the setting that keeps pushes within
/// it (the first failure and then one line a minute are logged with it).
#[cfg_attr(not(feature = "pyroscope"), allow(dead_code))]
pub(crate) fn pyroscope_limit_hint(message: &str) -> Option<&'static str> {
    let m = message.to_ascii_lowercase();
    let hints: [(&[&str], &str); 4] = [
        (
            &["sample", "stacktrace"],
            "limit: validation.max-profile-stacktrace-samples (16,000 samples per profile by \
             default); lower pyroscope.limits.max_samples_per_profile to the server's value",
        ),
        (
            &[
                "profile size",
                "size_limit",
                "max-profile-size",
                "size limit",
            ],
            "limit: validation.max-profile-size-bytes (4 MiB uncompressed by default); lower \
             pyroscope.limits.max_profile_bytes to the server's value",
        ),
        (
            &["label value", "label_value", "value too long"],
            "limit: validation.max-label-value-length (2048 bytes)",
        ),
        (
            &["labels", "label names", "label_names"],
            "limit: validation.max-label-names-per-series (30)",
        ),
    ];
    hints
        .iter()
        .find(|(needles, _)| needles.iter().any(|n| m.contains(n)))
        .map(|(_, hint)| *hint)
}

/// Inflates a gzipped request body (to split a compressed retry).
fn gunzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out)?;
    Ok(out)
}

/// gzip at the fastest level: the pprof inside is compressed already.
fn gzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() + 64),
        flate2::Compression::fast(),
    );
    encoder.write_all(data)?;
    encoder.finish()
}

/// A network error with its causes (reqwest's own message hides them). The URL in it
/// carries no credentials: the address is refused if it has any.
fn describe(error: &reqwest::Error, timeout: Duration) -> String {
    if error.is_timeout() {
        return format!("no answer within {timeout:?}");
    }
    // reqwest's own message only repeats the URL; the causes say what happened.
    let mut message = String::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        source = cause.source();
    }
    if message.is_empty() {
        message = error.to_string();
    }
    truncate(message)
}

/// `: <code>: <message>` of a Connect error body (`{"code": …, "message": …}`), else the
/// start of the body as text.
#[cfg_attr(not(feature = "pyroscope"), allow(dead_code))]
pub(crate) fn connect_error_detail(body: &[u8]) -> String {
    if body.is_empty() {
        return String::new();
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body) {
        let field = |name: &str| map.get(name).and_then(|v| v.as_str()).unwrap_or_default();
        let (code, message) = (field("code"), field("message"));
        if !code.is_empty() || !message.is_empty() {
            return format!(": {code}: {message}");
        }
    }
    let text: String = String::from_utf8_lossy(body)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    format!(": {}", text.trim())
}

/// `Retry-After` in seconds; the HTTP-date form is not used (the backoff applies).
fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

pub(crate) fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// SplitMix64 seeded from the standard library's per-process random hash keys: enough
/// to spread retries, not for secrets.
#[derive(Debug)]
struct Jitter(u64);

impl Jitter {
    fn new() -> Jitter {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        Jitter(hasher.finish())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, cap]` (full jitter).
    fn up_to(&mut self, cap: Duration) -> Duration {
        let cap = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        let n = match cap.checked_add(1) {
            Some(range) => self.next() % range,
            None => self.next(),
        };
        Duration::from_nanos(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_the_cap() {
        let mut jitter = Jitter::new();
        let cap = Duration::from_millis(10);
        let draws: Vec<Duration> = (0..1000).map(|_| jitter.up_to(cap)).collect();
        assert!(draws.iter().all(|d| *d <= cap));
        assert!(draws.iter().any(|d| *d < cap / 2) && draws.iter().any(|d| *d > cap / 2));
        assert_eq!(jitter.up_to(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn connect_errors_and_retry_after_are_read() {
        assert_eq!(
            connect_error_detail(br#"{"code":"invalid_argument","message":"bad labels"}"#),
            ": invalid_argument: bad labels"
        );
        assert_eq!(
            connect_error_detail(b"upstream\nconnect error"),
            ": upstream connect error"
        );
        assert_eq!(connect_error_detail(b""), "");
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}
