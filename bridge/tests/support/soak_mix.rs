//! A realistic mix for soaks, run in one process through the public API: threads churning
//! short roots with distinct (high-cardinality) span names, a thread with long roots and
//! many children, plain-API roots (`LocalRoot` + `SpanContextGuard`), thread churn,
//! forks, the sampler at 100 Hz, the OTEP 4947 thread context on, spans to local files
//! and profiles to a Pyroscope stand-in. [`Mix::snapshot`] reads RSS and the size of
//! every structure that grows with what the host does (docs/bounds.md).
//!
//! Shared (`#[path]`) by `tests/soak.rs` (the 60 s gate: every structure flat after
//! warm-up) and `benches/soak.rs` (a run of any length, with the RSS slope).
#![allow(dead_code)] // each binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceId};
use otel_profiling::{HealthStats, LocalRoot, SpanContextGuard, Telemetry, TelemetryGuard};
use tracing_subscriber::layer::SubscriberExt;

#[path = "receiver.rs"]
mod receiver;

/// Threads churning short roots with distinct names.
pub const SHORT_THREADS: u64 = 3;
/// Threads at most alive at once in the thread churn.
pub const CHURN_THREADS: u64 = 4;
/// Every thread that may hold label slots in a reclaim batch at once: the workers, the
/// churned threads, the long-root and plain-API threads.
pub const LABEL_THREADS: u64 = SHORT_THREADS + CHURN_THREADS + 2;

/// The mix, running until [`Mix::stop`].
pub struct Mix {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    guard: Option<TelemetryGuard>,
    receiver: receiver::Receiver,
    /// Roots made so far, all kinds.
    pub roots: Arc<AtomicU64>,
    /// Forked children that exited cleanly.
    pub forks: Arc<AtomicU64>,
    /// Forked children that did not.
    pub bad_forks: Arc<AtomicU64>,
    started: Instant,
}

/// What the mix holds at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub at: Duration,
    pub rss_kib: u64,
    /// Of `rss_kib`, anonymous memory (heap, stacks): what a leak grows.
    pub anon_kib: u64,
    /// Of `rss_kib`, pages of mapped files (the binary, its debug info as the symbolizer
    /// reads it): bounded by the files' sizes, and the kernel's to drop under pressure.
    pub file_kib: u64,
    pub roots: u64,
    pub health: HealthStats,
}

impl Snapshot {
    /// The structures' sizes, by name (the order of the printed columns).
    pub fn sizes(&self) -> Vec<(&'static str, u64)> {
        let r = &self.health.record;
        let s = &self.health.profiler.sampler;
        vec![
            ("label_slots", r.label_slots),
            ("in_limbo", r.label_slots_in_limbo),
            ("parked", r.label_slots_parked),
            ("mirrors", r.thread_context_mirrors),
            ("span_names", r.span_names),
            ("name_cache", r.span_name_cache_entries),
            ("counter_slots", r.root_counter_slots),
            ("evidence", r.evidence_entries),
            ("thread_slots", s.thread_slots),
            ("ring_kib", s.ring_bytes / 1024),
            ("scope_spill", r.scope_spill_bytes),
            ("schedstat_fds", r.schedstat_files_open),
            ("agg_keys", self.health.profiler.aggregation_keys),
            ("symbol_cache", self.health.profiler.symbol_cache_entries),
            (
                "queue_kib",
                self.health.pyroscope.map_or(0, |p| p.bytes_queued / 1024),
            ),
        ]
    }

    /// One line: time, RSS, roots, then every size.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:>6.0}s rss {:>7.1} MiB (anon {:.1}, file {:.1}) roots {:>10}",
            self.at.as_secs_f64(),
            self.rss_kib as f64 / 1024.0,
            self.anon_kib as f64 / 1024.0,
            self.file_kib as f64 / 1024.0,
            self.roots
        );
        for (name, value) in self.sizes() {
            line.push_str(&format!(" {name} {value}"));
        }
        line
    }
}

/// The process's resident set, in KiB.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// A `/proc/self/status` figure in KiB (`VmRSS:`, `RssAnon:`, `RssFile:`), 0 if absent.
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A little CPU work, so samples land in roots.
fn work(n: u64) -> u64 {
    let mut x = n | 1;
    for _ in 0..2_000 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    }
    std::hint::black_box(x)
}

impl Mix {
    /// Starts the mix, its files under `dir`; each short-root thread sleeps `pace` every
    /// 8 roots (the 60 s gate runs flat out, a long run at a service's pace).
    pub fn start(dir: &Path, pace: Duration) -> Mix {
        let receiver = receiver::Receiver::discarding(receiver::fresh_listener());
        let guard = Telemetry::builder()
            .service_name("soak")
            .frequency_hz(100)
            .output_dir(dir)
            .quiet(true)
            .thread_context(true)
            .pyroscope(&receiver.url(), None, None)
            .expect("stand-in url")
            .build()
            .expect("telemetry");
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(guard.layer()))
            .expect("the soak's subscriber is the process's");
        let stop = Arc::new(AtomicBool::new(false));
        let roots = Arc::new(AtomicU64::new(0));
        let forks = Arc::new(AtomicU64::new(0));
        let bad_forks = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        let spawn = |threads: &mut Vec<JoinHandle<()>>, f: Box<dyn FnOnce() + Send>| {
            threads.push(std::thread::spawn(f));
        };
        // Short roots, each with a name never seen before (ids in span names: the case
        // the name cap exists for), a child, a little CPU.
        for t in 0..SHORT_THREADS {
            let (stop, roots) = (stop.clone(), roots.clone());
            spawn(
                &mut threads,
                Box::new(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let name = format!("GET /item/{t}/{n}");
                        let root = tracing::info_span!("request", otel.name = %name);
                        let _e = root.enter();
                        tracing::info_span!("load").in_scope(|| work(n));
                        roots.fetch_add(1, Ordering::Relaxed);
                        if n.is_multiple_of(8) {
                            std::thread::sleep(pace);
                        }
                    }
                }),
            );
        }
        // Long roots with many children.
        {
            let (stop, roots) = (stop.clone(), roots.clone());
            spawn(
                &mut threads,
                Box::new(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let root = tracing::info_span!("GET /report");
                        let _e = root.enter();
                        for c in 0..50 {
                            tracing::info_span!("section", c).in_scope(|| work(c));
                            std::thread::sleep(Duration::from_millis(4));
                        }
                        roots.fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
        }
        // Plain-API roots: a label claimed and released per root, published.
        {
            let (stop, roots) = (stop.clone(), roots.clone());
            spawn(
                &mut threads,
                Box::new(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let root = LocalRoot::new(
                            SpanId::from(n),
                            TraceId::from(u128::from(n) << 1 | 1),
                            None,
                        );
                        drop(SpanContextGuard::enter(Some(&root)));
                        roots.fetch_add(1, Ordering::Relaxed);
                        if n.is_multiple_of(64) {
                            std::thread::sleep(pace);
                        }
                    }
                }),
            );
        }
        // Thread churn: short-lived threads, each with a few roots.
        {
            let (stop, roots) = (stop.clone(), roots.clone());
            spawn(
                &mut threads,
                Box::new(move || {
                    let mut round = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        round += 1;
                        let batch: Vec<_> = (0..CHURN_THREADS)
                            .map(|k| {
                                let (roots, n) = (roots.clone(), round * CHURN_THREADS + k);
                                std::thread::spawn(move || {
                                    for i in 0..5 {
                                        tracing::info_span!("job", n, i).in_scope(|| work(i));
                                        roots.fetch_add(1, Ordering::Relaxed);
                                    }
                                })
                            })
                            .collect();
                        for t in batch {
                            let _ = t.join();
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }),
            );
        }
        // Forks: a child runs a root on the crate's fork-safe paths and leaves.
        {
            let (stop, forks, bad) = (stop.clone(), forks.clone(), bad_forks.clone());
            spawn(
                &mut threads,
                Box::new(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_secs(2));
                        // SAFETY: the child uses the crate's fork-safe paths and leaves
                        // with _exit.
                        let pid = unsafe { libc::fork() };
                        if pid == 0 {
                            // SAFETY: a watchdog for the child, then leaving without
                            // destructors.
                            unsafe { libc::alarm(20) };
                            let root = LocalRoot::new(SpanId::from(7), TraceId::from(7), None);
                            let guard = SpanContextGuard::enter(Some(&root));
                            work(7);
                            drop(guard);
                            drop(root);
                            // SAFETY: as above.
                            unsafe { libc::_exit(0) };
                        }
                        let mut status = 0;
                        // SAFETY: waiting for our own child.
                        let waited =
                            pid > 0 && unsafe { libc::waitpid(pid, &mut status, 0) } == pid;
                        if waited && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                            forks.fetch_add(1, Ordering::Relaxed);
                        } else {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }),
            );
        }
        Mix {
            stop,
            threads,
            guard: Some(guard),
            receiver,
            roots,
            forks,
            bad_forks,
            started: Instant::now(),
        }
    }

    /// RSS and every structure's size now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            at: self.started.elapsed(),
            rss_kib: rss_kib(),
            anon_kib: status_kib("RssAnon:"),
            file_kib: status_kib("RssFile:"),
            roots: self.roots.load(Ordering::Relaxed),
            health: self.guard.as_ref().map(|g| g.stats()).unwrap_or_default(),
        }
    }

    /// Profile uploads the stand-in received.
    pub fn uploads(&self) -> usize {
        self.receiver.accepted.load(Ordering::SeqCst)
    }

    /// Stops the mix and the telemetry.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        drop(self.guard.take());
    }
}

/// A fresh directory for the mix's files.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("otel-profiling-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("soak dir");
    dir
}

/// A least-squares slope with two 95 % confidence half-widths.
#[derive(Debug, Clone, Copy)]
pub struct Slope {
    pub slope: f64,
    /// Treating the points as independent (t quantile for n − 2 degrees of freedom, the
    /// normal's 1.96 past 30). RSS read every few seconds is not: each point carries the
    /// last one's heap, so this interval is too narrow for a soak.
    pub ols_half: f64,
    /// Newey–West (Bartlett kernel, lag ⌊4 (n/100)^(2/9)⌋): the standard error that allows
    /// for residuals correlated with their neighbours, which RSS's are.
    pub hac_half: f64,
    pub lag: usize,
}

/// Least-squares slope of `(x, y)` with its confidence half-widths (see [`Slope`]).
pub fn slope_ci(points: &[(f64, f64)]) -> Option<Slope> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let residuals: Vec<f64> = points
        .iter()
        .map(|p| p.1 - my - slope * (p.0 - mx))
        .collect();
    let residual: f64 = residuals.iter().map(|e| e * e).sum();
    let se = (residual / (nf - 2.0) / sxx).sqrt();
    const T95: [f64; 30] = [
        12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13,
        2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04,
    ];
    let t = T95.get(n - 3).copied().unwrap_or(1.96);
    // Newey–West: the scores u_t = x̃_t e_t, their variance plus the weighted
    // autocovariances up to `lag`.
    let lag = (4.0 * (nf / 100.0).powf(2.0 / 9.0)).floor() as usize;
    let scores: Vec<f64> = points
        .iter()
        .zip(&residuals)
        .map(|(p, e)| (p.0 - mx) * e)
        .collect();
    let mut s = scores.iter().map(|u| u * u).sum::<f64>();
    for l in 1..=lag.min(n - 1) {
        let weight = 1.0 - l as f64 / (lag as f64 + 1.0);
        let cov: f64 = scores[l..].iter().zip(&scores).map(|(a, b)| a * b).sum();
        s += 2.0 * weight * cov;
    }
    let hac_se = (s.max(0.0) * nf / (nf - 2.0)).sqrt() / sxx;
    Some(Slope {
        slope,
        ols_half: t * se,
        hac_half: t * hac_se,
        lag,
    })
}

/// The slope of `y` over time net of a covariate (points `(hours, y, covariate)`): the
/// time coefficient of `y = a + b·t + c·covariate`, found by partialling the covariate
/// out of both `t` and `y` (Frisch–Waugh–Lovell) and fitting the residuals with
/// [`slope_ci`], so its intervals are those of the two-regressor fit. Also returns `c`.
///
/// For a bounded cache still filling after the warm-up (the symbolizer's names, capped
/// per file): the memory the process gains that the cache's own count does not explain.
pub fn slope_net_of(points: &[(f64, f64, f64)]) -> Option<(Slope, f64)> {
    let residuals = |pick: fn(&(f64, f64, f64)) -> f64| -> Option<(Vec<f64>, f64)> {
        let fit: Vec<(f64, f64)> = points.iter().map(|p| (p.2, pick(p))).collect();
        let n = fit.len() as f64;
        let mc = fit.iter().map(|p| p.0).sum::<f64>() / n;
        let mv = fit.iter().map(|p| p.1).sum::<f64>() / n;
        let scc: f64 = fit.iter().map(|p| (p.0 - mc).powi(2)).sum();
        if scc == 0.0 {
            return None;
        }
        let c = fit.iter().map(|p| (p.0 - mc) * (p.1 - mv)).sum::<f64>() / scc;
        Some((fit.iter().map(|p| p.1 - mv - c * (p.0 - mc)).collect(), c))
    };
    let (t_res, _) = residuals(|p| p.0)?;
    let (y_res, _) = residuals(|p| p.1)?;
    let fit = slope_ci(&t_res.into_iter().zip(y_res).collect::<Vec<_>>())?;
    // c given b: the covariate's coefficient in the joint fit.
    let resid_y: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.2, p.1 - fit.slope * p.0))
        .collect();
    let c = slope_ci(&resid_y).map_or(0.0, |f| f.slope);
    Some((fit, c))
}
