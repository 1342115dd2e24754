//! Sending a request to the collector: gRPC (tonic) or HTTP/protobuf
//! (hyper), over TLS for `https://` endpoints, with the configured headers
//! and compression; and reading its answer: partial success, an error
//! status (`google.rpc.Status`), `Retry-After` or gRPC `RetryInfo`, or an
//! answer that is not OTLP at all.

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;

use super::config::{Config, ConfigError, Transport};
use super::tls::TlsClient;
use crate::export::model::ExportResult;

/// The most of an HTTP answer read: an OTLP answer is a few bytes, an
/// error page a few KiB. A larger one ends the request (it is not kept).
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Why an export was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The gRPC call failed.
    #[error("gRPC {:?}: {}", .0.code(), grpc_detail(.0))]
    Grpc(Box<tonic::Status>),
    /// TLS with the collector failed (untrusted certificate, refused
    /// client certificate...): the explanation.
    #[error("{0}")]
    Tls(String),
    /// The HTTP request could not be made or sent (the whole cause chain).
    #[error("HTTP request failed: {0}")]
    Http(String),
    /// The collector answered with an error status.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The status.
        status: hyper::StatusCode,
        /// The `google.rpc.Status` message of the body, else its start
        /// (control characters escaped).
        body: String,
        /// `Retry-After` (429, 503), in seconds.
        retry_after: Option<Duration>,
    },
    /// A success status whose body is not an OTLP response.
    #[error(
        "the endpoint answered HTTP {status} with {content_type} that is not an OTLP response ({detail}): something in front of the collector (a proxy, a login page?) answered; check the endpoint"
    )]
    NotOtlp {
        /// The status.
        status: hyper::StatusCode,
        /// The `Content-Type` of the answer.
        content_type: String,
        /// What is wrong with the body.
        detail: String,
    },
    /// The connection failed in a way that says the endpoint speaks the
    /// other OTLP transport: the failure, then what to change.
    #[error("{detail}; {hint}")]
    WrongProtocol {
        /// The failure (the whole cause chain).
        detail: String,
        /// What to change.
        hint: String,
    },
    /// Compressing the body failed.
    #[error("cannot compress the request: {0}")]
    Compress(#[source] std::io::Error),
    /// No answer within the export timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

impl SendError {
    /// How long the collector asked to wait before the next attempt
    /// (HTTP `Retry-After`, gRPC `google.rpc.RetryInfo`), if it did,
    /// bounded by [`MAX_RETRY_AFTER`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            Self::Grpc(s) => {
                use tonic_types::StatusExt;
                s.get_details_retry_info()
                    .and_then(|r| r.retry_delay)
                    .map(|d| d.min(MAX_RETRY_AFTER))
            }
            _ => None,
        }
    }

    /// What says whether this failure is the one logged last: its text,
    /// but for a TLS failure only its explanation (the transport's detail
    /// in parentheses differs from one attempt to the next for the same
    /// cause: a connection reset, a broken pipe...).
    pub fn log_key(&self) -> String {
        match self {
            Self::Tls(s) => s.split(" (").next().unwrap_or(s).to_string(),
            e => e.to_string(),
        }
    }

    /// The `result` under which this failure is counted.
    pub fn result(&self) -> ExportResult {
        match self {
            Self::Tls(_) => ExportResult::TlsFailure,
            _ => ExportResult::Failure,
        }
    }
}

/// What a delivered export's answer says about rejected points.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partial {
    /// Data points the collector rejected.
    pub rejected: i64,
    /// The collector's explanation (may be empty).
    pub message: String,
}

impl Partial {
    fn of(
        p: Option<opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsPartialSuccess>,
    ) -> Self {
        p.map(|p| Self {
            rejected: p.rejected_data_points,
            message: p.error_message,
        })
        .unwrap_or_default()
    }
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error answer (only the
/// fields we log).
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// `Retry-After` in seconds (an HTTP date is not honoured), bounded by
/// [`MAX_RETRY_AFTER`].
fn retry_after(h: &hyper::HeaderMap) -> Option<Duration> {
    let v = h.get(hyper::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: u64 = v.parse().ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

/// Text for a log line: control characters escaped, at most `max` chars.
pub(super) fn printable(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars().take(max) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// An error answer's body: the `google.rpc.Status` message if it is one
/// (protobuf), else its start as text.
fn error_body(content_type: &str, body: &[u8]) -> String {
    if content_type.contains("protobuf")
        && let Ok(st) = RpcStatus::decode(body)
        && !st.message.is_empty()
    {
        return printable(&st.message, 300);
    }
    if body.is_empty() {
        return "(empty body)".to_string();
    }
    printable(&String::from_utf8_lossy(&body[..body.len().min(300)]), 200)
}

type HttpConnector = hyper_util::client::legacy::connect::HttpConnector;
type Client<C> = hyper_util::client::legacy::Client<C, Full<Bytes>>;

/// The HTTP client: plain, or TLS (rustls) for `https://`.
#[derive(Debug, Clone)]
enum HttpClient {
    Plain(Client<HttpConnector>),
    Tls(Client<hyper_rustls::HttpsConnector<HttpConnector>>),
}

/// A connection to the collector.
#[derive(Debug, Clone)]
pub(super) struct Sender {
    conn: Conn,
    /// The TLS settings of an `https://` endpoint (to explain failures).
    tls: Option<TlsClient>,
}

#[derive(Debug, Clone)]
enum Conn {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    Http(HttpClient),
}

/// A gRPC status's message and the root cause behind it (tonic's chain
/// in between repeats the message).
fn grpc_detail(s: &tonic::Status) -> String {
    let mut msg = s.message().to_string();
    let mut root = std::error::Error::source(s);
    while let Some(next) = root.and_then(|e| e.source()) {
        root = Some(next);
    }
    if let Some(root) = root.map(|e| e.to_string())
        && root != msg
    {
        msg.push_str(": ");
        msg.push_str(&root);
    }
    msg
}

/// What a failure whose cause chain reads `detail` says about the
/// endpoint, when it means the endpoint speaks the other OTLP transport:
/// an HTTP/1.1 request answered by an HTTP/2-only (gRPC) server, or gRPC's
/// HTTP/2 preface answered in HTTP/1.1.
fn wrong_protocol(transport: Transport, detail: &str) -> Option<String> {
    let speaks = match transport {
        Transport::HttpProtobuf
            if detail.contains("invalid HTTP version parsed")
                || detail.contains("received unexpected message from connection") =>
        {
            "gRPC (HTTP/2 only)"
        }
        Transport::Grpc
            if detail.contains("frame with invalid size")
                || detail.contains("invalid HTTP version")
                || detail.contains("connection reset") && detail.contains("h2") =>
        {
            "HTTP/1.1 (OTLP/HTTP?)"
        }
        _ => return None,
    };
    let other = transport.other().name();
    Some(format!(
        "the endpoint seems to speak {speaks}: set OTEL_EXPORTER_OTLP_PROTOCOL={other} (--otlp-protocol {other}), or use the collector's {} port ({} by default)",
        transport.name(),
        transport.default_port()
    ))
}

/// The TCP connector under both transports (and TLS).
fn tcp(cfg: &Config) -> HttpConnector {
    let mut conn = HttpConnector::new();
    conn.set_connect_timeout(Some(cfg.timeout));
    conn.set_nodelay(true);
    // `https://` URIs too: TLS is layered on top.
    conn.enforce_http(false);
    conn
}

/// The whole cause chain of `e`, `: `-separated.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

impl Sender {
    /// A sender to `cfg`'s endpoint (connections are made lazily). For an
    /// `https://` endpoint the TLS files are loaded and checked now.
    pub(super) fn new(cfg: &Config) -> Result<Self, ConfigError> {
        let tls = if cfg.secure {
            Some(TlsClient::load(&cfg.tls, &cfg.endpoint)?)
        } else {
            None
        };
        let endpoint_error = |source| ConfigError::Endpoint {
            endpoint: cfg.endpoint.clone(),
            source,
        };
        let conn = match cfg.transport {
            Transport::Grpc => {
                let ep = tonic::transport::Endpoint::from_shared(cfg.endpoint.clone())
                    .map_err(endpoint_error)?
                    .connect_timeout(cfg.timeout)
                    .timeout(cfg.timeout);
                let channel = match &tls {
                    None => ep.connect_lazy(),
                    // TLS by our connector, with the same rustls
                    // configuration as HTTP (tonic's own TLS features are
                    // off, so it passes the stream through).
                    Some(t) => ep.connect_with_connector_lazy(
                        hyper_rustls::HttpsConnectorBuilder::new()
                            .with_tls_config(t.config())
                            .https_only()
                            .enable_http2()
                            .wrap_connector(tcp(cfg)),
                    ),
                };
                let mut c = MetricsServiceClient::new(channel);
                if cfg.gzip {
                    c = c.send_compressed(tonic::codec::CompressionEncoding::Gzip);
                }
                Conn::Grpc(c)
            }
            Transport::HttpProtobuf => {
                let conn = tcp(cfg);
                let builder = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .pool_idle_timeout(Duration::from_secs(90))
                .clone();
                Conn::Http(match &tls {
                    None => HttpClient::Plain(builder.build(conn)),
                    Some(t) => {
                        let https = hyper_rustls::HttpsConnectorBuilder::new()
                            .with_tls_config(t.config())
                            .https_only()
                            .enable_http1()
                            .wrap_connector(conn);
                        HttpClient::Tls(builder.build(https))
                    }
                })
            }
        };
        Ok(Self { conn, tls })
    }

    /// How the collector is verified (`None`: plain text), for the
    /// start-up log.
    pub(super) fn tls_description(&self) -> Option<String> {
        self.tls.as_ref().map(TlsClient::describe)
    }

    /// A TLS explanation of `e` (worded `detail` by the transport) if it
    /// is a TLS failure.
    fn tls_error(
        &self,
        e: &(dyn std::error::Error + 'static),
        detail: impl FnOnce() -> String,
    ) -> Option<SendError> {
        let tls = self.tls.as_ref()?;
        tls.explain(e, &detail()).map(SendError::Tls)
    }

    /// Sends `req`; `Ok` with what the collector said about rejected
    /// points (partial success).
    pub(super) async fn send(
        &self,
        cfg: &Config,
        req: ExportMetricsServiceRequest,
    ) -> Result<Partial, SendError> {
        if let Some(t) = &self.tls {
            t.begin_export();
        }
        match &self.conn {
            Conn::Grpc(c) => {
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
                let resp = c.clone().export(r).await.map_err(|s| {
                    self.tls_error(&s, || grpc_detail(&s)).unwrap_or_else(|| {
                        let detail = grpc_detail(&s);
                        match wrong_protocol(Transport::Grpc, &detail) {
                            Some(hint) => SendError::WrongProtocol {
                                detail: format!("gRPC {:?}: {detail}", s.code()),
                                hint,
                            },
                            None => SendError::Grpc(Box::new(s)),
                        }
                    })
                })?;
                Ok(Partial::of(resp.into_inner().partial_success))
            }
            Conn::Http(c) => {
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
                    enc.write_all(&body).map_err(SendError::Compress)?;
                    body = enc.finish().map_err(SendError::Compress)?;
                    b = b.header(hyper::header::CONTENT_ENCODING, "gzip");
                }
                for (k, v) in &cfg.headers {
                    b = b.header(k.as_str(), v.as_str());
                }
                let r = b
                    .body(Full::new(Bytes::from(body)))
                    .map_err(|e| SendError::Http(e.to_string()))?;
                let sent = match c {
                    HttpClient::Plain(c) => c.request(r).await,
                    HttpClient::Tls(c) => c.request(r).await,
                };
                let resp = sent.map_err(|e| {
                    self.tls_error(&e, || chain(&e)).unwrap_or_else(|| {
                        let detail = chain(&e);
                        match wrong_protocol(Transport::HttpProtobuf, &detail) {
                            Some(hint) => SendError::WrongProtocol {
                                detail: format!("HTTP request failed: {detail}"),
                                hint,
                            },
                            None => SendError::Http(detail),
                        }
                    })
                })?;
                let status = resp.status();
                let content_type = resp
                    .headers()
                    .get(hyper::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_ascii_lowercase();
                let wait = retry_after(resp.headers());
                // Read up to a bound: an answer is a few bytes (an error
                // page a few KiB); a larger one is not kept in memory.
                let read = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                    .collect()
                    .await;
                let body = match read {
                    Ok(b) => b.to_bytes(),
                    Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                        let detail = format!(
                            "an answer over {MAX_ANSWER_BYTES} bytes, not read (is the endpoint an OTLP receiver?)"
                        );
                        return Err(if status.is_success() {
                            SendError::NotOtlp {
                                status,
                                content_type: format!("content type {content_type}"),
                                detail,
                            }
                        } else {
                            SendError::Status {
                                status,
                                body: detail,
                                retry_after: None,
                            }
                        });
                    }
                    Err(_) => Bytes::new(),
                };
                if !status.is_success() {
                    return Err(SendError::Status {
                        status,
                        body: error_body(&content_type, &body),
                        retry_after: matches!(status.as_u16(), 429 | 503)
                            .then_some(wait)
                            .flatten(),
                    });
                }
                if body.is_empty() {
                    return Ok(Partial::default());
                }
                let not_otlp = |detail: String| SendError::NotOtlp {
                    status,
                    content_type: if content_type.is_empty() {
                        "no content type".to_string()
                    } else {
                        format!("content type {content_type}")
                    },
                    detail,
                };
                if !content_type.is_empty() && !content_type.contains("protobuf") {
                    return Err(not_otlp(format!(
                        "{} bytes starting {:?}",
                        body.len(),
                        printable(&String::from_utf8_lossy(&body[..body.len().min(40)]), 40)
                    )));
                }
                match ExportMetricsServiceResponse::decode(body) {
                    Ok(r) => Ok(Partial::of(r.partial_success)),
                    Err(e) => Err(not_otlp(format!(
                        "not an ExportMetricsServiceResponse: {e}"
                    ))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    fn grpc(delay: Option<Duration>) -> SendError {
        let details = match delay {
            Some(d) => ErrorDetails::with_retry_info(Some(d)),
            None => ErrorDetails::new(),
        };
        SendError::Grpc(Box::new(tonic::Status::with_error_details(
            tonic::Code::Unavailable,
            "busy",
            details,
        )))
    }

    #[test]
    fn grpc_retry_info_is_the_retry_delay_bounded() {
        assert_eq!(
            grpc(Some(Duration::from_secs(4))).retry_after(),
            Some(Duration::from_secs(4))
        );
        assert_eq!(
            grpc(Some(Duration::from_secs(86_400))).retry_after(),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(grpc(None).retry_after(), None);
        let plain = SendError::Grpc(Box::new(tonic::Status::unavailable("busy")));
        assert_eq!(plain.retry_after(), None);
    }
}
