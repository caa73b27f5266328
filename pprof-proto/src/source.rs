//! What a function's source file (`Function.filename` in the profiles) says about whose
//! code it is. The bridge uses it to qualify bare debug-info names, the span report to
//! tell the user's code from dependencies: one reading of the paths for both.

/// The crate of a dependency's source file: under the Cargo registry
/// (`…/registry/src/<index>/<crate>-<version>/`), a git checkout
/// (`…/git/checkouts/<repo>-<hash>/<rev>/`) or the toolchain's library
/// (`/rustc/<hash>/library/<crate>/`, `…/rustlib/src/rust/library/<crate>/`, and its own
/// dependencies under `/rust/deps/<crate>-<version>/`); `None` for
/// any other file (the user's). `-` in crate names reads as `_`.
pub fn dependency_crate(file: &str) -> Option<String> {
    let file = file.replace('\\', "/");
    if let Some(rest) = after(&file, "/registry/src/") {
        return Some(versioned_crate(rest.split('/').nth(1)?));
    }
    // The toolchain library's own registry dependencies (hashbrown, …) as the Rust
    // distribution builds them: `/rust/deps/<crate>-<version>/`.
    if let Some(rest) = file.strip_prefix("/rust/deps/") {
        return Some(versioned_crate(rest.split('/').next()?));
    }
    if let Some(rest) = after(&file, "/git/checkouts/") {
        let dir = rest.split('/').next()?;
        let repo = dir.rsplit_once('-').map_or(dir, |(name, _)| name);
        return Some(repo.replace('-', "_"));
    }
    let library = if file.starts_with("/rustc/") {
        after(&file, "/library/")
    } else {
        after(&file, "/rustlib/src/rust/library/")
    };
    library
        .and_then(|rest| rest.split('/').next())
        .map(str::to_owned)
}

/// `tokio_util` of `tokio-util-0.7.11`.
fn versioned_crate(dir: &str) -> String {
    let name = match dir.rfind('-') {
        Some(at) if dir[at + 1..].starts_with(|c: char| c.is_ascii_digit()) => &dir[..at],
        _ => dir,
    };
    name.replace('-', "_")
}

fn after<'a>(file: &'a str, marker: &str) -> Option<&'a str> {
    file.find(marker).map(|at| &file[at + marker.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependency_paths_name_their_crate_and_other_paths_are_the_users() {
        let cases = [
            ("/rust/deps/hashbrown-0.16.1/src/raw/mod.rs", Some("hashbrown")),
            (
                "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/sha2-0.10.8/src/sha256/soft.rs",
                Some("sha2"),
            ),
            (
                "/home/u/.cargo/registry/src/index.crates.io-6f17d22bba15001f/tokio-util-0.7.11/src/codec.rs",
                Some("tokio_util"),
            ),
            (
                "/home/u/.cargo/git/checkouts/my-lib-3a9f1c2d/1b2c3d4/src/lib.rs",
                Some("my_lib"),
            ),
            (
                "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/num/mod.rs",
                Some("core"),
            ),
            (
                "/home/u/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/lib/rustlib/src/rust/library/std/src/thread/mod.rs",
                Some("std"),
            ),
            ("/work/svc/src/catalog.rs", None),
            ("/work/svc/src/library/mod.rs", None),
            ("src/main.rs", None),
            ("/work/library/src/lib.rs", None),
        ];
        for (file, krate) in cases {
            assert_eq!(dependency_crate(file).as_deref(), krate, "{file}");
        }
    }
}
