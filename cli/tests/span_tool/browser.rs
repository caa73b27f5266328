//! The HTML report in a real browser: headless Chromium opens the page from disk, runs its
//! script, and must show the endpoints, verdicts and flame graphs with no page error; its
//! screenshot must be a real picture with the split bars in it.
//!
//! Without Chromium the check is skipped with a note on stderr, so the README's test
//! command passes with only the Rust toolchain; `OTEL_PROFILING_REQUIRE_BROWSER=1` (set by
//! `.ci/run`, which installs Debian's `chromium`) makes a missing browser a failure.
//! `$CHROMIUM` names the browser binary when it is neither `chromium` nor
//! `chromium-browser` on the `PATH`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixture::{self, MS};

/// A span name that would run script if it reached the page as markup.
const HOSTILE: &str =
    r#"GET /<img src=x onerror="document.documentElement.setAttribute('data-injected','1')">"#;

/// The CPU bar's colour (`--cpu` in the page's style sheet).
const CPU_COLOUR: [u8; 3] = [0xd9, 0x48, 0x2b];

const WINDOW: (u32, u32) = (1400, 1800);

/// How long one browser run may take on a loaded machine before the test gives up.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// The browser to run, or `None` (with a note) when there is none and none is required.
fn chromium() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("CHROMIUM") {
        candidates.push(path.into());
    }
    candidates.extend(["chromium", "chromium-browser"].map(PathBuf::from));
    let mut errors = Vec::new();
    for candidate in candidates {
        match Command::new(&candidate).arg("--version").output() {
            Ok(out) if out.status.success() => return Some(candidate),
            Ok(out) => errors.push(format!(
                "`{} --version` failed: {}",
                candidate.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => errors.push(format!("`{}` not runnable: {e}", candidate.display())),
        }
    }
    let err = errors.join("; ");
    if std::env::var_os("OTEL_PROFILING_REQUIRE_BROWSER").is_some_and(|v| v == "1") {
        panic!(
            "{err}. OTEL_PROFILING_REQUIRE_BROWSER=1: install Chromium (Debian/Ubuntu: apt-get \
             install chromium) or set CHROMIUM to its binary, to check the HTML report in a browser"
        );
    }
    crate::skip::skipped(
        "the headless browser check of the HTML report",
        &format!(
            "{err}; install Chromium (apt-get install chromium) or set CHROMIUM to run it, as \
             CI does"
        ),
    );
    None
}

/// Runs headless Chromium on `page` with `args` and returns its stdout.
fn run_browser(browser: &Path, page: &Path, args: &[String]) -> String {
    let profile = tempfile::tempdir().expect("browser profile dir");
    let url = format!(
        "file://{}",
        page.canonicalize().expect("page path").display()
    );
    // --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start;
    // --disable-dev-shm-usage: containers' small /dev/shm crashes its renderer.
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the browser");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the browser") {
            break status;
        }
        if started.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            panic!("the browser did not finish {url} within {BROWSER_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().expect("stdout reader").expect("browser stdout");
    let stderr = err.join().expect("stderr reader").expect("browser stderr");
    assert!(status.success(), "the browser failed on {url}: {stderr}");
    stdout
}

/// The page's DOM after its scripts ran.
fn rendered_dom(browser: &Path, page: &Path) -> String {
    run_browser(browser, page, &["--dump-dom".to_owned()])
}

/// What a rendered page must show; each missing thing is one line of the result.
struct Expected<'a> {
    flame_graphs: usize,
    endpoints: &'a [&'a str],
    /// Function names drawn as labels in the flame graphs.
    flame_labels: &'a [&'a str],
    /// Any other text.
    texts: &'a [&'a str],
}

fn problems(dom: &str, expected: &Expected) -> Vec<String> {
    let mut problems = Vec::new();
    let html_tag = dom
        .find("<html")
        .and_then(|at| dom[at..].find('>').map(|end| &dom[at..at + end]))
        .unwrap_or("");
    if let Some(at) = html_tag.find("data-page-error=") {
        problems.push(format!("the page reported an error: {}", &html_tag[at..]));
    }
    if !html_tag.contains(r#"data-report-ready="1""#) {
        problems.push(format!(
            "the page's script did not run to its end (no data-report-ready): <{html_tag}>"
        ));
    }
    let graphs = format!(r#"data-flame-graphs="{}""#, expected.flame_graphs);
    if !html_tag.contains(&graphs) {
        problems.push(format!(
            "the script found another number of flame graphs than {}: <{html_tag}>",
            expected.flame_graphs
        ));
    }
    if dom.contains("data-injected=") || dom.contains("<img") {
        problems.push("a span name was rendered as markup".to_owned());
    }
    let svgs = flame_svgs(dom);
    if svgs.len() != expected.flame_graphs {
        problems.push(format!(
            "{} flame graphs in the DOM, expected {}",
            svgs.len(),
            expected.flame_graphs
        ));
    }
    let labels: Vec<&str> = svgs.iter().flat_map(|svg| elements(svg, "text")).collect();
    for name in expected.flame_labels {
        if !labels.iter().any(|label| label == name) {
            problems.push(format!("no flame graph frame labelled {name:?}"));
        }
    }
    let endpoint_cells: Vec<&str> = elements(dom, "td")
        .into_iter()
        .filter_map(|cell| cell.split('>').nth(1)?.split('<').next())
        .collect();
    for endpoint in expected.endpoints {
        if !endpoint_cells
            .iter()
            .any(|cell| unescape(cell) == *endpoint)
        {
            problems.push(format!("no table row for the endpoint {endpoint:?}"));
        }
    }
    let text = unescape(dom);
    for wanted in expected.texts {
        if !text.contains(wanted) {
            problems.push(format!("no {wanted:?} in the page"));
        }
    }
    problems
}

/// The `<svg class="flame">` elements of `dom`.
fn flame_svgs(dom: &str) -> Vec<&str> {
    dom.match_indices(r#"<svg class="flame""#)
        .filter_map(|(at, _)| dom[at..].find("</svg>").map(|end| &dom[at..at + end]))
        .collect()
}

/// The contents of every `<tag …>…</tag>` in `html` (not nested in themselves).
fn elements<'a>(html: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}"), format!("</{tag}>"));
    let mut found = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at..];
        let Some(start) = after.find('>') else { break };
        let Some(end) = after.find(&close) else { break };
        if end > start {
            found.push(&after[start + 1..end]);
        }
        rest = &after[end.max(start)..];
    }
    found
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// The fixture run, with `busy_ns` on the `GET /report` spans (90 % of their wall time),
/// `profiling.wall.active_ns` on `GET /search` (60 %) and a span whose name is markup;
/// returns the directory.
fn fixture_run() -> tempfile::TempDir {
    let dir = fixture::both_versions();
    for entry in std::fs::read_dir(dir.path()).expect("fixture dir") {
        let path = entry.expect("entry").path();
        if !path.to_string_lossy().ends_with("_spans.jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("span file");
        let mut lines: Vec<String> = text
            .lines()
            .map(|line| {
                let mut request: Value = serde_json::from_str(line).expect("fixture line");
                add_active_time(&mut request);
                request.to_string()
            })
            .collect();
        if lines.len() == 1 {
            lines.push(hostile_request());
        }
        std::fs::write(&path, lines.join("\n") + "\n").expect("rewrite span file");
    }
    dir
}

fn add_active_time(request: &mut Value) {
    let spans = request["resourceSpans"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .flat_map(|r| r["scopeSpans"].as_array_mut().into_iter().flatten())
        .flat_map(|s| s["spans"].as_array_mut().into_iter().flatten());
    for span in spans {
        // busy_ns (tracing-opentelemetry) on GET /report, the bridge's active time on
        // GET /search; none on the others.
        let (key, tenths) = match span["name"].as_str() {
            Some("GET /report") => ("busy_ns", 9),
            Some("GET /search") => ("profiling.wall.active_ns", 6),
            _ => continue,
        };
        let time = |key: &str| span[key].as_str().and_then(|t| t.parse::<u64>().ok());
        let wall = time("endTimeUnixNano").unwrap_or(0) - time("startTimeUnixNano").unwrap_or(0);
        if let Some(attributes) = span["attributes"].as_array_mut() {
            attributes.push(json!({
                "key": key, "value": {"intValue": (wall / 10 * tenths).to_string()}
            }));
        }
    }
}

fn hostile_request() -> String {
    let start: u64 = 1_700_000_100_000_000_000;
    json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "service.version", "value": {"stringValue": "1.0.0"}}
        ]},
        "scopeSpans": [{"spans": [{
            "traceId": "0000000000000000000000000000beef",
            "spanId": "000000000000beef",
            "name": HOSTILE,
            "startTimeUnixNano": start.to_string(),
            "endTimeUnixNano": (start + 50 * MS).to_string(),
            "attributes": [
                {"key": "pyroscope.profile.id", "value": {"stringValue": "000000000000beef"}}
            ]
        }]}]
    }]})
    .to_string()
}

/// Writes the fixture run's HTML report with the `otel-profiling` binary.
fn write_report(dir: &Path) -> PathBuf {
    let page = dir.join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .arg("report")
        .arg(dir)
        .arg("--html")
        .arg(&page)
        .output()
        .expect("run otel-profiling");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("3 flame graph(s), 2 version diff(s)"),
        "{stdout}"
    );
    page
}

const EXPECTED: Expected = Expected {
    flame_graphs: 3,
    endpoints: &[
        "GET /report",
        "GET /search",
        "GET /orders",
        "GET /health",
        "GET /legacy",
        HOSTILE,
    ],
    flame_labels: &[
        "handle_report",
        "render_rows",
        "encode_json",
        "paginate",
        "search_index",
    ],
    texts: &[
        "CPU-bound",
        "waiting",
        ">busy_ns<br><small>CPU / blocked / awaiting<",
        ">profiling.wall.active_ns<br><small>CPU / blocked / awaiting<",
        // GET /search: 30 of 100 ms on CPU, 60 ms active.
        "CPU 30% · blocked in poll 30% · awaiting 40%",
        ">none<br><small>CPU vs not on CPU<",
        "GET /report: 1.0.0 → 2.0.0, per request",
        "New in 2.0.0",
        // The diff's split: CPU 80 → 160 ms per request grew most, blocked and awaiting
        // 10 ms each.
        "(mean +100.00 ms per request): CPU +80.00 ms (in paginate: its total CPU",
    ],
};

#[test]
fn the_html_report_shows_endpoints_and_flame_graphs_in_headless_chromium() {
    let Some(browser) = chromium() else { return };
    let dir = fixture_run();
    let page = write_report(dir.path());

    let dom = rendered_dom(&browser, &page);
    let found = problems(&dom, &EXPECTED);
    assert!(found.is_empty(), "{}", found.join("\n"));

    let shot = dir.path().join("report.png");
    run_browser(
        &browser,
        &page,
        &[
            format!("--screenshot={}", shot.display()),
            format!("--window-size={},{}", WINDOW.0, WINDOW.1),
        ],
    );
    let (width, height, pixels) = decode_rgb(&shot);
    assert_eq!((width, height), WINDOW, "screenshot size");
    let mut colours: Vec<[u8; 3]> = pixels.clone();
    colours.sort_unstable();
    colours.dedup();
    assert!(
        colours.len() > 100,
        "a nearly blank screenshot: {} colours",
        colours.len()
    );
    // A little tolerance in case a build applies colour management to the screenshot.
    let cpu_bar = pixels
        .iter()
        .filter(|p| p.iter().zip(CPU_COLOUR).all(|(a, b)| a.abs_diff(b) <= 3))
        .count();
    assert!(
        cpu_bar > 500,
        "the CPU bars are not in the screenshot ({cpu_bar} pixels of their colour)"
    );
}

/// The check above fails when the page is broken: a script error, a script that never
/// ends, or flame graphs missing.
#[test]
fn the_browser_check_fails_a_broken_page() {
    let Some(browser) = chromium() else { return };
    let dir = fixture_run();
    let page = write_report(dir.path());
    let html = std::fs::read_to_string(&page).expect("page");

    let broken = |name: &str, html: String| -> Vec<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, html).expect("write broken page");
        problems(&rendered_dom(&browser, &path), &EXPECTED)
    };

    let found = broken(
        "error.html",
        html.replacen(
            "<body>",
            "<body><script>document.body.appendChild(null.child);</script>",
            1,
        ),
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains("the page reported an error")
                && p.contains("Cannot read properties of null")),
        "{found:?}"
    );

    let script_start = html.rfind("<script>").expect("page script");
    let found = broken(
        "no-script.html",
        format!("{}</body></html>", &html[..script_start]),
    );
    assert!(
        found.iter().any(|p| p.contains("did not run to its end")),
        "{found:?}"
    );

    let found = broken(
        "no-flames.html",
        html.replace(r#"<svg class="flame""#, r#"<svg class="gone""#),
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains("0 flame graphs in the DOM")),
        "{found:?}"
    );
    assert!(found.iter().any(|p| p.contains("render_rows")), "{found:?}");
}

/// Width, height and RGB pixels of a PNG file.
fn decode_rgb(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let bytes = std::fs::read(path).expect("screenshot written");
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buffer = vec![0; reader.output_buffer_size().expect("PNG size")];
    let info = reader.next_frame(&mut buffer).expect("PNG pixels");
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Indexed => panic!("palette left unexpanded"),
    };
    let pixels = buffer[..info.buffer_size()]
        .chunks_exact(channels)
        .map(|p| match channels {
            1 | 2 => [p[0]; 3],
            _ => [p[0], p[1], p[2]],
        })
        .collect();
    (info.width, info.height, pixels)
}

/// Without a browser too: the binary writes the page, and refuses a text-only flag with it.
#[test]
fn report_html_writes_one_page_and_refuses_all_frames() {
    let dir = fixture_run();
    let page = write_report(dir.path());
    let html = std::fs::read_to_string(&page).expect("page written");
    assert!(html.starts_with("<!DOCTYPE html>"));
    for text in ["GET /report", "render_rows", "New in 2.0.0"] {
        assert!(html.contains(text), "no {text:?} in the page");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_otel-profiling"))
        .arg("report")
        .arg(dir.path())
        .args(["--all-frames", "--html"])
        .arg(dir.path().join("other.html"))
        .output()
        .expect("run otel-profiling");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all-frames"));
    assert!(!dir.path().join("other.html").exists());
}
