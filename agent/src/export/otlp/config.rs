//! OTLP settings: the command-line flags, and their resolution against
//! the OpenTelemetry environment variables (flag first, then the
//! per-signal variable, then the general one), into a [`Config`].

use std::time::Duration;

use clap::{Args, ValueEnum};
use opentelemetry_otlp::{
    OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_METRICS_COMPRESSION, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_HEADERS, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_EXPORTER_OTLP_METRICS_TIMEOUT,
    OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TIMEOUT,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

use crate::util::text::parse_duration;

/// OTLP settings that cannot be used; each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A timeout or interval variable that is not a number.
    #[error("{var}={value:?} is not a number of milliseconds")]
    Millis {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
    },
    /// A protocol other than `grpc` and `http/protobuf`.
    #[error("OTLP protocol {0:?} is not supported; use grpc or http/protobuf")]
    Protocol(String),
    /// An HTTP endpoint without `http://`.
    #[error("OTLP endpoint {0:?} has no scheme; use http://HOST:PORT")]
    NoScheme(String),
    /// An `https://` endpoint (or a gRPC one without a scheme, secure by
    /// the specification).
    #[error(
        "OTLP endpoint {0} needs TLS, which this pfs-agent build does not \
         support; send to a collector over plain http:// (e.g. a local \
         OpenTelemetry Collector sidecar that forwards over TLS)"
    )]
    Tls(String),
    /// A scheme other than `http://`.
    #[error("OTLP endpoint {0:?}: the scheme must be http://")]
    Scheme(String),
    /// An endpoint that is not a URL.
    #[error("OTLP endpoint {endpoint:?} is not a valid URL")]
    Url {
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: hyper::http::uri::InvalidUri,
    },
    /// A `--otlp-header` without `=`.
    #[error("--otlp-header {0:?} must be KEY=VALUE")]
    HeaderSyntax(String),
    /// A gRPC endpoint tonic cannot use.
    #[error("OTLP endpoint {endpoint:?} is invalid")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// A header name HTTP does not allow.
    #[error("OTLP header name {0:?} is invalid")]
    HeaderName(String),
    /// A header value HTTP does not allow.
    #[error("OTLP header {0} has an invalid value")]
    HeaderValue(String),
    /// A zero interval or timeout.
    #[error("the OTLP export interval and timeout must be positive")]
    ZeroDuration,
    /// A compression other than `gzip` and `none`.
    #[error("OTLP compression {0:?} is not supported; use gzip or none")]
    Compression(String),
    /// A temporality preference other than cumulative, delta, lowmemory.
    #[error("{OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE}={0:?}: use cumulative or delta")]
    Temporality(String),
}

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
) -> Result<Option<Duration>, ConfigError> {
    for n in names {
        if let Some(v) = nonempty(env(n)) {
            let ms: u64 = v.parse().map_err(|_| ConfigError::Millis {
                var: n.to_string(),
                value: v.clone(),
            })?;
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
    pub fn from_env(args: &OtlpArgs) -> Result<Option<Self>, ConfigError> {
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
    ) -> Result<Option<Self>, ConfigError> {
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
                other => return Err(ConfigError::Protocol(other.to_string())),
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
                Transport::HttpProtobuf => return Err(ConfigError::NoScheme(endpoint)),
            }
        };
        if endpoint.starts_with("https://") {
            return Err(ConfigError::Tls(endpoint));
        }
        if !endpoint.starts_with("http://") {
            return Err(ConfigError::Scheme(endpoint));
        }
        endpoint
            .parse::<hyper::Uri>()
            .map_err(|source| ConfigError::Url {
                endpoint: endpoint.clone(),
                source,
            })?;

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
                return Err(ConfigError::HeaderSyntax(h.clone()));
            };
            headers.retain(|(hk, _)| !hk.eq_ignore_ascii_case(k.trim()));
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        for (k, v) in &headers {
            hyper::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| ConfigError::HeaderName(k.clone()))?;
            hyper::header::HeaderValue::from_str(v)
                .map_err(|_| ConfigError::HeaderValue(k.clone()))?;
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
        if interval.is_zero() || timeout.is_zero() {
            return Err(ConfigError::ZeroDuration);
        }

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
            Some(other) => return Err(ConfigError::Compression(other.to_string())),
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
                Some(other) => return Err(ConfigError::Temporality(other.to_string())),
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
    pub fn forced_service(&self) -> Option<AnyValue> {
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

/// A string attribute value.
pub fn str_value(s: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.to_string())),
    }
}

/// An integer attribute value.
pub fn int_value(v: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(v)),
    }
}

/// An attribute.
pub fn kv(k: &str, v: AnyValue) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(v),
        ..Default::default()
    }
}
