//! What writing spans to the local directory costs a service (issue 40): the local span
//! exporter against the path it replaced (OTLP message types + serde_json, the same
//! OTLP JSON lines), measured in one run.
//!
//! 1. **Per span**: the same batches (512 spans like a tracing-opentelemetry request's,
//!    7–13 attributes) encoded and appended to a file by each, in alternating rounds.
//! 2. **On a service**: two threads run 28 µs requests of three spans each through the
//!    SDK's batch processor, whose exporter is, each once a round in rotating order, one
//!    that drops the spans, the serde one, the local span exporter, or OTLP/HTTP protobuf
//!    (plain and gzip, as the one-call setup builds it) to a local receiver that reads and
//!    discards; requests per second of each with the ratio to dropping and its 95 %
//!    interval over the rounds. On 2 cores the exporter's thread (and the receiver) take
//!    their CPU from the requests.
//!
//! Run: `cargo bench -p otel-profiling --bench span_file` (`SPAN_FILE_ROUNDS`, default 8;
//! `SPAN_FILE_ROUND_MS`, default 1000).

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracerProvider, SpanData, SpanEvents, SpanExporter, SpanLinks,
};
use opentelemetry_sdk::Resource;
use otel_profiling::local_sink::LocalSpanExporter;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The exporter the local sink had before: message types, serde_json, one line a batch.
#[derive(Debug)]
struct SerdeLines {
    file: Mutex<File>,
    resource: ResourceAttributesWithSchema,
}

impl SerdeLines {
    fn new(path: &Path) -> SerdeLines {
        SerdeLines {
            file: Mutex::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("file"),
            ),
            resource: ResourceAttributesWithSchema::from(&resource()),
        }
    }

    fn write(&self, batch: Vec<SpanData>) {
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let mut line = serde_json::to_vec(&request).expect("encodes");
        line.push(b'\n');
        let mut file = self.file.lock().expect("lock");
        file.write_all(&line).expect("write");
    }
}

impl SpanExporter for SerdeLines {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.write(batch);
        Ok(())
    }
}

/// Drops every span: the service's cost without any span output.
#[derive(Debug)]
struct Drop;

impl SpanExporter for Drop {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        black_box(batch);
        Ok(())
    }
}

fn resource() -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "span-file-bench"),
            KeyValue::new("service.version", "1.0.0"),
        ])
        .build()
}

/// A span as `tracing-opentelemetry` exports one of a request: its code location, thread,
/// target and timings, and for the root the bridge's evidence.
fn span(n: u64, scope: &InstrumentationScope) -> SpanData {
    let root = n.is_multiple_of(3);
    let mut attributes = vec![
        KeyValue::new("code.file.path", "src/handlers/items.rs"),
        KeyValue::new("code.module.name", "service::handlers::items"),
        KeyValue::new("code.line.number", 160 + (n % 7) as i64),
        KeyValue::new("thread.id", (n % 4) as i64),
        KeyValue::new("target", "service::handlers::items"),
        KeyValue::new("busy_ns", 5_109 + n as i64),
        KeyValue::new("idle_ns", 1_734 + n as i64),
    ];
    if root {
        attributes.extend([
            KeyValue::new("pyroscope.profile.id", format!("{:016x}", n + 1)),
            KeyValue::new("profiling.cpu.samples", 0_i64),
            KeyValue::new("profiling.cpu.time_ns", 0_i64),
            KeyValue::new("profiling.wall.active_ns", 4_498_i64),
            KeyValue::new("profiling.wall.runqueue_ns", 0_i64),
            KeyValue::new("profiling.cgroup.throttled_ns", 0_i64),
        ]);
    }
    let start = SystemTime::now();
    SpanData {
        span_context: SpanContext::new(
            TraceId::from(0xfabe_76cf_56d1_1e40_5043_39a7_0ef3_c8a3 + u128::from(n / 3)),
            SpanId::from(n + 1),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: if root {
            SpanId::INVALID
        } else {
            SpanId::from(n - n % 3 + 1)
        },
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: if root {
            format!("GET /item/{}", n % 1000).into()
        } else {
            "load".into()
        },
        start_time: start,
        end_time: start + Duration::from_micros(28),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: scope.clone(),
    }
}

fn batches(count: usize) -> Vec<Vec<SpanData>> {
    let scope = InstrumentationScope::builder("tracing-opentelemetry").build();
    (0..count)
        .map(|b| {
            (0..512)
                .map(|i| span((b * 512 + i) as u64, &scope))
                .collect()
        })
        .collect()
}

fn per_span(dir: &Path, rounds: u64) {
    let batches = batches(8);
    let spans = batches.iter().map(Vec::len).sum::<usize>() as f64;
    let old_path = dir.join("serde_spans.jsonl");
    let new_dir = dir.join("local");
    let mut new = LocalSpanExporter::new(&new_dir).expect("exporter");
    new.set_resource(&resource());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let (mut old_ns, mut new_ns, mut clone_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(3) {
        // Both take the batch by value, as exporters do: the clone is timed apart.
        let t = Instant::now();
        for batch in &batches {
            black_box(batch.clone());
        }
        clone_ns.push(t.elapsed().as_nanos() as f64 / spans);
        // The old file is emptied each round: both write the same bytes a round at most.
        let old = SerdeLines::new(&old_path);
        old.file.lock().expect("lock").set_len(0).expect("truncate");
        let t = Instant::now();
        for batch in &batches {
            old.write(batch.clone());
        }
        old_ns.push(t.elapsed().as_nanos() as f64 / spans);
        let t = Instant::now();
        for batch in &batches {
            runtime.block_on(new.export(batch.clone())).expect("export");
        }
        new_ns.push(t.elapsed().as_nanos() as f64 / spans);
    }
    let old_bytes = std::fs::metadata(&old_path).map_or(0, |m| m.len()) as f64 / spans;
    // The local exporter's files rotate: its bytes are those of one pass in a fresh
    // directory.
    let bytes_dir = dir.join("bytes");
    let mut once = LocalSpanExporter::new(&bytes_dir).expect("exporter");
    once.set_resource(&resource());
    for batch in &batches {
        runtime
            .block_on(once.export(batch.clone()))
            .expect("export");
    }
    let new_bytes = std::fs::read_dir(&bytes_dir)
        .expect("dir")
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum::<u64>() as f64
        / spans;
    let clone = median(&mut clone_ns);
    let (old_med, new_med) = (median(&mut old_ns) - clone, median(&mut new_ns) - clone);
    println!(
        "per span (encoded and written, net of the {clone:.0} ns clone of the batch): serde path \
         {old_med:.0} ns, {old_bytes:.0} bytes; local span exporter {new_med:.0} ns, \
         {new_bytes:.0} bytes; {:.1}x faster, {:.2} of the bytes",
        old_med / new_med,
        new_bytes / old_bytes
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Requests per second of two threads doing 28 µs requests of three spans, spans going to
/// `exporter` through the SDK's batch processor, for `round`.
fn throughput<E: SpanExporter + 'static>(exporter: E, round: Duration) -> f64 {
    let provider = SdkTracerProvider::builder()
        .with_resource(resource())
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        .build();
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let tracer = provider.tracer("bench");
            let (done, stop) = (done.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let root = tracer.start(format!("GET /item/{}", n % 100));
                    let cx = Context::current().with_span(root);
                    for child in ["load", "render"] {
                        let mut span = tracer.start_with_context(child, &cx);
                        span.set_attribute(KeyValue::new("thread.id", t as i64));
                        spin(Duration::from_micros(14));
                        span.end();
                    }
                    cx.span().end();
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(round);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker");
    }
    let _ = provider.shutdown();
    done.load(Ordering::Relaxed) as f64 / round.as_secs_f64()
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        black_box(0);
    }
}

/// A local OTLP/HTTP receiver that reads each request and answers 200 with an empty
/// body, as a collector on the same host would (its CPU shares the two cores too);
/// returns its `/v1/traces` URL.
#[cfg(feature = "otlp-http")]
fn discarding_receiver() -> String {
    use std::io::{BufRead, BufReader, Read};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut writer = stream;
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        let line = line.trim_end();
                        if line.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                                   content-length: 0\r\n\r\n";
                    if writer.write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://127.0.0.1:{port}/v1/traces")
}

/// The OTLP/HTTP protobuf exporter as the one-call setup builds it, to `url`.
#[cfg(feature = "otlp-http")]
fn otlp_http(url: &str, gzip: bool) -> opentelemetry_otlp::SpanExporter {
    use opentelemetry_otlp::WithExportConfig;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url);
    if gzip {
        use opentelemetry_otlp::WithHttpConfig;
        builder = builder.with_compression(opentelemetry_otlp::Compression::Gzip);
    }
    builder.build().expect("OTLP exporter")
}

fn on_a_service(dir: &Path, rounds: u64, round: Duration) {
    type Variant<'a> = (&'static str, Box<dyn Fn(u64) -> f64 + 'a>);
    #[cfg_attr(not(feature = "otlp-http"), allow(unused_mut))]
    let mut variants: Vec<Variant<'_>> = vec![
        ("spans dropped", Box::new(|_| throughput(Drop, round))),
        (
            "serde path (before)",
            Box::new(|r| {
                let path = dir.join(format!("serde-{r}_spans.jsonl"));
                let n = throughput(SerdeLines::new(&path), round);
                let _ = std::fs::remove_file(&path);
                n
            }),
        ),
        (
            "local span exporter",
            Box::new(|r| {
                let new_dir = dir.join(format!("local-{r}"));
                let n = throughput(LocalSpanExporter::new(&new_dir).expect("exporter"), round);
                let _ = std::fs::remove_dir_all(&new_dir);
                n
            }),
        ),
    ];
    #[cfg(feature = "otlp-http")]
    {
        let url = discarding_receiver();
        let gz_url = url.clone();
        variants.push((
            "OTLP/HTTP protobuf",
            Box::new(move |_| throughput(otlp_http(&url, false), round)),
        ));
        variants.push((
            "OTLP/HTTP protobuf, gzip",
            Box::new(move |_| throughput(otlp_http(&gz_url, true), round)),
        ));
    }
    let k = variants.len();
    let mut rps = vec![Vec::new(); k];
    for r in 0..rounds {
        // Each round starts at another variant, so none always runs after the same one.
        let mut line = format!("  round {r}:");
        for i in 0..k {
            let v = (i + r as usize) % k;
            rps[v].push((variants[v].1)(r));
        }
        for (v, (name, _)) in variants.iter().enumerate() {
            line += &format!(" {name} {:.0}/s;", rps[v][r as usize]);
        }
        println!("{line}");
    }
    println!(
        "on a service (2 threads, 28 us requests of 3 spans, {rounds} rounds, each variant once \
         a round): requests per second, and as a share of dropping the spans (mean ± 95 % over \
         the rounds' pairs)"
    );
    for (v, (name, _)) in variants.iter().enumerate() {
        let ratios: Vec<f64> = rps[v].iter().zip(&rps[0]).map(|(x, d)| x / d).collect();
        let (mean, half) = mean_ci(&ratios);
        let per_s = rps[v].iter().sum::<f64>() / rps[v].len() as f64;
        println!("  {name:<26} {per_s:>9.0}/s  {mean:.3} ± {half:.3}");
    }
}

/// Mean and 95 % half-width (t quantile) of `v`.
fn mean_ci(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, f64::NAN);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    const T95: [f64; 10] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23];
    let t = T95.get(v.len() - 2).copied().unwrap_or(2.0);
    (mean, t * (var / n).sqrt())
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument that is not ours skips the run.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && a != "span_file")
    {
        return;
    }
    let rounds = env_u64("SPAN_FILE_ROUNDS", 8);
    let round = Duration::from_millis(env_u64("SPAN_FILE_ROUND_MS", 1000));
    let dir: PathBuf = std::env::temp_dir().join(format!("span-file-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    per_span(&dir, rounds);
    on_a_service(&dir, rounds, round);
    let _ = std::fs::remove_dir_all(&dir);
}
