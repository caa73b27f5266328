//! Run delay per local root: the time a thread inside a root was runnable but not
//! running (the scheduler ran other work: other processes, or the container's CPU quota
//! was used up). Without it, that time reads as "blocked in poll" (active, not on CPU).
//!
//! Linux keeps it per thread, cumulative: the second field of
//! `/proc/self/task/<tid>/schedstat` (nanoseconds). The watchdog reads it, never the span
//! hooks, every [`PERIOD`] for each thread inside a root with counters, through a file
//! kept open per thread slot (a `pread`, about a microsecond), and gives the change to
//! the root the thread held at both reads. The error is at most one period per stretch of
//! a thread inside a root (the delay since the stretch's last read is not seen), and a
//! thread that ran another root between two reads of the same one lends it that root's
//! delay for the period.

use std::fs::File;
use std::os::unix::fs::FileExt as _;

use super::Slot;
use crate::root_cpu;
use crate::span_context::RootLabel;

/// How often a thread's run delay is read while it is inside a root.
pub(crate) const PERIOD_NS: u64 = 50_000_000;

/// The reader of one thread slot's schedstat.
struct Reader {
    tid: libc::pid_t,
    file: File,
    /// What the last read saw: the slot's generation, the root, the run delay.
    last: Option<(u64, RootLabel, u64)>,
    next_read: u64,
}

/// Readers by thread slot index (slots are dense and never freed).
#[derive(Default)]
pub(crate) struct RunDelay {
    readers: Vec<Option<Reader>>,
}

impl RunDelay {
    /// At a tick that found slot `index` (owned with `generation`) inside `root`: reads
    /// its thread's run delay if a period passed, and gives the change to `root` when the
    /// last read saw the same root on the same ownership.
    pub(crate) fn note(
        &mut self,
        slot: &Slot,
        index: usize,
        generation: u64,
        root: RootLabel,
        now: u64,
    ) {
        let raw = root.cpu_raw();
        if raw == 0 {
            return;
        }
        if self.readers.len() <= index {
            self.readers.resize_with(index + 1, || None);
        }
        let tid = slot.owner_tid();
        let entry = &mut self.readers[index];
        if entry.as_ref().is_none_or(|r| r.tid != tid) {
            *entry = File::open(format!("/proc/self/task/{tid}/schedstat"))
                .ok()
                .map(|file| Reader {
                    tid,
                    file,
                    last: None,
                    next_read: 0,
                });
        }
        let Some(reader) = entry else { return };
        if now < reader.next_read {
            return;
        }
        reader.next_read = now.saturating_add(PERIOD_NS);
        let Some((cpu, delay)) = read_schedstat(&reader.file) else {
            *entry = None;
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
            Some((g, r, before)) if g == generation && r == root => delay.saturating_sub(before),
            // The first read of this root here: it is measured, from now on.
            _ => 0,
        };
        root_cpu::add_runqueue(raw, grown);
        reader.last = Some((generation, root, delay));
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
