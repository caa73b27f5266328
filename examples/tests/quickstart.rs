//! The README's common case is `src/bin/quickstart.rs`, compiled with the crate and run
//! here: it serves, takes requests, stops on Ctrl-C (SIGINT) and leaves its profiles and
//! spans; and with an OTLP endpoint configured (one that never answers) it still shuts
//! down cleanly from inside `#[tokio::main]`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};

#[test]
fn the_readme_quickstart_is_the_compiled_one() {
    let readme = include_str!("../../README.md");
    let code = include_str!("../src/bin/quickstart.rs");
    assert!(
        readme.contains(&format!("```rust,ignore\n{code}```\n")),
        "the README's quickstart block differs from examples/src/bin/quickstart.rs: copy the \
         file into the README"
    );
}

fn get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
}

/// Runs the quickstart with `envs`, sends it two requests and SIGINT; its output dir.
fn run(envs: &[(&str, String)], dir: &std::path::Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .env("ADDRESS", "127.0.0.1:0")
        .env("OTEL_PROFILING_OUTPUT_DIR", dir)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the quickstart starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the listening line");
    let address = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(get(&address, "/work").contains("hits"));
    assert!(get(&address, "/wait").contains("done"));
    assert!(get(&address, "/blocking").contains("summed"));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("it stops");
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An OTLP endpoint that accepts connections and never answers (the connections held).
fn endpoint_that_never_answers() -> String {
    let hole = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", hole.local_addr().expect("address"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in hole.incoming().flatten() {
            held.push(stream);
        }
    });
    endpoint
}

#[test]
fn the_quickstart_serves_stops_on_ctrl_c_and_leaves_its_data() {
    let dir =
        std::env::temp_dir().join(format!("otel-profiling-quickstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    run(&[], &dir);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("output dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let spans = names
        .iter()
        .find(|n| n.ends_with("_spans.jsonl"))
        .unwrap_or_else(|| panic!("a span file: {names:?}"));
    let text = std::fs::read_to_string(dir.join(spans)).expect("spans");
    assert!(
        text.contains("GET /work") && text.contains("GET /wait") && text.contains("GET /blocking"),
        "{text}"
    );
    assert!(names.iter().any(|n| n.ends_with("_cpu.pb.gz")), "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);

    // Spans over OTLP/HTTP to an endpoint that never answers: the guard, dropped after the
    // runtime, still shuts down within its timeout.
    let endpoint = endpoint_that_never_answers();
    run(&[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)], &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README stays a page a service owner reads: the two commands, the common case, what
/// you get and where the rest is (the reference lives in docs/).
#[test]
fn the_readme_stays_short_and_starts_with_the_two_commands() {
    let readme = include_str!("../../README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move reference material to docs/"
    );
    assert!(readme.starts_with(
        "# otel-profiling\n\n```sh\ncargo run -p otel-profiling-examples --bin demo\ncargo test --workspace\n```\n"
    ));
}

/// A guard dropped inside the runtime (an `async fn main` that drops it at its end, as
/// many services do, against the quickstart's advice) with spans over OTLP/HTTP to an
/// endpoint that never answers: no panic of the blocking HTTP client, and it returns
/// within its shutdown timeout.
#[test]
fn a_guard_dropped_inside_the_runtime_shuts_down_within_its_timeout() {
    let endpoint = endpoint_that_never_answers();
    let dir = std::env::temp_dir().join(format!("otel-profiling-inside-{}", std::process::id()));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let took = runtime.block_on(async {
        let telemetry = otel_profiling::Telemetry::builder()
            .service_name("inside")
            .otlp(
                &endpoint,
                otel_profiling::config::OtlpProtocol::HttpProtobuf,
            )
            .expect("endpoint")
            .output_dir(&dir)
            .shutdown_timeout(std::time::Duration::from_secs(2))
            .quiet(true)
            .build()
            .expect("setup");
        let tracer = opentelemetry::trace::TracerProvider::tracer(telemetry.tracer_provider(), "t");
        drop(opentelemetry::trace::Tracer::start(&tracer, "GET /inside"));
        let start = std::time::Instant::now();
        drop(telemetry);
        start.elapsed()
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        took < std::time::Duration::from_secs(10),
        "shutdown took {took:?}"
    );
}
