//! OTLP settings: the command-line flags, and their resolution against
//! the OpenTelemetry environment variables (flag first, then the
//! per-signal variable, then the general one), into a [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use opentelemetry_otlp::{
    OTEL_EXPORTER_OTLP_COMPRESSION, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_INSECURE, OTEL_EXPORTER_OTLP_METRICS_COMPRESSION,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, OTEL_EXPORTER_OTLP_METRICS_HEADERS,
    OTEL_EXPORTER_OTLP_METRICS_INSECURE, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_EXPORTER_OTLP_METRICS_TIMEOUT,
    OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TIMEOUT,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};

use super::tls::{TlsError, TlsFile, TlsSettings};
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
    /// An HTTP endpoint without a scheme.
    #[error("OTLP endpoint {0:?} has no scheme; use https://HOST:PORT or http://HOST:PORT")]
    NoScheme(String),
    /// A TLS file that cannot be used, or no trusted roots.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A scheme other than `http://` and `https://`.
    #[error("OTLP endpoint {0:?}: the scheme must be https:// or http://")]
    Scheme(String),
    /// A port that is not a number from 1 to 65535.
    #[error(
        "OTLP endpoint {endpoint:?}: port {port:?} is not a number from 1 to 65535; use e.g. http://HOST:{} (HTTP) or http://HOST:{} (gRPC)",
        Transport::HttpProtobuf.default_port(),
        Transport::Grpc.default_port()
    )]
    Port {
        /// The endpoint as given.
        endpoint: String,
        /// The port as given.
        port: String,
    },
    /// An endpoint without a host.
    #[error("OTLP endpoint {0:?} has no host; use https://HOST:PORT or http://HOST:PORT")]
    NoHost(String),
    /// A boolean variable that is neither `true` nor `false`.
    #[error("{var}={value:?} must be true or false")]
    Bool {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
    },
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
    /// An entry of a headers variable without `=` (or with no key).
    #[error(
        "{var}: {entry:?} must be KEY=VALUE (entries separated by commas, e.g. Authorization=Bearer%20abc)"
    )]
    EnvHeaderSyntax {
        /// The variable.
        var: String,
        /// The entry.
        entry: String,
    },
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
    /// A histogram aggregation other than the two the spec names.
    #[error(
        "{OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION}={0:?}: use explicit_bucket_histogram or base2_exponential_bucket_histogram"
    )]
    HistogramAggregation(String),
}

/// `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`: how
/// histograms are sent ([`HistogramAggregation`]).
pub const OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION: &str =
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION";

/// `OTEL_EXPORTER_OTLP_CERTIFICATE`: the CA file that verifies the
/// collector (instead of the system's roots).
pub const OTEL_EXPORTER_OTLP_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
/// `OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE` (wins over the general one).
pub const OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE";
/// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`: the mTLS client certificate
/// (chain), PEM.
pub const OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
/// `OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE` (wins over the general
/// one).
pub const OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE: &str =
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE";
/// `OTEL_EXPORTER_OTLP_CLIENT_KEY`: the mTLS client private key, PEM.
pub const OTEL_EXPORTER_OTLP_CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_CLIENT_KEY";
/// `OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY` (wins over the general one).
pub const OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY: &str = "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY";
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
    #[arg(long = "otlp-protocol", value_name = "PROTOCOL", value_parser = clap::builder::PossibleValuesParser::new(Transport::ALL.map(Transport::name)))]
    pub protocol: Option<String>,
    /// Aggregation temporality (overrides
    /// OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE; default cumulative).
    #[arg(long = "otlp-temporality", value_enum)]
    pub temporality: Option<Temporality>,
    /// How latency histograms are sent (overrides
    /// OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION; default
    /// explicit_bucket_histogram).
    #[arg(long = "otlp-histogram-aggregation", value_enum)]
    pub histogram_aggregation: Option<HistogramAggregation>,
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
    /// CA certificate file (PEM) that verifies the collector, instead of
    /// the system's roots (overrides
    /// OTEL_EXPORTER_OTLP_[METRICS_]CERTIFICATE).
    #[arg(long = "otlp-certificate", value_name = "FILE")]
    pub certificate: Option<PathBuf>,
    /// Client certificate file (PEM) for mTLS, with --otlp-client-key
    /// (overrides OTEL_EXPORTER_OTLP_[METRICS_]CLIENT_CERTIFICATE).
    #[arg(long = "otlp-client-certificate", value_name = "FILE")]
    pub client_certificate: Option<PathBuf>,
    /// Client private key file (PEM) for mTLS (overrides
    /// OTEL_EXPORTER_OTLP_[METRICS_]CLIENT_KEY).
    #[arg(long = "otlp-client-key", value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// Plain-text gRPC for an endpoint without a scheme (overrides
    /// OTEL_EXPORTER_OTLP_[METRICS_]INSECURE; default false: TLS). An
    /// `https://` or `http://` endpoint decides by itself.
    #[arg(long = "otlp-insecure", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub insecure: Option<bool>,
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

/// How histograms are sent, by the names of
/// `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum HistogramAggregation {
    /// `Histogram` points with the segment's bucket bounds (the default).
    #[default]
    #[value(name = "explicit_bucket_histogram")]
    ExplicitBucket,
    /// `ExponentialHistogram` points of scale 0, bucket for bucket the
    /// segment's (see `crate::export::exponential`).
    #[value(name = "base2_exponential_bucket_histogram")]
    Base2Exponential,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// gRPC (tonic), `grpc`.
    Grpc,
    /// HTTP POST of a protobuf body, `http/protobuf`.
    HttpProtobuf,
}

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 2] = [Transport::Grpc, Transport::HttpProtobuf];

    /// Its `OTEL_EXPORTER_OTLP_PROTOCOL` value.
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::HttpProtobuf => "http/protobuf",
        }
    }

    /// Its collectors' default port (OTLP's 4317 for gRPC, 4318 for HTTP).
    pub const fn default_port(self) -> u16 {
        match self {
            Transport::Grpc => 4317,
            Transport::HttpProtobuf => 4318,
        }
    }

    /// The other transport.
    pub const fn other(self) -> Transport {
        match self {
            Transport::Grpc => Transport::HttpProtobuf,
            Transport::HttpProtobuf => Transport::Grpc,
        }
    }

    /// A warning when `endpoint`'s port is the other transport's default:
    /// the usual cause of exports failing with a protocol error.
    pub fn port_warning(self, endpoint: &str) -> Option<String> {
        let port = endpoint.parse::<hyper::Uri>().ok()?.port_u16()?;
        let other = self.other();
        (port == other.default_port()).then(|| {
            format!(
                "port {port} is the OTLP {} default but the protocol is {}: if exports fail, set OTEL_EXPORTER_OTLP_PROTOCOL={} or use port {}",
                other.name(),
                self.name(),
                other.name(),
                self.default_port()
            )
        })
    }
}

/// The resolved exporter configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Full endpoint URL (for HTTP, including `/v1/metrics`).
    pub endpoint: String,
    /// Transport.
    pub transport: Transport,
    /// The endpoint is `https://`: TLS, with [`Config::tls`].
    pub secure: bool,
    /// TLS files (used only when `secure`).
    pub tls: TlsSettings,
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
    /// How histograms are sent.
    pub histogram_aggregation: HistogramAggregation,
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

/// A file setting: the flag, else the first variable set.
fn file_setting(
    flag: &Option<PathBuf>,
    flag_name: &str,
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&str],
) -> Option<TlsFile> {
    if let Some(p) = flag.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        return Some(TlsFile {
            path: p.clone(),
            from: flag_name.to_string(),
        });
    }
    first_env(env, names).map(|(var, v)| TlsFile {
        path: PathBuf::from(v),
        from: var,
    })
}

/// A boolean variable (`true`/`false`, any case), the first one set.
fn env_bool(
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&str],
) -> Result<Option<bool>, ConfigError> {
    match first_env(env, names) {
        None => Ok(None),
        Some((var, v)) => match v.to_ascii_lowercase().as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(ConfigError::Bool { var, value: v }),
        },
    }
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

/// The `k1=v1,k2=v2` of headers variable `var` (values percent-decoded;
/// empty entries skipped): an entry that is not `KEY=VALUE` is an error
/// (a header lost silently would show only as refusals at the receiver).
fn parse_header_pairs(var: &str, s: &str) -> Result<Vec<(String, String)>, ConfigError> {
    s.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), percent_decode(v.trim())))
            }
            _ => Err(ConfigError::EnvHeaderSyntax {
                var: var.to_string(),
                entry: kv.trim().to_string(),
            }),
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

/// `e` with its scheme (before `://`) lower-cased.
fn lower_scheme(e: &str) -> String {
    match e.split_once("://") {
        Some((scheme, rest)) if !scheme.is_empty() && looks_like_scheme(&format!("{scheme}:")) => {
            format!("{}://{rest}", scheme.to_ascii_lowercase())
        }
        _ => e.to_string(),
    }
}

/// Whether `e` starts with a URL scheme and `:` followed by something
/// other than a port (`http:/x`, `https:`), as opposed to `host:port`.
fn looks_like_scheme(e: &str) -> bool {
    let Some((scheme, rest)) = e.split_once(':') else {
        return false;
    };
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        && !rest.starts_with(|c: char| c.is_ascii_digit())
        && ["http", "https"].contains(&scheme.to_ascii_lowercase().as_str())
}

/// Checks the host and port of `endpoint` (`scheme://authority/path`):
/// a host is required, and a port, if given, must be 1..=65535 (the URL
/// parser would otherwise fall back to the scheme's default port).
fn check_authority(endpoint: &str, typed: &str) -> Result<(), ConfigError> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => (v6, None),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(ConfigError::NoHost(typed.to_string()));
    }
    if let Some(p) = port
        && !p.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(ConfigError::Port {
            endpoint: typed.to_string(),
            port: p.to_string(),
        });
    }
    Ok(())
}

impl Config {
    /// The configuration from `args` and the process environment; `None`
    /// when no endpoint is configured (OTLP off).
    pub fn from_env(args: &OtlpArgs) -> Result<Option<Self>, ConfigError> {
        Self::resolve(args, &|k| std::env::var(k).ok())
    }

    /// Resolves the configuration from `args` and `env` (a lookup of
    /// environment variables). `OTEL_RESOURCE_ATTRIBUTES` is parsed here
    /// too: `k=v` pairs split on `,`, then each value percent-decoded (as
    /// the specification says, so `a%2Cb` is `a,b`).
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
            Some(p) => match Transport::ALL.into_iter().find(|t| t.name() == p) {
                Some(t) => t,
                None => return Err(ConfigError::Protocol(p)),
            },
        };
        // The endpoint as the user gave it (errors quote it), with the
        // scheme lower-cased (schemes are case-insensitive), and whether
        // it is a base URL (`/v1/metrics` appended for HTTP).
        let (typed, base) = if let Some(e) = nonempty(args.endpoint.clone()) {
            (e, true)
        } else if let Some(e) = nonempty(env(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)) {
            (e, false)
        } else if let Some(e) = nonempty(env(OTEL_EXPORTER_OTLP_ENDPOINT)) {
            (e, true)
        } else {
            return Ok(None);
        };
        let endpoint = lower_scheme(&typed);
        let endpoint = if endpoint.contains("://") {
            endpoint
        } else if looks_like_scheme(&endpoint) {
            // `http:/x`, `http:host`: a scheme without `//`.
            return Err(ConfigError::Scheme(typed));
        } else {
            // The specification: a gRPC endpoint without a scheme is
            // secure unless `insecure` says otherwise (which applies to
            // such endpoints only). HTTP endpoints must have a scheme.
            let insecure = match args.insecure {
                Some(b) => b,
                None => env_bool(
                    env,
                    &[
                        OTEL_EXPORTER_OTLP_METRICS_INSECURE,
                        OTEL_EXPORTER_OTLP_INSECURE,
                    ],
                )?
                .unwrap_or(false),
            };
            match (transport, insecure) {
                (Transport::Grpc, false) => format!("https://{endpoint}"),
                (Transport::Grpc, true) => format!("http://{endpoint}"),
                (Transport::HttpProtobuf, _) => return Err(ConfigError::NoScheme(typed)),
            }
        };
        let secure = if endpoint.starts_with("https://") {
            true
        } else if endpoint.starts_with("http://") {
            false
        } else {
            return Err(ConfigError::Scheme(typed));
        };
        check_authority(&endpoint, &typed)?;
        let endpoint = match transport {
            Transport::HttpProtobuf if base => append_metrics_path(&endpoint),
            _ => endpoint,
        };
        let tls = TlsSettings {
            ca: file_setting(
                &args.certificate,
                "--otlp-certificate",
                env,
                &[
                    OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE,
                    OTEL_EXPORTER_OTLP_CERTIFICATE,
                ],
            ),
            client_cert: file_setting(
                &args.client_certificate,
                "--otlp-client-certificate",
                env,
                &[
                    OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE,
                    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
                ],
            ),
            client_key: file_setting(
                &args.client_key,
                "--otlp-client-key",
                env,
                &[
                    OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY,
                    OTEL_EXPORTER_OTLP_CLIENT_KEY,
                ],
            ),
        };
        endpoint
            .parse::<hyper::Uri>()
            .map_err(|source| ConfigError::Url {
                endpoint: typed.clone(),
                source,
            })?;

        let mut headers = match first_env(
            env,
            &[
                OTEL_EXPORTER_OTLP_METRICS_HEADERS,
                OTEL_EXPORTER_OTLP_HEADERS,
            ],
        ) {
            Some((var, v)) => parse_header_pairs(&var, &v)?,
            None => Vec::new(),
        };
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

        let histogram_aggregation = match args.histogram_aggregation {
            Some(h) => h,
            None => match nonempty(env(
                OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
            ))
            .map(|s| s.to_ascii_lowercase())
            .as_deref()
            {
                None | Some("explicit_bucket_histogram") => HistogramAggregation::ExplicitBucket,
                Some("base2_exponential_bucket_histogram") => {
                    HistogramAggregation::Base2Exponential
                }
                Some(other) => return Err(ConfigError::HistogramAggregation(other.to_string())),
            },
        };

        let service_name = nonempty(env(OTEL_SERVICE_NAME));
        let host = crate::util::host::host_name_or(env("HOSTNAME"))
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
            secure,
            tls,
            headers,
            timeout,
            gzip,
            interval,
            temporality,
            histogram_aggregation,
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
