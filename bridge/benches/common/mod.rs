//! Shared by the benchmarks: the alternative we measure against.

/// The `pyroscope` crate's agent with its pprof-rs backend sampling at `hz`, running. Its
/// server is an unused local port: uploads fail off the measured threads.
pub fn start_pyroscope_agent(
    hz: u32,
) -> pyroscope::Result<
    pyroscope::pyroscope::PyroscopeAgent<pyroscope::pyroscope::PyroscopeAgentRunning>,
> {
    pyroscope::pyroscope::PyroscopeAgentBuilder::new(
        "http://127.0.0.1:9",
        "bench",
        hz,
        "pyroscope-rs",
        "bench",
        pyroscope::backend::pprof_backend(
            pyroscope::backend::PprofConfig { sample_rate: hz },
            pyroscope::backend::BackendConfig::default(),
        ),
    )
    .build()
    .and_then(|agent| agent.start())
}
