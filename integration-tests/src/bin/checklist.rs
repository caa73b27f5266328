//! Runs the verification checklist against a running stack and prints a pass/fail table.
//!
//! ```text
//! checklist [--tempo URL] [--pyroscope URL] [--otlp URL] [--timeout SECS] [--standin]
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

use otel_profiling_integration_tests::checklist::{record_all, run_all, Backends};
use otel_profiling_integration_tests::standin::StandIn;
use otel_profiling_integration_tests::workload::{record, RecordSpec, Scenario};

fn usage(message: &str) -> ExitCode {
    eprintln!("checklist: {message}");
    eprintln!(
        "usage: checklist [--tempo URL] [--pyroscope URL] [--otlp URL] [--timeout SECS] [--standin]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("record") {
        return record_mode(&args[1..]);
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let mut tempo = env("TEMPO_URL");
    let mut pyroscope = env("PYROSCOPE_URL");
    let mut otlp = env("OTEL_EXPORTER_OTLP_ENDPOINT");
    let mut timeout = 60u64;
    let mut standin = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        let r = match arg.as_str() {
            "--tempo" => value("--tempo").map(|v| tempo = Some(v)),
            "--pyroscope" => value("--pyroscope").map(|v| pyroscope = Some(v)),
            "--otlp" => value("--otlp").map(|v| otlp = Some(v)),
            "--timeout" => value("--timeout").and_then(|v| {
                v.parse()
                    .map(|t| timeout = t)
                    .map_err(|_| format!("--timeout {v}: not a number of seconds"))
            }),
            "--standin" => {
                standin = true;
                Ok(())
            }
            "-h" | "--help" => return usage("runs the verification checklist"),
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = r {
            return usage(&e);
        }
    }
    let _guard;
    let backends = if standin {
        let s = match StandIn::start() {
            Ok(s) => s,
            Err(e) => return usage(&format!("starting the stand-in: {e}")),
        };
        let url = s.url();
        println!("using the in-process stand-in at {url} (a stand-in for tests, not a backend)");
        _guard = s;
        Backends::new(&url, &url, &url, Duration::from_secs(timeout.min(5)))
    } else {
        match (tempo, pyroscope, otlp) {
            (Some(t), Some(p), Some(o)) => Backends::new(&t, &p, &o, Duration::from_secs(timeout)),
            _ => {
                return usage(
                    "set TEMPO_URL, PYROSCOPE_URL and OTEL_EXPORTER_OTLP_ENDPOINT (or the flags), or pass --standin",
                )
            }
        }
    };
    println!(
        "tempo {}  pyroscope {}  otlp {}",
        backends.tempo_url, backends.pyroscope_url, backends.otlp_endpoint
    );
    let started = Instant::now();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return usage(&format!("cannot find this executable: {e}")),
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

fn record_mode(args: &[String]) -> ExitCode {
    let mut spec = RecordSpec {
        otlp_endpoint: String::new(),
        pyroscope_url: String::new(),
        service_name: String::new(),
        service_version: String::new(),
        scenario: Scenario::CpuAndIo,
        profile_id: true,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--no-profile-id" {
            spec.profile_id = false;
            continue;
        }
        let Some(v) = it.next().cloned() else {
            return usage(&format!("{arg} needs a value"));
        };
        match arg.as_str() {
            "--otlp" => spec.otlp_endpoint = v,
            "--pyroscope" => spec.pyroscope_url = v,
            "--service" => spec.service_name = v,
            "--version" => spec.service_version = v,
            "--scenario" => match Scenario::parse(&v) {
                Some(s) => spec.scenario = s,
                None => return usage(&format!("unknown scenario {v}")),
            },
            other => return usage(&format!("unknown argument {other}")),
        }
    }
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
