//! Module paths for the bare names debug info gives under `debug = "line-tables-only"`.
//!
//! That setting (the README's recommendation for release builds) keeps only
//! `DW_AT_name` on functions and inlined subroutines: `schedule`, `burn`, `{closure#0}`,
//! no crate and no module. A report of such names cannot tell the user's code from
//! tower's, and every closure of a crate would be one `{closure#0}`. So, for Rust compile
//! units:
//!
//! * an **out-of-line** function (the last frame of an address) takes the symbol table's
//!   name for the address, which is the mangled full path (`svc::catalog::hash_catalog`),
//!   when the file has one (see `mod.rs`);
//! * an **inlined** function, which has no symbol, becomes `<crate>::<module>::<name>`:
//!   the crate from its line-table file when that is a dependency's (Cargo registry, git
//!   checkout, the toolchain's library: `sha2::sha256::schedule`) or this crate's own,
//!   else from the compile unit's name (`src/main.rs/@/<crate>.<hash>-cgu.N`); the module
//!   from the file's path under its `src/` (`src/catalog.rs`: `catalog`). A method's type
//!   is not in the debug info: `impl Catalog { fn load }` reads `<crate>::catalog::load`;
//! * an inlined **closure or async block** (`{closure#0}`, `{async_fn#0}`,
//!   `{async_block#0}`) keeps the function it is defined in, so that distinct closures
//!   stay distinct: rustc names its type `<path>::{closure_env#0}` in the generic
//!   arguments of the code that calls it (`fold<…, svc::catalog::import::{closure_env#0},
//!   …>`), so the nearest caller naming such a type of the closure's crate gives
//!   `svc::catalog::import::{closure#0}`; failing that, the nearest caller in the same
//!   file (the function it is written in, when that calls it), else the file's module.
//!
//! Names that already carry a path (full debug info, linkage names) are left alone.

/// Whether `name` is bare: no `::` before its generic arguments (`fold<core::ops::Range
/// <u64>, …>` is bare; a qualified path, or a `<T as Trait>::method`, is not).
pub(super) fn is_bare(name: &str) -> bool {
    let head = match name.find('<') {
        Some(0) => return false,
        Some(at) => &name[..at],
        None => name,
    };
    !head.contains("::")
}

/// The crate of a Rust compile unit's name: rustc names units
/// `<main source file>/@/<crate>.<hash>-cgu.<n>`; an incremental build's units are a
/// bare hash (`src/lib.rs/@/2b7z819u5q3wbut2f7koumwg0`), which names no crate.
pub(super) fn crate_of_unit(unit_name: &str) -> Option<&str> {
    let (_, codegen_unit) = unit_name.rsplit_once("/@/")?;
    let (krate, rest) = codegen_unit.split_once('.')?;
    let named = !krate.is_empty()
        && krate.chars().all(|c| c.is_alphanumeric() || c == '_')
        && rest.contains("cgu");
    named.then_some(krate)
}

/// This crate's sources, as its own build saw them: a service that builds the bridge as a
/// path dependency (a vendored copy) inlines its code from files no registry path marks.
const OWN_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");

/// The crate a source file belongs to when its path says so: a dependency's (see
/// [`otel_profiling_pprof::source::dependency_crate`]) or this crate's own.
pub(super) fn crate_of_file(file: &str) -> Option<String> {
    otel_profiling_pprof::source::dependency_crate(file).or_else(|| {
        file.starts_with(OWN_SOURCES)
            .then(|| env!("CARGO_CRATE_NAME").to_owned())
    })
}

/// The module a source file is, within its crate, from its path under the crate's `src/`:
/// `…/src/catalog/import.rs` and `…/src/catalog/import/mod.rs` are `catalog::import`;
/// `src/main.rs`, `src/lib.rs` and `src/bin/<name>.rs` are the crate root (`""`). `None`
/// when the path has no `src/` or a part that is no identifier.
pub(super) fn module_of_file(file: &str) -> Option<String> {
    let file = file.replace('\\', "/");
    let at = file.rfind("/src/")?;
    let relative = file[at + "/src/".len()..].strip_suffix(".rs")?;
    let mut parts: Vec<&str> = relative.split('/').collect();
    if parts.len() > 1 && parts[0] == "bin" {
        // `src/bin/<name>.rs` and `src/bin/<name>/main.rs` are a binary's root.
        parts.drain(..2);
        if parts.is_empty() {
            parts.push("main");
        }
    }
    if parts.last() == Some(&"mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "main" || parts[0] == "lib") {
        parts.clear();
    }
    // A file of macros (`core::num::uint_macros`) defines functions elsewhere: its
    // directory is the nearer module.
    if parts.last().is_some_and(|p| p.ends_with("macros")) {
        parts.pop();
    }
    let identifier = |p: &&str| {
        !p.is_empty()
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars().all(|c| c.is_alphanumeric() || c == '_')
    };
    parts.iter().all(identifier).then(|| parts.join("::"))
}

/// One frame of an address as debug info names it (demangled), innermost first.
pub(super) struct RawFrame<'s> {
    pub(super) name: &'s str,
    pub(super) file: Option<&'s str>,
    /// An inlined subroutine; the last frame of a chain is the out-of-line function.
    pub(super) inlined: bool,
}

/// What a frame of a chain is called (see [`chain`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Named {
    /// As debug info names it (a path already, or no crate known).
    Unchanged,
    /// This qualified name.
    As(String),
    /// A closure written in the chain's out-of-line function, whose full path only the
    /// symbol table has: `<that path>::<suffix>`, else `fallback`.
    InFunction { suffix: String, fallback: String },
    /// The unit's crate is unknown (an incremental build names its units by a hash):
    /// `<crate>::<this>`, the crate from the symbol of the chain's out-of-line function
    /// when that is the user's code too, else this path alone.
    InUnitCrate(String),
}

/// The names of one address's frames (innermost first; see the module docs). Only bare
/// names of inlined Rust frames change; the out-of-line function is the symbol table's.
pub(super) fn chain(frames: &[RawFrame<'_>], unit_crate: Option<&str>) -> Vec<Named> {
    let mut named: Vec<Named> = frames.iter().map(|_| Named::Unchanged).collect();
    // Crates of the chain's dependency code: a closure of the unit's unknown crate is
    // none of these.
    let dependencies: Vec<String> = frames
        .iter()
        .filter_map(|f| f.file.and_then(crate_of_file))
        .chain(["core", "alloc", "std"].map(String::from))
        .collect();
    // Outermost first, so that a closure inside a closure finds its enclosing one named.
    for i in (0..frames.len()).rev() {
        let frame = &frames[i];
        if !frame.inlined || !is_bare(frame.name) {
            continue;
        }
        let krate = frame
            .file
            .and_then(crate_of_file)
            .or_else(|| unit_crate.map(str::to_owned));
        // `path` within the crate, the crate prefixed when known.
        let in_crate = |path: String| match &krate {
            Some(krate) => Named::As(format!("{krate}::{path}")),
            None => Named::InUnitCrate(path),
        };
        let module = frame.file.and_then(module_of_file).unwrap_or_default();
        let in_module = |name: &str| match module.as_str() {
            "" => name.to_owned(),
            module => format!("{module}::{name}"),
        };
        let Some(closure) = Closure::parse(frame.name) else {
            named[i] = in_crate(in_module(frame.name));
            continue;
        };
        let outer = (i + 1..frames.len()).map(|j| (j, &frames[j]));
        // 1. A caller generic over the closure's type names its path.
        let of_crate = |c: &str| match &krate {
            Some(krate) => c == krate,
            None => !dependencies.iter().any(|d| d == c),
        };
        if let Some(path) = outer
            .clone()
            .find_map(|(_, f)| closure.env_path_in(f.name, &of_crate))
        {
            named[i] = Named::As(format!("{path}::{}", frame.name));
            continue;
        }
        // 2. The nearest caller written in the same file.
        let same_file = outer
            .clone()
            .find(|(_, f)| f.file.is_some() && f.file == frame.file);
        named[i] = match same_file {
            Some((j, f)) if f.inlined => match &named[j] {
                Named::As(name) => Named::As(format!("{}::{}", without_generics(name), frame.name)),
                Named::InUnitCrate(path) => {
                    Named::InUnitCrate(format!("{}::{}", without_generics(path), frame.name))
                }
                _ => in_crate(format!("{}::{}", without_generics(f.name), frame.name)),
            },
            Some(_) => {
                let fallback = in_crate(in_module(frame.name));
                Named::InFunction {
                    suffix: frame.name.to_owned(),
                    fallback: match fallback {
                        Named::As(name) | Named::InUnitCrate(name) => name,
                        _ => frame.name.to_owned(),
                    },
                }
            }
            // 3. The file's module.
            None => in_crate(in_module(frame.name)),
        };
    }
    named
}

/// `name` without its generic arguments (`svc::fold<u64>` → `svc::fold`); a name that
/// starts with a qualified self type (`<T as Trait>::m`) as it is.
pub(super) fn without_generics(name: &str) -> &str {
    match name.find('<') {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    }
}

/// A closure-like bare name: `{closure#0}`, `{async_fn#1}<T>`, `{async_block#0}`.
struct Closure<'s> {
    /// `closure`, `async_fn`, `async_block`, `coroutine`…
    kind: &'s str,
    /// Its index among the enclosing function's closures of that kind.
    index: &'s str,
}

impl<'s> Closure<'s> {
    fn parse(name: &'s str) -> Option<Closure<'s>> {
        let inner = name.strip_prefix('{')?;
        let (inner, _) = inner.split_once('}')?;
        let (kind, index) = inner.split_once('#')?;
        let valid = !kind.is_empty()
            && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            && !index.is_empty()
            && index.chars().all(|c| c.is_ascii_digit());
        valid.then_some(Closure { kind, index })
    }

    /// The path of this closure's type (`<path>::{<kind>_env#<index>}`) in `other`'s
    /// generic arguments, of a crate `of_crate` accepts, the least nested first.
    fn env_path_in<'o>(&self, other: &'o str, of_crate: &dyn Fn(&str) -> bool) -> Option<&'o str> {
        let needle = format!("::{{{}_env#{}}}", self.kind, self.index);
        let mut best: Option<(usize, &'o str)> = None;
        for (at, _) in other.match_indices(&needle) {
            let start = other[..at]
                .rfind(|c: char| !(c.is_alphanumeric() || "_:{}#".contains(c)))
                .map_or(0, |p| p + 1);
            let path = &other[start..at];
            let first = path.split("::").next().unwrap_or("");
            if !of_crate(first) || path.starts_with(':') {
                continue;
            }
            let depth = nesting(&other[..at]);
            if best.is_none_or(|(d, _)| depth < d) {
                best = Some((depth, path));
            }
        }
        best.map(|(_, path)| path)
    }
}

/// How deep in generic arguments the end of `prefix` is (`->` is no closing bracket).
fn nesting(prefix: &str) -> usize {
    let mut depth = 0usize;
    let mut previous = ' ';
    for c in prefix.chars() {
        match c {
            '<' => depth += 1,
            '>' if previous != '-' => depth = depth.saturating_sub(1),
            _ => {}
        }
        previous = c;
    }
    depth
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'s>(name: &'s str, file: Option<&'s str>, inlined: bool) -> RawFrame<'s> {
        RawFrame {
            name,
            file,
            inlined,
        }
    }

    fn names(frames: &[RawFrame<'_>], unit: Option<&str>) -> Vec<String> {
        chain(frames, unit)
            .into_iter()
            .zip(frames)
            .map(|(n, f)| match n {
                Named::Unchanged => f.name.to_owned(),
                Named::As(name) => name,
                Named::InFunction { suffix, .. } => format!("<function>::{suffix}"),
                Named::InUnitCrate(path) => format!("<crate>::{path}"),
            })
            .collect()
    }

    #[test]
    fn units_files_and_modules_give_the_path() {
        assert_eq!(
            crate_of_unit("src/main.rs/@/heldout_workload.8f2a1c3b-cgu.0"),
            Some("heldout_workload")
        );
        assert_eq!(crate_of_unit("src/lib.rs"), None);
        // An incremental build's unit: a hash, no crate.
        assert_eq!(
            crate_of_unit("src/lib.rs/@/2b7z819u5q3wbut2f7koumwg0"),
            None
        );
        for (file, module) in [
            ("/w/svc/src/main.rs", Some("")),
            (
                "/rustc/5980/library/core/src/num/uint_macros.rs",
                Some("num"),
            ),
            ("/w/svc/src/lib.rs", Some("")),
            ("/w/svc/src/catalog.rs", Some("catalog")),
            ("/w/svc/src/catalog/import.rs", Some("catalog::import")),
            ("/w/svc/src/catalog/mod.rs", Some("catalog")),
            ("/w/svc/src/bin/tool.rs", Some("")),
            ("/w/svc/src/bin/tool/main.rs", Some("")),
            ("/w/svc/src/bin/tool/args.rs", Some("args")),
            (
                "/rustc/59807616/library/core/src/iter/adapters/map.rs",
                Some("iter::adapters::map"),
            ),
            ("/w/svc/src/2024-notes.rs", None),
            ("/w/svc/main.rs", None),
        ] {
            assert_eq!(module_of_file(file).as_deref(), module, "{file}");
        }
        let own = format!("{OWN_SOURCES}hooks/otel_scope/mod.rs");
        assert_eq!(crate_of_file(&own).as_deref(), Some("otel_profiling"));
    }

    #[test]
    fn inlined_functions_get_crate_and_module() {
        let dep = "/r/.cargo/registry/src/i-1/sha2-0.10.8/src/sha256.rs";
        let frames = [
            raw("schedule", Some(dep), true),
            raw("burn", Some("/work/svc/src/main.rs"), true),
            raw("digest", Some("/work/svc/src/catalog.rs"), true),
            raw("svc::already::qualified", None, true),
            raw("fold<core::ops::range::Range<u64>, u64>", None, true),
            raw("<T as Trait>::m", None, true),
            raw("run", None, false),
        ];
        assert_eq!(
            names(&frames, Some("svc")),
            [
                "sha2::sha256::schedule",
                "svc::burn",
                "svc::catalog::digest",
                "svc::already::qualified",
                "svc::fold<core::ops::range::Range<u64>, u64>",
                "<T as Trait>::m",
                "run",
            ]
        );
        // The unit's crate unknown: the path within it, the crate to come from the
        // out-of-line function's symbol.
        assert_eq!(
            names(&frames[1..3], None),
            ["<crate>::burn", "<crate>::catalog::digest"]
        );
        assert_eq!(names(&frames[..1], None), ["sha2::sha256::schedule"]);
        // The bridge's own code inlined into a service that vendors it.
        let own = format!("{OWN_SOURCES}hooks/otel_scope/mod.rs");
        assert_eq!(
            names(&[raw("in_scope<u64>", Some(&own), true)], Some("svc")),
            ["otel_profiling::hooks::otel_scope::in_scope<u64>"]
        );
    }

    /// The chain rustc 1.9x emits for `(0..n).map(|i| digest(i)).fold(…)` in
    /// `svc::catalog::hash_catalog` under `line-tables-only` (names as in the names
    /// fixture's DWARF): core's closure and the user's closure each take their path from
    /// the caller generic over them.
    #[test]
    fn closures_take_their_path_from_the_caller_generic_over_them() {
        let core_map = "/rustc/5980/library/core/src/iter/adapters/map.rs";
        let catalog = "/w/svc/src/catalog.rs";
        let frames = [
            raw("digest", Some(catalog), true),
            raw("{closure#0}", Some(catalog), true),
            raw(
                "{closure#0}<u64, u64, u64, svc::catalog::hash_catalog::{closure_env#0}, \
                 fn(u64, u64) -> u64>",
                Some(core_map),
                true,
            ),
            raw(
                "fold<core::ops::range::Range<u64>, u64, core::iter::adapters::map::\
                 map_fold::{closure_env#0}<u64, u64, u64, svc::catalog::hash_catalog::\
                 {closure_env#0}, fn(u64, u64) -> u64>>",
                Some(core_map),
                true,
            ),
            raw("hash_catalog", Some(catalog), false),
        ];
        let got = names(&frames, Some("svc"));
        assert_eq!(got[0], "svc::catalog::digest");
        assert_eq!(got[1], "svc::catalog::hash_catalog::{closure#0}");
        assert!(
            got[2].starts_with("core::iter::adapters::map::map_fold::{closure#0}<u64,"),
            "{}",
            got[2]
        );
        // Two closures of two functions in one file stay two.
        let other = [
            raw("{closure#0}", Some(catalog), true),
            raw(
                "call_once<svc::catalog::export::{closure_env#0}, ()>",
                Some("/rustc/5980/library/core/src/ops/function.rs"),
                true,
            ),
            raw("export", Some(catalog), false),
        ];
        assert_eq!(
            names(&other, Some("svc"))[0],
            "svc::catalog::export::{closure#0}"
        );
        // An env path of another crate, or another index, is not this closure's.
        let foreign = [
            raw("{closure#1}", Some(catalog), true),
            raw(
                "call_once<tokio::x::{closure_env#1}, svc::catalog::f::{closure_env#0}>",
                Some("/r/.cargo/registry/src/i-1/tokio-1.40.0/src/x.rs"),
                true,
            ),
            raw("run", Some("/w/svc/src/main.rs"), false),
        ];
        assert_eq!(names(&foreign, Some("svc"))[0], "svc::catalog::{closure#1}");
        // The unit's crate unknown (an incremental build): the env path of a crate no
        // dependency frame of the chain has, else a path within the unit's crate.
        let got = names(&frames, None);
        assert_eq!(got[1], "svc::catalog::hash_catalog::{closure#0}");
        assert!(got[2].starts_with("core::iter::adapters::map::map_fold::{closure#0}<"));
        assert_eq!(names(&foreign, None)[0], "<crate>::catalog::{closure#1}");
    }

    #[test]
    fn without_a_generic_caller_the_enclosing_function_is_the_one_in_its_file() {
        let catalog = "/w/svc/src/catalog.rs";
        // Inlined into an inlined function of its file, itself a closure's caller.
        let frames = [
            raw("{async_block#0}", Some(catalog), true),
            raw("{closure#0}", Some(catalog), true),
            raw("load", Some(catalog), true),
            raw("main", Some("/w/svc/src/main.rs"), false),
        ];
        assert_eq!(
            names(&frames, Some("svc")),
            [
                "svc::catalog::load::{closure#0}::{async_block#0}",
                "svc::catalog::load::{closure#0}",
                "svc::catalog::load",
                "main",
            ]
        );
        // Written in the out-of-line function: named once the symbol table names it.
        let direct = [
            raw("{closure#2}<u8>", Some(catalog), true),
            raw("import", Some(catalog), false),
        ];
        assert_eq!(
            chain(&direct, Some("svc"))[0],
            Named::InFunction {
                suffix: "{closure#2}<u8>".into(),
                fallback: "svc::catalog::{closure#2}<u8>".into()
            }
        );
        assert_eq!(
            without_generics("svc::f::{closure#0}<u8>"),
            "svc::f::{closure#0}"
        );
        assert_eq!(without_generics("<T as Tr>::m"), "<T as Tr>::m");
        assert_eq!(nesting("a<b<c, fn(u8) -> u8, "), 2);
    }
}
