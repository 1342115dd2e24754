//! A task queued on two instrumented tokio locks at once (`join!`): its
//! slot shows the wait that started last, then, once that lock is
//! acquired, the one still queued, then nothing; read back from the real
//! segment. Before, the first lock acquired took the task's wait out of
//! `events_waits_current` while it still waited for the other.
//! One test function: `init` is once per process.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::read;
use pfs_client::task::TaskExt;
use pfs_client::{LazyStatementClass, LazyWaitClass};
use pfs_shm_layout::reader::SegmentSnapshot;

static REQUEST: LazyStatementClass = LazyStatementClass::new("statement/test/joined");
static FIRST: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/first");
static SECOND: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/second");

/// The class name of the queued wait task `tid`'s slot shows, if any.
fn shown_wait(s: &SegmentSnapshot, tid: u64) -> Option<String> {
    let w = s
        .tasks
        .iter()
        .filter_map(|t| t.waits_current)
        .find(|w| w.thread_id == tid)?;
    s.classes
        .iter()
        .find(|c| c.index == w.class)
        .map(|c| c.name.clone())
}

/// Waits until task `tid`'s slot shows `want` (a class name, or none).
fn until_shown(path: &std::path::Path, tid: u64, want: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = shown_wait(&read(path), tid);
        if now.as_deref() == want {
            return;
        }
        assert!(Instant::now() < deadline, "shown {now:?}, want {want:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_task_queued_on_two_locks_shows_each_until_it_acquires_it() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("joined-waits").shm_dir(dir.path())).unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let first = Arc::new(pfs_client::tokio::Mutex::new(&FIRST, ()));
    let second = Arc::new(pfs_client::tokio::Mutex::new(&SECOND, ()));
    let held_first = rt.block_on(first.clone().lock_owned());
    let held_second = rt.block_on(second.clone().lock_owned());
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let task = rt.spawn(
        async move {
            let stmt = REQUEST.start_task();
            id_tx.send(stmt.id().0).unwrap();
            // Polled in order: the wait on `first` starts, then `second`'s.
            let (a, b) = tokio::join!(first.lock(), second.lock());
            drop((a, b));
            drop(stmt);
        }
        .pfs_task(),
    );
    let tid = id_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    until_shown(&path, tid, Some(SECOND.name()));
    drop(held_second);
    until_shown(&path, tid, Some(FIRST.name()));
    drop(held_first);
    rt.block_on(task).unwrap();
    until_shown(&path, tid, None);
}
