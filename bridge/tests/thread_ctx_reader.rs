//! An out-of-process reader of the OTEP 4947 thread context and the OTEP 4719 process
//! context, run against a second process that switches spans as fast as it can.
//!
//! This file is both processes (`harness = false`): run with
//! `OTEL_PROFILING_THREAD_CTX_ROLE=target` it is the target; otherwise it is the reader,
//! which starts itself as the target and then reads it the way the OTEPs describe:
//!
//! 1. the process context: `/proc/<pid>/maps` entry named `[anon_shmem:OTEL_CTX]`,
//!    `[anon:OTEL_CTX]` or `/memfd:OTEL_CTX`; header signature and version; timestamp,
//!    payload, timestamp again; the protobuf payload with the resource and the
//!    `threadlocal.*` attributes (schema version, attribute key map);
//! 2. the TLS symbol `otel_thread_ctx_v1` in the `.dynsym` of `/proc/<pid>/exe`
//!    (`STT_TLS`, 8 bytes), its access model from the dynamic relocations that name it
//!    (none in an executable: local-exec), and its thread-pointer offset per the
//!    x86-64 (variant II) or aarch64 (variant I) TLS ABI;
//! 3. each thread's thread pointer, once, with `PTRACE_SEIZE` + `PTRACE_INTERRUPT` +
//!    `PTRACE_GETREGS` (`fs_base`) or `PTRACE_GETREGSET`/`NT_ARM_TLS` (`tpidr_el0`);
//! 4. thousands of samples of the worker thread, each taken while the thread is stopped
//!    (`PTRACE_INTERRUPT`, the OTEP's concurrency model: readers read a stopped or
//!    interrupted thread, like an eBPF profiler in its perf-event handler): the pointer
//!    from `/proc/<pid>/mem`, the 28-byte header, `valid`, then `attrs-data`.
//!
//! The target derives each trace id, trace flags byte and span name from the span id, so a
//! record mixing two spans is detected, and a writer publishing a constant `01` instead
//! of the root's own flags (half the roots carry `03`, sampled + random) is too. The
//! pointer names the record of the root's label slot, and slots are reused: the test
//! asserts that records were reused by many roots (each read of a reused record is then
//! a check that it was not rewritten while named), no mix and no invalid record under a
//! stopped thread, many distinct spans recovered, and NULL for a thread that never ran a
//! span and for the worker between spans.

#[path = "support/skip.rs"]
mod skip;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, TraceFlags, TraceId};
use otel_profiling::{LocalRoot, SpanContextGuard, SpanName, Telemetry};

const ROLE: &str = "OTEL_PROFILING_THREAD_CTX_ROLE";
const NAMES: u64 = 7;

/// The span id of the target's `i`-th root (never 0).
fn span_of(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// The trace id the target pairs with `span`: a torn read pairs a span with another's.
fn trace_of(span: u64) -> u128 {
    let hi = span.rotate_left(29) ^ 0xa5a5_5a5a_0f0f_f0f0;
    let lo = !span.wrapping_mul(3);
    (u128::from(hi) << 64) | u128::from(lo)
}

/// The W3C trace flags the target gives the root `span`: sampled, and for half of them the
/// random-trace-id bit too (`03`, as a remote parent of W3C level 2 passes it on).
fn flags_of(span: u64) -> u8 {
    if span & 2 == 0 {
        0x01
    } else {
        0x03
    }
}

fn name_of(span: u64) -> String {
    format!("GET /thread-ctx/{}", span % NAMES)
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("target") {
        target();
    } else {
        reader();
    }
}

/// The target: a worker thread entering and leaving roots in a loop until told to stop.
fn target() {
    // The one-call setup, as a service would use it: the thread context is on unless
    // OTEL_PROFILING_THREAD_CONTEXT says otherwise; the profiler samples at 100 Hz.
    let dir = std::env::temp_dir().join(format!("thread-ctx-target-{}", std::process::id()));
    let telemetry = Telemetry::from_env()
        .expect("environment")
        .service_name("thread-ctx-target")
        .resource_attribute("service.version", "9.9.9")
        .output_dir(&dir)
        .quiet(true)
        .build()
        .expect("setup");
    let names: Vec<SpanName> = (0..NAMES)
        .map(|k| SpanName::intern(&format!("GET /thread-ctx/{k}")))
        .collect();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker_stop = stop.clone();
    let worker = std::thread::spawn(move || {
        let root = |i: u64| {
            let span = span_of(i);
            LocalRoot::new(
                SpanId::from(span),
                TraceId::from(trace_of(span)),
                Some(names[(span % NAMES) as usize]),
            )
            .with_trace_flags(TraceFlags::new(flags_of(span)))
        };
        // One span, then none: the pointer is NULL again.
        let first = root(0);
        drop(SpanContextGuard::enter(Some(&first)));
        tid_tx.send(unsafe { libc::gettid() }).unwrap();
        go_rx.recv().unwrap();
        let mut switches = 0u64;
        let mut i = 1;
        while !worker_stop.load(std::sync::atomic::Ordering::Relaxed) {
            let entered = root(i);
            let guard = SpanContextGuard::enter(Some(&entered));
            spin(300);
            drop(guard);
            spin(150);
            switches += 2;
            i += 1;
        }
        switches
    });
    let tid = tid_rx.recv().unwrap();
    println!("worker {tid}");
    std::io::stdout().flush().unwrap();
    let mut lines = std::io::stdin().lock().lines();
    assert_eq!(lines.next().unwrap().unwrap(), "go");
    go_tx.send(()).unwrap();
    let _ = lines.next(); // "stop", or end of input
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let switches = worker.join().unwrap();
    drop(telemetry);
    let _ = std::fs::remove_dir_all(&dir);
    println!("switches {switches}");
}

fn spin(n: u32) {
    for _ in 0..n {
        std::hint::spin_loop();
    }
}

/// What one read of a thread's record gave.
#[derive(Debug, PartialEq)]
enum Read {
    /// `otel_thread_ctx_v1` is NULL: no record attached.
    Null,
    /// A record whose `valid` is not 1.
    Invalid(u8),
    /// A valid record.
    Valid {
        trace: u128,
        span: u64,
        flags: u8,
        attrs: Vec<(u8, Vec<u8>)>,
    },
}

struct Target {
    pid: i32,
    mem: File,
}

impl Target {
    fn read(&self, addr: u64, buf: &mut [u8]) {
        self.mem
            .read_exact_at(buf, addr)
            .unwrap_or_else(|e| panic!("read {} bytes at {addr:#x}: {e}", buf.len()));
    }

    fn u64_at(&self, addr: u64) -> u64 {
        let mut b = [0; 8];
        self.read(addr, &mut b);
        u64::from_ne_bytes(b)
    }

    /// Reads a record per OTEP 4947 "Thread Sampling": pointer, 28-byte header, then
    /// `attrs-data-size` bytes when valid.
    fn read_record(&self, slot: u64) -> (u64, Read) {
        let ptr = self.u64_at(slot);
        if ptr == 0 {
            return (0, Read::Null);
        }
        let mut header = [0u8; 28];
        self.read(ptr, &mut header);
        if header[24] != 1 {
            return (ptr, Read::Invalid(header[24]));
        }
        let size = usize::from(u16::from_ne_bytes([header[26], header[27]]));
        let mut data = vec![0; size];
        self.read(ptr + 28, &mut data);
        let mut attrs = Vec::new();
        let mut rest = data.as_slice();
        // Stop when the rest cannot hold a complete entry (the OTEP's rule).
        while rest.len() >= 2 && rest.len() >= 2 + usize::from(rest[1]) {
            let len = usize::from(rest[1]);
            attrs.push((rest[0], rest[2..2 + len].to_vec()));
            rest = &rest[2 + len..];
        }
        (
            ptr,
            Read::Valid {
                trace: u128::from_be_bytes(header[..16].try_into().unwrap()),
                span: u64::from_be_bytes(header[16..24].try_into().unwrap()),
                flags: header[25],
                attrs,
            },
        )
    }
}

/// A running target process and its pipes.
struct Running {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    target: Target,
    worker: i32,
}

impl Running {
    /// Starts this file as the target, with `env` added to its environment.
    fn start(env: &[(&str, &str)]) -> Running {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .env(ROLE, "target")
            // Local files only, whatever the environment running the test says.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("PYROSCOPE_SERVER_ADDRESS")
            .env_remove("OTEL_PROFILING_THREAD_CONTEXT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("start the target");
        let pid = child.id() as i32;
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let worker = line
            .trim()
            .strip_prefix("worker ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("target said {line:?}"));
        let target = Target {
            pid,
            mem: File::open(format!("/proc/{pid}/mem")).expect("open /proc/<pid>/mem"),
        };
        Running {
            child,
            stdin,
            stdout,
            target,
            worker,
        }
    }

    fn go(&mut self) {
        writeln!(self.stdin, "go").unwrap();
    }

    /// Stops the target; returns how many context switches its worker made.
    fn finish(mut self) -> u64 {
        writeln!(self.stdin, "stop").unwrap();
        drop(self.stdin);
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let switches = line
            .trim()
            .strip_prefix("switches ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("target said {line:?}"));
        assert!(self.child.wait().unwrap().success());
        switches
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The reader: everything a profiler outside the process does.
fn reader() {
    let mut run = Running::start(&[]);
    let (pid, worker) = (run.target.pid, run.worker);

    // 1. The process context, found the way OTEP 4719 readers find it.
    let keys = process_context(&run.target).expect("an OTEL_CTX mapping");
    assert_eq!(keys, ["span_name"], "threadlocal.attribute_key_map");

    // 2. The TLS symbol and its thread-pointer offset.
    let offset = tls_offset(pid);

    // 3. Thread pointers, with ptrace.
    let tracer = match Tracer::seize(&[pid, worker]) {
        Ok(tracer) => tracer,
        Err(err) => {
            run.kill();
            skip::skipped(
                "thread_ctx_reader",
                &format!("ptrace is not permitted here ({err})"),
            );
            return;
        }
    };
    let main_tp = tracer.thread_pointer(pid);
    let worker_tp = tracer.thread_pointer(worker);
    let main_slot = main_tp.wrapping_add(offset as u64);
    let worker_slot = worker_tp.wrapping_add(offset as u64);

    // Empty states: a thread that never ran a span has a NULL pointer, and so has the
    // worker after its first span ended.
    tracer.stopped(pid, || {
        assert_eq!(
            run.target.read_record(main_slot).1,
            Read::Null,
            "main thread"
        );
    });
    tracer.stopped(worker, || {
        assert_eq!(
            run.target.read_record(worker_slot).1,
            Read::Null,
            "worker between spans"
        );
    });
    tracer.detach(pid);

    // 4. Sample the switching worker, each read with the thread stopped.
    run.go();
    std::thread::sleep(Duration::from_millis(20));
    let (mut valid, mut between, mut torn) = (0u64, 0u64, 0u64);
    let mut spans = HashSet::new();
    // The spans read through each record address: more than one is a reused record.
    let mut by_record: HashMap<u64, HashSet<u64>> = HashMap::new();
    let mut first_torn = None;
    let mut flag_values = HashSet::new();
    let start = Instant::now();
    let samples = 5000;
    for _ in 0..samples {
        // Let the worker run (and switch) between two stops.
        std::thread::sleep(Duration::from_micros(400));
        let (ptr, read) = tracer.stopped(worker, || run.target.read_record(worker_slot));
        match read {
            Read::Null => between += 1,
            Read::Valid {
                trace,
                span,
                flags,
                attrs,
            } => {
                let name = attrs
                    .iter()
                    .rev() // the last entry of a key wins
                    .find(|(key, _)| {
                        keys.get(usize::from(*key)).map(String::as_str) == Some("span_name")
                    })
                    .map(|(_, value)| String::from_utf8_lossy(value).into_owned());
                if span == 0
                    || trace != trace_of(span)
                    || flags != flags_of(span)
                    || name.as_deref() != Some(name_of(span).as_str())
                {
                    torn += 1;
                    first_torn.get_or_insert((trace, span, flags, name));
                } else {
                    valid += 1;
                    spans.insert(span);
                    by_record.entry(ptr).or_default().insert(span);
                    flag_values.insert(flags);
                }
            }
            other => {
                torn += 1;
                first_torn.get_or_insert((0, 0, 0, Some(format!("{other:?}"))));
            }
        }
    }
    let elapsed = start.elapsed();
    tracer.detach(worker);
    let switches = run.finish();

    let reused = by_record.values().filter(|spans| spans.len() > 1).count();
    let most = by_record.values().map(HashSet::len).max().unwrap_or(0);
    println!(
        "thread_ctx_reader: {samples} stopped-thread reads in {elapsed:?}: {valid} valid \
         ({} distinct spans through {} records, {reused} of them read under several roots, \
         up to {most}), {between} between spans (NULL), {torn} torn or invalid; the target \
         made {switches} context switches",
        spans.len(),
        by_record.len()
    );
    assert_eq!(torn, 0, "a read mixed two spans: {first_torn:?}");
    assert!(valid >= 1000, "too few valid reads: {valid}");
    assert!(
        spans.len() >= 1000,
        "too few distinct spans: {}",
        spans.len()
    );
    assert!(between >= 100, "too few reads between spans: {between}");
    assert!(
        reused >= 10 && most >= 10,
        "records are reused by later roots: {reused} reused, up to {most} roots on one"
    );
    assert_eq!(
        flag_values,
        HashSet::from([0x01, 0x03]),
        "each root's own trace flags, 03 included"
    );
    assert!(switches >= 2 * spans.len() as u64);

    switched_off();
    // No harness here: this is the result line.
    println!(
        "thread_ctx_reader: ok (process context, {valid} valid reads, none torn, switched off)"
    );
}

/// With `OTEL_PROFILING_THREAD_CONTEXT=false` nothing is published: no process context,
/// and the worker's `otel_thread_ctx_v1` stays NULL while it switches spans.
fn switched_off() {
    let mut run = Running::start(&[("OTEL_PROFILING_THREAD_CONTEXT", "false")]);
    assert_eq!(process_context(&run.target), None, "no OTEL_CTX mapping");
    let offset = tls_offset(run.target.pid);
    let worker = run.worker;
    let tracer = Tracer::seize(&[worker]).expect("ptrace");
    let slot = tracer.thread_pointer(worker).wrapping_add(offset as u64);
    run.go();
    let mut nulls = 0;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_micros(400));
        if tracer.stopped(worker, || run.target.read_record(slot)).1 == Read::Null {
            nulls += 1;
        }
    }
    tracer.detach(worker);
    let switches = run.finish();
    println!("thread_ctx_reader: switched off: {nulls} of 200 reads NULL over {switches} switches");
    assert_eq!(nulls, 200);
    assert!(switches > 0);
}

/// OTEP 4719 reading protocol; returns the `threadlocal.attribute_key_map`, or `None`
/// when the process publishes no context.
fn process_context(target: &Target) -> Option<Vec<String>> {
    use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use prost::Message;

    /// `opentelemetry.proto.processcontext.v1development.ProcessContext`, as OTEP 4719
    /// gives it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct ProcessContext {
        #[prost(message, optional, tag = "1")]
        resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        attributes: Vec<KeyValue>,
    }

    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid)).unwrap();
    let found: Vec<(u64, &str)> = maps
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let name = fields.get(5..).map(|f| f.join(" ")).unwrap_or_default();
            let named = [
                "[anon_shmem:OTEL_CTX]",
                "[anon:OTEL_CTX]",
                "/memfd:OTEL_CTX",
            ]
            .iter()
            .any(|prefix| name.starts_with(prefix));
            let start = u64::from_str_radix(fields[0].split('-').next()?, 16).ok()?;
            (named && !fields[1].contains('x')).then_some((start, line))
        })
        .collect();
    if found.is_empty() {
        return None;
    }
    assert_eq!(
        found.len(),
        1,
        "one OTEL_CTX mapping, not executable: {found:?}"
    );
    let (addr, line) = found[0];
    let mut header = [0u8; 32];
    target.read(addr, &mut header);
    assert_eq!(&header[..8], b"OTEL_CTX", "signature");
    assert_eq!(
        u32::from_ne_bytes(header[8..12].try_into().unwrap()),
        2,
        "version"
    );
    let published = u64::from_ne_bytes(header[16..24].try_into().unwrap());
    assert_ne!(published, 0, "monotonic_published_at_ns");
    let size = u32::from_ne_bytes(header[12..16].try_into().unwrap()) as usize;
    let payload_addr = u64::from_ne_bytes(header[24..32].try_into().unwrap());
    let mut payload = vec![0; size];
    target.read(payload_addr, &mut payload);
    assert_eq!(
        target.u64_at(addr + 16),
        published,
        "no update while reading"
    );
    let context = ProcessContext::decode(payload.as_slice()).expect("protobuf payload");
    let string = |kv: &KeyValue| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    };
    let resource = context.resource.expect("resource");
    let service = resource
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(string);
    assert_eq!(service.as_deref(), Some("thread-ctx-target"));
    let schema = context
        .attributes
        .iter()
        .find(|kv| kv.key == "threadlocal.schema_version")
        .and_then(string);
    assert_eq!(schema.as_deref(), Some("tlsdesc_v1_dev"));
    let keys = context
        .attributes
        .iter()
        .find(|kv| kv.key == "threadlocal.attribute_key_map")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::ArrayValue(array) => Some(
                array
                    .values
                    .iter()
                    .filter_map(|v| match v.value.as_ref()? {
                        Value::StringValue(s) => Some(s.clone()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .expect("threadlocal.attribute_key_map");
    println!(
        "thread_ctx_reader: process context at {addr:#x} ({}), {} resource attributes, \
         schema {schema:?}, keys {keys:?}",
        line.split_whitespace()
            .skip(5)
            .collect::<Vec<_>>()
            .join(" "),
        resource.attributes.len()
    );
    Some(keys)
}

/// The thread-pointer offset of `otel_thread_ctx_v1` in the target's executable.
fn tls_offset(pid: i32) -> i64 {
    use object::elf::{PT_TLS, STT_TLS};
    use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
    use object::{Object, ObjectSymbol, RelocationFlags, RelocationTarget};

    let data = std::fs::read(format!("/proc/{pid}/exe")).unwrap();
    let file = ElfFile64::<object::Endianness>::parse(data.as_slice()).expect("ELF");
    let endian = file.endian();
    // The OTEP: look the symbol up in `.dynsym`.
    let symbol = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("otel_thread_ctx_v1"))
        .expect("otel_thread_ctx_v1 in .dynsym");
    assert_eq!(symbol.elf_symbol().st_type(), STT_TLS, "an STT_TLS symbol");
    assert_eq!(symbol.size(), 8, "a pointer");
    // Relocations naming the symbol tell the access model; an executable that defines it
    // has none (the linker relaxed the accesses to local-exec).
    let named: Vec<u32> = file
        .dynamic_relocations()
        .into_iter()
        .flatten()
        .filter(|(_, r)| r.target() == RelocationTarget::Symbol(symbol.index()))
        .filter_map(|(_, r)| match r.flags() {
            RelocationFlags::Elf { r_type } => Some(r_type),
            _ => None,
        })
        .collect();
    assert!(
        named.is_empty(),
        "relocations {named:?} name the symbol: this reader handles the executable's \
         local-exec case only"
    );
    let tls = file
        .elf_header()
        .program_headers(endian, data.as_slice())
        .unwrap()
        .iter()
        .find(|p| p.p_type(endian) == PT_TLS)
        .expect("PT_TLS");
    let align = tls.p_align(endian).max(1);
    let value = symbol.address() as i64;
    if cfg!(target_arch = "aarch64") {
        // Variant I: the executable's block starts after the 16-byte TCB, aligned.
        (16u64.next_multiple_of(align)) as i64 + value
    } else {
        // Variant II (x86-64): the executable's block ends at the thread pointer.
        value - tls.p_memsz(endian).next_multiple_of(align) as i64
    }
}

/// Waits for a stop of tracee `tid` (`None`: none yet, with `WNOHANG`).
fn wait(tid: i32, flags: i32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waiting for our tracee.
    let got = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | flags) };
    if got == 0 {
        return None;
    }
    assert_eq!(got, tid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFSTOPPED(status), "status {status:#x}");
    Some(status)
}

/// The reader's ptrace handle on some of the target's threads.
struct Tracer;

impl Tracer {
    fn seize(tids: &[i32]) -> std::io::Result<Tracer> {
        for &tid in tids {
            // SAFETY: plain ptrace requests on our child's threads.
            if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(Tracer)
    }

    /// Runs `f` while thread `tid` is stopped (`PTRACE_INTERRUPT`), then resumes it.
    fn stopped<R>(&self, tid: i32, f: impl FnOnce() -> R) -> R {
        self.stop(tid);
        let out = f();
        // SAFETY: `tid` is in a ptrace-stop we caused.
        assert_eq!(unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, 0) }, 0);
        out
    }

    /// Stops thread `tid` in an interrupt stop (`PTRACE_EVENT_STOP`).
    ///
    /// The thread's profiling timer sends it `SIGPROF`, and each signal is a
    /// signal-delivery-stop the tracer must resume with the signal. An interrupt races
    /// those stops both ways: sent while the thread runs, it is cleared by a signal
    /// stop the thread takes first (any ptrace-stop clears a pending interrupt), so no
    /// interrupt stop follows the resume; sent while the thread is already in a signal
    /// stop not yet waited for, it stays pending and stops the thread right after the
    /// resume. So after a signal stop the reader waits a little for an interrupt stop,
    /// and interrupts again when none comes: never waiting forever, never leaving one
    /// pending.
    fn stop(&self, tid: i32) {
        loop {
            // SAFETY: as in `seize`.
            assert_eq!(
                unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) },
                0
            );
            let mut status = wait(tid, 0).expect("a blocking wait returns a stop");
            loop {
                if status >> 16 == libc::PTRACE_EVENT_STOP {
                    return;
                }
                // A signal for the target: deliver it, then look for our stop.
                let signal = libc::WSTOPSIG(status);
                // SAFETY: `tid` is in a signal-delivery-stop.
                assert_eq!(
                    unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, signal) },
                    0
                );
                let until = Instant::now() + Duration::from_millis(5);
                status = loop {
                    if let Some(status) = wait(tid, libc::WNOHANG) {
                        break status;
                    }
                    if Instant::now() >= until {
                        break 0;
                    }
                    std::thread::yield_now();
                };
                if status == 0 {
                    // The interrupt was cleared by the signal stop: ask again.
                    break;
                }
            }
        }
    }

    /// The thread pointer of `tid`: `fs_base` on x86-64, `tpidr_el0` on aarch64.
    fn thread_pointer(&self, tid: i32) -> u64 {
        self.stopped(tid, || {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: `regs` is a valid out-pointer for PTRACE_GETREGS.
                let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
                let rc = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs) };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                regs.fs_base
            }
            #[cfg(target_arch = "aarch64")]
            {
                const NT_ARM_TLS: libc::c_int = 0x401;
                let mut tpidr = 0u64;
                let mut iov = libc::iovec {
                    iov_base: (&mut tpidr as *mut u64).cast(),
                    iov_len: 8,
                };
                // SAFETY: `iov` describes 8 writable bytes.
                let rc = unsafe { libc::ptrace(libc::PTRACE_GETREGSET, tid, NT_ARM_TLS, &mut iov) };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                tpidr
            }
        })
    }

    fn detach(&self, tid: i32) {
        self.stop(tid);
        // SAFETY: `tid` is in a ptrace-stop we caused.
        assert_eq!(unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) }, 0);
    }
}
