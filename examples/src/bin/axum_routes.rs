//! The axum + tower-http service with route-named spans, end to end on local files:
//! serves `GET /cpu` (CPU-heavy), `GET /io` (awaits a slow TCP dependency) and `GET /sleep`
//! (`std::thread::sleep` in the handler) under load for 10 s, then prints the span report,
//! one row per route.
//!
//! Run: `cargo run -p otel-profiling-examples --bin axum_routes` (`AXUM_ROUTES_SECONDS`
//! changes the load time). Files go to `<output dir>/axum-routes/`.

use std::time::Duration;

use otel_profiling_examples::axum_routes;

fn main() {
    if let Err(err) = run() {
        eprintln!("axum_routes: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), axum_routes::RunError> {
    let seconds = match std::env::var("AXUM_ROUTES_SECONDS") {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("AXUM_ROUTES_SECONDS: got {text:?}, expected whole seconds"))?,
        Err(_) => 10,
    };
    let dir = otel_profiling::local_sink::output_dir(None).join("axum-routes");
    clear_previous_run(&dir)?;
    println!("GET /cpu, /io and /sleep under load for {seconds} s ...");
    let summary = axum_routes::run(&dir, Duration::from_secs(seconds))?;
    let [cpu, io, sleep] = summary.answered;
    println!(
        "answered: /cpu {cpu}, /io {io}, /sleep {sleep}; failed {}\n",
        summary.failed
    );
    let report = otel_profiling_cli::report::SpanReport::from_dirs(std::slice::from_ref(&dir))?;
    println!("{report}");
    Ok(())
}

/// Removes the previous run's files so the report covers this run only.
fn clear_previous_run(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| otel_profiling::local_sink::is_sink_file(&n)) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}
