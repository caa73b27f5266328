use otel_profiling_cli::flame::{FlameGraph, FlameSelection};
use otel_profiling_cli::ReportError;

use crate::fixture::{self, MS};
use crate::results;

fn graph(selection: FlameSelection) -> Result<FlameGraph, ReportError> {
    let dir = fixture::both_versions();
    FlameGraph::from_dirs(&[dir.path().to_path_buf()], &selection)
}

#[test]
fn flame_by_span_id_folds_its_stacks_outer_first() {
    let graph = graph(FlameSelection::SpanId("0000000000002000".into())).expect("graph");
    assert_eq!(
        graph.folded,
        [
            format!("main;handle_report;render_rows {}", 60 * MS),
            format!(
                "main;handle_report;serialize;paginate;encode_json {}",
                100 * MS
            ),
        ]
    );
    assert_eq!(graph.samples, 16);
    assert_eq!(graph.cpu_ns, 160 * MS);
    assert_eq!(
        graph.title,
        "CPU of span 0000000000002000: GET /report [2.0.0]"
    );
    // The drawing (title, counts, every frame): the binary's golden file, byte for byte.
    results::check("flame_span_id.svg", &graph.to_svg().expect("svg"));
}

#[test]
fn flame_by_span_id_accepts_upper_case_hex() {
    let graph = graph(FlameSelection::SpanId("0000000000001A00".into())).expect("graph");
    assert_eq!(
        graph.title,
        "CPU of span 0000000000001a00: GET /search [1.0.0]"
    );
}

#[test]
fn flame_by_span_name_takes_every_span_and_name_only_samples() {
    let graph = graph(FlameSelection::SpanName("GET /report".into())).expect("graph");
    assert_eq!(graph.title, "CPU of spans named GET /report");
    // 4 × 8 + 4 × 16 samples of the two versions, and 2 labelled with the name only.
    assert_eq!(graph.samples, 98);
    assert!(graph
        .folded
        .contains(&format!("main;handle_report;legacy_encoder {}", 20 * MS)));
    for (stack, ms) in [
        ("main;handle_report;serialize;encode_json", 80),
        ("main;handle_report;serialize;paginate;encode_json", 400),
    ] {
        assert!(
            graph.folded.contains(&format!("{stack} {}", ms * MS)),
            "{stack}"
        );
    }
    results::check("flame_span_name.svg", &graph.to_svg().expect("svg"));
}

/// `flame --span-name --service-version`: one version's roots only (their ids; samples
/// labelled with the name alone carry no version and stay out); without it the merge of
/// versions is said in the subtitle; an absent version lists the ones there are.
#[test]
fn flame_by_span_name_in_one_version_draws_only_that_version() {
    let in_version = |version: &str| {
        graph(FlameSelection::SpanNameInVersion {
            name: "GET /report".into(),
            version: version.into(),
        })
    };
    let new = in_version("2.0.0").expect("graph");
    assert_eq!(new.title, "CPU of spans named GET /report [2.0.0]");
    assert_eq!(new.samples, 4 * 16);
    assert!(
        new.subtitle.starts_with("4 spans, 64 samples"),
        "{}",
        new.subtitle
    );
    assert!(!new.folded.iter().any(|f| f.contains("legacy_encoder")));
    let old = in_version("1.0.0").expect("graph");
    assert_eq!(old.samples, 4 * 8);
    assert_eq!(old.samples + new.samples + 2, 98);

    let merged = graph(FlameSelection::SpanName("GET /report".into())).expect("graph");
    assert!(
        merged
            .subtitle
            .contains("of versions 1.0.0, 2.0.0 merged (--service-version draws one)"),
        "{}",
        merged.subtitle
    );

    let err = in_version("3.0.0").expect_err("no such version");
    assert_eq!(
        err.to_string(),
        "no \"GET /report\" spans of service.version \"3.0.0\"; versions found: \"1.0.0\", \"2.0.0\""
    );
}

#[test]
fn inlined_frames_are_drawn_as_their_own_frames() {
    let graph = graph(FlameSelection::SpanName("GET /search".into())).expect("graph");
    assert_eq!(
        graph.folded,
        [format!("main;handle_search;search_index {}", 30 * MS)]
    );
}

#[test]
fn flame_errors_name_the_problem() {
    let err = graph(FlameSelection::SpanId("12345".into())).expect_err("invalid");
    assert!(matches!(err, ReportError::InvalidSpanId { .. }));
    assert_eq!(
        err.to_string(),
        "span id \"12345\" is not 16 hexadecimal digits"
    );

    let err = graph(FlameSelection::SpanId("00000000deadbeef".into())).expect_err("unknown");
    assert!(
        err.to_string()
            .contains("span id 00000000deadbeef is in no span file"),
        "{err}"
    );

    let err = graph(FlameSelection::SpanName("GET /nope".into())).expect_err("unknown name");
    let text = err.to_string();
    assert!(
        text.starts_with("no span named \"GET /nope\" in "),
        "{text}"
    );
    assert!(text.contains("\"GET /orders\", \"GET /report\""), "{text}");

    // A slow span without samples: no empty graph, the reason instead.
    let err = graph(FlameSelection::SpanId("0000000000001200".into())).expect_err("no samples");
    assert!(matches!(err, ReportError::NoSamples { .. }));
    let text = err.to_string();
    assert!(
        text.contains("span 0000000000001200 (GET /orders) has no CPU samples"),
        "{text}"
    );
    assert!(text.contains("waiting"), "{text}");

    // A child span: its CPU is labelled with its local root's id.
    let err = graph(FlameSelection::SpanId("0000000000001300".into())).expect_err("child");
    let text = err.to_string();
    assert!(text.contains("not a local root span"), "{text}");
    assert!(text.contains("0000000000001200 (GET /orders)"), "{text}");
}

/// Issue 11 item 5: a span with no samples of its own can be shown the service's activity
/// over its interval — titled as concurrent activity, never as its own profile — and the
/// report names that activity for groups that are not computing.
#[test]
fn concurrent_activity_is_drawn_for_a_span_without_samples_and_labelled_as_such() {
    let dir = fixture::routes_with_active_time();
    let input = otel_profiling_cli::input::Input::load(&[dir.path().to_path_buf()]).expect("input");
    let selection = FlameSelection::SpanName("GET /sleep".into());
    // Its own flame graph is empty, and the error says where to look instead.
    match FlameGraph::from_input(&input, &selection) {
        Err(ReportError::NoSamples { reason, .. }) => {
            assert!(reason.contains("flame --concurrent"), "{reason}")
        }
        other => panic!("expected NoSamples, got {other:?}"),
    }
    let graph = FlameGraph::concurrent_from_input(&input, &selection).expect("concurrent");
    assert!(
        graph.title.contains("not this span") && graph.title.contains("GET /sleep"),
        "{}",
        graph.title
    );
    // GET /cpu's 3 × 8 samples ran in the same profile window.
    assert_eq!((graph.samples, graph.cpu_ns), (24, 240 * MS));
    let svg = graph.to_svg().expect("svg");
    assert!(svg.contains("not this span"), "the drawn title says it");

    let report = otel_profiling_cli::report::SpanReport::from_input(&input);
    let sleep = report
        .group("GET /sleep", Some(fixture::V1))
        .expect("sleep");
    let concurrent = sleep
        .concurrent
        .as_ref()
        .expect("not computing: view shown");
    assert_eq!(concurrent.cpu_ns, 240 * MS);
    assert!(report.to_string().contains(
        "concurrent workload activity, not this span: 0.02 CPU-s per s on the service's threads over the 1 profile window(s)"
    ), "{report}");
    // A CPU-bound group gets no such view: its own profile says it all.
    let cpu = report.group("GET /cpu", Some(fixture::V1)).expect("cpu");
    assert!(cpu.concurrent.is_none());
}

/// The fill of the first frame titled `name` in `svg`.
fn fill_of<'s>(svg: &'s str, name: &str) -> &'s str {
    let at = svg
        .find(&format!("<title>{name} ("))
        .unwrap_or_else(|| panic!("{name} is drawn"));
    let rest = &svg[at..];
    let fill = rest.find("fill=\"").expect("a fill") + "fill=\"".len();
    let end = rest[fill..].find('"').expect("closing quote");
    &rest[fill..fill + end]
}

/// The user's code is blue (`rgb(…,…,220)`), dependencies keep the warm palette; a
/// dependency named with `--crate` (`Input::user_crates`) counts as the user's.
#[test]
fn flame_draws_the_users_code_in_blue_and_crate_adds_to_it() {
    use otel_profiling_cli::input::Input;
    let dir = fixture::both_versions();
    let mut input = Input::load(&[dir.path().to_path_buf()]).expect("input");
    let selection = FlameSelection::SpanId("0000000000002000".into());
    let mut extra = input
        .samples
        .iter()
        .find(|s| {
            s.span_id
                .is_some_and(|id| id.to_string() == "0000000000002000")
        })
        .expect("a sample of the span")
        .clone();
    extra.frames = [
        "tokio::runtime::park",
        "extra_crate::poll",
        "handle_report",
        "main",
    ]
    .map(std::sync::Arc::from)
    .to_vec();
    input.samples.push(extra);
    input.sources.insert(
        "extra_crate::poll".into(),
        "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/extra-crate-1.0.0/src/lib.rs"
            .into(),
    );
    let graph = FlameGraph::from_input(&input, &selection).expect("graph");
    assert!(graph.user_frames.contains("handle_report"));
    assert!(!graph.user_frames.contains("extra_crate::poll"));
    assert!(!graph.user_frames.contains("tokio::runtime::park"));
    let svg = graph.to_svg().expect("svg");
    assert!(
        fill_of(&svg, "handle_report").ends_with(",220)"),
        "{}",
        fill_of(&svg, "handle_report")
    );
    assert!(!fill_of(&svg, "extra_crate::poll").ends_with(",220)"));

    input.user_crates = vec!["extra-crate".to_owned()];
    let graph = FlameGraph::from_input(&input, &selection).expect("graph");
    assert!(graph.user_frames.contains("extra_crate::poll"));
    let svg = graph.to_svg().expect("svg");
    assert!(fill_of(&svg, "extra_crate::poll").ends_with(",220)"));
    assert!(!fill_of(&svg, "tokio::runtime::park").ends_with(",220)"));
}
