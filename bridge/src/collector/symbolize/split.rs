//! The files split debug info lives in: a binary built with `split-debuginfo = "packed"`
//! keeps its units' entries in a DWARF package beside it (`<binary>.dwp`), one built with
//! `"unpacked"` in one `.dwo` file per codegen unit, named by each skeleton unit. The
//! binary itself keeps only skeleton units: their address ranges and line programs.
//!
//! Files are mapped on first use within a naming pass and stay mapped until the next pass
//! (a service's hot code usually lives in few of them); at most [`KEEP_MAPPED`] stay
//! mapped between passes, and none keeps pages resident between passes. Unlike the binary
//! itself, no loader holds these files: a rebuild may rewrite one in place (same path,
//! same `.dwo` name), and a truncated mapping faults when read. So between passes a file
//! whose identity on disk changed (inode, size, modification time) is unmapped, and the
//! next pass maps it afresh (its DWO id then says whether it still belongs to the binary).

use std::cell::RefCell;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::mapped::Mapped;

/// How many split files stay mapped between passes (a binary of a few hundred crates has
/// thousands of `.dwo` files; mappings are cheap, but not free).
const KEEP_MAPPED: usize = 64;

/// The split files of one binary opened so far, by path; `None`: could not be mapped.
///
/// Only grows through `&self`, so a slice of a mapping handed out stays valid for as long
/// as that borrow of `self`: the mapped memory does not move when the list grows, and a
/// mapping is unmapped only through `&mut self` ([`SplitFiles::between_passes`]) or drop.
#[derive(Default)]
pub(super) struct SplitFiles {
    opened: RefCell<Vec<Opened>>,
}

/// One file: where, its mapping (`None`: could not be mapped) and its identity then.
type Opened = (PathBuf, Option<Mapped>, Option<Identity>);

/// What says a file on disk is still the one mapped.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

fn identity(path: &Path) -> Option<Identity> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Identity {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
    })
}

impl SplitFiles {
    /// The bytes of the file at `path`, mapped on first use.
    pub(super) fn bytes(&self, path: &Path) -> Option<&[u8]> {
        let mut opened = self.opened.borrow_mut();
        let at = match opened.iter().position(|(p, _, _)| p == path) {
            Some(at) => at,
            None => {
                // Identity before the mapping: a change in between shows next pass.
                let id = identity(path);
                opened.push((path.to_path_buf(), Mapped::open(path).ok(), id));
                opened.len() - 1
            }
        };
        let bytes = opened[at].1.as_ref()?.bytes();
        // SAFETY: `bytes` points into the mapping, not into the list: it stays where it is
        // when the list reallocates, and the mapping lives until its `Mapped` is dropped,
        // which needs `&mut self` (or `self` dropped) — so not while the returned borrow of
        // `self` lives.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) })
    }

    /// Counts `bytes` read from the file at `path` (already opened), dropping its pages
    /// from the resident set past the budget, as the binary's own mapping does.
    pub(super) fn touch(&self, path: &Path, bytes: u64) {
        if let Some((_, Some(mapped), _)) = self.opened.borrow().iter().find(|(p, _, _)| p == path)
        {
            mapped.touch(bytes);
        }
    }

    /// After a pass: no page stays resident, files changed on disk are unmapped, and beyond
    /// [`KEEP_MAPPED`] files the oldest are unmapped (all opened again when needed). Files
    /// that could not be mapped are tried again next pass (a `.dwp` written after the
    /// binary started).
    pub(super) fn between_passes(&mut self) {
        let opened = self.opened.get_mut();
        opened.retain(|(path, m, id)| m.is_some() && id.is_some() && identity(path) == *id);
        for (_, mapped, _) in opened.iter() {
            if let Some(mapped) = mapped {
                mapped.release();
            }
        }
        let excess = opened.len().saturating_sub(KEEP_MAPPED);
        opened.drain(..excess);
    }

    #[cfg(test)]
    pub(super) fn mapped(&self) -> usize {
        self.opened
            .borrow()
            .iter()
            .filter(|(_, m, _)| m.is_some())
            .count()
    }
}

/// Where a binary's DWARF package is: beside it, its name with `.dwp` appended (gdb's and
/// rustc's convention: `svc` → `svc.dwp`, `libsvc.so` → `libsvc.so.dwp`).
pub(super) fn package_path(binary: &Path) -> PathBuf {
    let mut path = binary.as_os_str().to_owned();
    path.push(".dwp");
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_valid_while_more_files_open() {
        let dir = std::env::temp_dir().join(format!("otel-profiling-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let paths: Vec<PathBuf> = (0..80)
            .map(|i| {
                let path = dir.join(format!("{i}.dwo"));
                std::fs::write(&path, format!("file {i}")).expect("write");
                path
            })
            .collect();
        let mut files = SplitFiles::default();
        let first = files.bytes(&paths[0]).expect("mapped");
        let rest: Vec<&[u8]> = paths[1..].iter().filter_map(|p| files.bytes(p)).collect();
        assert_eq!(
            first, b"file 0",
            "the first slice survives the list growing"
        );
        assert_eq!(rest.len(), 79);
        assert_eq!(rest[78], b"file 79");
        assert!(files.bytes(&dir.join("missing.dwo")).is_none());
        files.between_passes();
        assert_eq!(files.mapped(), KEEP_MAPPED);
        assert_eq!(files.bytes(&paths[79]).expect("still mapped"), b"file 79");
        assert_eq!(files.bytes(&paths[0]).expect("mapped again"), b"file 0");
        // Rewritten in place (a rebuild): the next pass maps what is there now.
        std::fs::write(&paths[0], "rebuilt, and longer").expect("rewrite");
        files.between_passes();
        assert_eq!(
            files.bytes(&paths[0]).expect("mapped afresh"),
            b"rebuilt, and longer"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_package_sits_beside_the_binary() {
        assert_eq!(
            package_path(Path::new("/srv/svc")),
            Path::new("/srv/svc.dwp")
        );
        assert_eq!(
            package_path(Path::new("/lib/libsvc.so")),
            Path::new("/lib/libsvc.so.dwp")
        );
    }
}
