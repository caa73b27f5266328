//! Runs the verification checklist against a running stack and prints a pass/fail table.
//!
//! ```text
//! checklist [--tempo URL] [--pyroscope URL] [--otlp URL] [--timeout SECS] [--standin]
//!           [--profiles-over-otlp]
//! ```
//!
//! URLs default to `TEMPO_URL`, `PYROSCOPE_URL` and `OTEL_EXPORTER_OTLP_ENDPOINT`.
//! `--standin` starts the in-process stand-in (a stand-in for tests, not a backend)
//! instead. Exit code 0 when every check passes, 1 when one fails, 2 on usage errors.
//!
//! `checklist record ...` is the internal mode that records one scenario in this process
//! (the parent runs it as a child: the profiler is process-global).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use otel_profiling_integration_tests::checklist::{record_all, run_all, Backends};
use otel_profiling_integration_tests::clients::Auth;
use otel_profiling_integration_tests::standin::StandIn;
use otel_profiling_integration_tests::workload::{record, RecordSpec, Scenario};

/// Runs the verification checklist against a stack (Tempo, Pyroscope, an OTLP receiver)
/// and prints a pass/fail table with the evidence of each check.
///
/// Exit code 0 when every check passes, 1 when one fails, 2 on usage errors.
#[derive(Parser, Debug)]
#[command(name = "checklist", version)]
struct Cli {
    /// Tempo's HTTP API.
    #[arg(long, env = "TEMPO_URL", value_name = "URL")]
    tempo: Option<String>,
    /// Pyroscope's HTTP API.
    #[arg(long, env = "PYROSCOPE_URL", value_name = "URL")]
    pyroscope: Option<String>,
    /// Where the recorded operations send their spans (OTLP/HTTP).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    otlp: Option<String>,
    /// How long to wait for each trace and profile to become queryable.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    timeout: u64,
    /// Start the in-process stand-in (a stand-in for tests, not a backend) instead of
    /// using a stack.
    #[arg(long, conflicts_with_all = ["tempo", "pyroscope", "otlp"])]
    standin: bool,
    /// Ship the recordings' profiles as OTLP profiles to Pyroscope's
    /// `/v1development/profiles` instead of its push API; the checks are the same.
    #[arg(long, env = "CHECKLIST_PROFILES_OVER_OTLP", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    profiles_over_otlp: bool,
    #[command(subcommand)]
    mode: Option<Mode>,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Internal: records one scenario in this process (the parent runs it as a child,
    /// since the profiler is process-global).
    #[command(hide = true)]
    Record(RecordArgs),
}

#[derive(Args, Debug)]
struct RecordArgs {
    #[arg(long)]
    otlp: String,
    #[arg(long)]
    pyroscope: String,
    #[arg(long)]
    service: String,
    #[arg(long)]
    version: String,
    #[arg(long, value_parser = parse_scenario)]
    scenario: Scenario,
    #[arg(long)]
    no_profile_id: bool,
    #[arg(long)]
    profiles_over_otlp: bool,
}

fn parse_scenario(text: &str) -> Result<Scenario, String> {
    Scenario::parse(text).ok_or_else(|| format!("unknown scenario {text}"))
}

/// A usage error found after parsing, reported the way clap reports its own.
fn usage(message: &str) -> ExitCode {
    eprintln!("error: {message}\n\nFor more information, try '--help'.");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Mode::Record(args)) = cli.mode {
        return record_mode(args);
    }
    let blank = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let timeout = cli.timeout;
    let _guard;
    let backends = if cli.standin {
        let s = match StandIn::start() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("checklist: starting the stand-in: {e}");
                return ExitCode::from(1);
            }
        };
        let url = s.url();
        println!("using the in-process stand-in at {url} (a stand-in for tests, not a backend)");
        _guard = s;
        Backends::new(&url, &url, &url, Duration::from_secs(timeout.min(5)))
    } else {
        match (blank(cli.tempo), blank(cli.pyroscope), blank(cli.otlp)) {
            (Some(t), Some(p), Some(o)) => Backends::new(&t, &p, &o, Duration::from_secs(timeout))
                .and_then(|b| {
                    Ok(b.with_auth(Auth::from_env("TEMPO")?, Auth::from_env("PYROSCOPE")?))
                }),
            _ => {
                return usage(
                    "set TEMPO_URL, PYROSCOPE_URL and OTEL_EXPORTER_OTLP_ENDPOINT (or --tempo, --pyroscope, --otlp), or pass --standin",
                )
            }
        }
    };
    let backends = match backends {
        Ok(b) => b.with_profiles_over_otlp(cli.profiles_over_otlp),
        Err(e) => return usage(&e.to_string()),
    };
    println!(
        "tempo {}  pyroscope {}  otlp {}  profiles over {}",
        backends.tempo_url,
        backends.pyroscope_url,
        backends.otlp_endpoint,
        if backends.profiles_over_otlp {
            "OTLP (/v1development/profiles)"
        } else {
            "the push API"
        }
    );
    let started = Instant::now();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("checklist: cannot find this executable: {e}");
            return ExitCode::from(1);
        }
    };
    let recordings = match record_all(&exe, &backends) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("FAIL recording the operations: {e}");
            return ExitCode::from(1);
        }
    };
    let results = run_all(&backends, &recordings);
    println!();
    println!(
        "{:<5} {:<3} {:<32} {:<16} {:>8} {:>8}  top function",
        "", "#", "trace id", "span id", "cpu ms", "wall ms"
    );
    for r in &results {
        for (i, e) in r.evidence.iter().enumerate() {
            println!(
                "{:<5} {:<3} {:<32} {:<16} {:>8} {:>8}  {}",
                if i == 0 {
                    if r.passed {
                        "PASS"
                    } else {
                        "FAIL"
                    }
                } else {
                    ""
                },
                if i == 0 {
                    r.number.to_string()
                } else {
                    String::new()
                },
                e.trace_id,
                e.span_id,
                e.cpu_ms.map_or("-".into(), |v| format!("{v:.0}")),
                e.wall_ms.map_or("-".into(), |v| format!("{v:.0}")),
                e.top_function.as_deref().unwrap_or("-"),
            );
        }
    }
    println!();
    for r in &results {
        print!("{r}");
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    println!(
        "\n{} of {} checks passed in {:.1} s",
        results.len() - failed,
        results.len(),
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn record_mode(args: RecordArgs) -> ExitCode {
    let spec = RecordSpec {
        otlp_endpoint: args.otlp,
        pyroscope_url: args.pyroscope,
        service_name: args.service,
        service_version: args.version,
        scenario: args.scenario,
        profile_id: !args.no_profile_id,
        profiles_over_otlp: args.profiles_over_otlp,
    };
    match record(&spec) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("checklist record: {e}");
            ExitCode::from(1)
        }
    }
}
