//! The example service on its own (for the compose stack or a manual run).
//! Configuration: see `otel_profiling_examples::app`.

fn main() {
    if let Err(err) = otel_profiling_examples::app::main_from_env() {
        eprintln!("service: {err}");
        std::process::exit(1);
    }
}
