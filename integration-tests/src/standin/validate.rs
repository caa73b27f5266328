//! Pyroscope's ingest validation, as the stand-in applies it: series labels
//! (`validation.ValidateLabels`) and whole profiles (`validation.ValidateProfile`), both in
//! grafana/pyroscope v2.2.1 `pkg/validation/validate.go`. Error texts follow the `...ErrorMsg`
//! constants there, so a client sees the same message shape.

use otel_profiling_pprof::Profile;

use super::limits::{Limits, Reason};

/// Why a profile or a push was refused, with the Connect code and HTTP status Pyroscope
/// answers with (`invalid_argument` 400, `resource_exhausted` 429, `unknown` 500).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushRejection {
    /// HTTP status.
    pub status: u16,
    /// Connect error code (`{"code": ...}` of the JSON body).
    pub code: &'static str,
    /// Pyroscope's discard reason; `None` for a push that is not a profile at all.
    pub reason: Option<Reason>,
    /// The `message` of the JSON body.
    pub message: String,
}

impl PushRejection {
    /// A validation error: 400 `invalid_argument`.
    pub(crate) fn invalid(reason: Option<Reason>, message: String) -> PushRejection {
        PushRejection {
            status: 400,
            code: "invalid_argument",
            reason,
            message,
        }
    }

    /// The rate limiter refused: 429 `resource_exhausted`.
    pub(crate) fn rate_limited(message: String) -> PushRejection {
        PushRejection {
            status: 429,
            code: "resource_exhausted",
            reason: Some(Reason::RateLimited),
            message,
        }
    }

    /// An error Pyroscope does not classify (undecodable gzip or pprof): Connect's
    /// `unknown`, HTTP 500.
    pub(crate) fn unknown(message: String) -> PushRejection {
        PushRejection {
            status: 500,
            code: "unknown",
            reason: Some(Reason::MalformedProfile),
            message,
        }
    }
}

/// `phlaremodel.LabelPairsString`: `{a="x", b="y"}`.
pub(crate) fn labels_string(labels: &[(String, String)]) -> String {
    let pairs: Vec<String> = labels.iter().map(|(n, v)| format!("{n}={v:?}")).collect();
    format!("{{{}}}", pairs.join(", "))
}

/// `SanitizeLegacyLabelName`: `[a-zA-Z_][a-zA-Z0-9_]*` with dots allowed and turned into
/// underscores; `None` when the name is invalid.
fn sanitize_label_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return None;
    }
    let valid = name.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == '.' || (c.is_ascii_digit() && i > 0)
    });
    valid.then(|| name.replace('.', "_"))
}

/// Validates (and sanitizes) one series' labels the way Pyroscope's distributor does for
/// every series a profile is split into: sorted by name, then the count, `__name__`,
/// `service_name`, and per label the name length, value length, name syntax and
/// duplicates, in that order. Returns the labels to store.
pub(crate) fn validate_labels(
    limits: &Limits,
    mut ls: Vec<(String, String)>,
) -> Result<Vec<(String, String)>, PushRejection> {
    let err = |reason, msg| Err(PushRejection::invalid(Some(reason), msg));
    if ls.is_empty() {
        return err(
            Reason::MissingLabels,
            "error at least one label pair is required per profile".into(),
        );
    }
    ls.sort_by(|a, b| a.0.cmp(&b.0));
    if ls.len() > limits.max_label_names_per_series {
        return err(
            Reason::MaxLabelNamesPerSeries,
            format!(
                "profile series '{}' has {} label names; limit {}",
                labels_string(&ls),
                ls.len(),
                limits.max_label_names_per_series
            ),
        );
    }
    let get = |ls: &[(String, String)], name: &str| {
        ls.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    // Any non-empty UTF-8 metric name is valid (Prometheus' UTF-8 validation).
    if get(&ls, "__name__").is_empty() {
        return err(
            Reason::InvalidLabels,
            format!(
                "invalid labels '{}' with error: invalid metric name",
                labels_string(&ls)
            ),
        );
    }
    if get(&ls, "service_name").is_empty() {
        return err(
            Reason::MissingLabels,
            format!(
                "invalid labels '{}' with error: service name is not provided",
                labels_string(&ls)
            ),
        );
    }
    let mut last: Option<String> = None;
    let mut i = 0;
    while i < ls.len() {
        let (name, value) = ls[i].clone();
        if name.len() > limits.max_label_name_length {
            return err(
                Reason::LabelNameTooLong,
                format!(
                    "profile with labels '{}' has label name too long: '{name}'",
                    labels_string(&ls)
                ),
            );
        }
        if value.len() > limits.max_label_value_length {
            return err(
                Reason::LabelValueTooLong,
                format!(
                    "profile with labels '{}' has label value too long: '{value}'",
                    labels_string(&ls)
                ),
            );
        }
        let Some(sanitized) = sanitize_label_name(&name) else {
            return err(
                Reason::InvalidLabels,
                format!(
                    "invalid labels '{}' with error: invalid label name '{name}'",
                    labels_string(&ls)
                ),
            );
        };
        if sanitized != name {
            // Re-insert under the sanitized name; the same name and value merge, the same
            // name with another value is a duplicate.
            let original = labels_string(&ls);
            ls.remove(i);
            match ls.binary_search_by(|(n, _)| n.as_str().cmp(&sanitized)) {
                Ok(j) if ls[j].1 == value => {}
                Ok(_) => {
                    return err(
                        Reason::DuplicateLabelNames,
                        format!(
                            "profile with labels '{original}' has duplicate label name \
                             '{sanitized}' after label name sanitization from '{name}'"
                        ),
                    )
                }
                Err(j) => {
                    ls.insert(j, (sanitized, value));
                    i = i.min(j);
                }
            }
            last = i.checked_sub(1).map(|p| ls[p].0.clone());
            continue;
        }
        if last.as_deref() == Some(name.as_str()) {
            return err(
                Reason::DuplicateLabelNames,
                format!(
                    "profile with labels '{}' has duplicate label name: '{name}'",
                    labels_string(&ls)
                ),
            );
        }
        last = Some(name);
        i += 1;
    }
    Ok(ls)
}

/// `ValidateProfile` (without the ingestion window, which the stand-in does not apply):
/// emptiness, decompressed size, sample count, labels per sample, value lengths; then the
/// string-table and id checks of `otel_profiling_pprof::decode` stand for Pyroscope's
/// `validateStringTableAccess` and id checks. `series` is the sorted series labels (for the
/// message), `size` the decompressed pprof size, `plain` those bytes.
pub(crate) fn validate_profile(
    limits: &Limits,
    profile: &Profile,
    series: &[(String, String)],
    size: usize,
    plain: &[u8],
) -> Result<(), PushRejection> {
    let malformed = |m: &str| {
        Err(PushRejection::invalid(
            Some(Reason::MalformedProfile),
            m.into(),
        ))
    };
    if profile.sample_type.is_empty() {
        return malformed("empty profile");
    }
    let limit = limits.max_profile_size_bytes;
    if limit != 0 && size > limit {
        return Err(PushRejection::invalid(
            Some(Reason::ProfileSizeLimit),
            format!(
                "the profile with labels '{}' exceeds the size limit (max_profile_size_byte, \
                 actual: {size}, limit: {limit})",
                labels_string(series)
            ),
        ));
    }
    let limit = limits.max_profile_samples;
    if limit != 0 && profile.sample.len() > limit {
        return Err(PushRejection::invalid(
            Some(Reason::SamplesLimit),
            format!(
                "the profile with labels '{}' exceeds the samples count limit \
                 (max_profile_stacktrace_samples, actual: {}, limit: {limit})",
                labels_string(series),
                profile.sample.len()
            ),
        ));
    }
    let limit = limits.max_sample_labels;
    if let Some(s) = profile
        .sample
        .iter()
        .find(|s| limit != 0 && s.label.len() > limit)
    {
        return Err(PushRejection::invalid(
            Some(Reason::SampleLabelsLimit),
            format!(
                "the profile with labels '{}' exceeds the sample labels limit \
                 (max_profile_stacktrace_sample_labels, actual: {}, limit: {limit})",
                labels_string(series),
                s.label.len()
            ),
        ));
    }
    if profile
        .sample
        .iter()
        .any(|s| s.value.len() != profile.sample_type.len())
    {
        return malformed("sample value length mismatch");
    }
    if let Err(e) = otel_profiling_pprof::decode(plain) {
        return malformed(&e.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(ls: &[(&str, &str)]) -> Vec<(String, String)> {
        ls.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn base() -> Vec<(String, String)> {
        pairs(&[("service_name", "svc"), ("__name__", "process_cpu")])
    }

    #[test]
    fn valid_labels_come_back_sorted() {
        let ok = validate_labels(&Limits::default(), base()).unwrap();
        assert_eq!(
            ok,
            pairs(&[("__name__", "process_cpu"), ("service_name", "svc")])
        );
    }

    #[test]
    fn a_value_over_2048_bytes_is_refused_and_2048_is_not() {
        let limits = Limits::default();
        let mut ls = base();
        ls.push(("span_name".into(), "x".repeat(2048)));
        assert!(validate_labels(&limits, ls.clone()).is_ok());
        ls[2].1.push('x');
        let e = validate_labels(&limits, ls).unwrap_err();
        assert_eq!((e.status, e.reason), (400, Some(Reason::LabelValueTooLong)));
        assert!(
            e.message.contains("has label value too long: 'xxx"),
            "{e:?}"
        );
    }

    #[test]
    fn thirty_label_names_pass_thirty_one_do_not() {
        let limits = Limits::default();
        let mut ls = base();
        ls.extend((0..28).map(|i| (format!("l{i:02}"), "v".to_string())));
        assert!(validate_labels(&limits, ls.clone()).is_ok());
        ls.push(("span_name".into(), "GET /".into()));
        let e = validate_labels(&limits, ls).unwrap_err();
        assert_eq!(e.reason, Some(Reason::MaxLabelNamesPerSeries));
        assert!(e.message.ends_with("has 31 label names; limit 30"), "{e:?}");
    }

    #[test]
    fn name_length_syntax_and_duplicates() {
        let limits = Limits::default();
        let mut ls = base();
        ls.push(("much_too_long".into(), "v".into()));
        let e = validate_labels(&Limits::default().with_max_label_name_length(12), ls).unwrap_err();
        assert_eq!(e.reason, Some(Reason::LabelNameTooLong));

        let mut ls = base();
        ls.push(("9lives".into(), "v".into()));
        let e = validate_labels(&limits, ls).unwrap_err();
        assert_eq!(e.reason, Some(Reason::InvalidLabels));

        let mut ls = base();
        ls.push(("env".into(), "a".into()));
        ls.push(("env".into(), "b".into()));
        let e = validate_labels(&limits, ls).unwrap_err();
        assert_eq!(e.reason, Some(Reason::DuplicateLabelNames));
    }

    #[test]
    fn dots_become_underscores_and_clash_only_with_another_value() {
        let limits = Limits::default();
        let mut ls = base();
        ls.push(("k8s.pod".into(), "p".into()));
        let ok = validate_labels(&limits, ls.clone()).unwrap();
        assert!(ok.contains(&("k8s_pod".into(), "p".into())), "{ok:?}");
        ls.push(("k8s_pod".into(), "p".into()));
        assert_eq!(validate_labels(&limits, ls.clone()).unwrap().len(), 3);
        ls.pop();
        ls.push(("k8s_pod".into(), "q".into()));
        let e = validate_labels(&limits, ls).unwrap_err();
        assert_eq!(e.reason, Some(Reason::DuplicateLabelNames));
    }

    #[test]
    fn name_and_service_name_are_required() {
        let limits = Limits::default();
        let e = validate_labels(&limits, pairs(&[("service_name", "s")])).unwrap_err();
        assert_eq!(e.reason, Some(Reason::InvalidLabels));
        let e = validate_labels(&limits, pairs(&[("__name__", "process_cpu")])).unwrap_err();
        assert_eq!(e.reason, Some(Reason::MissingLabels));
    }
}
