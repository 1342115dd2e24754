//! `events_*_current` and tasks, read back from the real segment: while a
//! task runs, the rows of the worker polling it show its statement (with
//! its text) and stage running, at every poll, on whichever worker; while
//! it waits between polls, its open statement and stage are in no worker's
//! current row (a worker's row shows what it runs, or last ran) but in the
//! task's slot, which shows nothing once they end;
//! once the statement ends, on whichever worker, the only rows that show
//! it show it ended, with its text. A stage left open by a task (without a
//! statement) ends when the task does. One test function: `init` is once
//! per process.

mod common;

use std::time::{Duration, Instant};

use common::read;
use pfs_client::task::{TaskContext, TaskExt};
use pfs_client::{LazyStageClass, LazyStatementClass};
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::SegmentSnapshot;

static PARKED: LazyStatementClass = LazyStatementClass::new("statement/test/parked");
static WAITING: LazyStageClass = LazyStageClass::new("stage/test/waiting");
static LONE: LazyStageClass = LazyStageClass::new("stage/test/lone");
static OUTSIDE: LazyStatementClass = LazyStatementClass::new("statement/test/outside");
static THREAD_STMT: LazyStatementClass = LazyStatementClass::new("statement/test/thread");

/// The current statement and stage rows showing logical thread `tid`'s
/// events: (kind, event id, ended, text).
fn rows_of(s: &SegmentSnapshot, tid: u64) -> Vec<(&'static str, u64, bool, String)> {
    let mut out = Vec::new();
    for t in &s.threads {
        if let Some(c) = t
            .statements_current
            .as_ref()
            .filter(|c| c.ev.thread_id == tid)
        {
            out.push((
                "statement",
                c.ev.event_id,
                c.ev.end_event_id.is_some(),
                c.text.clone(),
            ));
        }
        if let Some(c) = t.stages_current.as_ref().filter(|c| c.thread_id == tid) {
            out.push(("stage", c.event_id, c.end_event_id.is_some(), String::new()));
        }
    }
    out.sort();
    out
}

/// What the task slots show of logical thread `tid`: (kind, event id,
/// text); every row there is running.
fn parked_of(s: &SegmentSnapshot, tid: u64) -> Vec<(&'static str, u64, String)> {
    let mut out = Vec::new();
    for t in &s.tasks {
        if let Some(c) = t
            .statements_current
            .as_ref()
            .filter(|c| c.ev.thread_id == tid)
        {
            assert!(c.ev.end_event_id.is_none(), "a slot shows {c:?} ended");
            out.push(("statement", c.ev.event_id, c.text.clone()));
        }
        if let Some(c) = t.stages_current.as_ref().filter(|c| c.thread_id == tid) {
            assert!(c.end_event_id.is_none(), "a slot shows {c:?} ended");
            out.push(("stage", c.event_id, String::new()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_waiting_task_is_in_no_current_row_and_an_ended_one_is_shown_ended() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("task-current-rows").shm_dir(dir.path()))
        .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let seg = path.clone();
    let task = rt.spawn(
        async move {
            let mut stmt = PARKED.start_task();
            stmt.set_text("parked request");
            WAITING.enter();
            // While the task runs, its worker's rows show both running,
            // the statement with its text.
            let (tid, id) = stmt.id();
            assert_eq!(
                rows_of(&read(&seg), tid),
                [
                    ("stage", id + 1, false, String::new()),
                    ("statement", id, false, "parked request".to_string()),
                ]
            );
            started_tx.send(stmt.id()).unwrap();
            // Parked here until the test says go: no worker runs it.
            go_rx.await.unwrap();
            // Woken by another thread: possibly resumed on the other worker.
            tokio::task::yield_now().await;
            // Polled again: the rows of the worker polling it show both
            // running again, the statement with its text.
            assert_eq!(
                rows_of(&read(&seg), tid),
                [
                    ("stage", id + 1, false, String::new()),
                    ("statement", id, false, "parked request".to_string()),
                ]
            );
            stmt.end();
        }
        .pfs_task(),
    );
    let (tid, stmt_id) = started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_ne!(tid, 0, "the task records");

    // Once the poll that started them returned, no current row shows the
    // open statement or stage.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = rows_of(&read(&path), tid);
        if shown.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a parked task's open events are still shown running: {shown:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Its slot shows both, the statement with its text.
    assert_eq!(
        parked_of(&read(&path), tid),
        [
            ("stage", stmt_id + 1, String::new()),
            ("statement", stmt_id, "parked request".to_string()),
        ]
    );

    go_tx.send(()).unwrap();
    rt.block_on(task).unwrap();
    // Ended: one statement row, ended, with its text, and one stage row,
    // ended (the statement's end ended its stage), on the worker that
    // ended them; none left running on the worker that started them.
    let shown = rows_of(&read(&path), tid);
    assert_eq!(
        shown,
        [
            ("stage", stmt_id + 1, true, String::new()),
            ("statement", stmt_id, true, "parked request".to_string()),
        ],
        "{shown:?}"
    );
    assert_eq!(
        parked_of(&read(&path), tid),
        [],
        "an ended task's slot is empty"
    );

    // A stage without a statement, left open by a task that completes
    // (here after migrating), and one left open by a task that is dropped.
    let lone = rt.block_on(async {
        let done = tokio::spawn(
            async {
                LONE.enter();
                tokio::task::yield_now().await;
                pfs_client::thread_id().unwrap()
            }
            .pfs_task(),
        );
        let tid = done.await.unwrap();
        let (_tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel::<()>();
        let parked = tokio::spawn(
            async move {
                LONE.enter();
                entered_tx.send(()).unwrap();
                let _ = rx.await;
            }
            .pfs_task(),
        );
        entered_rx.await.unwrap();
        parked.abort();
        let _ = parked.await;
        tid
    });
    // A statement ended outside its task, on a plain thread: the task,
    // polled again, does not show it running (nor with the
    // `events_statements_current` consumer off, a statement it does not
    // show at all).
    let seg = path.clone();
    let outside = rt.block_on(async move {
        tokio::spawn(
            async move {
                let stmt = OUTSIDE.start_task();
                let ids = stmt.id();
                tokio::task::yield_now().await;
                std::thread::spawn(move || drop(stmt)).join().unwrap();
                tokio::task::yield_now().await;
                let running: Vec<_> = rows_of(&read(&seg), ids.0)
                    .into_iter()
                    .filter(|r| r.0 == "statement" && !r.2)
                    .collect();
                assert_eq!(running, [], "an ended statement shown running");
                assert_eq!(parked_of(&read(&seg), ids.0), [], "nor in the task's slot");
                ids
            }
            .pfs_task(),
        )
        .await
        .unwrap()
    });
    // (The thread that ended it has exited: its record, and row, are gone.)
    let shown = rows_of(&read(&path), outside.0);
    assert!(shown.iter().all(|r| r.2), "{shown:?} ({outside:?})");
    let rw = Segment::open(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap(),
        true,
    )
    .unwrap();
    let seg = path.clone();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (ids_tx, ids_rx) = std::sync::mpsc::channel();
    let parked = rt.spawn(
        async move {
            let stmt = PARKED.start_task();
            ids_tx.send(stmt.id()).unwrap();
            go_rx.await.unwrap();
            tokio::task::yield_now().await;
            // The consumer was turned off while it waited: not shown.
            let running: Vec<_> = rows_of(&read(&seg), stmt.id().0)
                .into_iter()
                .filter(|r| r.0 == "statement" && !r.2)
                .collect();
            assert_eq!(running, [], "shown with its consumer off");
            assert_eq!(
                parked_of(&read(&seg), stmt.id().0),
                [],
                "parked with its consumer off"
            );
            drop(stmt);
        }
        .pfs_task(),
    );
    let ids = ids_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        pfs_shm_layout::setup::set_consumers(&rw, "events_statements_current", false),
        1
    );
    go_tx.send(()).unwrap();
    rt.block_on(parked).unwrap();
    assert_eq!(
        pfs_shm_layout::setup::set_consumers(&rw, "events_statements_current", true),
        1
    );
    assert!(
        rows_of(&read(&path), ids.0).iter().all(|r| r.2),
        "{:?}",
        rows_of(&read(&path), ids.0)
    );

    // A task entered over a thread's own open statement, and a task
    // entered over another task's: each outer statement, with its text,
    // and its stage show again when the inner context leaves; the tasks'
    // slots show theirs.
    let seg = path.clone();
    std::thread::spawn(move || {
        let mut own = THREAD_STMT.start();
        own.set_text("THREAD stmt");
        LONE.enter();
        let own_ids = (
            pfs_client::thread_id().unwrap(),
            pfs_client::statement_event_id().unwrap(),
        );
        let (mut a, mut b) = (TaskContext::new(), TaskContext::new());
        let outer = {
            let _in_a = a.enter();
            let mut outer = PARKED.start_task();
            outer.set_text("OUTER");
            WAITING.enter();
            let inner = {
                let _in_b = b.enter();
                let mut inner = OUTSIDE.start_task();
                inner.set_text("INNER");
                inner
            };
            // B left: A's statement and stage are in the rows again.
            let shown = rows_of(&read(&seg), outer.id().0);
            assert!(
                shown.contains(&("statement", outer.id().1, false, "OUTER".to_string())),
                "{shown:?}"
            );
            assert_eq!(
                parked_of(&read(&seg), inner.id().0),
                [("statement", inner.id().1, "INNER".to_string())]
            );
            (outer, inner)
        };
        // A left: the thread's own statement and stage are shown again,
        // with its text; both tasks' slots show theirs.
        let s = read(&seg);
        let own_rows = rows_of(&s, own_ids.0);
        assert!(
            own_rows.contains(&("statement", own_ids.1, false, "THREAD stmt".to_string())),
            "{own_rows:?}"
        );
        assert!(
            own_rows.iter().any(|r| r.0 == "stage" && !r.2),
            "{own_rows:?}"
        );
        let (o, _) = &outer;
        assert_eq!(
            parked_of(&s, o.id().0),
            [
                ("stage", o.id().1 + 1, String::new()),
                ("statement", o.id().1, "OUTER".to_string()),
            ]
        );
        // Each ended inside its own task (as the C API's
        // `pfs_task_statement_end` does): the thread's row is its own again.
        let (outer, inner) = outer;
        {
            let _in_a = a.enter();
            drop(outer);
        }
        {
            let _in_b = b.enter();
            drop(inner);
        }
        drop((a, b));
        drop(own);
        // Ended: its text kept to the end.
        let s = read(&seg);
        let ended: Vec<_> = s
            .threads
            .iter()
            .flat_map(|t| t.statements_history.iter())
            .filter(|h| (h.ev.thread_id, h.ev.event_id) == own_ids)
            .map(|h| h.text.clone())
            .collect();
        assert_eq!(ended, ["THREAD stmt"]);
    })
    .join()
    .unwrap();

    let s = read(&path);
    let lone_class = s
        .classes
        .iter()
        .find(|c| c.name == LONE.name())
        .unwrap()
        .index;
    let count: u64 = s
        .threads
        .iter()
        .flat_map(|t| t.rows.iter())
        .filter(|(c, _)| *c == lone_class)
        .map(|(_, r)| r.count)
        .sum();
    assert_eq!(count, 2, "both tasks' open stages ended and were counted");
    assert!(
        rows_of(&s, lone).iter().all(|r| r.2),
        "no stage left running: {:?}",
        rows_of(&s, lone)
    );
    drop(rt);
}
