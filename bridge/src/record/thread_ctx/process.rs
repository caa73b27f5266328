//! The process context of OTEP 4719: the resource attributes, and the thread context's
//! reference data (`threadlocal.schema_version`, `threadlocal.attribute_key_map`), in a
//! mapping named `OTEL_CTX` that readers find in `/proc/<pid>/maps`.
//!
//! Header (32 bytes, native endianness), at the start of the mapping:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | signature `OTEL_CTX` (no NUL) |
//! | 8 | 4 | version (2) |
//! | 12 | 4 | payload size |
//! | 16 | 8 | `monotonic_published_at_ns` (`CLOCK_BOOTTIME`; 0 while being written) |
//! | 24 | 8 | payload address (here: right after the header, in the same mapping) |
//!
//! The payload is a protobuf `opentelemetry.proto.processcontext.v1development.ProcessContext`
//! (`resource = 1`, `attributes = 2`). Publishing follows the OTEP's steps: `memfd_create`
//! (`OTEL_CTX`, with a fallback to an anonymous mapping), a private mapping of it,
//! `MADV_DONTFORK`, header and payload, a full fence, the timestamp last, then the
//! `PR_SET_VMA_ANON_NAME` name. A second publication follows the OTEP's update protocol
//! (timestamp to 0, fence, payload, fence, a new larger timestamp) on the same mapping,
//! so the process never has two contexts.

use crate::fork::AtforkMutex;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::ThreadContextError;

/// The mapping's name and the header's signature.
pub const PROCESS_CONTEXT_SIGNATURE: &[u8; 8] = b"OTEL_CTX";

/// The header format version readers accept (OTEP 4719: `2`).
pub const PROCESS_CONTEXT_VERSION: u32 = 2;

/// Size of the header before the payload.
pub const PROCESS_CONTEXT_HEADER_LEN: usize = 32;

/// Largest payload this writer publishes (the OpenTelemetry eBPF profiler reads at most
/// 64 KiB).
const MAX_PAYLOAD: usize = 65536;

/// The OTEP 4719 payload message.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ProcessContext {
    /// The resource attributes describing this process.
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    /// Attributes for external readers that are not part of the resource.
    #[prost(message, repeated, tag = "2")]
    pub(crate) attributes: Vec<KeyValue>,
}

fn string_value(value: &str) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(any_value::Value::StringValue(value.to_string())),
    })
}

fn key_value(key: &str, value: Option<AnyValue>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value,
        ..KeyValue::default()
    }
}

/// The payload for `resource` and the thread context's reference data.
pub(crate) fn payload(resource: &[(String, String)]) -> Vec<u8> {
    let mut seen = std::collections::HashSet::new();
    let mut attributes: Vec<KeyValue> = resource
        .iter()
        .rev()
        // Keys must be unique: the last value of a key wins, as in the SDK's resource.
        .filter(|(key, _)| seen.insert(key.as_str()))
        .map(|(key, value)| key_value(key, string_value(value)))
        .collect();
    attributes.reverse();
    let message = ProcessContext {
        resource: Some(Resource {
            attributes,
            ..Resource::default()
        }),
        attributes: vec![
            key_value(
                super::SCHEMA_VERSION_KEY,
                string_value(super::SCHEMA_VERSION),
            ),
            key_value(
                super::ATTRIBUTE_KEY_MAP_KEY,
                Some(AnyValue {
                    value: Some(any_value::Value::ArrayValue(ArrayValue {
                        values: super::ATTRIBUTE_KEYS
                            .iter()
                            .map(|key| AnyValue {
                                value: Some(any_value::Value::StringValue(key.to_string())),
                            })
                            .collect(),
                    })),
                }),
            ),
        ],
    };
    message.encode_to_vec()
}

/// The published mapping: its address and length, and the process that mapped it.
struct Mapping {
    addr: usize,
    len: usize,
    /// A child forked after publication has no such mapping (`MADV_DONTFORK`): there
    /// the record must be ignored, never written to.
    pid: u32,
}

/// Held across `fork` by the forking thread (`crate::fork`).
static PUBLISHED: AtforkMutex<Option<Mapping>> = AtforkMutex::new(None);

/// Before `fork`: the forking thread takes the published mapping's lock.
pub(crate) fn hold_for_fork() {
    PUBLISHED.hold();
}

/// After `fork`, in the parent and in the child.
pub(crate) fn release_after_fork() {
    PUBLISHED.release();
}

/// Publishes (or updates) the process context with `resource`.
pub(crate) fn publish(resource: &[(String, String)]) -> Result<(), ThreadContextError> {
    let payload = payload(resource);
    if payload.len() > MAX_PAYLOAD {
        return Err(ThreadContextError::PayloadTooLarge(payload.len()));
    }
    crate::fork::install_handlers();
    let mut published = PUBLISHED.lock();
    if published
        .as_ref()
        .is_some_and(|mapping| mapping.pid != std::process::id())
    {
        // Inherited from the parent across fork: not mapped in this process.
        *published = None;
    }
    match published.as_ref() {
        Some(mapping) if PROCESS_CONTEXT_HEADER_LEN + payload.len() <= mapping.len => {
            // SAFETY: the mapping is ours, writable, and at least header + payload long.
            unsafe { update(mapping, &payload) };
            Ok(())
        }
        _ => {
            let mapping = create(PROCESS_CONTEXT_HEADER_LEN + payload.len())?;
            // SAFETY: as above, freshly mapped.
            unsafe { first_publish(&mapping, &payload) };
            if let Some(old) = published.replace(mapping) {
                // SAFETY: the old mapping is ours and no longer referenced. Readers that
                // were reading it see a read error or a changed timestamp, and retry.
                unsafe { libc::munmap(old.addr as *mut libc::c_void, old.len) };
            }
            Ok(())
        }
    }
}

/// The address of the published header, if any (for tests).
#[cfg(test)]
pub(crate) fn published_addr() -> Option<usize> {
    PUBLISHED.lock().as_ref().map(|mapping| mapping.addr)
}

/// `CLOCK_BOOTTIME` in nanoseconds (never 0).
fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
        .max(1)
}

/// A private, writable mapping of at least `size` bytes: of a memfd named `OTEL_CTX`
/// (closed once mapped), else anonymous; not inherited across `fork`.
fn create(size: usize) -> Result<Mapping, ThreadContextError> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1);
    let len = size.div_ceil(page) * page;
    let name = c"OTEL_CTX";
    // SAFETY: valid C string; the flags are plain bits (MFD_NOEXEC_SEAL needs Linux 6.3,
    // so a failure is retried without it, as the OTEP says).
    let mut fd = unsafe {
        libc::memfd_create(
            name.as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_NOEXEC_SEAL,
        )
    };
    if fd < 0 {
        // SAFETY: as above.
        fd = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
    }
    let mut addr = libc::MAP_FAILED;
    if fd >= 0 {
        // SAFETY: `fd` is ours; the mapping is private, so writes stay in this process.
        unsafe {
            if libc::ftruncate(fd, len as libc::off_t) == 0 {
                addr = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                    fd,
                    0,
                );
            }
            libc::close(fd);
        }
    }
    if addr == libc::MAP_FAILED {
        // SAFETY: an anonymous private mapping.
        addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(ThreadContextError::Map(std::io::Error::last_os_error()));
        }
    }
    // SAFETY: our mapping.
    if unsafe { libc::madvise(addr, len, libc::MADV_DONTFORK) } != 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: our mapping, unused.
        unsafe { libc::munmap(addr, len) };
        return Err(ThreadContextError::Map(err));
    }
    Ok(Mapping {
        addr: addr as usize,
        len,
        pid: std::process::id(),
    })
}

/// The header's timestamp field.
///
/// # Safety
/// `mapping` must be a live mapping of at least [`PROCESS_CONTEXT_HEADER_LEN`] bytes.
unsafe fn timestamp(mapping: &Mapping) -> &AtomicU64 {
    AtomicU64::from_ptr((mapping.addr + 16) as *mut u64)
}

/// Writes the payload after the header and the header's size and address fields.
///
/// # Safety
/// `mapping` must be ours, writable, and hold header + payload.
unsafe fn write_payload(mapping: &Mapping, payload: &[u8]) {
    let base = mapping.addr as *mut u8;
    std::ptr::copy_nonoverlapping(
        payload.as_ptr(),
        base.add(PROCESS_CONTEXT_HEADER_LEN),
        payload.len(),
    );
    std::ptr::write_unaligned(base.add(12).cast::<u32>(), payload.len() as u32);
    std::ptr::write_unaligned(
        base.add(24).cast::<u64>(),
        base.add(PROCESS_CONTEXT_HEADER_LEN) as u64,
    );
}

/// OTEP 4719 publication steps 6–10 on a new mapping.
///
/// # Safety
/// As [`write_payload`].
unsafe fn first_publish(mapping: &Mapping, payload: &[u8]) {
    let base = mapping.addr as *mut u8;
    std::ptr::copy_nonoverlapping(
        PROCESS_CONTEXT_SIGNATURE.as_ptr(),
        base,
        PROCESS_CONTEXT_SIGNATURE.len(),
    );
    std::ptr::write_unaligned(base.add(8).cast::<u32>(), PROCESS_CONTEXT_VERSION);
    write_payload(mapping, payload);
    fence(Ordering::SeqCst);
    timestamp(mapping).store(boottime_ns(), Ordering::SeqCst);
    name(mapping);
}

/// OTEP 4719 updating protocol on the existing mapping.
///
/// # Safety
/// As [`write_payload`].
unsafe fn update(mapping: &Mapping, payload: &[u8]) {
    let ts = timestamp(mapping);
    let before = ts.load(Ordering::Relaxed);
    ts.store(0, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    write_payload(mapping, payload);
    fence(Ordering::SeqCst);
    // Different from, and later than, the previous one.
    ts.store(boottime_ns().max(before + 1), Ordering::SeqCst);
    name(mapping);
}

/// Names the mapping `OTEL_CTX` (Linux 5.17+ with `CONFIG_ANON_VMA_NAME`; a failure is
/// ignored, as the OTEP says: readers also find `/memfd:OTEL_CTX`).
fn name(mapping: &Mapping) {
    const PR_SET_VMA: libc::c_int = 0x5356_4d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: prctl only reads the name string.
    unsafe {
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            mapping.addr as libc::c_ulong,
            mapping.len as libc::c_ulong,
            c"OTEL_CTX".as_ptr(),
        );
    }
}
