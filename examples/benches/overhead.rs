//! What the profiler costs the production-shaped service (`otel_profiling_examples::
//! production`, issue 40): its throughput with the crate against without it, in paired
//! rounds of alternating order, each side a fresh process.
//!
//! * **with**: `Telemetry` as the README's quickstart sets it up (sampler at 100 Hz, the
//!   profiling layer, the evidence processor, the blocked-in-poll watchdog, local files),
//!   the runtime hooks registering its threads;
//! * **without**: the same service, spans and span file (`tracing-opentelemetry` into the
//!   SDK's batch processor and the same local span exporter), no profiling at all.
//!
//! The load comes from this process (four client loops per endpoint measured); requests
//! per second of each side and the ratio with its 95 % interval over the rounds.
//!
//! Run: `cargo bench -p otel-profiling-examples --bench overhead`
//! (`OVERHEAD_ROUNDS`, default 6; `OVERHEAD_ROUND_MS`, default 3000;
//! `OVERHEAD_ENDPOINT`, default `/fanout`).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The child: serves the service with or without the profiler until stdin closes.
fn serve(with: bool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::temp_dir().join(format!("overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let telemetry = if with {
        Some(
            otel_profiling::Telemetry::builder()
                .service_name("overhead")
                .output_dir(&dir)
                .quiet(true)
                .init()?,
        )
    } else {
        let exporter = otel_profiling::local_sink::LocalSpanExporter::new(&dir)?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .build();
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("overhead")))
            .try_init()?;
        std::mem::forget(provider);
        None
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).enable_all();
    if with {
        builder
            .on_thread_start(otel_profiling::sampler::tokio_on_thread_start())
            .on_thread_stop(otel_profiling::sampler::tokio_on_thread_stop());
    }
    let runtime = builder.build()?;
    let rounds = otel_profiling_examples::axum_routes::calibrate_rounds(Duration::from_millis(4));
    let app = runtime.block_on(async {
        let dependency =
            otel_profiling_examples::inventory::serve(Duration::from_millis(15)).await?;
        otel_profiling_examples::production::service(&dir, dependency, rounds)
    })?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    println!("PORT {}", listener.local_addr()?.port());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    // Until the parent closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let _ = stop.send(());
    let _ = runtime.block_on(server);
    drop(runtime);
    drop(telemetry);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A child serving one side; its port.
fn start(with: bool) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args(["--serve", if with { "with" } else { "without" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("child");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the child's port");
    let port = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port from the child: {line:?}"));
    (child, port)
}

/// Requests per second of four client loops on `endpoint` for `round`, after a warm-up.
fn measure(port: u16, endpoint: &str, round: Duration) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    let url = format!("http://127.0.0.1:{port}{endpoint}");
    let post = endpoint == "/ledger";
    runtime.block_on(async move {
        let client = reqwest::Client::new();
        let run = |d: Duration| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let deadline = Instant::now() + d;
                let loops: Vec<_> = (0..4)
                    .map(|_| {
                        let (client, url) = (client.clone(), url.clone());
                        tokio::spawn(async move {
                            let mut n = 0u64;
                            while Instant::now() < deadline {
                                let request = if post {
                                    client.post(&url)
                                } else {
                                    client.get(&url)
                                };
                                if let Ok(r) = request.send().await {
                                    if r.status().is_success() && r.bytes().await.is_ok() {
                                        n += 1;
                                    }
                                }
                            }
                            n
                        })
                    })
                    .collect();
                let mut total = 0;
                for l in loops {
                    total += l.await.unwrap_or(0);
                }
                total
            }
        };
        run(Duration::from_millis(500)).await;
        run(round).await as f64 / round.as_secs_f64()
    })
}

fn side(with: bool, endpoint: &str, round: Duration) -> f64 {
    let (mut child, port) = start(with);
    let rps = measure(port, endpoint, round);
    drop(child.stdin.take());
    let _ = child.wait();
    rps
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
    (
        mean,
        T95.get(v.len() - 2).copied().unwrap_or(2.0) * (var / n).sqrt(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--serve") {
        let with = args.get(at + 1).is_some_and(|m| m == "with");
        if let Err(e) = serve(with) {
            eprintln!("overhead child: {e}");
            std::process::exit(1);
        }
        return;
    }
    // `cargo bench` passes `--bench`; a filter argument that is not ours skips the run.
    if args
        .iter()
        .skip(1)
        .any(|a| !a.starts_with('-') && a != "overhead")
    {
        return;
    }
    let rounds = env_u64("OVERHEAD_ROUNDS", 6);
    let round = Duration::from_millis(env_u64("OVERHEAD_ROUND_MS", 3000));
    let endpoint = std::env::var("OVERHEAD_ENDPOINT").unwrap_or_else(|_| "/fanout".into());
    let (mut with_rps, mut without_rps, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        // Alternating order: neither side always runs first.
        let (w, wo) = if r % 2 == 0 {
            let w = side(true, &endpoint, round);
            (w, side(false, &endpoint, round))
        } else {
            let wo = side(false, &endpoint, round);
            (side(true, &endpoint, round), wo)
        };
        println!(
            "  round {r}: with {w:.1}/s, without {wo:.1}/s, ratio {:.4}",
            w / wo
        );
        with_rps.push(w);
        without_rps.push(wo);
        ratios.push(w / wo);
    }
    let (mean, half) = mean_ci(&ratios);
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "overhead on {endpoint} ({rounds} paired rounds of {} ms, 4 client loops): with the \
         profiler {:.1}/s, without {:.1}/s; ratio {mean:.4} ± {half:.4} (95 %): {:+.2} % \
         throughput",
        round.as_millis(),
        avg(&with_rps),
        avg(&without_rps),
        (mean - 1.0) * 100.0
    );
}
