//! `otel-profiling`: the span report, flame graphs and version diffs from the directories
//! otel-profiling's local sink writes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{ArgGroup, CommandFactory, Parser, Subcommand};
use otel_profiling_cli::diff::VersionDiff;
use otel_profiling_cli::flame::{FlameGraph, FlameSelection};
use otel_profiling_cli::html::HtmlReport;
use otel_profiling_cli::input::Input;
use otel_profiling_cli::report::SpanReport;
use otel_profiling_cli::ReportError;

/// Per-span CPU against wall time, flame graphs and version diffs from otel-profiling's
/// local files (`*_cpu.pb.gz` profiles and `*_spans.jsonl` OTLP JSON spans).
#[derive(Parser)]
#[command(name = "otel-profiling", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per span name and service.version: count, wall p50/p95, CPU from the profile and
    /// from the span attributes, CPU/wall, verdict and top functions.
    Report {
        /// Directories written by the local sink.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// List every frame in the top functions, runtime and libraries included, rather
        /// than your own code first with the rest grouped by crate.
        #[arg(long)]
        all_frames: bool,
        /// A crate to count as your code, beside those detected from the binary's source
        /// paths (repeatable; `-` and `_` alike).
        #[arg(long = "crate", value_name = "NAME")]
        crates: Vec<String>,
        /// Write the report as one self-contained HTML page to this file instead (the
        /// table with the CPU / blocked / awaiting split as bars, verdicts, a flame graph
        /// per endpoint and version, the version diffs); it opens from disk, no network.
        #[arg(long, value_name = "PATH")]
        html: Option<PathBuf>,
    },
    /// An SVG flame graph of one span (by id) or of every span of one name.
    #[command(group(ArgGroup::new("selection").required(true).args(["span_id", "span_name"])))]
    Flame {
        /// Directory written by the local sink.
        dir: PathBuf,
        /// Span id of a local root span (16 hex digits).
        #[arg(long)]
        span_id: Option<String>,
        /// Span name.
        #[arg(long)]
        span_name: Option<String>,
        /// With --span-name: only the spans of this service.version (else every version
        /// is drawn, merged, and the subtitle lists them).
        #[arg(long, requires = "span_name", value_name = "V")]
        service_version: Option<String>,
        /// Where to write the SVG.
        #[arg(short, long)]
        output: PathBuf,
        /// Draw what the service's threads did while the span(s) ran — the other work in
        /// the profile windows around them, titled as such — instead of their own samples
        /// (for spans with none: unsampled, too short, or not computing).
        #[arg(long)]
        concurrent: bool,
        /// Count this crate as your code (drawn in blue) beside those detected from the
        /// source paths (repeatable; `-` and `_` alike).
        #[arg(long = "crate", value_name = "NAME")]
        crates: Vec<String>,
    },
    /// One span name, per request, in two versions (one directory, --from/--to) or in two
    /// directories: each version's CPU / blocked in poll / queued / awaiting split and
    /// verdict, which part grew, and which functions' CPU grew.
    Diff {
        /// One directory (with --from and --to) or two (before, after).
        #[arg(required = true, num_args = 1..=2)]
        dirs: Vec<PathBuf>,
        /// The span name to compare.
        #[arg(long)]
        span_name: String,
        /// The old service.version.
        #[arg(long, requires = "to")]
        from: Option<String>,
        /// The new service.version.
        #[arg(long, requires = "from")]
        to: Option<String>,
        /// A crate to count as your code, beside those detected from the binary's source
        /// paths (repeatable; `-` and `_` alike).
        #[arg(long = "crate", value_name = "NAME")]
        crates: Vec<String>,
    },
    /// One operation where production data lives: its trace from Tempo, its profiles from
    /// Pyroscope (selected as Grafana's "Profiles for this span" selects them), the
    /// report's verdict and top functions, and a comparison with healthy requests
    /// (docs/investigate.md). Credentials from TEMPO_AUTH_TOKEN,
    /// TEMPO_BASIC_AUTH_USER/_PASSWORD, TEMPO_TENANT_ID and their PYROSCOPE_* twins.
    #[cfg(feature = "backends")]
    Investigate(Box<InvestigateArgs>),
}

#[cfg(feature = "backends")]
#[derive(clap::Args)]
struct InvestigateArgs {
    /// Tempo's query API, e.g. http://localhost:3200.
    #[arg(long, env = "TEMPO_URL", value_name = "URL")]
    tempo: String,
    /// Pyroscope's API, e.g. http://localhost:4040.
    #[arg(long, env = "PYROSCOPE_URL", value_name = "URL")]
    pyroscope: String,
    /// The trace (32 hex digits): one operation.
    #[arg(
        long,
        value_name = "ID",
        required_unless_present = "span_name",
        conflicts_with = "span_name"
    )]
    trace_id: Option<String>,
    /// With --service: the endpoint over time (--since), per version, instead of one
    /// operation.
    #[arg(long, value_name = "NAME", requires = "service")]
    span_name: Option<String>,
    /// The service.name of --span-name's endpoint.
    #[arg(long, value_name = "S", requires = "span_name")]
    service: Option<String>,
    /// With --span-name: how many of each version's slowest spans are read in full.
    #[arg(long, value_name = "N", default_value_t = otel_profiling_cli::investigate::DEFAULT_SPANS_PER_VERSION)]
    spans_per_version: usize,
    /// The span (16 hex digits); default: the trace's slowest local root.
    #[arg(long, value_name = "ID")]
    span_id: Option<String>,
    /// A crate to count as your code (repeatable; `-` and `_` alike).
    #[arg(long = "crate", value_name = "NAME")]
    crates: Vec<String>,
    /// Compare with this service.version (default: the most recent other version seen
    /// for the same span name in the --since window).
    #[arg(long, value_name = "V", conflicts_with_all = ["baseline_since", "no_control"])]
    baseline_version: Option<String>,
    /// Compare with the same span name and version in a window of the same length ending
    /// this long before the operation (`1h`, `1d` is `24h`).
    #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with = "no_control")]
    baseline_since: Option<std::time::Duration>,
    /// No comparison with other requests.
    #[arg(long)]
    no_control: bool,
    /// Compare only requests within ±25 % of the operation's value of this attribute
    /// (default: http.response.body.size when the span carries it).
    #[arg(long, value_name = "NAME")]
    size_attribute: Option<String>,
    /// How far back the comparison's search (or --span-name's) looks.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "1h")]
    since: std::time::Duration,
    /// The services' profile upload interval: a profile is stamped at its interval's
    /// start, so queries start this much earlier.
    #[arg(long, env = "PYROSCOPE_UPLOAD_INTERVAL", value_name = "DURATION", value_parser = duration, default_value = "15s")]
    upload_interval: std::time::Duration,
    /// Bound of each request to the backends.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "30s")]
    timeout: std::time::Duration,
    /// Print the investigation as JSON (schema: docs/investigate.md).
    #[arg(long, conflicts_with = "html")]
    json: bool,
    /// Also write the report's HTML page of what was read (the span, or the endpoint's
    /// spans per version) to this file.
    #[arg(long, value_name = "PATH")]
    html: Option<PathBuf>,
}

/// A duration as the bridge's variables take it (`15s`, `500ms`, `2h`).
#[cfg(feature = "backends")]
fn duration(s: &str) -> Result<std::time::Duration, String> {
    otel_profiling::config::parse_duration(s)
        .ok_or_else(|| format!("{s:?}: expected a duration like 15s, 500ms, 10m or 2h"))
}

#[cfg(feature = "backends")]
fn investigate(args: InvestigateArgs) -> Result<(), ReportError> {
    use otel_profiling_cli::investigate::{
        Backends, Baseline, EndpointQuery, EndpointReport, Investigation, OperationQuery,
    };
    let backends = Backends::from_urls(&args.tempo, &args.pyroscope, args.timeout)
        .map_err(otel_profiling_cli::investigate::InvestigateError::from)?;
    let (Some(trace_id), None) = (&args.trace_id, &args.span_name) else {
        let mut query = EndpointQuery::new(
            args.service.as_deref().unwrap_or_default(),
            args.span_name.as_deref().unwrap_or_default(),
            args.since,
        );
        query.user_crates = args.crates;
        query.upload_interval = args.upload_interval;
        query.spans_per_version = args.spans_per_version.max(1);
        let report = EndpointReport::run(&backends, &query)?;
        if let Some(path) = &args.html {
            HtmlReport::from_input(&report.input).write_file(path)?;
            eprintln!("wrote {}", path.display());
        }
        return if args.json {
            emit(&format!("{:#}\n", report.to_json()))
        } else {
            emit(&report)
        };
    };
    let mut query = OperationQuery::of_trace(trace_id);
    query.span_id = args.span_id;
    query.user_crates = args.crates;
    query.upload_interval = args.upload_interval;
    query.size_attribute = args.size_attribute;
    query.search_window = args.since;
    query.baseline = match (args.no_control, args.baseline_version, args.baseline_since) {
        (true, _, _) => Baseline::Off,
        (_, Some(v), _) => Baseline::Version(v),
        (_, None, Some(ago)) => Baseline::Since(ago),
        (false, None, None) => Baseline::OtherVersion,
    };
    let investigation = Investigation::run(&backends, &query)?;
    if let Some(path) = &args.html {
        HtmlReport::from_input(&investigation.input).write_file(path)?;
        eprintln!("wrote {}", path.display());
    }
    let text = if args.json {
        format!("{:#}\n", investigation.to_json())
    } else {
        investigation.to_string()
    };
    emit(&text)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), ReportError> {
    match command {
        Command::Report {
            dirs,
            all_frames,
            crates,
            html: Some(path),
        } => {
            if all_frames {
                usage_error(
                    "report",
                    "--all-frames applies to the text report, not --html",
                );
            }
            let page = HtmlReport::from_input(&load(&dirs, crates)?);
            page.write_file(&path)?;
            let report = page.report();
            println!(
                "wrote {}: {} span group(s), {} flame graph(s), {} version diff(s)",
                path.display(),
                report.groups.len(),
                report
                    .groups
                    .iter()
                    .filter(|g| g.profile_cpu_ns > 0)
                    .count(),
                page.diffs().len()
            );
        }
        Command::Report {
            dirs,
            all_frames,
            crates,
            html: None,
        } => {
            let mut report = SpanReport::from_input(&load(&dirs, crates)?);
            report.all_frames = all_frames;
            emit(&report)?;
        }
        Command::Flame {
            dir,
            span_id,
            span_name,
            service_version,
            output,
            concurrent,
            crates,
        } => {
            let selection = match (span_id, span_name, service_version) {
                (Some(id), _, _) => FlameSelection::SpanId(id),
                (None, Some(name), None) => FlameSelection::SpanName(name),
                (None, Some(name), Some(version)) => {
                    FlameSelection::SpanNameInVersion { name, version }
                }
                (None, None, _) => usage_error("flame", "give --span-id or --span-name"),
            };
            let input = load(&[dir], crates)?;
            let graph = if concurrent {
                FlameGraph::concurrent_from_input(&input, &selection)?
            } else {
                FlameGraph::from_input(&input, &selection)?
            };
            write_svg(&graph, &output)?;
            println!(
                "wrote {}: {} ({})",
                output.display(),
                graph.title,
                graph.subtitle
            );
        }
        Command::Diff {
            dirs,
            span_name,
            from,
            to,
            crates,
        } => {
            let diff = match (dirs.as_slice(), from, to) {
                ([dir], Some(from), Some(to)) => VersionDiff::between_versions_in(
                    &load(std::slice::from_ref(dir), crates)?,
                    &span_name,
                    &from,
                    &to,
                )?,
                ([_], _, _) => usage_error(
                    "diff",
                    "with one directory, give --from and --to (the two service.version values)",
                ),
                ([before, after], None, None) => VersionDiff::between_inputs(
                    &load(std::slice::from_ref(before), crates.clone())?,
                    &load(std::slice::from_ref(after), crates)?,
                    &span_name,
                )?,
                _ => usage_error(
                    "diff",
                    "give one directory with --from and --to, or two directories",
                ),
            };
            emit(&diff)?;
        }
        #[cfg(feature = "backends")]
        Command::Investigate(args) => investigate(*args)?,
    }
    Ok(())
}

/// Reads `dirs`, counting `crates` as the user's code beside those detected.
fn load(dirs: &[PathBuf], crates: Vec<String>) -> Result<Input, ReportError> {
    let mut input = Input::load(dirs)?;
    input.user_crates = crates;
    Ok(input)
}

/// Writes `text` to standard output. A reader that stopped reading (`report | head`) is
/// not an error: the output it wanted was written.
fn emit(text: &impl std::fmt::Display) -> Result<(), ReportError> {
    let mut out = std::io::stdout().lock();
    match write!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(ReportError::Io {
            path: PathBuf::from("<standard output>"),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn write_svg(graph: &FlameGraph, path: &Path) -> Result<(), ReportError> {
    let io = |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    graph.write_svg(&mut out)?;
    out.flush().map_err(io)
}

/// Exits with clap's usage error for `subcommand`.
fn usage_error(subcommand: &str, message: &str) -> ! {
    let mut command = Cli::command();
    command.build();
    match command.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(ErrorKind::ArgumentConflict, message).exit(),
        None => command.error(ErrorKind::ArgumentConflict, message).exit(),
    }
}
