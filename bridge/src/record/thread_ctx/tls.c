/*
 * The OTEP 4947 thread-local variable, defined in C because stable Rust can neither give
 * a thread-local an unmangled, exported name nor choose its TLS dialect.
 *
 * `otel_thread_ctx_v1` is an 8-byte STT_TLS object of default visibility holding a pointer
 * to the calling thread's Thread Local Context Record (or NULL: no record attached). The
 * record itself lives in a Rust thread-local (see `record.rs`); Rust asks for the slot's
 * address once per thread, through the accessor below, and stores the record's address
 * in it. Every later update changes the record only (its `valid` byte), never the slot.
 *
 * Dialect: build.rs compiles this file with `-mtls-dialect=gnu2` on x86-64 (TLSDESC;
 * aarch64 uses TLS descriptors by default), and the variable asks for the general-dynamic
 * model, so a shared object built from it carries TLSDESC relocations, the OTEP's
 * recommended form. Linked into an executable, the linker relaxes the access to
 * local-exec, which the OTEP's readers must handle (and do).
 */

#include <stddef.h>

__attribute__((visibility("default"), tls_model("global-dynamic")))
__thread void *otel_thread_ctx_v1 = NULL;

/* The calling thread's slot. Called once per thread, off the hot path. */
void **otel_profiling_thread_ctx_slot(void) { return &otel_thread_ctx_v1; }
