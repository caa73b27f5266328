use std::path::PathBuf;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::ids::SpanId;
use crate::input::Sample;

const MS: u64 = 1_000_000;
const HOSTILE: &str = r#"GET /<script>alert("x")</script>&'q'"#;
const HOSTILE_FN: &str = "<img/src=x onerror=alert(1)>::render";

fn span(id: u64, name: &str, version: &str, wall_ms: u64, busy_ms: Option<u64>) -> Span {
    Span {
        name: name.to_owned(),
        service_version: Some(version.to_owned()),
        busy_ns: busy_ms.map(|b| b * MS),
        ..Span::test_root(id, id * 1_000 * MS, id * 1_000 * MS + wall_ms * MS)
    }
}

fn sample(id: u64, frames: &[&str], samples: u64) -> Sample {
    Sample {
        frames: frames.iter().rev().map(|f| Arc::from(*f)).collect(),
        cpu_ns: samples * 10 * MS,
        count: samples,
        span_id: Some(SpanId::from(id)),
        trace_id: None,
        span_name: None,
        window: None,
    }
}

/// Two versions of a hostile-named endpoint (the second one slower in a new function)
/// and an endpoint without samples.
fn input() -> Input {
    Input {
        dirs: vec![PathBuf::from("/tmp/<run>&\"dir\"")],
        spans: vec![
            span(1, HOSTILE, "1.0", 100, Some(80)),
            span(2, HOSTILE, "2.0", 200, Some(150)),
            span(3, "GET /orders", "1.0", 300, None),
            // A third version, faster again: its diff is folded away.
            span(4, HOSTILE, "3.0", 100, Some(80)),
        ],
        samples: vec![
            sample(1, &["main", "handle", HOSTILE_FN], 4),
            sample(2, &["main", "handle", HOSTILE_FN], 4),
            sample(2, &["main", "handle", "paginate"], 6),
            sample(4, &["main", "handle", "compress"], 2),
        ],
        blocked: Vec::new(),
        profile_files: 1,
        span_files: 1,
        period_ns: Some(10 * MS),
        ..Input::default()
    }
}

#[test]
fn escapes_every_character_that_could_open_markup() {
    assert_eq!(
        Esc(r#"a<b>&"c"'d'"#).to_string(),
        "a&lt;b&gt;&amp;&quot;c&quot;&#39;d&#39;"
    );
    assert_eq!(Esc("plain ünïcode").to_string(), "plain ünïcode");
}

#[test]
fn hostile_span_and_function_names_are_text_not_markup() {
    let page = HtmlReport::from_input(&input()).to_string();
    for raw in [HOSTILE, HOSTILE_FN, "<run>"] {
        assert!(!page.contains(raw), "unescaped {raw:?} in the page");
    }
    assert!(page.contains("GET /&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;q&#39;"));
    assert!(page.contains("&lt;img/src=x onerror=alert(1)&gt;::render"));
    // The page's own two scripts are the only ones.
    assert_eq!(page.matches("<script>").count(), 2, "{page}");
    assert_eq!(page.matches("</script>").count(), 2);
    assert!(!page.contains("<img"));
}

#[test]
fn the_page_loads_nothing_from_anywhere() {
    let page = HtmlReport::from_input(&input()).to_string();
    assert!(!page.contains("http://") && !page.contains("https://"));
    for attribute in [" src=", " href=", "url("] {
        for (at, _) in page.match_indices(attribute) {
            let value = &page[at + attribute.len()..];
            assert!(
                value.starts_with("\"#") || value.starts_with("'#"),
                "{attribute} outside the page: {}",
                &value[..value.len().min(60)]
            );
        }
    }
    assert!(page.contains(r#"content="default-src 'none';"#));
}

#[test]
fn shows_split_verdicts_flame_graphs_and_the_version_diff() {
    let html = HtmlReport::from_input(&input());
    let page = html.to_string();
    // A flame graph per endpoint and version with samples; none for GET /orders.
    assert_eq!(page.matches(r#"<svg class="flame""#).count(), 3);
    assert!(page.contains(r#"data-n="paginate""#));
    assert!(page.contains("No flame graph:"));
    // busy_ns on the hostile endpoint's spans: CPU 40 of 100 ms, blocked 40, awaiting 20,
    // each share as the verdict's sentence prints it.
    assert!(
        page.contains("CPU 40% · blocked in poll 40% · awaiting 20%"),
        "{page}"
    );
    assert!(page.contains("CPU 40% of the wall time (blocked in poll 40%, awaiting 20%)"));
    assert!(page.contains(">busy_ns<"));
    // No busy_ns on GET /orders: said so, and only CPU against not on CPU.
    assert!(page.contains(">none<br><small>CPU vs not on CPU<"));
    assert!(page.contains("CPU 0% · not on CPU 100%"));
    // No samples and no evidence attribute on any root of 1.0: never "waiting".
    assert!(page.contains(r#"<span class="verdict no-evidence">no evidence</span> no root of its version carries profiling.* attributes"#), "{page}");
    assert!(page.contains(r#"<span class="verdict cpu-bound">CPU-bound</span>"#));
    // The diff 1.0 → 2.0 names the new function; 2.0 → 3.0 got cheaper and is folded.
    assert_eq!(html.diffs().len(), 2);
    assert_eq!(html.diffs()[0].new_functions[0].function, "paginate");
    assert!(page.contains("New in 2.0"));
    assert!(page.contains("<code>paginate</code>"));
    // Each version's split and verdict beside the other, and the part that grew named
    // first: CPU 40 → 100 ms per request, awaiting 20 → 50, blocked 40 → 50.
    assert!(
        page.contains(
            "<strong>What changed:</strong> wall p50 +100.00 ms (mean +100.00 ms per request): \
             CPU +60.00 ms (in paginate: its total CPU per request +60.00 ms), awaiting +30.00 ms (no child span \
             covers it: instrument the dependency call), blocked in poll +10.00 ms; verdict \
             mixed → CPU-bound"
        ),
        "{page}"
    );
    assert_eq!(page.matches(r#"<table class="diff-split">"#).count(), 2);
    assert!(page
        .contains("CPU 100.00 ms · blocked in poll 50.00 ms · awaiting 50.00 ms (wall 200.00 ms)"));
    assert_eq!(html.diffs()[1].after.label, "3.0");
    assert_eq!(page.matches("<details>").count(), 1);
    for tag in [
        "details", "section", "article", "table", "figure", "svg", "script",
    ] {
        assert_eq!(
            page.matches(&format!("<{tag}>")).count() + page.matches(&format!("<{tag} ")).count(),
            page.matches(&format!("</{tag}>")).count(),
            "unbalanced <{tag}>"
        );
    }
}

#[test]
fn allocations_get_a_flame_graph_of_bytes_beside_the_cpu_one() {
    let mut input = input();
    // GET /orders 1.0 allocated 3 MB in one function; the others allocated nothing.
    input.allocated = vec![Sample {
        cpu_ns: 3_000_000,
        ..sample(3, &["main", "handle", "render_orders"], 3)
    }];
    let page = HtmlReport::from_input(&input).to_string();
    // Three CPU graphs as before, and one of allocations.
    assert_eq!(page.matches(r#"<svg class="flame""#).count(), 4);
    assert_eq!(
        page.matches("Allocation flame graph of").count(),
        2,
        "caption and label"
    );
    assert!(
        page.contains("3.00 MB allocated (estimated) in 3 allocation sample(s)"),
        "{page}"
    );
    assert!(page.contains(r#"data-n="render_orders""#));
    // Its frames are measured in bytes, not milliseconds.
    assert!(
        page.contains("<title>render_orders — 3.00 MB, 100.0% (3 samples)</title>"),
        "{page}"
    );
    // No allocation samples: no allocation graph.
    let page = HtmlReport::from_input(&super::tests::input()).to_string();
    assert!(!page.contains("Allocation flame graph"));
}

proptest! {
    /// Issue 41, item 1: the page's sentence names the shares its bar prints.
    #[test]
    fn the_verdict_line_names_the_shares_its_bar_prints(
        (spans, samples) in crate::split::arbitrary::group("1", 1)
    ) {
        let input = Input {
            spans,
            samples,
            profile_files: 1,
            span_files: 1,
            period_ns: Some(10 * MS),
            ..Input::default()
        };
        let page = HtmlReport::from_input(&input).to_string();
        let article = page.split(r#"<article class="group" id="g0">"#).nth(1).expect("the group");
        let reason = article
            .split(r#"<p class="verdict-line">"#)
            .nth(1)
            .and_then(|l| l.split("</p>").next())
            .and_then(|l| l.split("</span> ").nth(1))
            .expect("the verdict line");
        let figures = article
            .split(r#"</div><small>"#)
            .nth(1)
            .and_then(|f| f.split("</small>").next())
            .expect("the bar's figures");
        let bar = crate::split::arbitrary::shares_named(figures).map_err(TestCaseError::fail)?;
        let named = crate::split::arbitrary::shares_named(reason).map_err(TestCaseError::fail)?;
        for (part, n) in named {
            prop_assert!(bar.contains(&(part, n)), "{} {}% not in the bar {}: {}", part.label(), n, figures, reason);
        }
    }
}
