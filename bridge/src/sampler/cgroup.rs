//! The container's CPU limit and the time it was throttled for it: with a CPU quota
//! (Kubernetes `limits.cpu`, `docker --cpus`), a process that used its quota for the
//! period is not run until the next one, and a span that was runnable meanwhile looks
//! "blocked" unless this is known.
//!
//! The kernel keeps a cumulative throttled time per cgroup: cgroup v2 `cpu.stat`
//! `throttled_usec`, v1 `cpu.stat` `throttled_time` (ns). The watchdog thread reads it
//! every [`REFRESH`] ([`refresh`]) and keeps it in an atomic, so a local root's processor
//! takes it with one load at the root's start and one at its end ([`throttled_ns`]); the
//! change is the throttling while the root ran, to within one refresh at each end. The
//! limit comes from `cpu.max` (v2) or `cpu.cfs_quota_us` / `cpu.cfs_period_us` (v1).
//! Files that are absent or unreadable mean "unknown", never an error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the watchdog reads the cgroup's files.
pub(crate) const REFRESH: Duration = Duration::from_millis(100);

/// Throttled time of the process's cgroup, nanoseconds, as of the last refresh.
static THROTTLED_NS: AtomicU64 = AtomicU64::new(0);
/// Whether [`THROTTLED_NS`] is being kept (a watchdog refreshes it and the file was read).
static KNOWN: AtomicBool = AtomicBool::new(false);
/// The CPU limit in thousandths of a CPU (0: none, or unknown).
static LIMIT_MILLICPUS: AtomicU64 = AtomicU64::new(0);

/// The process's cgroup throttled time now (nanoseconds), if it is known: one atomic load.
pub(crate) fn throttled_ns() -> Option<u64> {
    KNOWN
        .load(Ordering::Acquire)
        .then(|| THROTTLED_NS.load(Ordering::Relaxed))
}

/// The cgroup's CPU limit in CPUs, if it has one.
pub(crate) fn cpu_limit() -> Option<f64> {
    let milli = LIMIT_MILLICPUS.load(Ordering::Relaxed);
    (milli != 0).then(|| milli as f64 / 1000.0)
}

/// Reads the files again (the watchdog thread, every [`REFRESH`]). The process's cgroup is
/// looked up each time: a process can be moved.
pub(crate) fn refresh() {
    let Some(cgroup) = CpuCgroup::of_this_process() else {
        KNOWN.store(false, Ordering::Release);
        return;
    };
    LIMIT_MILLICPUS.store(
        cgroup
            .cpu_limit()
            .map_or(0, |cpus| (cpus * 1000.0).round() as u64),
        Ordering::Relaxed,
    );
    match cgroup.throttled_ns() {
        Some(ns) => {
            // Monotonic per cgroup; a move to another cgroup may go back: keep the larger
            // so a root's change is never negative (its figure for the move is then 0).
            THROTTLED_NS.fetch_max(ns, Ordering::Relaxed);
            KNOWN.store(true, Ordering::Release);
        }
        None => KNOWN.store(false, Ordering::Release),
    }
}

/// The watchdog stopped: the count is no longer kept.
pub(crate) fn forget() {
    KNOWN.store(false, Ordering::Release);
}

/// The `cpu` controller's directory of this process's cgroup.
#[derive(Debug, PartialEq)]
struct CpuCgroup {
    dir: PathBuf,
    v2: bool,
}

impl CpuCgroup {
    fn of_this_process() -> Option<CpuCgroup> {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        CpuCgroup::find(&cgroups, &mounts)
    }

    /// From `/proc/self/cgroup` and `/proc/self/mountinfo`: the v1 `cpu` hierarchy if one
    /// is mounted, else the v2 unified one.
    fn find(cgroups: &str, mountinfo: &str) -> Option<CpuCgroup> {
        let mut v2_path = None;
        for line in cgroups.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                v2_path = Some(path);
                continue;
            }
            if controllers.split(',').any(|c| c == "cpu") {
                let (root, mount) = mount_of(mountinfo, |fstype, options| {
                    fstype == "cgroup" && options.split(',').any(|o| o == "cpu")
                })?;
                return Some(CpuCgroup {
                    dir: under(&mount, &root, path),
                    v2: false,
                });
            }
        }
        let path = v2_path?;
        let (root, mount) = mount_of(mountinfo, |fstype, _| fstype == "cgroup2")?;
        Some(CpuCgroup {
            dir: under(&mount, &root, path),
            v2: true,
        })
    }

    fn throttled_ns(&self) -> Option<u64> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        let (key, scale) = if self.v2 {
            ("throttled_usec", 1000)
        } else {
            ("throttled_time", 1)
        };
        stat.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == key)
                .then(|| value.trim().parse::<u64>().ok())
                .flatten()
                .map(|v| v.saturating_mul(scale))
        })
    }

    fn cpu_limit(&self) -> Option<f64> {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name)).ok();
        if self.v2 {
            parse_cpu_max(&read("cpu.max")?)
        } else {
            parse_cfs(&read("cpu.cfs_quota_us")?, &read("cpu.cfs_period_us")?)
        }
    }
}

/// The (root, mount point) of the first mount in `mountinfo` whose filesystem type and
/// super options satisfy `wanted`.
fn mount_of(mountinfo: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<(String, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (fstype, _source, options) = (fs.next()?, fs.next()?, fs.next().unwrap_or(""));
        if !wanted(fstype, options) {
            return None;
        }
        let mut fields = mount.split(' ');
        let root = fields.nth(3)?;
        let point = fields.next()?;
        Some((unescape(root), PathBuf::from(unescape(point))))
    })
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount` whose root is `root`
/// (in a container the mount's root is often the container's own cgroup).
fn under(mount: &Path, root: &str, path: &str) -> PathBuf {
    let relative = path
        .strip_prefix(root)
        .filter(|_| root != "/")
        .unwrap_or(path)
        .trim_start_matches('/');
    mount.join(relative)
}

/// mountinfo escapes spaces, tabs, newlines and backslashes as octal (`\040`).
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// cgroup v2 `cpu.max`: `"<quota> <period>"` in µs, or `"max <period>"` (no limit).
fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?.parse::<f64>().ok()?;
    let period = fields.next()?.parse::<f64>().ok()?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// cgroup v1 `cpu.cfs_quota_us` (−1: no limit) over `cpu.cfs_period_us`.
fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let quota = quota.trim().parse::<f64>().ok()?;
    let period = period.trim().parse::<f64>().ok()?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS_V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
";
    const MOUNTS_V2_CONTAINER: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
40 27 0:35 /kubepods/pod1/c1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn the_cpu_cgroup_is_found_in_v1_and_v2() {
        let v1 = CpuCgroup::find("4:cpuset:/\n2:cpu,cpuacct:/svc/a\n0::/\n", MOUNTS_V1);
        assert_eq!(
            v1,
            Some(CpuCgroup {
                dir: PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/svc/a"),
                v2: false
            })
        );
        // A container sees its own cgroup as the mount's root.
        let v2 = CpuCgroup::find("0::/kubepods/pod1/c1\n", MOUNTS_V2_CONTAINER);
        assert_eq!(
            v2,
            Some(CpuCgroup {
                dir: PathBuf::from("/sys/fs/cgroup"),
                v2: true
            })
        );
        assert_eq!(
            CpuCgroup::find("0::/\n", MOUNTS_V1),
            None,
            "no cgroup2 mount"
        );
        assert_eq!(CpuCgroup::find("", ""), None);
        assert_eq!(unescape("/a\\040b\\\\"), "/a b\\\\");
    }

    #[test]
    fn limits_and_throttled_time_are_read_or_unknown() {
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cfs("150000\n", "100000\n"), Some(1.5));
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        let dir =
            std::env::temp_dir().join(format!("otel-profiling-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("cpu.stat"),
            "nr_periods 10\nnr_throttled 3\nthrottled_time 123456\n",
        )
        .expect("write");
        std::fs::write(dir.join("cpu.cfs_quota_us"), "20000\n").expect("write");
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000\n").expect("write");
        let v1 = CpuCgroup {
            dir: dir.clone(),
            v2: false,
        };
        assert_eq!(v1.throttled_ns(), Some(123_456));
        assert_eq!(v1.cpu_limit(), Some(0.2));
        std::fs::write(dir.join("cpu.stat"), "usage_usec 5\nthrottled_usec 7\n").expect("write");
        std::fs::write(dir.join("cpu.max"), "max 100000\n").expect("write");
        let v2 = CpuCgroup {
            dir: dir.clone(),
            v2: true,
        };
        assert_eq!(v2.throttled_ns(), Some(7_000));
        assert_eq!(v2.cpu_limit(), None);
        let missing = CpuCgroup {
            dir: dir.join("nope"),
            v2: true,
        };
        assert_eq!((missing.throttled_ns(), missing.cpu_limit()), (None, None));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
