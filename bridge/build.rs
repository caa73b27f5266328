//! Compiles the OTEP 4947 thread-local variable (`src/record/thread_ctx/tls.c`) on Linux x86-64
//! and aarch64, the platforms whose TLS ABI the thread context readers know.
//!
//! C, not Rust: stable Rust can neither export a thread-local under a fixed name nor
//! choose its TLS dialect, and the OTEP asks for the symbol `otel_thread_ctx_v1` in the
//! dynamic symbol table, accessed through TLS descriptors (`-mtls-dialect=gnu2`).

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=src/record/thread_ctx/tls.c");
    println!("cargo:rustc-check-cfg=cfg(otel_thread_ctx)");
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if os != "linux" || !(arch == "x86_64" || arch == "aarch64") {
        return;
    }
    let mut build = cc::Build::new();
    build.file("src/record/thread_ctx/tls.c").warnings(true);
    if arch == "x86_64" {
        // TLSDESC; on aarch64 descriptors are the only general-dynamic dialect already.
        build.flag("-mtls-dialect=gnu2");
    }
    build.compile("otel_profiling_thread_ctx");
    println!("cargo:rustc-cfg=otel_thread_ctx");
    // This package's own tests, examples and benchmarks export the symbol in `.dynsym`,
    // where the OTEP tells readers to look. (A build script's link arguments never reach
    // the crates that depend on this one: the README shows the line applications add.)
    println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
}
