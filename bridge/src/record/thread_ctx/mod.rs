//! The OpenTelemetry thread context (OTEP 4947) and process context (OTEP 4719): the
//! running local root span of every thread, published where a profiler *outside* the
//! process — the OpenTelemetry eBPF profiler, Datadog's agent — reads it to attribute its
//! own samples to our spans.
//!
//! * Each thread's **Thread Local Context Record** (trace id, span id, trace flags, and
//!   the root span's name as attribute 0) is reached through the ELF TLS variable
//!   [`SYMBOL`] (`otel_thread_ctx_v1`), an 8-byte pointer exported in the dynamic symbol
//!   table and accessed through TLS descriptors. It points at the record of the local
//!   root the thread runs (NULL: none), one record per root, written once beside the
//!   root's label slot; the pointer moves at the same root-span transitions as the
//!   crate's own span record: a store or two, no allocation, no lock, no system call. A
//!   record is rewritten for another root only once no thread's pointer can name it
//!   (`naming.rs`).
//! * The **process context** is a mapping named `OTEL_CTX` holding the resource
//!   attributes and the thread context's schema ([`SCHEMA_VERSION`]) and attribute key
//!   map ([`ATTRIBUTE_KEYS`]); readers look there first.
//!
//! [`Telemetry`](crate::Telemetry) turns both on by default (`Telemetry::thread_context`,
//! `OTEL_PROFILING_THREAD_CONTEXT`). Without it:
//!
//! ```
//! use opentelemetry::trace::{SpanId, TraceId};
//! use otel_profiling::{thread_ctx, LocalRoot, SpanContextGuard};
//!
//! // Process context from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, and the writer on.
//! thread_ctx::enable()?;
//! assert!(thread_ctx::is_enabled());
//! {
//!     // Every context switch of the crate now also updates this thread's record.
//!     let root = LocalRoot::new(SpanId::from(7), TraceId::from(9), None);
//!     let _guard = SpanContextGuard::enter(Some(&root));
//! }
//! thread_ctx::disable();
//! # Ok::<(), thread_ctx::ThreadContextError>(())
//! ```
//!
//! The symbol is in `.dynsym` only if the executable is linked with
//! `-Wl,--export-dynamic-symbol=otel_thread_ctx_v1` (a library's build script cannot
//! add that for its dependents; docs/thread-context.md shows the `.cargo/config.toml` line). Without
//! it, readers that fall back to `.symtab` (the OpenTelemetry eBPF profiler does) still
//! find it in binaries that are not stripped. See `docs/thread-context.md` for the
//! format, the sources, and the out-of-process reader test.

use std::sync::atomic::{AtomicU8, Ordering};

mod naming;
mod process;
mod record;
mod thread;

#[cfg(test)]
pub(crate) use naming::to_name;
pub(crate) use naming::Naming;
pub(crate) use process::{hold_for_fork, release_after_fork};
pub use process::{PROCESS_CONTEXT_HEADER_LEN, PROCESS_CONTEXT_SIGNATURE, PROCESS_CONTEXT_VERSION};
pub(crate) use record::register_name;
pub(crate) use thread::after_fork_in_child;

/// The TLS symbol readers look up: a pointer to the thread's record, or NULL.
pub const SYMBOL: &str = "otel_thread_ctx_v1";

/// Process-context attribute naming the thread context's schema.
pub const SCHEMA_VERSION_KEY: &str = "threadlocal.schema_version";

/// The schema this writer publishes. OTEP 4947 names `tlsdesc_v1_dev` as the initial
/// value (to become `tls_v1` later); it is the value the OpenTelemetry eBPF profiler's
/// reader and the other published writers use.
pub const SCHEMA_VERSION: &str = "tlsdesc_v1_dev";

/// Process-context attribute listing the record's attribute names by key index.
pub const ATTRIBUTE_KEY_MAP_KEY: &str = "threadlocal.attribute_key_map";

/// The record's attribute names, by key index: the local root span's name only (the same
/// `span_name` the crate's profiles carry).
pub const ATTRIBUTE_KEYS: &[&str] = &["span_name"];

/// Key index of the span name in a record's `attrs-data`.
pub(crate) const SPAN_NAME_KEY: u8 = 0;

/// Errors of publishing the thread and process context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadContextError {
    /// This platform has no `otel_thread_ctx_v1` (only Linux on x86-64 and aarch64).
    #[error("the OpenTelemetry thread context is only published on Linux x86-64 and aarch64")]
    Unsupported,
    /// The process context's mapping could not be created.
    #[error("could not map the OTEL_CTX process context: {0}")]
    Map(#[source] std::io::Error),
    /// The resource attributes do not fit the process context.
    #[error("the process context payload is {0} bytes, more than the 65536 readers accept")]
    PayloadTooLarge(usize),
    /// The environment's resource attributes are malformed.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

const NEVER: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

/// [`NEVER`]: the writer was never on (one relaxed load and a branch per transition);
/// [`ON`]: it publishes; [`OFF`]: it was on and now only sets a thread's pointer to NULL.
static STATE: AtomicU8 = AtomicU8::new(NEVER);

/// Publishes the process context with the resource from the environment
/// (`OTEL_SERVICE_NAME`, else `PYROSCOPE_APPLICATION_NAME`, else `unknown_service`, and
/// `OTEL_RESOURCE_ATTRIBUTES`) and turns the thread record writer on.
pub fn enable() -> Result<(), ThreadContextError> {
    let env = crate::config::EnvConfig::from_env()?;
    let mut resource = env.resource_attributes;
    resource.retain(|(key, _)| key != "service.name");
    resource.push((
        "service.name".to_string(),
        env.service_name
            .unwrap_or_else(|| "unknown_service".to_string()),
    ));
    enable_with_resource(&resource)
}

/// Publishes (or updates) the process context with `resource` (key, value pairs; the
/// last value of a key wins) and turns the thread record writer on.
pub fn enable_with_resource(resource: &[(String, String)]) -> Result<(), ThreadContextError> {
    if !cfg!(otel_thread_ctx) {
        return Err(ThreadContextError::Unsupported);
    }
    process::publish(resource)?;
    // The barrier's form is chosen here, before any record is filled: registering
    // `membarrier` takes milliseconds, and no released slot can be reclaimed until it is
    // chosen, so a first publication racing heavy root churn would see fresh slots taken
    // meanwhile.
    naming::barrier::init();
    STATE.store(ON, Ordering::Relaxed);
    Ok(())
}

/// Stops publishing thread records. The calling thread's `otel_thread_ctx_v1` is NULL
/// now; every other thread's at its next span transition (until then a reader still sees
/// the root it was running). The process context stays published.
pub fn disable() {
    if STATE.load(Ordering::Relaxed) == ON {
        STATE.store(OFF, Ordering::Relaxed);
        thread::invalidate();
    }
}

/// Whether the writer was ever on in this process (a switch then goes through
/// [`publish`]: on, it publishes; off again, it sets a thread's pointer to NULL once).
#[inline(always)]
pub(crate) fn was_ever_enabled() -> bool {
    STATE.load(Ordering::Relaxed) != NEVER
}

/// Whether thread records are being written.
pub fn is_enabled() -> bool {
    STATE.load(Ordering::Relaxed) == ON
}

/// Publishes the calling thread's new local root (`None`: no span). Called by
/// `span_context::replace` at every root transition, on the owning thread.
///
/// A switch of a process that never enabled the writer pays one load and a branch. This
/// is inlined into the switch, itself out of line, so a transition makes one call.
#[inline]
pub(crate) fn publish(label: Option<crate::label::Label>) {
    // ON first: the usual case is one compare.
    match STATE.load(Ordering::Relaxed) {
        // A label whose root ended meanwhile (a stale word restored) reads as none.
        ON => thread::publish(label),
        NEVER => {}
        _ => thread::invalidate(),
    }
}

#[cfg(test)]
mod tests;
