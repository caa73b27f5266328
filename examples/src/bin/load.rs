//! Drives a running service: `load [BASE_URL] [SECONDS]` (default http://127.0.0.1:8080, 60).

use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let seconds: u64 = match args.next().map(|s| s.parse()) {
        None => 60,
        Some(Ok(s)) => s,
        Some(Err(_)) => {
            eprintln!("load: SECONDS must be a whole number");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(1);
        }
    };
    let stats = runtime.block_on(otel_profiling_examples::load::run(
        base.trim_end_matches('/'),
        Duration::from_secs(seconds),
        2,
        2,
        1,
        Duration::from_secs(5),
        |s, t| println!("{}", s.progress_line(t)),
    ));
    if stats.errors.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        std::process::exit(1);
    }
}
