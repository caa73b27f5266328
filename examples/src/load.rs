//! A load generator that drives the service's endpoints for a while and reports progress.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests completed per endpoint.
#[derive(Debug, Default)]
pub struct LoadStats {
    /// `/report` requests answered.
    pub reports: AtomicU64,
    /// `/orders` requests answered.
    pub orders: AtomicU64,
    /// `/export` requests answered.
    pub exports: AtomicU64,
    /// Requests that failed.
    pub errors: AtomicU64,
}

impl LoadStats {
    /// One progress line: elapsed time and requests done per endpoint.
    pub fn progress_line(&self, elapsed: Duration) -> String {
        format!(
            "{:>4}s  /report {:>5} done  /orders {:>5} done  /export {:>5} done  errors {}",
            elapsed.as_secs(),
            self.reports.load(Ordering::Relaxed),
            self.orders.load(Ordering::Relaxed),
            self.exports.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed)
        )
    }
}

/// Drives `base_url` for `duration` with `report_workers` loops on `/report`,
/// `order_workers` on `/orders` and `export_workers` on `/export`, calling `progress` about
/// every `every`.
pub async fn run(
    base_url: &str,
    duration: Duration,
    report_workers: usize,
    order_workers: usize,
    export_workers: usize,
    every: Duration,
    mut progress: impl FnMut(&LoadStats, Duration),
) -> Arc<LoadStats> {
    let client = reqwest::Client::new();
    let stats = Arc::new(LoadStats::default());
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for (path, workers) in [
        ("/report", report_workers),
        ("/orders", order_workers),
        ("/export", export_workers),
    ] {
        for _ in 0..workers {
            let (client, stats, url) = (client.clone(), stats.clone(), format!("{base_url}{path}"));
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let ok = match client.get(&url).send().await {
                        Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                        Err(_) => false,
                    };
                    let counter = match (ok, path) {
                        (false, _) => &stats.errors,
                        (true, "/report") => &stats.reports,
                        (true, "/export") => &stats.exports,
                        (true, _) => &stats.orders,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }));
        }
    }
    let start = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(every.min(deadline.saturating_duration_since(Instant::now()))).await;
        progress(&stats, start.elapsed());
    }
    for task in tasks {
        let _ = task.await;
    }
    stats
}
