//! OTLP push over TLS, against real TLS receivers that are not our code
//! (`tests/otlp_receiver.py`: grpcio's SSL server and Python's `ssl`), with
//! a CA this test creates (rcgen): a custom CA, the system's roots, mTLS,
//! a wrong CA (a counted `tls_failure`), and bad files refused at start.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pfs_tests::{
    Agent, ChildGuard, OtlpReceiver, ReceiverTls, TEST_CLASSES, agent_bin, free_port, otlp_metrics,
    poll, sample, spawn_exact, writer_exe,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::Value;

const N: u64 = 2;
const K: u64 = 100;

/// A CA and what it issued, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    /// A new CA; a server certificate for `localhost` and `127.0.0.1`; a
    /// client certificate.
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let write = |file: &str, pem: String| {
            let p = dir.path().join(file);
            std::fs::write(&p, pem).unwrap();
            p
        };
        let issue = |sans: Vec<String>, eku: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(sans).unwrap();
            p.distinguished_name.push(DnType::CommonName, name);
            p.extended_key_usages = vec![eku];
            (p.signed_by(&key, &ca).unwrap().pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = issue(
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = issue(
            vec!["pfs-agent".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Self {
            ca: write("ca.pem", ca.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            dir,
        }
    }

    fn receiver_tls(&self, mtls: bool) -> ReceiverTls {
        ReceiverTls {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
            client_ca: mtls.then(|| self.ca.clone()),
        }
    }
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// A TLS receiver for one transport, and its port.
fn receiver(grpc: bool, tls: &ReceiverTls) -> (OtlpReceiver, u16) {
    let port = free_port();
    let r = if grpc {
        OtlpReceiver::start_tls(Some(port), None, tls)
    } else {
        OtlpReceiver::start_tls(None, Some(port), tls)
    }
    .unwrap();
    (r, port)
}

/// The agent's environment for `grpc` or HTTP to `endpoint`, plus `extra`.
fn env(
    grpc: bool,
    endpoint: String,
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            if grpc { "grpc" } else { "http/protobuf" }.to_string(),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "3000".to_string()),
    ];
    env.extend_from_slice(extra);
    env
}

fn transport(grpc: bool) -> &'static str {
    if grpc { "grpc" } else { "http" }
}

/// `pfs_agent_otlp_exports_total{result}` now.
fn exports(agent: &Agent, result: &str) -> f64 {
    let m = agent.metrics().unwrap();
    sample(&m, "pfs_agent_otlp_exports_total", &[("result", result)])
        .unwrap_or_else(|e| panic!("{e:#}: result={result} must exist from the start"))
}

/// Whether `req` carries the writer's final count for the first class.
fn complete(req: &Value) -> bool {
    otlp_metrics(req, "pfs.events.waits").iter().any(|(_, m)| {
        m["points"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["attributes"]["event_name"] == TEST_CLASSES[0] && p["value"] == N * K)
    })
}

/// Runs the agent with `env` until `receiver` has the writer's exact
/// counts over `grpc`/HTTP, then checks the counter: successes, no
/// failure of either kind (both series present at 0).
fn delivers(grpc: bool, receiver: &mut OtlpReceiver, env: &[(&str, String)]) -> Agent {
    let service = format!("otlp-tls-{}", transport(grpc));
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, _) =
        spawn_exact(writer_exe!(), dir.path(), &service, N as u32, K as u32, 0).unwrap();
    let agent = Agent::serve_with_env(dir.path(), env).unwrap();
    let req = receiver
        .wait_for(Duration::from_secs(20), complete)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    assert_eq!(req["transport"], transport(grpc));
    let ok = poll(Duration::from_secs(10), || {
        let v = exports(&agent, "success");
        Ok((v > 0.0).then_some(v))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    assert!(ok >= 1.0);
    assert_eq!(exports(&agent, "tls_failure"), 0.0);
    assert_eq!(exports(&agent, "failure"), 0.0);
    writer.finish(Duration::from_secs(10)).unwrap();
    agent
}

/// Runs the agent with `env` until it has counted TLS failures, and
/// returns its log; nothing may be delivered or counted otherwise.
fn fails_tls(receiver: &mut OtlpReceiver, env: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::serve_with_env(dir.path(), env).unwrap();
    // Before the first export every result is there, at 0.
    for r in ["success", "failure", "tls_failure"] {
        exports(&agent, r);
    }
    poll(Duration::from_secs(15), || {
        Ok((exports(&agent, "tls_failure") >= 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("no TLS failure counted: {e:#}\n{}", agent.guard.describe()));
    assert_eq!(
        exports(&agent, "success"),
        0.0,
        "{}",
        agent.guard.describe()
    );
    assert_eq!(
        exports(&agent, "failure"),
        0.0,
        "{}",
        agent.guard.describe()
    );
    assert!(
        receiver.next(Duration::from_millis(500)).unwrap().is_none(),
        "the receiver got a request"
    );
    let log = agent.guard.stderr();
    for l in log.lines().filter(|l| l.contains("OTLP export failed")) {
        eprintln!("{l}");
    }
    log
}

#[test]
fn exports_over_tls_trusting_a_custom_ca() {
    let pki = Pki::new("custom");
    for grpc in [true, false] {
        let (mut r, port) = receiver(grpc, &pki.receiver_tls(false));
        let env = if grpc {
            // gRPC without a scheme is TLS (the OTLP specification); the
            // per-signal CA variable wins over the general one.
            env(
                true,
                format!("localhost:{port}"),
                &[
                    ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", path(&pki.ca)),
                    (
                        "OTEL_EXPORTER_OTLP_CERTIFICATE",
                        "/nonexistent/ca.pem".into(),
                    ),
                ],
            )
        } else {
            env(
                false,
                format!("https://127.0.0.1:{port}"),
                &[("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca))],
            )
        };
        let agent = delivers(grpc, &mut r, &env);
        let log = agent.guard.stderr();
        assert!(
            log.contains("OTLP metrics export enabled") && log.contains(&path(&pki.ca)),
            "the start-up line says what is trusted:\n{log}"
        );
    }
}

#[test]
fn the_system_roots_are_trusted_by_default() {
    let pki = Pki::new("system");
    for grpc in [true, false] {
        let (mut r, port) = receiver(grpc, &pki.receiver_tls(false));
        // SSL_CERT_FILE replaces the platform's store (as for OpenSSL), so
        // the test CA is the system's only root here.
        let env = env(
            grpc,
            format!("https://localhost:{port}"),
            &[
                ("SSL_CERT_FILE", path(&pki.ca)),
                ("SSL_CERT_DIR", String::new()),
            ],
        );
        let agent = delivers(grpc, &mut r, &env);
        let log = agent.guard.stderr();
        assert!(log.contains("the system's 1 root certificates"), "{log}");
    }
}

#[test]
fn mtls_works_with_a_client_certificate_and_fails_clearly_without() {
    let pki = Pki::new("mtls");
    for grpc in [true, false] {
        let (mut r, port) = receiver(grpc, &pki.receiver_tls(true));
        let endpoint = format!("https://localhost:{port}");
        // The per-signal key variable wins over the (broken) general one.
        let with_cert = env(
            grpc,
            endpoint.clone(),
            &[
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca)),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                    path(&pki.client_cert),
                ),
                (
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    "/nonexistent/client.key".into(),
                ),
                (
                    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
                    path(&pki.client_key),
                ),
            ],
        );
        drop(delivers(grpc, &mut r, &with_cert));

        let (mut r, port) = receiver(grpc, &pki.receiver_tls(true));
        let without = env(
            grpc,
            format!("https://localhost:{port}"),
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca))],
        );
        let log = fails_tls(&mut r, &without);
        assert!(
            log.contains("OTLP export failed")
                && log.contains("the collector requires a client certificate")
                && log.contains("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
            "{}: {log}",
            transport(grpc)
        );
    }
}

#[test]
fn a_wrong_ca_is_a_clear_counted_tls_failure() {
    let pki = Pki::new("right");
    let wrong = Pki::new("wrong");
    for grpc in [true, false] {
        let (mut r, port) = receiver(grpc, &pki.receiver_tls(false));
        let env = env(
            grpc,
            format!("https://127.0.0.1:{port}"),
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&wrong.ca))],
        );
        let log = fails_tls(&mut r, &env);
        assert!(
            log.contains("OTLP export failed")
                && log.contains("not issued by a trusted CA")
                && log.contains(&path(&wrong.ca))
                && log.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
            "{}: {log}",
            transport(grpc)
        );
    }
}

/// Runs `pfs-agent serve` with `args` and `env` towards an `https://`
/// endpoint, expects it to stop at start, and returns its stderr.
fn refused_at_start(args: &[&str], env: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(agent_bin());
    cmd.arg("serve")
        .arg("--shm-dir")
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--otlp-endpoint")
        .arg("https://127.0.0.1:4318")
        .args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") || k.starts_with("SSL_CERT_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let mut agent = ChildGuard::spawn("pfs-agent", cmd, false).unwrap();
    let started = Instant::now();
    let status = agent
        .wait_timeout(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the agent did not stop\n{}", agent.describe()));
    assert!(!status.success(), "{}", agent.describe());
    assert!(started.elapsed() < Duration::from_secs(30));
    agent.stderr()
}

#[test]
fn bad_tls_files_stop_the_agent_at_start_naming_file_and_setting() {
    let pki = Pki::new("files");
    let other = Pki::new("other");

    let missing = pki.dir.path().join("missing-ca.pem");
    let e = refused_at_start(&["--otlp-certificate", &path(&missing)], &[]);
    assert!(
        e.contains("cannot read the OTLP CA certificate")
            && e.contains(&path(&missing))
            && e.contains("--otlp-certificate"),
        "{e}"
    );

    // A directory where the key should be: unreadable.
    let e = refused_at_start(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca)),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                path(&pki.client_cert),
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
                path(pki.dir.path()),
            ),
        ],
    );
    assert!(
        e.contains("cannot read the OTLP client key")
            && e.contains(&path(pki.dir.path()))
            && e.contains("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"),
        "{e}"
    );

    // Another CA's key for this certificate.
    let e = refused_at_start(
        &[
            "--otlp-client-certificate",
            &path(&pki.client_cert),
            "--otlp-client-key",
            &path(&other.client_key),
        ],
        &[("OTEL_EXPORTER_OTLP_CERTIFICATE", path(&pki.ca))],
    );
    assert!(
        e.contains("cannot be used together")
            && e.contains(&path(&pki.client_cert))
            && e.contains(&path(&other.client_key))
            && e.contains("--otlp-client-key"),
        "{e}"
    );

    // No CA file and no system root to trust.
    let e = refused_at_start(&[], &[("SSL_CERT_FILE", "/nonexistent/roots.pem".into())]);
    assert!(
        e.contains("no system root certificates") && e.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "{e}"
    );
}
