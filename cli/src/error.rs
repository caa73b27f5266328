//! Everything that can go wrong reading a directory or answering a question about it.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// What the local sink writes, for messages about a directory that lacks it.
pub const EXPECTED_FILES: &str =
    "`<UTC stamp>_cpu.pb.gz` (pprof CPU profiles) and `<UTC stamp>_spans.jsonl` (OTLP JSON spans), \
     as otel-profiling's local sink writes them";

/// An error of the span report tool; each message names the file or value at fault.
#[derive(Debug, Error)]
pub enum ReportError {
    /// No directory was given.
    #[error("no directory given: expected one or more directories holding {EXPECTED_FILES}")]
    NoDirectories,

    /// A directory does not exist (or is not a directory).
    #[error("{}: no such directory; expected a directory holding {EXPECTED_FILES}", path.display())]
    DirectoryMissing {
        /// The path given.
        path: PathBuf,
    },

    /// A directory holds neither profiles nor span files.
    #[error("{}: no profile or span files in this directory; expected {EXPECTED_FILES}", path.display())]
    DirectoryEmpty {
        /// The directory.
        path: PathBuf,
    },

    /// A directory or file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A `*_cpu.pb.gz` file is not a valid (gzipped) pprof profile.
    #[error("{}: not a valid pprof profile: {message}", path.display())]
    CorruptProfile {
        /// The profile file.
        path: PathBuf,
        /// The decoder's message.
        message: String,
    },

    /// A line of a `*_spans.jsonl` file is not an OTLP JSON `ExportTraceServiceRequest`.
    #[error("{}:{line}: not an OTLP JSON ExportTraceServiceRequest: {message}", path.display())]
    MalformedSpanLine {
        /// The span file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },

    /// A span id given on the command line is not 16 hex digits.
    #[error("span id {id:?} is not 16 hexadecimal digits")]
    InvalidSpanId {
        /// The id as given.
        id: String,
    },

    /// No span and no sample has this span id.
    #[error("span id {id} is in no span file and no profile sample of the directories read")]
    UnknownSpanId {
        /// The id (lowercase).
        id: String,
    },

    /// No span and no sample has this span name.
    #[error("no span named {name:?} in {}; span names found: {}", place.display(), list_or_none(known))]
    UnknownSpanName {
        /// The name as given.
        name: String,
        /// The directory (or first directory) searched.
        place: PathBuf,
        /// The span names that do exist, sorted.
        known: Vec<String>,
    },

    /// The span name has no spans of this `service.version`.
    #[error(
        "no {span_name:?} spans of service.version {version:?}; versions found: {}",
        list_or_none(available)
    )]
    UnknownVersion {
        /// The span name.
        span_name: String,
        /// The version asked for.
        version: String,
        /// The versions that do exist for this span name, sorted (`(none)` for spans of a
        /// resource without `service.version`).
        available: Vec<String>,
    },

    /// The selection exists but has no CPU samples, so there is nothing to draw.
    #[error("{selection} has no CPU samples: {reason}")]
    NoSamples {
        /// What was selected.
        selection: String,
        /// Why there are none.
        reason: String,
    },

    /// Writing the flame graph failed.
    #[error("drawing the flame graph: {0}")]
    Flamegraph(#[source] io::Error),

    /// `investigate`: a backend failed, or the trace or span is not there.
    #[cfg(feature = "backends")]
    #[error(transparent)]
    Investigate(#[from] crate::investigate::InvestigateError),
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
