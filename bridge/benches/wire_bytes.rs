//! What a sample costs on the wire to Pyroscope, and what splitting an interval costs:
//! bytes per sample (uncompressed and gzipped) with and without the `trace_id` sample
//! label, and the time to prepare the pushes of one interval, unsplit vs split to
//! Pyroscope's limits, measured in one run.
//!
//! The workload mirrors a busy service: 40 endpoints, stacks 30 frames deep drawn from
//! 600 functions, one root span (and trace) per request, a request taking 1-3 samples.
//! Every sample carries its request's `span_id`, so (stack, span) entries rarely merge.
//!
//! Run: `cargo bench -p otel-profiling --bench wire_bytes`

use std::time::{Duration, Instant, SystemTime};

use otel_profiling::pprof::{FrameLine, ProfileBuilder, SampleLabels, SymbolizedFrame};
use otel_profiling_pprof::split::{split, SplitLimits};
use otel_profiling_pprof::{self as pprof, encode_gzip};
use prost::Message;

const SAMPLES: u64 = 20_000;

/// One interval's profile, read back from its bytes as a server would (to split it).
fn interval(with_trace_id: bool) -> pprof::Profile {
    let mut builder = ProfileBuilder::new(10_000_000, SystemTime::now(), Duration::from_secs(10));
    let mut request = 0u64;
    let mut left_in_request = 0;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..SAMPLES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if left_in_request == 0 {
            request += 1;
            left_in_request = 1 + x % 3;
        }
        left_in_request -= 1;
        let endpoint = request % 40;
        let stack: Vec<SymbolizedFrame> = (0..30u64)
            .map(|d| {
                // Outer frames shared by the endpoint, inner ones vary with the sample.
                let f = if d > 10 {
                    endpoint * 13 + d
                } else {
                    (x >> d) % 600
                };
                SymbolizedFrame {
                    address: 0x40_0000 + f * 64 + d,
                    lines: vec![FrameLine {
                        function: format!("shop_service::handlers::endpoint_{}::step_{f}", f % 40)
                            .into(),
                        file: Some(format!("src/handlers/endpoint_{}.rs", f % 40).into()),
                        line: Some((f * 7 % 500) as u32),
                    }],
                }
            })
            .collect();
        let labels = SampleLabels {
            span_id: Some(0x1000_0000_0000 + request),
            trace_id: with_trace_id.then_some(u128::from(request) << 64 | 0xabcdef),
            span_name: Some(format!("GET /api/endpoint/{endpoint}").into()),
        };
        builder.add_sample(&stack, &labels, 1);
    }
    pprof::decode(&builder.build().encode()).unwrap_or_else(|e| panic!("our own bytes: {e}"))
}

fn main() {
    println!("{SAMPLES} samples in one interval, one span per request:");
    for with_trace_id in [true, false] {
        let profile = interval(with_trace_id);
        let raw = profile.encoded_len();
        let gz = encode_gzip(&profile).map(|g| g.len()).unwrap_or(0);
        println!(
            "  trace_id label {:>3}: {} entries, {:>8} B uncompressed ({:>5.1} B/sample), {:>7} B gzipped ({:>5.1} B/sample)",
            if with_trace_id { "on" } else { "off" },
            profile.sample.len(),
            raw,
            raw as f64 / profile.sample.len() as f64,
            gz,
            gz as f64 / profile.sample.len() as f64,
        );
    }
    let profile = interval(true);
    let limits = SplitLimits {
        max_samples: 15_000,
        max_bytes: 1536 * 1024,
    };
    let rounds = 5;
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(encode_gzip(&profile).map(|g| g.len()).unwrap_or(0));
    }
    let whole = start.elapsed() / rounds;
    let start = Instant::now();
    let mut parts = Vec::new();
    for _ in 0..rounds {
        parts = split(&profile, limits);
        let bytes: usize = parts
            .iter()
            .map(|p| encode_gzip(p).map(|g| g.len()).unwrap_or(0))
            .sum();
        std::hint::black_box(bytes);
    }
    let with_split = start.elapsed() / rounds;
    let raw_parts: usize = parts.iter().map(Message::encoded_len).sum();
    let gz_parts: usize = parts
        .iter()
        .map(|p| encode_gzip(p).map(|g| g.len()).unwrap_or(0))
        .sum();
    println!(
        "  split to Pyroscope's limits (15,000 samples, 1.5 MiB): {} parts, {} B uncompressed, {} B gzipped in all ({:+.1} % / {:+.1} % vs unsplit)",
        parts.len(),
        raw_parts,
        gz_parts,
        (raw_parts as f64 / profile.encoded_len() as f64 - 1.0) * 100.0,
        (gz_parts as f64 / encode_gzip(&profile).map(|g| g.len()).unwrap_or(1) as f64 - 1.0) * 100.0,
    );
    println!(
        "  preparing the interval's pushes: unsplit (gzip) {:.1} ms, split + gzip of the parts {:.1} ms ({:.2}x)",
        whole.as_secs_f64() * 1e3,
        with_split.as_secs_f64() * 1e3,
        with_split.as_secs_f64() / whole.as_secs_f64()
    );
}
