//! The loaded ELF objects of this process and their unwind tables, read from memory.
//!
//! `dl_iterate_phdr` lists every object the dynamic loader has mapped (the executable,
//! the vDSO, each shared library). Per object this keeps the executable `PT_LOAD` range
//! and copies `.eh_frame_hdr` (the `PT_GNU_EH_FRAME` segment) and `.eh_frame` (located
//! through the header's `eh_frame_ptr`; its length found by walking the CIE/FDE length
//! words). The copies are taken inside the `dl_iterate_phdr` callback, while the loader
//! lock keeps the object mapped, so a later `dlclose` can never leave the unwinder
//! reading unmapped memory. No file is read.
//!
//! The unwinder (`unwind/`) takes the tables; the symbolizer (`crate::symbolize`) only
//! the names and ranges, from [`list`].
//!
//! Never called from the signal handler: `dl_iterate_phdr` takes the loader lock and
//! this module allocates.

use std::cell::RefCell;
use std::ffi::CStr;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Held around each of the crate's `dl_iterate_phdr` calls, and by the forking thread
/// across `fork`. glibc resets the loader's other locks in a forked child but not the one
/// `dl_iterate_phdr` holds (`dl_load_write_lock`): a child forked while one of our threads
/// was listing objects (the symbolizer checks the load counts every interval) waited on
/// it forever at its own first listing (a test's child, 1 fork in ~15: a futex word in
/// `ld-linux`'s data). Other libraries' calls (C++ exceptions, backtraces) are theirs.
static LOADER_CALLS: Mutex<()> = Mutex::new(());

thread_local! {
    /// [`LOADER_CALLS`], held by the forking thread from `pthread_atfork`'s prepare
    /// handler until the parent and child handlers.
    static HELD_ACROSS_FORK: RefCell<Option<MutexGuard<'static, ()>>> =
        const { RefCell::new(None) };
}

/// Waits for the crate's own `dl_iterate_phdr` calls in progress and keeps others from
/// starting until [`after_fork`] (the prepare handler; after the unwinder's publisher,
/// the order a refresh takes them in).
pub(crate) fn before_fork() {
    let guard = LOADER_CALLS.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = HELD_ACROSS_FORK.try_with(|held| *held.borrow_mut() = Some(guard));
}

/// After `fork`, in the parent and in the child (its one thread is the one holding it).
pub(crate) fn after_fork() {
    let _ = HELD_ACROSS_FORK.try_with(|held| held.borrow_mut().take());
}

/// Runs `dl_iterate_phdr(callback, data)` holding [`LOADER_CALLS`].
///
/// # Safety
/// As `dl_iterate_phdr`'s: `callback` must be sound for every entry with `data`.
unsafe fn iterate_phdr(
    callback: unsafe extern "C" fn(
        *mut libc::dl_phdr_info,
        libc::size_t,
        *mut libc::c_void,
    ) -> libc::c_int,
    data: *mut libc::c_void,
) {
    let _calls = LOADER_CALLS.lock().unwrap_or_else(PoisonError::into_inner);
    // SAFETY: the caller's contract.
    unsafe { libc::dl_iterate_phdr(Some(callback), data) };
}

/// The loader's process-wide counts of objects loaded and unloaded so far
/// (`dlpi_adds`, `dlpi_subs`): a change means the set of objects changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoadGeneration {
    pub(crate) adds: u64,
    pub(crate) subs: u64,
}

/// One loaded object.
#[derive(Debug)]
pub(crate) struct LoadedObject {
    /// The loader's name: `""` for the main executable, `linux-vdso.so.1` for the vDSO,
    /// otherwise the path it was loaded from.
    pub(crate) name: String,
    /// Load bias (`dlpi_addr`): runtime address minus the address in the file.
    pub(crate) bias: u64,
    /// Runtime addresses spanned by its executable `PT_LOAD` segments.
    pub(crate) code: Range<u64>,
    pub(crate) tables: Tables,
    /// The GNU build id of the mapped image (its `PT_NOTE`, read from memory): what the
    /// symbolizer checks a file on disk against before naming from it.
    pub(crate) build_id: Option<Box<[u8]>>,
}

impl LoadedObject {
    /// Whether this is the mapping `(name, bias, code)` describes.
    pub(crate) fn same_mapping(&self, name: &str, bias: u64, code: &Range<u64>) -> bool {
        self.bias == bias && self.code == *code && self.name == name
    }
}

/// An object's unwind tables.
#[derive(Debug)]
pub(crate) enum Tables {
    /// Copied from memory.
    Copied(UnwindTables),
    /// Not copied: the caller already had them (see [`scan`]).
    Known,
    /// The object has no `PT_GNU_EH_FRAME` segment (or a malformed one).
    Missing,
}

/// Copies of an object's `.eh_frame_hdr` and `.eh_frame`, with their runtime addresses.
#[derive(Debug)]
pub(crate) struct UnwindTables {
    pub(crate) eh_frame_hdr_avma: u64,
    /// `None` when the header has no binary-search table (the compiler of unwind rules
    /// reads every entry of `.eh_frame` anyway).
    pub(crate) eh_frame_hdr: Option<Vec<u8>>,
    pub(crate) eh_frame_avma: u64,
    pub(crate) eh_frame: Vec<u8>,
}

/// The result of one pass over the loaded objects.
#[derive(Debug)]
pub(crate) struct Scan {
    pub(crate) objects: Vec<LoadedObject>,
    /// The load counts the listed set corresponds to (`None` if the loader does not
    /// report them).
    pub(crate) generation: Option<LoadGeneration>,
}

/// The loader's current load/unload counts; about 30 ns. `None` if the loader's
/// `dl_phdr_info` lacks them.
pub(crate) fn load_generation() -> Option<LoadGeneration> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid entry of `size` bytes; `data` is the
        // `Option<LoadGeneration>` below, alive for the whole `dl_iterate_phdr` call.
        unsafe {
            *(data as *mut Option<LoadGeneration>) = generation_of(&*info, size);
        }
        1 // the counts are process-wide: the first entry is enough
    }
    let mut generation: Option<LoadGeneration> = None;
    // SAFETY: the callback only writes through `data`, which points at `generation`.
    unsafe {
        iterate_phdr(
            first,
            &mut generation as *mut Option<LoadGeneration> as *mut libc::c_void,
        )
    };
    generation
}

fn generation_of(info: &libc::dl_phdr_info, size: usize) -> Option<LoadGeneration> {
    // The counters were appended to the struct; `size` tells whether this loader has them.
    let needed = std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
    (size >= needed).then_some(LoadGeneration {
        adds: info.dlpi_adds,
        subs: info.dlpi_subs,
    })
}

/// Lists the loaded objects without copying any unwind tables (each object's `tables` is
/// [`Tables::Known`]).
pub(crate) fn list() -> Scan {
    scan(&|_, _, _| true)
}

/// Lists the loaded objects and copies the unwind tables of those for which `known`
/// returns false (`known(name, bias, code range)`); the others get [`Tables::Known`].
pub(crate) fn scan(known: &dyn Fn(&str, u64, &Range<u64>) -> bool) -> Scan {
    struct Ctx<'a> {
        known: &'a dyn Fn(&str, u64, &Range<u64>) -> bool,
        scan: Scan,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Ctx` below, alive and exclusively ours for the whole
        // `dl_iterate_phdr` call; the loader passes a valid entry of `size` bytes.
        let (ctx, info) = unsafe { (&mut *(data as *mut Ctx<'_>), &*info) };
        if ctx.scan.objects.is_empty() {
            ctx.scan.generation = generation_of(info, size);
        }
        // SAFETY: called from the `dl_iterate_phdr` callback with the loader's entry,
        // so the object stays mapped while it is read.
        if let Some(object) = unsafe { read_object(info, ctx.known) } {
            ctx.scan.objects.push(object);
        }
        0
    }
    let mut ctx = Ctx {
        known,
        scan: Scan {
            objects: Vec::new(),
            generation: None,
        },
    };
    // SAFETY: the callback uses `data` only as the `Ctx` it points at.
    unsafe { iterate_phdr(each, &mut ctx as *mut Ctx<'_> as *mut libc::c_void) };
    ctx.scan
}

/// Reads one object's ranges and, unless `known`, copies its unwind tables. Objects
/// without executable code are skipped.
///
/// # Safety
/// Only inside a `dl_iterate_phdr` callback, with the `info` it was given.
unsafe fn read_object(
    info: &libc::dl_phdr_info,
    known: &dyn Fn(&str, u64, &Range<u64>) -> bool,
) -> Option<LoadedObject> {
    if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        return None;
    }
    // SAFETY: the loader's entry points at `dlpi_phnum` program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let bias = info.dlpi_addr;
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    // Readable segments (where the tables must lie) and the executable span.
    let mut readable: Vec<Range<u64>> = Vec::new();
    // Executable span, as (lowest start, highest end).
    let (mut code_start, mut code_end) = (u64::MAX, 0);
    let mut hdr = None;
    let mut notes: Vec<Range<u64>> = Vec::new();
    for ph in phdrs {
        let start = bias.wrapping_add(ph.p_vaddr);
        let Some(end) = start.checked_add(ph.p_memsz) else {
            continue;
        };
        if ph.p_type == libc::PT_LOAD {
            if ph.p_flags & libc::PF_R != 0 {
                readable.push(start..end);
            }
            if ph.p_flags & libc::PF_X != 0 {
                code_start = code_start.min(start);
                code_end = code_end.max(end);
            }
        } else if ph.p_type == libc::PT_GNU_EH_FRAME {
            hdr = Some(start..end);
        } else if ph.p_type == libc::PT_NOTE {
            notes.push(start..end);
        }
    }
    if code_start >= code_end {
        return None;
    }
    let code = code_start..code_end;
    let tables = if known(&name, bias, &code) {
        Tables::Known
    } else {
        // SAFETY: the ranges come from this object's program headers and the loader
        // keeps the object mapped during the callback.
        match hdr.and_then(|hdr| unsafe { copy_tables(hdr, &readable) }) {
            Some(tables) => Tables::Copied(tables),
            None => Tables::Missing,
        }
    };
    let build_id = notes.iter().find_map(|note| {
        segment_containing(&readable, note.start, note.end)?;
        let len = usize::try_from(note.end - note.start).ok()?;
        // SAFETY: inside a readable segment of the object (checked above), which the
        // loader keeps mapped during the callback.
        let bytes = unsafe { std::slice::from_raw_parts(note.start as *const u8, len) };
        gnu_build_id(bytes).map(Box::from)
    });
    Some(LoadedObject {
        name,
        bias,
        code,
        tables,
        build_id,
    })
}

/// The `NT_GNU_BUILD_ID` descriptor among the ELF notes in `notes` (native endian, 4-byte
/// aligned fields, as the loader maps them).
fn gnu_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let align = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let name_size = usize::try_from(word(notes, 0)?).ok()?;
        let desc_size = usize::try_from(word(notes, 4)?).ok()?;
        let kind = word(notes, 8)?;
        let desc_at = 12usize.checked_add(align(name_size)?)?;
        let next = desc_at.checked_add(align(desc_size)?)?;
        let name = notes.get(12..12usize.checked_add(name_size)?)?;
        let desc = notes.get(desc_at..desc_at.checked_add(desc_size)?)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc);
        }
        notes = notes.get(next..)?;
    }
    None
}

/// The readable segment that contains `[start, end)`.
fn segment_containing(readable: &[Range<u64>], start: u64, end: u64) -> Option<&Range<u64>> {
    readable
        .iter()
        .find(|seg| seg.start <= start && end <= seg.end && start <= end)
}

/// Copies `.eh_frame_hdr` (at `hdr`) and the `.eh_frame` it points at.
///
/// # Safety
/// Every range in `readable` must be mapped and readable for the duration of the call.
unsafe fn copy_tables(hdr: Range<u64>, readable: &[Range<u64>]) -> Option<UnwindTables> {
    segment_containing(readable, hdr.start, hdr.end)?;
    let hdr_len = usize::try_from(hdr.end - hdr.start).ok()?;
    // SAFETY: inside a readable segment (checked above).
    let hdr_bytes = unsafe { std::slice::from_raw_parts(hdr.start as *const u8, hdr_len) };
    let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr.start);
    let parsed = gimli::EhFrameHdr::new(hdr_bytes, gimli::LittleEndian)
        .parse(&bases, 8)
        .ok()?;
    let eh_frame_avma = match parsed.eh_frame_ptr() {
        gimli::Pointer::Direct(addr) => addr,
        gimli::Pointer::Indirect(_) => return None,
    };
    let has_table = parsed.table().is_some();
    let segment = segment_containing(readable, eh_frame_avma, eh_frame_avma)?;
    // SAFETY: `[eh_frame_avma, segment.end)` is inside a readable segment.
    let eh_frame_len = unsafe { eh_frame_length(eh_frame_avma, segment.end) };
    if eh_frame_len == 0 {
        return None;
    }
    // SAFETY: as above; `eh_frame_length` stays within `segment.end`.
    let eh_frame =
        unsafe { std::slice::from_raw_parts(eh_frame_avma as *const u8, eh_frame_len) }.to_vec();
    Some(UnwindTables {
        eh_frame_hdr_avma: hdr.start,
        eh_frame_hdr: has_table.then(|| hdr_bytes.to_vec()),
        eh_frame_avma,
        eh_frame,
    })
}

/// The length of the `.eh_frame` section starting at `start`: its CIE/FDE records up to
/// and including the zero terminator, or up to `limit`, whichever comes first.
///
/// # Safety
/// `[start, limit)` must be readable.
unsafe fn eh_frame_length(start: u64, limit: u64) -> usize {
    let read_u32 = |at: u64| {
        // SAFETY: callers check `at + 4 <= limit`.
        unsafe { std::ptr::read_unaligned(at as *const u32) }
    };
    let mut at = start;
    while at.checked_add(4).is_some_and(|end| end <= limit) {
        let length = read_u32(at);
        if length == 0 {
            at += 4; // keep the terminator
            break;
        }
        let next = if length == 0xffff_ffff {
            // 64-bit DWARF: the real length follows.
            if at.checked_add(12).is_none_or(|end| end > limit) {
                break;
            }
            let length = u64::from(read_u32(at + 4)) | (u64::from(read_u32(at + 8)) << 32);
            at.checked_add(12).and_then(|a| a.checked_add(length))
        } else {
            at.checked_add(4 + u64::from(length))
        };
        match next {
            Some(next) if next <= limit => at = next,
            _ => break, // a record that runs past the segment: stop before it
        }
    }
    (at - start) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn some_code() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn finds_the_executable_and_libc_with_unwind_tables() {
        let scan = scan(&|_, _, _| false);
        let this_fn = some_code as *const () as usize as u64;
        let exe = scan
            .objects
            .iter()
            .find(|o| o.code.contains(&this_fn))
            .expect("the object holding this test's code");
        assert_eq!(exe.name, "", "the main executable has an empty loader name");
        let libc_fn = libc::getpid as *const () as usize as u64;
        let libc = scan
            .objects
            .iter()
            .find(|o| o.code.contains(&libc_fn))
            .expect("the object holding getpid");
        assert!(libc.name.contains("libc"), "{}", libc.name);
        for object in [exe, libc] {
            let Tables::Copied(tables) = &object.tables else {
                panic!("{:?} has no unwind tables", object.name);
            };
            let hdr = tables.eh_frame_hdr.as_ref().expect("a search table");
            assert!(!hdr.is_empty() && hdr[0] == 1, "version 1 header");
            assert!(tables.eh_frame.len() > 1024, "{}", tables.eh_frame.len());
            // The walk ends on the zero terminator.
            assert_eq!(tables.eh_frame[tables.eh_frame.len() - 4..], [0, 0, 0, 0]);
            assert!(object.code.start >= object.bias);
        }
        assert!(scan
            .generation
            .is_some_and(|g| g.adds >= scan.objects.len() as u64));
        assert_eq!(load_generation(), scan.generation);
    }

    #[test]
    fn known_objects_are_not_copied() {
        let all = scan(&|_, _, _| false);
        let again =
            scan(&|name, bias, code| all.objects.iter().any(|o| o.same_mapping(name, bias, code)));
        assert_eq!(all.objects.len(), again.objects.len());
        assert!(again
            .objects
            .iter()
            .all(|o| matches!(o.tables, Tables::Known)));
    }

    #[test]
    fn eh_frame_length_follows_the_records() {
        // Two records (lengths 8 and 4) then the terminator, then junk.
        let bytes: [u8; 32] = [
            8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, // record 1
            4, 0, 0, 0, 9, 9, 9, 9, // record 2
            0, 0, 0, 0, // terminator
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        let start = bytes.as_ptr() as u64;
        // SAFETY: reads stay inside `bytes`.
        unsafe {
            assert_eq!(eh_frame_length(start, start + 32), 24);
            // No terminator before the limit: stops at the last whole record.
            assert_eq!(eh_frame_length(start, start + 22), 20);
            assert_eq!(eh_frame_length(start, start + 13), 12);
            assert_eq!(eh_frame_length(start, start + 3), 0);
        }
        // A record longer than the segment is not included.
        let long: [u8; 8] = [0xf0, 0, 0, 0, 1, 2, 3, 4];
        let start = long.as_ptr() as u64;
        // SAFETY: as above.
        assert_eq!(unsafe { eh_frame_length(start, start + 8) }, 0);
    }
}
