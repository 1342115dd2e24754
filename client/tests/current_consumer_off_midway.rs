//! An event that started while its `events_*_current` consumer was on
//! ends in that row even if the consumer is switched off before it ends
//! (as in MySQL, an event's fate is decided when it starts): the row must
//! not show it running for good, which the agent's running gauges and the
//! `PfsWaitStuck` alert would read as a stuck event. One test function:
//! `init` is once per process.

use pfs_client::{LazyStageClass, LazyStatementClass, LazyWaitClass, Operation};
use pfs_shm_layout::Segment;
use pfs_shm_layout::kinds::EventKind;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static QUERY: LazyStatementClass = LazyStatementClass::new("statement/midway/query");
static STAGE: LazyStageClass = LazyStageClass::new("stage/midway/working");
static LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/midway/lock");

/// The segment, mapped writable (to change the consumers, as
/// `pfs-agent setup consumers` does).
fn segment() -> Segment {
    let path = pfs_client::segment_path().unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    Segment::open(f, true).unwrap()
}

/// This thread's current row of `kind`: its event id and whether it ended.
fn current(seg: &Segment, kind: EventKind) -> (u64, bool) {
    let s = snapshot(seg, &ReadOptions::default()).unwrap();
    let t = &s.threads[0];
    let e = t.current(kind).expect("a current row");
    (e.event_id, e.end_event_id.is_some())
}

#[test]
fn events_started_in_the_current_row_end_there_after_the_consumer_goes_off() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("midway").shm_dir(dir.path())).unwrap();
    let seg = segment();
    let consumers = "events_%_current";
    let set = |on: bool| pfs_shm_layout::setup::set_consumers(&seg, consumers, on);

    let statement = QUERY.start();
    STAGE.enter();
    let wait = LOCK.get().start(Operation::Lock, 1);
    let (_, stmt_id) = statement.id();
    let (wait_id, ended) = current(&seg, EventKind::Wait);
    assert!(!ended, "the wait runs");
    assert_eq!(set(false), 3, "the three current consumers");
    drop(wait);
    assert_eq!(
        current(&seg, EventKind::Wait),
        (wait_id, true),
        "the wait ended in its row"
    );
    let (stage_id, ended) = current(&seg, EventKind::Stage);
    assert!(!ended, "the stage still runs");
    drop(statement); // ends the stage too
    assert_eq!(current(&seg, EventKind::Stage), (stage_id, true));
    assert_eq!(current(&seg, EventKind::Statement), (stmt_id, true));

    // Started while off: not written, the rows keep the ended events.
    let later = QUERY.start();
    let wait = LOCK.get().start(Operation::Lock, 2);
    drop(wait);
    drop(later);
    assert_eq!(current(&seg, EventKind::Wait), (wait_id, true));
    assert_eq!(current(&seg, EventKind::Statement), (stmt_id, true));

    // On again: written as before.
    set(true);
    let wait = LOCK.get().start(Operation::Lock, 3);
    let (id, ended) = current(&seg, EventKind::Wait);
    assert!(id > wait_id && !ended);
    drop(wait);
    assert_eq!(current(&seg, EventKind::Wait), (id, true));
}
