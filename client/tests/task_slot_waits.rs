//! A task queued on an instrumented tokio lock shows the wait in its task
//! slot while it awaits (`events_waits_current`), nested in its open
//! stage, and no more once it acquired; read back from the real segment.
//! One test function: `init` is once per process.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::read;
use pfs_client::task::TaskExt;
use pfs_client::{LazyStageClass, LazyStatementClass, LazyWaitClass};
use pfs_shm_layout::kinds::Operation;
use pfs_shm_layout::reader::{Event, SegmentSnapshot};

static REQUEST: LazyStatementClass = LazyStatementClass::new("statement/test/queued_request");
static POOL_WAIT: LazyStageClass = LazyStageClass::new("stage/test/pool_wait");
static POOL: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/pool");

const TASKS: usize = 12;

/// The queued waits the task slots show, by `THREAD_ID`, with the stage
/// the same slot shows.
fn queued(s: &SegmentSnapshot) -> BTreeMap<u64, (Event, Option<Event>)> {
    s.tasks
        .iter()
        .filter_map(|t| {
            let w = t.waits_current?;
            Some((w.thread_id, (w, t.stages_current)))
        })
        .collect()
}

#[test]
fn a_task_queued_on_a_lock_shows_the_wait_until_it_acquires() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("task-slot-waits").shm_dir(dir.path())).unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pool = Arc::new(pfs_client::tokio::Mutex::new(&POOL, ()));
    let held = rt.block_on(pool.clone().lock_owned());
    let (ids_tx, ids_rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let pool = pool.clone();
            let ids = ids_tx.clone();
            rt.spawn(
                async move {
                    let stmt = REQUEST.start_task();
                    POOL_WAIT.enter();
                    ids.send(stmt.id().0).unwrap();
                    let _g = pool.lock().await;
                    tokio::task::yield_now().await;
                    drop(stmt);
                }
                .pfs_task(),
            )
        })
        .collect();
    let tids: Vec<u64> = (0..TASKS)
        .map(|_| ids_rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();

    let class = |s: &SegmentSnapshot| {
        s.classes
            .iter()
            .find(|c| c.name == POOL.name())
            .map(|c| c.index)
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        let s = read(&path);
        if queued(&s).len() == TASKS {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {TASKS} queued waits shown",
            queued(&s).len()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let shown = queued(&s);
    for tid in &tids {
        let (w, stage) = &shown[tid];
        assert_eq!(w.class, class(&s));
        assert_eq!(w.operation, Some(Operation::Lock));
        assert_eq!(w.end_event_id, None, "running");
        assert!(w.timer_start.is_some(), "timed");
        let stage = stage.as_ref().expect("the stage it queued in");
        assert_eq!(
            w.nesting_event_id,
            Some(stage.event_id),
            "nested in its stage"
        );
        assert_eq!(stage.thread_id, *tid);
    }
    // The agent's `events_waits_current` shows the time so far of a
    // running wait: here, the slot's rows are what it reads.
    drop(held);
    for h in handles {
        rt.block_on(h).unwrap();
    }
    let s = read(&path);
    assert!(queued(&s).is_empty(), "acquired: no wait shown");
    assert!(s.tasks.is_empty(), "ended tasks show nothing");
    drop(rt);
}
