//! TLS of the OTLP push (rustls, no OpenSSL): loads the trusted roots (the
//! system's store, or the configured CA file) and the mTLS client identity
//! once, at start, into one rustls configuration for both transports, with
//! errors that name the file and the setting; and explains the TLS
//! failures that exports meet.

use std::error::Error as StdError;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore, SignatureScheme};

/// A TLS file setting and where it came from (a flag or a variable), so
/// that errors can name both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFile {
    /// The file.
    pub path: PathBuf,
    /// The flag (`--otlp-certificate`) or variable that set it.
    pub from: String,
}

impl std::fmt::Display for TlsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (from {})", self.path.display(), self.from)
    }
}

/// The TLS files configured (each from its flag, else the per-signal
/// variable, else the general one). Used only for `https://` endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// CA certificates that verify the collector; `None`: the system's.
    pub ca: Option<TlsFile>,
    /// The mTLS client certificate (chain).
    pub client_cert: Option<TlsFile>,
    /// The mTLS client private key.
    pub client_key: Option<TlsFile>,
}

impl TlsSettings {
    /// Whether any TLS file is configured.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client_cert.is_none() && self.client_key.is_none()
    }
}

/// TLS settings that cannot be used; each message names the file and the
/// flag or variable that set it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file that cannot be read.
    #[error("cannot read the OTLP {what} {file}: {source}")]
    Read {
        /// What the file should hold (`CA certificate`, `client key`...).
        what: &'static str,
        /// The file and its setting.
        file: TlsFile,
        /// Why.
        source: std::io::Error,
    },
    /// A file with no PEM certificate in it, or broken PEM.
    #[error("the OTLP {what} {file} holds no usable PEM certificate ({reason})")]
    NoCertificate {
        /// `CA certificate` or `client certificate`.
        what: &'static str,
        /// The file and its setting.
        file: TlsFile,
        /// What the parser said.
        reason: String,
    },
    /// A CA certificate rustls cannot use as a trust anchor.
    #[error("the OTLP CA certificate {file} cannot be trusted as a CA: {source}")]
    BadCa {
        /// The file and its setting.
        file: TlsFile,
        /// Why.
        source: rustls::Error,
    },
    /// A key file with no private key in it.
    #[error(
        "the OTLP client key {file} holds no PEM private key (PKCS#8, PKCS#1 or SEC1) ({reason})"
    )]
    NoKey {
        /// The file and its setting.
        file: TlsFile,
        /// What the parser said.
        reason: String,
    },
    /// A client certificate and key that do not belong together.
    #[error(
        "the OTLP client certificate {cert} and client key {key} cannot be used together: {source}"
    )]
    Identity {
        /// The certificate file.
        cert: TlsFile,
        /// The key file.
        key: TlsFile,
        /// Why (e.g. the key does not match the certificate).
        source: Box<rustls::Error>,
    },
    /// Only one half of the mTLS identity.
    #[error("{have} is set but not {missing}: mTLS needs the client certificate and its key")]
    HalfIdentity {
        /// The setting given.
        have: String,
        /// The setting missing (variable and flag).
        missing: &'static str,
    },
    /// No CA file, and no usable root certificate in the system's store.
    #[error(
        "no system root certificates to verify the OTLP endpoint {endpoint} ({detail}); \
         install the ca-certificates package (or set SSL_CERT_FILE), or give the \
         collector's CA with OTEL_EXPORTER_OTLP_CERTIFICATE or --otlp-certificate"
    )]
    NoSystemRoots {
        /// The endpoint.
        endpoint: String,
        /// What the loader said.
        detail: String,
    },
}

/// The loaded TLS client settings of an `https://` endpoint: the trusted
/// roots and the optional client identity, checked to be usable.
#[derive(Debug, Clone)]
pub struct TlsClient {
    /// The rustls configuration of both transports (without ALPN, which
    /// the connector sets: `h2` for gRPC, `http/1.1` for HTTP).
    config: Arc<ClientConfig>,
    /// Without a client identity: set when a collector asks for a client
    /// certificate during a handshake (see [`TlsClient::begin_export`]).
    asked_for_cert: Option<Arc<AtomicBool>>,
    /// What is trusted, for messages: the CA file or the system's store.
    trusted: String,
    /// The client certificate, for messages.
    client_cert: Option<TlsFile>,
}

/// The client-certificate resolver when none is configured: offers no
/// certificate (as rustls' own), and records that a collector asked for
/// one, so that a collector which then drops the connection without a TLS
/// alert (as gRPC servers do) can be explained.
#[derive(Debug)]
struct NoClientCert(Arc<AtomicBool>);

impl ResolvesClientCert for NoClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.0.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        false
    }
}

fn read(what: &'static str, file: &TlsFile) -> Result<Vec<u8>, TlsError> {
    std::fs::read(&file.path).map_err(|source| TlsError::Read {
        what,
        file: file.clone(),
        source,
    })
}

fn certificates(
    what: &'static str,
    file: &TlsFile,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, file)?;
    let no_cert = |reason: String| TlsError::NoCertificate {
        what,
        file: file.clone(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| no_cert(e.to_string()))?;
    if certs.is_empty() {
        return Err(no_cert("no CERTIFICATE block".to_string()));
    }
    Ok(certs)
}

/// The ring provider: the one crypto backend this build has.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsClient {
    /// Loads and checks `settings` for `endpoint`: the CA file (which
    /// replaces the system's roots) or the system's roots, and the client
    /// certificate and key (which must both be set, and match).
    pub fn load(settings: &TlsSettings, endpoint: &str) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        let trusted = match &settings.ca {
            Some(file) => {
                for cert in certificates("CA certificate", file)? {
                    roots.add(cert).map_err(|source| TlsError::BadCa {
                        file: file.clone(),
                        source,
                    })?;
                }
                format!("the CA certificate {file}")
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _ignored) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    let detail = if found.errors.is_empty() {
                        "the store is empty".to_string()
                    } else {
                        found
                            .errors
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; ")
                    };
                    return Err(TlsError::NoSystemRoots {
                        endpoint: endpoint.to_string(),
                        detail,
                    });
                }
                format!("the system's {added} root certificates")
            }
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots);
        let (config, asked_for_cert) = match (&settings.client_cert, &settings.client_key) {
            (None, None) => {
                let asked = Arc::new(AtomicBool::new(false));
                let resolver = Arc::new(NoClientCert(asked.clone()));
                (builder.with_client_cert_resolver(resolver), Some(asked))
            }
            (Some(c), None) => {
                return Err(TlsError::HalfIdentity {
                    have: c.from.clone(),
                    missing: "OTEL_EXPORTER_OTLP_[METRICS_]CLIENT_KEY or --otlp-client-key",
                });
            }
            (None, Some(k)) => {
                return Err(TlsError::HalfIdentity {
                    have: k.from.clone(),
                    missing: "OTEL_EXPORTER_OTLP_[METRICS_]CLIENT_CERTIFICATE or \
                              --otlp-client-certificate",
                });
            }
            (Some(cert_file), Some(key_file)) => {
                let chain = certificates("client certificate", cert_file)?;
                let key_pem = read("client key", key_file)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::NoKey {
                    file: key_file.clone(),
                    reason: e.to_string(),
                })?;
                // rustls checks that the key is the certificate's.
                let config = builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|source| TlsError::Identity {
                        cert: cert_file.clone(),
                        key: key_file.clone(),
                        source: Box::new(source),
                    })?;
                (config, None)
            }
        };
        Ok(Self {
            config: Arc::new(config),
            asked_for_cert,
            trusted,
            client_cert: settings.client_cert.clone(),
        })
    }

    /// The rustls configuration (roots and identity), without ALPN.
    pub fn config(&self) -> ClientConfig {
        (*self.config).clone()
    }

    /// Marks the start of one export, so that [`TlsClient::explain`]
    /// knows whether a collector asked for a client certificate during
    /// this export's handshakes (exports are one at a time).
    pub fn begin_export(&self) {
        if let Some(a) = &self.asked_for_cert {
            a.store(false, Ordering::Relaxed);
        }
    }

    /// What verifies the collector, for the start-up log.
    pub fn describe(&self) -> String {
        match &self.client_cert {
            Some(c) => format!("trusting {}, client certificate {c}", self.trusted),
            None => format!("trusting {}", self.trusted),
        }
    }

    /// A TLS failure found in `err`'s chain, explained (what failed and
    /// which setting to look at); `None` if the failure is not TLS.
    /// `detail` is how the transport words `err`, kept when the failure is
    /// inferred rather than reported by TLS.
    pub fn explain(&self, err: &(dyn StdError + 'static), detail: &str) -> Option<String> {
        let Some(e) = find_rustls_error(err) else {
            // No TLS error, but the connection failed (a cause chain: not
            // an answer of the collector's) after the collector asked this
            // export for a client certificate we do not have: that is why
            // it hung up.
            let asked = self
                .asked_for_cert
                .as_ref()
                .is_some_and(|a| a.load(Ordering::Relaxed));
            return (asked && err.source().is_some())
                .then(|| format!("TLS error: {NEEDS_CLIENT_CERT} ({detail})"));
        };
        let hint = match e {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => format!(
                    "the collector's certificate is not issued by a trusted CA (trusting {})",
                    self.trusted
                ),
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    "the collector's certificate is not valid for the endpoint's host name"
                        .to_string()
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "the collector's certificate has expired".to_string()
                }
                _ => format!(
                    "the collector's certificate was refused (trusting {})",
                    self.trusted
                ),
            },
            rustls::Error::AlertReceived(a) => match (&self.client_cert, a) {
                (
                    None,
                    AlertDescription::CertificateRequired
                    | AlertDescription::HandshakeFailure
                    | AlertDescription::BadCertificate,
                ) => NEEDS_CLIENT_CERT.to_string(),
                (
                    Some(c),
                    AlertDescription::BadCertificate
                    | AlertDescription::UnknownCA
                    | AlertDescription::CertificateUnknown
                    | AlertDescription::UnsupportedCertificate
                    | AlertDescription::CertificateExpired
                    | AlertDescription::CertificateRevoked
                    | AlertDescription::AccessDenied,
                ) => format!("the collector refused the client certificate {c}"),
                _ => "the collector ended the TLS handshake".to_string(),
            },
            // The first bytes back were not a TLS record: a server that
            // speaks plain HTTP (or gRPC without TLS) on that port.
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => {
                "the endpoint does not speak TLS: for a plain-text collector use an http:// endpoint (or --otlp-insecure for gRPC)".to_string()
            }
            _ => "the TLS handshake failed".to_string(),
        };
        Some(format!("TLS error: {e}: {hint}"))
    }
}

/// The explanation of a collector that wants a client certificate.
const NEEDS_CLIENT_CERT: &str = "the collector requires a client certificate (mTLS) and none \
     is configured: set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and \
     OTEL_EXPORTER_OTLP_CLIENT_KEY (or --otlp-client-certificate and --otlp-client-key)";

/// The first `rustls::Error` in `err`'s source chain, looking inside
/// `std::io::Error`s too (whose `source()` skips their payload).
pub fn find_rustls_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && let Some(r) = find_rustls_error(inner)
        {
            return Some(r);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use std::path::Path;

    /// A CA, and a certificate and key it issued, as PEM files in `dir`.
    fn pki(dir: &Path) -> (TlsFile, TlsFile, TlsFile) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["client".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let write = |name: &str, pem: String, var: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            TlsFile {
                path,
                from: var.to_string(),
            }
        };
        (
            write("ca.pem", ca.pem(), "OTEL_EXPORTER_OTLP_CERTIFICATE"),
            write(
                "cert.pem",
                cert.pem(),
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            ),
            write("key.pem", key.serialize_pem(), "--otlp-client-key"),
        )
    }

    fn load_err(s: &TlsSettings) -> String {
        TlsClient::load(s, "https://c:4317")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn good_files_load() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let t = TlsClient::load(
            &TlsSettings {
                ca: Some(ca.clone()),
                client_cert: Some(cert.clone()),
                client_key: Some(key),
            },
            "https://c:4317",
        )
        .unwrap();
        assert!(t.config().client_auth_cert_resolver.has_certs());
        assert!(t.asked_for_cert.is_none());
        let d = t.describe();
        assert!(
            d.contains(&ca.to_string()) && d.contains(&cert.to_string()),
            "{d}"
        );
    }

    #[test]
    fn bad_files_name_the_file_and_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let missing = TlsFile {
            path: dir.path().join("nope.pem"),
            from: "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE".into(),
        };
        let e = load_err(&TlsSettings {
            ca: Some(missing.clone()),
            ..Default::default()
        });
        assert!(e.starts_with("cannot read the OTLP CA certificate"), "{e}");
        assert!(e.contains(&missing.path.display().to_string()), "{e}");
        assert!(e.contains("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"), "{e}");

        // A key is not a certificate.
        let e = load_err(&TlsSettings {
            ca: Some(TlsFile {
                path: key.path.clone(),
                from: "--otlp-certificate".into(),
            }),
            ..Default::default()
        });
        assert!(e.contains("holds no usable PEM certificate"), "{e}");
        assert!(e.contains("--otlp-certificate"), "{e}");

        // A certificate is not a key.
        let e = load_err(&TlsSettings {
            ca: Some(ca.clone()),
            client_cert: Some(cert.clone()),
            client_key: Some(TlsFile {
                path: cert.path.clone(),
                from: "OTEL_EXPORTER_OTLP_CLIENT_KEY".into(),
            }),
        });
        assert!(e.contains("holds no PEM private key"), "{e}");
        assert!(e.contains("OTEL_EXPORTER_OTLP_CLIENT_KEY"), "{e}");

        // A key that is not the certificate's.
        let other = dir.path().join("other-key.pem");
        std::fs::write(&other, KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let e = load_err(&TlsSettings {
            ca: Some(ca.clone()),
            client_cert: Some(cert.clone()),
            client_key: Some(TlsFile {
                path: other.clone(),
                from: "--otlp-client-key".into(),
            }),
        });
        assert!(e.contains("cannot be used together"), "{e}");
        assert!(e.contains(&other.display().to_string()), "{e}");
        assert!(e.contains(&cert.path.display().to_string()), "{e}");

        // Half an identity.
        let e = load_err(&TlsSettings {
            ca: Some(ca),
            client_cert: Some(cert),
            client_key: None,
        });
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE is set"),
            "{e}"
        );
        assert!(e.contains("--otlp-client-key"), "{e}");
    }

    /// An error whose chain holds `err` inside an `io::Error`, as hyper and
    /// tonic report a failed handshake.
    #[derive(Debug, thiserror::Error)]
    #[error("connection failed")]
    struct Outer(#[source] std::io::Error);

    fn wrapped(err: rustls::Error) -> Outer {
        Outer(std::io::Error::new(std::io::ErrorKind::InvalidData, err))
    }

    #[test]
    fn tls_failures_are_explained() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let server_only = TlsClient::load(
            &TlsSettings {
                ca: Some(ca.clone()),
                ..Default::default()
            },
            "https://c:4317",
        )
        .unwrap();
        let m = server_only
            .explain(
                &wrapped(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                "connection failed",
            )
            .unwrap();
        assert!(m.contains("not issued by a trusted CA"), "{m}");
        assert!(m.contains(&ca.to_string()), "{m}");
        let m = server_only
            .explain(
                &wrapped(rustls::Error::AlertReceived(
                    AlertDescription::CertificateRequired,
                )),
                "connection failed",
            )
            .unwrap();
        assert!(m.contains("requires a client certificate"), "{m}");
        assert!(m.contains("OTEL_EXPORTER_OTLP_CLIENT_KEY"), "{m}");
        let mtls = TlsClient::load(
            &TlsSettings {
                ca: Some(ca),
                client_cert: Some(cert.clone()),
                client_key: Some(key),
            },
            "https://c:4317",
        )
        .unwrap();
        let m = mtls
            .explain(
                &wrapped(rustls::Error::AlertReceived(AlertDescription::UnknownCA)),
                "connection failed",
            )
            .unwrap();
        assert!(
            m.contains("refused the client certificate") && m.contains(&cert.to_string()),
            "{m}"
        );
        // Not TLS: no explanation.
        let refused = Outer(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(mtls.explain(&refused, "refused").is_none());
        assert!(server_only.explain(&refused, "refused").is_none());
        // A collector that asked for a client certificate during this
        // export, then hung up without an alert (as gRPC servers do).
        let closed = Outer(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        let asked = server_only.asked_for_cert.as_ref().unwrap();
        asked.store(true, Ordering::Relaxed);
        let m = server_only.explain(&closed, "connection failed").unwrap();
        assert!(m.contains("requires a client certificate"), "{m}");
        assert!(m.contains("connection failed"), "the cause is kept: {m}");
        // An answer of the collector's (no cause chain) is not TLS.
        let answer = std::io::Error::other("permission denied");
        assert!(server_only.explain(&answer, "answer").is_none());
        server_only.begin_export();
        assert!(server_only.explain(&closed, "connection failed").is_none());
    }
}
