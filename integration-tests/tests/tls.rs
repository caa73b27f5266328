//! The OTLP exporters' client TLS, end to end: a private CA, a server certificate for
//! 127.0.0.1 and a client certificate are made per run; the stand-in is reached only
//! through a TLS front that demands a client certificate signed by that CA. Spans and
//! OTLP profiles, over HTTP and over gRPC, configured only with the OpenTelemetry
//! variables (`OTEL_EXPORTER_OTLP_CERTIFICATE`, `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`),
//! must arrive, gzipped as `OTEL_EXPORTER_OTLP_COMPRESSION` says; without the client
//! certificate, or without the CA, nothing arrives and the failures are counted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use otel_profiling::config::EnvConfig;
use otel_profiling::{HealthStats, Telemetry};
use otel_profiling_integration_tests::standin::StandIn;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tracing_subscriber::layer::SubscriberExt;

/// One profiler per process: the cases take turns.
static TURN: Mutex<()> = Mutex::new(());

/// The run's certificates, as PEM files in a directory of its own.
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A client certificate from a CA the front does not trust.
    stranger_cert: PathBuf,
    stranger_key: PathBuf,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivateKeyDer<'static>,
    ca_der: CertificateDer<'static>,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

fn leaf(names: &[&str], issuer: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .expect("params");
    let cert = params.signed_by(&key, issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let dir = std::env::temp_dir().join(format!("otel-profiling-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let write = |name: &str, text: &str| -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let authority = ca("otel-profiling test CA");
    let stranger_ca = ca("someone else's CA");
    let (server_pem, server_key_pem) = leaf(&["127.0.0.1", "localhost"], &authority);
    let (client_pem, client_key_pem) = leaf(&["checkout.client"], &authority);
    let (stranger_pem, stranger_key_pem) = leaf(&["checkout.client"], &stranger_ca);
    Pki {
        ca: write("ca.pem", &authority.pem()),
        client_cert: write("client.pem", &client_pem),
        client_key: write("client-key.pem", &client_key_pem),
        stranger_cert: write("stranger.pem", &stranger_pem),
        stranger_key: write("stranger-key.pem", &stranger_key_pem),
        server_chain: vec![CertificateDer::from_pem_slice(server_pem.as_bytes()).expect("pem")],
        server_key: PrivateKeyDer::from_pem_slice(server_key_pem.as_bytes()).expect("key"),
        ca_der: authority.der().clone(),
        dir,
    }
}

/// A TLS front of `backend`: demands a client certificate from the run's CA, speaks h2
/// and HTTP/1.1 (ALPN), and forwards the plain bytes. Counts handshakes.
struct TlsFront {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    _runtime: tokio::runtime::Runtime,
}

fn front(pki: &Pki, backend: SocketAddr) -> TlsFront {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).expect("CA root");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
        .expect("server certificate");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (accepted, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (ok, bad) = (accepted.clone(), refused.clone());
    runtime.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, ok, bad) = (acceptor.clone(), ok.clone(), bad.clone());
            tokio::spawn(async move {
                let mut tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(_) => {
                        bad.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                };
                ok.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    TlsFront {
        addr,
        accepted,
        refused,
        _runtime: runtime,
    }
}

/// A fresh stand-in and the mutual-TLS front that forwards to it.
fn standin_behind_front(pki: &Pki) -> (StandIn, TlsFront) {
    let standin = StandIn::start().expect("stand-in");
    let backend: SocketAddr = standin
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("addr");
    let front = front(pki, backend);
    (standin, front)
}

#[inline(never)]
fn burn(cpu: Duration) -> u64 {
    let start = Instant::now();
    let mut x = 1u64;
    while start.elapsed() < cpu {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
    }
    x
}

/// Sets up telemetry from `vars` alone, runs one CPU-heavy span, waits (at most 15 s)
/// until the health counters satisfy `settled`, shuts down, and returns the counters.
fn run(vars: &[(&str, String)], settled: impl Fn(&HealthStats) -> bool) -> HealthStats {
    let env = EnvConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("valid variables");
    let telemetry = Telemetry::from_env_config(env)
        .default_service_name("checkout")
        .frequency_hz(250)
        .upload_interval(Duration::from_millis(400))
        .shutdown_timeout(Duration::from_secs(3))
        .quiet(true)
        .build()
        .expect("telemetry");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    tracing::subscriber::with_default(subscriber, || {
        tracing::info_span!("POST /checkout").in_scope(|| {
            std::hint::black_box(burn(Duration::from_millis(300)));
        });
    });
    telemetry.flush();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut stats = telemetry.stats();
    while !settled(&stats) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        telemetry.flush();
        stats = telemetry.stats();
    }
    drop(telemetry);
    stats
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn vars(pki: &Pki, front: &TlsFront, protocol: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://127.0.0.1:{}", front.addr.port()),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
        ("OTEL_PROFILING_PROFILES_EXPORTER", "otlp".to_string()),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca)),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            path(&pki.client_cert),
        ),
        ("OTEL_EXPORTER_OTLP_CLIENT_KEY", path(&pki.client_key)),
    ]
}

/// With the CA and the client certificate from the environment, spans and OTLP
/// profiles reach a backend that demands mutual TLS, over HTTP and over gRPC (gzipped).
#[test]
fn spans_and_profiles_reach_a_mutual_tls_backend() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let pki = pki();
    for protocol in ["http/protobuf", "grpc"] {
        let (standin, front) = standin_behind_front(&pki);
        let mut vars = vars(&pki, &front, protocol);
        vars.push(("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".to_string()));
        let stats = run(&vars, |s| {
            s.spans.spans_sent > 0 && s.otlp_profiles.is_some_and(|p| p.profiles_sent > 0)
        });
        assert!(
            standin.span_count() >= 1,
            "{protocol}: no span arrived: {stats:?}"
        );
        assert!(
            standin.sample_count() > 0,
            "{protocol}: no profile sample arrived: {stats:?}"
        );
        assert_eq!(stats.spans.spans_failed, 0, "{protocol}: {stats:?}");
        let profiles = stats.otlp_profiles.expect("OTLP profiles configured");
        assert!(profiles.profiles_sent > 0, "{protocol}: {profiles:?}");
        assert_eq!(profiles.profiles_failed, 0, "{protocol}: {profiles:?}");
        let (gzipped, plain) = standin.request_encodings();
        assert!(
            gzipped >= 2 && plain == 0,
            "{protocol}: OTEL_EXPORTER_OTLP_COMPRESSION=gzip: {gzipped} gzipped, {plain} plain"
        );
        assert!(front.accepted.load(Ordering::SeqCst) >= 2, "{protocol}");
        assert_eq!(front.refused.load(Ordering::SeqCst), 0, "{protocol}");
    }
}

/// Without the client certificate (or with one from another CA) the front refuses every
/// handshake; without the CA the exporters refuse the server. Nothing arrives, and what
/// failed is counted, never lost silently.
#[test]
fn a_missing_or_wrong_certificate_is_refused_and_counted() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let pki = pki();
    let without = |vars: &mut Vec<(&'static str, String)>, names: &[&str]| {
        vars.retain(|(k, _)| !names.contains(k));
    };
    type Change = Box<dyn Fn(&mut Vec<(&'static str, String)>)>;
    let stranger = (path(&pki.stranger_cert), path(&pki.stranger_key));
    let cases: [(&str, Change, bool); 3] = [
        (
            "no client certificate",
            Box::new(move |v| {
                without(
                    v,
                    &[
                        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    ],
                )
            }),
            true,
        ),
        (
            "a client certificate of another CA",
            Box::new(move |v| {
                for (k, val) in v.iter_mut() {
                    match *k {
                        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE" => *val = stranger.0.clone(),
                        "OTEL_EXPORTER_OTLP_CLIENT_KEY" => *val = stranger.1.clone(),
                        _ => {}
                    }
                }
            }),
            true,
        ),
        (
            "no CA (the platform's roots do not know the server)",
            Box::new(move |v| without(v, &["OTEL_EXPORTER_OTLP_CERTIFICATE"])),
            false,
        ),
    ];
    for protocol in ["http/protobuf", "grpc"] {
        for (what, change, front_refuses) in &cases {
            let (standin, front) = standin_behind_front(&pki);
            let mut vars = vars(&pki, &front, protocol);
            change(&mut vars);
            let stats = run(&vars, |s| {
                s.spans.spans_failed > 0
                    && s.otlp_profiles
                        .is_some_and(|p| p.retries + p.profiles_failed + p.network_errors > 0)
            });
            let case = format!("{protocol}, {what}");
            assert_eq!(standin.span_count(), 0, "{case}");
            assert_eq!(standin.sample_count(), 0, "{case}");
            assert_eq!(front.accepted.load(Ordering::SeqCst), 0, "{case}");
            if *front_refuses {
                assert!(front.refused.load(Ordering::SeqCst) > 0, "{case}");
            }
            assert!(
                stats.spans.spans_failed > 0,
                "{case}: span export failures not counted: {stats:?}"
            );
            let profiles = stats.otlp_profiles.expect("OTLP profiles configured");
            assert_eq!(profiles.profiles_sent, 0, "{case}: {profiles:?}");
            assert!(
                profiles.retries + profiles.profiles_failed + profiles.network_errors > 0,
                "{case}: profile failures not counted: {profiles:?}"
            );
        }
    }
}
