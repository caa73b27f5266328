//! CPU per function: self time (the innermost frame) and total time (anywhere on the stack),
//! over every frame or over the user's own code only, with the rest grouped by library.

use std::collections::HashMap;
use std::sync::Arc;

use crate::input::Sample;
use crate::ownership::Ownership;

/// The frame name given to samples without a stack.
pub const NO_STACK: &str = "[no stack]";

/// A function with the CPU time attributed to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionCpu {
    /// Function name (demangled, as in the profile).
    pub function: String,
    /// CPU time, nanoseconds.
    pub cpu_ns: u64,
}

/// Self and total CPU per function over a set of samples.
#[derive(Clone, Debug, Default)]
pub(crate) struct FunctionTotals {
    self_ns: HashMap<Arc<str>, u64>,
    total_ns: HashMap<Arc<str>, u64>,
    /// Deepest position seen from the outermost frame (0): breaks ties in favour of the
    /// frames nearer the work (the handler rather than the thread's entry point).
    depth: HashMap<Arc<str>, usize>,
    /// CPU per innermost frame of the user's code (see [`library_group`]): its own CPU and
    /// that of the library code it called, which is where a user can act on it.
    user_self_ns: HashMap<Arc<str>, u64>,
    /// CPU per library group of the innermost frame, when that frame is not the user's.
    grouped_ns: HashMap<Arc<str>, u64>,
    /// Whose code each frame is (the default: by name alone).
    owners: Arc<Ownership>,
}

impl FunctionTotals {
    /// Totals that tell the user's code from dependencies with `owners`.
    pub(crate) fn with_owners(owners: Arc<Ownership>) -> FunctionTotals {
        FunctionTotals {
            owners,
            ..FunctionTotals::default()
        }
    }

    /// Whether `function` is the user's code.
    pub(crate) fn is_user(&self, function: &str) -> bool {
        self.owners.is_user(function)
    }

    /// Adds one sample: its CPU counts as self time of its innermost frame and as total
    /// time of every function on its stack, once even when the function recurses.
    pub(crate) fn add(&mut self, sample: &Sample) {
        let no_stack: Arc<str> = Arc::from(NO_STACK);
        let innermost = sample.frames.first().unwrap_or(&no_stack);
        *self.self_ns.entry(innermost.clone()).or_default() += sample.cpu_ns;
        let mut on_stack: Vec<&Arc<str>> = if sample.frames.is_empty() {
            vec![&no_stack]
        } else {
            sample.frames.iter().collect()
        };
        on_stack.sort_unstable();
        on_stack.dedup();
        for function in on_stack {
            *self.total_ns.entry(function.clone()).or_default() += sample.cpu_ns;
        }
        for (depth, function) in sample.frames.iter().rev().enumerate() {
            let deepest = self.depth.entry(function.clone()).or_default();
            *deepest = (*deepest).max(depth);
        }
        if let Some(group) = self.owners.group(innermost) {
            *self.grouped_ns.entry(group).or_default() += sample.cpu_ns;
        }
        if let Some(user) = sample.frames.iter().find(|f| self.owners.is_user(f)) {
            *self.user_self_ns.entry(user.clone()).or_default() += sample.cpu_ns;
        }
    }

    /// Self CPU of `function`.
    pub(crate) fn self_ns(&self, function: &str) -> u64 {
        self.self_ns.get(function).copied().unwrap_or(0)
    }

    /// The deepest position `function` was seen at, from the outermost frame (0).
    pub(crate) fn depth(&self, function: &str) -> usize {
        self.depth.get(function).copied().unwrap_or(0)
    }

    /// Total CPU of `function`.
    pub(crate) fn total_ns(&self, function: &str) -> u64 {
        self.total_ns.get(function).copied().unwrap_or(0)
    }

    /// Every function seen.
    pub(crate) fn functions(&self) -> impl Iterator<Item = &Arc<str>> {
        self.total_ns.keys()
    }

    /// The `n` functions with the most self CPU, most first.
    pub(crate) fn top_self(&self, n: usize) -> Vec<FunctionCpu> {
        self.top(&self.self_ns, n)
    }

    /// The `n` functions with the most total CPU, most first; among equals, the deepest
    /// on the stack first (many frames of a thread's entry hold 100 %).
    pub(crate) fn top_total(&self, n: usize) -> Vec<FunctionCpu> {
        self.top(&self.total_ns, n)
    }

    /// The `n` functions of the user's code with the most CPU in them or in the library
    /// code they called (innermost frame of the user's code), most first.
    pub(crate) fn top_user_self(&self, n: usize) -> Vec<FunctionCpu> {
        self.top(&self.user_self_ns, n)
    }

    /// The `n` functions of the user's code with the most total CPU, most first; among
    /// equals, the deepest first.
    pub(crate) fn top_user_total(&self, n: usize) -> Vec<FunctionCpu> {
        let user: HashMap<Arc<str>, u64> = self
            .total_ns
            .iter()
            .filter(|(f, _)| self.owners.is_user(f))
            .map(|(f, &ns)| (f.clone(), ns))
            .collect();
        self.top(&user, n)
    }

    /// CPU whose innermost frame is library or runtime code, per group (`tokio`, `std`,
    /// `libc`…), most first; `function` is the group's name.
    pub(crate) fn grouped(&self) -> Vec<FunctionCpu> {
        let mut groups: Vec<FunctionCpu> = self
            .grouped_ns
            .iter()
            .filter(|(_, &ns)| ns > 0)
            .map(|(group, &ns)| FunctionCpu {
                function: group.to_string(),
                cpu_ns: ns,
            })
            .collect();
        groups.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.function.cmp(&b.function)));
        groups
    }

    /// Most CPU first, then deepest first, then by name.
    fn top(&self, map: &HashMap<Arc<str>, u64>, n: usize) -> Vec<FunctionCpu> {
        let mut all: Vec<(&Arc<str>, u64, usize)> = map
            .iter()
            .filter(|(_, &ns)| ns > 0)
            .map(|(f, &ns)| (f, ns, self.depth.get(f).copied().unwrap_or(0)))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(b.0)));
        all.into_iter()
            .take(n)
            .map(|(f, ns, _)| FunctionCpu {
                function: f.to_string(),
                cpu_ns: ns,
            })
            .collect()
    }
}

/// Crate families whose frames are runtime or library code, not the user's: a crate
/// belongs to a family when its name is the family's or starts with it and `_`
/// (`tokio_util`, `opentelemetry_sdk`, `serde_json`). The family names the group.
const LIBRARY_FAMILIES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "tokio",
    "tracing",
    "opentelemetry",
    "hyper",
    "h2",
    "http",
    "axum",
    "tower",
    "futures",
    "mio",
    "serde",
    "otel_profiling",
    "bytes",
    "matchit",
    "parking_lot",
    "hashbrown",
    "sharded_slab",
    "slab",
    "smallvec",
    "crossbeam",
    "pin_project",
    "tonic",
    "prost",
    "reqwest",
    "rustls",
    "backtrace",
    "panic_unwind",
    "libc",
    // The allocator shims rustc emits (`__rustc::__rust_alloc`, `__rust_realloc`), the
    // innermost frames of allocation samples.
    "__rustc",
];

/// Families matched by their exact name only: a service crate named after this one
/// (`otel_profiling_examples`) is the user's code, not the profiler's.
const EXACT_FAMILIES: &[&str] = &["otel_profiling"];

/// Primitive types: their inherent methods (`<u64>::rotate_left`, kept as frames in debug
/// builds) are the standard library's code.
const PRIMITIVES: &[&str] = &[
    "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize", "f32",
    "f64", "bool", "char", "str",
];

/// Bare (path-less) names of C library and loader functions that show up on Rust stacks:
/// the C `main` rustc generates (it calls `std::rt::lang_start`; the user's is
/// `crate::main`), thread entry, clocks, allocation, memory and system calls.
const NATIVE_FUNCTIONS: &[&str] = &[
    "main",
    "start_thread",
    "clone",
    "clone3",
    "syscall",
    "clock_gettime",
    "gettimeofday",
    "time",
    "getpid",
    "malloc",
    "free",
    "realloc",
    "calloc",
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "bcmp",
    "strlen",
    "read",
    "write",
    "readv",
    "writev",
    "recv",
    "send",
    "recvfrom",
    "sendto",
    "epoll_wait",
    "poll",
    "nanosleep",
    "clock_nanosleep",
    "sched_yield",
];

/// The group name of C library, loader and vDSO frames.
pub const NATIVE_GROUP: &str = "libc";

/// The library or runtime group a frame's code belongs to, or `None` for the user's own
/// code. A frame is classified by the path that owns its code: `<A as Trait>::method` by
/// `A` (a `Serialize` impl derived on the user's type is the user's code), falling back to
/// the trait when `A` is no path (`[T]`, `u8`); generic wrappers (`…::{{closure}}`,
/// `{closure#0}`, `poll`, `call_once`) by the function they belong to, so a handler's
/// async block counts as the handler's crate and `tokio::…::poll` as tokio's.
pub fn library_group(frame: &str) -> Option<&'static str> {
    let frame = frame.trim();
    if frame == NO_STACK {
        return Some(NO_STACK);
    }
    match owning_crate(frame) {
        Some(krate) => LIBRARY_FAMILIES.iter().copied().find(|family| {
            krate == *family
                || (!EXACT_FAMILIES.contains(family)
                    && krate
                        .strip_prefix(family)
                        .is_some_and(|rest| rest.starts_with('_')))
        }),
        None => is_native(frame).then_some(NATIVE_GROUP),
    }
}

/// Whether `frame` is an unnamed address (`0x…`, or `file+0x…` where no symbol covers it).
pub fn is_address(frame: &str) -> bool {
    frame.starts_with("0x") || frame.contains("+0x")
}

/// The first path segment (the crate) of the path owning `frame`'s code; `None` for a
/// name without a path (a C symbol, or an unnamed `file+0x…` address).
pub(crate) fn owning_crate(frame: &str) -> Option<&str> {
    let mut path = frame;
    while let Some(inner) = path.strip_prefix('<') {
        let inner = ["&mut ", "&", "*const ", "*mut ", "dyn ", "impl "]
            .iter()
            .fold(inner, |s, p| s.strip_prefix(p).unwrap_or(s));
        match first_segment(inner) {
            Some(_) => path = inner,
            // `<[T] as alloc::…>::m`, `<u8 as core::…>::m`: the trait's crate owns it.
            None => match inner.split_once(" as ") {
                Some((_, rest)) => path = rest,
                // `<u64>::rotate_left`, `<[T]>::iter`: inherent methods of the language's
                // own types.
                None if inner.starts_with('[')
                    || PRIMITIVES.iter().any(|p| {
                        inner
                            .strip_prefix(p)
                            .is_some_and(|rest| rest.starts_with('>'))
                    }) =>
                {
                    return Some("core")
                }
                None => return None,
            },
        }
    }
    first_segment(path)
}

/// `krate` of `krate::rest`, when `path` starts with an identifier followed by `::`.
fn first_segment(path: &str) -> Option<&str> {
    let end = path
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(path.len());
    let (ident, rest) = path.split_at(end);
    (!ident.is_empty() && rest.starts_with("::")).then_some(ident)
}

/// A path-less name of the C library, the loader or the vDSO: an unnamed `libc.so.6+0x…`
/// address, `[vdso]`, a reserved `_`/`__` symbol (`__libc_start_main`, `_start`,
/// `__vdso_clock_gettime`) or one of [`NATIVE_FUNCTIONS`].
fn is_native(frame: &str) -> bool {
    let name = frame.split('@').next().unwrap_or(frame);
    name.starts_with('_')
        || name.starts_with('[')
        || name.starts_with("0x")
        || name.contains(".so")
        || name.contains("+0x")
        || name.starts_with("pthread_")
        || NATIVE_FUNCTIONS.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(frames: &[&str], cpu_ns: u64) -> Sample {
        Sample {
            frames: frames.iter().map(|f| Arc::from(*f)).collect(),
            cpu_ns,
            count: 1,
            span_id: None,
            trace_id: None,
            span_name: None,
            window: None,
        }
    }

    #[test]
    fn self_is_innermost_and_total_counts_recursion_once() {
        let mut totals = FunctionTotals::default();
        totals.add(&sample(&["leaf", "rec", "rec", "main"], 10));
        totals.add(&sample(&["rec", "main"], 5));
        totals.add(&sample(&[], 1));
        assert_eq!(totals.self_ns("leaf"), 10);
        assert_eq!(totals.self_ns("rec"), 5);
        assert_eq!(totals.total_ns("rec"), 15);
        assert_eq!(totals.total_ns("main"), 15);
        assert_eq!(totals.self_ns(NO_STACK), 1);
        // main and rec tie at 15: the deeper one comes first.
        let top = totals.top_total(2);
        assert_eq!(top[0].function, "rec");
        assert_eq!(top[1].function, "main");
        assert_eq!(totals.top_self(1)[0].function, "leaf");
    }

    #[test]
    fn frames_are_classified_by_the_path_owning_their_code() {
        for (frame, group) in [
            ("shop::catalog::serialize_catalog", None),
            ("__rustc::__rust_realloc", Some("__rustc")),
            ("shop::handlers::get_catalog::{{closure}}", None),
            ("shop::handlers::get_catalog::{closure#0}", None),
            ("<shop::Catalog as serde::ser::Serialize>::serialize", None),
            ("handle_report", None),
            (
                "tokio::runtime::task::core::Core<T,S>::poll::{{closure}}",
                Some("tokio"),
            ),
            (
                "<core::pin::Pin<P> as core::future::future::Future>::poll",
                Some("core"),
            ),
            (
                "<&mut serde_json::ser::Serializer<W> as serde::ser::Serializer>::serialize_str",
                Some("serde"),
            ),
            (
                "<[T] as alloc::slice::hack::ConvertVec>::to_vec",
                Some("alloc"),
            ),
            ("core::ops::function::FnOnce::call_once", Some("core")),
            (
                "tracing_subscriber::registry::Registry::enter",
                Some("tracing"),
            ),
            (
                "opentelemetry_sdk::trace::span::Span::end",
                Some("opentelemetry"),
            ),
            ("axum::routing::Router::call", Some("axum")),
            ("tower_http::trace::service::Trace::call", Some("tower")),
            ("std::rt::lang_start_internal", Some("std")),
            ("libc.so.6+0x9508b", Some(NATIVE_GROUP)),
            ("__libc_start_main", Some(NATIVE_GROUP)),
            ("__vdso_clock_gettime", Some(NATIVE_GROUP)),
            ("clock_gettime", Some(NATIVE_GROUP)),
            ("main", Some(NATIVE_GROUP)),
            // A crate whose name only starts like a library's is the user's.
            ("tokioish::run", None),
            // So is a service crate named after this one.
            ("otel_profiling_examples::axum_routes::checksums", None),
            (
                "otel_profiling::layer::ProfilingLayer::on_enter",
                Some("otel_profiling"),
            ),
            // Inherent methods of primitive types and slices (debug builds).
            ("<u64>::rotate_left", Some("core")),
            ("<[T]>::iter", Some("core")),
        ] {
            assert_eq!(library_group(frame), group, "{frame}");
        }
    }

    #[test]
    fn user_functions_take_the_cpu_of_the_library_code_they_call() {
        let mut totals = FunctionTotals::default();
        let entry = [
            "shop::main::{{closure}}",
            "<core::pin::Pin<P> as core::future::future::Future>::poll",
            "tokio::runtime::task::harness::poll",
            "main",
        ];
        let stack = |inner: &[&'static str]| -> Vec<&'static str> { [inner, &entry[..]].concat() };
        totals.add(&sample(
            &stack(&["alloc::vec::Vec<T>::push", "shop::serialize_catalog"]),
            30,
        ));
        totals.add(&sample(&stack(&["shop::serialize_catalog"]), 10));
        totals.add(&sample(&["tokio::runtime::park", "main"], 60));
        let named = |list: Vec<FunctionCpu>| -> Vec<(String, u64)> {
            list.into_iter().map(|f| (f.function, f.cpu_ns)).collect()
        };
        assert_eq!(
            named(totals.top_user_self(5)),
            [("shop::serialize_catalog".to_owned(), 40)]
        );
        assert_eq!(
            named(totals.top_user_total(5)),
            [
                ("shop::serialize_catalog".to_owned(), 40),
                ("shop::main::{{closure}}".to_owned(), 40),
            ]
        );
        assert_eq!(
            named(totals.grouped()),
            [("tokio".to_owned(), 60), ("alloc".to_owned(), 30)]
        );
    }
}
