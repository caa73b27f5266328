//! Drives a running example service with a mix of requests and prints progress.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Sends CPU-heavy, I/O-bound and blocking requests to a running example service.
#[derive(Debug, Parser)]
#[command(name = "load", version)]
struct Args {
    /// The service's base URL.
    #[arg(default_value = "http://127.0.0.1:8080")]
    base_url: String,
    /// How long to run, in whole seconds.
    #[arg(default_value_t = 60)]
    seconds: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("load: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stats = runtime.block_on(otel_profiling_examples::load::run(
        args.base_url.trim_end_matches('/'),
        Duration::from_secs(args.seconds),
        2,
        2,
        1,
        Duration::from_secs(5),
        |s, t| println!("{}", s.progress_line(t)),
    ));
    if stats.errors.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_a_bad_duration() {
        let args = Args::try_parse_from(["load"]).expect("defaults");
        assert_eq!(
            (args.base_url.as_str(), args.seconds),
            ("http://127.0.0.1:8080", 60)
        );
        let args = Args::try_parse_from(["load", "http://h:1/", "5"]).expect("both");
        assert_eq!((args.base_url.as_str(), args.seconds), ("http://h:1/", 5));
        let err = Args::try_parse_from(["load", "http://h:1", "soon"]).expect_err("not a number");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("SECONDS"), "{err}");
    }
}
