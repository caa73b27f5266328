//! In-use memory (optional): which sampled allocations are still alive, so that a profile
//! can say which span's allocations the program still holds.
//!
//! A free must not cost a lookup, and the allocator hears of every free. So a sampled
//! object is placed where its free can be told by its address alone:
//!
//! ```text
//!  sampled allocation (tracking on)           any free / realloc
//!  size ≤ 64 KiB (align ≤ 4 KiB):             ptr − arena base < arena length?
//!    a cell of the arena, first fit in its      yes: the cell's state → free (one
//!    size class: state FREE → LIVE(gen + 1)       atomic), nothing else to find
//!  size > 64 KiB: the inner allocator's        size > 64 KiB and a large object is
//!    block, its pointer in a large slot         tracked: probe its 16 slots
//!  the sample carries (index, gen)            collector: an object is in use while its
//!                                               entry's state is LIVE with its gen
//! ```
//!
//! The arena is one anonymous mapping (`MAP_NORESERVE`: pages are backed only when a
//! cell on them is first used), reserved once by the setup and kept for the process's
//! life: a pointer into it may be freed at any time, after the profiler stops or in a
//! forked child. Its size classes are the powers of two from 16 B to 64 KiB, each with at
//! most [`MAX_CELLS`] cells and 4 MiB; a class with no free cell tries the next two
//! larger ones, and a sample that finds no room, or whose alignment is above a page, is
//! profiled but not tracked (counted). Cells are taken first fit, so the pages in use
//! follow the peak of tracked objects, not their churn.
//!
//! Each entry (cell or large slot) is one word, `generation << 1 | live`: taking it bumps
//! the generation, freeing it clears the bit. A sample names its entry and generation; the
//! collector counts it in use while the word still reads `(generation, live)`, and a
//! stale name (the cell freed and taken again) never matches. No allocation and no lock
//! anywhere: the allocator's paths are atomics on these words.

use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// The smallest cell.
const SMALLEST_CELL: usize = 16;
/// Size classes: 16 B, 32 B, ... 64 KiB.
const CLASSES: usize = 13;
/// The largest object a cell holds; larger tracked objects stay in the inner allocator,
/// their pointers in the large slots.
pub(crate) const CELL_MAX: usize = SMALLEST_CELL << (CLASSES - 1);
/// Cells a class has at most (and at most [`CLASS_BYTES`] of them).
pub(crate) const MAX_CELLS: usize = 512;
/// Bytes a class has at most.
const CLASS_BYTES: usize = 4 << 20;
/// The largest alignment a cell gives (the mapping's page alignment).
const CELL_MAX_ALIGN: usize = 4096;
/// How many larger classes a sample tries when its own has no free cell.
const SPILL_CLASSES: usize = 2;
/// Large objects (over [`CELL_MAX`]) tracked at once.
pub(crate) const LARGE_SLOTS: usize = 512;
/// Slots a large object may take, from its pointer's hash on: a free of a large object
/// probes at most this many.
const LARGE_PROBE: usize = 16;

const fn cell_size(class: usize) -> usize {
    SMALLEST_CELL << class
}

const fn cells(class: usize) -> usize {
    let by_bytes = CLASS_BYTES / cell_size(class);
    if by_bytes < MAX_CELLS {
        by_bytes
    } else {
        MAX_CELLS
    }
}

/// Where a class's cells start in the arena: the largest class first, so that every
/// region starts at a multiple of its cell size (the regions' sizes are falling powers
/// of two) and a cell is aligned to its size, up to the page.
const fn region_offset(class: usize) -> usize {
    let mut offset = 0;
    let mut larger = CLASSES;
    while larger > class + 1 {
        larger -= 1;
        offset += cells(larger) * cell_size(larger);
    }
    offset
}

/// The entry index of a class's first cell.
const fn first_entry(class: usize) -> usize {
    let mut index = 0;
    let mut smaller = 0;
    while smaller < class {
        index += cells(smaller);
        smaller += 1;
    }
    index
}

/// A size class's place in the arena and the entries.
#[derive(Clone, Copy)]
struct Class {
    /// Where its cells start in the arena.
    offset: usize,
    /// The entry of its first cell.
    first: usize,
    /// Its cells.
    cells: usize,
    /// Bytes a cell.
    size: usize,
}

/// Every class's geometry, computed once, at compile time (the allocator's paths read it).
const GEOMETRY: [Class; CLASSES] = {
    let mut out = [Class {
        offset: 0,
        first: 0,
        cells: 0,
        size: 0,
    }; CLASSES];
    let mut class = 0;
    while class < CLASSES {
        out[class] = Class {
            offset: region_offset(class),
            first: first_entry(class),
            cells: cells(class),
            size: cell_size(class),
        };
        class += 1;
    }
    out
};

/// Bytes of the arena (20 MiB less 8 KiB).
pub(crate) const ARENA_BYTES: usize = region_offset(0) + cells(0) * cell_size(0);
/// Entries of cells.
const CELL_ENTRIES: usize = first_entry(CLASSES);
/// Entries in all: the cells', then the large slots'.
pub(crate) const ENTRIES: usize = CELL_ENTRIES + LARGE_SLOTS;

/// The arena's base address; until one is mapped, an address no user pointer has (the
/// top of the address space), so that the range check is one load, a subtraction and a
/// comparison whether or not tracking was ever on.
static ARENA_BASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(UNSET_BASE);
/// [`ARENA_BASE`] until the arena is mapped.
const UNSET_BASE: usize = 0usize.wrapping_sub(ARENA_BYTES);
/// Large slots live now: frees of large objects look at the slots only when some are.
static LARGE_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Large slots live now whose object a `realloc` moved out of the slot's probe window:
/// while some are, a free not found in its window looks at every slot.
static LARGE_FAR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Whether new samples are tracked (set by a profiler started with tracking on).
static TRACKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Samples that could not be tracked (no free cell or slot, alignment over a page).
static UNTRACKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The entries' states, and the large slots' pointers.
pub(crate) struct Entries {
    states: [AtomicU64; ENTRIES],
    large: [AtomicUsize; LARGE_SLOTS],
    /// Whether a large slot's object is outside the slot's probe window (its holder's).
    far: [AtomicUsize; LARGE_SLOTS],
}

impl Entries {
    #[cfg(not(loom))]
    const fn new() -> Entries {
        Entries {
            states: [const { AtomicU64::new(0) }; ENTRIES],
            large: [const { AtomicUsize::new(0) }; LARGE_SLOTS],
            far: [const { AtomicUsize::new(0) }; LARGE_SLOTS],
        }
    }

    #[cfg(loom)]
    fn new() -> Entries {
        Entries {
            states: std::array::from_fn(|_| AtomicU64::new(0)),
            large: std::array::from_fn(|_| AtomicUsize::new(0)),
            far: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }
}

crate::sync::lazy_static_value! {
    /// 52 KiB of zeroed static memory (`.bss`): nothing to allocate, and untouched pages
    /// cost nothing while tracking is off.
    static ENTRIES_TABLE: Entries = Entries::new();
}

fn table() -> &'static Entries {
    &ENTRIES_TABLE
}

/// Bits of a [`Tracked`] naming the entry.
const INDEX_BITS: u32 = 13;
const _: () = assert!(ENTRIES < 1 << INDEX_BITS);

/// A tracked object, as its sample names it: its entry and the generation it took, in one
/// word (a sample record grows by that word alone). A generation keeps 51 bits: a cell
/// taken a million times a second would wrap them in 71 years.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Tracked(std::num::NonZeroU64);

impl Tracked {
    fn new(index: usize, generation: u64) -> Option<Tracked> {
        let word = generation << INDEX_BITS | index as u64;
        std::num::NonZeroU64::new(word).map(Tracked)
    }

    /// The entry.
    pub(crate) fn index(self) -> usize {
        (self.0.get() & ((1 << INDEX_BITS) - 1)) as usize
    }

    /// The generation the object took (its low 51 bits).
    pub(crate) fn generation(self) -> u64 {
        self.0.get() >> INDEX_BITS
    }
}

/// Takes the first free entry of `states`: its generation bumped, marked live. Returns
/// its position and the word it now holds.
pub(crate) fn take_first_free(states: &[AtomicU64]) -> Option<(usize, u64)> {
    for (i, state) in states.iter().enumerate() {
        let mut word = state.load(Ordering::Relaxed);
        while word & 1 == 0 {
            let taken = ((word >> 1) + 1) << 1 | 1;
            // Acquire: the last holder's use of the cell (its free's release) happens
            // before ours.
            match state.compare_exchange_weak(word, taken, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some((i, taken)),
                Err(now) => word = now,
            }
        }
    }
    None
}

/// Frees a taken entry. Its holder alone writes a live entry (a take needs the bit
/// clear), so a plain store does. Release: our use of the cell happens before the next
/// holder's.
pub(crate) fn release(state: &AtomicU64) {
    let word = state.load(Ordering::Relaxed);
    state.store(word & !1, Ordering::Release);
}

/// Whether the entry holding `state` still holds the object that took `generation` (its
/// low 51 bits, as a [`Tracked`] keeps it).
pub(crate) fn holds(state: &AtomicU64, generation: u64) -> bool {
    let word = state.load(Ordering::Relaxed);
    word & 1 == 1
        && (word >> 1) & (u64::MAX >> (INDEX_BITS + 1))
            == generation & (u64::MAX >> (INDEX_BITS + 1))
}

/// The size class serving `size` bytes at `align`, if a cell can.
fn class_of(size: usize, align: usize) -> Option<usize> {
    if align > CELL_MAX_ALIGN || size > CELL_MAX {
        return None;
    }
    let need = size.max(align).max(SMALLEST_CELL).next_power_of_two();
    Some(need.trailing_zeros() as usize - SMALLEST_CELL.trailing_zeros() as usize)
}

/// Whether new samples are tracked.
#[inline]
pub(crate) fn tracking() -> bool {
    TRACKING.load(Ordering::Relaxed)
}

/// Whether `ptr` is a cell of the arena: one load, a subtraction, a comparison.
#[inline(always)]
pub(crate) fn in_arena(ptr: *mut u8) -> bool {
    (ptr as usize).wrapping_sub(ARENA_BASE.load(Ordering::Relaxed)) < ARENA_BYTES
}

/// Whether some large object is tracked (frees over [`CELL_MAX`] then probe the slots).
#[inline(always)]
pub(crate) fn large_tracked() -> bool {
    LARGE_LIVE.load(Ordering::Relaxed) != 0
}

/// A cell for a sampled object of `size` bytes at `align`, when tracking is on and one is
/// free (zeroed if `zeroed`). `None`: the inner allocator serves it (objects over
/// [`CELL_MAX`] are tracked by [`track_large`] once it has).
pub(crate) fn take_cell(size: usize, align: usize, zeroed: bool) -> Option<(*mut u8, Tracked)> {
    if !tracking() || size > CELL_MAX {
        return None;
    }
    let Some(class) = class_of(size, align) else {
        UNTRACKED.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    // Acquire, and checked: seeing `TRACKING` set does not order this load after the
    // mapping's publication (a thread could still read the unset base just after
    // tracking first starts, and hand out an address at the top of the address space).
    let base = ARENA_BASE.load(Ordering::Acquire);
    if base == UNSET_BASE {
        return None;
    }
    let entries = &table().states;
    for class in &GEOMETRY[class..(class + 1 + SPILL_CLASSES).min(CLASSES)] {
        let Some(states) = entries.get(class.first..class.first + class.cells) else {
            continue;
        };
        if let Some((cell, word)) = take_first_free(states) {
            let ptr = (base + class.offset + cell * class.size) as *mut u8;
            if zeroed {
                // SAFETY: the cell is ours (taken above) and at least `size` bytes long.
                unsafe { std::ptr::write_bytes(ptr, 0, size) };
            }
            // The name is zero only for entry 0 at a generation whose kept 51 bits are all
            // zero (once in 2^51 takes): that take gives the cell back, untracked.
            if let Some(tracked) = Tracked::new(class.first + cell, word >> 1) {
                return Some((ptr, tracked));
            }
            release(&states[cell]);
        }
    }
    UNTRACKED.fetch_add(1, Ordering::Relaxed);
    None
}

/// The entry of the arena cell at `ptr` (which [`in_arena`] said is one), and the cell's
/// size.
fn cell_at(ptr: *mut u8) -> Option<(usize, usize)> {
    let offset = (ptr as usize).wrapping_sub(ARENA_BASE.load(Ordering::Relaxed));
    GEOMETRY.iter().find_map(|class| {
        let within = offset
            .checked_sub(class.offset)
            .filter(|&o| o < class.cells * class.size)?;
        Some((class.first + within / class.size, class.size))
    })
}

/// Frees the arena cell at `ptr`.
pub(crate) fn free_cell(ptr: *mut u8) {
    if let Some(state) = cell_at(ptr).and_then(|(entry, _)| table().states.get(entry)) {
        release(state);
    }
}

/// The bytes the arena cell at `ptr` holds.
pub(crate) fn cell_capacity(ptr: *mut u8) -> usize {
    cell_at(ptr).map_or(0, |(_, size)| size)
}

fn large_home(ptr: *mut u8) -> usize {
    // Blocks this large are page-aligned or nearly: the low bits say little.
    let key = (ptr as usize >> 4) as u64;
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % LARGE_SLOTS
}

/// Tracks a sampled object over [`CELL_MAX`] at `ptr` (the inner allocator's) in a large
/// slot. `None`: tracking is off, or its slots are all taken (counted).
pub(crate) fn track_large(ptr: *mut u8) -> Option<Tracked> {
    if !tracking() {
        return None;
    }
    let home = large_home(ptr);
    let table = table();
    for probe in 0..LARGE_PROBE {
        let slot = (home + probe) % LARGE_SLOTS;
        let state = &table.states[CELL_ENTRIES + slot];
        if let Some((_, word)) = take_first_free(std::slice::from_ref(state)) {
            table.large[slot].store(ptr as usize, Ordering::Relaxed);
            LARGE_LIVE.fetch_add(1, Ordering::Relaxed);
            return Tracked::new(CELL_ENTRIES + slot, word >> 1);
        }
    }
    UNTRACKED.fetch_add(1, Ordering::Relaxed);
    None
}

/// Tracks the sampled object of `size` bytes at `ptr` if it is over [`CELL_MAX`] (a
/// cell holds the others); see [`track_large`].
pub(crate) fn track_if_large(ptr: *mut u8, size: usize) -> Option<Tracked> {
    if size > CELL_MAX {
        track_large(ptr)
    } else {
        None
    }
}

/// The large slot tracking `ptr`, if one does: in its probe window, or (while some object
/// was moved out of its window) anywhere.
#[cold]
pub(crate) fn find_large(ptr: *mut u8) -> Option<usize> {
    let home = large_home(ptr);
    let table = table();
    let holds = |slot: &usize| {
        table.large[*slot].load(Ordering::Relaxed) == ptr as usize
            && table.states[CELL_ENTRIES + *slot].load(Ordering::Relaxed) & 1 == 1
    };
    (0..LARGE_PROBE)
        .map(|probe| (home + probe) % LARGE_SLOTS)
        .find(holds)
        .or_else(|| {
            (LARGE_FAR.load(Ordering::Relaxed) != 0)
                .then(|| (0..LARGE_SLOTS).find(holds))
                .flatten()
        })
}

/// What a large slot's pointer reads while its object is inside the inner allocator's
/// `realloc`: no block's address, so that a free of the old address (reused by then)
/// finds nothing here.
const MOVING: usize = usize::MAX;

/// The tracked large object in `slot` is being reallocated: until [`move_large`], its
/// slot matches no address (the inner allocator may free the old one before it returns).
pub(crate) fn moving_large(slot: usize) {
    table().large[slot].store(MOVING, Ordering::Relaxed);
}

/// The tracked large object in `slot` is at `ptr` (after a `realloc`: the new address, or
/// the old one if it failed). Only the slot's holder writes its pointer.
pub(crate) fn move_large(slot: usize, ptr: *mut u8) {
    let table = table();
    let far = (slot + LARGE_SLOTS - large_home(ptr)) % LARGE_SLOTS >= LARGE_PROBE;
    let was_far = table.far[slot].swap(usize::from(far), Ordering::Relaxed) != 0;
    match (was_far, far) {
        (false, true) => {
            LARGE_FAR.fetch_add(1, Ordering::Relaxed);
        }
        (true, false) => {
            LARGE_FAR.fetch_sub(1, Ordering::Relaxed);
        }
        _ => {}
    }
    table.large[slot].store(ptr as usize, Ordering::Relaxed);
}

/// Frees the large slot `slot` (its object freed).
pub(crate) fn release_large(slot: usize) {
    let table = table();
    table.large[slot].store(0, Ordering::Relaxed);
    if table.far[slot].swap(0, Ordering::Relaxed) != 0 {
        LARGE_FAR.fetch_sub(1, Ordering::Relaxed);
    }
    release(&table.states[CELL_ENTRIES + slot]);
    LARGE_LIVE.fetch_sub(1, Ordering::Relaxed);
}

/// Frees the large slot tracking `ptr`, if one does (a free over [`CELL_MAX`]).
#[cold]
#[inline(never)]
pub(crate) fn forget_large(ptr: *mut u8) {
    if let Some(slot) = find_large(ptr) {
        release_large(slot);
    }
}

/// Whether the object `tracked` names is still alive (the collector's question).
pub(crate) fn alive(tracked: Tracked) -> bool {
    table()
        .states
        .get(tracked.index())
        .is_some_and(|state| holds(state, tracked.generation()))
}

/// Starts (or stops) tracking new samples. Starting maps the arena, once, if our
/// allocator is installed; `Err`: the mapping failed (tracking stays off).
pub(crate) fn set_tracking(on: bool) -> std::io::Result<()> {
    if on && ARENA_BASE.load(Ordering::Acquire) == UNSET_BASE {
        map_arena()?;
    }
    TRACKING.store(on, Ordering::Relaxed);
    Ok(())
}

#[cfg(not(loom))]
fn map_arena() -> std::io::Result<()> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ARENA_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    if ARENA_BASE
        .compare_exchange(
            UNSET_BASE,
            base as usize,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another setup mapped one first.
        // SAFETY: ours, never published.
        unsafe { libc::munmap(base, ARENA_BYTES) };
    }
    Ok(())
}

#[cfg(loom)]
fn map_arena() -> std::io::Result<()> {
    Err(std::io::Error::other("no arena under loom"))
}

/// What in-use tracking holds now, for [`AllocationStats`](super::AllocationStats).
pub(crate) struct InuseStats {
    pub(crate) tracked: u64,
    pub(crate) untracked: u64,
    pub(crate) arena_bytes: u64,
}

pub(crate) fn stats() -> InuseStats {
    let mapped = ARENA_BASE.load(Ordering::Relaxed) != UNSET_BASE;
    InuseStats {
        tracked: if mapped {
            table()
                .states
                .iter()
                .filter(|s| s.load(Ordering::Relaxed) & 1 == 1)
                .count() as u64
        } else {
            0
        },
        untracked: UNTRACKED.load(Ordering::Relaxed),
        arena_bytes: if mapped { ARENA_BYTES as u64 } else { 0 },
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn classes_tile_the_arena_aligned_to_their_cells() {
        assert_eq!(ARENA_BYTES, (20 << 20) - 8 * 1024);
        assert_eq!(CELL_MAX, 64 * 1024);
        for class in 0..CLASSES {
            assert_eq!(region_offset(class) % cell_size(class).min(4096), 0);
            if class + 1 < CLASSES {
                assert_eq!(
                    region_offset(class),
                    region_offset(class + 1) + cells(class + 1) * cell_size(class + 1)
                );
            }
        }
        assert_eq!(CELL_ENTRIES, 10 * 512 + 256 + 128 + 64);
        assert_eq!(class_of(1, 1), Some(0));
        assert_eq!(class_of(17, 8), Some(1));
        assert_eq!(class_of(8, 64), Some(2));
        assert_eq!(class_of(CELL_MAX, 8), Some(CLASSES - 1));
        assert_eq!(class_of(CELL_MAX + 1, 8), None);
        assert_eq!(class_of(100, 8192), None);
    }

    /// A large object being reallocated names no address: a free of its old address (the
    /// inner allocator may have freed and handed it out again) must not find it.
    #[test]
    fn a_large_slot_follows_its_object_across_a_realloc() {
        set_tracking(true).expect("arena");
        let (old, new) = (
            0x7f00_dead_0000usize as *mut u8,
            0x7f00_beef_0000usize as *mut u8,
        );
        let tracked = track_large(old).expect("a slot");
        let slot = find_large(old).expect("tracked");
        assert_eq!(slot + CELL_ENTRIES, tracked.index());
        assert!(alive(tracked) && large_tracked());
        moving_large(slot);
        assert_eq!(find_large(old), None, "moving: the old address is not ours");
        // Moved out of the slot's probe window (the slot's home is the old address's):
        // found all the same, by the scan of every slot.
        move_large(slot, new);
        assert_eq!(find_large(new), Some(slot));
        assert_eq!(LARGE_FAR.load(Ordering::Relaxed), 1);
        forget_large(new);
        assert_eq!(find_large(new), None);
        assert_eq!(LARGE_FAR.load(Ordering::Relaxed), 0);
        assert!(!alive(tracked));
        // No arena pointer comes from an unset base.
        assert!(!in_arena(UNSET_BASE.wrapping_sub(1) as *mut u8));
        set_tracking(false).expect("off");
    }

    #[test]
    fn an_entry_is_taken_once_and_a_stale_name_never_matches() {
        let states: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        let (a, wa) = take_first_free(&states).expect("free");
        let (b, wb) = take_first_free(&states).expect("free");
        assert_eq!((a, b), (0, 1));
        assert!(holds(&states[0], wa >> 1) && holds(&states[1], wb >> 1));
        release(&states[0]);
        assert!(!holds(&states[0], wa >> 1));
        // Taken again: first fit, a new generation; the old name stays dead.
        let (again, wagain) = take_first_free(&states).expect("free");
        assert_eq!(again, 0);
        assert!(holds(&states[0], wagain >> 1) && !holds(&states[0], wa >> 1));
        assert!(take_first_free(&states).is_some());
        assert!(take_first_free(&states).is_none(), "all three taken");
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! loom model of the entries: two allocators racing for cells while their objects are
    //! freed and a collector asks which are alive. Each cell has one holder at a time (the
    //! cell's contents, a loom cell, would report two), and a name goes dead on its free.

    use super::*;
    use crate::sync::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    struct Cells {
        states: Vec<AtomicU64>,
        contents: Vec<UnsafeCell<u64>>,
    }

    fn cells(n: usize) -> Arc<Cells> {
        Arc::new(Cells {
            states: (0..n).map(|_| AtomicU64::new(0)).collect(),
            contents: (0..n).map(|_| UnsafeCell::new(0)).collect(),
        })
    }

    fn use_one(cells: &Cells, mark: u64) -> Option<(usize, u64)> {
        let (i, word) = take_first_free(&cells.states)?;
        // SAFETY: the cell is ours until released (what the model checks).
        cells.contents[i].with_mut(|p| unsafe { *p = mark });
        // SAFETY: as above.
        let read = cells.contents[i].with(|p| unsafe { *p });
        assert_eq!(read, mark, "another holder wrote our cell");
        Some((i, word >> 1))
    }

    #[test]
    fn loom_cells_have_one_holder_and_names_die_on_free() {
        loom::model(|| {
            let shared = cells(2);
            let other = shared.clone();
            let t = thread::spawn(move || {
                let (i, generation) = use_one(&other, 1).expect("two cells, two takers");
                release(&other.states[i]);
                // Free, or taken again since (a newer generation): the name is dead.
                assert!(!holds(&other.states[i], generation));
                let _ = use_one(&other, 3);
            });
            let (i, generation) = use_one(&shared, 2).expect("a free cell");
            assert!(holds(&shared.states[i], generation));
            release(&shared.states[i]);
            t.join().expect("taker");
        });
    }

    /// One cell, taken by each thread in turn (or found taken).
    fn take_in_turn(shared: Arc<Cells>) {
        let other = shared.clone();
        let t = thread::spawn(move || {
            if let Some((i, _)) = use_one(&other, 1) {
                release(&other.states[i]);
            }
        });
        if let Some((i, _)) = use_one(&shared, 2) {
            release(&shared.states[i]);
        }
        t.join().expect("taker");
    }

    #[test]
    fn loom_a_cell_passes_from_holder_to_holder() {
        loom::model(|| take_in_turn(cells(1)));
    }

    /// The broken variant: with the states relaxed, the next holder's write races the
    /// last one's: loom reports it.
    #[test]
    #[should_panic(expected = "Causality violation")]
    fn loom_cells_with_relaxed_states_race_on_the_contents() {
        crate::sync::check("in-use cells, broken", 3, || {
            let shared = cells(1);
            shared.states[0].stores_as_swaps_for_model();
            shared.states[0].relax_for_model();
            take_in_turn(shared);
        });
    }
}
