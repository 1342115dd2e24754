//! Sending a request to the collector: gRPC (tonic) or HTTP/protobuf
//! (hyper), with the configured headers and compression.

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

/// Why an export was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The gRPC call failed.
    #[error("gRPC {:?}: {}", .0.code(), .0.message())]
    Grpc(Box<tonic::Status>),
    /// The HTTP request could not be made or sent (the whole cause chain).
    #[error("HTTP request failed: {0}")]
    Http(String),
    /// The collector answered with an error status.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The status.
        status: hyper::StatusCode,
        /// The start of the answer's body.
        body: String,
    },
    /// Compressing the body failed.
    #[error("cannot compress the request: {0}")]
    Compress(#[source] std::io::Error),
    /// No answer within the export timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// A connection to the collector.
#[derive(Debug, Clone)]
pub(super) enum Sender {
    Grpc(MetricsServiceClient<tonic::transport::Channel>),
    Http(HttpClient),
}

impl Sender {
    /// A sender to `cfg`'s endpoint (connections are made lazily).
    pub(super) fn new(cfg: &Config) -> Result<Self, ConfigError> {
        Ok(match cfg.transport {
            Transport::Grpc => {
                let ep = tonic::transport::Endpoint::from_shared(cfg.endpoint.clone())
                    .map_err(|source| ConfigError::Endpoint {
                        endpoint: cfg.endpoint.clone(),
                        source,
                    })?
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
    pub(super) async fn send(
        &self,
        cfg: &Config,
        req: ExportMetricsServiceRequest,
    ) -> Result<i64, SendError> {
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
                    .map_err(|s| SendError::Grpc(Box::new(s)))?;
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
                let resp = c.request(r).await.map_err(|e| {
                    let mut msg = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        msg.push_str(": ");
                        msg.push_str(&s.to_string());
                        src = s.source();
                    }
                    SendError::Http(msg)
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
                    return Err(SendError::Status { status, body: text });
                }
                Ok(ExportMetricsServiceResponse::decode(body)
                    .ok()
                    .and_then(|r| r.partial_success)
                    .map(|p| p.rejected_data_points)
                    .unwrap_or(0))
            }
        }
    }
}
