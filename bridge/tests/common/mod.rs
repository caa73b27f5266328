//! Helpers shared by the test binaries that run the (process-wide) profiler.

#![allow(dead_code)] // each test binary uses its own subset

#[path = "../support/skip.rs"]
pub mod skip;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
        skip::skipped("the go tool pprof check", "OTEL_PROFILING_SKIP_GO=1");
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
    skip::skipped(
        "the go tool pprof check",
        &format!("{err}; install Go (apt-get install golang-go) to run it, as CI does"),
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

/// How long a child may take before it counts as hung.
pub const CHILD_LIMIT: Duration = Duration::from_secs(10);

/// Forks; the child runs `child` and exits with its code. Returns the child's exit code,
/// or `None` if it hung past [`CHILD_LIMIT`] (then it is killed) or died of a signal.
pub fn run_child(child: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child runs the crate's fork-safe paths and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // A panic must not unwind into the test harness's copy of the thread (its
        // end would exit the child with status 0).
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + CHILD_LIMIT;
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            if libc::WIFSIGNALED(status) {
                eprintln!("child {pid} died of signal {}", libc::WTERMSIG(status));
            }
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if Instant::now() >= deadline {
            eprintln!("child {pid} hung; its threads:\n{}", threads_of(pid));
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Each thread of process `pid`: its name, state, what it waits in (`wchan`) and its
/// system call, for a hang's report.
fn threads_of(pid: libc::pid_t) -> String {
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return String::from("(unreadable)");
    };
    let mut out = String::new();
    let maps = read(format!("/proc/{pid}/maps"));
    // The mapping an address of the report lies in (a futex's word, a pc).
    let mapping_of = |addr: &str| -> String {
        let Ok(addr) = u64::from_str_radix(addr.trim_start_matches("0x"), 16) else {
            return String::new();
        };
        maps.lines()
            .find(|line| {
                let range = line.split_whitespace().next().unwrap_or("");
                let (lo, hi) = range.split_once('-').unwrap_or(("", ""));
                let (lo, hi) = (
                    u64::from_str_radix(lo, 16).unwrap_or(1),
                    u64::from_str_radix(hi, 16).unwrap_or(0),
                );
                (lo..hi).contains(&addr)
            })
            .map(|line| format!(" [{addr:#x} in {line}]"))
            .unwrap_or_default()
    };
    for task in tasks.flatten() {
        let dir = task.path().display().to_string();
        let syscall = read(format!("{dir}/syscall"));
        let fields: Vec<&str> = syscall.split_whitespace().collect();
        let futex = match fields.first() {
            Some(&"202") => fields.get(1).map(|a| mapping_of(a)).unwrap_or_default(),
            _ => String::new(),
        };
        let pc = fields.last().map(|a| mapping_of(a)).unwrap_or_default();
        out.push_str(&format!("  futex word{futex}; pc{pc}\n"));
        let stat = read(format!("{dir}/stat"));
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next();
        out.push_str(&format!(
            "  {} {:?} state {} wchan {} syscall {}\n",
            task.file_name().to_string_lossy(),
            read(format!("{dir}/comm")).trim(),
            state.unwrap_or("?"),
            read(format!("{dir}/wchan")),
            read(format!("{dir}/syscall")).trim(),
        ));
    }
    out
}

/// Another library's timer: process-directed SIGPROF with a payload that is no slot.
pub fn foreign_timer() -> libc::timer_t {
    // SAFETY: plain FFI with initialised arguments; the caller deletes the timer.
    unsafe {
        let mut sev: libc::sigevent = std::mem::zeroed();
        sev.sigev_notify = libc::SIGEV_SIGNAL;
        sev.sigev_signo = libc::SIGPROF;
        sev.sigev_value = libc::sigval {
            sival_ptr: 0x1234 as *mut libc::c_void,
        };
        let mut timer: libc::timer_t = std::mem::zeroed();
        assert_eq!(
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer),
            0
        );
        let ms = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        let spec = libc::itimerspec {
            it_interval: ms,
            it_value: ms,
        };
        assert_eq!(
            libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()),
            0
        );
        timer
    }
}

/// Aborts the test process if it is still running after `limit` (a deadlock or hang
/// would otherwise stall the suite until CI's own timeout); set the returned flag when
/// done.
pub fn abort_if_hung(
    what: &'static str,
    limit: Duration,
) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    use std::sync::atomic::Ordering;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        while !flag.load(Ordering::Relaxed) {
            if start.elapsed() > limit {
                eprintln!("{what}: deadlock or hang; aborting");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    done
}

/// An exporting span processor's stand-in that keeps nothing (and has no lock of its own
/// a fork could leave held: the SDK's in-memory exporter has one, which is not this
/// crate's to make fork-safe).
#[derive(Debug)]
pub struct Discard;

impl opentelemetry_sdk::trace::SpanProcessor for Discard {
    fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &opentelemetry::Context) {}
    fn on_end(&self, _: opentelemetry_sdk::trace::SpanData) {}
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
    fn shutdown_with_timeout(&self, _: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

/// A profiler writing into a fresh temporary directory named after `name`, and a tracer
/// provider whose local roots get their evidence attributes, exported in memory.
pub fn profiled_provider(
    name: &str,
) -> (
    otel_profiling::Profiler,
    std::path::PathBuf,
    opentelemetry_sdk::trace::SdkTracerProvider,
    opentelemetry_sdk::trace::InMemorySpanExporter,
) {
    let dir = std::env::temp_dir().join(format!("otel-profiling-{name}-{}", std::process::id()));
    let profiler = otel_profiling::Profiler::builder()
        .output_dir(&dir)
        .start()
        .expect("profiler");
    let (provider, exporter) = evidence_provider();
    (profiler, dir, provider, exporter)
}

/// A tracer provider whose spans go through the crate's evidence processor into an
/// in-memory exporter, read back with the `profiling.*` attributes.
pub fn evidence_provider() -> (
    opentelemetry_sdk::trace::SdkTracerProvider,
    opentelemetry_sdk::trace::InMemorySpanExporter,
) {
    let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(otel_profiling::CpuEvidenceProcessor::new(
            opentelemetry_sdk::trace::SimpleSpanProcessor::new(exporter.clone()),
        ))
        .build();
    (provider, exporter)
}

/// Every span of a local span file's OTLP JSON lines (`ExportTraceServiceRequest`s).
pub fn spans_of_file(text: &str) -> Vec<serde_json::Value> {
    let mut spans = Vec::new();
    for line in text.lines() {
        let request: serde_json::Value = serde_json::from_str(line).expect("OTLP JSON");
        for rs in request["resourceSpans"].as_array().expect("resourceSpans") {
            for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
                spans.extend(ss["spans"].as_array().expect("spans").iter().cloned());
            }
        }
    }
    spans
}

/// A local root with span id `span` (its trace id derived from it) named `name`.
pub fn test_root(span: u64, name: &str) -> otel_profiling::LocalRoot {
    use opentelemetry::trace::{SpanId, TraceId};
    otel_profiling::LocalRoot::new(
        SpanId::from(span),
        TraceId::from(u128::from(span) << 64 | 1),
        Some(otel_profiling::SpanName::intern(name)),
    )
}

/// The function names of location `id` of `profile`, innermost first.
pub fn function_names(profile: &otel_profiling_pprof::Profile, id: u64) -> Vec<String> {
    let s = |i: i64| profile.string_table[i as usize].clone();
    let location = profile.location.iter().find(|l| l.id == id);
    location
        .map(|l| {
            l.line
                .iter()
                .filter_map(|line| profile.function.iter().find(|f| f.id == line.function_id))
                .map(|f| s(f.name))
                .collect()
        })
        .unwrap_or_default()
}

/// The `span_id` label of `sample` ("" for none).
pub fn span_label(
    profile: &otel_profiling_pprof::Profile,
    sample: &otel_profiling_pprof::Sample,
) -> String {
    let s = |i: i64| profile.string_table[i as usize].clone();
    sample
        .label
        .iter()
        .find(|l| s(l.key) == "span_id")
        .map(|l| s(l.str))
        .unwrap_or_default()
}
