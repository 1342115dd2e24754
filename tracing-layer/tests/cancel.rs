//! Cancellation: a client that hangs up while its request's handler is
//! still running. hyper drops the response future, tower-http's span
//! closes without its response event, and the layer records the
//! statement as cancelled: flagged, counted in COUNT_CANCELLED, not an
//! error; the handler's open stage ends with it. A request that completes
//! meanwhile is not cancelled. One test function: `init` is once per
//! process.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use pfs_shm_layout::EventKind;
use pfs_tracing::PfsLayer;
use tokio::io::AsyncWriteExt;
use tower_http::trace::TraceLayer;
use tracing::Instrument;
use tracing_subscriber::prelude::*;

async fn slow() -> &'static str {
    // A stage open when the client hangs up: the handler future (and
    // this span) is dropped outside the request span.
    tokio::time::sleep(Duration::from_secs(60))
        .instrument(tracing::info_span!("stage/app/waiting"))
        .await;
    "too late"
}

async fn fast() -> &'static str {
    "ok"
}

static QUEUE: pfs_client::LazyWaitClass =
    pfs_client::LazyWaitClass::new("wait/synch/mutex/app/queue");

/// A lock the test holds while a request queues on it.
fn queue() -> &'static pfs_client::tokio::Mutex<()> {
    static Q: OnceLock<pfs_client::tokio::Mutex<()>> = OnceLock::new();
    Q.get_or_init(|| pfs_client::tokio::Mutex::new(&QUEUE, ()))
}

async fn locked() -> &'static str {
    // Queued when the client hangs up: hyper drops the response future,
    // and tower-http drops the handler's future (this waiter with it)
    // outside the request span.
    let _g = queue().lock().await;
    "too late"
}

const SLOW: &str = "statement/http/GET /slow";
const FAST: &str = "statement/http/GET /fast";
const LOCKED: &str = "statement/http/GET /locked";

#[test]
fn a_client_hanging_up_cancels_the_statement() {
    let (_dir, path) = common::init("tracing-cancel");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PfsLayer::http()))
        .unwrap();
    let rt = common::runtime(2);
    rt.block_on(async {
        let app = Router::new()
            .route("/slow", get(slow))
            .route("/fast", get(fast))
            .route("/locked", get(locked))
            .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
        let (addr, _shutdown, _server) = common::serve(app).await;

        // Two clients hang up, each on a raw connection, once their
        // request is surely in the handler.
        for _ in 0..2 {
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            conn.write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(conn);
        }
        // One hangs up while its request waits for a lock.
        let held = queue().lock().await;
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /locked HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(conn);
        // And a client times out, dropping its request future.
        let client = common::client();
        let req = client.get(format!("http://{addr}/slow").parse().unwrap());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), req)
                .await
                .is_err()
        );
        drop(client);
        assert_eq!(
            common::send(&common::client(), "GET", &format!("http://{addr}/fast")).await,
            200
        );

        // The server notices each hang-up on its own: wait for the three.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = common::read(&path);
            let sums = common::sums(&s);
            let done = sums.get(SLOW).map_or(0, |x| x.count);
            if done == 3
                && sums.get(FAST).is_some_and(|x| x.count == 1)
                && sums.get(LOCKED).is_some_and(|x| x.count == 1)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cancelled statements recorded: {done}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(held);
    });
    let s = common::read(&path);
    drop(rt);

    let sums = common::sums(&s);
    assert_eq!(sums[SLOW].statement.cancelled, 3);
    assert_eq!(sums[SLOW].statement.errors, 0, "a hang-up is not an error");
    assert_eq!(sums[FAST].statement.cancelled, 0);
    let slow = common::class_index(&s, SLOW).unwrap();
    let waiting = common::class_index(&s, "stage/app/waiting").unwrap();
    let cancelled: Vec<_> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == slow)
        .collect();
    assert_eq!(cancelled.len(), 3);
    for st in &cancelled {
        assert_eq!(st.figures.cancelled, 1);
        assert_eq!(st.text, "GET /slow");
        let wait = st.ev.timer_wait.unwrap();
        // Ran until the hang-up (not the handler's 60 s): under load the
        // request may reach the handler late, so no lower bound.
        assert!(wait < 30_000_000_000_000, "ended at the hang-up: {wait} ps");
        assert!(wait >= st.figures.cpu_time_ps);
        // Its stage ended with it, nested in it.
        let stage = s.long[EventKind::Stage.index()]
            .iter()
            .find(|e| e.thread_id == st.ev.thread_id)
            .expect("the stage of the cancelled statement");
        assert_eq!(stage.class, waiting);
        assert_eq!(stage.nesting_event_id, Some(st.ev.event_id));
        assert_eq!(stage.nesting_event_type, Some(EventKind::Statement));
        assert!(stage.timer_wait.unwrap() <= wait);
    }

    // The waiter dropped with the handler's future, outside the span, is
    // still the request's: its wait, under the statement's THREAD_ID,
    // nested in it, inside its event range.
    assert_eq!(sums[LOCKED].statement.cancelled, 1);
    let locked = common::class_index(&s, LOCKED).unwrap();
    let st = s
        .long_statements
        .iter()
        .find(|e| e.ev.class == locked)
        .expect("the cancelled statement");
    let queue = common::class_index(&s, QUEUE.name()).unwrap();
    let waits: Vec<_> = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == queue)
        .collect();
    assert_eq!(waits.len(), 1, "one wait: {waits:?}");
    let w = waits[0];
    assert_eq!(w.thread_id, st.ev.thread_id);
    assert_eq!(w.nesting_event_id, Some(st.ev.event_id));
    assert_eq!(w.nesting_event_type, Some(EventKind::Statement));
    assert!(w.event_id > st.ev.event_id);
    assert_eq!(w.end_event_id, Some(w.event_id + 1));
    assert!(st.ev.end_event_id.is_some_and(|end| w.event_id < end));
    assert!(w.timer_wait.unwrap() <= st.ev.timer_wait.unwrap());
}
