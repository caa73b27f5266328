//! A full disk under the local files never fails or stalls the service: writes that fail
//! are counted (spans and profiles), the service goes on making spans, and the guard drops
//! within its timeout. The disk is a 128 KiB tmpfs the test mounts (CI runs as root);
//! where mounting is not allowed the test says SKIPPED.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = std::env::temp_dir().join(format!("otel-profiling-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("mount not runnable: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_full_disk_is_counted_and_never_fails_the_service() {
    let disk = match Tmpfs::mount("128k") {
        Ok(disk) => disk,
        Err(why) => {
            return common::skip::skipped("full_disk", &format!("cannot mount a tmpfs: {why}"))
        }
    };
    let _turn = common::turn();
    let telemetry = otel_profiling::Telemetry::builder()
        .service_name("full-disk")
        .output_dir(&disk.0)
        .upload_interval(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(2))
        .quiet(true)
        .build()
        .expect("setup on an empty disk");
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(telemetry.layer()));
    let payload = "x".repeat(400);
    tracing::dispatcher::with_default(&dispatch, || {
        // About 2 MB of span JSON and a second of CPU: far past the 128 KiB disk.
        let until = Instant::now() + Duration::from_secs(1);
        let mut i = 0u32;
        while Instant::now() < until || i < 4_000 {
            let _span = tracing::info_span!("GET /full", i, payload = payload.as_str()).entered();
            common::burn(Duration::from_micros(200));
            i += 1;
        }
    });
    telemetry.flush();
    let stats = telemetry.stats();
    assert!(
        stats.spans.spans_failed > 0 || stats.profiler.profiles_failed > 0,
        "the failed writes are counted: {stats:?}"
    );
    // The service goes on: more spans, then a shutdown within its timeout.
    tracing::dispatcher::with_default(&dispatch, || {
        tracing::info_span!("GET /after").in_scope(|| std::hint::black_box(1));
    });
    drop(dispatch);
    let start = Instant::now();
    drop(telemetry);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}
