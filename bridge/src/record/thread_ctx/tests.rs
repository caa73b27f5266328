use super::*;
use crate::{LocalRoot, SpanContextGuard, SpanName};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer, TracerProvider,
};
use prost::Message;
use std::sync::{Mutex, PoisonError};

/// The tests that switch the process-wide writer on and off run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn decoded() -> Option<(u128, u64, u8, Vec<u8>)> {
    thread::decoded()
}

fn on() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    enable_with_resource(&[("service.name".into(), "thread-ctx-unit".into())]).unwrap();
    guard
}

#[test]
fn thread_ctx_record_follows_the_root_and_encodes_its_name() {
    let _serial = on();
    std::thread::spawn(|| {
        assert!(thread::slot_value().is_null(), "NULL before the first span");
        let name = SpanName::intern("thread-ctx/GET /orders/{id}");
        let root = LocalRoot::new(
            SpanId::from(0x0102_0304_0506_0708),
            TraceId::from(0x1112_1314_1516_1718_191a_1b1c_1d1e_1f20),
            Some(name),
        );
        {
            let _guard = SpanContextGuard::enter(Some(&root));
            let (trace, span, flags, attrs) = decoded().expect("valid while in the span");
            assert_eq!(trace, 0x1112_1314_1516_1718_191a_1b1c_1d1e_1f20);
            assert_eq!(span, 0x0102_0304_0506_0708);
            assert_eq!(flags, 0x01);
            let text = b"thread-ctx/GET /orders/{id}";
            assert_eq!(attrs[0], SPAN_NAME_KEY);
            assert_eq!(usize::from(attrs[1]), text.len());
            assert_eq!(&attrs[2..], text);
            // The pointer names the record beside the root's label slot.
            let slot = crate::label::slot_index(root.word().unwrap().word());
            let record = crate::label::LABELS.naming().record(slot).unwrap();
            assert_eq!(thread::slot_value(), record.record());
            // In memory the ids are the W3C bytes, in order.
            {
                let bytes =
                    unsafe { std::slice::from_raw_parts(thread::slot_value().cast::<u8>(), 28) };
                assert_eq!(
                    bytes[..16],
                    0x1112_1314_1516_1718_191a_1b1c_1d1e_1f20u128.to_be_bytes()
                );
                assert_eq!(bytes[16..24], 0x0102_0304_0506_0708u64.to_be_bytes());
                assert_eq!(bytes[24], 1, "valid");
                assert_eq!(bytes[25], 0x01, "trace flags: sampled");
                assert_eq!(u16::from_ne_bytes([bytes[26], bytes[27]]), 2 + 27);
            }
            // The root's own flags byte, here sampled + random (W3C level 2).
            let random = LocalRoot::new(
                SpanId::from(0x0102_0304_0506_0708),
                TraceId::from(0x1112_1314_1516_1718_191a_1b1c_1d1e_1f20),
                Some(name),
            )
            .with_trace_flags(TraceFlags::new(0x03));
            let _inner = SpanContextGuard::enter(Some(&random));
            {
                let bytes =
                    unsafe { std::slice::from_raw_parts(thread::slot_value().cast::<u8>(), 28) };
                assert_eq!(bytes[24], 1, "valid");
                assert_eq!(bytes[25], 0x03, "trace flags: the root's");
            }
            assert_eq!(decoded().map(|(_, _, flags, _)| flags), Some(0x03));
        }
        assert_eq!(decoded(), None, "invalid once no span runs");
        assert!(thread::slot_value().is_null(), "NULL once no span runs");
    })
    .join()
    .unwrap();
}

/// Issue 22 item 6: a local root whose remote parent carried `03` (sampled, random) is
/// published with `03`, not a constant `01`; one whose parent carried `01`, with `01`.
#[test]
fn thread_ctx_record_carries_the_roots_w3c_trace_flags() {
    let _serial = on();
    std::thread::spawn(|| {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let tracer = provider.tracer("thread-ctx-flags");
        for (parent_flags, span) in [(0x03u8, 0x31u64), (0x01, 0x32)] {
            let remote = SpanContext::new(
                TraceId::from(0x7777_u128),
                SpanId::from(span),
                TraceFlags::new(parent_flags),
                true,
                TraceState::default(),
            );
            let parent = opentelemetry::Context::new().with_remote_span_context(remote);
            let server = tracer.start_with_context("GET /flags", &parent);
            let cx = parent.with_span(server);
            let scope = crate::ProfilingContext::new(cx, "GET /flags");
            let root = scope.local_root().expect("a sampled local root");
            assert_eq!(root.trace_flags(), TraceFlags::new(parent_flags));
            let (trace, _, flags, _) = scope.in_scope(decoded).expect("valid inside the root");
            assert_eq!(trace, 0x7777);
            assert_eq!(flags, parent_flags, "the record carries the span's flags");
        }
        let _ = provider.shutdown();
    })
    .join()
    .unwrap();
}

#[test]
fn thread_ctx_name_only_roots_and_long_names() {
    let _serial = on();
    std::thread::spawn(|| {
        let long = "é".repeat(200); // 400 bytes: cut at a character boundary
        let root = LocalRoot::name_only(SpanName::intern(&long));
        let _guard = SpanContextGuard::enter(Some(&root));
        let (trace, span, flags, attrs) = decoded().expect("valid");
        assert_eq!(
            (trace, span, flags),
            (0, 0, 0),
            "no ids for an unsampled trace"
        );
        assert_eq!(usize::from(attrs[1]), 254);
        assert_eq!(std::str::from_utf8(&attrs[2..]).unwrap(), "é".repeat(127));
        // A root without a name clears the attribute.
        let plain = LocalRoot::new(SpanId::from(5), TraceId::from(6), None);
        let _inner = SpanContextGuard::enter(Some(&plain));
        assert_eq!(decoded(), Some((6, 5, 1, Vec::new())));
    })
    .join()
    .unwrap();
}

/// The record keeps the word whose label its fields hold: the same root entered again
/// (the next poll) is valid again with its own fields; a root released while a forgotten
/// scope still names it, and the slot reused by another root, is published as no span
/// when that scope's word comes back, never as the root that reuses the slot.
#[test]
fn thread_ctx_same_root_again_and_a_released_root_restored() {
    let _serial = on();
    std::thread::spawn(|| {
        let a = LocalRoot::new(SpanId::from(21), TraceId::from(22), None);
        for _ in 0..3 {
            let _poll = SpanContextGuard::enter(Some(&a));
            assert_eq!(decoded(), Some((22, 21, 1, Vec::new())));
            drop(_poll);
            assert_eq!(decoded(), None, "between polls");
        }
        // A forgotten guard leaves a's word on the stack; then a is released while a
        // scope of no span runs above it.
        std::mem::forget(SpanContextGuard::enter(Some(&a)));
        let none = SpanContextGuard::enter(None);
        assert_eq!(decoded(), None);
        drop(a);
        // a's stale word comes back: the root the thread named last, whose record now
        // holds its release mark.
        drop(none);
        assert_eq!(decoded(), None, "the root named last, released: no span");
        // Usually a's slot (the free list is LIFO), unless another test's thread claimed
        // in between: either way a's word must not publish b.
        let b = LocalRoot::new(SpanId::from(31), TraceId::from(32), None);
        {
            let _b = SpanContextGuard::enter(Some(&b));
            assert_eq!(decoded(), Some((32, 31, 1, Vec::new())));
        }
        // b's scope ended: a's stale word is the context again.
        assert_eq!(decoded(), None, "a released root is no span, never b");
        crate::span_context::forget_scopes_for_test();
    })
    .join()
    .unwrap();
}

#[test]
fn thread_ctx_disable_invalidates_and_stops_writing() {
    let _serial = on();
    std::thread::spawn(|| {
        let root = LocalRoot::new(SpanId::from(11), TraceId::from(12), None);
        let guard = SpanContextGuard::enter(Some(&root));
        assert!(decoded().is_some());
        disable();
        assert!(!is_enabled());
        assert_eq!(decoded(), None, "disable invalidates the caller's record");
        let other = LocalRoot::new(SpanId::from(13), TraceId::from(14), None);
        let inner = SpanContextGuard::enter(Some(&other));
        assert_eq!(decoded(), None, "nothing written while off");
        drop(inner);
        drop(guard);
    })
    .join()
    .unwrap();
    enable_with_resource(&[]).unwrap();
    assert!(is_enabled());
}

#[test]
fn thread_ctx_process_context_header_and_payload() {
    let _serial = on();
    let resource = [
        ("service.name".to_string(), "checkout".to_string()),
        ("service.version".to_string(), "1.2.3".to_string()),
        ("service.name".to_string(), "checkout-2".to_string()),
    ];
    enable_with_resource(&resource).unwrap();
    let addr = process::published_addr().expect("published");
    let read = |addr: usize| unsafe {
        let base = addr as *const u8;
        let signature = std::slice::from_raw_parts(base, 8).to_vec();
        let version = std::ptr::read_unaligned(base.add(8).cast::<u32>());
        let size = std::ptr::read_unaligned(base.add(12).cast::<u32>()) as usize;
        let ts = std::ptr::read_unaligned(base.add(16).cast::<u64>());
        let payload = std::ptr::read_unaligned(base.add(24).cast::<u64>()) as *const u8;
        let payload = std::slice::from_raw_parts(payload, size).to_vec();
        (signature, version, ts, payload)
    };
    let (signature, version, ts, payload) = read(addr);
    assert_eq!(signature, b"OTEL_CTX");
    assert_eq!(version, 2);
    assert_ne!(ts, 0);
    let message = process::ProcessContext::decode(payload.as_slice()).unwrap();
    let resource = message.resource.unwrap();
    let pairs: Vec<(String, String)> = resource
        .attributes
        .iter()
        .map(|kv| {
            (
                kv.key.clone(),
                format!("{:?}", kv.value.as_ref().unwrap().value),
            )
        })
        .collect();
    assert_eq!(pairs.len(), 2, "unique keys: {pairs:?}");
    assert!(
        pairs[1].1.contains("checkout-2"),
        "last value wins: {pairs:?}"
    );
    assert_eq!(message.attributes[0].key, SCHEMA_VERSION_KEY);
    assert_eq!(message.attributes[1].key, ATTRIBUTE_KEY_MAP_KEY);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| usize::from_str_radix(l.split('-').next().unwrap(), 16).unwrap() == addr)
        .unwrap();
    assert!(
        [
            "[anon_shmem:OTEL_CTX]",
            "[anon:OTEL_CTX]",
            "/memfd:OTEL_CTX"
        ]
        .iter()
        .any(|name| line.contains(name)),
        "{line}"
    );
    // A second publication updates the same mapping with a later timestamp.
    enable_with_resource(&[("service.name".into(), "again".into())]).unwrap();
    assert_eq!(
        process::published_addr(),
        Some(addr),
        "one context per process"
    );
    let (_, _, ts2, payload2) = read(addr);
    assert!(ts2 > ts);
    let message = process::ProcessContext::decode(payload2.as_slice()).unwrap();
    assert_eq!(message.resource.unwrap().attributes[0].key, "service.name");
}

/// A child forked after publication has no `OTEL_CTX` mapping (`MADV_DONTFORK`); its own
/// `enable` maps a new one instead of writing to the parent's address.
#[test]
fn thread_ctx_fork_child_publishes_its_own_context() {
    let _serial = on();
    let count = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.contains("OTEL_CTX"))
            .count()
    };
    assert_eq!(count(), 1);
    // SAFETY: the child only reads /proc, maps memory and exits; the locks it takes are
    // not held by another thread (SERIAL serializes every caller of `enable`).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let before = count();
        let ok = enable_with_resource(&[("service.name".into(), "child".into())]).is_ok();
        let after = count();
        unsafe {
            libc::_exit(if before == 0 && ok && after == 1 {
                0
            } else {
                1
            })
        };
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
}

/// Threads running one root name one record: its bytes are written once, by the first.
#[test]
fn thread_ctx_threads_running_one_root_name_one_record() {
    let _serial = on();
    let root = LocalRoot::new(SpanId::from(41), TraceId::from(42), None);
    let named = |root: &LocalRoot| {
        let _guard = SpanContextGuard::enter(Some(root));
        (thread::slot_value() as usize, decoded())
    };
    let here = named(&root);
    let there = std::thread::scope(|s| s.spawn(|| named(&root)).join().unwrap());
    assert_ne!(here.0, 0);
    assert_eq!(here, there, "one record, named by both threads");
    assert_eq!(here.1, Some((42, 41, 1, Vec::new())));
}

/// A released root's slot is not reused (its record not rewritten) while a thread's
/// `otel_thread_ctx_v1` still names it, however many roots come and go and reclaims run;
/// once that thread moved off (here: exited), a reclaim frees it and a new root fills
/// the same record with its own bytes.
#[test]
fn thread_ctx_a_named_slot_is_reused_only_once_no_thread_names_it() {
    use crate::label::{slot_index, LABELS};
    let _serial = on();
    let (named_tx, named_rx) = std::sync::mpsc::channel();
    let (exit_tx, exit_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let a = LocalRoot::new(SpanId::from(51), TraceId::from(52), None);
        // The scope stays on the stack (and the pointer on a's record) after a is gone.
        std::mem::forget(SpanContextGuard::enter(Some(&a)));
        let index = slot_index(a.word().unwrap().word());
        drop(a);
        named_tx
            .send((index, thread::slot_value() as usize))
            .unwrap();
        exit_rx.recv().unwrap();
        crate::span_context::forget_scopes_for_test();
    });
    let (index, pointer) = named_rx.recv().unwrap();
    assert_ne!(pointer, 0);
    let record = || unsafe { &*(pointer as *const record::Record) }.decode();
    assert_eq!(record(), Some((52, 51, 1, Vec::new())));
    // Roots published and released on this thread, reclaims between them: never a's slot.
    for i in 0..300u64 {
        let root = LocalRoot::new(SpanId::from(1000 + i), TraceId::from(7), None);
        drop(SpanContextGuard::enter(Some(&root)));
        assert_ne!(
            slot_index(root.word().unwrap().word()),
            index,
            "reused while named"
        );
        drop(root);
        if i % 50 == 0 {
            LABELS.reclaim_for_test();
        }
    }
    assert_eq!(
        record(),
        Some((52, 51, 1, Vec::new())),
        "rewritten while named"
    );
    // The holder exits: its mirror goes back, the slot is freed and reused.
    exit_tx.send(()).unwrap();
    holder.join().unwrap();
    LABELS.reclaim_for_test();
    let reused = (0..10_000u64).find_map(|i| {
        let root = LocalRoot::new(SpanId::from(5000 + i), TraceId::from(9), None);
        let guard = SpanContextGuard::enter(Some(&root));
        let hit = (slot_index(root.word().unwrap().word()) == index)
            .then(|| (thread::slot_value() as usize, decoded()));
        drop(guard);
        if i % 50 == 49 {
            LABELS.reclaim_for_test();
        }
        hit
    });
    let (again, value) = reused.expect("a's slot is reused once no thread names it");
    assert_eq!(again, pointer, "the same record");
    let (trace, span, _, _) = value.expect("valid");
    assert_eq!(trace, 9);
    assert!(span >= 5000, "the new root's own bytes");
}

/// While the thread context is on, a root's record is filled as its label is claimed, so
/// its publications only store the pointer; a root claimed while it is off is filled by
/// its first publication instead.
#[test]
fn thread_ctx_a_root_claimed_while_on_has_its_record_filled_at_once() {
    use crate::label::{slot_index, LABELS};
    let _serial = on();
    let record_of = |root: &LocalRoot| {
        let word = root.word().expect("a slot").word();
        (
            word,
            LABELS.naming().record(slot_index(word)).expect("record"),
        )
    };
    let root = LocalRoot::new(SpanId::from(61), TraceId::from(62), None);
    let (word, record) = record_of(&root);
    assert!(record.holds(word), "filled by the claim");
    assert_eq!(record.decode(), Some((62, 61, 1, Vec::new())));
    std::thread::spawn(move || {
        let _guard = SpanContextGuard::enter(Some(&root));
        assert_eq!(thread::slot_value(), record.record(), "named as filled");
        assert_eq!(decoded(), Some((62, 61, 1, Vec::new())));
    })
    .join()
    .unwrap();
    disable();
    let off = LocalRoot::new(SpanId::from(63), TraceId::from(64), None);
    let (word, record) = record_of(&off);
    assert!(!record.holds(word), "not filled while off");
    enable_with_resource(&[]).unwrap();
    std::thread::spawn(move || {
        let _guard = SpanContextGuard::enter(Some(&off));
        assert!(record.holds(word), "filled by its first publication");
        assert_eq!(decoded(), Some((64, 63, 1, Vec::new())));
    })
    .join()
    .unwrap();
}
