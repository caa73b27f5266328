//! The calling thread's CPU time and run delay, read by the span hooks at the end of a
//! long stretch (see `active`): ~1 µs, never on a switch that ends a short one.
//!
//! * CPU time: `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, exact to the call (the kernel
//!   brings the running thread's sum up to date; schedstat's first field is a tick behind).
//! * Run delay: the second field of the thread's own `schedstat`, which the kernel brings
//!   up to date each time the thread is put on a CPU, so a running thread's is exact.
//!
//! **Files.** Each thread keeps its `schedstat` open (one `pread` a reading), closed when
//! the thread exits. At most [`MAX_KEPT`] are kept at once, process-wide: past it a
//! reading opens and closes the file (about 3 µs instead of 1), so a host with thousands
//! of threads does not spend its descriptors on us. A forked child's copy of a parent
//! thread's file names the parent's thread: the process id each file was opened in is
//! kept with it, and a reading in another process opens its own.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most `schedstat` files kept open at once (a quarter of the usual soft
/// `RLIMIT_NOFILE`, as the other per-thread files of the crate).
pub(crate) const MAX_KEPT: usize = 256;

/// Files kept open now, by every thread.
static KEPT: AtomicUsize = AtomicUsize::new(0);

/// One reading of the calling thread's clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reading {
    pub(crate) cpu_ns: u64,
    /// `None`: the schedstat file could not be read (no `/proc`), the CPU clock could.
    pub(crate) delay_ns: Option<u64>,
    /// The process it was read in: a reading from before a `fork` is the parent's.
    pub(crate) pid: libc::pid_t,
}

/// The thread's kept file: its descriptor (-1: none) and the process it was opened in.
struct Kept {
    fd: Cell<libc::c_int>,
    pid: Cell<libc::pid_t>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        let fd = self.fd.replace(-1);
        if fd < 0 {
            return;
        }
        // SAFETY: this thread's descriptor (opened by it, or by the thread it was forked
        // from: then this process's own copy), used by no one else.
        unsafe { libc::close(fd) };
        // Counted only in the process that opened it (a child's count starts at 0).
        if self.pid.get() == current_pid() {
            KEPT.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static FILE: Kept = const { Kept { fd: Cell::new(-1), pid: Cell::new(0) } };
}

fn current_pid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// In a forked child: the count was the parent's threads' files; the forking thread's
/// own copy is let go of at its next reading (another process id).
pub(crate) fn after_fork_in_child() {
    KEPT.store(0, Ordering::Relaxed);
}

/// Files kept open now (for `RecordStats`).
pub(crate) fn kept() -> u64 {
    KEPT.load(Ordering::Relaxed) as u64
}

/// Reads the calling thread's CPU time and run delay (`None` without `/proc`), or `None`
/// if the CPU clock cannot be read (a seccomp profile refusing it).
pub(crate) fn read() -> Option<Reading> {
    let cpu_ns = cpu()?;
    let pid = current_pid();
    Some(Reading {
        cpu_ns,
        delay_ns: delay(pid),
        pid,
    })
}

/// The calling thread's CPU time (one `clock_gettime`, ~1 µs on the project's VM).
#[inline]
pub(crate) fn cpu() -> Option<u64> {
    crate::sampler::cpu_ledger::thread_cpu_ns()
}

/// The calling thread's run delay, in process `pid` (the process id: a file kept from
/// before a `fork` is let go of). One `pread`, ~2 µs on the project's VM.
pub(crate) fn delay(pid: libc::pid_t) -> Option<u64> {
    #[cfg(test)]
    if tests::NO_SCHEDSTAT.with(std::cell::Cell::get) {
        return None;
    }
    match FILE.try_with(|kept| read_kept(kept, pid)) {
        Ok(delay) => delay,
        // The thread is exiting (its file is closed): once, without keeping it.
        Err(_) => read_once(),
    }
}

/// The calling process's id.
pub(crate) fn pid() -> libc::pid_t {
    current_pid()
}

fn read_kept(kept: &Kept, pid: libc::pid_t) -> Option<u64> {
    let mut fd = kept.fd.get();
    if fd >= 0 && kept.pid.get() != pid {
        // A parent thread's file, copied by `fork`: not ours to read, and the parent's
        // count of kept files is not this process's.
        // SAFETY: the descriptor is this process's copy, used by no one else.
        unsafe { libc::close(fd) };
        kept.fd.set(-1);
        fd = -1;
    }
    if fd < 0 {
        // A place under the cap is taken before the file is opened, so threads racing
        // here never keep more than the cap between them.
        let placed = KEPT
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_KEPT).then_some(n + 1)
            })
            .is_ok();
        if !placed {
            return read_once();
        }
        let Some(opened) = open() else {
            KEPT.fetch_sub(1, Ordering::Relaxed);
            return None;
        };
        fd = opened;
        kept.fd.set(fd);
        kept.pid.set(pid);
    }
    let delay = read_delay(fd);
    if delay.is_none() {
        // SAFETY: as above; the file is forgotten, a later reading opens it again.
        unsafe { libc::close(fd) };
        kept.fd.set(-1);
        KEPT.fetch_sub(1, Ordering::Relaxed);
    }
    delay
}

fn read_once() -> Option<u64> {
    let fd = open()?;
    let delay = read_delay(fd);
    // SAFETY: opened just above, by this thread.
    unsafe { libc::close(fd) };
    delay
}

fn open() -> Option<libc::c_int> {
    // `/proc/thread-self` (Linux 3.17): the calling thread's directory, no path to format.
    // SAFETY: a NUL-terminated path; the descriptor is closed by its owner.
    let fd = unsafe {
        libc::open(
            c"/proc/thread-self/schedstat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    (fd >= 0).then_some(fd)
}

/// The run delay (second field) of the schedstat file `fd`, read from its start.
fn read_delay(fd: libc::c_int) -> Option<u64> {
    let mut buf = [0u8; 96];
    // SAFETY: `buf` is valid for its length; `fd` is open.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    let n = usize::try_from(n).ok()?;
    second_field(buf.get(..n)?)
}

/// The second of the whitespace-separated decimal fields of `text`.
fn second_field(text: &[u8]) -> Option<u64> {
    let mut fields = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    fields.next()?;
    let field = fields.next()?;
    let mut value: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(value)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Instant;

    use super::*;

    thread_local! {
        /// Set by a test: this thread's schedstat file reads as missing (no `/proc`).
        pub(crate) static NO_SCHEDSTAT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    #[test]
    fn the_second_field_is_the_run_delay() {
        assert_eq!(second_field(b"2921455 17211 33\n"), Some(17_211));
        assert_eq!(second_field(b"2921455\n"), None);
        assert_eq!(second_field(b""), None);
        assert_eq!(second_field(b"1 x2 3"), None);
    }

    /// The readings follow the thread: CPU time grows by what a busy loop burns, the
    /// file is kept (and counted) once per thread and closed when it exits.
    #[test]
    fn reads_the_threads_own_clocks_and_keeps_one_file_per_thread() {
        std::thread::spawn(|| {
            let cpu = || crate::sampler::cpu_ledger::thread_cpu_ns().expect("CPU clock");
            let start = Instant::now();
            let before = read().expect("a reading");
            let from = cpu();
            // 20 ms of CPU, however long that takes on a busy machine.
            while cpu() - from < 20_000_000 {
                std::hint::spin_loop();
            }
            let after = read().expect("a reading");
            let wall = start.elapsed();
            let burned = after.cpu_ns - before.cpu_ns;
            assert!(
                burned >= 20_000_000 && burned <= wall.as_nanos() as u64,
                "{burned} ns of CPU read for 20 ms burned in {wall:?}"
            );
            assert!(after.delay_ns >= before.delay_ns && after.delay_ns.is_some());
            assert_eq!(after.pid, current_pid());
            assert!(FILE.with(|k| k.fd.get()) >= 0, "kept");
        })
        .join()
        .expect("reader");
    }

    /// A forked child's thread lets go of the parent's kept file (a copy of the parent
    /// thread's descriptor: not its own clocks) and keeps one of its own, and the count of
    /// kept files is the child's alone.
    #[test]
    fn a_forked_child_reads_its_own_file_not_the_parents() {
        std::thread::spawn(|| {
            crate::fork::install_handlers();
            let parent = read().expect("a reading");
            assert!(parent.delay_ns.is_some());
            let parent_fd = FILE.with(|k| k.fd.get());
            assert!(parent_fd >= 0, "kept in the parent");
            // SAFETY: the child only reads files, checks and `_exit`s (no allocation on
            // its checks' success path, no locks other threads may hold).
            let child = unsafe { libc::fork() };
            assert!(child >= 0, "fork");
            if child == 0 {
                let pid = current_pid();
                let reading = read();
                let (fd, kept_pid) = FILE.with(|k| (k.fd.get(), k.pid.get()));
                let code = match reading {
                    Some(r) if r.pid != pid => 2,
                    Some(r) if r.delay_ns.is_none() => 3,
                    Some(_) if kept_pid != pid => 4,
                    Some(_) if fd < 0 => 5,
                    Some(_) if KEPT.load(Ordering::Relaxed) != 1 => 6,
                    Some(_) => 0,
                    None => 1,
                };
                // SAFETY: ends the child without running the parent's exit handlers.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waits for the child just forked.
            assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
            assert!(libc::WIFEXITED(status), "child status {status}");
            assert_eq!(
                libc::WEXITSTATUS(status),
                0,
                "1 no reading, 2 the parent's pid, 3 no delay, 4 the parent's file kept, \
                 5 none kept, 6 the parent's count"
            );
            // The parent's own file is untouched.
            assert_eq!(FILE.with(|k| k.fd.get()), parent_fd);
            assert!(read().is_some_and(|r| r.pid == current_pid()));
        })
        .join()
        .expect("forking thread");
    }

    /// A thread's kept file is its own (the path names its tid) and is closed when it
    /// exits; with more threads reading at once than the cap, no more than the cap are
    /// kept and every reading still succeeds (the rest open and close).
    #[test]
    fn files_close_with_their_threads_and_stay_under_the_cap() {
        use std::sync::{Arc, Barrier};
        let threads = MAX_KEPT + 40;
        let barrier = Arc::new(Barrier::new(threads + 1));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let reading = read();
                    let fd = FILE.with(|k| k.fd.get());
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() };
                    if fd >= 0 {
                        let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
                            .expect("the kept file");
                        assert!(
                            target.ends_with(format!("task/{tid}/schedstat")),
                            "{target:?} is not thread {tid}'s"
                        );
                    }
                    barrier.wait();
                    barrier.wait();
                    (reading.is_some(), fd, tid)
                })
            })
            .collect();
        barrier.wait();
        assert!(kept() <= MAX_KEPT as u64, "{} kept", kept());
        barrier.wait();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("reader"))
            .collect();
        assert!(results.iter().all(|(ok, _, _)| *ok), "a reading failed");
        assert!(
            results.iter().filter(|(_, fd, _)| *fd >= 0).count() <= MAX_KEPT,
            "more files kept than the cap"
        );
        for (_, fd, tid) in results.into_iter().filter(|(_, fd, _)| *fd >= 0) {
            let still = std::fs::read_link(format!("/proc/self/fd/{fd}"))
                .is_ok_and(|t| t.ends_with(format!("task/{tid}/schedstat")));
            assert!(!still, "thread {tid}'s file outlived it");
        }
    }
}
