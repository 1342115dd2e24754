//! `spawn_blocking` under a request span, in a real axum server: the
//! blocking closure enters the request's span while the worker that
//! spawned it is still inside the request's poll (the handler keeps the
//! worker there until the closure is about to enter, so the race is
//! certain, not a matter of luck). With `pfs_tracing::enter_blocking`, every wait the closure
//! records nests in the request's statement, under its THREAD_ID; with a
//! plain `enter` the context is taken and the closure's waits are the
//! blocking thread's own (documented). One test function: `init` is once
//! per process.

mod common;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use pfs_client::{LazyWaitClass, Operation};
use pfs_shm_layout::EventKind;
use pfs_tracing::PfsLayer;
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

static WORK: LazyWaitClass = LazyWaitClass::new("wait/io/file/app/blocking_work");
static PLAIN_WORK: LazyWaitClass = LazyWaitClass::new("wait/io/file/app/plain_work");

const REQUESTS: usize = 20;

/// Spawns the blocking work and stays in the poll until the closure is
/// about to enter the span, then 200 µs more, as a handler that does more
/// work after spawning would: the closure's `enter_blocking` finds the
/// span still entered here (if it is late, it finds it free: either way
/// its wait must nest in the request).
async fn blocking() -> &'static str {
    let req = tracing::Span::current();
    let (entering_tx, entering_rx) = std::sync::mpsc::channel();
    let h = tokio::task::spawn_blocking(move || {
        entering_tx.send(()).unwrap();
        let _g = pfs_tracing::enter_blocking(&req);
        let _w = WORK.get().start(Operation::Read, 0);
        std::thread::sleep(Duration::from_micros(200));
    });
    entering_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_micros(200));
    h.await.unwrap();
    "done"
}

/// The same with a plain `enter`, made while this poll is surely still
/// in the span: the closure says it entered, and the poll waits for that
/// before it returns.
async fn plain() -> &'static str {
    let req = tracing::Span::current();
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let h = tokio::task::spawn_blocking(move || {
        let _g = req.enter();
        entered_tx.send(()).unwrap();
        let _w = PLAIN_WORK.get().start(Operation::Read, 0);
        std::thread::sleep(Duration::from_micros(200));
    });
    entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    h.await.unwrap();
    "done"
}

#[test]
fn enter_blocking_nests_the_closure_in_the_request() {
    let (_dir, path) = common::init("tracing-blocking");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PfsLayer::http()))
        .unwrap();
    let rt = common::runtime(2);
    rt.block_on(async {
        let app = Router::new()
            .route("/blocking", get(blocking))
            .route("/plain", get(plain))
            .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
        let (addr, shutdown, server) = common::serve(app).await;
        let client = common::client();
        for _ in 0..REQUESTS {
            for route in ["blocking", "plain"] {
                let url = format!("http://{addr}/{route}");
                assert_eq!(common::send(&client, "GET", &url).await, 200);
            }
        }
        drop(shutdown);
        server.await.unwrap();
    });
    drop(rt);
    let s = common::read(&path);
    let statements = |route: &str| {
        let class = common::class_index(&s, &format!("statement/http/GET /{route}")).unwrap();
        s.long_statements
            .iter()
            .filter(|e| e.ev.class == class)
            .map(|e| (e.ev.thread_id, e.ev.event_id))
            .collect::<std::collections::HashSet<_>>()
    };
    let waits = |class: &LazyWaitClass| {
        let idx = common::class_index(&s, class.name()).unwrap();
        s.long[EventKind::Wait.index()]
            .iter()
            .filter(|e| e.class == idx)
            .cloned()
            .collect::<Vec<_>>()
    };
    let requests = statements("blocking");
    assert_eq!(requests.len(), REQUESTS);
    let work = waits(&WORK);
    assert_eq!(work.len(), REQUESTS);
    for w in &work {
        assert_eq!(w.nesting_event_type, Some(EventKind::Statement));
        let parent = (w.thread_id, w.nesting_event_id.unwrap());
        assert!(requests.contains(&parent), "{w:?} nests in a request");
    }
    // Each request's own wait: one per statement.
    let parents: std::collections::HashSet<_> = work
        .iter()
        .map(|w| (w.thread_id, w.nesting_event_id.unwrap()))
        .collect();
    assert_eq!(parents, requests);

    // A plain enter found the context taken: the blocking thread's own.
    let plain = statements("plain");
    let plain_work = waits(&PLAIN_WORK);
    assert_eq!(plain_work.len(), REQUESTS);
    let nested = plain_work
        .iter()
        .filter(|w| {
            w.nesting_event_id
                .is_some_and(|n| plain.contains(&(w.thread_id, n)))
        })
        .count();
    assert_eq!(
        nested, 0,
        "a plain enter of a span held elsewhere does not wait"
    );
}
