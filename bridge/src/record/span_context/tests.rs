use super::*;
use crate::span_name::SpanName;
use opentelemetry::trace::{SpanId, TraceId};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

/// What `current_local_root` reads while `root` runs.
fn seen(root: &LocalRoot) -> Option<RootLabel> {
    Some(root.label())
}

fn root(n: u64) -> LocalRoot {
    // Every field differs between roots, so a torn read would be visible as a mix.
    LocalRoot::new(
        SpanId::from(n),
        TraceId::from(u128::from(n) << 64 | u128::from(n)),
        Some(SpanName::intern(&format!("span-context-test/{n}"))),
    )
}

#[test]
fn guards_nest_and_restore() {
    let (a, b) = (root(1), root(2));
    assert_eq!(current_local_root(), None);
    let outer = SpanContextGuard::enter(Some(&a));
    {
        let _inner = SpanContextGuard::enter(Some(&b));
        assert_eq!(current_local_root(), seen(&b));
        {
            let _cleared = SpanContextGuard::enter(None);
            assert_eq!(current_local_root(), None);
        }
        assert_eq!(current_local_root(), seen(&b));
    }
    assert_eq!(current_local_root(), seen(&a));
    drop(outer);
    assert_eq!(current_local_root(), None);
}

/// A guard dropped before one entered after it leaves the later one's context in place,
/// and that one, when dropped, restores what was there before both, not the ended root.
#[test]
fn guards_dropped_out_of_order_keep_the_live_scope() {
    let (a, b, c) = (root(3), root(4), root(5));
    let ga = SpanContextGuard::enter(Some(&a));
    let gb = SpanContextGuard::enter(Some(&b));
    drop(ga);
    assert_eq!(
        current_local_root(),
        seen(&b),
        "a's drop cleared the live b"
    );
    drop(gb);
    assert_eq!(
        current_local_root(),
        None,
        "b's drop brought back the ended a"
    );

    // The middle one of three.
    let ga = SpanContextGuard::enter(Some(&a));
    let gb = SpanContextGuard::enter(Some(&b));
    let gc = SpanContextGuard::enter(Some(&c));
    drop(gb);
    assert_eq!(current_local_root(), seen(&c));
    drop(gc);
    assert_eq!(current_local_root(), seen(&a), "c restores what b found");
    drop(ga);
    assert_eq!(current_local_root(), None);
}

/// Guards held across `.await` in futures joined on a current-thread runtime end in the
/// order the futures finish: the first future's guard ends while the second's is live.
#[test]
fn guards_held_across_awaits_in_join() {
    let (a, b) = (root(6), root(7));
    let (a, b) = (&a, &b);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let b_seen_at_end = rt.block_on(async {
        let ((), seen) = tokio::join!(
            async {
                let _guard = SpanContextGuard::enter(Some(a));
                tokio::task::yield_now().await;
            },
            async {
                let _guard = SpanContextGuard::enter(Some(b));
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
                // The first future has finished and dropped its guard by now.
                current_local_root()
            },
        );
        seen
    });
    assert_eq!(b_seen_at_end, seen(b), "a's guard ending cleared b's");
    assert_eq!(
        current_local_root(),
        None,
        "b's guard brought back the ended a"
    );
}

#[test]
fn ids_round_trip() {
    let r = root(0xdead_beef);
    assert_eq!(r.span_id(), Some(SpanId::from(0xdead_beef)));
    assert_eq!(
        r.span_id().map(|s| s.to_string()).as_deref(),
        Some("00000000deadbeef")
    );
    assert_eq!(r.trace_id_u128(), 0xdead_beef_u128 << 64 | 0xdead_beef);
    let n = LocalRoot::name_only(SpanName::intern("x"));
    assert_eq!((n.span_id(), n.trace_id()), (None, None));
    let _g = SpanContextGuard::enter(Some(&n));
    assert_eq!(current_local_root(), seen(&n));
}

/// A reader on another thread, racing a writer that alternates two roots as fast as it can,
/// sees only the two roots or "no span", never a mix.
#[test]
fn cross_thread_reads_are_never_torn() {
    let cell = Arc::new(SpanContextCell::new());
    let stop = Arc::new(AtomicBool::new(false));
    let (a, b) = (root(11), root(22));
    let (wa, wb) = (a.word(), b.word());
    let (a, b) = (a.label(), b.label());
    let writer = {
        let (cell, stop) = (cell.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                cell.write(if i.is_multiple_of(2) { wa } else { wb });
                i += 1;
            }
            i
        })
    };
    let (mut seen, mut none) = (0u64, 0u64);
    for _ in 0..2_000_000 {
        match cell.read() {
            Some(r) => {
                assert!(r == a || r == b, "torn read: {r:?}");
                seen += 1;
            }
            None => none += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().expect("writer");
    assert!(
        writes > 0 && seen > 0,
        "writes {writes}, seen {seen}, none {none}"
    );
}

/// The sequence at its wrap (`u64::MAX` → 0): snapshots stay whole, an odd sequence reads
/// as a write in progress to them, and every write still changes the sequence a reader compares (the
/// watchdog's "same poll" test), across the wrap too.
#[test]
fn the_sequence_wraps_without_a_repeat_or_a_torn_read() {
    let cell = SpanContextCell::new();
    let (a, b) = (root(31), root(32));
    cell.set_sequence(u64::MAX - 3);
    cell.write(a.word());
    let (before, read) = cell.snapshot().expect("no write in progress");
    assert_eq!((before, read), (u64::MAX - 1, seen(&a)));
    cell.write(b.word());
    let (after, read) = cell.snapshot().expect("no write in progress");
    assert_eq!((after, read), (0, seen(&b)), "wrapped");
    assert_ne!(after, before);
    cell.write(a.word());
    let (again, read) = cell.snapshot().expect("no write in progress");
    assert_eq!(read, seen(&a));
    assert!(again != before && again != after);
    cell.set_sequence(u64::MAX);
    assert_eq!(cell.snapshot(), None, "odd: a write in progress");
    // The handler runs on the owning thread, between two of the writer's instructions:
    // the word alone is always whole, the sequence is not its concern.
    assert_eq!(cell.read(), seen(&a));
}

static HANDLER_CELL: AtomicUsize = AtomicUsize::new(0);
static SEEN_A: AtomicU64 = AtomicU64::new(0);
static SEEN_B: AtomicU64 = AtomicU64::new(0);
static SEEN_NONE: AtomicU64 = AtomicU64::new(0);
static SEEN_TORN: AtomicU64 = AtomicU64::new(0);
static A_SPAN: AtomicU64 = AtomicU64::new(0);
static B_SPAN: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigusr2(_: libc::c_int) {
    // Same reads the sampler's handler does: through the thread's own cell, loads only.
    let cell = HANDLER_CELL.load(Ordering::Relaxed) as *const SpanContextCell;
    if cell.is_null() {
        return;
    }
    // SAFETY: the pointer is the interrupted thread's own live cell (set before signals start).
    let read = unsafe { (*cell).read() };
    let counter = match read {
        None => &SEEN_NONE,
        Some(r)
            if r.span_id == A_SPAN.load(Ordering::Relaxed)
                && r.trace_id >> 64 == u128::from(r.span_id)
                && r.trace_id as u64 == r.span_id =>
        {
            &SEEN_A
        }
        Some(r)
            if r.span_id == B_SPAN.load(Ordering::Relaxed)
                && r.trace_id >> 64 == u128::from(r.span_id)
                && r.trace_id as u64 == r.span_id =>
        {
            &SEEN_B
        }
        Some(_) => &SEEN_TORN,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A signal handler that interrupts the writing thread mid-write sees a whole root or
/// "no span", never a mix: the sampler's exact situation.
#[test]
fn signal_handler_reads_are_never_torn() {
    let (a, b) = (root(33), root(44));
    A_SPAN.store(33, Ordering::Relaxed);
    B_SPAN.store(44, Ordering::Relaxed);
    // SAFETY: installing a handler that only does atomic loads and stores.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigusr2 as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()),
            0
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            HANDLER_CELL.store(thread_cell() as usize, Ordering::SeqCst);
            // SAFETY: pthread_self has no preconditions.
            let _ = ready_tx.send(unsafe { libc::pthread_self() });
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                drop(SpanContextGuard::enter(Some(if i.is_multiple_of(2) {
                    &a
                } else {
                    &b
                })));
                i += 1;
            }
        })
    };
    let thread = ready_rx.recv().expect("writer started");
    for _ in 0..20_000 {
        // SAFETY: the writer thread is alive until `stop` is set and it is joined below.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let (sa, sb, sn, st) = (
        SEEN_A.load(Ordering::Relaxed),
        SEEN_B.load(Ordering::Relaxed),
        SEEN_NONE.load(Ordering::Relaxed),
        SEEN_TORN.load(Ordering::Relaxed),
    );
    assert_eq!(st, 0, "torn reads: a {sa}, b {sb}, none {sn}, torn {st}");
    assert!(sa > 0 && sb > 0, "a {sa}, b {sb}, none {sn}");
}

/// A scope whose root's last handle is dropped while the scope is still on the stack (a
/// guard forgotten with `mem::forget`; the borrow keeps it from happening otherwise):
/// from then on the record names a released slot, and reads (the handler's, the
/// watchdog's) report no label, never the label of a root that reuses the slot, also
/// when a later scope's exit restores the stale word.
#[test]
fn a_word_outliving_its_root_reads_as_no_label() {
    let a = root(51);
    let word = a.word().expect("a slot");
    std::mem::forget(SpanContextGuard::enter(Some(&a)));
    assert_eq!(current_local_root(), seen(&a));
    drop(a);
    assert_eq!(current_local_root(), None, "released: no label");
    // Claims that may take the slot again (the free list is LIFO; another test's thread
    // may take it first): the old word never reads as any of them.
    let reused: Vec<_> = (0..64).map(|n| root(1000 + n)).collect();
    assert_eq!(current_local_root(), None, "reused: still no label");
    assert!(
        reused.iter().all(|r| r.word() != Some(word)),
        "a generation repeated"
    );
    {
        let _above = SpanContextGuard::enter(Some(&reused[0]));
        assert_eq!(current_local_root(), seen(&reused[0]));
    }
    assert_eq!(
        current_local_root(),
        None,
        "the stale word restored reads as none"
    );
    // Leave the thread clean for the next test on it.
    super::forget_scopes_for_test();
}

/// `with_trace_flags` after the claim reaches what the handler reads.
#[test]
fn trace_flags_set_after_the_claim_are_read() {
    use opentelemetry::trace::TraceFlags;
    let a = root(52).with_trace_flags(TraceFlags::new(0x03));
    let _g = SpanContextGuard::enter(Some(&a));
    assert_eq!(
        current_local_root().map(|r| r.trace_flags()),
        Some(TraceFlags::new(0x03))
    );
}
