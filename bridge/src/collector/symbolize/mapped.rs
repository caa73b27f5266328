//! A file mapped read-only, its resident pages kept within a budget, and its symbol table
//! kept compact.
//!
//! Debug info is read straight from the mapping, never copied. A file's pages count in the
//! process's resident set (what a container limit sees) once read, for as long as they
//! stay mapped: [`Mapped::touch`] drops them every [`RELEASE_EVERY`] bytes read, so at most
//! about that much of the file stays resident between passes (the units named last, which
//! the next pass often needs again) and within one.

use std::cell::Cell;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// About how many bytes of the file may be read before the pages read so far are dropped
/// from the resident set. Reading them again costs minor faults (the page cache keeps them).
pub(super) const RELEASE_EVERY: u64 = 2 << 20;

/// A whole file mapped read-only and private.
pub(super) struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
    /// Bytes read (an estimate the readers give) since the pages were last dropped.
    touched: Cell<u64>,
}

// SAFETY: the mapping is plain read-only memory owned by this value; moving it to another
// thread (the collector's state is built before its thread starts) moves that ownership.
unsafe impl Send for Mapped {}

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
            touched: Cell::new(0),
        })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until `self` is dropped.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Counts `bytes` more read from the mapping, and drops the pages read so far from the
    /// resident set once that passes [`RELEASE_EVERY`].
    pub(super) fn touch(&self, bytes: u64) {
        let touched = self.touched.get().saturating_add(bytes);
        if touched > RELEASE_EVERY {
            self.release();
        } else {
            self.touched.set(touched);
        }
    }

    /// Drops the pages read so far from the resident set; they are read again (from the
    /// page cache) if touched again. The contents never change: the mapping is read-only.
    pub(super) fn release(&self) {
        self.touched.set(0);
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
