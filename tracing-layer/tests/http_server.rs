//! The layer inside a real axum + tower-http server on a multi-threaded
//! tokio runtime, answering real HTTP requests from 8 concurrent clients:
//! per-route statement counts and errors equal what the clients received,
//! and every statement's events nest exactly (stages in their statement,
//! same THREAD_ID; TIMER_WAIT ≥ CPU_TIME > 0; TIMER_WAIT ≥ each stage's).
//! While a handler runs, after it was suspended, its request's statement
//! shows running in `events_statements_current`, with its `SQL_TEXT`.
//! One test function: `init` is once per process.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::StatementEvent;
use pfs_tracing::{PfsLayer, SpanMatch, StageRule};
use tower_http::trace::TraceLayer;
use tracing::Instrument;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

const CLIENTS: usize = 8;
const PER_CLIENT: usize = 48;

/// The segment, for handlers that read it.
static SEGMENT: OnceLock<std::path::PathBuf> = OnceLock::new();
/// Handlers that looked for their statement in the current rows, and
/// those that did not find it running.
static LOOKED: AtomicU64 = AtomicU64::new(0);
static NOT_RUNNING: AtomicU64 = AtomicU64::new(0);
/// Those whose running statement did not show its `SQL_TEXT` (the
/// request's method and path, known from the span's start).
static NO_TEXT: AtomicU64 = AtomicU64::new(0);

/// Whether a current statement row shows the running request of the
/// calling task (a handler resumed after an await).
fn request_shown_running() {
    let (Some(path), Some(tid)) = (SEGMENT.get(), pfs_client::thread_id()) else {
        return;
    };
    let s = common::read(path);
    let running = s.threads.iter().find_map(|t| {
        t.statements_current
            .as_ref()
            .filter(|c| c.ev.thread_id == tid && c.ev.end_event_id.is_none())
    });
    LOOKED.fetch_add(1, Relaxed);
    match running {
        None => {
            NOT_RUNNING.fetch_add(1, Relaxed);
        }
        Some(c) if !c.text.starts_with("GET /users/") => {
            NO_TEXT.fetch_add(1, Relaxed);
        }
        Some(_) => {}
    }
}

async fn get_user(Path(id): Path<u64>) -> String {
    // A stage by rule (this crate's spans named `load_user`), held across
    // an await that may move the task to another worker.
    async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
    }
    .instrument(tracing::info_span!("load_user", id))
    .await;
    request_shown_running();
    // A stage by its name, entered synchronously.
    let _render = tracing::info_span!("stage/app/render").entered();
    format!("user {id}")
}

async fn fail() -> StatusCode {
    tokio::task::yield_now().await;
    StatusCode::INTERNAL_SERVER_ERROR
}

async fn create_item() -> (StatusCode, &'static str) {
    (StatusCode::CREATED, "created")
}

/// What one request was, by statement class.
fn request(client: usize, i: usize) -> (&'static str, &'static str, String) {
    let n = client * PER_CLIENT + i;
    match n % 4 {
        0 => (
            "GET",
            "statement/http/GET /users/{id}",
            format!("/users/{n}"),
        ),
        1 => ("GET", "statement/http/GET /fail", "/fail".to_string()),
        2 => ("POST", "statement/http/POST /items", "/items".to_string()),
        _ => ("GET", "statement/http/unknown", format!("/nowhere/{n}")),
    }
}

#[test]
fn per_route_statements_equal_what_the_clients_received() {
    let (_dir, path) = common::init("tracing-test");
    SEGMENT.set(path.clone()).unwrap();
    let layer = PfsLayer::builder()
        .http_defaults()
        .stage(StageRule::new(SpanMatch::name("load_user"), "app"))
        .build();
    // fmt on the same registry, filtered to INFO on its own; it writes to
    // a sink.
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(layer).with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(LevelFilter::INFO),
        ),
    )
    .unwrap();

    let rt = common::runtime(4);
    // (class, status) -> responses received.
    let received: Arc<Mutex<HashMap<(&'static str, u16), u64>>> = Arc::default();
    rt.block_on(async {
        let app = Router::new()
            .route("/users/{id}", get(get_user))
            .route("/fail", get(fail))
            .route("/items", post(create_item))
            .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
        let (addr, shutdown, server) = common::serve(app).await;
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let received = received.clone();
            clients.push(tokio::spawn(async move {
                let client = common::client();
                for i in 0..PER_CLIENT {
                    let (method, class, path) = request(c, i);
                    let status =
                        common::send(&client, method, &format!("http://{addr}{path}")).await;
                    *received.lock().unwrap().entry((class, status)).or_default() += 1;
                }
            }));
        }
        for c in clients {
            c.await.unwrap();
        }
        shutdown.send(()).unwrap();
        server.await.unwrap();
    });
    let s = common::read(&path);
    drop(rt);
    assert!(LOOKED.load(Relaxed) > 0);
    assert_eq!(
        NOT_RUNNING.load(Relaxed),
        0,
        "handlers whose request was not shown running, of {}",
        LOOKED.load(Relaxed)
    );
    assert_eq!(
        NO_TEXT.load(Relaxed),
        0,
        "running requests shown without their SQL_TEXT, of {}",
        LOOKED.load(Relaxed)
    );

    let received = received.lock().unwrap().clone();
    let statuses: HashMap<&str, u16> = received.keys().map(|(c, st)| (*c, *st)).collect();
    assert_eq!(
        statuses,
        HashMap::from([
            ("statement/http/GET /users/{id}", 200),
            ("statement/http/GET /fail", 500),
            ("statement/http/POST /items", 201),
            ("statement/http/unknown", 404),
        ]),
        "one status per route"
    );
    let total: u64 = received.values().sum();
    assert_eq!(total, (CLIENTS * PER_CLIENT) as u64);

    // Summaries: COUNT_STAR and SUM_ERRORS per route class.
    let sums = common::sums(&s);
    for ((class, status), n) in &received {
        let sum = sums
            .get(*class)
            .unwrap_or_else(|| panic!("{class} recorded"));
        assert_eq!(sum.count, *n, "{class}: one statement per response");
        let errors = if *status >= 500 { *n } else { 0 };
        assert_eq!(
            sum.statement.errors, errors,
            "{class}: errors = 5xx received"
        );
        assert_eq!(sum.statement.cancelled, 0, "{class}");
    }
    let http_classes = s
        .classes
        .iter()
        .filter(|c| c.name.starts_with("statement/http/"))
        .count();
    assert_eq!(http_classes, 4, "no class beyond the routes and unknown");
    assert_eq!(s.lost[LostKind::Classes as usize], 0);
    assert_eq!(&s.lost[5..8], &[0, 0, 0], "history_long lost events");

    // history_long: every statement, its text, figures and times.
    let class_name: HashMap<u32, &str> = s
        .classes
        .iter()
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    let stmts: Vec<&StatementEvent> = s
        .long_statements
        .iter()
        .filter(|e| class_name[&e.ev.class].starts_with("statement/http/"))
        .collect();
    assert_eq!(stmts.len() as u64, total);
    let mut by_id: HashMap<(u64, u64), &StatementEvent> = HashMap::new();
    for st in &stmts {
        let class = class_name[&st.ev.class];
        let wait = st.ev.timer_wait.expect("timed");
        let cpu = st.figures.cpu_time_ps;
        assert!(cpu > 0, "{class}: CPU_TIME > 0");
        assert!(wait >= cpu, "{class}: TIMER_WAIT {wait} >= CPU_TIME {cpu}");
        assert_eq!(
            st.ev.nesting_event_type, None,
            "a statement span is a logical thread"
        );
        assert_eq!(
            st.ev.event_id, 1,
            "a request's statement is its context's first event"
        );
        let expected_text = match class {
            "statement/http/GET /users/{id}" => st.text.starts_with("GET /users/"),
            "statement/http/GET /fail" => st.text == "GET /fail",
            "statement/http/POST /items" => st.text == "POST /items",
            _ => st.text.starts_with("GET /nowhere/"),
        };
        assert!(expected_text, "{class}: SQL_TEXT {:?}", st.text);
        assert_ne!(st.figures.digest, 0, "DIGEST set");
        assert!(
            by_id
                .insert((st.ev.thread_id, st.ev.event_id), st)
                .is_none(),
            "one statement per THREAD_ID"
        );
    }
    // Same shape, same DIGEST; different routes, different ones.
    let mut digests: HashMap<&str, u64> = HashMap::new();
    for st in &stmts {
        let d = *digests
            .entry(class_name[&st.ev.class])
            .or_insert(st.figures.digest);
        assert_eq!(d, st.figures.digest);
    }
    let mut distinct: Vec<u64> = digests.values().copied().collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 4);

    // Stages: two per /users request, each nested in its own statement.
    let load = common::class_index(&s, "stage/app/load_user").expect("stage registered");
    let render = common::class_index(&s, "stage/app/render").expect("stage registered");
    let mut stages_of: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
    for e in &s.long[EventKind::Stage.index()] {
        assert!(
            e.class == load || e.class == render,
            "only our stages: {e:?}"
        );
        let parent = (e.thread_id, e.nesting_event_id.expect("nested"));
        assert_eq!(e.nesting_event_type, Some(EventKind::Statement));
        let st = by_id
            .get(&parent)
            .unwrap_or_else(|| panic!("{e:?}: its statement, same THREAD_ID"));
        assert_eq!(class_name[&st.ev.class], "statement/http/GET /users/{id}");
        assert!(st.ev.event_id < e.event_id && e.event_id < st.ev.end_event_id.unwrap());
        let (sw, ew) = (st.ev.timer_wait.unwrap(), e.timer_wait.unwrap());
        assert!(
            sw >= ew,
            "statement TIMER_WAIT {sw} >= stage TIMER_WAIT {ew}"
        );
        assert!(e.timer_start.unwrap() >= st.ev.timer_start.unwrap());
        assert!(e.timer_end.unwrap() <= st.ev.timer_end.unwrap());
        stages_of.entry(parent).or_default().push(e.class);
    }
    let users = received[&("statement/http/GET /users/{id}", 200)];
    assert_eq!(
        stages_of.len() as u64,
        users,
        "every /users statement has its stages"
    );
    for stages in stages_of.values() {
        assert_eq!(stages, &[load, render], "load_user, then render");
    }
    // The sleep in load_user is not poll time: some of the wall time is
    // not CPU_TIME (not necessarily the whole sleep: a poll preempted
    // past the sleep's deadline counts as poll time).
    for id in stages_of.keys() {
        let st = by_id[id];
        let (wait, cpu) = (st.ev.timer_wait.unwrap(), st.figures.cpu_time_ps);
        assert!(wait > cpu, "TIMER_WAIT {wait} > CPU_TIME {cpu}: {st:?}");
    }
}
