//! Helpers shared by the test binaries that run the (process-wide) profiler.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());

/// The sampler is process-wide (one SIGPROF owner): tests of one binary take turns.
pub fn turn() -> MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// CPU time of the calling thread, so CPU work lasts the same whatever else the machine runs.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain FFI with an out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Whether the independent pprof reader (`go tool pprof`) can run here.
///
/// With `go` installed the check runs. Without it, the check is skipped with a note on
/// stderr, so the README's test command passes on a machine with only the Rust toolchain;
/// `OTEL_PROFILING_REQUIRE_GO=1` (set by `.ci/run`, which installs Go) makes a missing
/// `go` a failure instead. `OTEL_PROFILING_SKIP_GO=1` skips it even where Go exists.
pub fn go_available() -> bool {
    if std::env::var_os("OTEL_PROFILING_SKIP_GO").is_some_and(|v| v == "1") {
        eprintln!("note: OTEL_PROFILING_SKIP_GO=1: not checking with go tool pprof");
        return false;
    }
    let err = match std::process::Command::new("go").arg("version").output() {
        Ok(out) if out.status.success() => return true,
        Ok(out) => format!(
            "`go version` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("`go` not runnable: {e}"),
    };
    if std::env::var_os("OTEL_PROFILING_REQUIRE_GO").is_some_and(|v| v == "1") {
        panic!(
            "{err}. OTEL_PROFILING_REQUIRE_GO=1: install Go (Debian/Ubuntu: apt-get install \
             golang-go) to read the profiles with go tool pprof"
        );
    }
    eprintln!(
        "note: SKIPPED the go tool pprof check ({err}); install Go (apt-get install golang-go) \
         to run it, as CI does"
    );
    false
}

/// Burns `d` of the calling thread's CPU time (not wall time: a loaded machine stretches
/// it, never shortens it), in a function of its own for the profiles.
#[inline(never)]
pub fn burn(d: Duration) {
    let start = thread_cpu_time();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    while thread_cpu_time() - start < d {
        for _ in 0..2_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    std::hint::black_box(x);
}

/// The nanoseconds attribute `key` of an exported span, as a duration; panics naming the
/// span and its attributes when it is missing or not an integer.
pub fn ns_attribute(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Duration {
    match span.attributes.iter().find(|kv| kv.key.as_str() == key) {
        Some(kv) => match kv.value {
            opentelemetry::Value::I64(v) => Duration::from_nanos(v as u64),
            ref other => panic!("{}: {key} is {other:?}", span.name),
        },
        None => panic!("{} has no {key}: {:?}", span.name, span.attributes),
    }
}
