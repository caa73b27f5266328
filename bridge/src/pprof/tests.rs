use super::*;
use prost::Message;
use std::collections::HashMap;
use std::time::UNIX_EPOCH;

const PERIOD: i64 = 10_101_010; // 99 Hz

fn line(function: &str, file: Option<&str>, line: Option<u32>) -> FrameLine {
    FrameLine {
        function: function.into(),
        file: file.map(Into::into),
        line,
    }
}

fn frame(address: u64, lines: Vec<FrameLine>) -> SymbolizedFrame {
    SymbolizedFrame { address, lines }
}

fn labels(span_id: u64, trace_id: u128, name: &str) -> SampleLabels {
    SampleLabels {
        span_id: Some(span_id),
        trace_id: Some(trace_id),
        span_name: Some(name.into()),
    }
}

/// `main` ← `render` (with `to_string` inlined into it), innermost first.
fn stack() -> Vec<SymbolizedFrame> {
    vec![
        frame(
            0x2000,
            vec![
                line("serde_json::ser::to_string", Some("ser.rs"), Some(10)),
                line("app::render_report", Some("report.rs"), Some(42)),
            ],
        ),
        frame(0x1000, vec![line("app::main", Some("main.rs"), Some(3))]),
    ]
}

fn builder() -> ProfileBuilder {
    ProfileBuilder::new(
        PERIOD,
        UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        Duration::from_secs(10),
    )
}

fn s(p: &proto::Profile, index: i64) -> &str {
    &p.string_table[usize::try_from(index).expect("string index")]
}

/// Labels of a sample as (key, value) strings.
fn label_strings(p: &proto::Profile, sample: &proto::Sample) -> Vec<(String, String)> {
    sample
        .label
        .iter()
        .map(|l| (s(p, l.key).to_owned(), s(p, l.str).to_owned()))
        .collect()
}

/// Function names of a sample's stack, innermost first, inlined frames expanded.
fn stack_names(p: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
    let mut names = Vec::new();
    for id in &sample.location_id {
        let loc = p.location.iter().find(|l| l.id == *id).expect("location");
        for ln in &loc.line {
            let f = p
                .function
                .iter()
                .find(|f| f.id == ln.function_id)
                .expect("function");
            names.push(s(p, f.name).to_owned());
        }
    }
    names
}

#[test]
fn header_follows_pyroscope_cpu_contract() {
    let p = builder().build_proto();
    assert_eq!(p.string_table[0], "");
    assert_eq!(p.sample_type.len(), 1);
    assert_eq!(s(&p, p.sample_type[0].r#type), "cpu");
    assert_eq!(s(&p, p.sample_type[0].unit), "nanoseconds");
    let period_type = p.period_type.as_ref().expect("period_type");
    assert_eq!(s(&p, period_type.r#type), "cpu");
    assert_eq!(s(&p, period_type.unit), "nanoseconds");
    assert_eq!(p.period, PERIOD);
    assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
    assert_eq!(p.duration_nanos, 10_000_000_000);
    assert_eq!(p.mapping.len(), 1);
    let m = &p.mapping[0];
    assert_eq!((m.id, m.memory_start, m.memory_limit), (1, 0, u64::MAX));
    assert!(m.has_functions);
    // No lines yet, so nothing claims file names or line numbers.
    assert!(!m.has_filenames && !m.has_line_numbers);
    if let Ok(exe) = std::env::current_exe() {
        assert_eq!(s(&p, m.filename), exe.to_string_lossy());
    }
}

#[test]
fn round_trip_through_gzip_keeps_samples_and_labels() {
    let mut b = builder();
    b.add_sample(&stack(), &labels(0xab, 0x1234, "GET /report"), 3);
    b.add_sample(&stack()[1..], &SampleLabels::default(), 1);
    let built = b.build_proto();

    let bytes = proto::encode_gzip(&built).expect("encode");
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip output");
    let decoded = decode(&bytes).expect("decode gzip");
    assert_eq!(decoded, built);
    // Plain (not gzipped) bytes decode too.
    assert_eq!(decode(&built.encode_to_vec()).expect("decode plain"), built);

    assert_eq!(decoded.sample.len(), 2);
    // Samples are ordered by labels: the unlabelled one first.
    let first = &decoded.sample[1];
    assert_eq!(first.value, vec![3 * PERIOD]);
    assert_eq!(
        stack_names(&decoded, first),
        [
            "serde_json::ser::to_string",
            "app::render_report",
            "app::main"
        ]
    );
    assert_eq!(
        label_strings(&decoded, first),
        [
            ("span_id".to_owned(), "00000000000000ab".to_owned()),
            (
                "trace_id".to_owned(),
                "00000000000000000000000000001234".to_owned()
            ),
            ("span_name".to_owned(), "GET /report".to_owned()),
        ]
    );
    let second = &decoded.sample[0];
    assert_eq!(second.value, vec![PERIOD]);
    assert_eq!(stack_names(&decoded, second), ["app::main"]);
    assert!(second.label.is_empty());

    let m = &decoded.mapping[0];
    assert!(m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames);
}

#[test]
fn identical_samples_merge_and_different_labels_do_not() {
    let mut b = builder();
    let a = labels(1, 2, "a");
    b.add_sample(&stack(), &a, 2);
    b.add_sample(&stack(), &a, 5);
    b.add_sample(&stack(), &labels(1, 2, "b"), 1);
    b.add_sample(&stack()[1..], &a, 1);
    b.add_sample(&stack(), &a, 0); // adds nothing
    let p = b.build_proto();
    let values: Vec<i64> = p.sample.iter().map(|s| s.value[0]).collect();
    // Ordered by (labels, stack addresses): `a` at [0x1000], `a` at [0x2000, 0x1000], `b`.
    assert_eq!(values, [PERIOD, 7 * PERIOD, PERIOD]);
}

#[test]
fn label_formats_are_fixed_width_lowercase_hex() {
    let mut b = builder();
    b.add_sample(
        &stack(),
        &SampleLabels {
            span_id: Some(0xab),
            ..SampleLabels::default()
        },
        1,
    );
    b.add_sample(
        &stack(),
        &SampleLabels {
            span_id: Some(u64::MAX),
            trace_id: Some(0xABCDEF << 64 | 1),
            span_name: None,
        },
        1,
    );
    b.add_sample(
        &stack(),
        &SampleLabels {
            span_name: Some("only name".into()),
            ..SampleLabels::default()
        },
        1,
    );
    let p = b.build_proto();
    let got: Vec<_> = p.sample.iter().map(|x| label_strings(&p, x)).collect();
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    // Ordered by labels, absent ones first.
    assert_eq!(got[0], [pair("span_name", "only name")]);
    assert_eq!(got[1], [pair("span_id", "00000000000000ab")]);
    assert_eq!(
        got[2],
        [
            pair("span_id", "ffffffffffffffff"),
            pair("trace_id", "0000000000abcdef0000000000000001"),
        ]
    );
}

#[test]
fn functions_and_locations_are_deduplicated() {
    let mut b = builder();
    // Same function at two addresses, plus the same name in another file.
    let other = vec![
        frame(0x3000, vec![line("app::main", Some("main.rs"), Some(7))]),
        frame(0x4000, vec![line("app::main", Some("other.rs"), None)]),
    ];
    b.add_sample(&stack(), &SampleLabels::default(), 1);
    b.add_sample(&other, &SampleLabels::default(), 1);
    b.add_sample(&stack(), &labels(9, 9, "x"), 1);
    let p = b.build_proto();

    let addresses: Vec<u64> = p.location.iter().map(|l| l.address).collect();
    assert_eq!(addresses, [0x2000, 0x1000, 0x3000, 0x4000]);
    let ids: Vec<u64> = p.location.iter().map(|l| l.id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    assert!(p.location.iter().all(|l| l.mapping_id == 1));
    assert_eq!(p.sample[0].location_id, [1, 2]);
    assert_eq!(p.sample[2].location_id, [1, 2]);

    let functions: Vec<(u64, &str, &str)> = p
        .function
        .iter()
        .map(|f| {
            assert_eq!(f.system_name, f.name);
            (f.id, s(&p, f.name), s(&p, f.filename))
        })
        .collect();
    assert_eq!(
        functions,
        [
            (1, "serde_json::ser::to_string", "ser.rs"),
            (2, "app::render_report", "report.rs"),
            (3, "app::main", "main.rs"),
            (4, "app::main", "other.rs"),
        ]
    );
    // Inlined lines keep their order and line numbers; a missing line number is 0.
    let lines = |i: usize| -> Vec<(u64, i64)> {
        p.location[i]
            .line
            .iter()
            .map(|l| (l.function_id, l.line))
            .collect()
    };
    assert_eq!(lines(0), [(1, 10), (2, 42)]);
    assert_eq!(lines(2), [(3, 7)]);
    assert_eq!(lines(3), [(4, 0)]);

    // Every string once.
    let mut table = p.string_table.clone();
    table.sort();
    table.dedup();
    assert_eq!(table.len(), p.string_table.len());
}

#[test]
fn missing_file_becomes_empty_filename() {
    let mut b = builder();
    b.add_sample(
        &[frame(0x10, vec![line("no_debug_info", None, None)])],
        &SampleLabels::default(),
        1,
    );
    let p = b.build_proto();
    assert_eq!(s(&p, p.function[0].filename), "");
    assert!(!p.mapping[0].has_filenames && !p.mapping[0].has_line_numbers);
    assert!(!p.mapping[0].has_inline_frames);
}

#[test]
fn values_saturate_instead_of_wrapping() {
    let mut b = builder();
    b.add_sample(&stack(), &SampleLabels::default(), u64::MAX);
    b.add_sample(&stack(), &SampleLabels::default(), u64::MAX);
    assert_eq!(b.build_proto().sample[0].value, [i64::MAX]);
}

#[test]
fn decode_rejects_garbage_with_invalid_data() {
    let mut truncated = proto::encode_gzip(&{
        let mut b = builder();
        b.add_sample(&stack(), &labels(1, 2, "x"), 1);
        b.build_proto()
    })
    .expect("encode");
    truncated.truncate(truncated.len() / 2);

    let bad_string_zero = proto::Profile {
        string_table: vec!["x".into()],
        ..Default::default()
    }
    .encode_to_vec();
    let bad_index = proto::Profile {
        string_table: vec![String::new()],
        function: vec![proto::Function {
            id: 1,
            name: 5,
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let bad_location = proto::Profile {
        sample: vec![proto::Sample {
            location_id: vec![7],
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();

    let cases: [(&str, &[u8]); 6] = [
        ("text", b"this is not a profile"),
        ("gzip magic only", &[0x1f, 0x8b]),
        (
            "gzip header then junk",
            &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3],
        ),
        ("truncated gzip", &truncated),
        ("string_table[0] not empty", &bad_string_zero),
        ("string index out of range", &bad_index),
    ];
    for (what, bytes) in cases
        .iter()
        .copied()
        .chain([("unknown location", &bad_location[..])])
    {
        let err = decode(bytes).expect_err(what);
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
        assert!(err.to_string().starts_with("pprof: "), "{what}: {err}");
    }
}

/// A profile of `n` samples over a few dozen distinct stacks, each sample its own span.
fn many_spans(n: u64) -> proto::Profile {
    let mut b = builder();
    for i in 0..n {
        let depth = 3 + (i % 7) as usize;
        let stack: Vec<SymbolizedFrame> = (0..depth)
            .map(|d| {
                let f = (i % 31) * 16 + d as u64;
                frame(
                    0x10_000 + f * 0x10,
                    vec![line(
                        &format!("app::module_{}::function_{f}", f % 5),
                        Some("src/app.rs"),
                        Some(f as u32),
                    )],
                )
            })
            .collect();
        b.add_sample(
            &stack,
            &labels(
                0x1000 + i,
                u128::from(i) << 64 | 7,
                &format!("GET /r{}", i % 13),
            ),
            1 + i % 3,
        );
    }
    b.build_proto()
}

/// A sample as a reader sees it: stack names and label (key, value) pairs.
type SampleContent = (Vec<String>, Vec<(String, String)>);

/// (stack names, labels) → value, the content a reader sees regardless of table order.
fn content(parts: &[proto::Profile]) -> HashMap<SampleContent, i64> {
    let mut out = HashMap::new();
    for p in parts {
        for sample in &p.sample {
            *out.entry((stack_names(p, sample), label_strings(p, sample)))
                .or_default() += sample.value[0];
        }
    }
    out
}

#[test]
fn split_parts_respect_the_limits_and_keep_every_sample() {
    use prost::Message as _;
    let whole = many_spans(5_000);
    let whole_bytes = whole.encoded_len();
    for limits in [
        split::SplitLimits {
            max_samples: 1_000,
            max_bytes: usize::MAX,
        },
        split::SplitLimits {
            max_samples: usize::MAX,
            max_bytes: whole_bytes / 7,
        },
        split::SplitLimits {
            max_samples: 333,
            max_bytes: whole_bytes / 3,
        },
        split::SplitLimits {
            max_samples: 1,
            max_bytes: 1,
        },
    ] {
        let parts = split::split(&whole, limits);
        let minimum = whole
            .sample
            .len()
            .div_ceil(limits.max_samples.min(whole.sample.len()));
        assert!(parts.len() >= minimum, "{limits:?}: {} parts", parts.len());
        for part in &parts {
            assert!(part.sample.len() <= limits.max_samples, "{limits:?}");
            assert!(
                part.encoded_len() <= limits.max_bytes || part.sample.len() == 1,
                "{limits:?}: {} bytes",
                part.encoded_len()
            );
            // Every part is a valid profile on its own, with the whole one's header.
            let decoded = decode(&proto::encode_gzip(part).expect("encode")).expect("valid part");
            assert_eq!(decoded.time_nanos, whole.time_nanos);
            assert_eq!(decoded.duration_nanos, whole.duration_nanos);
            assert_eq!(decoded.period, whole.period);
            assert_eq!(s(&decoded, decoded.sample_type[0].r#type), "cpu");
        }
        assert_eq!(
            parts.iter().map(|p| p.sample.len()).sum::<usize>(),
            whole.sample.len(),
            "{limits:?}"
        );
        assert_eq!(
            content(&parts),
            content(std::slice::from_ref(&whole)),
            "{limits:?}"
        );
    }
    // A profile within the limits comes back as one identical part.
    let parts = split::split(
        &whole,
        split::SplitLimits {
            max_samples: 5_000,
            max_bytes: whole_bytes,
        },
    );
    assert_eq!(parts, vec![whole]);
}

/// Issue 11 item 3: the blocked-in-poll profile has Go's block profile shape, two values
/// per sample (blocks, blocked nanoseconds), merged per stack and labels.
#[test]
fn blocked_profiles_have_the_block_shape() {
    let mut b =
        ProfileBuilder::blocked(UNIX_EPOCH + Duration::from_secs(1), Duration::from_secs(10));
    let a = labels(0xab, 0x1234, "GET /blocking");
    b.add_blocked(&stack(), &a, 1, 5_000_000);
    b.add_blocked(&stack(), &a, 0, 7_000_000);
    b.add_blocked(&stack(), &a, 0, 0);
    let p = decode(&proto::encode_gzip(&b.build_proto()).expect("encode")).expect("decode");
    let s = |i: i64| p.string_table[i as usize].clone();
    let types: Vec<(String, String)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("contentions".into(), "count".into()),
            ("delay".into(), "nanoseconds".into())
        ]
    );
    let period = p.period_type.as_ref().expect("period type");
    assert_eq!(
        (s(period.r#type), s(period.unit), p.period),
        ("contentions".into(), "count".into(), 1)
    );
    assert_eq!(p.sample.len(), 1, "merged");
    assert_eq!(p.sample[0].value, [1, 12_000_000]);
}

#[path = "../../tests/support/golden.rs"]
mod golden;

/// A fixed set of samples: two spans of one trace, one unlabelled sample, a second
/// name, inlined frames, a frame without file or line.
fn golden_samples() -> Vec<(Vec<SymbolizedFrame>, SampleLabels, u64, u64)> {
    let parse = || frame(0x5000, vec![line("serde_json::de::from_str", None, None)]);
    let mut parsing = vec![parse()];
    parsing.extend(stack()[1..].iter().cloned());
    vec![
        (stack(), labels(0xab, 0x1234, "GET /report"), 3, 4_000),
        (stack()[1..].to_vec(), SampleLabels::default(), 1, 0),
        (
            parsing.clone(),
            labels(0xab, 0x1234, "GET /report"),
            2,
            1_500,
        ),
        (stack(), labels(0xcd, 0x1234, "GET /search"), 5, 0),
        (
            parsing,
            SampleLabels {
                span_name: Some("unsampled".into()),
                ..SampleLabels::default()
            },
            1,
            250,
        ),
    ]
}

/// The profile of `samples`, added in the order given.
fn golden_profile(
    blocked: bool,
    samples: impl IntoIterator<Item = (Vec<SymbolizedFrame>, SampleLabels, u64, u64)>,
) -> proto::Profile {
    let mut b = if blocked {
        ProfileBuilder::blocked(
            UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            Duration::from_secs(10),
        )
    } else {
        builder()
    };
    for (stack, labels, count, delay_ns) in samples {
        if blocked {
            b.add_blocked(&stack, &labels, count, delay_ns);
        } else {
            b.add_sample(&stack, &labels, count);
        }
    }
    let mut p = b.build_proto();
    // The mapping names the test binary, whose path differs between builds.
    let exe = usize::try_from(p.mapping[0].filename).expect("string index");
    p.string_table[exe] = "<current exe>".to_owned();
    p
}

/// Every field of `p` as text, then its encoded bytes in hex: what the golden files hold.
fn dump(p: &proto::Profile) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let vt = |v: &proto::ValueType| format!("{}/{}", s(p, v.r#type), s(p, v.unit));
    let types: Vec<String> = p.sample_type.iter().map(vt).collect();
    let _ = writeln!(out, "sample_type: {}", types.join(", "));
    let _ = writeln!(
        out,
        "period_type: {} period: {}",
        p.period_type.as_ref().map(vt).unwrap_or_default(),
        p.period
    );
    let _ = writeln!(
        out,
        "time_nanos: {} duration_nanos: {} default_sample_type: {} drop_frames: {} \
         keep_frames: {} comments: {:?} doc_url: {}",
        p.time_nanos,
        p.duration_nanos,
        p.default_sample_type,
        p.drop_frames,
        p.keep_frames,
        p.comment,
        p.doc_url
    );
    let _ = writeln!(out, "strings:");
    for (i, text) in p.string_table.iter().enumerate() {
        let _ = writeln!(out, "  {i} {text:?}");
    }
    let _ = writeln!(out, "mappings:");
    for m in &p.mapping {
        let _ = writeln!(
            out,
            "  {} [{:#x}, {:#x}) offset {:#x} file {:?} build_id {} functions {} filenames {} \
             line_numbers {} inline_frames {}",
            m.id,
            m.memory_start,
            m.memory_limit,
            m.file_offset,
            s(p, m.filename),
            m.build_id,
            m.has_functions,
            m.has_filenames,
            m.has_line_numbers,
            m.has_inline_frames
        );
    }
    let _ = writeln!(out, "functions:");
    for f in &p.function {
        let _ = writeln!(
            out,
            "  {} {:?} system {:?} file {:?} start_line {}",
            f.id,
            s(p, f.name),
            s(p, f.system_name),
            s(p, f.filename),
            f.start_line
        );
    }
    let _ = writeln!(out, "locations:");
    for l in &p.location {
        let lines: Vec<String> = l
            .line
            .iter()
            .map(|ln| format!("fn {} line {} col {}", ln.function_id, ln.line, ln.column))
            .collect();
        let _ = writeln!(
            out,
            "  {} {:#x} mapping {} folded {} [{}]",
            l.id,
            l.address,
            l.mapping_id,
            l.is_folded,
            lines.join("; ")
        );
    }
    let _ = writeln!(out, "samples:");
    for sample in &p.sample {
        let labels: Vec<String> = label_strings(p, sample)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            out,
            "  values {:?} locations {:?} labels {{{}}} ({})",
            sample.value,
            sample.location_id,
            labels.join(", "),
            stack_names(p, sample).join(" < ")
        );
    }
    let bytes = p.encode_to_vec();
    let _ = writeln!(out, "encoded: {} bytes", bytes.len());
    for chunk in bytes.chunks(32) {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(out, "  {}", hex.concat());
    }
    out
}

fn golden_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pprof/results")
        .join(name)
}

#[test]
fn cpu_profile_matches_its_golden_file() {
    let p = golden_profile(false, golden_samples());
    golden::check(&golden_path("cpu.txt"), &dump(&p));
}

#[test]
fn blocked_profile_matches_its_golden_file() {
    let p = golden_profile(true, golden_samples());
    golden::check(&golden_path("blocked.txt"), &dump(&p));
}

#[test]
fn the_same_samples_in_any_order_give_the_same_bytes() {
    for blocked in [false, true] {
        let forward = golden_profile(blocked, golden_samples());
        let reversed = golden_profile(blocked, golden_samples().into_iter().rev());
        assert_eq!(
            forward.encode_to_vec(),
            reversed.encode_to_vec(),
            "blocked: {blocked}\n{}",
            golden::line_diff(&dump(&forward), &dump(&reversed))
        );
        // As the collector hands them over: in the order of a hash map, whose seed differs
        // from map to map.
        for _ in 0..4 {
            let map: HashMap<usize, _> = golden_samples().into_iter().enumerate().collect();
            let hashed = golden_profile(blocked, map.into_values());
            assert_eq!(
                proto::encode_gzip(&forward).expect("encode"),
                proto::encode_gzip(&hashed).expect("encode"),
                "blocked: {blocked}\n{}",
                golden::line_diff(&dump(&forward), &dump(&hashed))
            );
        }
    }
}
