//! A file mapped read-only for one naming pass, and its symbol table kept compact.
//!
//! Debug info is read straight from the mapping, never copied. The mapping lives only as
//! long as one pass: dropping it (`munmap`) takes its pages out of the process's resident
//! set, which is what a container limit counts. [`Mapped::release`] does the same in the
//! middle of a long pass.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::FileId;

/// A whole file mapped read-only and private.
pub(super) struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
    /// The identity of the file actually mapped (it may differ from what was at the path
    /// when the object was listed).
    pub(super) id: FileId,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum MapError {
    #[error("cannot open or examine the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("the file is empty or too large to map")]
    Size,
}

impl Mapped {
    pub(super) fn open(path: &Path) -> Result<Mapped, MapError> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        let len = usize::try_from(meta.len()).map_err(|_| MapError::Size)?;
        if len == 0 {
            return Err(MapError::Size);
        }
        // SAFETY: a fresh read-only private mapping of an open file; nothing else aliases it.
        // The file being truncated while mapped would fault on access, the same risk any
        // reader of a mapped binary takes (the loader maps it too).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MapError::Io(std::io::Error::last_os_error()));
        }
        Ok(Mapped {
            ptr,
            len,
            id: FileId {
                dev: meta.dev(),
                ino: meta.ino(),
                size: meta.size(),
                mtime: (meta.mtime(), meta.mtime_nsec()),
            },
        })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until `self` is dropped.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Drops the pages read so far from the resident set; they are read again (from the
    /// page cache) if touched again. The contents never change: the mapping is read-only.
    pub(super) fn release(&self) {
        // SAFETY: advice on our own mapping; MADV_DONTNEED on a private read-only file
        // mapping only discards page table entries, later reads refault the same bytes.
        unsafe {
            libc::madvise(self.ptr, self.len, libc::MADV_DONTNEED);
        }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; no slice of it outlives `self`.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// A file's function symbols (`.symtab`, else `.dynsym`), as the fallback for addresses
/// that debug info does not name. Names stay in the file: an entry is 24 bytes.
pub(super) struct SymbolTable {
    /// Sorted by address.
    entries: Vec<SymbolEntry>,
}

struct SymbolEntry {
    address: u64,
    /// 0: unknown (it then spans up to the next symbol).
    size: u64,
    /// Offset and length of the name in the file.
    name_at: u32,
    name_len: u32,
}

impl SymbolTable {
    /// The symbols of `object`, parsed from `data`. The choice among symbols sharing an
    /// address and the sizes guessed for symbols without one are `object`'s symbol map's.
    pub(super) fn parse(object: &object::File<'_>, data: &[u8]) -> SymbolTable {
        use object::Object;
        let base = data.as_ptr() as usize;
        let entries = object
            .symbol_map()
            .symbols()
            .iter()
            .filter_map(|s| {
                let name = s.name();
                // Names are slices of the file's string table.
                let at = (name.as_ptr() as usize).checked_sub(base)?;
                if at + name.len() > data.len() {
                    return None;
                }
                Some(SymbolEntry {
                    address: s.address(),
                    size: s.size(),
                    name_at: u32::try_from(at).ok()?,
                    name_len: u32::try_from(name.len()).ok()?,
                })
            })
            .collect();
        SymbolTable { entries }
    }

    /// The symbol spanning `address` (nearest at or below it), read from `data`, the same
    /// file this table was parsed from.
    pub(super) fn containing<'a>(&self, address: u64, data: &'a [u8]) -> Option<&'a str> {
        let i = self.entries.partition_point(|s| s.address <= address);
        let s = self.entries[..i].last()?;
        if s.size != 0 && address.wrapping_sub(s.address) >= s.size {
            return None;
        }
        let at = s.name_at as usize;
        let bytes = data.get(at..at + s.name_len as usize)?;
        std::str::from_utf8(bytes).ok()
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<SymbolEntry>()
    }
}
