//! The HTTP server: `/metrics`, `/healthz` and the PFS tables as JSON.
//!
//! | method | path | answer |
//! |--------|------|--------|
//! | GET | `/metrics` | OpenMetrics text |
//! | GET | `/healthz` | `ok` |
//! | GET | `/api/v1/tables` | `{"tables": [...]}` |
//! | GET | `/api/v1/tables/{table}?service=S&pid=N` | `{"table", "columns", "rows"}` (chunked) |
//! | POST | `/api/v1/setup/{instruments,consumers,timers,actors}[?service=S&pid=N]` | `{"matched": n, "segments": m}` |
//! | POST | `/api/v1/tables/{table}/truncate` | `{"truncated": table}` |
//!
//! Control (POST) needs `Authorization: Bearer <token>` matching the
//! `--control-token-file`, compared in constant time: a missing or wrong
//! token gets 401, and with no token configured control is refused (403).
//! Nothing is changed unless the token matches.
//!
//! Reads (`/metrics`, `/api/v1/tables*`) are open unless a read token is
//! configured (`--read-token-file`): then they need `Authorization: Bearer`
//! with the read token or the control token (401 otherwise). `/healthz`
//! stays open for probes.
//!
//! Scrape storms and hostile clients (see `docs/SECURITY.md`):
//!
//! * `/metrics` bodies are rendered at most once per snapshot lifetime
//!   (250 ms) and shared: every request in that time gets the same
//!   reference-counted bytes, so concurrent scrapes cost one render and one copy in memory,
//!   and writing a body to a slow client holds no lock. While one request
//!   renders the next body, the others get the previous one (at most
//!   [`STALE_WHILE_RENDERING`] old) instead of queueing.
//! * At most `max_connections` connections are served at once; further
//!   ones wait in the kernel's listen backlog until one ends.
//! * Request headers must arrive within `header_timeout` (this also ends
//!   idle keep-alive connections) and be at most [`MAX_HEADER_BYTES`] long
//!   (431 otherwise); a connection lives at most `connection_timeout`
//!   (which ends clients that never read their response); control bodies
//!   are at most [`MAX_BODY`] bytes (413).
//! * Tables are streamed: a blocking task serialises the rows one at a
//!   time into [`TABLE_CHUNK`]-byte chunks, at most
//!   [`TABLE_CHUNKS_QUEUED`] ahead of the client, so a request holds the
//!   (shared) full snapshot and a few chunks, never the whole JSON. A
//!   client that stops reading stalls its task, which then keeps that
//!   snapshot alive until `connection_timeout` ends the connection; a
//!   failure after the headers closes the connection without the final
//!   chunk, so a cut table is never taken for a whole one.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
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

/// While a render is in progress, bodies up to this old are served.
pub const STALE_WHILE_RENDERING: Duration = Duration::from_secs(1);

/// Shared state of the server.
#[derive(Debug)]
pub struct AppState {
    /// The snapshot source.
    pub snap: Arc<Snapshotter>,
    registry: Registry,
    render_seconds: Arc<AtomicU64>,
    token: Option<String>,
    read_token: Option<String>,
    baselines: std::sync::Mutex<Baselines>,
    /// Held while rendering: identical concurrent scrapes wait for one
    /// render instead of each doing it.
    rendering: Mutex<()>,
    /// The newest body and when its render started, readable while a
    /// render is in progress (locked only to copy it).
    latest: Mutex<Option<(Instant, Bytes)>>,
    /// Bodies younger than this are served without asking the snapshotter.
    max_age: Duration,
    /// Where the TRUNCATE baselines are saved.
    baselines_dir: Option<std::path::PathBuf>,
}

/// Options of the server beyond its snapshot source.
#[derive(Debug, Default)]
pub struct AppOptions {
    /// Bearer token of the control endpoints (none: control refused, 403).
    pub control_token: Option<String>,
    /// Bearer token that reads must present (none: reads are open).
    pub read_token: Option<String>,
    /// Directory (the segment directory) where `TRUNCATE` baselines are
    /// kept across restarts (none: in memory only).
    pub baselines_dir: Option<std::path::PathBuf>,
}

impl AppState {
    /// State over `snap`; `token` enables the control endpoints.
    pub fn new(snap: Arc<Snapshotter>, token: Option<String>) -> Arc<Self> {
        Self::with_options(
            snap,
            AppOptions {
                control_token: token,
                ..AppOptions::default()
            },
        )
    }

    /// State over `snap` with `o` (loads saved `TRUNCATE` baselines).
    pub fn with_options(snap: Arc<Snapshotter>, o: AppOptions) -> Arc<Self> {
        let (registry, render_seconds) = prometheus::registry(snap.clone());
        let baselines = o
            .baselines_dir
            .as_deref()
            .map(Baselines::load)
            .unwrap_or_default();
        Arc::new(Self {
            snap,
            registry,
            render_seconds,
            token: o.control_token,
            read_token: o.read_token,
            baselines: std::sync::Mutex::new(baselines),
            rendering: Mutex::new(()),
            latest: Mutex::new(None),
            max_age: crate::run::SNAPSHOT_MAX_AGE,
            baselines_dir: o.baselines_dir,
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

    /// Checks the control bearer token: `Err` is the refusal to send.
    fn authorize(&self, req: &Request<Incoming>) -> Result<(), Box<Resp>> {
        let Some(want) = &self.token else {
            return Err(Box::new(error(
                StatusCode::FORBIDDEN,
                "control is disabled: start the agent with --control-token-file to enable it",
            )));
        };
        if token_matches(req, [Some(want), None]) {
            Ok(())
        } else {
            Err(Box::new(unauthorized()))
        }
    }

    /// Checks the read token, if one is configured (the control token is
    /// accepted too).
    fn authorize_read(&self, req: &Request<Incoming>) -> Result<(), Box<Resp>> {
        let Some(read) = &self.read_token else {
            return Ok(());
        };
        if token_matches(req, [Some(read), self.token.as_ref()]) {
            Ok(())
        } else {
            Err(Box::new(unauthorized()))
        }
    }

    /// The newest `/metrics` body without waiting: if its snapshot is
    /// younger than a snapshot's lifetime, or, while another request is
    /// rendering the next one, younger than [`STALE_WHILE_RENDERING`]
    /// (a scrape storm then never queues behind a render). Bodies only
    /// move forward, so a client never sees an older body than before.
    fn fresh_metrics(&self) -> Option<Bytes> {
        let (at, body) = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let age = at.elapsed();
        if age < self.max_age {
            return Some(body);
        }
        let rendering = self.rendering.try_lock().is_err();
        (rendering && age < STALE_WHILE_RENDERING).then_some(body)
    }

    /// Drops the cached body (after a setup change).
    fn invalidate(&self) {
        let _rendering = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        self.snap.invalidate();
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Renders `/metrics`, or returns the body rendered less than a
    /// snapshot's lifetime ago (blocking: waits for a render in progress,
    /// and the render walks the segments if the snapshot is stale).
    pub fn metrics(&self) -> Result<Bytes, std::fmt::Error> {
        let _rendering = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, body)) = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            && at.elapsed() < self.max_age
        {
            return Ok(body);
        }
        let start = Instant::now();
        let body = Bytes::from(prometheus::render(&self.registry)?);
        self.render_seconds
            .store(start.elapsed().as_secs_f64().to_bits(), Ordering::Relaxed);
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((start, body.clone()));
        Ok(body)
    }
}

/// Whether the request's bearer token equals one of `want` (constant time
/// in the token's content; every candidate is compared).
fn token_matches(req: &Request<Incoming>, want: [Option<&String>; 2]) -> bool {
    use subtle::ConstantTimeEq;
    let got = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let mut ok = subtle::Choice::from(0);
    for w in want.into_iter().flatten() {
        ok |= got.as_bytes().ct_eq(w.as_bytes());
    }
    bool::from(ok)
}

fn unauthorized() -> Resp {
    let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    r.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer"),
    );
    r
}

type Resp = Response<Body>;

/// A response body: whole, or a table written by a blocking task while it
/// is sent ([`stream_table`]).
#[derive(Debug)]
pub enum Body {
    /// The whole body.
    Full(Full<Bytes>),
    /// Chunks as they are written; an error ends the response abnormally
    /// (the connection is closed without the last chunk, so the client
    /// cannot take a cut table for a whole one).
    Stream(tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Body::Full(f) => std::pin::Pin::new(f)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Body::Stream(rx) => rx
                .poll_recv(cx)
                .map(|c| c.map(|c| c.map(hyper::body::Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(f) => f.is_end_stream(),
            Body::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Full(f) => f.size_hint(),
            Body::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// Size of the chunks a streamed table is sent in.
pub const TABLE_CHUNK: usize = 64 * 1024;

/// Chunks in flight between the task writing a table and the connection.
pub const TABLE_CHUNKS_QUEUED: usize = 4;

/// Where a streamed table is written: chunks of [`TABLE_CHUNK`] bytes,
/// each sent to the connection once full (blocking while
/// [`TABLE_CHUNKS_QUEUED`] wait), so that the JSON is never held whole.
struct ChunkWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(TABLE_CHUNK + 1024));
        self.tx
            .blocking_send(Ok(Bytes::from(chunk)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client gone"))
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= TABLE_CHUNK {
            self.send()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// Answers a table request (`name` must exist, [`tables::exists`]): its
/// JSON is written row by row by a blocking task into [`Body::Stream`], so
/// the request holds the snapshot and a few chunks, not a `Value` per cell
/// and the whole text.
fn stream_table(state: Arc<AppState>, name: String, filter: Filter) -> Resp {
    let (tx, rx) = tokio::sync::mpsc::channel(TABLE_CHUNKS_QUEUED);
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkWriter {
            buf: Vec::with_capacity(TABLE_CHUNK + 1024),
            tx: tx.clone(),
        };
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let snap = state.snap.get();
            let baselines = state.baselines().clone();
            tables::write_json(&name, &snap, &filter, &baselines, &mut out)
        }));
        let failed = match written {
            Ok(Ok(true)) => match std::io::Write::flush(&mut out) {
                Ok(()) => None,
                Err(_) => return, // the client went away
            },
            Ok(Ok(false)) => Some("no such table".to_string()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => return,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("building the table panicked".to_string()),
        };
        if let Some(why) = failed {
            tracing::warn!(table = %name, "table response cut short: {why}");
            let _ = tx.blocking_send(Err(std::io::Error::other(why)));
        }
    });
    let mut r = Response::new(Body::Stream(rx));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Body::Full(Full::new(body.into())));
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
            let mut b = s.baselines();
            b.truncate(&table, &snap)?;
            if let Some(dir) = &s.baselines_dir
                && let Err(e) = b.save(dir)
            {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot save the TRUNCATE baselines; a restarted agent would show lifetime values");
            }
            Ok::<_, String>(table)
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
        s.invalidate();
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
    if path != "/healthz"
        && let Err(refusal) = state.authorize_read(&req)
    {
        return *refusal;
    }
    match path.as_str() {
        "/healthz" => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        "/metrics" => {
            if let Some(body) = state.fresh_metrics() {
                return reply(StatusCode::OK, prometheus::CONTENT_TYPE, body);
            }
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
            if !tables::exists(&name) {
                return error(
                    StatusCode::NOT_FOUND,
                    format!(
                        "no such table; GET /api/v1/tables lists them: {}",
                        tables::names().join(", ")
                    ),
                );
            }
            stream_table(state, name, filter)
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz or /api/v1/tables",
        ),
    }
}

/// Largest request head (request line and headers) accepted; larger gets 431.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Connection limits of the server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (and the longest a
    /// keep-alive connection may sit idle).
    pub header_timeout: Duration,
    /// Longest life of one connection.
    pub connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(60),
        }
    }
}

/// Serves with the default [`Limits`] until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_with(listener, state, Limits::default(), shutdown).await
}

/// Serves until `shutdown` completes, within `limits`. Requests are
/// answered from the shared, cached snapshot.
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        // A slot first: beyond the limit, connections wait in the backlog.
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = &mut shutdown => return,
        };
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
            let _permit = permit;
            let svc = service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(state, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_header_size(MAX_HEADER_BYTES)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(limits.connection_timeout, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
                Err(_) => {
                    tracing::debug!(%peer, "connection closed: it outlived --connection-timeout")
                }
            }
        });
    }
}
