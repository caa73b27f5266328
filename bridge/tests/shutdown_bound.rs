//! A backend that accepts connections and never answers: dropping the guard takes at most
//! the shutdown timeout in all (not once per exporter), and says what was lost, naming the
//! endpoint. Runs in a child process, whose stderr the parent reads.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;

const CHILD: &str = "OTEL_PROFILING_SHUTDOWN_CHILD";
const TIMEOUT: Duration = Duration::from_secs(1);

/// A listener that takes every connection and never reads or writes.
fn black_hole() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    format!("http://{address}")
}

#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let url = black_hole();
    let telemetry = otel_profiling::Telemetry::builder()
        .service_name("black-hole")
        .otlp(&url, otel_profiling::config::OtlpProtocol::HttpProtobuf)
        .expect("otlp")
        .pyroscope(&url, None, None)
        .expect("pyroscope")
        .upload_interval(Duration::from_millis(200))
        .shutdown_timeout(TIMEOUT)
        .quiet(true)
        .build()
        .expect("setup");
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(telemetry.layer()));
    tracing::dispatcher::with_default(&dispatch, || {
        for _ in 0..20 {
            let _span = tracing::info_span!("GET /black-hole").entered();
            let until = Instant::now() + Duration::from_millis(30);
            while Instant::now() < until {
                std::hint::black_box(0u64);
            }
        }
    });
    drop(dispatch);
    let start = Instant::now();
    drop(telemetry);
    println!("shutdown took {} ms", start.elapsed().as_millis());
}

#[test]
fn shutdown_is_bounded_by_one_timeout_and_says_what_was_lost() {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let took: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("shutdown took "))
        .and_then(|l| l.strip_suffix(" ms"))
        .and_then(|ms| ms.parse().ok())
        .expect("the child says how long shutdown took");
    eprintln!(
        "shutdown took {took} ms (timeout {} ms)",
        TIMEOUT.as_millis()
    );
    assert!(
        took <= TIMEOUT.as_millis() as u64 + 500,
        "shutdown took {took} ms, past the {} ms timeout",
        TIMEOUT.as_millis()
    );
    assert!(
        stderr.contains("not exported")
            && stderr.contains("span(s) to http://127.0.0.1")
            && stderr.contains("profile(s) to http://127.0.0.1"),
        "what was lost, and where to: {stderr}"
    );
}
