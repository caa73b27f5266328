//! Run delay per local root: the time a thread inside a root was runnable but not
//! running (the scheduler ran other work: other processes, or the container's CPU quota
//! was used up). Without it, that time reads as "blocked in poll" (active, not on CPU).
//!
//! Linux keeps it per thread, cumulative: the second field of
//! `/proc/self/task/<tid>/schedstat` (nanoseconds). The watchdog reads it, never the span
//! hooks, every [`PERIOD_NS`] for each thread inside a root with counters, through a file
//! kept open per thread (a `pread`, about a microsecond), and gives the change to
//! the root the thread held at both reads. The error is at most one period per stretch of
//! a thread inside a root (the delay since the stretch's last read is not seen), and a
//! thread that ran another root between two reads of the same one lends it that root's
//! delay for the period.
//!
//! **Open files.** A reader's file is closed as soon as a tick finds its slot free or owned
//! by another thread (the thread exited), and when its thread was not inside a root with
//! counters for [`IDLE_NS`], so that the open files follow the threads in roots now, not
//! every thread ever seen in one. At most [`MAX_OPEN`] are open at once (fewer under a low
//! `RLIMIT_NOFILE`, see [`max_open`]): past it a thread gets no run-delay reading, counted
//! per period in [`WatchdogStats::run_delay_skipped`](super::WatchdogStats) (nor the CPU
//! clock read that bounds what lagging timer signals leave uncounted, see `cpu_ledger`).

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::Ordering;

use super::{bump, Slot, COUNTERS};
use crate::root_cpu;
use crate::span_context::RootLabel;

/// How often a thread's run delay is read while it is inside a root.
pub(crate) const PERIOD_NS: u64 = 50_000_000;

/// Most schedstat files open at once. Each is a descriptor of the host's: a quarter of
/// the usual soft `RLIMIT_NOFILE` (1,024), so the host keeps the rest for its own sockets
/// and files, and still one per thread inside a root on hosts with up to 256 runtime
/// workers (a thread counts only while it is inside a root).
pub(crate) const MAX_OPEN: usize = 256;

/// A reader whose thread was not inside a root with counters for this long is closed
/// (20 periods): a thread back in a root after that costs one `open`, and the cap goes
/// to the threads in roots now.
pub(crate) const IDLE_NS: u64 = 1_000_000_000;

/// [`MAX_OPEN`], or a quarter of the soft `RLIMIT_NOFILE` when that is lower.
pub(crate) fn max_open() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return MAX_OPEN;
    }
    usize::try_from(limit.rlim_cur / 4).map_or(MAX_OPEN, |quarter| quarter.min(MAX_OPEN))
}

/// One open schedstat file. Counted in `WatchdogStats::schedstat_files_open` from its
/// open to its drop, whoever drops it.
struct Reader {
    file: File,
    /// What the last read saw: the root and the run delay.
    last: Option<(RootLabel, u64)>,
}

impl Reader {
    fn open(tid: libc::pid_t) -> Option<Reader> {
        let file = File::open(format!("/proc/self/task/{tid}/schedstat")).ok()?;
        COUNTERS
            .schedstat_files_open
            .fetch_add(1, Ordering::Relaxed);
        Some(Reader { file, last: None })
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        COUNTERS
            .schedstat_files_open
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the watchdog keeps of one owned slot for its run delay.
struct Entry {
    /// The slot's generation it belongs to: another one is another thread.
    generation: u64,
    /// `None` before the first read, after a failed open or read, or at the cap.
    reader: Option<Reader>,
    next_read: u64,
    /// The last tick that found the slot owned with `generation`.
    seen: u64,
    /// When a tick last found the thread inside a root with counters.
    in_root: u64,
}

/// Entries by thread slot index (slots are dense and never freed).
pub(crate) struct RunDelay {
    entries: Vec<Option<Entry>>,
    /// Readers open in `entries`, at most `max_open`.
    open: usize,
    max_open: usize,
}

impl RunDelay {
    /// Readers for a watchdog that keeps at most `max_open` files open.
    pub(crate) fn new(max_open: usize) -> RunDelay {
        RunDelay {
            entries: Vec::new(),
            open: 0,
            max_open,
        }
    }

    /// The schedstat files open here.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open
    }

    /// At tick `tick`, slot `index` is owned with `generation` (inside a root or not):
    /// its reader, if that thread's, is kept.
    pub(crate) fn owned(&mut self, index: usize, generation: u64, tick: u64) {
        if let Some(Some(entry)) = self.entries.get_mut(index) {
            if entry.generation == generation {
                entry.seen = tick;
            }
        }
    }

    /// At a tick that found slot `index` (owned with `generation`) inside `root`: reads
    /// its thread's run delay if a period passed, and gives the change to `root` when the
    /// last read saw the same root.
    pub(crate) fn note(
        &mut self,
        slot: &Slot,
        index: usize,
        generation: u64,
        root: RootLabel,
        now: u64,
        tick: u64,
    ) {
        let raw = root.cpu_raw();
        if raw == 0 {
            return;
        }
        if self.entries.len() <= index {
            self.entries.resize_with(index + 1, || None);
        }
        let entry = &mut self.entries[index];
        if entry.as_ref().is_none_or(|e| e.generation != generation) {
            // Another thread (or none yet): the old one's file, if any, is closed.
            if entry.take().is_some_and(|e| e.reader.is_some()) {
                self.open -= 1;
            }
            *entry = Some(Entry {
                generation,
                reader: None,
                next_read: 0,
                seen: tick,
                in_root: now,
            });
        }
        let Some(entry) = entry else { return };
        entry.seen = tick;
        entry.in_root = now;
        if now < entry.next_read {
            return;
        }
        entry.next_read = now.saturating_add(PERIOD_NS);
        if entry.reader.is_none() {
            if self.open >= self.max_open {
                bump(&COUNTERS.run_delay_skipped);
                return;
            }
            // The tid may be a newer owner's if the slot changed hands since the tick
            // read it: the check after the read below sees that, and the next tick
            // finds the new generation and opens the file again.
            entry.reader = Reader::open(slot.owner_tid());
            if entry.reader.is_none() {
                return;
            }
            self.open += 1;
        }
        let Some(reader) = &mut entry.reader else {
            return;
        };
        let Some((cpu, delay)) = read_schedstat(&reader.file) else {
            entry.reader = None;
            self.open -= 1;
            return;
        };
        // The tid read above is the owner's only if the slot kept its owner meanwhile.
        if !slot
            .read_cell_if_owned(generation)
            .is_some_and(|(_, word)| word.and_then(crate::label::Label::read) == Some(root))
        {
            reader.last = None;
            return;
        }
        // The same read bounds the CPU time a root's end can leave uncounted when the
        // thread's timer signals lag (see `cpu_ledger`): the thread's CPU clock, given
        // from the ledger to the root it holds, unless the slot changed owner meanwhile.
        let given = slot
            .cpu
            .advance_while(cpu, || slot.generation() == generation);
        root_cpu::add_cpu(raw, given);
        let grown = match reader.last {
            Some((r, before)) if r == root => delay.saturating_sub(before),
            // The first read of this root here: it is measured, from now on.
            _ => 0,
        };
        root_cpu::add_runqueue(raw, grown);
        reader.last = Some((root, delay));
    }

    /// After tick `tick` (which started at `now`): forgets the slots it did not find
    /// owned by the same thread, and closes the files of threads out of roots for
    /// [`IDLE_NS`].
    pub(crate) fn sweep(&mut self, tick: u64, now: u64) {
        for slot in &mut self.entries {
            let Some(entry) = slot else { continue };
            if entry.seen == tick && now.saturating_sub(entry.in_root) < IDLE_NS {
                continue;
            }
            if entry.reader.is_some() {
                self.open -= 1;
            }
            *slot = None;
        }
    }
}

/// The CPU time and the run delay (first and second fields, nanoseconds) of a schedstat
/// file, re-read from its start.
fn read_schedstat(file: &File) -> Option<(u64, u64)> {
    let mut buf = [0u8; 96];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_schedstat(buf.get(..n)?)
}

fn parse_schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut fields = text.split_whitespace();
    let cpu = fields.next()?.parse().ok()?;
    let delay = fields.next()?.parse().ok()?;
    Some((cpu, delay))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_give_their_first_two_fields() {
        assert_eq!(
            parse_schedstat(b"2921455 17211 33\n"),
            Some((2_921_455, 17_211))
        );
        assert_eq!(parse_schedstat(b"2921455\n"), None);
        assert_eq!(parse_schedstat(b""), None);
        // This thread's own file reads.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let file = File::open(format!("/proc/self/task/{tid}/schedstat")).expect("schedstat");
        assert!(read_schedstat(&file).is_some());
    }
}
