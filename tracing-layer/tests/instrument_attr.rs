//! Statements from `#[tracing::instrument]` async functions under a rule
//! without status fields, on a multi-threaded runtime: how they end when
//! they do not complete.
//!
//! * Dropped by a `select!` inside a task: completed, unless the dropped
//!   future is wrapped with `pfs_cancellable()`, then cancelled (and so
//!   is a handler it called, whose span closes in that drop).
//! * A `Cancellable` that completes, and a task dropped before it
//!   completed (its spans close in the drop): completed, and cancelled.
//! * A function that panics: one error, not cancelled.
//! * `#[instrument(err)]` with `.errors("error")`: one error per `Err`,
//!   whatever the error displays as (`404`, `0`, `-1`).
//! * Work spawned from inside a stage function with `in_current_span()`
//!   (the stage span): its waits nest in that stage of the statement.
//!
//! One test function: `init` is once per process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use pfs_client::LazyWaitClass;
use pfs_client::task::TaskExt;
use pfs_shm_layout::EventKind;
use pfs_tracing::{PfsLayer, SpanMatch, StageRule, StatementRule};
use tracing::Instrument;
use tracing_subscriber::prelude::*;

static LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/attr/counter");

const N: u64 = 5;

#[tracing::instrument(name = "lookup")]
async fn lookup(key: u64) {
    std::future::pending::<()>().await;
}

#[tracing::instrument(name = "lookup_plain")]
async fn lookup_plain(key: u64) {
    std::future::pending::<()>().await;
}

/// A handler calling a handler, both instrumented: dropped early, both
/// spans are cancelled.
#[tracing::instrument(name = "outer_req")]
async fn outer_req() {
    inner_req().await;
}

#[tracing::instrument(name = "inner_req")]
async fn inner_req() {
    std::future::pending::<()>().await;
}

#[tracing::instrument(name = "quick")]
async fn quick() {
    tokio::task::yield_now().await;
}

#[tracing::instrument(name = "stuck_task")]
async fn stuck_task() {
    std::future::pending::<()>().await;
}

#[tracing::instrument(name = "boom")]
async fn boom() {
    tokio::task::yield_now().await;
    panic!("boom");
}

#[tracing::instrument(name = "fetch", err)]
async fn fetch(code: i64) -> Result<(), i64> {
    tokio::task::yield_now().await;
    if code == 1 { Ok(()) } else { Err(code) }
}

#[tracing::instrument(name = "outer", skip_all)]
async fn outer(m: Arc<pfs_client::tokio::Mutex<u32>>) {
    step(m).await;
}

/// A stage that spawns its work, carrying the current (stage) span.
#[tracing::instrument(name = "step", skip_all)]
async fn step(m: Arc<pfs_client::tokio::Mutex<u32>>) {
    let child = tokio::spawn(async move { *m.lock().await += 1 }.in_current_span());
    child.await.unwrap();
}

#[test]
fn instrumented_async_functions_end_as_they_ended() {
    let (_dir, path) = common::init("tracing-instrument-attr");
    let layer = PfsLayer::builder()
        .statement(
            StatementRule::new(
                SpanMatch::names(&[
                    "lookup",
                    "lookup_plain",
                    "quick",
                    "stuck_task",
                    "boom",
                    "fetch",
                    "outer",
                    "outer_req",
                    "inner_req",
                ]),
                "attr",
            )
            .errors("error"),
        )
        .stage(StageRule::new(SpanMatch::name("step"), "attr"))
        .build();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();

    let rt = common::runtime(2);
    rt.block_on(async {
        let handler = async {
            for i in 0..N {
                tokio::select! {
                    _ = lookup(i).pfs_cancellable() => unreachable!(),
                    _ = tokio::task::yield_now() => {}
                }
                tokio::select! {
                    _ = lookup_plain(i) => unreachable!(),
                    _ = tokio::task::yield_now() => {}
                }
                quick().pfs_cancellable().await;
                tokio::select! {
                    _ = outer_req().pfs_cancellable() => unreachable!(),
                    _ = tokio::task::yield_now() => {}
                }
            }
        };
        tokio::spawn(handler.pfs_task()).await.unwrap();

        for _ in 0..N {
            // A task timed out: dropped with the spans it holds.
            let r = tokio::time::timeout(Duration::from_millis(1), stuck_task().pfs_task()).await;
            assert!(r.is_err());
            // A panic, in a plain spawned task.
            let r = tokio::spawn(boom()).await;
            assert!(r.unwrap_err().is_panic());
        }
        for code in [1, 404, 0, -1, 3] {
            let r = tokio::spawn(fetch(code)).await.unwrap();
            assert_eq!(r.is_ok(), code == 1);
        }
        for _ in 0..N {
            // The spawned child waits for the lock the test holds.
            let m = Arc::new(pfs_client::tokio::Mutex::new(&LOCK, 0));
            let held = m.lock().await;
            let request = tokio::spawn(outer(m.clone()));
            tokio::time::sleep(Duration::from_millis(5)).await;
            drop(held);
            request.await.unwrap();
            assert_eq!(*m.lock().await, 1);
        }
    });
    drop(rt);

    let s = common::read(&path);
    // Spawned from inside the stage: each wait nests in its request's
    // `step` stage, under the request's THREAD_ID.
    let class = |name: &str| common::class_index(&s, name).unwrap();
    let (lock, step, outer) = (
        class(LOCK.name()),
        class("stage/attr/step"),
        class("statement/attr/outer"),
    );
    let stages = &s.long[EventKind::Stage.index()];
    let waits: Vec<_> = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == lock)
        .collect();
    assert_eq!(waits.len() as u64, N, "one contended wait per request");
    for w in &waits {
        let parent = stages
            .iter()
            .find(|st| st.thread_id == w.thread_id && Some(st.event_id) == w.nesting_event_id)
            .unwrap_or_else(|| panic!("the wait nests in no stage: {w:?}"));
        assert_eq!(parent.class, step, "{w:?}");
        assert_eq!(w.nesting_event_type, Some(EventKind::Stage));
        let stmt = s
            .long_statements
            .iter()
            .find(|st| {
                st.ev.thread_id == w.thread_id && Some(st.ev.event_id) == parent.nesting_event_id
            })
            .unwrap_or_else(|| panic!("the stage nests in no statement: {parent:?}"));
        assert_eq!(stmt.ev.class, outer);
    }

    let sums = common::sums(&s);
    let figures = |name: &str| {
        let s = sums
            .get(&format!("statement/attr/{name}"))
            .unwrap_or_else(|| panic!("{name}: no row in {:?}", sums.keys()));
        (s.count, s.statement.cancelled, s.statement.errors)
    };
    // (COUNT_STAR, COUNT_CANCELLED, SUM_ERRORS)
    assert_eq!(
        figures("lookup"),
        (N, N, 0),
        "Cancellable dropped by select!"
    );
    assert_eq!(
        figures("lookup_plain"),
        (N, 0, 0),
        "a plain future dropped by select!: Rust gives no sign"
    );
    assert_eq!(figures("quick"), (N, 0, 0), "a Cancellable that completed");
    assert_eq!(figures("outer_req"), (N, N, 0), "the outer handler");
    assert_eq!(
        figures("inner_req"),
        (N, N, 0),
        "the handler it called, whose span closes inside the outer's drop"
    );
    assert_eq!(figures("stuck_task"), (N, N, 0), "a task timed out");
    assert_eq!(figures("boom"), (N, 0, N), "a panic is one error");
    assert_eq!(
        figures("fetch"),
        (5, 0, 4),
        "#[instrument(err)]: one error per Err, whatever it displays"
    );
}
