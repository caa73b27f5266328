//! Issue 42: root-span names past `MAX_SPAN_NAMES` share `<other>`, and a thread that
//! sees a stream of them (ids in span names, the case the cap is for) keeps no memory per
//! name. Measured on the process's resident set: before the fix each folded name stayed
//! in the cache of every thread that saw it, for the thread's life (1,000,000 names on one
//! thread: +100 MB; 250,000 spans with distinct `otel.name` on another: +31 MB); now
//! +8 to 72 KiB and +244 KiB (the threads' own start).

use std::fmt::Write as _;
use std::sync::{mpsc, Arc, Barrier};

use otel_profiling::{span_names_overflowed, ProfilingLayer, SpanName, MAX_SPAN_NAMES};
use tracing_subscriber::layer::SubscriberExt;

/// The process's resident set in bytes (`VmRSS` of `/proc/self/status`).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

/// 4 MiB: an eighth of the smaller growth of the unbounded caches, sixteen times the
/// larger one now.
const LIMIT: u64 = 4 << 20;

/// Runs `work` on a new thread and returns how much the resident set grew meanwhile. The
/// thread then waits at `exit`: a thread's exit frees its cache, and memory its allocator
/// arena keeps would hide the next measurement's growth.
fn grown_on_a_thread(
    work: impl FnOnce() + Send + 'static,
    exit: &Arc<Barrier>,
) -> (u64, std::thread::JoinHandle<()>) {
    let (grown_tx, grown_rx) = mpsc::channel();
    let exit = exit.clone();
    let thread = std::thread::spawn(move || {
        let before = rss_bytes();
        work();
        let _ = grown_tx.send(rss_bytes().saturating_sub(before));
        exit.wait();
    });
    let grown = grown_rx.recv().expect("the thread measured");
    (grown, thread)
}

#[test]
fn a_stream_of_names_past_the_cap_keeps_no_memory() {
    for i in 0..MAX_SPAN_NAMES {
        SpanName::intern(&format!("span-names-bounded/fill/{i}"));
    }
    let other = SpanName::intern("span-names-bounded/first-past-the-cap");
    assert_eq!(
        &*other.resolve(),
        SpanName::OVERFLOW_NAME,
        "the table is full"
    );
    let overflowed = span_names_overflowed();

    // Both measuring threads and this one.
    let exit = Arc::new(Barrier::new(3));
    let (interned, first) = grown_on_a_thread(
        move || {
            let mut name = String::new();
            for i in 0..1_000_000u32 {
                name.clear();
                let _ = write!(name, "GET /users/{i:08}/orders");
                assert_eq!(SpanName::intern(&name), other);
            }
        },
        &exit,
    );
    let (spans, second) = grown_on_a_thread(
        || {
            let subscriber = tracing_subscriber::registry().with(ProfilingLayer::new());
            tracing::subscriber::with_default(subscriber, || {
                for i in 0..250_000u32 {
                    let span = tracing::info_span!(
                        "request",
                        otel.name = %format_args!("GET /orders/{i:08}/items")
                    );
                    span.in_scope(|| {});
                }
            });
        },
        &exit,
    );
    exit.wait();
    for thread in [first, second] {
        thread.join().expect("measuring thread");
    }
    eprintln!(
        "resident set: +{interned} bytes for 1,000,000 folded names on one thread, \
         +{spans} for 250,000 spans with distinct otel.name on another"
    );
    assert!(
        span_names_overflowed() >= overflowed + 1_000_000,
        "each name was folded into <other>"
    );
    assert!(
        interned < LIMIT,
        "folded names grew a thread by {interned} bytes"
    );
    assert!(
        spans < LIMIT,
        "otel.name ids grew a thread by {spans} bytes"
    );
    // A name from before the table was full still answers itself.
    assert_eq!(
        &*SpanName::intern("span-names-bounded/fill/7").resolve(),
        "span-names-bounded/fill/7"
    );
}
