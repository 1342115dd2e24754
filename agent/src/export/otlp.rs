//! OTLP metrics push: every export interval, the [`super::model`] families
//! of one snapshot (the same cached snapshot `/metrics` serves) are sent to
//! an OpenTelemetry Collector (or any OTLP endpoint) over gRPC or
//! HTTP/protobuf.
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
//! environment variable names come from `opentelemetry-otlp`, and
//! `OTEL_RESOURCE_ATTRIBUTES` is parsed by `opentelemetry_sdk`'s
//! environment resource detector.
//!
//! # Failure behaviour
//!
//! One export at a time, from one task: while an export is in flight (at
//! most the configured timeout), missed ticks are skipped, never queued;
//! each export is built fresh from the current snapshot, so memory does not
//! grow while a collector is down. After a failure, exports pause for an
//! exponentially growing delay (interval × 2ⁿ, capped at
//! [`MAX_BACKOFF`]). `/metrics` never waits for the exporter. Results are
//! counted in `pfs_agent_otlp_exports_total{result}`; the error is logged
//! when the state changes (first failure, recovery), not on every cycle.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt, Full};
use opentelemetry_otlp::{
    OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_METRICS_COMPRESSION, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_EXPORTER_OTLP_METRICS_TIMEOUT,
    OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TIMEOUT,
};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::model::{self, Family, Kind, Point, Value};
use crate::cli::parse_duration;
use crate::snapshot::Snapshotter;

/// `OTEL_METRIC_EXPORT_INTERVAL` (milliseconds).
pub const OTEL_METRIC_EXPORT_INTERVAL: &str = "OTEL_METRIC_EXPORT_INTERVAL";
/// `OTEL_SERVICE_NAME`.
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `OTEL_RESOURCE_ATTRIBUTES`.
pub const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
/// Default export interval (the OpenTelemetry default, 60 s).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// Default export timeout (the OpenTelemetry default, 10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause between exports after repeated failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// `service.name` of the agent's own metrics (those without a `service`
/// label) when exporting one resource per service.
pub const AGENT_SERVICE_NAME: &str = "pfs-agent";
/// Downward-API environment variables and the resource attribute each sets.
pub const K8S_ENV: [(&str, &str); 3] = [
    ("K8S_POD_NAME", "k8s.pod.name"),
    ("K8S_NAMESPACE", "k8s.namespace.name"),
    ("K8S_NODE_NAME", "k8s.node.name"),
];

/// OTLP options of `serve` and `demo`. Each flag overrides the
/// corresponding OpenTelemetry environment variable; OTLP is off unless an
/// endpoint is configured (flag or environment).
#[derive(Debug, Args, Clone, Default)]
pub struct OtlpArgs {
    /// OTLP endpoint; enables the push. For http/protobuf a base URL gets
    /// `/v1/metrics` appended unless already there. Overrides
    /// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT and OTEL_EXPORTER_OTLP_ENDPOINT.
    #[arg(long = "otlp-endpoint", value_name = "URL")]
    pub endpoint: Option<String>,
    /// OTLP transport (overrides OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL;
    /// default http/protobuf).
    #[arg(long = "otlp-protocol", value_name = "PROTOCOL", value_parser = ["grpc", "http/protobuf"])]
    pub protocol: Option<String>,
    /// Aggregation temporality (overrides
    /// OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE; default cumulative).
    #[arg(long = "otlp-temporality", value_enum)]
    pub temporality: Option<Temporality>,
    /// Export interval, e.g. 10s (overrides OTEL_METRIC_EXPORT_INTERVAL;
    /// default 60s).
    #[arg(long = "otlp-interval", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Timeout of one export, e.g. 5s (overrides
    /// OTEL_EXPORTER_OTLP_[METRICS_]TIMEOUT; default 10s).
    #[arg(long = "otlp-timeout", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Extra request header `key=value` (repeatable; added to
    /// OTEL_EXPORTER_OTLP_[METRICS_]HEADERS, overriding equal keys).
    #[arg(long = "otlp-header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Compression (overrides OTEL_EXPORTER_OTLP_[METRICS_]COMPRESSION).
    #[arg(long = "otlp-compression", value_parser = ["gzip", "none"])]
    pub compression: Option<String>,
}

/// Aggregation temporality of sums and histograms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Temporality {
    /// Totals since the start (the default).
    #[default]
    Cumulative,
    /// Change since the previous successful export.
    Delta,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// gRPC (tonic), `grpc`.
    Grpc,
    /// HTTP POST of a protobuf body, `http/protobuf`.
    HttpProtobuf,
}

/// The resolved exporter configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Full endpoint URL (for HTTP, including `/v1/metrics`).
    pub endpoint: String,
    /// Transport.
    pub transport: Transport,
    /// Request headers.
    pub headers: Vec<(String, String)>,
    /// Timeout of one export.
    pub timeout: Duration,
    /// Gzip request bodies.
    pub gzip: bool,
    /// Export interval.
    pub interval: Duration,
    /// Temporality.
    pub temporality: Temporality,
    /// `OTEL_SERVICE_NAME`, which forces one resource.
    pub service_name: Option<String>,
    /// Resource attributes besides `service.name`: detected ones, then
    /// `OTEL_RESOURCE_ATTRIBUTES` (which overrides them).
    pub resource: Vec<(String, AnyValue)>,
}

fn nonempty(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

fn env_ms(
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&str],
) -> anyhow::Result<Option<Duration>> {
    for n in names {
        if let Some(v) = nonempty(env(n)) {
            let ms: u64 = v
                .parse()
                .with_context(|| format!("{n}={v:?} is not a number of milliseconds"))?;
            return Ok(Some(Duration::from_millis(ms)));
        }
    }
    Ok(None)
}

fn first_env(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<(String, String)> {
    names
        .iter()
        .find_map(|n| nonempty(env(n)).map(|v| (n.to_string(), v)))
}

/// Percent-decodes `%XX` sequences (header and resource values).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses `k1=v1,k2=v2` (values percent-decoded), skipping malformed pairs.
pub fn parse_pairs(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

/// `http/protobuf` endpoint from a base URL: `/v1/metrics` appended to its
/// path (per the OTLP exporter specification).
fn append_metrics_path(base: &str) -> String {
    if base.ends_with("/v1/metrics") {
        return base.to_string();
    }
    format!("{}/v1/metrics", base.trim_end_matches('/'))
}

impl Config {
    /// The configuration from `args` and the process environment; `None`
    /// when no endpoint is configured (OTLP off).
    pub fn from_env(args: &OtlpArgs) -> anyhow::Result<Option<Self>> {
        let mut c = match Self::resolve(args, &|k| std::env::var(k).ok())? {
            Some(c) => c,
            None => return Ok(None),
        };
        // OTEL_RESOURCE_ATTRIBUTES through the SDK's detector (it
        // percent-decodes and ignores malformed pairs).
        let detected = opentelemetry_sdk::Resource::builder_empty()
            .with_detector(Box::new(
                opentelemetry_sdk::resource::EnvResourceDetector::new(),
            ))
            .build();
        let mut user: Vec<(String, AnyValue)> = detected
            .iter()
            .map(|(k, v)| (k.to_string(), AnyValue::from(v.clone())))
            .collect();
        user.sort_by(|a, b| a.0.cmp(&b.0));
        merge_attrs(&mut c.resource, user);
        Ok(Some(c))
    }

    /// Resolves the configuration from `args` and `env` (a lookup of
    /// environment variables). `OTEL_RESOURCE_ATTRIBUTES` is parsed here
    /// too, without percent-decoding subtleties beyond `%XX`.
    pub fn resolve(
        args: &OtlpArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<Self>> {
        let transport = match args.protocol.clone().or_else(|| {
            first_env(
                env,
                &[
                    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
                    OTEL_EXPORTER_OTLP_PROTOCOL,
                ],
            )
            .map(|(_, v)| v)
        }) {
            None => Transport::HttpProtobuf,
            Some(p) => match p.as_str() {
                "grpc" => Transport::Grpc,
                "http/protobuf" => Transport::HttpProtobuf,
                other => {
                    bail!("OTLP protocol {other:?} is not supported; use grpc or http/protobuf")
                }
            },
        };
        let endpoint = if let Some(e) = nonempty(args.endpoint.clone()) {
            match transport {
                Transport::Grpc => e,
                Transport::HttpProtobuf => append_metrics_path(&e),
            }
        } else if let Some(e) = nonempty(env(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)) {
            e
        } else if let Some(e) = nonempty(env(OTEL_EXPORTER_OTLP_ENDPOINT)) {
            match transport {
                Transport::Grpc => e,
                Transport::HttpProtobuf => append_metrics_path(&e),
            }
        } else {
            return Ok(None);
        };
        let endpoint = if endpoint.contains("://") {
            endpoint
        } else {
            // The specification: a gRPC endpoint without a scheme is
            // secure. HTTP endpoints must have one.
            match transport {
                Transport::Grpc => format!("https://{endpoint}"),
                Transport::HttpProtobuf => {
                    bail!("OTLP endpoint {endpoint:?} has no scheme; use http://HOST:PORT")
                }
            }
        };
        if endpoint.starts_with("https://") {
            bail!(
                "OTLP endpoint {endpoint} needs TLS, which this pfs-agent build does not \
                 support; send to a collector over plain http:// (e.g. a local \
                 OpenTelemetry Collector sidecar that forwards over TLS)"
            );
        }
        if !endpoint.starts_with("http://") {
            bail!("OTLP endpoint {endpoint:?}: the scheme must be http://");
        }
        endpoint
            .parse::<hyper::Uri>()
            .with_context(|| format!("OTLP endpoint {endpoint:?} is not a valid URL"))?;

        let mut headers = first_env(
            env,
            &[
                OTEL_EXPORTER_OTLP_METRICS_HEADERS,
                OTEL_EXPORTER_OTLP_HEADERS,
            ],
        )
        .map(|(_, v)| parse_pairs(&v))
        .unwrap_or_default();
        for h in &args.headers {
            let Some((k, v)) = h.split_once('=') else {
                bail!("--otlp-header {h:?} must be KEY=VALUE");
            };
            headers.retain(|(hk, _)| !hk.eq_ignore_ascii_case(k.trim()));
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        for (k, v) in &headers {
            hyper::header::HeaderName::from_bytes(k.as_bytes())
                .with_context(|| format!("OTLP header name {k:?} is invalid"))?;
            hyper::header::HeaderValue::from_str(v)
                .with_context(|| format!("OTLP header {k} has an invalid value"))?;
        }

        let timeout = match args.timeout {
            Some(t) => t,
            None => env_ms(
                env,
                &[
                    OTEL_EXPORTER_OTLP_METRICS_TIMEOUT,
                    OTEL_EXPORTER_OTLP_TIMEOUT,
                ],
            )?
            .unwrap_or(DEFAULT_TIMEOUT),
        };
        let interval = match args.interval {
            Some(t) => t,
            None => env_ms(env, &[OTEL_METRIC_EXPORT_INTERVAL])?.unwrap_or(DEFAULT_INTERVAL),
        };
        anyhow::ensure!(
            !interval.is_zero() && !timeout.is_zero(),
            "the OTLP export interval and timeout must be positive"
        );

        let compression = args.compression.clone().or_else(|| {
            first_env(
                env,
                &[
                    OTEL_EXPORTER_OTLP_METRICS_COMPRESSION,
                    OTEL_EXPORTER_OTLP_COMPRESSION,
                ],
            )
            .map(|(_, v)| v.to_ascii_lowercase())
        });
        let gzip = match compression.as_deref() {
            None | Some("none") => false,
            Some("gzip") => true,
            Some(other) => bail!("OTLP compression {other:?} is not supported; use gzip or none"),
        };

        let temporality = match args.temporality {
            Some(t) => t,
            None => match nonempty(env(OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE))
                .map(|s| s.to_ascii_lowercase())
                .as_deref()
            {
                None | Some("cumulative") => Temporality::Cumulative,
                Some("delta") => Temporality::Delta,
                // Low-memory keeps asynchronous instruments (all of ours)
                // cumulative.
                Some("lowmemory") => Temporality::Cumulative,
                Some(other) => bail!(
                    "{OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE}={other:?}: use cumulative or delta"
                ),
            },
        };

        let service_name = nonempty(env(OTEL_SERVICE_NAME));
        let host = nonempty(std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .or_else(|| nonempty(env("HOSTNAME")))
            .unwrap_or_else(|| "localhost".to_string());
        let pid = std::process::id();
        let k8s: Vec<(String, String)> = K8S_ENV
            .iter()
            .filter_map(|(var, attr)| nonempty(env(var)).map(|v| (attr.to_string(), v)))
            .collect();
        let pod = k8s.iter().find(|(k, _)| k == "k8s.pod.name").map(|p| &p.1);
        let ns = k8s
            .iter()
            .find(|(k, _)| k == "k8s.namespace.name")
            .map(|p| &p.1);
        let instance = match (ns, pod) {
            (Some(ns), Some(pod)) => format!("{ns}.{pod}"),
            (None, Some(pod)) => pod.clone(),
            _ => format!("{host}:{pid}"),
        };
        let mut resource = vec![
            ("service.instance.id".to_string(), str_value(&instance)),
            ("host.name".to_string(), str_value(&host)),
            ("process.pid".to_string(), int_value(i64::from(pid))),
        ];
        resource.extend(k8s.iter().map(|(k, v)| (k.clone(), str_value(v))));
        if let Some(ra) = nonempty(env(OTEL_RESOURCE_ATTRIBUTES)) {
            let user = parse_pairs(&ra)
                .into_iter()
                .map(|(k, v)| (k, str_value(&v)))
                .collect();
            merge_attrs(&mut resource, user);
        }
        Ok(Some(Self {
            endpoint,
            transport,
            headers,
            timeout,
            gzip,
            interval,
            temporality,
            service_name,
            resource,
        }))
    }

    /// The resource's `service.name` override: `OTEL_SERVICE_NAME`, else a
    /// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`.
    fn forced_service(&self) -> Option<AnyValue> {
        self.service_name.as_deref().map(str_value).or_else(|| {
            self.resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
    }
}

fn merge_attrs(base: &mut Vec<(String, AnyValue)>, over: Vec<(String, AnyValue)>) {
    for (k, v) in over {
        match base.iter_mut().find(|(bk, _)| *bk == k) {
            Some(slot) => slot.1 = v,
            None => base.push((k, v)),
        }
    }
}

fn str_value(s: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.to_string())),
    }
}

fn int_value(v: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(v)),
    }
}

fn kv(k: &str, v: AnyValue) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(v),
        ..Default::default()
    }
}

// --- exports counter ---------------------------------------------------------

/// Export outcomes since the agent started.
#[derive(Debug)]
pub struct ExportCounts {
    enabled: AtomicBool,
    success: AtomicU64,
    failure: AtomicU64,
}

impl ExportCounts {
    /// `(success, failure)`.
    pub fn get(&self) -> (u64, u64) {
        (
            self.success.load(Ordering::Relaxed),
            self.failure.load(Ordering::Relaxed),
        )
    }
}

/// The process's export outcomes (exported as
/// `pfs_agent_otlp_exports_total`).
pub static OTLP_EXPORTS: ExportCounts = ExportCounts {
    enabled: AtomicBool::new(false),
    success: AtomicU64::new(0),
    failure: AtomicU64::new(0),
};

/// The exporter's own families (`pfs_agent_otlp_exports_total{result}`),
/// present once OTLP export is enabled.
pub fn families() -> Vec<Family> {
    if !OTLP_EXPORTS.enabled.load(Ordering::Relaxed) {
        return Vec::new();
    }
    let (ok, failed) = OTLP_EXPORTS.get();
    vec![Family {
        name: "pfs_agent_otlp_exports",
        unit: None,
        otel_name: "pfs.agent.otlp.exports",
        otel_unit: "{export}",
        help: "OTLP metric exports, by result.",
        kind: Kind::Counter,
        points: vec![
            Point {
                labels: vec![("result", "success".to_string())],
                value: Value::Int(ok),
            },
            Point {
                labels: vec![("result", "failure".to_string())],
                value: Value::Int(failed),
            },
        ],
    }]
}

// --- request building ----------------------------------------------------------

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A point's attributes, value and series key.
type SeriesPoint = (Vec<KeyValue>, Value, String);

/// What the previous export said about one series.
#[derive(Debug, Clone)]
struct SeriesState {
    start_ns: u64,
    last_ns: u64,
    value: Value,
}

/// Turns model families into OTLP requests, keeping per-series start times
/// (cumulative) or the previous values (delta). State is committed only
/// after a successful export, so a delta after failures covers the gap.
#[derive(Debug)]
pub struct RequestBuilder {
    cfg: Config,
    start_ns: u64,
    series: HashMap<String, SeriesState>,
}

/// A request and the series state to commit if it is delivered.
#[derive(Debug)]
pub struct Built {
    /// The request.
    pub request: ExportMetricsServiceRequest,
    /// Data points in it.
    pub points: usize,
    next: HashMap<String, SeriesState>,
}

fn monotonic_le(prev: &Value, cur: &Value) -> bool {
    match (prev, cur) {
        (Value::Int(a), Value::Int(b)) => a <= b,
        (Value::Float(a), Value::Float(b)) => a <= b,
        (Value::Histogram { count: a, .. }, Value::Histogram { count: b, .. }) => a <= b,
        _ => false,
    }
}

fn minus(cur: &Value, prev: &Value) -> Value {
    match (cur, prev) {
        (Value::Int(a), Value::Int(b)) => Value::Int(a - b),
        (Value::Float(a), Value::Float(b)) => Value::Float(a - b),
        (
            Value::Histogram {
                sum,
                count,
                buckets,
            },
            Value::Histogram {
                sum: ps,
                count: pc,
                buckets: pb,
            },
        ) if buckets.len() == pb.len() => Value::Histogram {
            sum: sum - ps,
            count: count - pc,
            buckets: buckets
                .iter()
                .zip(pb)
                .map(|((le, c), (_, p))| (*le, c.saturating_sub(*p)))
                .collect(),
        },
        _ => cur.clone(),
    }
}

impl RequestBuilder {
    /// A builder for `cfg`; cumulative series start now.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            start_ns: unix_nanos(SystemTime::now()),
            series: HashMap::new(),
        }
    }

    /// Records a delivered request's series state.
    pub fn commit(&mut self, built: Built) {
        self.series = built.next;
    }

    fn resource(&self, service: Option<&str>) -> Resource {
        let mut attrs = vec![kv(
            "service.name",
            self.cfg
                .forced_service()
                .unwrap_or_else(|| str_value(service.unwrap_or(AGENT_SERVICE_NAME))),
        )];
        attrs.extend(
            self.cfg
                .resource
                .iter()
                .filter(|(k, _)| k != "service.name")
                .map(|(k, v)| kv(k, v.clone())),
        );
        Resource {
            attributes: attrs,
            ..Default::default()
        }
    }

    /// The request for `families` at time `now`.
    pub fn build(&self, families: &[Family], now: SystemTime) -> Built {
        let now_ns = unix_nanos(now);
        let split = self.cfg.forced_service().is_none();
        let delta = self.cfg.temporality == Temporality::Delta;
        let temporality = if delta {
            AggregationTemporality::Delta
        } else {
            AggregationTemporality::Cumulative
        } as i32;
        // resource key (service or None for the agent's own) → metrics
        let mut by_res: BTreeMap<Option<String>, Vec<Metric>> = BTreeMap::new();
        let mut next = HashMap::new();
        let mut points = 0;
        for f in families {
            let mut per_res: BTreeMap<Option<String>, Vec<SeriesPoint>> = BTreeMap::new();
            for p in &f.points {
                let service = p
                    .labels
                    .iter()
                    .find(|(k, _)| *k == "service")
                    .map(|(_, v)| v.clone());
                let attrs: Vec<KeyValue> = p
                    .labels
                    .iter()
                    .filter(|(k, _)| !(split && *k == "service"))
                    .map(|(k, v)| kv(k, str_value(v)))
                    .collect();
                let key = format!("{}\u{0}{:?}", f.otel_name, p.labels);
                let res = if split { service } else { None };
                per_res
                    .entry(res)
                    .or_default()
                    .push((attrs, p.value.clone(), key));
            }
            for (res, pts) in per_res {
                let data = self.data(f, pts, now_ns, delta, temporality, &mut next);
                points += data.1;
                by_res.entry(res).or_default().push(Metric {
                    name: f.otel_name.to_string(),
                    description: f.help.to_string(),
                    unit: f.otel_unit.to_string(),
                    data: Some(data.0),
                    ..Default::default()
                });
            }
        }
        let scope = InstrumentationScope {
            name: "pfs-agent".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        };
        let resource_metrics = by_res
            .into_iter()
            .map(|(res, metrics)| ResourceMetrics {
                resource: Some(self.resource(res.as_deref())),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope.clone()),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        Built {
            request: ExportMetricsServiceRequest { resource_metrics },
            points,
            next,
        }
    }

    /// The OTLP data of one family's points for one resource, and the
    /// number of points.
    fn data(
        &self,
        f: &Family,
        pts: Vec<SeriesPoint>,
        now_ns: u64,
        delta: bool,
        temporality: i32,
        next: &mut HashMap<String, SeriesState>,
    ) -> (metric::Data, usize) {
        let n = pts.len();
        let mut numbers = Vec::new();
        let mut hists = Vec::new();
        for (attrs, value, key) in pts {
            let (start_ns, out) = match f.kind {
                Kind::Counter | Kind::Histogram => {
                    let prev = self
                        .series
                        .get(&key)
                        .filter(|s| monotonic_le(&s.value, &value));
                    let (start, out, series_start) = match (prev, delta) {
                        (Some(p), false) => (p.start_ns, value.clone(), p.start_ns),
                        (Some(p), true) => (p.last_ns, minus(&value, &p.value), p.start_ns),
                        // New series, or a reset (value went down).
                        (None, _) => {
                            let s = if self.series.contains_key(&key) {
                                now_ns.saturating_sub(1)
                            } else {
                                self.start_ns
                            };
                            (s, value.clone(), s)
                        }
                    };
                    next.insert(
                        key,
                        SeriesState {
                            start_ns: series_start,
                            last_ns: now_ns,
                            value,
                        },
                    );
                    (start, out)
                }
                Kind::Gauge | Kind::Info => (0, value),
            };
            match out {
                Value::Int(v) => numbers.push(NumberDataPoint {
                    attributes: attrs,
                    start_time_unix_nano: start_ns,
                    time_unix_nano: now_ns,
                    value: Some(number_data_point::Value::AsInt(v as i64)),
                    ..Default::default()
                }),
                Value::Float(v) => numbers.push(NumberDataPoint {
                    attributes: attrs,
                    start_time_unix_nano: start_ns,
                    time_unix_nano: now_ns,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    ..Default::default()
                }),
                Value::Histogram {
                    sum,
                    count,
                    buckets,
                } => {
                    let mut bounds: Vec<f64> = buckets.iter().map(|b| b.0).collect();
                    let mut counts: Vec<u64> = buckets.iter().map(|b| b.1).collect();
                    if bounds.last().is_some_and(|b| b.is_infinite()) {
                        bounds.pop();
                    } else {
                        counts.push(0);
                    }
                    hists.push(HistogramDataPoint {
                        attributes: attrs,
                        start_time_unix_nano: start_ns,
                        time_unix_nano: now_ns,
                        count,
                        sum: Some(sum),
                        bucket_counts: counts,
                        explicit_bounds: bounds,
                        ..Default::default()
                    });
                }
            }
        }
        let data = match f.kind {
            Kind::Counter => metric::Data::Sum(Sum {
                data_points: numbers,
                aggregation_temporality: temporality,
                is_monotonic: true,
            }),
            Kind::Gauge | Kind::Info => metric::Data::Gauge(Gauge {
                data_points: numbers,
            }),
            Kind::Histogram => metric::Data::Histogram(Histogram {
                data_points: hists,
                aggregation_temporality: temporality,
            }),
        };
        (data, n)
    }
}

// --- OTel → Prometheus names ------------------------------------------------------

/// Prometheus unit word of a UCUM unit (the translation table of the
/// OpenTelemetry → Prometheus compatibility specification, as used by the
/// Collector and Prometheus' OTLP receiver).
fn ucum_word(u: &str) -> String {
    match u {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        other => other,
    }
    .to_string()
}

fn per_word(u: &str) -> String {
    match u {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        other => other,
    }
    .to_string()
}

/// Splits on everything but ASCII letters, digits and `:`, and joins the
/// non-empty pieces with `_`.
fn sanitize(s: &str) -> String {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == ':'))
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

/// The Prometheus name an OTLP metric `name` with `unit` becomes under the
/// OpenTelemetry → Prometheus translation (with suffixes): invalid
/// characters become `_`, the UCUM unit is appended as a word unless the
/// name already ends with it (`{annotation}` units add nothing; `1` adds
/// `_ratio` to gauges only), and monotonic sums get `_total`.
pub fn prometheus_name(name: &str, unit: &str, monotonic_sum: bool, gauge: bool) -> String {
    let mut n = sanitize(name);
    // Annotations in braces are dropped from units.
    let mut u = String::new();
    let mut depth = 0;
    for c in unit.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            c if depth == 0 => u.push(c),
            _ => {}
        }
    }
    let u = u.trim();
    let suffix = if u == "1" {
        if gauge {
            "ratio".to_string()
        } else {
            String::new()
        }
    } else if let Some((a, b)) = u.split_once('/') {
        let (a, b) = (sanitize(&ucum_word(a)), sanitize(&per_word(b)));
        match (a.is_empty(), b.is_empty()) {
            (false, false) => format!("{a}_per_{b}"),
            (false, true) => a,
            (true, false) => format!("per_{b}"),
            (true, true) => String::new(),
        }
    } else {
        sanitize(&ucum_word(u))
    };
    if !suffix.is_empty() && !n.ends_with(&format!("_{suffix}")) && n != suffix {
        n.push('_');
        n.push_str(&suffix);
    }
    if monotonic_sum && !n.ends_with("_total") {
        n.push_str("_total");
    }
    n
}

/// What `f` becomes in Prometheus when sent over OTLP: a monotonic sum for
/// counters, a gauge for gauges and info families, a histogram.
pub fn translated_name(f: &Family) -> String {
    prometheus_name(
        f.otel_name,
        f.otel_unit,
        f.kind == Kind::Counter,
        matches!(f.kind, Kind::Gauge | Kind::Info),
    )
}

/// The OTLP type of a family's metric.
pub fn otlp_type(k: Kind) -> &'static str {
    match k {
        Kind::Counter => "Sum (monotonic)",
        Kind::Gauge | Kind::Info => "Gauge",
        Kind::Histogram => "Histogram",
    }
}

/// The name mapping of `families` as a Markdown table (docs/OTLP.md).
pub fn mapping_table(families: &[Family]) -> String {
    let mut out = String::from(
        "| OTel name | OTel unit | OTLP type | Prometheus name |\n|---|---|---|---|\n",
    );
    let mut seen = std::collections::BTreeSet::new();
    for f in families {
        if seen.insert(f.otel_name) {
            let unit = if f.otel_unit.is_empty() {
                "(none)".to_string()
            } else {
                format!("`{}`", f.otel_unit)
            };
            out.push_str(&format!(
                "| `{}` | {unit} | {} | `{}` |\n",
                f.otel_name,
                otlp_type(f.kind),
                f.prometheus_name()
            ));
        }
    }
    out
}

// --- transport -------------------------------------------------------------------

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// A connection to the collector.
#[derive(Debug, Clone)]
enum Sender {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    Http(HttpClient),
}

impl Sender {
    fn new(cfg: &Config) -> anyhow::Result<Self> {
        Ok(match cfg.transport {
            Transport::Grpc => {
                let ep = tonic::transport::Endpoint::from_shared(cfg.endpoint.clone())
                    .with_context(|| format!("OTLP endpoint {:?} is invalid", cfg.endpoint))?
                    .connect_timeout(cfg.timeout)
                    .timeout(cfg.timeout);
                let mut c = MetricsServiceClient::new(ep.connect_lazy());
                if cfg.gzip {
                    c = c.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Self::Grpc(c)
            }
            Transport::HttpProtobuf => {
                let mut conn = hyper_util::client::legacy::connect::HttpConnector::new();
                conn.set_connect_timeout(Some(cfg.timeout));
                conn.set_nodelay(true);
                Self::Http(
                    hyper_util::client::legacy::Client::builder(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .pool_idle_timeout(Duration::from_secs(90))
                    .build(conn),
                )
            }
        })
    }

    /// Sends `req`; `Ok` with the number of rejected points the collector
    /// reported (partial success).
    async fn send(&self, cfg: &Config, req: ExportMetricsServiceRequest) -> Result<i64, String> {
        match self {
            Self::Grpc(c) => {
                let mut r = tonic::Request::new(req);
                for (k, v) in &cfg.headers {
                    let (Ok(k), Ok(v)) = (
                        k.to_ascii_lowercase()
                            .parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
                        v.parse(),
                    ) else {
                        continue;
                    };
                    r.metadata_mut().insert(k, v);
                }
                let resp = c
                    .clone()
                    .export(r)
                    .await
                    .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))?;
                Ok(resp
                    .into_inner()
                    .partial_success
                    .map(|p| p.rejected_data_points)
                    .unwrap_or(0))
            }
            Self::Http(c) => {
                let mut body = req.encode_to_vec();
                let mut b = hyper::Request::post(&cfg.endpoint)
                    .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
                    .header(
                        hyper::header::USER_AGENT,
                        concat!("pfs-agent/", env!("CARGO_PKG_VERSION")),
                    );
                if cfg.gzip {
                    let mut enc =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                    enc.write_all(&body).map_err(|e| e.to_string())?;
                    body = enc.finish().map_err(|e| e.to_string())?;
                    b = b.header(hyper::header::CONTENT_ENCODING, "gzip");
                }
                for (k, v) in &cfg.headers {
                    b = b.header(k.as_str(), v.as_str());
                }
                let r = b
                    .body(Full::new(Bytes::from(body)))
                    .map_err(|e| e.to_string())?;
                let resp = c.request(r).await.map_err(|e| {
                    let mut msg = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        msg.push_str(": ");
                        msg.push_str(&s.to_string());
                        src = s.source();
                    }
                    format!("HTTP request failed: {msg}")
                })?;
                let status = resp.status();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                if !status.is_success() {
                    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                    return Err(format!("HTTP {status}: {text}"));
                }
                Ok(
                    opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse::decode(body)
                        .ok()
                        .and_then(|r| r.partial_success)
                        .map(|p| p.rejected_data_points)
                        .unwrap_or(0),
                )
            }
        }
    }
}

// --- the export loop -----------------------------------------------------------------

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
/// (must be called inside the tokio runtime). `last_scrape_seconds` gives
/// the value of `pfs_agent_scrape_duration_seconds` to export.
pub fn start(
    args: &OtlpArgs,
    snap: Arc<Snapshotter>,
    last_scrape_seconds: impl Fn() -> f64 + Send + Sync + 'static,
) -> anyhow::Result<Option<OtlpExporter>> {
    let Some(cfg) = Config::from_env(args)? else {
        return Ok(None);
    };
    let sender = Sender::new(&cfg)?;
    OTLP_EXPORTS.enabled.store(true, Ordering::Relaxed);
    tracing::info!(
        endpoint = %cfg.endpoint,
        protocol = match cfg.transport { Transport::Grpc => "grpc", Transport::HttpProtobuf => "http/protobuf" },
        interval = ?cfg.interval,
        temporality = ?cfg.temporality,
        "OTLP metrics export enabled"
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(run(
        cfg,
        sender,
        snap,
        Arc::new(last_scrape_seconds),
        stopped,
    ));
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

async fn collect(
    snap: &Arc<Snapshotter>,
    last: &Arc<dyn Fn() -> f64 + Send + Sync>,
) -> Option<Vec<Family>> {
    let snap = snap.clone();
    let last = last.clone();
    // One snapshot per cycle (the shared, cached one), read off the runtime
    // threads since it may walk the segments.
    tokio::task::spawn_blocking(move || {
        let s = snap.summaries();
        model::families(&s, &snap.totals(), last())
    })
    .await
    .ok()
}

async fn run(
    cfg: Config,
    sender: Sender,
    snap: Arc<Snapshotter>,
    last: Arc<dyn Fn() -> f64 + Send + Sync>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut builder = RequestBuilder::new(cfg.clone());
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await; // the first tick is immediate: export after one interval
    let mut failures = 0u32;
    let mut paused_until = Instant::now();
    let mut last_error: Option<String> = None;
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stopped.changed() => true,
        };
        if !stopping && Instant::now() < paused_until {
            continue;
        }
        let Some(families) = collect(&snap, &last).await else {
            continue;
        };
        let built = builder.build(&families, SystemTime::now());
        let points = built.points;
        let req = built.request.clone();
        let result = tokio::select! {
            r = tokio::time::timeout(cfg.timeout, sender.send(&cfg, req)) => {
                r.unwrap_or_else(|_| Err(format!("timed out after {:?}", cfg.timeout)))
            }
            // Stopping while an export is in flight: give it up.
            _ = stopped.changed(), if !stopping => {
                tracing::debug!("OTLP export abandoned: the agent is stopping");
                break;
            }
        };
        match result {
            Ok(rejected) => {
                OTLP_EXPORTS.success.fetch_add(1, Ordering::Relaxed);
                builder.commit(built);
                if rejected > 0 {
                    tracing::warn!(rejected, points, "OTLP collector rejected some data points");
                }
                if last_error.take().is_some() {
                    tracing::info!(endpoint = %cfg.endpoint, after_failures = failures, "OTLP export recovered");
                } else {
                    tracing::debug!(points, "OTLP export succeeded");
                }
                failures = 0;
                paused_until = Instant::now();
            }
            Err(e) => {
                OTLP_EXPORTS.failure.fetch_add(1, Ordering::Relaxed);
                failures = failures.saturating_add(1);
                let pause = backoff(cfg.interval, failures);
                // Ticks keep coming every interval; those before the end of
                // the pause are skipped (half an interval of slack so the
                // tick that ends it is not).
                paused_until = Instant::now() + pause.saturating_sub(cfg.interval / 2);
                if last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(endpoint = %cfg.endpoint, error = %e, retry_in = ?pause, "OTLP export failed; dropping this export and backing off");
                    last_error = Some(e);
                }
            }
        }
        if stopping {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn resolve(args: &OtlpArgs, pairs: &[(&str, &str)]) -> anyhow::Result<Option<Config>> {
        Config::resolve(args, &env_of(pairs))
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
        // A gRPC endpoint without a scheme is secure, which needs TLS.
        let e = resolve(
            &a,
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "c:4317"),
                (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("https://c:4317"), "{e}");
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
    fn other_settings() {
        let c = resolve(
            &OtlpArgs::default(),
            &[
                (OTEL_EXPORTER_OTLP_ENDPOINT, "http://c:4318"),
                (OTEL_EXPORTER_OTLP_HEADERS, "a=1, b = x%20y ,bad"),
                (OTEL_EXPORTER_OTLP_METRICS_HEADERS, "api-key=s3cret"),
                (OTEL_EXPORTER_OTLP_TIMEOUT, "2500"),
                (OTEL_EXPORTER_OTLP_COMPRESSION, "gzip"),
                (OTEL_METRIC_EXPORT_INTERVAL, "1000"),
                (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "Delta"),
                (OTEL_SERVICE_NAME, "svc"),
                (
                    OTEL_RESOURCE_ATTRIBUTES,
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
                (OTEL_METRIC_EXPORT_INTERVAL, "1000"),
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
            crate::discover::SegmentSet::new(shm, Duration::from_secs(60)),
            Duration::ZERO,
        );
        OTLP_EXPORTS.enabled.store(true, Ordering::Relaxed);
        let s = snap.get();
        let fams = model::families(&s, &snap.totals(), 0.0);
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
        let mut b = RequestBuilder::new(cfg.clone());
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
        let mut d = RequestBuilder::new(Config {
            temporality: Temporality::Delta,
            service_name: Some("forced".into()),
            ..cfg
        });
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
