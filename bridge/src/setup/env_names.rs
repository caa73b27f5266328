//! The names of the environment variables under this crate's prefixes (`OTEL_PROFILING_`,
//! `PYROSCOPE_`, `OTEL_EXPORTER_OTLP_`): which ones it reads, and which the OpenTelemetry
//! specification defines for other signals. Every setting the specification defines for
//! traces and profiles is read (a test holds the reader to it). Anything else is a typo
//! until shown otherwise: setup names it, with the closest variable it may have meant,
//! instead of silently falling back to local files.

/// Read by this crate (see [`crate::config`]), and the test suite's own switches.
const READ: &[&str] = &[
    "OTEL_PROFILING_OUTPUT_DIR",
    "OTEL_PROFILING_OUTPUT_MAX_BYTES",
    "OTEL_PROFILING_ALLOC_SAMPLE_BYTES",
    "OTEL_PROFILING_ALLOC_INUSE",
    "OTEL_PROFILING_MAX_LIVE_ROOTS",
    "OTEL_PROFILING_BLOCKED_THRESHOLD",
    "OTEL_PROFILING_PROFILES_EXPORTER",
    "OTEL_PROFILING_QUIET",
    "OTEL_PROFILING_THREAD_CONTEXT",
    "OTEL_PROFILING_BLESS",
    "OTEL_PROFILING_REQUIRE_GO",
    "OTEL_PROFILING_SKIP_GO",
    "OTEL_PROFILING_REQUIRE_PYTHON_OTLP",
    "OTEL_PROFILING_REQUIRE_BROWSER",
    "PYROSCOPE_SERVER_ADDRESS",
    "PYROSCOPE_APPLICATION_NAME",
    "PYROSCOPE_BASIC_AUTH_USER",
    "PYROSCOPE_BASIC_AUTH_PASSWORD",
    "PYROSCOPE_AUTH_TOKEN",
    "PYROSCOPE_TENANT_ID",
    "PYROSCOPE_SAMPLE_RATE",
    "PYROSCOPE_UPLOAD_INTERVAL",
    "PYROSCOPE_LABELS",
    "PYROSCOPE_HTTP_HEADERS",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
    "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_PROFILES_INSECURE",
];

/// The per-signal settings the specification defines (`OTEL_EXPORTER_OTLP_[SIGNAL_]<X>`).
const SETTINGS: &[&str] = &[
    "ENDPOINT",
    "PROTOCOL",
    "HEADERS",
    "TIMEOUT",
    "COMPRESSION",
    "CERTIFICATE",
    "CLIENT_KEY",
    "CLIENT_CERTIFICATE",
    "INSECURE",
];

/// What setup says about one variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EnvNote {
    /// Neither read here nor defined by the specification: a typo, most likely.
    Unknown {
        name: String,
        closest: Option<&'static str>,
    },
}

impl EnvNote {
    /// The one line setup writes.
    pub(crate) fn line(&self, local_files: Option<&std::path::Path>) -> String {
        let lost = local_files.map_or_else(String::new, |dir| {
            format!(
                "; no backend is configured, so the data goes to local files in {}",
                dir.display()
            )
        });
        match self {
            EnvNote::Unknown { name, closest } => {
                let hint = closest.map_or_else(String::new, |c| format!(" (did you mean {c}?)"));
                format!("otel-profiling: {name} is not a variable otel-profiling reads{hint}: it is ignored{lost}")
            }
        }
    }
}

/// The notes for `names` (the process's variable names), in their order.
pub(crate) fn check<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<EnvNote> {
    let mut notes = Vec::new();
    for name in names {
        let ours = ["OTEL_PROFILING_", "PYROSCOPE_", "OTEL_EXPORTER_OTLP_"]
            .iter()
            .any(|p| name.starts_with(p));
        if !ours || READ.contains(&name) {
            continue;
        }
        if let Some(rest) = name.strip_prefix("OTEL_EXPORTER_OTLP_") {
            let (signal, setting) = match ["TRACES_", "METRICS_", "LOGS_", "PROFILES_"]
                .iter()
                .find_map(|s| rest.strip_prefix(s).map(|r| (Some(*s), r)))
            {
                Some(split) => split,
                None => (None, rest),
            };
            let defined = SETTINGS.contains(&setting)
                || (signal == Some("METRICS_")
                    && matches!(
                        setting,
                        "TEMPORALITY_PREFERENCE" | "DEFAULT_HISTOGRAM_AGGREGATION"
                    ));
            // Other signals' settings are another SDK's business (ours are all in READ).
            if defined && matches!(signal, Some("METRICS_") | Some("LOGS_")) {
                continue;
            }
        }
        notes.push(EnvNote::Unknown {
            name: name.to_owned(),
            closest: closest(name),
        });
    }
    notes
}

/// The read variable nearest `name` by edit distance, if near enough to be meant.
fn closest(name: &str) -> Option<&'static str> {
    READ.iter()
        .map(|known| (distance(name, known), *known))
        .filter(|(d, known)| *d <= (known.len() / 5).max(2))
        .min()
        .map(|(_, known)| known)
}

/// Levenshtein distance over bytes (the names are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(x != y));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_name_the_variable_meant_and_known_ones_pass() {
        let notes = check([
            "PYROSCOPE_SERVER_ADDRES",
            "OTEL_EXPORTER_OTLP_ENDPIONT",
            "OTEL_PROFILING_OUTPUTDIR",
            "PYROSCOPE_SERVER_ADDRESS",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
            "OTEL_SERVICE_NAME",
            "HOME",
        ]);
        assert_eq!(
            notes,
            [
                EnvNote::Unknown {
                    name: "PYROSCOPE_SERVER_ADDRES".into(),
                    closest: Some("PYROSCOPE_SERVER_ADDRESS"),
                },
                EnvNote::Unknown {
                    name: "OTEL_EXPORTER_OTLP_ENDPIONT".into(),
                    closest: Some("OTEL_EXPORTER_OTLP_ENDPOINT"),
                },
                EnvNote::Unknown {
                    name: "OTEL_PROFILING_OUTPUTDIR".into(),
                    closest: Some("OTEL_PROFILING_OUTPUT_DIR"),
                },
            ]
        );
        let line = notes[0].line(Some(std::path::Path::new("/srv/out")));
        assert_eq!(
            line,
            "otel-profiling: PYROSCOPE_SERVER_ADDRES is not a variable otel-profiling reads \
             (did you mean PYROSCOPE_SERVER_ADDRESS?): it is ignored; no backend is configured, \
             so the data goes to local files in /srv/out"
        );
    }

    /// Every setting the specification defines for traces, profiles and all signals is in
    /// READ, and the reader really asks for it (so none is listed without being applied).
    #[test]
    fn every_specified_setting_of_our_signals_is_read() {
        let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let config = crate::config::EnvConfig::from_lookup(|name| {
            asked.borrow_mut().insert(name.to_string());
            // Only the generic endpoint: then every signal's own variable is asked for too.
            (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://localhost:4318".to_string())
        });
        assert!(config.is_ok(), "{config:?}");
        for signal in ["", "TRACES_", "PROFILES_"] {
            for setting in SETTINGS {
                let name = format!("OTEL_EXPORTER_OTLP_{signal}{setting}");
                assert!(READ.contains(&name.as_str()), "{name} is not in READ");
                assert!(asked.borrow().contains(&name), "{name} is never read");
            }
        }
        assert_eq!(
            check([
                "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                "PYROSCOPE_LOG_LEVEL",
            ]),
            [EnvNote::Unknown {
                name: "PYROSCOPE_LOG_LEVEL".into(),
                closest: None
            }]
        );
    }
}
