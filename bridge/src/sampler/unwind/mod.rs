//! DWARF CFI stack unwinding in the signal handler, from rules compiled ahead of it.
//!
//! ```text
//!  non-signal context (start, registration, collector)     SIGPROF handler (thread T)
//!  refresh(): dlpi_adds/subs changed?                      IN_FLIGHT += 1
//!    └─ scan loaded objects, copy new .eh_frame            s = CURRENT.load()
//!       compile its rows into rules (`rules.rs`)           per frame: search s's rules,
//!       CURRENT.swap(new) ─► old goes to `retired`           apply one, read ≤ 2 words
//!       retired freed once IN_FLIGHT == 0 is seen          IN_FLIGHT -= 1
//! ```
//!
//! **Publication and retirement.** The compiled rules and the sorted code ranges they
//! cover form one immutable [`Snapshot`], published through the `CURRENT` atomic pointer.
//! The handler increments `IN_FLIGHT` *before* loading `CURRENT` and decrements it after
//! its last use of the snapshot. A refresh swaps in the new snapshot and moves the old one
//! to a `retired` list; retired snapshots are freed by a later refresh (or the same one)
//! that observes `IN_FLIGHT == 0` after the swap. All four operations are `SeqCst`, so a
//! zero read after the swap means every handler that could have loaded an old pointer has
//! finished with it. The refresher never waits: if handlers are busy, retired snapshots
//! just live until the next refresh. The current snapshot is kept for the life of the
//! process (a stopped sampler's pending signals may still read it, and a restart reuses
//! it after a cheap check).
//!
//! **In the handler** nothing allocates, locks, touches thread-locals or can panic: per
//! frame, a binary search of the object's code ranges and of its rules, and one rule
//! applied with checked arithmetic (`rules::Rule::step`), reading at most two stack words
//! through `StackReader` (aligned, inside `[sp, stack top)`); the depth is capped at
//! [`MAX_FRAMES`](crate::sampler::MAX_FRAMES); an address outside every known object
//! ends the walk. The CFI itself is evaluated when an object is loaded, outside the
//! handler (see `rules.rs` for why). There is no per-thread state: a thread's first walk
//! costs what every other does, and a new snapshot has nothing stale to flush.
//!
//! **Record format.** `frames[0]` is the interrupted pc; every later entry is a return
//! address exactly as found (it points after the call: symbolizers look up `addr - 1`,
//! and so does the walk, to find the caller's rule).
//!
//! **Limits.** Frames of code without call-frame information end the walk: JIT code,
//! an object loaded since the last refresh (both counted as unknown pcs), a signal
//! trampoline (only met when SIGPROF interrupts another signal handler), rows whose
//! rules use what the walk does not follow (`rules.rs`), and, with `panic = "abort"`,
//! the C `main` shim rustc emits without unwind tables (main-thread stacks then end at
//! `main`, marked truncated; `-C force-unwind-tables=yes` avoids it).
//!
//! **Layout.** This file is the architecture-independent part: publication, the walk and
//! its bounds checks. The rules and their compiler are in `rules.rs`; what differs per
//! architecture (DWARF register numbers, the link register, pointer-authentication bits,
//! where the signal context keeps the registers) is in `x86_64.rs` and `aarch64.rs`;
//! elsewhere `unwind/unsupported.rs` stands in for this module.

use std::ops::Range;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use rules::{Frame, ModuleRules, RuleArch, Step};

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

mod rules;

/// What one architecture contributes beyond its DWARF register numbers.
pub(crate) trait Arch: RuleArch {
    /// The bits of a return address that are address (aarch64 pointer authentication
    /// signs the others), given the highest known code address.
    fn return_address_mask(max_code_address: u64) -> u64;
    /// The interrupted frame's link register, where the architecture has one.
    fn link_register(regs: &Registers) -> Option<u64>;
}

/// An immutable set of known objects: their code ranges and compiled rules.
pub(crate) struct Snapshot<A: Arch> {
    /// Code ranges of the known objects, sorted by start.
    code: Vec<Range<u64>>,
    /// `rules[i]`: the compiled rules of the object whose code is `code[i]`.
    rules: Vec<Arc<ModuleRules>>,
    /// The known objects, for the next refresh's comparison.
    objects: Vec<KnownObject>,
    /// See [`Arch::return_address_mask`].
    return_mask: u64,
    arch: std::marker::PhantomData<A>,
}

struct KnownObject {
    name: String,
    bias: u64,
    code: Range<u64>,
    rules: Arc<ModuleRules>,
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
    /// Builds the next snapshot from a scan, reusing `previous`'s compiled rules for the
    /// objects it already had. `None` when the set of objects with unwind tables is
    /// unchanged.
    fn next(previous: Option<&Snapshot<A>>, scan: modules::Scan) -> Option<Snapshot<A>> {
        let known = |o: &LoadedObject| {
            previous.and_then(|p| {
                p.objects
                    .iter()
                    .find(|k| o.same_mapping(&k.name, k.bias, &k.code))
            })
        };
        let kept = scan
            .objects
            .iter()
            .filter(|o| matches!(o.tables, Tables::Known) && known(o).is_some())
            .count();
        let added = scan
            .objects
            .iter()
            .any(|o| matches!(o.tables, Tables::Copied(_)));
        let previous_len = previous.map_or(0, |p| p.objects.len());
        if previous.is_some() && !added && kept == previous_len {
            return None;
        }
        let mut objects = Vec::with_capacity(scan.objects.len());
        for object in &scan.objects {
            let rules = match &object.tables {
                Tables::Known => match known(object) {
                    Some(k) => k.rules.clone(),
                    None => continue,
                },
                Tables::Copied(tables) => Arc::new(ModuleRules::compile::<A>(tables, &object.code)),
                Tables::Missing => continue,
            };
            objects.push(KnownObject {
                name: object.name.clone(),
                bias: object.bias,
                code: object.code.clone(),
                rules,
            });
        }
        objects.sort_by_key(|k| k.code.start);
        let code = objects.iter().map(|k| k.code.clone()).collect();
        let rules = objects.iter().map(|k| k.rules.clone()).collect();
        let max_code_address = objects.iter().map(|k| k.code.end).max().unwrap_or(0);
        Some(Snapshot {
            code,
            rules,
            objects,
            return_mask: A::return_address_mask(max_code_address),
            arch: std::marker::PhantomData,
        })
    }

    /// The index of the known object whose code holds `addr`. Async-signal-safe.
    #[inline]
    fn object_of(&self, addr: u64) -> Option<usize> {
        let i = self.code.partition_point(|r| r.start <= addr);
        // The last range starting at or below `addr` (none when `i` is 0).
        let last = i.checked_sub(1)?;
        self.code
            .get(last)
            .is_some_and(|r| addr < r.end)
            .then_some(last)
    }

    /// Whether `addr` is in the code of a known object.
    #[inline]
    fn is_code(&self, addr: u64) -> bool {
        self.object_of(addr).is_some()
    }

    /// Heap bytes of the compiled rules.
    fn table_bytes(&self) -> usize {
        self.objects.iter().map(|k| k.rules.size().1).sum()
    }

    /// Unwinds from `regs` into `record` (entry 0, the pc, is already there).
    /// Async-signal-safe and panic-free (checked indexing and arithmetic only).
    #[inline]
    fn walk(
        &self,
        regs: &Registers,
        mut read: impl FnMut(u64) -> Result<u64, ()>,
        record: &mut SampleRecord,
    ) -> WalkEnd {
        let mut frame = Frame {
            pc: regs.pc,
            sp: regs.sp,
            fp: regs.fp,
        };
        let mut link_register = A::link_register(regs);
        // The interrupted instruction is looked up as is; a return address at the
        // instruction before it (the call), which may end its function.
        let mut lookup = regs.pc;
        let mut depth = 1usize;
        let end = loop {
            let Some(object) = self.object_of(lookup) else {
                break WalkEnd::UnknownPc;
            };
            let Some(rule) = self.rules.get(object).and_then(|r| r.rule_at(lookup)) else {
                break WalkEnd::Truncated;
            };
            let caller = match rule.step(frame, link_register, &mut read) {
                Step::Caller(caller) => caller,
                Step::Outermost => break WalkEnd::Complete,
                Step::Stuck => break WalkEnd::Truncated,
            };
            let return_address = caller.pc & self.return_mask;
            // A zero return address ends the chain (some start routines leave one).
            if return_address == 0 {
                break WalkEnd::Complete;
            }
            // Past `MAX_FRAMES` there is no entry left: truncated.
            let Some(entry) = record.frames.get_mut(depth) else {
                break WalkEnd::Truncated;
            };
            *entry = return_address;
            depth += 1;
            frame = Frame {
                pc: return_address,
                ..caller
            };
            link_register = None;
            lookup = return_address - 1;
        };
        record.depth = depth as u16;
        end
    }
}

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
/// Only from the `SIGPROF` handler of the thread whose stack `stack` describes.
#[inline(never)]
pub(crate) unsafe fn walk(
    regs: &Registers,
    stack: StackBounds,
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
                Some(snapshot) => snapshot.walk(regs, |addr| reader.read(addr), record),
            };
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            end
        }
    };
    record.truncated = end != WalkEnd::Complete;
    end
}

/// Fills `record` like [`walk`], from another thread's registers and a copy of its stack:
/// `copy` holds the bytes that were at `[regs.sp, regs.sp + copy.len())`. Every read
/// is served from the copy, so nothing of the other thread is touched. Not for signal
/// handlers (it holds `IN_FLIGHT` like one, so a refresh never frees the snapshot under
/// it).
pub(crate) fn walk_copy(regs: &Registers, copy: &[u8], record: &mut SampleRecord) -> WalkEnd {
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
        Some(snapshot) => snapshot.walk(regs, read, record),
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
    use std::cell::UnsafeCell;
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
            rules: Arc::default(),
        });
        let next = Snapshot::next(Some(&fewer), scan).expect("a removal is a change");
        assert!(!next.objects.iter().any(|k| k.name == "gone.so"));
        assert_eq!(next.objects.len(), first.objects.len());
    }

    /// State for the `SIGUSR1` handler below (one test thread raises it on itself).
    struct Probe {
        stack: StackBounds,
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
            let end = walk(&regs, probe.stack, &mut *probe.record.get());
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
    /// the callers and ends cleanly; prints the time per walk, the first and the rest.
    #[test]
    #[inline(never)] // keep its own frame in release builds (checked below)
    fn walks_from_a_signal_handler() {
        refresh(Wait::Upto(Duration::from_secs(5)));
        let probe = Box::new(Probe {
            stack: StackBounds::current().expect("stack"),
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

        /// Snapshots published while the readers read.
        const REPLACEMENTS: usize = 12;
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
                        // Two spinning readers on a 2-core machine would starve the
                        // builder (each build compiles the test binary's unwind rules).
                        std::thread::yield_now();
                    }
                    reads
                })
            })
            .collect();
        let mut retired_seen = 0;
        for _ in 0..REPLACEMENTS {
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
        eprintln!(
            "{reads} reads across {REPLACEMENTS} replacements; at most {retired_seen} retired at once"
        );
        assert!(reads > 0);
    }

    /// Stacks captured by a signal at random points of a varied workload, for the
    /// comparison with framehop below.
    #[cfg(target_arch = "x86_64")]
    mod captured {
        use super::*;
        use std::sync::atomic::AtomicUsize;

        pub(super) const CAPTURES: usize = 400;
        pub(super) const STACK_COPY: usize = 64 * 1024;

        pub(super) struct Capture {
            pub(super) regs: Registers,
            pub(super) len: usize,
            pub(super) bytes: Box<[u8]>,
        }

        pub(super) struct Captures {
            pub(super) stack: StackBounds,
            pub(super) slots: Vec<UnsafeCell<Capture>>,
            pub(super) taken: AtomicUsize,
        }

        // SAFETY: each slot is written once by the handler (claimed through `taken`) and
        // read by the test only after the capture thread stopped and joined.
        unsafe impl Sync for Captures {}

        pub(super) static TARGET: AtomicPtr<Captures> = AtomicPtr::new(std::ptr::null_mut());

        pub(super) extern "C" fn on_signal(
            _: libc::c_int,
            _: *mut libc::siginfo_t,
            ucontext: *mut libc::c_void,
        ) {
            // SAFETY: the test keeps the captures alive while the signal may come.
            let Some(captures) = (unsafe { TARGET.load(Ordering::SeqCst).as_ref() }) else {
                return;
            };
            let i = captures.taken.fetch_add(1, Ordering::SeqCst);
            let Some(slot) = captures.slots.get(i) else {
                return;
            };
            // SAFETY: the kernel's context; slot `i` is this handler's alone.
            unsafe {
                let Some(regs) = Registers::from_ucontext(ucontext) else {
                    return;
                };
                let capture = &mut *slot.get();
                let top = captures
                    .stack
                    .hi
                    .min(regs.sp.saturating_add(STACK_COPY as u64));
                let len = top.saturating_sub(regs.sp) as usize;
                if regs.sp >= captures.stack.lo && len <= capture.bytes.len() {
                    std::ptr::copy_nonoverlapping(
                        regs.sp as *const u8,
                        capture.bytes.as_mut_ptr(),
                        len,
                    );
                    capture.len = len;
                    capture.regs = regs;
                }
            }
        }

        /// Code of many shapes (std's sorting, formatting, maps, closures, recursion).
        #[inline(never)]
        pub(super) fn workload(round: u64) -> u64 {
            fn fib(n: u64) -> u64 {
                if n < 2 {
                    n
                } else {
                    std::hint::black_box(fib(n - 1)) + fib(n - 2)
                }
            }
            let mut words: Vec<String> = (0..200)
                .map(|i| format!("w{}", (i * 7919 + round) % 1000))
                .collect();
            words.sort();
            let map: std::collections::BTreeMap<_, _> = words
                .iter()
                .enumerate()
                .map(|(i, w)| (w.clone(), i))
                .collect();
            let hashed: std::collections::HashMap<_, _> =
                map.iter().map(|(k, v)| (v, k.len())).collect();
            fib(18)
                + hashed.values().sum::<usize>() as u64
                + words.iter().map(|w| w.len() as u64).sum::<u64>()
        }
    }

    /// The compiled rules walk real stacks frame for frame as framehop does (it evaluates
    /// the CFI at every frame): stacks captured by a signal at random instructions of a
    /// varied workload, walked from copies by both. framehop guesses with frame pointers
    /// where there is no CFI, the rules end the walk there: only then may they stop
    /// earlier, and never in this test's own code.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn compiled_rules_walk_captured_stacks_as_framehop_does() {
        use captured::*;
        use framehop::Unwinder as _;

        let signal = libc::SIGRTMIN() + 5;
        let captures = Box::new(Captures {
            stack: StackBounds::current().expect("stack"),
            slots: (0..CAPTURES)
                .map(|_| {
                    UnsafeCell::new(Capture {
                        regs: Registers {
                            pc: 0,
                            sp: 0,
                            fp: 0,
                        },
                        len: 0,
                        bytes: vec![0; STACK_COPY].into_boxed_slice(),
                    })
                })
                .collect(),
            taken: AtomicUsize::new(0),
        });
        TARGET.store(
            &*captures as *const Captures as *mut Captures,
            Ordering::SeqCst,
        );
        // SAFETY: installing an SA_SIGINFO handler for a signal no other test uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
        }
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() } as usize;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kicker = {
            let done = done.clone();
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    // SAFETY: the test thread lives until this thread is joined.
                    unsafe { libc::pthread_kill(me as libc::pthread_t, signal) };
                    std::thread::sleep(Duration::from_micros(700));
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut round = 0;
        while captures.taken.load(Ordering::SeqCst) < CAPTURES && Instant::now() < deadline {
            std::hint::black_box(workload(round));
            round += 1;
        }
        done.store(true, Ordering::SeqCst);
        kicker.join().expect("kicker");
        TARGET.store(std::ptr::null_mut(), Ordering::SeqCst);

        // Both unwinders over the same objects.
        let compile_start = Instant::now();
        let ours = build::<Native>();
        let compile_took = compile_start.elapsed();
        let mut theirs = framehop::x86_64::UnwinderX86_64::<Vec<u8>>::new();
        for object in modules::scan(&|_, _, _| false).objects {
            let Tables::Copied(tables) = object.tables else {
                continue;
            };
            let svma = |avma: u64, len: usize| avma - object.bias..avma - object.bias + len as u64;
            let hdr_len = tables.eh_frame_hdr.as_ref().map_or(0, Vec::len);
            let info = framehop::ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: Some(object.code.start - object.bias..object.code.end - object.bias),
                eh_frame_svma: Some(svma(tables.eh_frame_avma, tables.eh_frame.len())),
                eh_frame: Some(tables.eh_frame),
                eh_frame_hdr_svma: Some(svma(tables.eh_frame_hdr_avma, hdr_len)),
                eh_frame_hdr: tables.eh_frame_hdr,
                ..Default::default()
            };
            theirs.add_module(framehop::Module::new(
                object.name.clone(),
                object.code.clone(),
                object.bias,
                info,
            ));
        }
        let mut cache = framehop::x86_64::CacheX86_64::<_>::new();
        let test_code = workload as *const () as usize as u64;
        let (mut compared, mut equal, mut frames, mut earlier) = (0, 0, 0, Vec::new());
        let (mut ours_ns, mut theirs_ns) = (0u128, 0u128);
        let taken = captures.taken.load(Ordering::SeqCst).min(CAPTURES);
        for slot in &captures.slots[..taken] {
            // SAFETY: the handler is uninstalled from TARGET and the kicker joined.
            let capture = unsafe { &*slot.get() };
            if capture.len == 0 {
                continue;
            }
            let copy = &capture.bytes[..capture.len];
            let base = capture.regs.sp;
            let read = |addr: u64| -> Result<u64, ()> {
                let at = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
                let word = copy.get(at..at + 8).ok_or(())?;
                Ok(u64::from_ne_bytes(word.try_into().map_err(|_| ())?))
            };
            let mut record = SampleRecord::EMPTY;
            record.frames[0] = capture.regs.pc;
            record.depth = 1;
            // Walked twice like framehop below; the second walk is timed.
            let _ = ours.walk(&capture.regs, read, &mut record.clone());
            let started = Instant::now();
            let end = ours.walk(&capture.regs, read, &mut record);
            ours_ns += started.elapsed().as_nanos();
            let mine = record.frames().to_vec();
            let mut reference = Vec::new();
            let mut read = read;
            // framehop twice, the second walk timed and compared: its cache is then warm
            // from this stack's first walk, as in a thread's steady state.
            for pass in 0..2 {
                reference.clear();
                let started = Instant::now();
                let mut iter = theirs.iter_frames(
                    capture.regs.pc,
                    framehop::x86_64::UnwindRegsX86_64::new(
                        capture.regs.pc,
                        capture.regs.sp,
                        capture.regs.fp,
                    ),
                    &mut cache,
                    &mut read,
                );
                while let Ok(Some(frame)) = iter.next() {
                    reference.push(frame.address());
                    if reference.len() == mine.len().max(crate::sampler::MAX_FRAMES)
                        || !ours.is_code(frame.address_for_lookup())
                    {
                        break;
                    }
                }
                if pass == 1 {
                    theirs_ns += started.elapsed().as_nanos();
                }
            }
            compared += 1;
            frames += mine.len();
            assert!(
                reference.starts_with(&mine),
                "walks differ at pc {:#x} ({end:?}):\n ours   {mine:x?}\n theirs {reference:x?}",
                capture.regs.pc
            );
            if mine == reference {
                equal += 1;
            } else {
                // Ours stopped where framehop went on by frame pointers: never inside the
                // workload's own frames (they have CFI).
                assert_eq!(end, WalkEnd::Truncated, "{mine:x?} / {reference:x?}");
                let last = *mine.last().expect("a frame");
                earlier.push(function_of(last.saturating_sub(1)));
                assert_ne!(last, test_code);
            }
        }
        let (rows, bytes): (usize, usize) = ours
            .objects
            .iter()
            .map(|k| k.rules.size())
            .fold((0, 0), |(r, b), (r2, b2)| (r + r2, b + b2));
        eprintln!(
            "{compared} captured stacks ({frames} frames): {equal} walked exactly as framehop \
             does; {} ended where framehop guessed by frame pointers ({earlier:?}); rules: \
             {rows} rows, {bytes} bytes, compiled in {compile_took:?}; walk time {:.2} us per \
             stack, framehop's with a warm cache {:.2} us",
            earlier.len(),
            ours_ns as f64 / compared.max(1) as f64 / 1e3,
            theirs_ns as f64 / compared.max(1) as f64 / 1e3,
        );
        assert!(compared >= CAPTURES / 2, "only {compared} stacks captured");
        assert!(
            equal * 10 >= compared * 9,
            "{equal} of {compared} walked as framehop does"
        );
    }
}
