//! `otel-profiling-standin`: the in-process stand-in for Tempo and Pyroscope served on its
//! own — a **stand-in for tests, not a backend**.
//!
//! ```text
//! otel-profiling-standin [--port N]
//! ```
//!
//! Everything it receives is kept in memory and lost when it stops; nothing is compacted,
//! downsampled or persisted. One loopback port serves OTLP/HTTP and OTLP/gRPC ingest,
//! Tempo's trace-by-id and search APIs, and Pyroscope's push, OTLP profiles intake and
//! querier calls (see the `standin` module of `otel-profiling-integration-tests`).
//!
//! Once it listens it prints, and flushes, exactly three lines on stdout, in this order:
//!
//! ```text
//! otlp: http://127.0.0.1:PORT
//! tempo: http://127.0.0.1:PORT
//! pyroscope: http://127.0.0.1:PORT
//! ```
//!
//! It exits 0 on SIGINT or SIGTERM, 1 when it cannot listen (e.g. the port is busy; the
//! message on stderr names the port), 2 on usage errors.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use otel_profiling_integration_tests::standin::{Limits, StandIn};
use tokio::signal::unix::{signal, SignalKind};

/// Serves the stand-in for Tempo and Pyroscope (for tests, not a backend: in memory,
/// nothing persisted) on one loopback port until SIGINT or SIGTERM.
#[derive(Parser, Debug)]
#[command(name = "otel-profiling-standin", version)]
struct Cli {
    /// Port on 127.0.0.1 to listen on; 0 or absent: any free port.
    #[arg(long, value_name = "N", default_value_t = 0)]
    port: u16,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.port) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("otel-profiling-standin: {message}");
            ExitCode::from(1)
        }
    }
}

fn run(port: u16) -> Result<(), String> {
    // The server runs on the stand-in's own thread; this runtime only waits for signals.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(async {
        let standin = StandIn::start_on(port, Limits::default()).map_err(|e| e.to_string())?;
        // Handlers are installed before the address is printed: whoever reads it may
        // signal at once and must get the clean exit, not the default (death by signal).
        let mut interrupt =
            signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
        let mut terminate =
            signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
        let url = standin.url();
        let mut out = std::io::stdout().lock();
        writeln!(out, "otlp: {url}")
            .and_then(|()| writeln!(out, "tempo: {url}"))
            .and_then(|()| writeln!(out, "pyroscope: {url}"))
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write the addresses to stdout: {e}"))?;
        drop(out);
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        // Stops the server (graceful: requests in flight are answered) and its thread.
        drop(standin);
        Ok(())
    })
}
