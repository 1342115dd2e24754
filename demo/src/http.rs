//! Layer 1. The demo's async service: a small "orders" HTTP API (axum on a
//! multi-threaded tokio runtime), instrumented the way an async Rust
//! service is: tower-http's `TraceLayer` request spans become statements
//! through the `pfs-tracing` layer, the handlers enter stages, and their
//! locks are `pfs_client::tokio` drop-ins. A load generator in the same
//! runtime drives it over real HTTP connections, so the statements, stages,
//! waits, CPU time, errors and cancellations it shows are measured, not
//! made up.
//!
//! * `GET /orders/{id}`: a read of the order book (a tokio `RwLock`);
//!   about one id in 40 fails with 500 (a storage error: an error of
//!   `statement/http/GET /orders/{id}`).
//! * `POST /orders`: validation, then a commit under the ledger `Mutex`,
//!   held across a simulated write: concurrent commits wait on it.
//! * `GET /report`: two reports at a time (a `Semaphore`), each computing
//!   for about a millisecond (CPU time) and waiting on I/O (wall time).
//! * `GET /slow`: answers after 300 ms; the load generator gives up after
//!   50 ms, so the request's future is dropped: a cancelled statement.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use pfs_client::{LazyStageClass, LazyWaitClass};
use tower_http::trace::TraceLayer;
use tracing_subscriber::layer::SubscriberExt;

use crate::error::DemoError;

/// The order book: read by GETs, written by commits.
static BOOK_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/orders/book");
/// The ledger, held across a commit's write.
static LEDGER_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/orders/ledger");
/// Report slots: two reports at a time.
static REPORT_SLOTS: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/orders/report_slots");

static STAGE_LOOKUP: LazyStageClass = LazyStageClass::new("stage/orders/lookup");
static STAGE_RENDER: LazyStageClass = LazyStageClass::new("stage/orders/rendering");
static STAGE_VALIDATE: LazyStageClass = LazyStageClass::new("stage/orders/validating");
static STAGE_COMMIT: LazyStageClass = LazyStageClass::new("stage/orders/committing");
static STAGE_QUEUED: LazyStageClass = LazyStageClass::new("stage/orders/waiting_for_slot");
static STAGE_COMPUTE: LazyStageClass = LazyStageClass::new("stage/orders/computing");

/// Worker threads of the service's runtime.
const WORKERS: usize = 2;
/// Concurrent clients of the load generator.
const CLIENTS: usize = 4;
/// The load generator's patience with `GET /slow`.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(50);
/// How long `GET /slow` takes.
const SLOW: Duration = Duration::from_millis(300);
/// Pause between two requests of one client: about 4 × 1000 / 6 ≈ 600
/// requests per second in all, a light load beside the key-value store.
const THINK: Duration = Duration::from_millis(6);

/// What the handlers share.
struct Orders {
    book: pfs_client::tokio::RwLock<HashMap<u64, u64>>,
    ledger: pfs_client::tokio::Mutex<u64>,
    reports: pfs_client::tokio::Semaphore,
    next_id: AtomicU64,
}

type Shared = Arc<Orders>;

async fn get_order(State(s): State<Shared>, Path(id): Path<u64>) -> (StatusCode, String) {
    STAGE_LOOKUP.enter();
    let found = s.book.read().await.get(&id).copied();
    if id % 40 == 39 {
        return (StatusCode::INTERNAL_SERVER_ERROR, "storage error\n".into());
    }
    STAGE_RENDER.enter();
    match found {
        Some(amount) => (
            StatusCode::OK,
            format!("{{\"id\":{id},\"amount\":{amount}}}\n"),
        ),
        None => (StatusCode::NOT_FOUND, "no such order\n".into()),
    }
}

async fn post_order(State(s): State<Shared>) -> (StatusCode, String) {
    STAGE_VALIDATE.enter();
    tokio::task::yield_now().await;
    STAGE_COMMIT.enter();
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut ledger = s.ledger.lock().await;
        // The ledger's write: held across I/O, so concurrent commits queue.
        tokio::time::sleep(Duration::from_millis(2)).await;
        *ledger += id;
    }
    s.book.write().await.insert(id, id * 10);
    (StatusCode::CREATED, format!("{{\"id\":{id}}}\n"))
}

async fn report(State(s): State<Shared>) -> (StatusCode, String) {
    STAGE_QUEUED.enter();
    let Ok(_slot) = s.reports.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "closed\n".into());
    };
    STAGE_COMPUTE.enter();
    // About a millisecond of computation (CPU_TIME), then I/O (wall time).
    let mut x = 0u64;
    let until = std::time::Instant::now() + Duration::from_millis(1);
    while std::time::Instant::now() < until {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let total = s.book.read().await.len();
    (
        StatusCode::OK,
        format!("{{\"orders\":{total},\"x\":{}}}\n", x % 10),
    )
}

async fn slow() -> &'static str {
    tokio::time::sleep(SLOW).await;
    "finally\n"
}

/// The service's routes, traced by tower-http (request spans carrying
/// axum's matched route, which the pfs layer turns into statements).
fn app() -> Router {
    let state = Arc::new(Orders {
        book: pfs_client::tokio::RwLock::new(&BOOK_LOCK, (0..100).map(|i| (i, i * 10)).collect()),
        ledger: pfs_client::tokio::Mutex::new(&LEDGER_LOCK, 0),
        reports: pfs_client::tokio::Semaphore::new(&REPORT_SLOTS, 2),
        next_id: AtomicU64::new(100),
    });
    Router::new()
        .route("/orders/{id}", get(get_order))
        .route("/orders", axum::routing::post(post_order))
        .route("/report", get(report))
        .route("/slow", get(slow))
        .with_state(state)
        .layer(pfs_tracing::CutBodyLayer)
        .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span))
}

/// One client of the load generator: a keep-alive HTTP/1 connection pool
/// sending a mix of requests until `stop`.
async fn client(addr: SocketAddr, seed: u64, stop: Arc<AtomicBool>) {
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut rng = fastrand::Rng::with_seed(seed);
    while !stop.load(Ordering::Relaxed) {
        let (method, path, patient) = match rng.u64(..100) {
            0..=59 => ("GET", format!("/orders/{}", rng.u64(..160)), true),
            60..=84 => ("POST", "/orders".to_string(), true),
            85..=97 => ("GET", "/report".to_string(), true),
            _ => ("GET", "/slow".to_string(), false),
        };
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(Empty::new());
        if let Ok(req) = req {
            let call = async {
                if let Ok(resp) = http.request(req).await {
                    let _ = resp.into_body().collect().await;
                }
            };
            if patient {
                call.await;
            } else {
                // Gives up: hyper drops the connection and the server drops
                // the request's future (a cancelled statement).
                let _ = tokio::time::timeout(CLIENT_TIMEOUT, call).await;
            }
        }
        tokio::time::sleep(THINK).await;
    }
}

thread_local! {
    /// The service's subscriber, made the default of each runtime thread
    /// (the process-wide one belongs to the `pfs-agent` binary's logs).
    static DISPATCH: RefCell<Option<tracing::dispatcher::DefaultGuard>> = const { RefCell::new(None) };
}

/// Starts the service and its load generator on their own runtime, in a
/// thread `http-service`, until `stop` is set. Returns the thread and the
/// address the service listens on (127.0.0.1, a free port).
pub fn spawn(stop: Arc<AtomicBool>) -> Result<(JoinHandle<()>, SocketAddr), DemoError> {
    // Its wait instruments listed from the start, as the workload's.
    for class in [&BOOK_LOCK, &LEDGER_LOCK, &REPORT_SLOTS] {
        class.get();
    }
    let dispatch =
        tracing::Dispatch::new(tracing_subscriber::registry().with(pfs_tracing::PfsLayer::http()));
    let on_start = dispatch.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("http-worker")
        .enable_all()
        .on_thread_start(move || {
            let guard = tracing::dispatcher::set_default(&on_start);
            DISPATCH.with(|d| *d.borrow_mut() = Some(guard));
        })
        .on_thread_stop(|| DISPATCH.with(|d| drop(d.borrow_mut().take())))
        .build()
        .map_err(DemoError::resource("start the HTTP service's runtime"))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .map_err(DemoError::resource("bind the HTTP service to 127.0.0.1"))?;
    let addr = listener
        .local_addr()
        .map_err(DemoError::resource("read the HTTP service's address"))?;
    let handle = std::thread::Builder::new()
        .name("http-service".into())
        .spawn(move || {
            let _guard = tracing::dispatcher::set_default(&dispatch);
            rt.block_on(async move {
                for i in 0..CLIENTS {
                    tokio::spawn(client(addr, 0x9E37_79B9 + i as u64, stop.clone()));
                }
                let stopped = {
                    let stop = stop.clone();
                    async move {
                        while !stop.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                };
                if let Err(e) = axum::serve(listener, app())
                    .with_graceful_shutdown(stopped)
                    .await
                {
                    tracing::warn!(error = %e, "the demo HTTP service stopped");
                }
            });
        })
        .map_err(DemoError::resource("start the HTTP service thread"))?;
    Ok((handle, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_answers_every_route() {
        let stop = Arc::new(AtomicBool::new(false));
        let (handle, addr) = spawn(stop.clone()).unwrap();
        let agent = ureq::Agent::new_with_defaults();
        let status = |method: &str, path: &str| {
            let url = format!("http://{addr}{path}");
            let r = match method {
                "POST" => agent.post(&url).send_empty(),
                _ => agent.get(&url).call(),
            };
            match r {
                Ok(resp) => resp.status().as_u16(),
                Err(ureq::Error::StatusCode(c)) => c,
                Err(e) => panic!("{method} {path}: {e}"),
            }
        };
        assert_eq!(status("GET", "/orders/1"), 200);
        assert_eq!(status("GET", "/orders/39"), 500);
        assert_eq!(status("GET", "/orders/150"), 404);
        assert_eq!(status("POST", "/orders"), 201);
        assert_eq!(status("GET", "/report"), 200);
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }
}
