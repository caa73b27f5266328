//! The local directory stays within `output_max_bytes` (before, ~7 MB of span JSON per 30 s
//! at ~100 requests/s grew without end): earlier runs' files count and go first, the span
//! file rotates at an eighth of the bound, and the removals are counted.

use std::time::Duration;

use tracing_subscriber::layer::SubscriberExt;

const BOUND: u64 = 4 << 20;

fn ours_in(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .expect("output dir")
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            otel_profiling::local_sink::is_sink_file(&name)
                .then(|| (name, e.metadata().map_or(0, |m| m.len())))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_output_directory_stays_within_its_bound() {
    let dir = std::env::temp_dir().join(format!("otel-profiling-bound-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    // An earlier run's files: 8 × 512 KiB, already the whole bound.
    for i in 0..8 {
        let name = format!("2020-01-01T00-00-0{i}.000Z_cpu.pb.gz");
        std::fs::write(dir.join(name), vec![0u8; 512 << 10]).expect("old file");
    }
    std::fs::write(dir.join("notes.txt"), b"not ours").expect("other file");

    let telemetry = otel_profiling::Telemetry::builder()
        .service_name("bounded")
        .output_dir(&dir)
        .output_max_bytes(BOUND)
        .upload_interval(Duration::from_millis(200))
        .quiet(true)
        .build()
        .expect("setup");
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(telemetry.layer()));
    let payload = "x".repeat(400);
    tracing::dispatcher::with_default(&dispatch, || {
        // About 20 MB of span JSON: five times the bound.
        for i in 0..30_000u32 {
            let _span =
                tracing::info_span!("GET /bounded", i, payload = payload.as_str()).entered();
        }
    });
    telemetry.flush();
    let stats = telemetry.stats();
    drop(dispatch);
    drop(telemetry);

    let files = ours_in(&dir);
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    assert!(
        total as f64 <= BOUND as f64 * 1.15,
        "{total} bytes in {} files, bound {BOUND}",
        files.len()
    );
    assert!(
        files.iter().all(|(name, _)| !name.starts_with("2020-")),
        "the earlier run's files go first: {files:?}"
    );
    assert!(
        dir.join("notes.txt").exists(),
        "other files are never touched"
    );
    let span_files = files
        .iter()
        .filter(|(n, _)| n.ends_with("_spans.jsonl"))
        .count();
    assert!(span_files > 1, "the span file rotated: {files:?}");
    assert!(stats.local_files_removed >= 8, "{stats:?}");
    assert!(stats.local_bytes_removed >= 8 * (512 << 10), "{stats:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
