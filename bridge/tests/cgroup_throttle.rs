//! A root that runs while its container is throttled for its CPU quota carries the
//! throttled time and the limit (`profiling.cgroup.throttled_ns`, `profiling.cgroup.cpu_limit`).
//!
//! The test makes a cgroup v1 `cpu` group with a quota of 0.2 CPU and moves this process
//! into it (its own test binary: every thread of the process is throttled), which needs
//! root and a writable v1 `cpu` hierarchy, as on the machines the suite runs on. Elsewhere
//! it says on stderr, uncaptured, that it was skipped and why.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt as _, Tracer as _, TracerProvider as _};
use otel_profiling::{ProfilingContext, CGROUP_CPU_LIMIT_ATTRIBUTE, CGROUP_THROTTLED_ATTRIBUTE};

/// Says the test was skipped (see `support/skip.rs`).
fn skipped(why: &str) {
    common::skip::skipped("cgroup_throttle", why);
}

/// The v1 `cpu` hierarchy's mount point, from /proc/self/mountinfo.
fn cpu_v1_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (fstype, _, options) = (fs.next()?, fs.next()?, fs.next()?);
        (fstype == "cgroup" && options.split(',').any(|o| o == "cpu"))
            .then(|| mount.split(' ').nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// A cgroup this test made and moved the process into; moves it back and removes the
/// group when dropped (also on a failed assertion).
struct Throttled {
    dir: PathBuf,
    back_to: PathBuf,
}

impl Throttled {
    fn enter(mount: &Path, quota_us: u64, period_us: u64) -> std::io::Result<Throttled> {
        let dir = mount.join(format!("otel-profiling-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let group = Throttled {
            dir,
            back_to: mount.to_path_buf(),
        };
        std::fs::write(group.dir.join("cpu.cfs_period_us"), period_us.to_string())?;
        std::fs::write(group.dir.join("cpu.cfs_quota_us"), quota_us.to_string())?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(group.dir.join("cgroup.procs"))?
            .write_all(std::process::id().to_string().as_bytes())?;
        Ok(group)
    }
}

impl Drop for Throttled {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.back_to.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_root_under_a_cpu_quota_carries_its_throttled_time_and_the_limit() {
    let Some(mount) = cpu_v1_mount() else {
        return skipped("no cgroup v1 cpu hierarchy is mounted here");
    };
    let group = match Throttled::enter(&mount, 20_000, 100_000) {
        Ok(group) => group,
        Err(e) => {
            return skipped(&format!(
                "cannot make a cgroup under {} ({e}): needs root",
                mount.display()
            ))
        }
    };
    let (profiler, dir, provider, exporter) = common::profiled_provider("cgroup");
    // Past the watchdog's first refresh in the new group.
    std::thread::sleep(Duration::from_millis(250));
    let span = provider.tracer("cgroup").start("GET /throttled");
    let cx = opentelemetry::Context::current_with_span(span);
    // 0.3 s of CPU at 0.2 CPU: about 1.2 s of it throttled.
    ProfilingContext::new(cx.clone(), "GET /throttled")
        .in_scope(|| common::burn(Duration::from_millis(300)));
    // Past the next refresh, so the end reading has the throttling.
    std::thread::sleep(Duration::from_millis(250));
    cx.span().end();
    drop(group);
    drop(profiler);
    let _ = std::fs::remove_dir_all(&dir);
    let spans = exporter.get_finished_spans().expect("spans");
    let root = spans
        .iter()
        .find(|s| s.name == "GET /throttled")
        .expect("the root");
    let throttled = common::ns_attribute(root, CGROUP_THROTTLED_ATTRIBUTE);
    assert!(
        throttled >= Duration::from_millis(300),
        "throttled {throttled:?} while burning 300 ms at 0.2 CPU: {:?}",
        root.attributes
    );
    let limit = root
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == CGROUP_CPU_LIMIT_ATTRIBUTE)
        .map(|kv| kv.value.clone());
    assert_eq!(
        limit,
        Some(opentelemetry::Value::F64(0.2)),
        "{:?}",
        root.attributes
    );
}
