//! Requests that wait, inside a real axum + tower-http server: while 16
//! handlers await a backend (a stage span held across the await), every
//! request is in `events_statements_current` (from its task slot), running,
//! with its `SQL_TEXT` and class, its stage in `events_stages_current`
//! nested in it; once they are answered, none is. One test function:
//! `init` is once per process.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;
use pfs_shm_layout::reader::SegmentSnapshot;
use pfs_tracing::{PfsLayer, SpanMatch, StageRule};
use tower_http::trace::TraceLayer;
use tracing::Instrument;
use tracing_subscriber::prelude::*;

const REQUESTS: usize = 16;

async fn sleepy() -> &'static str {
    tokio::time::sleep(Duration::from_millis(300)).await;
    "late"
}

async fn slow(
    Path(id): Path<u64>,
    State(open): State<tokio::sync::watch::Receiver<bool>>,
) -> String {
    let mut open = open.clone();
    async move {
        let _ = open.wait_for(|o| *o).await;
    }
    .instrument(tracing::info_span!("wait_backend", id))
    .await;
    format!("done {id}")
}

/// Running requests shown by task slots: `THREAD_ID` → (class, text,
/// stage class nested in it).
fn waiting(s: &SegmentSnapshot) -> BTreeMap<u64, (String, String, Option<String>)> {
    let name = |c: u32| {
        s.classes
            .iter()
            .find(|k| k.index == c)
            .map(|k| k.name.clone())
            .unwrap_or_default()
    };
    s.tasks
        .iter()
        .filter_map(|t| {
            let st = t.statements_current.as_ref()?;
            let stage = t
                .stages_current
                .as_ref()
                .filter(|g| g.nesting_event_id == Some(st.ev.event_id))
                .map(|g| name(g.class));
            Some((st.ev.thread_id, (name(st.ev.class), st.text.clone(), stage)))
        })
        .collect()
}

#[test]
fn waiting_requests_show_in_the_current_tables() {
    let (_dir, path) = common::init("tracing-awaiting");
    let layer = PfsLayer::builder()
        .http_defaults()
        .stage(StageRule::new(SpanMatch::name("wait_backend"), "app"))
        .build();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let rt = common::runtime(2);
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    let statuses = rt.block_on(async {
        let app = Router::new()
            .route("/slow/{id}", get(slow))
            .route("/sleepy", get(sleepy))
            .with_state(open_rx)
            .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
        let (addr, shutdown, server) = common::serve(app).await;
        let clients: Vec<_> = (0..REQUESTS)
            .map(|i| {
                tokio::spawn(async move {
                    let client = common::client();
                    common::send(&client, "GET", &format!("http://{addr}/slow/{i}")).await
                })
            })
            .collect();
        // From another thread, as an agent reads: all requests wait.
        let seg = path.clone();
        let shown = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let w = waiting(&common::read(&seg));
                // (A snapshot reads the classes first: one taken as the
                // first requests registered theirs may not name them.)
                if w.len() == REQUESTS && w.values().all(|(c, _, g)| !c.is_empty() && g.is_some()) {
                    return w;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} of {REQUESTS} waiting requests shown: {w:?}",
                    w.len()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        })
        .await
        .unwrap();
        let mut texts: Vec<_> = shown.values().map(|(_, text, _)| text.clone()).collect();
        texts.sort();
        let mut expected: Vec<_> = (0..REQUESTS).map(|i| format!("GET /slow/{i}")).collect();
        expected.sort();
        assert_eq!(texts, expected);
        for (class, _, stage) in shown.values() {
            assert_eq!(class, "statement/http/GET /slow/{id}");
            assert_eq!(stage.as_deref(), Some("stage/app/wait_backend"));
        }
        open_tx.send(true).unwrap();
        let mut statuses = Vec::new();
        for c in clients {
            statuses.push(c.await.unwrap());
        }
        // Clients that hang up before the answer: the handler's future is
        // dropped, its statement ends cancelled, and its slot empties.
        for _ in 0..REQUESTS {
            let client = common::client();
            let req = hyper::Request::builder()
                .uri(format!("http://{addr}/sleepy"))
                .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                .unwrap();
            let _ = tokio::time::timeout(Duration::from_millis(20), client.request(req)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let left = waiting(&common::read(&path));
        assert!(
            left.is_empty(),
            "hung-up requests still shown waiting: {left:?}"
        );
        shutdown.send(()).unwrap();
        server.await.unwrap();
        statuses
    });
    assert_eq!(statuses, vec![200; REQUESTS]);
    let s = common::read(&path);
    assert!(
        waiting(&s).is_empty(),
        "answered requests still shown: {:?}",
        waiting(&s)
    );
    drop(rt);
}
