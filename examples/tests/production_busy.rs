//! The production-shaped service beside two busy loops in other processes (2 cores: the
//! service's threads wait for a CPU): run delay is counted as waiting for a CPU, never as
//! blocked, and stays within what the kernel counted.

#[path = "support/production.rs"]
mod production;

#[test]
fn beside_busy_loops_run_delay_is_waiting_for_a_cpu_not_blocked() {
    let (run, report) = production::run("production-busy", 2);
    production::check(&run, &report);
    let fanout = report
        .group("GET /fanout", Some(env!("CARGO_PKG_VERSION")))
        .expect("fan-out row");
    let roots_delay: u64 = report.groups.iter().map(|g| g.split.runqueue_ns).sum();
    // The busy loops took CPUs from the service: the kernel counted run delay, and the
    // roots hold a good part of it (their threads ran them most of the time).
    assert!(run.kernel.run_delay_ns >= 100_000_000, "{run:?}");
    assert!(
        roots_delay * 4 >= run.kernel.run_delay_ns,
        "the roots hold {} of {} ns of run delay",
        roots_delay,
        run.kernel.run_delay_ns
    );
    assert!(
        fanout.split.runqueue_ns * 10 >= fanout.split.wall_ns,
        "the fan-out waited for a CPU a part of its wall time: {}",
        fanout.reason
    );
}
