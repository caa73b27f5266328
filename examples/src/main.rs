//! The demo, end to end on the embedded default (no server, no Docker):
//!
//! 1. starts the slow inventory dependency (a local TCP service with 40 ms latency);
//! 2. runs the example service twice as a child process, release `1.4.0` (healthy
//!    serializer) then `1.5.0` (the paged serializer regression), each under load for
//!    20 s, with the profiler writing pprof files and OTLP span lines to one directory;
//! 3. prints the span report (wall vs CPU per endpoint and release, verdicts, top
//!    functions, allocations a request and where) and the diff of `GET /report` between
//!    the two releases.
//!
//! Run: `cargo run -p otel-profiling-examples --bin demo`. With `OTEL_EXPORTER_OTLP_ENDPOINT`
//! and `PYROSCOPE_SERVER_ADDRESS` set (the compose stack), the services send there instead.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use otel_profiling_examples::{app, inventory, load, service};

/// The bridge's allocator: the services also profile allocations by span, so the report
/// and the diff say what each endpoint and release allocates, and where.
#[global_allocator]
static ALLOC: otel_profiling::ProfilingAllocator = otel_profiling::ProfilingAllocator::system();

/// Set in the child processes the demo starts; outside `OTEL_PROFILING_*`, whose
/// variables the bridge does not read it warns about.
const ROLE_VAR: &str = "DEMO_CHILD_ROLE";
const RELEASES: [(&str, &str); 2] = [("1.4.0", "v1"), ("1.5.0", "paged")];
const LOAD_FOR: Duration = Duration::from_secs(20);

fn main() {
    if std::env::var(ROLE_VAR).as_deref() == Ok("service") {
        if let Err(err) = app::main_from_env() {
            eprintln!("demo service: {err}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(err) = orchestrate() {
        eprintln!("demo: {err}");
        std::process::exit(1);
    }
}

fn orchestrate() -> Result<(), Box<dyn std::error::Error>> {
    let dir = otel_profiling::local_sink::output_dir(None).join("demo");
    clear_previous_run(&dir)?;
    let remote = std::env::var_os("PYROSCOPE_SERVER_ADDRESS").is_some();
    println!(
        "otel-profiling demo: a tokio/axum service, two releases, load, CPU profiles per span"
    );
    if remote {
        println!("profiles go to PYROSCOPE_SERVER_ADDRESS; traces per OTEL_EXPORTER_OTLP_ENDPOINT");
    } else {
        println!("files: {}", dir.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let inventory = runtime.block_on(inventory::serve(Duration::from_millis(40)))?;
    let rows = service::calibrate_rows(Duration::from_millis(100));
    println!("report size: {rows} rows (a healthy serialization takes ~100 ms on this build)\n");

    for (version, serializer) in RELEASES {
        println!("== release {version} (serializer `{serializer}`): starting the service");
        let (mut child, url) = start_service(version, serializer, rows, inventory, &dir)?;
        println!(
            "   {url}: /report, /orders and /export under load for {}s",
            LOAD_FOR.as_secs()
        );
        let stats = runtime.block_on(load::run(
            &url,
            LOAD_FOR,
            2,
            2,
            1,
            Duration::from_secs(5),
            |s, t| println!("  {}", s.progress_line(t)),
        ));
        stop_service(&mut child)?;
        if stats.errors.load(Relaxed) > 0 {
            return Err(format!("{} requests failed", stats.errors.load(Relaxed)).into());
        }
    }
    drop(runtime);

    if remote {
        println!("\nprofiles and traces were sent to the stack: open Grafana (see docs/stack.md)");
        return Ok(());
    }
    println!();
    print_report(&dir)?;
    println!("\nfiles of this run ({}):", dir.display());
    for file in list(&dir)? {
        println!("  {}", file.display());
    }
    println!(
        "more: `cargo run -p otel-profiling-cli -- report {}`",
        dir.display()
    );
    Ok(())
}

fn print_report(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let report = otel_profiling_cli::report::SpanReport::from_dirs(&[dir.to_path_buf()])?;
    println!("{report}");
    let diff = otel_profiling_cli::diff::VersionDiff::between_versions(
        dir,
        "GET /report",
        RELEASES[0].0,
        RELEASES[1].0,
    )?;
    println!("{diff}");
    Ok(())
}

fn start_service(
    version: &str,
    serializer: &str,
    rows: usize,
    inventory: std::net::SocketAddr,
    dir: &Path,
) -> Result<(Child, String), Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(ROLE_VAR, "service")
        .env("SERVICE_VERSION", version)
        .env("REPORT_SERIALIZER", serializer)
        .env("REPORT_ROWS", rows.to_string())
        .env("BIND_ADDR", "127.0.0.1:0")
        .env("INVENTORY_ADDR", inventory.to_string())
        .env("SHUTDOWN_ON_STDIN_EOF", "1")
        .env("OTEL_PROFILING_OUTPUT_DIR", dir)
        .env("PYROSCOPE_UPLOAD_INTERVAL", "5s")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout from the service")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .ok_or_else(|| format!("the service did not start: {line:?}"))?
        .to_string();
    Ok((child, url))
}

/// Closes the service's standard input (its shutdown signal) and waits for it to write its
/// last profile; kills it after 30 s.
fn stop_service(child: &mut Child) -> Result<(), Box<dyn std::error::Error>> {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait()? {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("the service exited with {status}").into())
            };
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return Err("the service did not stop within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn list(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    Ok(files)
}

/// Removes the previous demo run's files so the report covers this run only.
fn clear_previous_run(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for file in list(dir)? {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| otel_profiling::local_sink::is_sink_file(&n)) {
            std::fs::remove_file(&file)?;
        }
    }
    Ok(())
}
