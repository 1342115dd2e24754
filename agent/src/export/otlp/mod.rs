//! OTLP metrics push (the run loop; settings in [`config`], requests in
//! [`request`], names in [`names`], sending in [`transport`], TLS in
//! [`tls`]): every export interval, the [`super::model`] families of one
//! snapshot (the same cached snapshot `/metrics` serves) are sent to an
//! OpenTelemetry Collector (or any OTLP endpoint) over gRPC or
//! HTTP/protobuf, in plain text or TLS (rustls).
//!
//! # Why `opentelemetry-proto` messages, not the SDK's meter pipeline
//!
//! The 0.33 SDK's metric data model (`opentelemetry_sdk::metrics::data`)
//! is read-only: no public constructors and no producer hook, and its
//! observable instruments cannot report a pre-aggregated histogram. Our
//! histograms already are aggregated (per-bucket counts in shared memory),
//! so the exporter builds the OTLP `ExportMetricsServiceRequest` itself
//! from `opentelemetry-proto` (the message types `opentelemetry-otlp`
//! sends) and sends it with tonic (gRPC) or hyper (HTTP/protobuf). This
//! gives full control over histograms (our explicit bounds), temporality,
//! one resource per service, and failure behaviour. The OpenTelemetry
//! environment variable names come from `opentelemetry-otlp`;
//! `OTEL_RESOURCE_ATTRIBUTES` is parsed in [`config`] (split on `,`, then
//! percent-decoded, as the specification says: the SDK's detector does not
//! decode).
//!
//! # Failure behaviour
//!
//! One export at a time, from one task: while an export is in flight (at
//! most the configured timeout), missed ticks are skipped, never queued;
//! each export is built fresh from the current snapshot, so memory does not
//! grow while a collector is down. After a failure, exports pause for an
//! exponentially growing delay (interval × 2ⁿ, capped at
//! [`MAX_BACKOFF`]). `/metrics` never waits for the exporter. Results are
//! counted in `pfs_agent_otlp_exports_total{result}` (every
//! [`ExportResult`] from the start, at 0; TLS failures apart); the error
//! is logged when the state changes (first failure, recovery), not on
//! every cycle.

pub mod config;
pub mod names;
pub mod request;
pub mod starts;
pub mod tls;
pub mod transport;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::model::{self, AgentStats, ExportResult, Family};
use crate::snapshot::Snapshotter;
pub use config::{Config, ConfigError, OtlpArgs, Temporality, Transport};
use request::RequestBuilder;
use transport::{SendError, Sender};

/// Longest pause between exports after repeated failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The running exporter; [`OtlpExporter::shutdown`] sends a final export.
#[derive(Debug)]
pub struct OtlpExporter {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// The pause before the next export after `failures` consecutive failures.
pub fn backoff(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (failures - 1).min(16);
    interval
        .saturating_mul(factor)
        .min(MAX_BACKOFF.max(interval))
}

/// Starts the exporter if `args` or the environment configure an endpoint
/// (must be called inside the tokio runtime). Export results are counted
/// in `stats`, which also gives the agent's other own figures.
pub fn start(
    args: &OtlpArgs,
    snap: Arc<Snapshotter>,
    stats: Arc<AgentStats>,
) -> Result<Option<OtlpExporter>, ConfigError> {
    let Some(cfg) = Config::from_env(args)? else {
        return Ok(None);
    };
    let sender = Sender::new(&cfg)?;
    if !cfg.secure && !cfg.tls.is_empty() {
        tracing::warn!(endpoint = %cfg.endpoint, "OTLP TLS certificate settings are ignored: the endpoint is plain http://");
    }
    stats.enable_otlp();
    let agent_start = SystemTime::now();
    tracing::info!(
        endpoint = %cfg.endpoint,
        protocol = cfg.transport.name(),
        tls = %sender.tls_description().unwrap_or_else(|| "off".to_string()),
        interval = ?cfg.interval,
        temporality = ?cfg.temporality,
        "OTLP metrics export enabled"
    );
    if let Some(hint) = cfg.transport.port_warning(&cfg.endpoint) {
        tracing::warn!(endpoint = %cfg.endpoint, "{hint}");
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(run(cfg, sender, snap, stats, stopped, agent_start));
    Ok(Some(OtlpExporter { stop, task }))
}

impl OtlpExporter {
    /// Stops the loop after one final export (bounded by the export
    /// timeout, and by `limit` overall).
    pub async fn shutdown(self, limit: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(limit, &mut task).await.is_err() {
            task.abort();
            tracing::warn!("OTLP exporter did not finish its final export in time");
        }
    }
}

/// The families of one snapshot, and when each service's processes
/// started.
async fn collect(
    snap: &Arc<Snapshotter>,
    stats: &Arc<AgentStats>,
) -> Option<(Vec<Family>, Vec<starts::ServiceStarts>)> {
    let snap = snap.clone();
    let stats = stats.clone();
    // One snapshot per cycle (the shared, cached one), read off the runtime
    // threads since it may walk the segments.
    tokio::task::spawn_blocking(move || {
        let s = snap.summaries();
        (
            model::families(&s, &snap.totals(), &stats),
            starts::observe(&s),
        )
    })
    .await
    .ok()
}

async fn run(
    cfg: Config,
    sender: Sender,
    snap: Arc<Snapshotter>,
    stats: Arc<AgentStats>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    agent_start: SystemTime,
) {
    let mut builder = RequestBuilder::new(cfg.clone(), agent_start);
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await; // the first tick is immediate: export after one interval
    let mut failures = 0u32;
    let mut paused_until = Instant::now();
    let mut last_error: Option<String> = None;
    // The collector's last partial-success message, logged once per change.
    let mut last_partial: Option<transport::Partial> = None;
    // Stopping was asked for while an export was in flight: the final
    // export follows at once.
    let mut stop_now = false;
    loop {
        let stopping = stop_now
            || tokio::select! {
                _ = tick.tick() => false,
                _ = stopped.changed() => true,
            };
        if !stopping && Instant::now() < paused_until {
            continue;
        }
        let Some((families, services)) = collect(&snap, &stats).await else {
            continue;
        };
        builder.observe(&services);
        let built = builder.build(&families, SystemTime::now());
        let points = built.points;
        let req = built.request.clone();
        let result = tokio::select! {
            r = tokio::time::timeout(cfg.timeout, sender.send(&cfg, req)) => {
                r.unwrap_or(Err(SendError::Timeout(cfg.timeout)))
            }
            // Stopping while an export is in flight: give it up for the
            // final one (of fresh figures, within the shutdown's limit).
            _ = stopped.changed(), if !stopping => {
                tracing::debug!("OTLP export abandoned: the agent is stopping; exporting the final figures");
                builder.keep_baselines(built);
                stop_now = true;
                continue;
            }
        };
        match result {
            Ok(partial) => {
                if partial.rejected > 0 {
                    stats.count_otlp_export(ExportResult::Partial);
                    stats.count_otlp_rejected(partial.rejected.unsigned_abs());
                } else {
                    stats.count_otlp_export(ExportResult::Success);
                }
                builder.commit(built);
                log_partial(&partial, points, &mut last_partial);
                if last_error.take().is_some() {
                    tracing::info!(endpoint = %cfg.endpoint, after_failures = failures, "OTLP export recovered");
                } else {
                    tracing::debug!(points, "OTLP export succeeded");
                }
                failures = 0;
                paused_until = Instant::now();
            }
            Err(e) => {
                stats.count_otlp_export(e.result());
                builder.keep_baselines(built);
                failures = failures.saturating_add(1);
                // The collector's Retry-After (bounded) wins over the
                // back-off for the next attempt.
                let pause = e
                    .retry_after()
                    .unwrap_or_else(|| backoff(cfg.interval, failures));
                // Ticks keep coming every interval; those before the end of
                // the pause are skipped (half an interval of slack so the
                // tick that ends it is not).
                paused_until = Instant::now() + pause.saturating_sub(cfg.interval / 2);
                let key = e.log_key();
                if last_error.as_deref() != Some(key.as_str()) {
                    tracing::warn!(endpoint = %cfg.endpoint, error = %e, retry_in = ?pause, "OTLP export failed; dropping this export and backing off");
                    last_error = Some(key);
                }
            }
        }
        if stopping {
            break;
        }
    }
}

/// Logs what a delivered export's answer says about rejected points, once
/// per change (not on every export).
fn log_partial(p: &transport::Partial, points: usize, last: &mut Option<transport::Partial>) {
    let is_partial = p.rejected != 0 || !p.message.is_empty();
    if !is_partial {
        if last.take().is_some() {
            tracing::info!("OTLP collector accepts every data point again");
        }
        return;
    }
    if last.as_ref() == Some(p) {
        return;
    }
    let message = transport::printable(&p.message, 300);
    if p.rejected > 0 {
        tracing::warn!(rejected = p.rejected, points, collector_message = %message, "OTLP collector rejected some data points (partial success); fix what it names, the rest was delivered");
    } else {
        tracing::warn!(collector_message = %message, "OTLP collector accepted every data point with a warning (partial success, 0 rejected)");
    }
    *last = Some(p.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::model::Kind;
    use config::{int_value, parse_pairs, str_value};
    use names::{mapping_table, prometheus_name, translated_name};
    use opentelemetry_otlp::{
        OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
        OTEL_EXPORTER_OTLP_INSECURE, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
        OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_METRICS_INSECURE,
        OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_EXPORTER_OTLP_PROTOCOL,
        OTEL_EXPORTER_OTLP_TIMEOUT,
    };
    use opentelemetry_proto::tonic::metrics::v1::{
        AggregationTemporality, ResourceMetrics, metric, number_data_point,
    };
    use request::AGENT_SERVICE_NAME;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn resolve(args: &OtlpArgs, pairs: &[(&str, &str)]) -> Result<Option<Config>, ConfigError> {
        Config::resolve(args, &env_of(pairs))
    }

    #[test]
    fn the_other_transports_default_port_is_warned_about() {
        let w = Transport::HttpProtobuf.port_warning("http://c:4317/v1/metrics");
        assert!(
            w.unwrap()
                .contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc or use port 4318")
        );
        assert!(Transport::Grpc.port_warning("https://c:4318").is_some());
        assert!(Transport::Grpc.port_warning("http://c:4317").is_none());
        assert!(
            Transport::HttpProtobuf
                .port_warning("http://c:4318/v1/metrics")
                .is_none()
        );
        assert!(
            Transport::HttpProtobuf
                .port_warning("http://c/v1/metrics")
                .is_none()
        );
    }

    #[test]
    fn off_without_endpoint() {
        assert!(resolve(&OtlpArgs::default(), &[]).unwrap().is_none());
        assert!(
            resolve(
                &OtlpArgs::default(),
                &[(OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")]
            )
            .unwrap()
            .is_none()
        );
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let a = OtlpArgs::default();
        let c = resolve(&a, &[(OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(c.transport, Transport::HttpProtobuf);
        assert_eq!(c.endpoint, "http://c:4318/v1/metrics");
        let c = resolve(&a, &[(OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318/otlp/")])
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint, "http://c:4318/otlp/v1/metrics");
        // The per-signal variable is used as is, and wins.
        let c = resolve(
            &a,
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "http://m:9/custom"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://m:9/custom");
        // gRPC: as is; the flag beats the environment.
        let c = resolve(
            &a,
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4317"),
                (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.transport, c.endpoint.as_str()),
            (Transport::Grpc, "http://c:4317")
        );
        let flag = OtlpArgs {
            endpoint: Some("http://f:1".into()),
            protocol: Some("http/protobuf".into()),
            ..Default::default()
        };
        let c = resolve(
            &flag,
            &[
                (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "http://m:9/custom"),
                (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://f:1/v1/metrics");
        assert!(!c.secure);
        // https:// is TLS, for both transports.
        let c = resolve(&a, &[(OTEL_EXPORTER_OTLP_ENDPOINT, "https://c:4318")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.secure),
            ("https://c:4318/v1/metrics", true)
        );
        let c = resolve(
            &a,
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "https://c:4317"),
                (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
                // `insecure` does not apply to an endpoint with a scheme.
                (OTEL_EXPORTER_OTLP_INSECURE, "true"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!((c.endpoint.as_str(), c.secure), ("https://c:4317", true));
        // A gRPC endpoint without a scheme is secure unless `insecure`.
        let grpc = |extra: &[(&str, &str)], args: &OtlpArgs| {
            let mut env = vec![
                (OTEL_EXPORTER_OTLP_ENDPOINT, "c:4317"),
                (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
            ];
            env.extend_from_slice(extra);
            resolve(args, &env).map(|c| c.map(|c| (c.endpoint, c.secure)))
        };
        let tls = Some(("https://c:4317".to_string(), true));
        let plain = Some(("http://c:4317".to_string(), false));
        assert_eq!(grpc(&[], &a).unwrap(), tls);
        assert_eq!(
            grpc(&[(OTEL_EXPORTER_OTLP_INSECURE, "TRUE")], &a).unwrap(),
            plain
        );
        assert_eq!(
            grpc(&[(OTEL_EXPORTER_OTLP_INSECURE, "false")], &a).unwrap(),
            tls
        );
        // The per-signal variable wins; the flag wins over both.
        let both = [
            (OTEL_EXPORTER_OTLP_INSECURE, "true"),
            (OTEL_EXPORTER_OTLP_METRICS_INSECURE, "false"),
        ];
        assert_eq!(grpc(&both, &a).unwrap(), tls);
        let flag = |b| OtlpArgs {
            insecure: Some(b),
            ..Default::default()
        };
        assert_eq!(grpc(&both, &flag(true)).unwrap(), plain);
        assert_eq!(
            grpc(&[(OTEL_EXPORTER_OTLP_INSECURE, "true")], &flag(false)).unwrap(),
            tls
        );
        let e = grpc(&[(OTEL_EXPORTER_OTLP_METRICS_INSECURE, "yes")], &a).unwrap_err();
        assert!(
            e.to_string()
                .contains("OTEL_EXPORTER_OTLP_METRICS_INSECURE"),
            "{e}"
        );
        // HTTP needs a scheme, and only http(s).
        let e = resolve(&a, &[(OTEL_EXPORTER_OTLP_ENDPOINT, "c:4318")]).unwrap_err();
        assert!(matches!(e, ConfigError::NoScheme(_)), "{e}");
        let e = resolve(&a, &[(OTEL_EXPORTER_OTLP_ENDPOINT, "ftp://c:4318")]).unwrap_err();
        assert!(matches!(e, ConfigError::Scheme(_)), "{e}");
        assert!(
            resolve(
                &a,
                &[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:1"),
                    (OTEL_EXPORTER_OTLP_PROTOCOL, "http/json")
                ]
            )
            .is_err()
        );
    }

    #[test]
    fn bad_ports_and_schemes_are_refused_with_what_was_typed() {
        let a = OtlpArgs::default();
        let ep = |e: &str| resolve(&a, &[(OTEL_EXPORTER_OTLP_ENDPOINT, e)]);
        for (typed, port) in [
            ("http://127.0.0.1:abc", "abc"),
            ("http://127.0.0.1:99999", "99999"),
            ("http://127.0.0.1:0/x", "0"),
            ("http://[::1]:70000", "70000"),
        ] {
            let e = ep(typed).unwrap_err();
            assert!(matches!(e, ConfigError::Port { .. }), "{typed}: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{typed:?}")) && msg.contains(&format!("port {port:?}")),
                "{msg}"
            );
        }
        let grpc = |e: &str| {
            resolve(
                &a,
                &[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, e),
                    (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
                ],
            )
        };
        assert!(matches!(
            grpc("c:abc").unwrap_err(),
            ConfigError::Port { .. }
        ));
        // Schemes are case-insensitive.
        let c = ep("HTTP://c:4318").unwrap().unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.secure),
            ("http://c:4318/v1/metrics", false)
        );
        let c = grpc("HttpS://c:4317").unwrap().unwrap();
        assert_eq!((c.endpoint.as_str(), c.secure), ("https://c:4317", true));
        // Errors quote the endpoint as typed, not a rewritten URL.
        for typed in ["http://", "http:///v1/metrics"] {
            let e = ep(typed).unwrap_err();
            assert!(matches!(e, ConfigError::NoHost(_)), "{typed}: {e}");
            assert!(e.to_string().contains(&format!("{typed:?}")), "{e}");
        }
        for typed in ["http:/x", "https:c"] {
            let e = ep(typed).unwrap_err();
            assert!(e.to_string().contains(&format!("{typed:?}")), "{e}");
            let e = grpc(typed).unwrap_err();
            assert!(e.to_string().contains(&format!("{typed:?}")), "{e}");
        }
        let e = ep("ftp://c:4318").unwrap_err();
        assert!(e.to_string().contains("\"ftp://c:4318\""), "{e}");
        // Good ones still pass.
        assert!(ep("http://c").unwrap().is_some());
        assert!(ep("http://user@[::1]:4318/p").unwrap().is_some());
        assert!(grpc("c:4317").unwrap().is_some());
    }

    #[test]
    fn resource_attribute_values_are_percent_decoded() {
        let c = resolve(
            &OtlpArgs::default(),
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                (
                    config::OTEL_RESOURCE_ATTRIBUTES,
                    "team=a%2Cb,note=x%3Dy%20z",
                ),
            ],
        )
        .unwrap()
        .unwrap();
        let get = |k: &str| {
            c.resource
                .iter()
                .find(|(rk, _)| rk == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("team"), Some(str_value("a,b")));
        assert_eq!(get("note"), Some(str_value("x=y z")));
    }

    #[test]
    fn tls_files_flag_then_per_signal_then_general() {
        let env = [
            (OTEL_EXPORTER_OTLP_ENDPOINT, "https://c:4318"),
            (config::OTEL_EXPORTER_OTLP_CERTIFICATE, "/g/ca.pem"),
            (config::OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE, "/m/ca.pem"),
            (config::OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, "/g/cert.pem"),
            (config::OTEL_EXPORTER_OTLP_CLIENT_KEY, "/g/key.pem"),
            (config::OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY, "/m/key.pem"),
        ];
        let file = |p: &str, from: &str| {
            Some(tls::TlsFile {
                path: p.into(),
                from: from.to_string(),
            })
        };
        let c = resolve(&OtlpArgs::default(), &env).unwrap().unwrap();
        assert_eq!(
            c.tls,
            tls::TlsSettings {
                ca: file("/m/ca.pem", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"),
                client_cert: file("/g/cert.pem", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
                client_key: file("/m/key.pem", "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY"),
            }
        );
        let flags = OtlpArgs {
            certificate: Some("/f/ca.pem".into()),
            client_certificate: Some("/f/cert.pem".into()),
            client_key: Some("/f/key.pem".into()),
            ..Default::default()
        };
        let c = resolve(&flags, &env).unwrap().unwrap();
        assert_eq!(
            c.tls,
            tls::TlsSettings {
                ca: file("/f/ca.pem", "--otlp-certificate"),
                client_cert: file("/f/cert.pem", "--otlp-client-certificate"),
                client_key: file("/f/key.pem", "--otlp-client-key"),
            }
        );
        // Resolved for plain endpoints too (start() warns they are unused).
        let c = resolve(
            &OtlpArgs::default(),
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                (config::OTEL_EXPORTER_OTLP_CERTIFICATE, "/g/ca.pem"),
            ],
        )
        .unwrap()
        .unwrap();
        assert!(!c.secure && !c.tls.is_empty());
    }

    #[test]
    fn every_export_result_is_exported_from_the_start() {
        let fams = live_families();
        let f = fams
            .iter()
            .find(|f| f.name == "pfs_agent_otlp_exports")
            .expect("the OTLP exports family, once OTLP is enabled");
        let labels: Vec<&str> = f.points.iter().map(|p| p.labels[0].1.as_str()).collect();
        let want: Vec<&str> = ExportResult::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, want);
        assert!(labels.contains(&"tls_failure") && labels.contains(&"failure"));
        assert!(f.points.iter().all(|p| p.value == model::Value::Int(0)));
        // Each result counts in its own series.
        let stats = AgentStats::default();
        assert!(stats.otlp_exports().is_none(), "absent until OTLP is on");
        stats.enable_otlp();
        stats.count_otlp_export(ExportResult::TlsFailure);
        stats.count_otlp_export(ExportResult::TlsFailure);
        stats.count_otlp_export(ExportResult::Success);
        let got = stats.otlp_exports().unwrap();
        assert_eq!(
            got,
            [
                (ExportResult::Failure, 0),
                (ExportResult::Partial, 0),
                (ExportResult::Success, 1),
                (ExportResult::TlsFailure, 2)
            ]
        );
    }

    /// A header entry without `=` (a colon-style header, say) stops the
    /// agent naming the variable, as `--otlp-header` does; empty entries
    /// are skipped.
    #[test]
    fn a_malformed_header_variable_is_an_error() {
        for bad in ["Authorization: Bearer abc,x-ok=1", "bad", "=v"] {
            let e = resolve(
                &OtlpArgs::default(),
                &[
                    (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                    (OTEL_EXPORTER_OTLP_HEADERS, bad),
                ],
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("OTEL_EXPORTER_OTLP_HEADERS") && e.contains("must be KEY=VALUE"),
                "{bad}: {e}"
            );
        }
        let c = resolve(
            &OtlpArgs::default(),
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                (OTEL_EXPORTER_OTLP_HEADERS, "a=1,,b=x%20y,"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            c.headers,
            vec![("a".into(), "1".into()), ("b".into(), "x y".into())]
        );
    }

    #[test]
    fn other_settings() {
        let c = resolve(
            &OtlpArgs::default(),
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                (OTEL_EXPORTER_OTLP_HEADERS, "a=1, b = x%20y ,bad"),
                (OTEL_EXPORTER_OTLP_METRICS_HEADERS, "api-key=s3cret"),
                (OTEL_EXPORTER_OTLP_TIMEOUT, "2500"),
                (OTEL_EXPORTER_OTLP_COMPRESSION, "gzip"),
                (config::OTEL_METRIC_EXPORT_INTERVAL, "1000"),
                (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "Delta"),
                (config::OTEL_SERVICE_NAME, "svc"),
                (
                    config::OTEL_RESOURCE_ATTRIBUTES,
                    "deployment.environment=prod,host.name=h1",
                ),
                ("K8S_POD_NAME", "pod-1"),
                ("K8S_NAMESPACE", "ns"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.headers, vec![("api-key".into(), "s3cret".into())]);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert!(c.gzip);
        assert_eq!(c.interval, Duration::from_secs(1));
        assert_eq!(c.temporality, Temporality::Delta);
        assert_eq!(c.service_name.as_deref(), Some("svc"));
        let get = |k: &str| {
            c.resource
                .iter()
                .find(|(rk, _)| rk == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("host.name"), Some(str_value("h1")));
        assert_eq!(get("deployment.environment"), Some(str_value("prod")));
        assert_eq!(get("k8s.pod.name"), Some(str_value("pod-1")));
        assert_eq!(get("k8s.namespace.name"), Some(str_value("ns")));
        assert_eq!(get("service.instance.id"), Some(str_value("ns.pod-1")));
        assert_eq!(
            get("process.pid"),
            Some(int_value(i64::from(std::process::id())))
        );
        assert_eq!(parse_pairs("a=1, b = x%20y ,bad").len(), 2);
        assert_eq!(parse_pairs("b=x%20y")[0].1, "x y");

        let flags = OtlpArgs {
            endpoint: Some("http://f:1".into()),
            temporality: Some(Temporality::Cumulative),
            interval: Some(Duration::from_secs(5)),
            timeout: Some(Duration::from_secs(3)),
            headers: vec!["API-KEY=flag".into()],
            compression: Some("none".into()),
            ..Default::default()
        };
        let c = resolve(
            &flags,
            &[
                (OTEL_EXPORTER_OTLP_HEADERS, "api-key=env"),
                (OTEL_EXPORTER_OTLP_COMPRESSION, "gzip"),
                (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "delta"),
                (config::OTEL_METRIC_EXPORT_INTERVAL, "1000"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.headers, vec![("API-KEY".into(), "flag".into())]);
        assert!(!c.gzip);
        assert_eq!(c.temporality, Temporality::Cumulative);
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.timeout, Duration::from_secs(3));
    }

    #[test]
    fn histogram_aggregation_flag_then_variable() {
        use config::{
            HistogramAggregation, OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION as VAR,
        };
        let ep = (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318");
        let c = resolve(&OtlpArgs::default(), &[ep]).unwrap().unwrap();
        assert_eq!(
            c.histogram_aggregation,
            HistogramAggregation::ExplicitBucket
        );
        let env = [ep, (VAR, "BASE2_exponential_bucket_histogram")];
        let c = resolve(&OtlpArgs::default(), &env).unwrap().unwrap();
        assert_eq!(
            c.histogram_aggregation,
            HistogramAggregation::Base2Exponential
        );
        let flag = OtlpArgs {
            histogram_aggregation: Some(HistogramAggregation::ExplicitBucket),
            ..OtlpArgs::default()
        };
        let c = resolve(&flag, &env).unwrap().unwrap();
        assert_eq!(
            c.histogram_aggregation,
            HistogramAggregation::ExplicitBucket
        );
        let e = resolve(&OtlpArgs::default(), &[ep, (VAR, "exponential")]).unwrap_err();
        assert!(
            e.to_string().contains("base2_exponential_bucket_histogram"),
            "{e}"
        );
    }

    #[test]
    fn backoff_is_exponential_and_capped() {
        let i = Duration::from_secs(1);
        let b: Vec<u64> = (0..12).map(|n| backoff(i, n).as_secs()).collect();
        assert_eq!(b, [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(
            backoff(Duration::from_secs(600), 3),
            Duration::from_secs(600)
        );
    }

    /// A snapshot with real data: this process records waits into a
    /// segment in a temporary directory.
    fn live_families() -> Vec<Family> {
        static SHM: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
            std::sync::OnceLock::new();
        let (_, shm) = SHM.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            pfs_client::init_with(pfs_client::Config::new("otlp-names").shm_dir(dir.path()))
                .expect("pfs_client::init_with");
            let shm = pfs_client::segment_path()
                .expect("pfs_client initialised")
                .parent()
                .unwrap()
                .to_path_buf();
            (dir, shm)
        });
        let class = pfs_client::WaitClass::register("wait/synch/rwlock/otlp/names");
        for _ in 0..3 {
            class.start(pfs_client::Operation::ReadLock, 0).end();
        }
        let snap = Snapshotter::new(
            crate::segments::SegmentSet::new(shm, Duration::from_secs(60)),
            Duration::ZERO,
        );
        let stats = AgentStats::default();
        stats.enable_otlp();
        let s = snap.get();
        let fams = model::families(&s, &snap.totals(), &stats);
        assert!(
            fams.iter()
                .any(|f| f.kind == Kind::Histogram && !f.points.is_empty()),
            "the snapshot has histogram points"
        );
        fams
    }

    #[test]
    fn translation_rules() {
        assert_eq!(
            prometheus_name("system.filesystem.usage", "By", false, true),
            "system_filesystem_usage_bytes"
        );
        assert_eq!(
            prometheus_name("system.network.dropped", "{packets}", true, false),
            "system_network_dropped_total"
        );
        assert_eq!(
            prometheus_name("system.memory.utilization", "1", false, true),
            "system_memory_utilization_ratio"
        );
        assert_eq!(
            prometheus_name("x.count", "1", true, false),
            "x_count_total"
        );
        assert_eq!(
            prometheus_name("(lambda).function.executions(#)", "", false, true),
            "lambda_function_executions"
        );
        assert_eq!(
            prometheus_name("net.io", "By/s", false, true),
            "net_io_bytes_per_second"
        );
        assert_eq!(
            prometheus_name("a.b.seconds", "s", true, false),
            "a_b_seconds_total"
        );
    }

    #[test]
    fn otel_names_translate_to_the_prometheus_names() {
        let fams = live_families();
        let mut wrong = Vec::new();
        for f in &fams {
            let got = translated_name(f);
            if got != f.prometheus_name() {
                wrong.push(format!(
                    "{} ({:?}, unit {:?}) translates to {got}, /metrics says {}",
                    f.otel_name,
                    f.kind,
                    f.otel_unit,
                    f.prometheus_name()
                ));
            }
            assert!(
                !f.otel_name.contains('_') || f.otel_name.starts_with("pfs."),
                "{}",
                f.otel_name
            );
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(fams.iter().any(|f| f.name == "pfs_agent_otlp_exports"));
    }

    #[test]
    fn docs_list_every_family() {
        let fams = live_families();
        let table = mapping_table(&fams);
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/OTLP.md"),
        )
        .expect("docs/OTLP.md");
        assert!(
            doc.contains(&table),
            "docs/OTLP.md must contain the current name mapping table:\n\n{table}"
        );
    }

    #[test]
    fn request_from_families() {
        let fams = live_families();
        let cfg = resolve(
            &OtlpArgs::default(),
            &[(OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318")],
        )
        .unwrap()
        .unwrap();
        let mut b = RequestBuilder::new(cfg.clone(), SystemTime::now());
        let t0 = SystemTime::now();
        let built = b.build(&fams, t0);
        let names = |r: &ResourceMetrics| {
            r.resource
                .as_ref()
                .unwrap()
                .attributes
                .iter()
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.clone())
        };
        let rms = &built.request.resource_metrics;
        assert!(
            rms.iter()
                .any(|r| names(r) == Some(str_value("otlp-names")))
        );
        assert!(
            rms.iter()
                .any(|r| names(r) == Some(str_value(AGENT_SERVICE_NAME)))
        );
        let svc = rms
            .iter()
            .find(|r| names(r) == Some(str_value("otlp-names")))
            .unwrap();
        let metrics = &svc.scope_metrics[0].metrics;
        let h = metrics
            .iter()
            .find(|m| m.name == "pfs.events.waits.duration")
            .unwrap();
        let Some(metric::Data::Histogram(h)) = &h.data else {
            panic!("not a histogram")
        };
        let p = h
            .data_points
            .iter()
            .find(|p| {
                p.attributes
                    .iter()
                    .any(|a| a.value == Some(str_value("wait/synch/rwlock/otlp/names")))
            })
            .unwrap();
        assert!(p.attributes.iter().all(|a| a.key != "service"));
        assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
        assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count);
        assert!(p.count >= 3);
        assert_eq!(
            h.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        b.commit(built);

        // Delta: the second export carries only what changed.
        let mut d = RequestBuilder::new(
            Config {
                temporality: Temporality::Delta,
                service_name: Some("forced".into()),
                ..cfg
            },
            SystemTime::now(),
        );
        let first = d.build(&fams, t0);
        assert_eq!(
            first.request.resource_metrics.len(),
            1,
            "one forced resource"
        );
        d.commit(first);
        let second = d.build(&fams, t0 + Duration::from_secs(1));
        let m = &second.request.resource_metrics[0].scope_metrics[0].metrics;
        let waits = m.iter().find(|m| m.name == "pfs.events.waits").unwrap();
        let Some(metric::Data::Sum(s)) = &waits.data else {
            panic!("not a sum")
        };
        assert!(s.is_monotonic);
        assert_eq!(
            s.aggregation_temporality,
            AggregationTemporality::Delta as i32
        );
        for p in &s.data_points {
            assert!(p.attributes.iter().any(|a| a.key == "service"));
            assert_eq!(p.value, Some(number_data_point::Value::AsInt(0)));
            assert!(p.start_time_unix_nano < p.time_unix_nano);
        }
    }
}
