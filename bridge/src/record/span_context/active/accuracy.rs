//! The stretch timing against the reference that reads the thread's clocks at every
//! transition (`reference`), on the shapes of work that got wrong evidence before (issue
//! 40): roots of 1–50 ms made of many short polls, roots that block inside their polls,
//! and roots whose polls alternate on one thread; each quiet and beside busy loops on
//! every core. Per group of roots: CPU time within 10 % of the reference's, run delay
//! within 20 %, and for pure-CPU roots beside busy loops what is left as "blocked in
//! poll" (active − CPU − run delay) at most 10 % of the active time more than the
//! kernel's own readings leave. The kernel's residual is not zero on a virtual machine:
//! time the hypervisor steals from a running thread is in neither its CPU clock nor its
//! run delay (the scheduler's task clock leaves steal out), and a CI runner beside noisy
//! neighbours lost 10 % of a pure-CPU root that way; the tests print the machine's steal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::reference;
use crate::clock::ticks_to_ns;
use crate::root_cpu::{RootTotals, RunDelay, SlotLists};
use crate::{LocalRoot, RootLabel, SpanContextGuard, SpanName};

/// One test at a time: the reference is process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

/// Deterministic durations.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    /// Microseconds in `[lo, hi)`.
    fn micros(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_micros(lo + self.next() % (hi - lo))
    }
}

fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Busy loops on every core (twice over), outside any root, while the guard lives.
struct BusyLoops {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyLoops {
    fn start(on: bool) -> BusyLoops {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..if on { cores * 2 } else { 0 })
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        spin(Duration::from_micros(100));
                    }
                })
            })
            .collect();
        BusyLoops { stop, threads }
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A group's totals: real CPU, real run delay, active, and the reference's CPU and
/// run delay (nanoseconds).
#[derive(Debug)]
struct Group {
    cpu: u64,
    delay: u64,
    active: u64,
    ref_cpu: u64,
    ref_delay: u64,
    roots: u64,
    /// The machine's steal and interrupt time when the group began.
    machine: Option<(u64, u64)>,
}

impl Group {
    fn new() -> Group {
        Group {
            cpu: 0,
            delay: 0,
            active: 0,
            ref_cpu: 0,
            ref_delay: 0,
            roots: 0,
            machine: steal::read(),
        }
    }

    fn add(&mut self, totals: RootTotals) {
        self.cpu += totals.cpu_ns();
        self.delay += match totals.runqueue {
            RunDelay::Read(ns) => ns,
            RunDelay::NoLongStretch => 0,
            RunDelay::Unknown => panic!("a stretch could not be read: {totals:?}"),
        };
        assert!(totals.off_cpu_ns.is_some(), "CPU unknown: {totals:?}");
        self.active += ticks_to_ns(totals.active_ticks);
        self.ref_cpu += totals.reference.0;
        self.ref_delay += totals.reference.1;
        self.roots += 1;
    }

    fn blocked(&self) -> u64 {
        self.active
            .saturating_sub(self.cpu)
            .saturating_sub(self.delay)
    }

    /// What the kernel's readings at every transition leave as neither CPU nor run delay:
    /// real blocking, and time the hypervisor stole.
    fn ref_blocked(&self) -> u64 {
        self.active
            .saturating_sub(self.ref_cpu)
            .saturating_sub(self.ref_delay)
    }

    /// The timing's "blocked in poll" is at most `share` of the active time (and 1 ms)
    /// more than the kernel's residual.
    fn check_blocked(&self, what: &str, share: f64) {
        assert!(
            self.blocked() as f64 <= self.ref_blocked() as f64 + self.active as f64 * share + 1e6,
            "{what}: {} ns of {} ns read as blocked in poll, the kernel's residual {} ns",
            self.blocked(),
            self.active,
            self.ref_blocked()
        );
    }

    /// The targets, with an absolute slack for groups whose totals are small.
    fn check(&self, what: &str) {
        let ms = |n: f64| n / 1e6;
        eprintln!(
            "{what}: {} roots, active {:.1} ms; CPU {:.1} ms (reference {:.1}); run delay \
             {:.1} ms (reference {:.1}); blocked {:.1} ms (reference {:.1}); {}",
            self.roots,
            ms(self.active as f64),
            ms(self.cpu as f64),
            ms(self.ref_cpu as f64),
            ms(self.delay as f64),
            ms(self.ref_delay as f64),
            ms(self.blocked() as f64),
            ms(self.ref_blocked() as f64),
            steal::since(self.machine)
        );
        let within = |real: u64, reference: u64, share: f64, slack_ms: f64| {
            (real as f64 - reference as f64).abs() <= reference as f64 * share + slack_ms * 1e6
        };
        assert!(
            within(self.cpu, self.ref_cpu, 0.10, 1.0),
            "{what}: CPU {} ns against the reference's {} ns",
            self.cpu,
            self.ref_cpu
        );
        assert!(
            within(self.delay, self.ref_delay, 0.20, 2.0),
            "{what}: run delay {} ns against the reference's {} ns",
            self.delay,
            self.ref_delay
        );
    }
}

/// Runs `rounds` roots on this thread, each made by `work` (which enters it through the
/// guard it is given), and sums their totals.
fn roots_on_this_thread(
    name: &str,
    rounds: usize,
    mut work: impl FnMut(usize, &dyn Fn(&mut dyn FnMut())),
) -> Group {
    let mut lists = SlotLists::default();
    let mut group = Group::new();
    let name = SpanName::intern(name);
    for round in 0..rounds {
        let handle = lists.claim().expect("counters");
        let root = LocalRoot::claim(RootLabel::name_only(name).with_cpu(handle), None);
        let poll = |body: &mut dyn FnMut()| {
            let _scope = SpanContextGuard::enter(Some(&root));
            body();
        };
        work(round, &poll);
        drop(root);
        group.add(lists.release(handle));
    }
    group
}

/// Roots of 1–50 ms of CPU, each in polls of 50 µs–3 ms with runtime work between.
fn short_cpu_roots(busy: bool) -> Group {
    let _busy = BusyLoops::start(busy);
    let mut lcg = Lcg(7);
    let totals = [1, 2, 5, 10, 20, 50];
    roots_on_this_thread("accuracy-short", 36, |round, poll| {
        let total = Duration::from_millis(totals[round % totals.len()]);
        let mut done = Duration::ZERO;
        while done < total {
            let d = lcg.micros(50, 3_000).min(total - done);
            poll(&mut || spin(d));
            done += d;
            spin(lcg.micros(5, 200));
        }
    })
}

#[test]
fn short_roots_of_many_polls_quiet_and_beside_busy_loops() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    reference::set(true);
    for busy in [false, true] {
        let group = short_cpu_roots(busy);
        let what = if busy { "short, busy" } else { "short, quiet" };
        group.check(what);
        if busy {
            group.check_blocked(what, 0.10);
        }
    }
    reference::set(false);
}

/// Roots whose polls block (a `thread::sleep` of 0.2–5 ms) between bits of CPU.
#[test]
fn blocking_roots_quiet_and_beside_busy_loops() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    reference::set(true);
    for busy in [false, true] {
        let _busy = BusyLoops::start(busy);
        let mut lcg = Lcg(11);
        let group = roots_on_this_thread("accuracy-blocking", 24, |_, poll| {
            for _ in 0..4 {
                let (cpu, sleep) = (lcg.micros(50, 2_000), lcg.micros(200, 5_000));
                poll(&mut || {
                    spin(cpu);
                    std::thread::sleep(sleep);
                });
                spin(lcg.micros(5, 200));
            }
        });
        group.check(if busy {
            "blocking, busy"
        } else {
            "blocking, quiet"
        });
    }
    reference::set(false);
}

/// Two roots whose polls (0.1–2 ms each) alternate on one thread, as two tasks on one
/// worker: neither is given the other's CPU or run delay.
#[test]
fn roots_alternating_on_one_thread_quiet_and_beside_busy_loops() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    reference::set(true);
    for busy in [false, true] {
        let _busy = BusyLoops::start(busy);
        let mut lcg = Lcg(13);
        let mut lists = SlotLists::default();
        let (mut a_group, mut b_group) = (Group::new(), Group::new());
        for _ in 0..8 {
            let (a, b) = (
                lists.claim().expect("counters"),
                lists.claim().expect("counters"),
            );
            let root = |name: &str, cpu| {
                LocalRoot::claim(
                    RootLabel::name_only(SpanName::intern(name)).with_cpu(cpu),
                    None,
                )
            };
            let (ra, rb) = (root("accuracy-a", a), root("accuracy-b", b));
            for _ in 0..20 {
                {
                    let _a = SpanContextGuard::enter(Some(&ra));
                    spin(lcg.micros(100, 2_000));
                }
                {
                    // `b` sleeps half of its polls: a root that waits beside one that runs.
                    let _b = SpanContextGuard::enter(Some(&rb));
                    spin(lcg.micros(100, 1_000));
                    if lcg.next().is_multiple_of(2) {
                        std::thread::sleep(lcg.micros(100, 1_000));
                    }
                }
            }
            drop((ra, rb));
            b_group.add(lists.release(b));
            a_group.add(lists.release(a));
        }
        let what = if busy { "busy" } else { "quiet" };
        a_group.check(&format!("alternating a (CPU), {what}"));
        b_group.check(&format!("alternating b (CPU and sleep), {what}"));
        if busy {
            a_group.check_blocked("the pure-CPU root", 0.10);
        }
    }
    reference::set(false);
}

/// Pure-CPU roots whose polls (0.3–2 ms each) are separated by the runtime's short parks
/// (a sleep of 30–200 µs in no root, under the threshold): with the park hooks, the parks'
/// time is no root's, and the roots read as computing. Without the hooks the same
/// pattern charges the parks to the next long stretch.
#[test]
fn parks_between_polls_are_no_roots_time_with_the_hooks() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    reference::set(true);
    let pattern = |hooks: bool| {
        let mut lcg = Lcg(17);
        roots_on_this_thread("accuracy-parks", 24, |_, poll| {
            for _ in 0..6 {
                poll(&mut || spin(lcg.micros(300, 2_000)));
                if hooks {
                    super::parked();
                }
                std::thread::sleep(lcg.micros(30, 200));
                if hooks {
                    super::unparked();
                }
            }
        })
    };
    let with = pattern(true);
    with.check("parks, hooks");
    with.check_blocked("parks with the hooks", 0.05);
    let without = pattern(false);
    eprintln!(
        "parks, no hooks: blocked {:.1} ms of {:.1} ms active (the kernel's residual {:.1} ms)",
        without.blocked() as f64 / 1e6,
        without.active as f64 / 1e6,
        without.ref_blocked() as f64 / 1e6
    );
    // Over the kernel's residual each time: steal differs between the two runs.
    let excess = |g: &Group| g.blocked().saturating_sub(g.ref_blocked());
    assert!(
        excess(&without) > excess(&with),
        "the hooks make no difference: {} against {} ns blocked over the kernel's residual",
        excess(&without),
        excess(&with)
    );
    reference::set(false);
}

/// The machine's stolen and interrupt time (`/proc/stat`, all CPUs, milliseconds), for
/// the log: a residual the kernel's own clocks leave is explained by it, not by the timing.
mod steal {
    /// (steal, irq + softirq) in milliseconds since boot.
    pub(super) fn read() -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal, in ticks of 10 ms.
        Some((
            f.get(7).copied()? * 10,
            (f.get(5).copied()? + f.get(6).copied()?) * 10,
        ))
    }

    /// "machine steal X ms, interrupts Y ms" since `start`.
    pub(super) fn since(start: Option<(u64, u64)>) -> String {
        match (start, read()) {
            (Some(a), Some(b)) => format!(
                "machine steal {} ms, interrupts {} ms (all CPUs)",
                b.0.saturating_sub(a.0),
                b.1.saturating_sub(a.1)
            ),
            _ => "machine steal unknown".into(),
        }
    }
}
