//! Statements of one thread that nest: the outer one keeps its own
//! `SQL_TEXT` (set before, or while, the inner one runs) though the inner
//! one took the thread's `events_statements_current` row; and statements
//! ended out of order (the outer first) do not leave later statements
//! nested in one that ended, and each keeps its own text; a statement
//! that starts ends the open stage (as in MySQL), so the waits it records
//! nest in it, not in its parent's stage. One test function: `init` is
//! once per process.

use pfs_client::{LazyStageClass, LazyStatementClass, LazyWaitClass, Operation};
use pfs_shm_layout::Segment;
use pfs_shm_layout::kinds::EventKind;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, StatementEvent, snapshot};

static OUTER: LazyStatementClass = LazyStatementClass::new("statement/nest/outer");
static INNER: LazyStatementClass = LazyStatementClass::new("statement/nest/inner");
static LATER: LazyStatementClass = LazyStatementClass::new("statement/nest/later");
static STAGE: LazyStageClass = LazyStageClass::new("stage/nest/working");
static LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/nest/lock");

fn read() -> SegmentSnapshot {
    let path = pfs_client::segment_path().unwrap();
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

fn by_id(h: &[StatementEvent], id: u64) -> &StatementEvent {
    h.iter()
        .find(|s| s.ev.event_id == id)
        .unwrap_or_else(|| panic!("no statement {id} in {h:?}"))
}

#[test]
fn nested_statements_keep_their_texts_and_their_nesting() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("nest").shm_dir(dir.path())).unwrap();

    // Text set before the inner statement, and one changed while it runs.
    let mut outer = OUTER.start();
    outer.set_text("CALL outer()");
    let mut inner = INNER.start();
    inner.set_text("SELECT inner");
    let (_, outer_id) = outer.id();
    let (_, inner_id) = inner.id();
    drop(inner);
    drop(outer);
    let mut second = OUTER.start();
    let mut inner = INNER.start();
    inner.set_text("SELECT 2");
    second.set_text("CALL second()"); // while the inner one runs
    drop(inner);
    let (_, second_id) = second.id();
    drop(second);

    let s = read();
    let h = &s.threads[0].statements_history;
    assert_eq!(by_id(h, outer_id).text, "CALL outer()");
    assert_eq!(by_id(h, inner_id).text, "SELECT inner");
    assert_eq!(by_id(h, inner_id).ev.nesting_event_id, Some(outer_id));
    assert_eq!(by_id(h, second_id).text, "CALL second()");
    let current = s.threads[0].statements_current.as_ref().unwrap();
    assert_eq!(
        (current.ev.event_id, current.text.as_str()),
        (second_id, "CALL second()"),
        "the last statement to end, with its own text"
    );

    // Out of order: the outer one ends first.
    let outer = OUTER.start();
    let inner = INNER.start();
    let (_, inner_id) = inner.id();
    let (_, outer_id) = outer.id();
    outer.end();
    inner.end();
    let later: Vec<u64> = (0..3).map(|_| LATER.start().id().1).collect();
    let s = read();
    let h = &s.threads[0].statements_history;
    assert_eq!(by_id(h, inner_id).ev.nesting_event_id, Some(outer_id));
    for id in later {
        assert_eq!(
            by_id(h, id).ev.nesting_event_id,
            None,
            "a later top-level statement nests in nothing"
        );
    }

    // Out of order with texts: each ends with its own, the inner one's
    // also when set after the outer one ended.
    let mut outer = OUTER.start();
    outer.set_text("OOO outer");
    let mut inner = INNER.start();
    inner.set_text("OOO inner");
    let (_, outer_id) = outer.id();
    let (_, inner_id) = inner.id();
    drop(outer);
    let s = read();
    let h = &s.threads[0].statements_history;
    assert_eq!(by_id(h, outer_id).text, "OOO outer");
    inner.set_text("OOO inner, later");
    drop(inner);
    let s = read();
    let h = &s.threads[0].statements_history;
    assert_eq!(by_id(h, outer_id).text, "OOO outer");
    assert_eq!(by_id(h, inner_id).text, "OOO inner, later");

    // A stage of the outer statement, then a nested statement and a wait:
    // the stage ends as the inner statement starts, the wait nests in the
    // inner statement.
    let outer = OUTER.start();
    STAGE.enter();
    let inner = INNER.start();
    let wait = LOCK.get().start(Operation::Lock, 1);
    let wait_id = wait_event_id();
    drop(wait);
    let (_, outer_id) = outer.id();
    let (_, inner_id) = inner.id();
    drop(inner);
    drop(outer);
    let s = read();
    let t = &s.threads[0];
    let w = t
        .waits_history
        .iter()
        .find(|e| e.event_id == wait_id)
        .unwrap_or_else(|| panic!("no wait {wait_id} in {:?}", t.waits_history));
    assert_eq!(
        (w.nesting_event_id, w.nesting_event_type),
        (Some(inner_id), Some(EventKind::Statement)),
        "the wait nests in the statement running it"
    );
    let stage = t
        .stages_history
        .iter()
        .rfind(|e| e.nesting_event_id == Some(outer_id))
        .expect("the outer statement's stage");
    assert!(
        stage.end_event_id.is_some_and(|end| end <= inner_id),
        "the stage ends as the inner statement starts: {stage:?}"
    );
    assert_eq!(
        by_id(&t.statements_history, inner_id).ev.nesting_event_id,
        Some(outer_id)
    );
}

/// The `EVENT_ID` of the wait this thread is in: the last event id
/// issued, read from its `events_waits_current` row.
fn wait_event_id() -> u64 {
    read().threads[0]
        .waits_current
        .as_ref()
        .expect("a wait in progress")
        .event_id
}
