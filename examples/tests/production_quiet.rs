//! The production-shaped service (`otel_profiling_examples::production`) on this machine as
//! it is: the evidence against the kernel's figures, and each endpoint's verdict.

#[path = "support/production.rs"]
mod production;

#[test]
fn production_shaped_service_evidence_matches_the_kernel() {
    let (run, report) = production::run("production-quiet", 0);
    production::check(&run, &report);
}
