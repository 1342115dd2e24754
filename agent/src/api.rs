//! The HTTP server: `/metrics`, `/healthz` and the PFS tables as JSON.
//!
//! | method | path | answer |
//! |--------|------|--------|
//! | GET | `/metrics` | OpenMetrics text |
//! | GET | `/healthz` | `ok` |
//! | GET | `/api/v1/tables` | `{"tables": [...]}` |
//! | GET | `/api/v1/tables/{table}?service=S&pid=N` | `{"table", "columns", "rows"}` |
//! | POST | `/api/v1/setup/{instruments,consumers,timers,actors}[?service=S&pid=N]` | `{"matched": n, "segments": m}` |
//! | POST | `/api/v1/tables/{table}/truncate` | `{"truncated": table}` |
//!
//! Control (POST) needs `Authorization: Bearer <token>` matching the
//! `--control-token-file`, compared in constant time: a missing or wrong
//! token gets 401, and with no token configured control is refused (403).
//! Nothing is changed unless the token matches.

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
use crate::setup::{self, Change};
use crate::snapshot::Snapshotter;
use crate::tables::{self, Filter};
use crate::truncate::Baselines;

/// Shared state of the server.
#[derive(Debug)]
pub struct AppState {
    /// The snapshot source.
    pub snap: Arc<Snapshotter>,
    registry: Registry,
    render_seconds: Arc<AtomicU64>,
    token: Option<String>,
    baselines: std::sync::Mutex<Baselines>,
}

impl AppState {
    /// State over `snap`; `token` enables the control endpoints.
    pub fn new(snap: Arc<Snapshotter>, token: Option<String>) -> Arc<Self> {
        let (registry, render_seconds) = prometheus::registry(snap.clone());
        Arc::new(Self {
            snap,
            registry,
            render_seconds,
            token,
            baselines: std::sync::Mutex::new(Baselines::default()),
        })
    }

    /// Seconds the previous `/metrics` scrape took (for OTLP's copy of
    /// `pfs_agent_scrape_duration_seconds`).
    pub fn last_scrape_seconds(&self) -> f64 {
        f64::from_bits(self.render_seconds.load(Ordering::Relaxed))
    }

    fn baselines(&self) -> std::sync::MutexGuard<'_, Baselines> {
        self.baselines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the bearer token: `Err` is the refusal to send.
    fn authorize(&self, req: &Request<Incoming>) -> Result<(), Box<Resp>> {
        use subtle::ConstantTimeEq;
        let Some(want) = &self.token else {
            return Err(Box::new(error(
                StatusCode::FORBIDDEN,
                "control is disabled: start the agent with --control-token-file to enable it",
            )));
        };
        let got = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if bool::from(got.as_bytes().ct_eq(want.as_bytes())) {
            Ok(())
        } else {
            let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            Err(Box::new(r))
        }
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

/// Largest control request body accepted.
const MAX_BODY: usize = 64 * 1024;

async fn control(
    state: Arc<AppState>,
    req: Request<Incoming>,
    path: &str,
    query: Option<&str>,
) -> Resp {
    use http_body_util::BodyExt;
    if let Err(refusal) = state.authorize(&req) {
        return *refusal;
    }
    let filter = match parse_filter(query) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if let Some(table) = path
        .strip_prefix("/api/v1/tables/")
        .and_then(|t| t.strip_suffix("/truncate"))
    {
        let table = table.to_string();
        let s = state.clone();
        let r = tokio::task::spawn_blocking(move || {
            let snap = s.snap.take();
            s.baselines().truncate(&table, &snap).map(|()| table)
        })
        .await;
        return match r {
            Ok(Ok(t)) => json_reply(StatusCode::OK, json!({ "truncated": t })),
            Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e),
            Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "truncate failed"),
        };
    }
    let Some(what) = path.strip_prefix("/api/v1/setup/") else {
        return error(
            StatusCode::NOT_FOUND,
            "control paths: /api/v1/setup/{instruments,consumers,timers,actors}, /api/v1/tables/{table}/truncate",
        );
    };
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body larger than {MAX_BODY} bytes"),
            );
        }
    };
    let parsed: Result<Change, serde_json::Error> = match what {
        "instruments" => serde_json::from_slice(&body).map(Change::Instruments),
        "consumers" => serde_json::from_slice(&body).map(Change::Consumers),
        "timers" => serde_json::from_slice(&body).map(Change::Timers),
        "actors" => serde_json::from_slice(&body).map(Change::Actors),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "setup tables: instruments, consumers, timers, actors",
            );
        }
    };
    let change = match parsed {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid JSON body for setup/{what}: {e}"),
            );
        }
    };
    if let Err(e) = setup::validate(&change) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let s = state.clone();
    let out = tokio::task::spawn_blocking(move || {
        let paths = s.snap.live_paths();
        let out = setup::apply(&paths, &filter, &change);
        s.snap.invalidate();
        out
    })
    .await;
    match out {
        Ok(o) => {
            for e in &o.errors {
                tracing::warn!("setup change not applied: {e}");
            }
            json_reply(
                StatusCode::OK,
                json!({ "matched": o.matched, "segments": o.segments, "errors": o.errors }),
            )
        }
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "setup change failed"),
    }
}

/// Answers one request.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    if req.method() == Method::POST {
        return control(state, req, &path, query.as_deref()).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET reads; POST changes setup or truncates",
        );
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
            json_reply(StatusCode::OK, json!({ "tables": tables::names() }))
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
                let baselines = s.baselines().clone();
                tables::build(&name, &snap, &filter, &baselines)
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
                        tables::names().join(", ")
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
