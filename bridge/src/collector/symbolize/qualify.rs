//! Module paths for the bare names debug info gives under `debug = "line-tables-only"`.
//!
//! That setting (the README's recommendation for release builds) keeps only
//! `DW_AT_name` on functions and inlined subroutines: `schedule`, `burn`, `{closure#0}`,
//! no crate and no module. A report of such names cannot tell the user's code from
//! tower's. So, for Rust compile units:
//!
//! * an **out-of-line** function (the last frame of an address) takes the symbol table's
//!   name for the address, which is the mangled full path (`svc::catalog::hash_catalog`),
//!   when the file has one (see `mod.rs`);
//! * an **inlined** frame, which has no symbol, becomes exactly `<crate>::<name>`: the
//!   crate from its line-table file when that is a dependency's (Cargo registry, git
//!   checkout, the toolchain's library: `sha2::schedule`), else from the compile unit's
//!   name (`src/main.rs/@/<crate>.<hash>-cgu.N`: `heldout_workload::burn`).
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
/// `<main source file>/@/<crate>.<hash>-cgu.<n>`.
pub(super) fn crate_of_unit(unit_name: &str) -> Option<&str> {
    let (_, codegen_unit) = unit_name.rsplit_once("/@/")?;
    let krate = codegen_unit.split('.').next()?;
    (!krate.is_empty()).then_some(krate)
}

/// An inlined frame's name: `<crate>::<name>` when `name` is bare and a crate is known
/// (its file's, else the unit's), else `name` as it is.
pub(super) fn inlined(name: &str, file: Option<&str>, unit_crate: Option<&str>) -> Option<String> {
    if !is_bare(name) {
        return None;
    }
    let krate = file
        .and_then(otel_profiling_pprof::source::dependency_crate)
        .or_else(|| unit_crate.map(str::to_owned))?;
    Some(format!("{krate}::{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_files_and_bare_names_give_the_crate() {
        assert_eq!(
            crate_of_unit("src/main.rs/@/heldout_workload.8f2a1c3b-cgu.0"),
            Some("heldout_workload")
        );
        assert_eq!(crate_of_unit("src/lib.rs"), None);
        let unit = Some("svc");
        let dep = "/r/.cargo/registry/src/i-1/sha2-0.10.8/src/sha256.rs";
        assert_eq!(
            inlined("schedule", Some(dep), unit).as_deref(),
            Some("sha2::schedule")
        );
        assert_eq!(
            inlined("burn", Some("/work/svc/src/main.rs"), unit).as_deref(),
            Some("svc::burn")
        );
        assert_eq!(
            inlined("{closure#0}", None, unit).as_deref(),
            Some("svc::{closure#0}")
        );
        assert_eq!(inlined("svc::already::qualified", None, unit), None);
        assert_eq!(
            inlined("fold<core::ops::range::Range<u64>, u64>", None, unit).as_deref(),
            Some("svc::fold<core::ops::range::Range<u64>, u64>")
        );
        assert_eq!(inlined("<T as Trait>::m", None, unit), None);
        assert_eq!(inlined("burn", None, None), None);
    }
}
