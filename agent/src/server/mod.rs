//! Layer 7: the HTTP server: `/metrics`, `/healthz`, the PFS tables as
//! JSON, a landing page, and control. One concern per submodule: [`body`]
//! (responses), [`conns`] (the connections and which one makes room),
//! [`auth`] (bearer tokens), [`metrics_cache`] (the shared
//! `/metrics` body), [`rebinding`] (the `Host` check of loopback
//! connections), [`state`] (what requests share), [`stream`] (tables
//! written while they are sent), [`control`] (setup changes and
//! `TRUNCATE`), [`landing`] (the HTML page at `/`), [`routes`] (which
//! request goes where); this module runs the accept loop within the
//! connection [`Limits`].
//!
//! The routes are listed in [`routes`].
//!
//! Control (POST) needs `Authorization: Bearer <token>` (the scheme in any
//! case) matching the `--control-token-file`, compared in constant time: a
//! missing or wrong token gets 401, and with no token configured control is
//! refused (403). Nothing is changed unless the token matches. A known path
//! asked with the wrong method gets 405 and an `Allow` header, before any
//! token is checked.
//!
//! A request that arrives on a loopback address must name the agent in
//! its `Host` header by an IP address, `localhost` (or a name under
//! `.localhost`), the machine's host name, a name of `/etc/hosts` or of
//! `--allowed-host` (403 otherwise, before anything else): a web page
//! cannot read the agent through a name rebound to a loopback address
//! (see [`rebinding`] for what it does not cover).
//!
//! Reads (`/metrics`, `/api/v1/tables*`) are open unless a read token is
//! configured (`--read-token-file`): then they need `Authorization: Bearer`
//! with the read token or the control token (401 otherwise). `/healthz`
//! stays open for probes, and so does the landing page `/`, which holds
//! no data (its table browser reads through the API, with the token).
//!
//! Scrape storms and hostile clients (see `docs/SECURITY.md`):
//!
//! * `/metrics` bodies are rendered at most once per snapshot lifetime
//!   (250 ms) and shared: every request in that time gets the same
//!   reference-counted bytes, so concurrent scrapes cost one render and one copy in memory,
//!   and writing a body to a slow client holds no lock. While one request
//!   renders the next body, the others get the previous one (at most
//!   [`metrics_cache::STALE_WHILE_RENDERING`] old) instead of queueing.
//! * At most `max_connections` connections are served at once. Up to
//!   [`SPARE_CONNECTIONS`] more are accepted: on those `/healthz` is
//!   answered at once (so the kubelet's probes never queue behind the
//!   limit), and any other request waits for a slot. Beyond those, a new
//!   connection closes the one idle the longest (no response in flight:
//!   not sent a request yet, or kept alive after one), if idle for
//!   [`IDLE_FOR`] ([`conns`]: so a flood of silent or idle keep-alive
//!   connections, each holding a slot until its header timeout, never
//!   keeps a probe out for long); if there is none, it waits until one
//!   ends or turns idle (further ones in the kernel's listen backlog).
//! * Request headers must arrive within `header_timeout` (this also ends
//!   idle keep-alive connections) and be at most [`MAX_HEADER_BYTES`] long
//!   with the request line: beyond that hyper answers `431` itself, before
//!   any handler runs, so with no body (hyper 1 has no hook for it; the
//!   connection is then closed). Within it, a path and query longer than
//!   [`MAX_URI_BYTES`] get `414` and a JSON error that says the limit, so
//!   a long URL is told what to do unless it alone fills the head; a
//!   connection lives at most `connection_timeout`
//!   (which ends clients that never read their response): then it takes
//!   no new request, and the response in flight gets [`CLOSE_GRACE`] to
//!   finish (a keep-alive client is never cut mid-body by its connection's
//!   age); control bodies are at most [`control::MAX_BODY`] bytes (413).
//! * Tables are streamed: a thread of the stream's own serialises the rows
//!   one at a time into [`stream::TABLE_CHUNK`]-byte chunks, at most
//!   [`stream::TABLE_CHUNKS_QUEUED`] ahead of the client, so a request holds the
//!   (shared) full snapshot and a few chunks, never the whole JSON. A
//!   client that stops reading stalls that thread, which then keeps that
//!   snapshot alive until [`stream::TABLE_STALL_LIMIT`] passes without
//!   progress and the stream is given up; a
//!   failure after the headers closes the connection without the final
//!   chunk, so a cut table is never taken for a whole one. At most
//!   [`stream::MAX_TABLE_STREAMS`] tables are sent at once (a request
//!   waits up to [`stream::TABLE_STREAM_WAIT`] for one to end, then gets
//!   503), and never on the runtime's blocking threads, so no table client
//!   can hold up `/metrics`, OTLP or control.
//! * `/healthz` answers 503 with the reason when the background discovery
//!   is stuck (see [`AppOptions::discovery_stale_after`]); it answers 200
//!   with a `degraded:` line when the segment directory cannot be listed
//!   (see [`AppState::degraded`]: a restart would not fix that).

pub mod auth;
pub mod body;
pub mod conns;
pub mod control;
pub mod landing;
pub mod metrics_cache;
pub mod rebinding;
pub mod routes;
pub mod state;
pub mod stream;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

pub use auth::Tokens;
pub use conns::IDLE_FOR;
use conns::{Conn, Conns, Counted, EVICT_RETRY, Slot};
pub use rebinding::HostCheck;
pub use routes::handle;
pub use state::{AppOptions, AppState};

/// Largest request head (request line and headers) accepted; larger gets
/// hyper's own 431, with no body.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Longest path and query answered; longer gets 414 and a JSON error.
/// Half of [`MAX_HEADER_BYTES`], so that a URL somewhat too long gets the
/// explanation rather than hyper's bare 431, with room left for headers.
pub const MAX_URI_BYTES: usize = 8 * 1024;

const _: () = assert!(MAX_URI_BYTES < MAX_HEADER_BYTES);

/// Connections accepted beyond `max_connections`, so that a probe's
/// `GET /healthz` is answered at once whatever the other clients do; any
/// other request on one of them waits for a regular slot, as it would have
/// in the listen backlog. Beyond these too, connections wait in the
/// backlog.
pub const SPARE_CONNECTIONS: usize = 16;

/// How long a connection past `connection_timeout` has to finish the
/// response in flight before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

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

impl Limits {
    /// The defaults (also the command line's).
    pub const DEFAULT: Limits = Limits {
        max_connections: 256,
        header_timeout: Duration::from_secs(10),
        connection_timeout: Duration::from_secs(60),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
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

/// A regular slot or a spare one, if one is free now.
fn free_slot(
    slots: &Arc<tokio::sync::Semaphore>,
    spares: &Arc<tokio::sync::Semaphore>,
) -> Option<Slot> {
    if let Ok(p) = slots.clone().try_acquire_owned() {
        return Some(Slot {
            regular: Some(p),
            spare: None,
        });
    }
    spares.clone().try_acquire_owned().ok().map(|p| Slot {
        regular: None,
        spare: Some(p),
    })
}

/// Before a request other than `/healthz` on a connection accepted beyond
/// the limit: waits for a regular slot, which the connection then keeps
/// (giving its spare one back); if none is free, the connection holding
/// one that has been idle the longest is closed to make room.
async fn regular_slot(
    slot: &std::sync::Mutex<Slot>,
    slots: &Arc<tokio::sync::Semaphore>,
    conns: &Conns,
    me: &Conn,
) {
    let has_one = slot
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .regular
        .is_some();
    if has_one {
        return;
    }
    let permit = loop {
        if let Ok(p) = slots.clone().try_acquire_owned() {
            break p;
        }
        conns.evict_longest_idle(true);
        tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => break p,
                Err(_) => return,
            },
            _ = tokio::time::sleep(EVICT_RETRY) => {}
        }
    };
    let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
    s.regular = Some(permit);
    s.spare = None;
    me.holds_regular();
}

/// Serves until `shutdown` completes, within `limits`. Requests are
/// answered from the shared, cached snapshot. Table streams still
/// running then are cut short (without their final chunk) before it
/// returns.
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    accept(listener, state.clone(), limits, shutdown).await;
    state.table_streams.stop().await;
}

/// [`serve_with`]'s loop: accepts connections and serves each on a task
/// of its own, until `shutdown` completes.
async fn accept(
    listener: TcpListener,
    state: Arc<AppState>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let spares = Arc::new(tokio::sync::Semaphore::new(SPARE_CONNECTIONS));
    let conns = Arc::new(Conns::default());
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
        // A slot, else a spare one; with neither free, the connection
        // idle the longest makes room, else this one waits for one to end
        // (and later ones in the backlog).
        let slot = match free_slot(&slots, &spares) {
            Some(s) => s,
            None => loop {
                if conns.evict_longest_idle(false) {
                    tracing::debug!(%peer, "every slot taken: closing the connection idle the longest");
                }
                tokio::select! {
                    biased;
                    _ = &mut shutdown => return,
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => break Slot { regular: Some(p), spare: None },
                        Err(_) => return,
                    },
                    p = spares.clone().acquire_owned() => match p {
                        Ok(p) => break Slot { regular: None, spare: Some(p) },
                        Err(_) => return,
                    },
                    _ = tokio::time::sleep(EVICT_RETRY) => {}
                }
            },
        };
        let me = conns.add(&slot);
        let slot = Arc::new(std::sync::Mutex::new(slot));
        let slots = slots.clone();
        let state = state.clone();
        // Unknown (an error the kernel does not give for a connected
        // socket): checked as a loopback one.
        let local = stream
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let conns = conns.clone();
        tokio::spawn(async move {
            let conn_state = me.clone();
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let state = state.clone();
                let (slot, slots) = (slot.clone(), slots.clone());
                let (conns, conn_state) = (conns.clone(), conn_state.clone());
                // In flight until the response's body is dropped.
                let in_flight = conn_state.start();
                async move {
                    // A Host that is not text names nothing served.
                    let hosts = req
                        .headers()
                        .get_all(hyper::header::HOST)
                        .iter()
                        .map(|h| h.to_str().unwrap_or("\u{fffd}"));
                    let authority = req.uri().authority().map(|a| a.as_str());
                    if let Some(why) = state.host_check.refusal(local, hosts, authority) {
                        let resp = body::error(hyper::StatusCode::FORBIDDEN, why);
                        return Ok(resp.map(|b| Counted::new(b, in_flight)));
                    }
                    if !routes::is_healthz(req.uri().path()) {
                        regular_slot(&slot, &slots, &conns, &conn_state).await;
                    }
                    let resp = handle(state, req).await;
                    Ok::<_, Infallible>(resp.map(|b| Counted::new(b, in_flight)))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_header_size(MAX_HEADER_BYTES)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            let mut conn = std::pin::pin!(conn);
            // `Err`: stopped by the agent, with why.
            let ended = tokio::select! {
                r = conn.as_mut() => Ok(r),
                _ = tokio::time::sleep(limits.connection_timeout) => Err("it outlived --connection-timeout"),
                // Silent while every slot was taken: closed for a new one.
                _ = me.evicted() => Err("it was idle while every slot was taken"),
            };
            // Stopped, a connection takes no new request, but a response
            // in flight (a keep-alive client's latest, or a request whose
            // head arrived as it was chosen to make room) gets CLOSE_GRACE
            // to finish instead of being cut mid-body; a client that does
            // not read it is dropped then. An idle one closes at once.
            let ended = match ended {
                Ok(r) => Some(r),
                // Never a request dispatched (hyper calls the service in
                // the poll that parses a head, in this task, so none is
                // meanwhile): nothing to flush, closed now, a half-sent
                // head with it. After one, hyper may still hold the end of
                // the last response (its body is dropped once handed to
                // the write buffer): the graceful path flushes it.
                Err(_) if !me.had_requests() => Some(Ok(())),
                Err(why) => {
                    conn.as_mut().graceful_shutdown();
                    let r = tokio::time::timeout(CLOSE_GRACE, conn).await.ok();
                    if r.is_none() {
                        tracing::debug!(%peer, "connection closed: {why}, and its response did not finish");
                    }
                    r
                }
            };
            me.ended();
            if let Some(Err(e)) = ended {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
