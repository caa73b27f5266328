//! DWARF CFI stack unwinding in the signal handler, with framehop.
//!
//! ```text
//!  non-signal context (start, registration, collector)     SIGPROF handler (thread T)
//!  refresh(): dlpi_adds/subs changed?                      IN_FLIGHT += 1
//!    └─ scan loaded objects, copy new .eh_frame(_hdr)      s = CURRENT.load()
//!       clone unwinder, add/remove modules                 walk with s + T's own cache
//!       CURRENT.swap(new) ─► old goes to `retired`         IN_FLIGHT -= 1
//!       retired freed once IN_FLIGHT == 0 is seen
//! ```
//!
//! **Publication and retirement.** The unwinder and the sorted code ranges it knows form
//! one immutable [`Snapshot`], published through the `CURRENT` atomic pointer. The handler
//! increments `IN_FLIGHT` *before* loading `CURRENT` and decrements it after its last use
//! of the snapshot. A refresh swaps in the new snapshot and moves the old one to a
//! `retired` list; retired snapshots are freed by a later refresh (or the same one) that
//! observes `IN_FLIGHT == 0` after the swap. All four operations are `SeqCst`, so a zero
//! read after the swap means every handler that could have loaded an old pointer has
//! finished with it. The refresher never waits: if handlers are busy, retired snapshots
//! just live until the next refresh. The current snapshot is kept for the life of the
//! process (a stopped sampler's pending signals may still read it, and a restart reuses
//! it after a cheap check).
//!
//! **In the handler** nothing allocates, locks or touches thread-locals: framehop runs
//! with `MustNotAllocateDuringUnwind` and a per-thread cache made at registration; every
//! stack read goes through `StackReader` (aligned, inside `[sp, stack top)`); the depth
//! is capped at [`MAX_FRAMES`](crate::sampler::MAX_FRAMES); an address outside every
//! known object ends the walk (framehop would otherwise guess with frame pointers, which
//! release builds do not keep).
//!
//! **A thread's cache across snapshots.** framehop caches one unwind rule per slot
//! (`address % 509`) and trusts an entry whose address and "module generation" match the
//! unwinder's. That generation is a `u16` drawn from a process-wide counter which every
//! `Unwinder::new`, `add_module` and effective `remove_module` of any framehop unwinder in
//! the process advances, and which `clone` keeps. [`Snapshot::next`] clones the previous
//! unwinder and removes and adds modules, so a snapshot carries the counter's value at its
//! last module change. A cache filled under snapshot S would thus trust its entries again
//! under a later snapshot S' whenever the counter advanced by a multiple of 65,536 between
//! them: after 65,536 module changes by any framehop unwinder (here: a plugin `dlopen`ed
//! and `dlclose`d 32,768 times with a refresh between), for every slot not overwritten since (a thread that was off-CPU
//! across those refreshes keeps all of them). Such a rule describes code that was unmapped
//! or replaced: the walk would read the wrong stack words (still bounds-checked) and record
//! wrong frames. So every snapshot has a `u64` id that never repeats, a thread's cache
//! records the id it was filled under, and the first walk under another snapshot overwrites
//! every slot before using the cache ([`Snapshot::adopt`]). framehop has no call that
//! clears a cache, and making a new one (33 KB, boxed) is not possible in the handler; the
//! overwrite is one lookup per slot at an address in no module, for which framehop stores
//! its fallback rule without reading the stack or allocating.
//!
//! **Record format.** `frames[0]` is the interrupted pc; every later entry is a return
//! address exactly as found (it points after the call: symbolizers look up `addr - 1`).
//!
//! **Limits.** Frames of code without call-frame information end the walk: JIT code,
//! an object loaded since the last refresh (both counted as unknown pcs), a signal
//! trampoline (only met when SIGPROF interrupts another signal handler), and, with
//! `panic = "abort"`, the C `main` shim rustc emits without unwind tables (main-thread
//! stacks then end at `main`, marked truncated; `-C force-unwind-tables=yes` avoids it).
//! Measured on x86_64 (release): about 0.3 µs per warm walk of 13 frames, 30–40 µs for
//! the first walk of a thread (cold cache); framehop in an unoptimised dev build is about
//! ten times slower. A thread's first walk under a newly published snapshot also
//! overwrites its cache: 509 lookups, about 70 µs in an unoptimised build.
//!
//! **Layout.** This file is the architecture-independent part: publication, the walk and
//! its bounds checks, the thread caches. What differs per architecture (framehop's
//! unwinder, cache and register types, and where the signal context keeps the
//! registers) is in `x86_64.rs` and `aarch64.rs`, as framehop arranges its own; elsewhere
//! `unwind/unsupported.rs` stands in for this module.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};

use super::modules::{self, LoadGeneration, LoadedObject, Tables};
use super::ring::SampleRecord;
use super::stack::{Registers, StackBounds};

// Both are compiled on either architecture, so the other one's path is type-checked too.
mod aarch64;
mod x86_64;

/// The unwinder of the architecture we run on.
#[cfg(target_arch = "x86_64")]
type Native = x86_64::X86_64;
#[cfg(target_arch = "aarch64")]
type Native = aarch64::Aarch64;

#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::registers;
/// The interrupted registers in a `SA_SIGINFO` handler's context, as this architecture
/// lays it out.
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::registers;

/// What one architecture contributes: its framehop unwinder, cache and registers.
pub(crate) trait Arch {
    type Unwinder: Unwinder<Module = Module<Vec<u8>>, UnwindRegs = Self::Regs, Cache = Self::Cache>
        + Send
        + Sync;
    type Regs;
    type Cache: Send;
    fn new_unwinder() -> Self::Unwinder;
    fn new_cache() -> Self::Cache;
    /// Extra state derived from the known modules (the aarch64 pointer-auth mask).
    fn register_mask(unwinder: &Self::Unwinder) -> u64;
    fn regs(regs: &Registers, mask: u64) -> Self::Regs;
}

/// An immutable set of known objects: the unwinder plus what the handler checks.
pub(crate) struct Snapshot<A: Arch> {
    /// Never repeats, and is never [`NO_SNAPSHOT`]; tags the thread caches that walked
    /// with this snapshot (see [`Snapshot::adopt`]).
    id: u64,
    unwinder: A::Unwinder,
    /// Code ranges of the objects added to `unwinder`, sorted by start.
    code: Vec<Range<u64>>,
    /// The objects added to `unwinder`, for the next refresh's comparison.
    objects: Vec<KnownObject>,
    register_mask: u64,
}

struct KnownObject {
    name: String,
    bias: u64,
    code: Range<u64>,
    table_bytes: usize,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WalkEnd {
    /// The outermost frame was reached (its CFI marks the return address undefined).
    Complete,
    /// An address in no known object: that frame is kept and the walk stops.
    UnknownPc,
    /// A failed stack read, a CFI error, more than `MAX_FRAMES` frames, the interrupted
    /// `sp` off the thread's stack, or no unwinder yet.
    Truncated,
}

impl<A: Arch> Snapshot<A> {
    /// Builds the next snapshot from a scan, reusing `previous`'s modules for the objects
    /// it already had. `None` when the set of objects with unwind tables is unchanged.
    fn next(previous: Option<&Snapshot<A>>, scan: modules::Scan) -> Option<Snapshot<A>> {
        let had = |o: &LoadedObject| {
            previous.is_some_and(|p| {
                p.objects
                    .iter()
                    .any(|k| o.same_mapping(&k.name, k.bias, &k.code))
            })
        };
        let kept = scan
            .objects
            .iter()
            .filter(|o| matches!(o.tables, Tables::Known) && had(o))
            .count();
        let added = scan
            .objects
            .iter()
            .any(|o| matches!(o.tables, Tables::Copied(_)));
        let previous_len = previous.map_or(0, |p| p.objects.len());
        if previous.is_some() && !added && kept == previous_len {
            return None;
        }
        let mut unwinder = previous.map_or_else(A::new_unwinder, |p| p.unwinder.clone());
        let mut objects = Vec::with_capacity(scan.objects.len());
        if let Some(previous) = previous {
            for gone in previous.objects.iter().filter(|k| {
                !scan
                    .objects
                    .iter()
                    .any(|o| o.same_mapping(&k.name, k.bias, &k.code))
            }) {
                unwinder.remove_module(gone.code.start);
            }
        }
        for object in scan.objects {
            match object.tables {
                Tables::Known => {
                    if let Some(known) = previous.and_then(|p| {
                        p.objects
                            .iter()
                            .find(|k| object.same_mapping(&k.name, k.bias, &k.code))
                    }) {
                        objects.push(KnownObject {
                            name: object.name,
                            bias: object.bias,
                            code: object.code,
                            table_bytes: known.table_bytes,
                        });
                    }
                }
                Tables::Copied(tables) => {
                    let table_bytes = tables.len();
                    unwinder.add_module(module(&object.name, object.bias, &object.code, tables));
                    objects.push(KnownObject {
                        name: object.name,
                        bias: object.bias,
                        code: object.code,
                        table_bytes,
                    });
                }
                Tables::Missing => {}
            }
        }
        objects.sort_by_key(|k| k.code.start);
        let code = objects.iter().map(|k| k.code.clone()).collect();
        let register_mask = A::register_mask(&unwinder);
        Some(Snapshot {
            id: next_snapshot_id(),
            unwinder,
            code,
            objects,
            register_mask,
        })
    }

    /// Whether `addr` is in the code of a known object.
    #[inline]
    fn is_code(&self, addr: u64) -> bool {
        let i = self.code.partition_point(|r| r.start <= addr);
        // The last range starting at or below `addr` (none when `i` is 0).
        i.checked_sub(1)
            .and_then(|last| self.code.get(last))
            .is_some_and(|r| addr < r.end)
    }

    fn table_bytes(&self) -> usize {
        self.objects.iter().map(|k| k.table_bytes).sum()
    }

    /// Makes `cache` fit to unwind with this snapshot. A cache filled under another
    /// snapshot may hold rules tagged with this unwinder's module generation for code that
    /// has changed (see the module docs), so all its slots are overwritten first.
    /// Async-signal-safe.
    #[inline]
    fn adopt(&self, cache: &mut ThreadCache<A>) {
        if cache.filled_under != self.id {
            if cache.filled_under != NO_SNAPSHOT {
                self.overwrite_all_slots(cache);
            }
            cache.filled_under = self.id;
        }
    }

    /// Looks up [`RULE_CACHE_SLOTS`] consecutive addresses, one per slot, that are in no
    /// module: framehop stores its fallback rule for each, tagged with this unwinder's
    /// generation, without reading the stack (the callback refuses every read anyway) or
    /// allocating. Out of line: once per thread per published snapshot.
    #[cold]
    #[inline(never)]
    fn overwrite_all_slots(&self, cache: &mut ThreadCache<A>) {
        let nothing = Registers {
            pc: 0,
            sp: 0,
            fp: 0,
            #[cfg(target_arch = "aarch64")]
            lr: 0,
        };
        for address in FLUSH_FROM..=u64::MAX {
            let mut regs = A::regs(&nothing, self.register_mask);
            // The result is the frame-pointer rule's, from a zero fp: no frame.
            framehop_unwind_frame::<A>(
                &self.unwinder,
                FrameAddress::from_instruction_pointer(address),
                &mut regs,
                &mut cache.rules,
            );
        }
    }

    /// Unwinds from `regs` into `record` (entry 0, the pc, is already there).
    /// Async-signal-safe.
    #[inline]
    fn walk(
        &self,
        regs: &Registers,
        mut read: impl FnMut(u64) -> Result<u64, ()>,
        cache: &mut ThreadCache<A>,
        record: &mut SampleRecord,
    ) -> WalkEnd {
        if !self.is_code(regs.pc) {
            return WalkEnd::UnknownPc;
        }
        self.adopt(cache);
        let mut frames = self.unwinder.iter_frames(
            regs.pc,
            A::regs(regs, self.register_mask),
            &mut cache.rules,
            &mut read,
        );
        // The first item is the interrupted pc itself.
        if !matches!(framehop_next(&mut frames), Ok(Some(_))) {
            return WalkEnd::Truncated;
        }
        let mut depth = 1;
        let end = loop {
            match framehop_next(&mut frames) {
                Ok(Some(frame)) => {
                    // Past `MAX_FRAMES` there is no entry left: truncated.
                    let Some(entry) = record.frames.get_mut(depth) else {
                        break WalkEnd::Truncated;
                    };
                    *entry = frame.address();
                    depth += 1;
                    if !self.is_code(frame.address_for_lookup()) {
                        break WalkEnd::UnknownPc;
                    }
                }
                Ok(None) => break WalkEnd::Complete,
                Err(_) => break WalkEnd::Truncated,
            }
        };
        record.depth = depth as u16;
        end
    }
}

// framehop's two calls in the signal handler, each behind an abort-on-unwind boundary.
//
// framehop and gimli keep panic paths (indexing, `unwrap`, `unreachable!`) in their CFI
// lookup and evaluation that the optimiser cannot remove, so the handler's link-time
// proof (`handler::handle_signal`, feature `handler-no-panic-check`) cannot cover them.
// An `extern "C"` function cannot unwind: a panic inside one aborts the process at its
// boundary, as a panic anywhere in the handler did before (its entry is `extern "C"` too).
// So the proof covers everything the handler does around these two calls, including the
// walk's bookkeeping, and names exactly what it leaves out: these two functions. The
// stack reads framehop calls back (`StackReader::read`) carry their own proof.

/// framehop's next frame of a walk; `Err(())` for its errors. No unwinding crosses this
/// boundary (see above).
#[allow(improper_ctypes_definitions)] // Rust to Rust: the boundary is only for unwinding
#[inline(never)]
extern "C" fn framehop_next<U, F>(
    frames: &mut framehop::UnwindIterator<'_, '_, '_, U, F>,
) -> Result<Option<FrameAddress>, ()>
where
    U: Unwinder,
    F: FnMut(u64) -> Result<u64, ()>,
{
    frames.next().map_err(|_| ())
}

/// framehop's lookup of one address with a stack that reads nothing (the cache overwrite
/// of [`Snapshot::adopt`]); the result is not needed. No unwinding crosses this boundary.
#[allow(improper_ctypes_definitions)] // Rust to Rust: the boundary is only for unwinding
#[inline(never)]
extern "C" fn framehop_unwind_frame<A: Arch>(
    unwinder: &A::Unwinder,
    address: FrameAddress,
    regs: &mut A::Regs,
    cache: &mut A::Cache,
) {
    let _ = unwinder.unwind_frame(address, regs, cache, &mut |_| Err(()));
}

/// framehop's module for one object. Addresses in the file (SVMA) are runtime
/// addresses (AVMA) minus the load bias; `base_svma` is 0 for ELF.
fn module(
    name: &str,
    bias: u64,
    code: &Range<u64>,
    tables: modules::UnwindTables,
) -> Module<Vec<u8>> {
    let svma = |avma: u64, len: usize| avma - bias..avma - bias + len as u64;
    let hdr_len = tables.eh_frame_hdr.as_ref().map_or(0, Vec::len);
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(code.start - bias..code.end - bias),
        eh_frame_svma: Some(svma(tables.eh_frame_avma, tables.eh_frame.len())),
        eh_frame: Some(tables.eh_frame),
        eh_frame_hdr_svma: Some(svma(tables.eh_frame_hdr_avma, hdr_len)),
        eh_frame_hdr: tables.eh_frame_hdr,
        ..Default::default()
    };
    let name = if name.is_empty() { "[exe]" } else { name };
    Module::new(name.to_owned(), code.clone(), bias, info)
}

/// A thread's framehop cache (about 33 KB, allocated here, at registration).
pub(crate) struct UnwindCache(UnsafeCell<ThreadCache<Native>>);

impl UnwindCache {
    pub(crate) fn new() -> UnwindCache {
        UnwindCache(UnsafeCell::new(ThreadCache::new()))
    }
}

/// framehop's rule cache and the snapshot its rules were computed with.
struct ThreadCache<A: Arch> {
    rules: A::Cache,
    /// The [`Snapshot::id`] of the rules in `rules`; [`NO_SNAPSHOT`] while it holds none.
    filled_under: u64,
}

impl<A: Arch> ThreadCache<A> {
    fn new() -> ThreadCache<A> {
        ThreadCache {
            rules: A::new_cache(),
            filled_under: NO_SNAPSHOT,
        }
    }
}

/// No snapshot has this id: a cache filled under it is empty.
const NO_SNAPSHOT: u64 = 0;
/// The next [`Snapshot::id`]. A `u64` counting up from 1 does not wrap.
static SNAPSHOT_IDS: AtomicU64 = AtomicU64::new(NO_SNAPSHOT + 1);

fn next_snapshot_id() -> u64 {
    SNAPSHOT_IDS.fetch_add(1, Ordering::Relaxed)
}

/// framehop 0.16 keeps a cache's rules in this many slots, slot `address % 509` (the
/// private `CACHE_ENTRY_COUNT` of its `rule_cache.rs`); the test
/// `a_new_snapshot_replaces_every_cached_rule` fails if that changes.
const RULE_CACHE_SLOTS: u64 = 509;
/// The first of the [`RULE_CACHE_SLOTS`] consecutive addresses (one per slot) that
/// [`Snapshot::adopt`] looks up. They lie in the kernel's half of the address space on
/// x86_64 and aarch64, so in no loaded object and no module of any snapshot.
const FLUSH_FROM: u64 = u64::MAX - (RULE_CACHE_SLOTS - 1);

/// The published snapshot; owned by the publisher (a `Box` turned raw).
static CURRENT: AtomicPtr<Snapshot<Native>> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers between their `CURRENT` load and their last use of that snapshot.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Snapshots published since the process started.
static PUBLISHED: AtomicU64 = AtomicU64::new(0);

struct Publisher {
    /// Load counts when the objects were last listed.
    seen: Option<LoadGeneration>,
    /// Replaced snapshots a handler may still be reading.
    retired: Vec<Retired>,
}

/// A snapshot no longer reachable through `CURRENT`, kept as the raw pointer handlers
/// may still read through; freed on drop.
struct Retired(*mut Snapshot<Native>);

// SAFETY: the snapshot is `Send + Sync` data; the pointer is only freed by its owner.
unsafe impl Send for Retired {}

impl Drop for Retired {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::into_raw` and is dropped only by
        // `Publisher::collect`, after no handler can hold it any more.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

impl Publisher {
    /// Frees the retired snapshots if no handler is inside a walk now.
    fn collect(&mut self) {
        if !self.retired.is_empty() && IN_FLIGHT.load(Ordering::SeqCst) == 0 {
            self.retired.clear();
        }
    }
}

static PUBLISHER: Mutex<Publisher> = Mutex::new(Publisher {
    seen: None,
    retired: Vec::new(),
});

/// How long a refresh may wait for another one in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// Wait up to this long (then skip: the caller goes on with the current snapshot).
    Upto(Duration),
}

/// Brings the published unwinder up to date with the loaded objects. Cheap (one
/// `dl_iterate_phdr` step) when nothing was loaded or unloaded since the last call.
/// Returns whether a new snapshot was published. Never call it from the signal handler.
pub(crate) fn refresh(wait: Wait) -> bool {
    let mut publisher = match PUBLISHER.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => match wait {
            Wait::Upto(limit) => {
                // A bounded wait rather than `lock()`: in a child forked while another
                // thread held the lock, it is never released.
                let deadline = Instant::now() + limit;
                loop {
                    std::thread::sleep(Duration::from_micros(200));
                    match PUBLISHER.try_lock() {
                        Ok(guard) => break guard,
                        Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                        Err(TryLockError::WouldBlock) if Instant::now() < deadline => {}
                        Err(TryLockError::WouldBlock) => return false,
                    }
                }
            }
        },
    };
    publisher.collect();
    let current = CURRENT.load(Ordering::SeqCst);
    let generation = modules::load_generation();
    if !current.is_null() && generation.is_some() && generation == publisher.seen {
        return false;
    }
    // SAFETY: only the publisher (whose lock we hold) replaces or frees `CURRENT`.
    let previous = unsafe { current.as_ref() };
    let scan = modules::scan(&|name, bias, code| {
        previous.is_some_and(|p| {
            p.objects
                .iter()
                .any(|k| k.bias == bias && k.code == *code && k.name == name)
        })
    });
    publisher.seen = scan.generation;
    let Some(next) = Snapshot::next(previous, scan) else {
        return false;
    };
    publish(&mut publisher, next);
    true
}

/// Makes `next` the snapshot handlers load; retires the previous one.
fn publish(publisher: &mut Publisher, next: Snapshot<Native>) {
    let old = CURRENT.swap(Box::into_raw(Box::new(next)), Ordering::SeqCst);
    if !old.is_null() {
        // Handlers that loaded it before the swap may still be reading it.
        publisher.retired.push(Retired(old));
    }
    publisher.collect();
    PUBLISHED.fetch_add(1, Ordering::Relaxed);
}

/// Known objects and copied unwind-table bytes of the published unwinder, and how
/// many unwinders were published so far. Takes no lock: it holds the snapshot the way a
/// handler does.
pub(crate) fn published_stats() -> (usize, usize, u64) {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    // SAFETY: as in `walk`: not freed before the decrement below.
    let current = unsafe { CURRENT.load(Ordering::SeqCst).as_ref() };
    let stats = (
        current.map_or(0, |s| s.objects.len()),
        current.map_or(0, Snapshot::table_bytes),
        PUBLISHED.load(Ordering::Relaxed),
    );
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    stats
}

thread_local! {
    /// The publisher lock, held by the forking thread from `pthread_atfork`'s prepare
    /// handler until the parent and child handlers (all three run on that thread).
    static HELD_ACROSS_FORK: std::cell::RefCell<Option<std::sync::MutexGuard<'static, Publisher>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before `fork`: waits for a refresh in progress and holds the publisher across the
/// fork, so the child's copy of it is consistent and unlocked (a `Mutex` held by another
/// thread at `fork` stays locked forever in the child: it would never refresh again).
pub(crate) fn before_fork() {
    let guard = PUBLISHER.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = HELD_ACROSS_FORK.try_with(|held| *held.borrow_mut() = Some(guard));
}

/// After `fork`, in the parent: lets go of the publisher.
pub(crate) fn after_fork_in_parent() {
    let _ = HELD_ACROSS_FORK.try_with(|held| held.borrow_mut().take());
}

/// In a forked child only the forking thread exists, and it is not in a handler.
pub(crate) fn after_fork_in_child() {
    IN_FLIGHT.store(0, Ordering::Relaxed);
    let _ = HELD_ACROSS_FORK.try_with(|held| held.borrow_mut().take());
}

/// Holds the publisher for `d`, as a slow refresh would (tests).
#[cfg(test)]
pub(crate) fn hold_publisher_for_test(d: Duration) {
    let _guard = PUBLISHER.lock().unwrap_or_else(PoisonError::into_inner);
    std::thread::sleep(d);
}

/// Whether the publisher is free (tests: a forked child must be able to refresh).
#[cfg(test)]
pub(crate) fn publisher_is_free() -> bool {
    PUBLISHER.try_lock().is_ok()
}

/// Fills `record` with the stack of the interrupted thread: `frames[0] = regs.pc`, then
/// return addresses, innermost first; sets `depth` and `truncated`. Async-signal-safe.
///
/// # Safety
/// Only from the `SIGPROF` handler of the thread that owns `cache` and whose stack
/// `stack` describes; the handler must not nest (SIGPROF is blocked while it runs).
///
/// Never inlined: on a cache miss framehop's CFI evaluation keeps several KB of
/// temporaries, which must live in this frame (entered only after the handler checked the
/// stack headroom), not in the handler's own.
#[inline(never)]
pub(crate) unsafe fn walk(
    regs: &Registers,
    stack: StackBounds,
    cache: &UnwindCache,
    record: &mut SampleRecord,
) -> WalkEnd {
    record.frames[0] = regs.pc;
    record.depth = 1;
    let end = match stack.reader_from(regs.sp) {
        // Off its stack (an alternate signal stack, say): no stack word may be read.
        None => WalkEnd::Truncated,
        Some(reader) => {
            IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
            let snapshot = CURRENT.load(Ordering::SeqCst);
            // SAFETY: a snapshot loaded after the increment is freed only after a
            // refresher sees IN_FLIGHT back at zero, which needs our decrement below.
            let end = match unsafe { snapshot.as_ref() } {
                None => WalkEnd::Truncated,
                Some(snapshot) => {
                    // SAFETY: the caller guarantees this thread's handler is the cache's
                    // only user and does not nest, so this is the only reference to it.
                    let cache = unsafe { &mut *cache.0.get() };
                    snapshot.walk(regs, |addr| reader.read(addr), cache, record)
                }
            };
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            end
        }
    };
    record.truncated = end != WalkEnd::Complete;
    end
}

/// A framehop cache owned by one ordinary thread (the blocked-thread watchdog), for
/// [`walk_copy`].
pub(crate) struct OwnedCache(Box<ThreadCache<Native>>);

impl OwnedCache {
    pub(crate) fn new() -> OwnedCache {
        OwnedCache(Box::new(ThreadCache::new()))
    }
}

/// Fills `record` like [`walk`], from another thread's registers and a copy of its stack:
/// `copy` holds the bytes that were at `[regs.sp, regs.sp + copy.len())`. Every read
/// is served from the copy, so nothing of the other thread is touched. Not for signal
/// handlers (it holds `IN_FLIGHT` like one, so a refresh never frees the snapshot under
/// it).
pub(crate) fn walk_copy(
    regs: &Registers,
    copy: &[u8],
    cache: &mut OwnedCache,
    record: &mut SampleRecord,
) -> WalkEnd {
    record.frames[0] = regs.pc;
    record.depth = 1;
    let base = regs.sp;
    let read = |addr: u64| -> Result<u64, ()> {
        if !addr.is_multiple_of(8) {
            return Err(());
        }
        let at = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
        let word = copy.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_ne_bytes(word.try_into().map_err(|_| ())?))
    };
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let snapshot = CURRENT.load(Ordering::SeqCst);
    // SAFETY: as in `walk`: loaded after the increment, freed only once IN_FLIGHT is
    // seen at zero after it was retired.
    let end = match unsafe { snapshot.as_ref() } {
        None => WalkEnd::Truncated,
        Some(snapshot) => snapshot.walk(regs, read, &mut cache.0, record),
    };
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    record.truncated = end != WalkEnd::Complete;
    end
}

/// Whether `addr` lies in code the published unwinder knows (tests; the watchdog's
/// frame-pointer guess).
pub(crate) fn is_known_code(addr: u64) -> bool {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let snapshot = CURRENT.load(Ordering::SeqCst);
    // SAFETY: as in `walk_copy`.
    let known = unsafe { snapshot.as_ref() }.is_some_and(|s| s.is_code(addr));
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    known
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::PoisonError;

    pub(super) fn build<A: Arch>() -> Snapshot<A> {
        Snapshot::<A>::next(None, modules::scan(&|_, _, _| false)).expect("objects")
    }

    #[test]
    fn code_ranges_are_searched_exactly() {
        let snapshot = build::<Native>();
        assert!(snapshot.code.windows(2).all(|w| w[0].end <= w[1].start));
        for range in &snapshot.code {
            assert!(snapshot.is_code(range.start));
            assert!(snapshot.is_code(range.end - 1));
            assert!(
                !snapshot.is_code(range.end) || snapshot.code.iter().any(|r| r.start == range.end)
            );
        }
        assert!(!snapshot.is_code(0));
        assert!(!snapshot.is_code(u64::MAX));
        assert!(snapshot.is_code(build::<Native> as *const () as usize as u64));
        assert!(
            snapshot.table_bytes() > 100_000,
            "{}",
            snapshot.table_bytes()
        );
    }

    #[test]
    fn an_unchanged_process_gives_no_new_snapshot() {
        let first = build::<Native>();
        let scan = modules::scan(&|name, bias, code| {
            first
                .objects
                .iter()
                .any(|k| k.bias == bias && k.code == *code && k.name == name)
        });
        assert!(Snapshot::next(Some(&first), scan).is_none());
        // An object that vanished is noticed.
        let scan = modules::scan(&|_, _, _| true);
        let mut fewer = build::<Native>();
        fewer.objects.push(KnownObject {
            name: "gone.so".into(),
            bias: 1 << 40,
            code: (1 << 40)..(1 << 40) + 4096,
            table_bytes: 0,
        });
        let next = Snapshot::next(Some(&fewer), scan).expect("a removal is a change");
        assert!(!next.objects.iter().any(|k| k.name == "gone.so"));
        assert_eq!(next.objects.len(), first.objects.len());
    }

    /// State for the `SIGUSR1` handler below (one test thread raises it on itself).
    struct Probe {
        stack: StackBounds,
        cache: UnwindCache,
        record: UnsafeCell<SampleRecord>,
        end: UnsafeCell<Option<WalkEnd>>,
        nanos: AtomicU64,
    }

    static PROBE: AtomicPtr<Probe> = AtomicPtr::new(std::ptr::null_mut());

    // clock_gettime: async-signal-safe, so the handler-side probe may read it.
    use crate::clock::monotonic_ns;

    extern "C" fn on_sigusr1(_: libc::c_int, _: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
        // SAFETY: the test keeps the probe alive while it raises the signal.
        let Some(probe) = (unsafe { PROBE.load(Ordering::SeqCst).as_ref() }) else {
            return;
        };
        let start = monotonic_ns();
        // SAFETY: the kernel's context argument; the probe belongs to the raising thread
        // and this handler does not nest; `record`/`end` are read only after `raise`.
        unsafe {
            let regs = Registers::from_ucontext(ucontext).expect("registers");
            let end = walk(&regs, probe.stack, &probe.cache, &mut *probe.record.get());
            *probe.end.get() = Some(end);
        }
        probe
            .nanos
            .fetch_add(monotonic_ns() - start, Ordering::Relaxed);
    }

    #[inline(never)]
    fn raise_from_level_2(n: usize) -> Vec<(Vec<u64>, Option<WalkEnd>, u64)> {
        // SAFETY: reading our own probe after each synchronous `raise` returned.
        let probe = unsafe { &*PROBE.load(Ordering::SeqCst) };
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            probe.nanos.store(0, Ordering::Relaxed);
            // SAFETY: raising a signal whose handler is installed; delivered before return.
            assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
            // SAFETY: the handler has returned; nothing else touches the probe.
            let (record, end) = unsafe { (&*probe.record.get(), *probe.end.get()) };
            out.push((
                record.frames().to_vec(),
                end,
                probe.nanos.load(Ordering::Relaxed),
            ));
        }
        std::hint::black_box(out)
    }

    #[inline(never)]
    fn raise_from_level_1(n: usize) -> Vec<(Vec<u64>, Option<WalkEnd>, u64)> {
        std::hint::black_box(raise_from_level_2(n))
    }

    fn function_of(addr: u64) -> String {
        let mut name = String::new();
        backtrace::resolve(addr as *mut std::ffi::c_void, |symbol| {
            if name.is_empty() {
                name = symbol.name().map(|n| n.to_string()).unwrap_or_default();
            }
        });
        name
    }

    /// A walk from a real signal frame (the handler interrupts `raise` in libc) reaches
    /// the callers and ends cleanly; prints the time per walk, cold and warm cache.
    #[test]
    #[inline(never)] // keep its own frame in release builds (checked below)
    fn walks_from_a_signal_handler() {
        refresh(Wait::Upto(Duration::from_secs(5)));
        let probe = Box::new(Probe {
            stack: StackBounds::current().expect("stack"),
            cache: UnwindCache::new(),
            record: UnsafeCell::new(SampleRecord::EMPTY),
            end: UnsafeCell::new(None),
            nanos: AtomicU64::new(0),
        });
        PROBE.store(&*probe as *const Probe as *mut Probe, Ordering::SeqCst);
        // SAFETY: installing an SA_SIGINFO handler for a signal no other test uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigusr1
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
                0
            );
        }
        let walks = raise_from_level_1(200);
        PROBE.store(std::ptr::null_mut(), Ordering::SeqCst);
        drop(probe);
        let (frames, end, cold_ns) = &walks[0];
        let names: Vec<String> = frames
            .iter()
            .enumerate()
            .map(|(i, &a)| function_of(if i == 0 { a } else { a - 1 }))
            .collect();
        let position = |needle: &str| names.iter().position(|n| n.contains(needle));
        let (l2, l1, test) = (
            position("raise_from_level_2"),
            position("raise_from_level_1"),
            position("walks_from_a_signal_handler"),
        );
        assert!(
            l2.is_some() && l2 < l1 && l1 < test,
            "callers in order: {names:#?}"
        );
        assert_eq!(*end, Some(WalkEnd::Complete), "{names:#?}");
        assert!(walks.iter().all(|w| w.0 == *frames && w.1 == *end));
        let mut warm: Vec<u64> = walks[1..].iter().map(|w| w.2).collect();
        warm.sort_unstable();
        eprintln!(
            "walk from a signal handler: depth {}, cold {:.1} us, warm median {:.2} us (p90 {:.2} us)",
            frames.len(),
            *cold_ns as f64 / 1e3,
            warm[warm.len() / 2] as f64 / 1e3,
            warm[warm.len() * 9 / 10] as f64 / 1e3,
        );
    }

    /// Readers that hold snapshots the way handlers do, while snapshots are replaced
    /// as fast as they can be built: no reader ever sees a freed one, and the retired
    /// ones are freed once no reader is inside.
    #[test]
    fn replaced_snapshots_outlive_their_readers() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;

        refresh(Wait::Upto(Duration::from_secs(5)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let probe = Snapshot::<Native>::is_code as *const () as usize as u64;
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
                        // SAFETY: held like a handler holds it, until the decrement.
                        let snapshot = unsafe { &*CURRENT.load(Ordering::SeqCst) };
                        for _ in 0..100 {
                            assert!(snapshot.is_code(probe));
                            assert!(snapshot.code.windows(2).all(|w| w[0].end <= w[1].start));
                            assert_eq!(snapshot.code.len(), snapshot.objects.len());
                        }
                        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let mut retired_seen = 0;
        for _ in 0..50 {
            let next = build::<Native>();
            let mut publisher = PUBLISHER.lock().unwrap_or_else(PoisonError::into_inner);
            publish(&mut publisher, next);
            retired_seen = retired_seen.max(publisher.retired.len());
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|r| r.join().expect("reader")).sum();
        // With the readers gone (and no signal handler inside a walk), the next look
        // frees everything retired.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut publisher = PUBLISHER.lock().unwrap_or_else(PoisonError::into_inner);
            publisher.collect();
            if publisher.retired.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "retired snapshots never freed");
            drop(publisher);
            std::thread::sleep(Duration::from_millis(1));
        }
        eprintln!("{reads} reads across 50 replacements; at most {retired_seen} retired at once");
        assert!(reads > 0);
    }

    /// A function whose first instruction the wrap test below unwinds from.
    #[inline(never)]
    fn an_entry_point() -> u64 {
        std::hint::black_box(3)
    }

    /// framehop tags cached rules with a `u16` module generation drawn from a
    /// process-wide counter. Once that counter has gone round, an unwinder with other
    /// modules can carry the generation a thread's cache was filled under: its cached
    /// rules must not be used for the new snapshot.
    #[test]
    fn a_wrapped_module_generation_does_not_revive_stale_rules() {
        // Where the two rules for `an_entry_point`'s first instruction find the return
        // address: its CFI says `[sp]` (or `lr` on aarch64); the frame-pointer rule that
        // framehop uses for addresses in no module says `[fp + 8]`.
        const BY_CFI: u64 = 0x1111_1110;
        const BY_FP: u64 = 0x2222_2220;
        let pc = an_entry_point as *const () as usize as u64;
        let words: [u64; 8] = [BY_CFI, 0, 0, 0, 0, BY_FP, 0, 0];
        let base = words.as_ptr() as u64;
        let bounds = StackBounds {
            lo: base,
            hi: base + 64,
        };
        let regs = Registers {
            pc,
            sp: base,
            fp: base + 32,
            #[cfg(target_arch = "aarch64")]
            lr: BY_CFI,
        };
        let walk = |snapshot: &Snapshot<Native>, cache: &mut ThreadCache<Native>| {
            let mut record = SampleRecord::EMPTY;
            record.frames[0] = pc;
            record.depth = 1;
            let reader = bounds.reader_from(base).expect("sp in bounds");
            snapshot.walk(&regs, |addr| reader.read(addr), cache, &mut record);
            record.frames().to_vec()
        };

        // Snapshot `a` knows this binary; a thread's cache learns `pc`'s rule from it.
        let a = build::<Native>();
        assert!(a.is_code(pc));
        let mut thread_cache = ThreadCache::new();
        assert_eq!(walk(&a, &mut thread_cache), [pc, BY_CFI]);

        // Make unwinders until one has `a`'s generation (a full wrap of the counter). A second cache tells: an address looked up under `a` hits only for
        // an unwinder with `a`'s generation. Other tests make unwinders meanwhile, so a
        // wrap may step over it; then the next wrap is tried.
        let probe_at = FrameAddress::from_instruction_pointer(u64::MAX - 4096);
        let no_regs = Registers {
            pc: 0,
            sp: 0,
            fp: 0,
            #[cfg(target_arch = "aarch64")]
            lr: 0,
        };
        let mut probe = Native::new_cache();
        let look_up = |unwinder: &<Native as Arch>::Unwinder, probe: &mut _| {
            let mut regs = Native::regs(&no_regs, 0);
            let _ = unwinder.unwind_frame(probe_at, &mut regs, probe, &mut |_| Err(()));
        };
        look_up(&a.unwinder, &mut probe);
        let mut made = 0u64;
        let twin = loop {
            let candidate = Native::new_unwinder();
            made += 1;
            let hits = probe.stats().hit_count;
            look_up(&candidate, &mut probe);
            if probe.stats().hit_count > hits {
                break candidate;
            }
            assert!(made < 8 << 16, "no unwinder with a's generation in {made}");
            // The miss replaced the probe's entry; put `a`'s back.
            look_up(&a.unwinder, &mut probe);
        };
        eprintln!("an unwinder with a's module generation after {made} new ones");

        // Snapshot `b`: the same code ranges, but no modules, so framehop's rule for
        // `pc` is the frame-pointer one.
        let b = Snapshot::<Native> {
            id: next_snapshot_id(),
            unwinder: twin,
            code: a.code.clone(),
            objects: Vec::new(),
            register_mask: a.register_mask,
        };
        assert_eq!(walk(&b, &mut ThreadCache::new()), [pc, BY_FP]);
        assert_eq!(
            walk(&b, &mut thread_cache),
            [pc, BY_FP],
            "a rule cached under snapshot a was used for snapshot b"
        );
    }

    /// Adopting a new snapshot leaves no slot of the cache holding an earlier rule, even
    /// one tagged with the new unwinder's generation (a clone keeps it); adopting the same
    /// snapshot again keeps the rules. Also checks [`RULE_CACHE_SLOTS`] against framehop.
    #[test]
    fn a_new_snapshot_replaces_every_cached_rule() {
        let no_regs = Registers {
            pc: 0,
            sp: 0,
            fp: 0,
            #[cfg(target_arch = "aarch64")]
            lr: 0,
        };
        let first = Snapshot::<Native> {
            id: next_snapshot_id(),
            unwinder: Native::new_unwinder(),
            code: Vec::new(),
            objects: Vec::new(),
            register_mask: 0,
        };
        let second = Snapshot::<Native> {
            id: next_snapshot_id(),
            unwinder: first.unwinder.clone(),
            code: Vec::new(),
            objects: Vec::new(),
            register_mask: 0,
        };
        let look_up = |cache: &mut ThreadCache<Native>, addresses: Range<u64>| {
            let hits = cache.rules.stats().hit_count;
            for address in addresses {
                let mut regs = Native::regs(&no_regs, 0);
                let _ = first.unwinder.unwind_frame(
                    FrameAddress::from_instruction_pointer(address),
                    &mut regs,
                    &mut cache.rules,
                    &mut |_| Err(()),
                );
            }
            cache.rules.stats().hit_count - hits
        };
        let mut cache = ThreadCache::new();
        first.adopt(&mut cache);
        // Four addresses per slot; the last of each stays.
        let slots = RULE_CACHE_SLOTS;
        look_up(&mut cache, 0x1000..0x1000 + 4 * slots);
        let last = 0x1000 + 3 * slots..0x1000 + 4 * slots;
        assert_eq!(look_up(&mut cache, last.clone()), slots, "all cached");
        first.adopt(&mut cache);
        assert_eq!(look_up(&mut cache, last.clone()), slots, "kept");
        let start = Instant::now();
        second.adopt(&mut cache);
        let took = start.elapsed();
        assert_eq!(look_up(&mut cache, last), 0, "a rule survived the flush");
        // More slots than RULE_CACHE_SLOTS would keep some of an earlier, wider fill.
        look_up(&mut cache, 0x10_0000..0x10_0000 + 8 * slots);
        let cached = (0x10_0000..0x10_0000 + 8 * slots)
            .rev()
            .filter(|&a| look_up(&mut cache, a..a + 1) == 1)
            .count();
        assert_eq!(cached as u64, slots, "framehop's rule cache changed size");
        eprintln!("replacing every cached rule took {took:?}");
    }
}
