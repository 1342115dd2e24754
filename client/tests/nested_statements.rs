//! Statements of one thread that nest: the outer one keeps its own
//! `SQL_TEXT` (set before, or while, the inner one runs) though the inner
//! one took the thread's `events_statements_current` row; and statements
//! ended out of order (the outer first) do not leave later statements
//! nested in one that ended. One test function: `init` is once per
//! process.

use pfs_client::LazyStatementClass;
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, StatementEvent, snapshot};

static OUTER: LazyStatementClass = LazyStatementClass::new("statement/nest/outer");
static INNER: LazyStatementClass = LazyStatementClass::new("statement/nest/inner");
static LATER: LazyStatementClass = LazyStatementClass::new("statement/nest/later");

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
}
