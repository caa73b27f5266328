//! Client TLS settings of the OTLP exporters: the certificates a server's certificate is
//! checked against, and the client's own certificate and key for mutual TLS
//! (`OTEL_EXPORTER_OTLP_[SIGNAL_]CERTIFICATE`, `…_CLIENT_CERTIFICATE`, `…_CLIENT_KEY`).
//!
//! The PEM files are read and parsed once, at setup: a missing file, a file without a
//! certificate or key, or a certificate without its key fails setup naming the variable,
//! instead of failing every export later. The clients (reqwest for HTTP, tonic for gRPC)
//! are built from the parsed data by [`crate::export`]'s transports; only `https://`
//! endpoints use these settings.

use std::fmt;
use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ConfigError;

/// The accepted form of a certificate file.
const CERTIFICATE_FORM: &str =
    "a readable PEM file with at least one -----BEGIN CERTIFICATE----- block";
/// The accepted form of a key file.
const KEY_FORM: &str = "a readable PEM file with a private key (PKCS#8, PKCS#1 or SEC1)";

/// One PEM file's bytes, with the setting it came from (for errors and notes).
#[derive(Clone, PartialEq, Eq)]
struct Pem {
    bytes: Vec<u8>,
    field: &'static str,
}

/// TLS settings of one exporter's client. Empty (the default): the platform's trusted
/// certificates check the server, and no client certificate is sent.
///
/// ```no_run
/// use otel_profiling::config::ClientTls;
///
/// let tls = ClientTls::new()
///     .with_ca_certificate_file("/etc/otel/ca.pem")?
///     .with_client_identity_files("/etc/otel/client.pem", "/etc/otel/client-key.pem")?;
/// # Ok::<(), otel_profiling::config::ConfigError>(())
/// ```
///
/// `Debug` never shows the key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// The certificates the server's chain must lead to (instead of the platform's).
    ca: Option<Pem>,
    /// The client certificate chain and its key.
    identity: Option<(Pem, Pem)>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_certificate", &self.ca.as_ref().map(|p| p.field))
            .field(
                "client_identity",
                &self.identity.as_ref().map(|(c, _)| c.field),
            )
            .finish()
    }
}

impl ClientTls {
    /// No settings: platform roots, no client certificate.
    pub fn new() -> ClientTls {
        ClientTls::default()
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.identity.is_none()
    }

    /// Checks the server's certificate against the certificates in `pem` only (a private
    /// CA, a self-signed server). An error names `tls.certificate`.
    pub fn with_ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        self.ca = Some(certificates(
            "tls.certificate",
            "(PEM given in code)",
            pem.into(),
        )?);
        Ok(self)
    }

    /// [`with_ca_certificate_pem`](Self::with_ca_certificate_pem) with the file at `path`.
    pub fn with_ca_certificate_file(self, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let bytes = read("tls.certificate", path, CERTIFICATE_FORM)?;
        let ca = certificates("tls.certificate", &path.display().to_string(), bytes)?;
        Ok(ClientTls {
            ca: Some(ca),
            ..self
        })
    }

    /// Presents the certificate chain `certificate` with its private `key` (both PEM)
    /// to servers that ask for one (mutual TLS).
    pub fn with_client_identity_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Result<Self, ConfigError> {
        let shown = "(PEM given in code)";
        self.identity = Some((
            certificates("tls.client_certificate", shown, certificate.into())?,
            private_key("tls.client_key", shown, key.into())?,
        ));
        Ok(self)
    }

    /// [`with_client_identity_pem`](Self::with_client_identity_pem) with the files at
    /// `certificate` and `key`.
    pub fn with_client_identity_files(
        mut self,
        certificate: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, ConfigError> {
        let (certificate, key) = (certificate.as_ref(), key.as_ref());
        self.identity = Some((
            certificates(
                "tls.client_certificate",
                &certificate.display().to_string(),
                read("tls.client_certificate", certificate, CERTIFICATE_FORM)?,
            )?,
            private_key(
                "tls.client_key",
                &key.display().to_string(),
                read("tls.client_key", key, KEY_FORM)?,
            )?,
        ));
        Ok(self)
    }

    /// The settings of `signal` (`TRACES` or `PROFILES`) from the environment: each of
    /// `OTEL_EXPORTER_OTLP_<SIGNAL>_{CERTIFICATE,CLIENT_CERTIFICATE,CLIENT_KEY}`, else the
    /// generic `OTEL_EXPORTER_OTLP_*` one (the OpenTelemetry specification). A client
    /// certificate without its key, or a key without its certificate, is an error.
    pub(crate) fn from_env(
        get: &dyn Fn(&str) -> Option<String>,
        names: &SignalNames,
    ) -> Result<ClientTls, ConfigError> {
        let pick = |names| crate::config::pick(get, names);
        let mut tls = ClientTls::new();
        if let Some((field, path)) = pick(names.certificate) {
            let bytes = read(field, Path::new(&path), CERTIFICATE_FORM)?;
            tls.ca = Some(certificates(field, &path, bytes)?);
        }
        match (pick(names.client_certificate), pick(names.client_key)) {
            (Some((cert_field, cert)), Some((key_field, key))) => {
                tls.identity = Some((
                    certificates(
                        cert_field,
                        &cert,
                        read(cert_field, Path::new(&cert), CERTIFICATE_FORM)?,
                    )?,
                    private_key(key_field, &key, read(key_field, Path::new(&key), KEY_FORM)?)?,
                ));
            }
            (Some((field, _)), None) => {
                return Err(ConfigError::new(
                    names.client_key.1,
                    "missing while a client certificate is set",
                    field,
                    "both a client certificate and its key, or neither",
                ))
            }
            (None, Some((field, _))) => {
                return Err(ConfigError::new(
                    names.client_certificate.1,
                    "missing while a client key is set",
                    field,
                    "both a client certificate and its key, or neither",
                ))
            }
            (None, None) => {}
        }
        Ok(tls)
    }

    /// The settings that were given (for the note when an `http://` endpoint leaves them
    /// unused).
    pub(crate) fn fields(&self) -> Vec<&'static str> {
        let mut fields: Vec<&'static str> = self.ca.iter().map(|p| p.field).collect();
        if let Some((cert, key)) = &self.identity {
            fields.extend([cert.field, key.field]);
        }
        fields
    }

    /// The trusted certificates (PEM), if set.
    #[allow(dead_code)] // unused without a TLS transport compiled in
    pub(crate) fn ca_pem(&self) -> Option<&[u8]> {
        self.ca.as_ref().map(|p| p.bytes.as_slice())
    }

    /// The client certificate chain and key (PEM), if set.
    #[allow(dead_code)] // unused without a TLS transport compiled in
    pub(crate) fn identity_pem(&self) -> Option<(&[u8], &[u8])> {
        self.identity
            .as_ref()
            .map(|(c, k)| (c.bytes.as_slice(), k.bytes.as_slice()))
    }

    /// The reqwest client builder with these settings (for `https://` endpoints).
    #[cfg(all(feature = "tls", any(feature = "pyroscope", feature = "otlp-http")))]
    pub(crate) fn apply_reqwest(
        &self,
        builder: reqwest::blocking::ClientBuilder,
    ) -> Result<reqwest::blocking::ClientBuilder, String> {
        let mut builder = builder;
        if let Some(ca) = &self.ca {
            let roots = reqwest::Certificate::from_pem_bundle(&ca.bytes)
                .map_err(|e| format!("{}: {e}", ca.field))?;
            builder = builder.tls_certs_only(roots);
        }
        if let Some((cert, key)) = &self.identity {
            let mut pem = cert.bytes.clone();
            pem.push(b'\n');
            pem.extend_from_slice(&key.bytes);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| format!("{} and {}: {e}", cert.field, key.field))?;
            builder = builder.identity(identity);
        }
        Ok(builder)
    }

    /// tonic's TLS settings for an `https://` endpoint: these certificates, or the
    /// platform's when none are set.
    #[cfg(all(feature = "tls", feature = "otlp-grpc"))]
    pub(crate) fn tonic(&self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let config = match &self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.bytes)),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(&cert.bytes, &key.bytes)),
            None => config,
        }
    }
}

/// The variable names of one signal's TLS settings: (signal-specific, generic) each.
pub(crate) struct SignalNames {
    pub(crate) certificate: (&'static str, &'static str),
    pub(crate) client_certificate: (&'static str, &'static str),
    pub(crate) client_key: (&'static str, &'static str),
}

/// The traces exporter's variables.
pub(crate) const TRACES: SignalNames = SignalNames {
    certificate: (
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ),
    client_certificate: (
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    ),
    client_key: (
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    ),
};

/// The OTLP profiles exporter's variables.
pub(crate) const PROFILES: SignalNames = SignalNames {
    certificate: (
        "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ),
    client_certificate: (
        "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    ),
    client_key: (
        "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    ),
};

fn read(field: &'static str, path: &Path, form: &'static str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| {
        ConfigError::new(
            field,
            "cannot read the file",
            &format!("{}: {e}", path.display()),
            form,
        )
    })
}

/// `bytes` if they hold at least one certificate and nothing malformed.
fn certificates(field: &'static str, shown: &str, bytes: Vec<u8>) -> Result<Pem, ConfigError> {
    let mut found = 0usize;
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        match cert {
            Ok(_) => found += 1,
            Err(e) => {
                return Err(ConfigError::new(
                    field,
                    "not a valid PEM certificate file",
                    &format!("{shown}: {e}"),
                    CERTIFICATE_FORM,
                ))
            }
        }
    }
    if found == 0 {
        return Err(ConfigError::new(
            field,
            "no certificate in the file",
            shown,
            CERTIFICATE_FORM,
        ));
    }
    Ok(Pem { bytes, field })
}

/// `bytes` if they hold a private key. The key itself never appears in an error.
fn private_key(field: &'static str, shown: &str, bytes: Vec<u8>) -> Result<Pem, ConfigError> {
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(_) => Ok(Pem { bytes, field }),
        Err(_) => Err(ConfigError::new(
            field,
            "no private key in the file",
            shown,
            KEY_FORM,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A throwaway self-signed certificate and its key (P-256), made for these tests only.
    const CERT: &str = include_str!("tls/test-cert.pem");
    const KEY: &str = include_str!("tls/test-key.pem");

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    fn files() -> (tempdir::Dir, String, String, String) {
        let dir = tempdir::Dir::new("tls");
        let cert = dir.write("cert.pem", CERT);
        let key = dir.write("key.pem", KEY);
        let junk = dir.write("junk.pem", "not a certificate\n");
        (dir, cert, key, junk)
    }

    /// A minimal temporary directory (removed on drop).
    mod tempdir {
        pub(super) struct Dir(std::path::PathBuf);
        impl Dir {
            pub(super) fn new(name: &str) -> Dir {
                let path = std::env::temp_dir().join(format!(
                    "otel-profiling-{name}-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&path).expect("temp dir");
                Dir(path)
            }
            pub(super) fn write(&self, name: &str, text: &str) -> String {
                let path = self.0.join(name);
                std::fs::write(&path, text).expect("write");
                path.display().to_string()
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    /// The signal's own variable wins over the generic one, each setting on its own.
    #[test]
    fn the_signal_variable_wins_and_the_generic_one_fills_in() {
        let (_dir, cert, key, junk) = files();
        let vars = [
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", junk.as_str()),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", cert.as_str()),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.as_str()),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.as_str()),
        ];
        let tls = ClientTls::from_env(&env(&vars), &TRACES).expect("valid");
        assert_eq!(
            tls.fields(),
            [
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_KEY"
            ]
        );
        assert_eq!(tls.ca_pem(), Some(CERT.as_bytes()));
        assert_eq!(tls.identity_pem(), Some((CERT.as_bytes(), KEY.as_bytes())));
        // For profiles the generic certificate applies, and it is junk: refused, named.
        let e = ClientTls::from_env(&env(&vars), &PROFILES).expect_err("junk");
        assert_eq!(e.field, "OTEL_EXPORTER_OTLP_CERTIFICATE");
        assert_eq!(e.problem, "no certificate in the file");
        assert!(ClientTls::from_env(&env(&[]), &PROFILES)
            .expect("nothing set")
            .is_empty());
    }

    /// Each ordinary mistake fails at setup naming the variable, never at the first export.
    #[test]
    fn mistakes_fail_naming_the_variable() {
        let (_dir, cert, key, junk) = files();
        // The variables, then the field and problem of the error.
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: [Case; 5] = [
            (
                &[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")],
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "cannot read the file",
            ),
            (
                &[(
                    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
                    cert.as_str(),
                )],
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                "missing while a client certificate is set",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.as_str())],
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "missing while a client key is set",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.as_str()),
                    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", cert.as_str()),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                "no private key in the file",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", key.as_str())],
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "no certificate in the file",
            ),
        ];
        for (vars, field, problem) in cases {
            let e = ClientTls::from_env(&env(vars), &TRACES).expect_err(field);
            assert_eq!((e.field, e.problem), (field, problem), "{e}");
            assert!(!e.to_string().contains("PRIVATE KEY"), "{e}");
        }
        let e = ClientTls::new()
            .with_ca_certificate_file(&junk)
            .expect_err("junk");
        assert_eq!(e.field, "tls.certificate");
        assert!(ClientTls::new()
            .with_client_identity_pem(CERT, KEY)
            .expect("valid")
            .identity_pem()
            .is_some());
    }

    /// `Debug` names the settings, never the key.
    #[test]
    fn debug_never_shows_the_key() {
        let tls = ClientTls::new()
            .with_client_identity_pem(CERT, KEY)
            .expect("valid");
        let shown = format!("{tls:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(shown.contains("tls.client_certificate"), "{shown}");
    }
}
