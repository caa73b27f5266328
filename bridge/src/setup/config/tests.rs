use super::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> Result<EnvConfig, ConfigError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    EnvConfig::from_lookup(|name| map.get(name).cloned())
}

fn err_field(pairs: &[(&str, &str)]) -> &'static str {
    match env(pairs) {
        Err(e) => e.field,
        Ok(c) => panic!("expected an error for {pairs:?}, got {c:?}"),
    }
}

#[test]
fn nothing_set_means_nothing_configured() {
    assert_eq!(env(&[]).expect("empty env"), EnvConfig::default());
    // Empty counts as unset.
    assert_eq!(
        env(&[("PYROSCOPE_SERVER_ADDRESS", " ")]).expect("blank"),
        EnvConfig::default()
    );
}

#[test]
fn service_name_prefers_otel_then_pyroscope() {
    let c = env(&[
        ("OTEL_SERVICE_NAME", "checkout"),
        ("PYROSCOPE_APPLICATION_NAME", "x"),
    ])
    .expect("ok");
    assert_eq!(c.service_name.as_deref(), Some("checkout"));
    let c = env(&[("PYROSCOPE_APPLICATION_NAME", "ride-sharing")]).expect("ok");
    assert_eq!(c.service_name.as_deref(), Some("ride-sharing"));
}

#[test]
fn resource_attributes_valid_and_malformed() {
    let c = env(&[(
        "OTEL_RESOURCE_ATTRIBUTES",
        "service.version=1.2.3, deployment.environment=prod,team=a%2Cb",
    )])
    .expect("ok");
    assert_eq!(
        c.resource_attributes,
        vec![
            ("service.version".into(), "1.2.3".into()),
            ("deployment.environment".into(), "prod".into()),
            ("team".into(), "a,b".into()),
        ]
    );
    for bad in ["novalue", "=x", "k=%zz", "k=%4"] {
        let e = env(&[("OTEL_RESOURCE_ATTRIBUTES", bad)]).expect_err(bad);
        assert_eq!(e.field, "OTEL_RESOURCE_ATTRIBUTES", "{bad}");
        assert!(e.to_string().contains("key=value"), "{e}");
    }
}

#[test]
fn otlp_endpoint_and_protocol() {
    let c = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://tempo:4318/")]).expect("ok");
    let otlp = c.otlp.expect("otlp");
    assert_eq!(otlp.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(otlp.traces_url(), "http://tempo:4318/v1/traces");
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://tempo:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ])
    .expect("ok");
    assert_eq!(c.otlp.expect("otlp").traces_url(), "http://tempo:4317");
    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "tempo:4318")]),
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    );
    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://tempo:99999")]),
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    );
    assert_eq!(
        err_field(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://t:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        ]),
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    );
    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")]),
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    );
}

#[test]
fn pyroscope_server_auth_and_tenant() {
    let c = env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "https://profiles.example.com"),
        ("PYROSCOPE_BASIC_AUTH_USER", "123"),
        ("PYROSCOPE_BASIC_AUTH_PASSWORD", "s3cret"),
        ("PYROSCOPE_TENANT_ID", "team-a"),
    ])
    .expect("ok");
    let p = c.pyroscope.expect("pyroscope");
    assert_eq!(p.server_address, "https://profiles.example.com");
    assert_eq!(p.tenant_id.as_deref(), Some("team-a"));
    let debug = format!("{p:?}");
    assert!(
        !debug.contains("s3cret") && debug.contains("***"),
        "{debug}"
    );
    let c = env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "http://p:4040"),
        ("PYROSCOPE_AUTH_TOKEN", "tok"),
    ])
    .expect("ok");
    assert_eq!(
        c.pyroscope.expect("p").auth,
        Some(PyroscopeAuth::Bearer("tok".into()))
    );

    assert_eq!(
        err_field(&[("PYROSCOPE_SERVER_ADDRESS", "ftp://p")]),
        "PYROSCOPE_SERVER_ADDRESS"
    );
    assert_eq!(
        err_field(&[("PYROSCOPE_SERVER_ADDRESS", "http://p:4040?x=1")]),
        "PYROSCOPE_SERVER_ADDRESS"
    );
    assert_eq!(
        err_field(&[
            ("PYROSCOPE_SERVER_ADDRESS", "http://p"),
            ("PYROSCOPE_BASIC_AUTH_USER", "u")
        ]),
        "PYROSCOPE_BASIC_AUTH_PASSWORD"
    );
    assert_eq!(
        err_field(&[
            ("PYROSCOPE_SERVER_ADDRESS", "http://p"),
            ("PYROSCOPE_BASIC_AUTH_PASSWORD", "pw")
        ]),
        "PYROSCOPE_BASIC_AUTH_USER"
    );
    let e = env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "http://p"),
        ("PYROSCOPE_BASIC_AUTH_USER", "u"),
        ("PYROSCOPE_BASIC_AUTH_PASSWORD", "pw-secret"),
        ("PYROSCOPE_AUTH_TOKEN", "tok-secret"),
    ])
    .expect_err("both");
    assert_eq!(e.field, "PYROSCOPE_AUTH_TOKEN");
    assert!(!e.to_string().contains("secret"), "{e}");
    assert_eq!(
        err_field(&[("PYROSCOPE_TENANT_ID", "t")]),
        "PYROSCOPE_SERVER_ADDRESS"
    );
}

#[test]
fn sample_rate_and_upload_interval() {
    let c = env(&[
        ("PYROSCOPE_SAMPLE_RATE", "250"),
        ("PYROSCOPE_UPLOAD_INTERVAL", "15s"),
    ])
    .expect("ok");
    assert_eq!(c.sample_rate_hz, Some(250));
    assert_eq!(c.upload_interval, Some(Duration::from_secs(15)));
    for (v, d) in [("500ms", 500), ("1m", 60_000), ("20", 20_000)] {
        let c = env(&[("PYROSCOPE_UPLOAD_INTERVAL", v)]).expect(v);
        assert_eq!(c.upload_interval, Some(Duration::from_millis(d)), "{v}");
    }
    for bad in ["0", "1001", "fast", "-5", "99.5"] {
        let e = env(&[("PYROSCOPE_SAMPLE_RATE", bad)]).expect_err(bad);
        assert_eq!(e.field, "PYROSCOPE_SAMPLE_RATE");
        assert!(e.to_string().contains("1 to 1000"), "{e}");
    }
    for bad in ["10 parsecs", "ms", "50ms", "1.5s"] {
        assert_eq!(
            err_field(&[("PYROSCOPE_UPLOAD_INTERVAL", bad)]),
            "PYROSCOPE_UPLOAD_INTERVAL",
            "{bad}"
        );
    }
}

/// A profile is stamped with its interval's start and Grafana's span link searches 60 s
/// around a span: `2h` used to be accepted, and an interval that long also held two
/// hours of samples in memory before the aggregation had a cap.
#[test]
fn upload_interval_is_at_most_a_minute() {
    for (ok, d) in [("60s", 60), ("1m", 60), ("60", 60)] {
        let c = env(&[("PYROSCOPE_UPLOAD_INTERVAL", ok)]).expect(ok);
        assert_eq!(c.upload_interval, Some(Duration::from_secs(d)), "{ok}");
    }
    for bad in ["61s", "60001ms", "2m", "2h"] {
        let e = env(&[("PYROSCOPE_UPLOAD_INTERVAL", bad)]).expect_err(bad);
        assert_eq!(e.field, "PYROSCOPE_UPLOAD_INTERVAL", "{bad}");
        assert!(e.to_string().contains("100 ms to 60 s"), "{e}");
    }
}

/// `0` is read as it is written, the explicit "no bound", never as unset.
#[test]
fn output_max_bytes() {
    for (v, bytes) in [("64KiB", 64 << 10), ("268435456", 256 << 20), ("0", 0)] {
        let c = env(&[("OTEL_PROFILING_OUTPUT_MAX_BYTES", v)]).expect(v);
        assert_eq!(c.output_max_bytes, Some(bytes), "{v}");
    }
    let c = env(&[("OTEL_PROFILING_OUTPUT_MAX_BYTES", " ")]).expect("blank");
    assert_eq!(c.output_max_bytes, None);
    for bad in ["10MB", "-1", "lots"] {
        let e = env(&[("OTEL_PROFILING_OUTPUT_MAX_BYTES", bad)]).expect_err(bad);
        assert_eq!(e.field, "OTEL_PROFILING_OUTPUT_MAX_BYTES", "{bad}");
        assert!(e.to_string().contains("0 for no bound"), "{e}");
    }
}

#[test]
fn output_dir() {
    let c = env(&[("OTEL_PROFILING_OUTPUT_DIR", "/tmp/prof")]).expect("ok");
    assert_eq!(c.output_dir, Some(PathBuf::from("/tmp/prof")));
    let c = env(&[("OTEL_PROFILING_OUTPUT_DIR", " ")]).expect("blank");
    assert_eq!(c.output_dir, None);
}

/// `10 s` used to be read as ten seconds without a word; it is rejected, naming the
/// variable and the accepted forms (blanks around the whole value still count as nothing).
#[test]
fn upload_interval_with_a_blank_before_the_unit_is_rejected() {
    for bad in ["10 s", "500 ms", "1 m", "10\ts"] {
        let e = env(&[("PYROSCOPE_UPLOAD_INTERVAL", bad)]).expect_err(bad);
        assert_eq!(e.field, "PYROSCOPE_UPLOAD_INTERVAL", "{bad}");
        let msg = e.to_string();
        assert!(msg.starts_with("PYROSCOPE_UPLOAD_INTERVAL: "), "{msg}");
        assert!(msg.contains("`10s`") && msg.contains("`500ms`"), "{msg}");
        assert!(msg.contains("no space before the unit"), "{msg}");
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
    let c = env(&[("PYROSCOPE_UPLOAD_INTERVAL", " 10s ")]).expect("surrounding blanks");
    assert_eq!(c.upload_interval, Some(Duration::from_secs(10)));
}

/// The example in an endpoint error is that variable's own port: OTLP/HTTP 4318, OTLP/gRPC
/// 4317, Pyroscope 4040 (the OTLP error used to suggest Pyroscope's 4040).
#[test]
fn url_errors_suggest_each_variables_own_port() {
    let msg = |pairs: &[(&str, &str)]| env(pairs).expect_err("malformed").to_string();
    let http = msg(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "tempo:4318")]);
    assert!(http.contains("http://localhost:4318"), "{http}");
    assert!(!http.contains("4040"), "{http}");
    let grpc = msg(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://tempo:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ]);
    assert!(grpc.contains("http://localhost:4317"), "{grpc}");
    assert!(!grpc.contains("4040"), "{grpc}");
    let pyroscope = msg(&[("PYROSCOPE_SERVER_ADDRESS", "pyroscope:4040")]);
    assert!(pyroscope.contains("http://localhost:4040"), "{pyroscope}");
    assert!(!pyroscope.contains("4318"), "{pyroscope}");
}

/// A gRPC endpoint without a scheme takes it from `OTEL_EXPORTER_OTLP_[SIGNAL_]INSECURE`
/// (`https://` unless insecure, the specification's default); a written scheme wins; HTTP
/// endpoints still need one.
#[test]
fn insecure_gives_a_schemeless_grpc_endpoint_its_scheme() {
    let grpc = |extra: &[(&'static str, &'static str)]| {
        let mut vars = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        vars.extend_from_slice(extra);
        let config = env(&vars).expect("valid");
        (
            config.otlp.expect("traces").endpoint,
            config.otlp_profiles.expect("profiles").endpoint,
        )
    };
    let https = "https://collector:4317".to_string();
    let http = "http://collector:4317".to_string();
    assert_eq!(grpc(&[]), (https.clone(), https.clone()));
    assert_eq!(
        grpc(&[("OTEL_EXPORTER_OTLP_INSECURE", "true")]),
        (http.clone(), http.clone())
    );
    assert_eq!(
        grpc(&[
            ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
            ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "false"),
        ]),
        (https.clone(), http.clone())
    );
    assert_eq!(
        grpc(&[("OTEL_EXPORTER_OTLP_PROFILES_INSECURE", "true")]),
        (https, http)
    );
    // A written scheme wins.
    let config = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
    ])
    .expect("valid");
    assert_eq!(
        config.otlp.expect("traces").endpoint,
        "https://collector:4317"
    );
    let e = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "maybe"),
    ])
    .expect_err("bad bool");
    assert_eq!(e.field, "OTEL_EXPORTER_OTLP_INSECURE");
    assert!(env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
    ])
    .is_err());
}

/// `OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION` (else the generic one) reaches the OTLP
/// profiles settings; unset leaves the exporter's default.
#[test]
fn profiles_compression() {
    let gzip = |vars: &[(&str, &str)]| {
        let mut all = vec![(
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://pyroscope:4040/v1development/profiles",
        )];
        all.extend_from_slice(vars);
        env(&all)
            .expect("valid")
            .otlp_profiles
            .expect("profiles")
            .gzip
    };
    assert_eq!(gzip(&[]), None);
    assert_eq!(
        gzip(&[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]),
        Some(true)
    );
    assert_eq!(
        gzip(&[
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "none"),
        ]),
        Some(false)
    );
    let e = env(&[
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://p:4040/v1development/profiles",
        ),
        ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "zstd"),
    ])
    .expect_err("zstd");
    assert_eq!(e.field, "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION");
}

#[test]
fn quiet_switch() {
    assert_eq!(env(&[]).expect("unset").quiet, None);
    for (v, q) in [
        ("1", true),
        ("true", true),
        ("TRUE", true),
        ("0", false),
        ("false", false),
    ] {
        assert_eq!(
            env(&[("OTEL_PROFILING_QUIET", v)]).expect(v).quiet,
            Some(q),
            "{v}"
        );
    }
    for bad in ["yes", "2", "quiet"] {
        let e = env(&[("OTEL_PROFILING_QUIET", bad)]).expect_err(bad);
        assert_eq!(e.field, "OTEL_PROFILING_QUIET");
        assert!(e.to_string().contains("`1` or `true`"), "{e}");
    }
}

#[test]
fn blocked_threshold_or_off() {
    let c = env(&[("OTEL_PROFILING_BLOCKED_THRESHOLD", "25ms")]).expect("ok");
    assert_eq!(c.blocked_threshold, Some(Some(Duration::from_millis(25))));
    let c = env(&[("OTEL_PROFILING_BLOCKED_THRESHOLD", "OFF")]).expect("ok");
    assert_eq!(c.blocked_threshold, Some(None));
    assert_eq!(env(&[]).expect("ok").blocked_threshold, None);
    for bad in ["0", "0ms", "2m", "fast", "10 ms"] {
        let e = env(&[("OTEL_PROFILING_BLOCKED_THRESHOLD", bad)]).expect_err(bad);
        assert_eq!(e.field, "OTEL_PROFILING_BLOCKED_THRESHOLD", "{bad}");
        assert!(e.to_string().contains("off"), "{e}");
    }
}

#[test]
fn thread_context_switch() {
    assert_eq!(env(&[]).expect("unset").thread_context, None);
    for (v, on) in [("1", true), ("true", true), ("0", false), ("FALSE", false)] {
        let c = env(&[("OTEL_PROFILING_THREAD_CONTEXT", v)]).expect(v);
        assert_eq!(c.thread_context, Some(on), "{v}");
    }
    for bad in ["on", "yes", "2"] {
        let e = env(&[("OTEL_PROFILING_THREAD_CONTEXT", bad)]).expect_err(bad);
        assert_eq!(e.field, "OTEL_PROFILING_THREAD_CONTEXT");
        assert!(
            e.to_string().contains("OTEL_PROFILING_THREAD_CONTEXT"),
            "{e}"
        );
    }
}

#[test]
fn otlp_profiles_endpoint_protocol_and_headers_fall_back_to_the_generic_variables() {
    // The generic endpoint gets the signal path appended, as the OTel spec says.
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "X-Scope-OrgID=t1,Authorization=Bearer%20abc",
        ),
    ])
    .expect("ok");
    let t = c.otlp_profiles.expect("target");
    assert_eq!(t.endpoint, "http://collector:4318/v1development/profiles");
    assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(
        t.headers,
        vec![
            ("X-Scope-OrgID".to_string(), "t1".to_string()),
            ("Authorization".to_string(), "Bearer abc".to_string())
        ]
    );
    assert!(!format!("{t:?}").contains("abc"), "{t:?}");
    // Only the generic endpoint: nothing chosen, profiles stay where they were.
    assert_eq!(c.profiles_exporter, None);

    // The signal-specific ones win and are used as given.
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://tempo:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://pyroscope:4040/v1development/profiles",
        ),
        ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
        ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "b=2"),
    ])
    .expect("ok");
    let t = c.otlp_profiles.expect("target");
    assert_eq!(t.endpoint, "http://pyroscope:4040/v1development/profiles");
    assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(t.headers, vec![("b".to_string(), "2".to_string())]);
    // A profiles endpoint implies OTLP profiles; with a Pyroscope server too, both.
    assert_eq!(c.profiles_exporter, Some(ProfilesExporter::Otlp));
    let c = env(&[
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://c:4318/v1development/profiles",
        ),
        ("PYROSCOPE_SERVER_ADDRESS", "http://pyroscope:4040"),
    ])
    .expect("ok");
    assert_eq!(c.profiles_exporter, Some(ProfilesExporter::Both));
    // gRPC keeps the endpoint as is.
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
        ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "grpc"),
    ])
    .expect("ok");
    assert_eq!(
        c.otlp_profiles.expect("target").endpoint,
        "http://collector:4317"
    );
}

#[test]
fn profiles_exporter_choice_is_one_setting_and_bad_values_name_their_variable() {
    for (value, expected) in [
        ("pyroscope", ProfilesExporter::Pyroscope),
        ("OTLP", ProfilesExporter::Otlp),
        ("both", ProfilesExporter::Both),
    ] {
        let c = env(&[("OTEL_PROFILING_PROFILES_EXPORTER", value)]).expect("ok");
        assert_eq!(c.profiles_exporter, Some(expected));
    }
    assert_eq!(
        err_field(&[("OTEL_PROFILING_PROFILES_EXPORTER", "jaeger")]),
        "OTEL_PROFILING_PROFILES_EXPORTER"
    );
    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/json")]),
        "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL"
    );
    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "pyroscope:4040")]),
        "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"
    );
    let e = env(&[(
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
        "Authorization Bearer secret",
    )])
    .expect_err("no =");
    assert_eq!(e.field, "OTEL_EXPORTER_OTLP_PROFILES_HEADERS");
    assert!(!e.to_string().contains("secret"), "{e}");
    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_HEADERS", "=x")]),
        "OTEL_EXPORTER_OTLP_HEADERS"
    );
}

#[test]
fn header_values_are_percent_decoded_and_malformed_escapes_fail_setup() {
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "a=%e2%82%ac%20x,b=plain"),
    ])
    .expect("ok");
    let t = c.otlp_profiles.expect("target");
    assert_eq!(
        t.headers,
        vec![
            ("a".to_string(), "€ x".to_string()),
            ("b".to_string(), "plain".to_string())
        ]
    );
    for bad in ["a=%zz", "a=100%", "a=%4", "a=%ff"] {
        assert_eq!(
            err_field(&[("OTEL_EXPORTER_OTLP_HEADERS", bad)]),
            "OTEL_EXPORTER_OTLP_HEADERS",
            "{bad}"
        );
    }
}

/// Every URL setting goes through the one check: credentials in the URL are refused, for
/// the environment as for the exporters' own settings, and never echoed.
#[test]
fn credentials_in_a_url_are_refused_without_being_shown() {
    for (field, url) in [
        (
            "PYROSCOPE_SERVER_ADDRESS",
            "http://user:s3cret@pyroscope:4040",
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://s3cret@tempo:4318/"),
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "http://u:s3cret@c:4318/v1development/profiles",
        ),
    ] {
        let e = env(&[(field, url)]).expect_err(url);
        assert_eq!(e.field, field);
        let msg = e.to_string();
        assert!(msg.contains("credentials in the URL"), "{msg}");
        assert!(!msg.contains("s3cret") && msg.contains("***@"), "{msg}");
    }
    assert_eq!(
        parse_url("f", "http://h:1/p/?q", "x")
            .expect_err("query")
            .problem,
        "query or fragment not allowed"
    );
    assert_eq!(
        parse_url("f", " https://h:4040/prefix/ ", "x").as_deref(),
        Ok("https://h:4040/prefix")
    );
}

/// The traces variables as the specification defines them: a signal-specific endpoint is
/// the URL itself (before, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` was ignored and spans went
/// to local files); each signal-specific variable wins over the generic one.
#[test]
fn traces_variables_are_read_with_their_generic_fallbacks() {
    let c = env(&[(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "https://otlp.example.com/custom/traces",
    )])
    .expect("ok");
    let otlp = c.otlp.expect("the traces endpoint alone configures OTLP");
    assert_eq!(otlp.traces_url(), "https://otlp.example.com/custom/traces");
    assert_eq!(otlp.endpoint_field(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");

    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-generic=1"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "authorization=Bearer%20t",
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "20000"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "3000"),
    ])
    .expect("ok");
    let otlp = c.otlp.expect("otlp");
    assert_eq!(otlp.traces_url(), "http://tempo:4317");
    assert_eq!(otlp.protocol, OtlpProtocol::Grpc);
    assert_eq!(
        otlp.headers,
        [("authorization".to_owned(), "Bearer t".to_owned())]
    );
    assert_eq!(otlp.timeout, Some(Duration::from_secs(3)));

    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-generic=1"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "20000"),
    ])
    .expect("ok");
    let otlp = c.otlp.expect("otlp");
    assert_eq!(otlp.traces_url(), "http://collector:4318/v1/traces");
    assert_eq!(otlp.headers, [("x-generic".to_owned(), "1".to_owned())]);
    assert_eq!(otlp.timeout, Some(Duration::from_secs(20)));

    assert_eq!(
        err_field(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "tempo:4318")]),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    );
    assert_eq!(
        err_field(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://t:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
        ]),
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    );
    assert_eq!(
        err_field(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://t:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "5s")
        ]),
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
    );
}

#[test]
fn traces_exporter_and_sdk_disabled() {
    assert!(!env(&[]).expect("ok").traces_disabled);
    assert!(
        !env(&[("OTEL_TRACES_EXPORTER", "otlp")])
            .expect("ok")
            .traces_disabled
    );
    assert!(
        env(&[("OTEL_TRACES_EXPORTER", "None")])
            .expect("ok")
            .traces_disabled
    );
    // An exporter this crate has not is an error, not local files in its place.
    assert_eq!(
        err_field(&[("OTEL_TRACES_EXPORTER", "zipkin")]),
        "OTEL_TRACES_EXPORTER"
    );
    assert!(
        env(&[("OTEL_SDK_DISABLED", "TRUE")])
            .expect("ok")
            .sdk_disabled
    );
    assert!(
        !env(&[("OTEL_SDK_DISABLED", "false")])
            .expect("ok")
            .sdk_disabled
    );
    assert_eq!(
        err_field(&[("OTEL_SDK_DISABLED", "yes")]),
        "OTEL_SDK_DISABLED"
    );
}

/// `PYROSCOPE_LABELS` and `PYROSCOPE_HTTP_HEADERS` in the Pyroscope Java agent's forms.
#[test]
fn pyroscope_labels_and_http_headers() {
    let c = env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "http://pyroscope:4040"),
        ("PYROSCOPE_LABELS", "region=eu-west-1, team=checkout"),
        (
            "PYROSCOPE_HTTP_HEADERS",
            r#"{"X-Scope-OrgID": "tenant-a", "X-Token": "s3cret"}"#,
        ),
    ])
    .expect("ok");
    assert_eq!(
        c.profile_labels,
        [
            ("region".to_owned(), "eu-west-1".to_owned()),
            ("team".to_owned(), "checkout".to_owned())
        ]
    );
    let headers = &c.pyroscope.expect("pyroscope").headers;
    assert!(headers.contains(&("X-Token".to_owned(), "s3cret".to_owned())));
    assert_eq!(headers.len(), 2);

    assert_eq!(
        err_field(&[("PYROSCOPE_LABELS", "region")]),
        "PYROSCOPE_LABELS"
    );
    let e = env(&[
        ("PYROSCOPE_SERVER_ADDRESS", "http://pyroscope:4040"),
        ("PYROSCOPE_HTTP_HEADERS", "X-Token: s3cret"),
    ])
    .expect_err("not JSON");
    assert_eq!(e.field, "PYROSCOPE_HTTP_HEADERS");
    assert!(
        !e.to_string().contains("s3cret"),
        "a secret in an error: {e}"
    );
    assert_eq!(
        err_field(&[("PYROSCOPE_HTTP_HEADERS", r#"{"X-Token": "t"}"#)]),
        "PYROSCOPE_SERVER_ADDRESS"
    );
}

#[test]
fn compression_and_the_profiles_timeout() {
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
    ])
    .expect("ok");
    assert!(c.otlp.as_ref().expect("otlp").gzip);
    assert_eq!(
        c.otlp_profiles.expect("profiles").request_timeout,
        Duration::from_millis(2500)
    );
    let c = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
        ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "700"),
    ])
    .expect("ok");
    assert!(!c.otlp.expect("otlp").gzip, "the signal's own wins");
    assert_eq!(
        c.otlp_profiles.expect("profiles").request_timeout,
        Duration::from_millis(700)
    );
    assert_eq!(
        err_field(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd")
        ]),
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
    );
}

#[test]
fn alloc_sample_bytes_is_a_size_naming_its_variable_when_bad() {
    use super::alloc_sample_bytes_variable as read;
    let var = |v: &'static str| {
        move |name: &str| (name == "OTEL_PROFILING_ALLOC_SAMPLE_BYTES").then(|| v.to_string())
    };
    assert_eq!(read(|_| None).expect("unset"), None);
    assert_eq!(read(var(" ")).expect("blank"), None);
    assert_eq!(read(var("64KiB")).expect("size"), Some(64 * 1024));
    assert_eq!(read(var("0")).expect("off"), Some(0));
    assert_eq!(read(var("1TiB")).ok().flatten(), None, "no TiB suffix");
    for bad in ["lots", "-5", "1099511627777"] {
        let e = read(var(bad)).expect_err(bad);
        assert_eq!(e.field, "OTEL_PROFILING_ALLOC_SAMPLE_BYTES", "{bad}");
        assert!(
            e.to_string().contains("switches allocation sampling off"),
            "{e}"
        );
    }
}
