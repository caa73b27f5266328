//! The `otel-profiling-standin` binary: its three address lines, a span in and back out
//! through Tempo's APIs, a clean exit on SIGTERM, and exit 1 naming a busy port.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

const BIN: &str = env!("CARGO_BIN_EXE_otel-profiling-standin");

/// Kills the child if a test fails before it exits.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "still running after {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Percent-encodes a URL query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn export_request(trace_id: [u8; 16], span_id: [u8; 8], name: &str) -> ExportTraceServiceRequest {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("standin-server-test".into())),
                    }),
                    ..KeyValue::default()
                }],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: trace_id.to_vec(),
                    span_id: span_id.to_vec(),
                    name: name.into(),
                    kind: 2,
                    start_time_unix_nano: now - 5_000_000,
                    end_time_unix_nano: now,
                    ..Span::default()
                }],
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

#[test]
fn serves_prints_its_addresses_and_exits_0_on_sigterm() {
    let child = Command::new(BIN)
        .args(["--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the stand-in binary starts");
    let mut child = Running(child);
    let stdout = child.0.stdout.take().expect("piped stdout");
    // Read on a thread: a stand-in that never prints must fail the test, not hang it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    for _ in 0..3 {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("an address line within 30 s")
            .expect("UTF-8 stdout");
        lines.push(line);
    }
    let base = lines[0]
        .strip_prefix("otlp: ")
        .unwrap_or_else(|| panic!("first line {:?}", lines[0]))
        .to_string();
    let port = base
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("not http://127.0.0.1:PORT: {base:?}"));
    assert_ne!(port, 0);
    assert_eq!(
        lines,
        [
            format!("otlp: http://127.0.0.1:{port}"),
            format!("tempo: http://127.0.0.1:{port}"),
            format!("pyroscope: http://127.0.0.1:{port}"),
        ]
    );

    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let trace_id = [
        0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47,
        0x36,
    ];
    let span_id = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
    let name = "GET /standin \"quoted\"";
    let response = http
        .post(format!("{base}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(export_request(trace_id, span_id, name).encode_to_vec())
        .send()
        .expect("POST /v1/traces");
    assert_eq!(response.status(), 200);

    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let response = http
        .get(format!("{base}/api/traces/{}", hex(&trace_id)))
        .send()
        .expect("GET /api/traces");
    assert_eq!(response.status(), 200);
    let trace: serde_json::Value = response.json_body();
    assert_eq!(
        trace["batches"][0]["scopeSpans"][0]["spans"][0]["name"], name,
        "{trace}"
    );

    let q = format!("{{name=\"{}\"}}", name.replace('"', "\\\""));
    let response = http
        .get(format!("{base}/api/search?q={}", encode(&q)))
        .send()
        .expect("GET /api/search");
    assert_eq!(response.status(), 200);
    let found: serde_json::Value = response.json_body();
    let trace = &found["traces"][0];
    assert_eq!(trace["traceID"], hex(&trace_id), "{found}");
    assert_eq!(trace["rootServiceName"], "standin-server-test");
    assert_eq!(trace["spanSet"]["spans"][0]["spanID"], hex(&span_id));
    assert_eq!(trace["spanSet"]["spans"][0]["name"], name);

    // An unsupported query: Tempo's plain-text 400, naming the part.
    let response = http
        .get(format!(
            "{base}/api/search?q={}",
            encode("{name=\"a\"} >> {name=\"b\"}")
        ))
        .send()
        .expect("GET /api/search");
    assert_eq!(response.status(), 400);
    let text = response.text().expect("a body");
    assert!(
        text.starts_with("the stand-in supports only") && text.contains("`>>`"),
        "{text}"
    );

    let pid = i32::try_from(child.0.id()).expect("a pid fits i32");
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child.0, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn a_busy_port_is_exit_1_naming_it() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = busy.local_addr().expect("bound").port();
    let child = Command::new(BIN)
        .args(["--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the stand-in binary starts");
    let mut child = Running(child);
    let status = wait_exit(&mut child.0, Duration::from_secs(10));
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let mut stdout = String::new();
    child
        .0
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_string(&mut stdout)
        .expect("stdout");
    assert_eq!(status.code(), Some(1), "{status}; stderr: {stderr}");
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(stdout.is_empty(), "no address printed: {stdout}");
    drop(busy);
}

/// `response.json()` needs reqwest's `json` feature; the body parsed with serde_json.
trait JsonBody {
    fn json_body(self) -> serde_json::Value;
}

impl JsonBody for reqwest::blocking::Response {
    fn json_body(self) -> serde_json::Value {
        let text = self.text().expect("a body");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }
}
