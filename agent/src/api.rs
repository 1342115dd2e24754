//! The HTTP server: `/metrics`, `/healthz` and the PFS tables as JSON.
//!
//! | method | path | answer |
//! |--------|------|--------|
//! | GET | `/metrics` | OpenMetrics text |
//! | GET | `/healthz` | `ok` |
//! | GET | `/api/v1/tables` | `{"tables": [...]}` |
//! | GET | `/api/v1/tables/{table}?service=S&pid=N` | `{"table", "columns", "rows"}` |

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;

use crate::export::prometheus;
use crate::snapshot::Snapshotter;
use crate::tables::{self, Filter};

/// Shared state of the server.
#[derive(Debug)]
pub struct AppState {
    /// The snapshot source.
    pub snap: Arc<Snapshotter>,
    registry: Registry,
    render_seconds: Arc<AtomicU64>,
}

impl AppState {
    /// State over `snap`.
    pub fn new(snap: Arc<Snapshotter>) -> Arc<Self> {
        let (registry, render_seconds) = prometheus::registry(snap.clone());
        Arc::new(Self {
            snap,
            registry,
            render_seconds,
        })
    }

    /// Renders `/metrics` (blocking: walks the segments if the cache is stale).
    pub fn metrics(&self) -> Result<String, std::fmt::Error> {
        let start = Instant::now();
        let out = prometheus::render(&self.registry);
        self.render_seconds
            .store(start.elapsed().as_secs_f64().to_bits(), Ordering::Relaxed);
        out
    }
}

type Resp = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_reply(status: StatusCode, v: serde_json::Value) -> Resp {
    reply(status, "application/json", v.to_string())
}

fn error(status: StatusCode, msg: impl Into<String>) -> Resp {
    json_reply(status, json!({ "error": msg.into() }))
}

fn parse_filter(query: Option<&str>) -> Result<Filter, String> {
    let mut f = Filter::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "service" => f.service = Some(v.to_string()),
            "pid" => {
                f.pid = Some(
                    v.parse()
                        .map_err(|_| format!("pid must be a number, got {v:?}"))?,
                )
            }
            _ => {
                return Err(format!(
                    "unknown query parameter {k:?}; use service= or pid="
                ));
            }
        }
    }
    Ok(f)
}

/// Answers one request.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error(StatusCode::METHOD_NOT_ALLOWED, "only GET is served here");
    }
    match path.as_str() {
        "/healthz" => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        "/metrics" => {
            let s = state.clone();
            match tokio::task::spawn_blocking(move || s.metrics()).await {
                Ok(Ok(body)) => reply(StatusCode::OK, prometheus::CONTENT_TYPE, body),
                _ => error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed"),
            }
        }
        "/api/v1/tables" | "/api/v1/tables/" => {
            json_reply(StatusCode::OK, json!({ "tables": tables::TABLES }))
        }
        p if p.starts_with("/api/v1/tables/") => {
            let name = p.trim_start_matches("/api/v1/tables/").to_string();
            let filter = match parse_filter(query.as_deref()) {
                Ok(f) => f,
                Err(e) => return error(StatusCode::BAD_REQUEST, e),
            };
            let s = state.clone();
            let table = tokio::task::spawn_blocking(move || {
                let snap = s.snap.get();
                tables::build(&name, &snap, &filter)
            })
            .await
            .ok()
            .flatten();
            match table {
                Some(t) => json_reply(StatusCode::OK, t.to_json()),
                None => error(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no such table; GET /api/v1/tables lists them: {}",
                        tables::TABLES.join(", ")
                    ),
                ),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /api/v1/tables",
        ),
    }
}

/// Serves until `shutdown` completes. Connections get a header timeout, and
/// requests are answered from the shared, cached snapshot.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(state, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = tokio::time::timeout(Duration::from_secs(60), conn)
                .await
                .unwrap_or(Ok(()))
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
