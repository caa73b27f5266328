//! Whose code a frame is: the user's, or a dependency's (a crate from the Cargo registry
//! or a git checkout, the toolchain's library, C libraries), decided from the binary
//! itself where the profiles carry source paths.
//!
//! With source paths (the bridge writes each function's file from the line tables): a
//! file under the Cargo registry (`…/registry/src/<index>/<crate>-<version>/`), a git
//! checkout (`…/git/checkouts/<repo>-<hash>/<rev>/`) or the toolchain's library
//! (`/rustc/<hash>/library/<crate>/`, `…/rustlib/src/rust/library/<crate>/`) is a
//! dependency, grouped by its crate; any other file is the user's (the executable's crate
//! and the workspace's others, path dependencies too), and so is every crate whose
//! functions have such files. A frame without a file is the user's when the crate of its
//! qualified name is one of those (or given with `--crate`), a dependency when it is a
//! crate seen only under dependency paths, and otherwise classified by name as before
//! ([`library_group`]: known runtime and library families, C library functions).
//!
//! Where the user's crates are known (files, `--crate`, `main`, the spans' modules), a
//! name without a path in C's style (an upper-case letter, which no snake_case Rust
//! function has) is C code linked in (`sqlite3VdbeExec`): [`C_GROUP`].
//!
//! The profiler's own frames (the `otel_profiling` crate: its span hooks, the sampler)
//! are never the user's code, whatever their files say: a service built against the
//! bridge as a path dependency (a vendored copy, this repository's examples) would
//! otherwise see a sample landing in a span hook as its own top function, where a report
//! read from Pyroscope (names only) calls it the profiler's. `--crate otel-profiling`
//! still makes them the user's.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use otel_profiling_pprof::source::dependency_crate;

use crate::functions::{library_group, owning_crate, NO_STACK};

/// The user's crates and each function's source file, for one set of profiles.
#[derive(Clone, Debug, Default)]
pub struct Ownership {
    /// Source file per function name (from the profiles' function table).
    sources: HashMap<Arc<str>, Arc<str>>,
    /// Crates that are the user's: those with functions in user files, and `--crate`.
    user_crates: BTreeSet<String>,
    /// Crates seen only in dependency files.
    dependency_crates: BTreeSet<String>,
    /// Crates named with `--crate`: the user's whatever their files say.
    named: BTreeSet<String>,
    /// No source files to go by (an executable without debug info): a crate neither
    /// named nor an entry crate is a dependency.
    entry_crates_only: bool,
}

impl Ownership {
    /// From the functions' source files and the crates the user names (`--crate`).
    pub fn new(sources: HashMap<Arc<str>, Arc<str>>, extra_user_crates: &[String]) -> Ownership {
        let named: BTreeSet<String> = extra_user_crates
            .iter()
            .map(|c| c.replace('-', "_"))
            .collect();
        let mut user_crates = named.clone();
        let mut dependency_crates = BTreeSet::new();
        for (function, file) in &sources {
            let Some(krate) = owning_crate(function) else {
                continue;
            };
            if krate == PROFILER_CRATE && !named.contains(krate) {
                continue;
            }
            match dependency_crate(file) {
                None => {
                    user_crates.insert(krate.to_owned());
                }
                Some(_) => {
                    dependency_crates.insert(krate.to_owned());
                }
            }
        }
        dependency_crates.retain(|c| !user_crates.contains(c));
        Ownership {
            sources,
            user_crates,
            dependency_crates,
            named,
            entry_crates_only: false,
        }
    }

    /// For profiles of an executable without debug info (no source files): the crates of
    /// its `main` functions (`svc::main`) are the user's, beside `--crate`, and every other
    /// crate is a dependency, rather than guessed from its name.
    pub fn entry_crates_only(mut self, entry_crates: impl IntoIterator<Item = String>) -> Self {
        let before = self.user_crates.len();
        self.user_crates.extend(entry_crates);
        self.entry_crates_only = self.user_crates.len() > before || !self.named.is_empty();
        self
    }

    /// The group a frame's code belongs to (a crate or family name: `tokio`, `sha2`,
    /// `std`, `libc`…), or `None` for the user's own code.
    pub fn group(&self, frame: &str) -> Option<Arc<str>> {
        let frame = frame.trim();
        if frame == NO_STACK {
            return Some(Arc::from(NO_STACK));
        }
        let krate = owning_crate(frame);
        if krate.is_some_and(|krate| self.named.contains(krate)) {
            return None;
        }
        // Never the user's, whatever file the line table gives them (rustc emits the
        // allocator shims into the user's own compile unit).
        if let Some(own @ (PROFILER_CRATE | ALLOCATOR_SHIMS)) = krate {
            return Some(Arc::from(own));
        }
        if let Some(file) = self.sources.get(frame) {
            return dependency_crate(file).map(|krate| family_or(&krate));
        }
        if let Some(krate) = owning_crate(frame) {
            if self.user_crates.contains(krate) {
                return None;
            }
            if self.dependency_crates.contains(krate) || self.entry_crates_only {
                return Some(family_or(krate));
            }
        }
        match library_group(frame) {
            Some(group) => Some(Arc::from(group)),
            // Where the user's crates are known, a path-less name in C's style (an
            // upper-case letter: `sqlite3VdbeExec`, which no snake_case Rust function
            // has) is a C library's the symbol table named. A bare snake_case name may be
            // the user's inlined Rust code whose crate the debug info did not give.
            None if krate.is_none()
                && !self.user_crates.is_empty()
                && !frame.starts_with(['<', '{'])
                && frame.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                Some(Arc::from(C_GROUP))
            }
            None => None,
        }
    }

    /// Whether `frame` is the user's code.
    pub fn is_user(&self, frame: &str) -> bool {
        self.group(frame).is_none()
    }

    /// The crates taken as the user's.
    pub fn user_crates(&self) -> impl Iterator<Item = &str> {
        self.user_crates.iter().map(String::as_str)
    }
}

/// The group of path-less names no family claims: C code linked into the executable.
pub const C_GROUP: &str = "C code";

/// The profiler's own crate: its frames are its own, never the user's (module docs).
const PROFILER_CRATE: &str = "otel_profiling";

/// The path rustc gives the allocator shims (`__rustc::__rust_alloc`, `__rust_realloc`):
/// the innermost frames of allocation samples, the allocator's, not the caller's.
const ALLOCATOR_SHIMS: &str = "__rustc";

/// The family a crate belongs to (`tokio_util` → `tokio`), else the crate itself.
fn family_or(krate: &str) -> Arc<str> {
    let probe = format!("{krate}::x");
    Arc::from(library_group(&probe).unwrap_or(krate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_decides_whose_code_a_frame_is() {
        let sources: HashMap<Arc<str>, Arc<str>> = [
            ("svc::catalog::hash_catalog", "/work/svc/src/catalog.rs"),
            ("svc_model::Item::price", "/work/model/src/lib.rs"),
            (
                "sha2::sha256::compress256",
                "/u/.cargo/registry/src/index.crates.io-1/sha2-0.10.8/src/sha256.rs",
            ),
            (
                "itoa::Buffer::format",
                "/u/.cargo/registry/src/index.crates.io-1/itoa-1.0.11/src/lib.rs",
            ),
            // rustc emits the allocator shims into the user's compile unit.
            ("__rustc::__rust_realloc", "/work/svc/src/main.rs"),
        ]
        .into_iter()
        .map(|(f, p)| (Arc::from(f), Arc::from(p)))
        .collect();
        let owners = Ownership::new(sources, &["extra-crate".to_owned()]);
        // By file.
        assert!(owners.is_user("svc::catalog::hash_catalog"));
        assert!(owners.is_user("svc_model::Item::price"));
        assert_eq!(
            owners.group("sha2::sha256::compress256").as_deref(),
            Some("sha2")
        );
        // The allocator's shim is never the user's, whatever its file.
        assert_eq!(
            owners.group("__rustc::__rust_realloc").as_deref(),
            Some("__rustc")
        );
        // Without a file, by the crate of its name: the user's crates, the dependencies
        // seen, --crate, then the built-in families.
        assert!(owners.is_user("svc::main"));
        assert!(owners.is_user("svc::catalog::{closure#0}"));
        assert_eq!(
            owners.group("sha2::sha256::schedule").as_deref(),
            Some("sha2")
        );
        assert_eq!(owners.group("itoa::fmt").as_deref(), Some("itoa"));
        assert!(owners.is_user("extra_crate::f"));
        assert_eq!(
            owners.group("tokio::runtime::park").as_deref(),
            Some("tokio")
        );
        assert_eq!(
            owners.group("close").as_deref(),
            None.or(library_group("close"))
        );
        assert!(
            owners.is_user("{closure#0}"),
            "a bare Rust name is no C code"
        );
        // No files at all: the name rules alone, as before.
        let none = Ownership::default();
        assert_eq!(none.group("sha2::x").as_deref(), library_group("sha2::x"));
        assert!(none.is_user("handle_report"));
    }

    #[test]
    fn without_source_files_the_crate_of_main_is_the_users() {
        let guessed = Ownership::new(HashMap::new(), &[]);
        assert!(
            guessed.is_user("<u64 as itoa::Unsigned>::fmt"),
            "by name: unknown"
        );
        let owners = Ownership::new(HashMap::new(), &["extra-crate".to_owned()])
            .entry_crates_only(["svc".to_owned()]);
        assert!(owners.is_user("svc::catalog::hash_catalog"));
        assert!(owners.is_user("extra_crate::helper"));
        assert_eq!(
            owners.group("<u64 as itoa::Unsigned>::fmt").as_deref(),
            Some("itoa")
        );
        assert_eq!(
            owners.group("tokio::runtime::park").as_deref(),
            Some("tokio")
        );
        assert_eq!(owners.group("__memcpy_avx").as_deref(), Some("libc"));
        // C code linked in: never the user's once their crates are known.
        assert_eq!(owners.group("sqlite3VdbeExec").as_deref(), Some(C_GROUP));
        assert_eq!(
            Ownership::new(HashMap::new(), &["svc".to_owned()])
                .group("sqlite3VdbeExec")
                .as_deref(),
            Some(C_GROUP)
        );
        // The profiler's frames, named or vendored: its own.
        assert_eq!(
            owners
                .group("otel_profiling::hooks::otel_scope::in_scope<u64>")
                .as_deref(),
            Some("otel_profiling")
        );
    }
}
