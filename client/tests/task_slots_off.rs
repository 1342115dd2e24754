//! `PFS_TASK_SLOTS=0` (`Config::task_slots(0)`): the segment has no Tasks
//! section, a task that awaits is in no current row (as before layout
//! 7.1), and nothing is counted lost for it. One test function: `init` is
//! once per process.

use std::time::{Duration, Instant};

use pfs_client::LazyStatementClass;
use pfs_client::task::TaskExt;
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};

static REQUEST: LazyStatementClass = LazyStatementClass::new("statement/test/no_slot");

fn read(path: &std::path::Path) -> SegmentSnapshot {
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    assert!(seg.tasks().is_none(), "no Tasks section");
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

#[test]
fn no_task_slots_shows_an_awaiting_task_nowhere_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("task-slots-off")
            .shm_dir(dir.path())
            .task_slots(0),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let task = rt.spawn(
        async move {
            let stmt = REQUEST.start_task();
            id_tx.send(stmt.id().0).unwrap();
            go_rx.await.unwrap();
            drop(stmt);
        }
        .pfs_task(),
    );
    let tid = id_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = read(&path);
        let running = s.threads.iter().any(|t| {
            t.statements_current
                .as_ref()
                .is_some_and(|c| c.ev.thread_id == tid && c.ev.end_event_id.is_none())
        });
        if !running {
            assert!(s.tasks.is_empty());
            assert_eq!(s.lost[LostKind::TaskSlots as usize], 0);
            break;
        }
        assert!(Instant::now() < deadline, "still shown running");
        std::thread::sleep(Duration::from_millis(5));
    }
    go_tx.send(()).unwrap();
    rt.block_on(task).unwrap();
    assert_eq!(read(&path).lost[LostKind::TaskSlots as usize], 0);
    drop(rt);
}
