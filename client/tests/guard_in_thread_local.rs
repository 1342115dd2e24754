//! A guard kept in a `thread_local!` outlives the thread's context: the
//! registry frees the context in its own thread-local destructor at thread
//! exit, and a destructor registered earlier runs after it (they run in
//! reverse order of registration). Such a guard must end nothing through
//! the freed context: its event is counted as lost, the thread's folded
//! totals stay what they were, and nothing crashes. One test function:
//! `init` is once per process.

use std::cell::RefCell;

use pfs_client::{
    LazyStageClass, LazyStatementClass, LazyWaitClass, Operation, StatementGuard, WaitGuard,
};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};

static LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/kept");
static QUERY: LazyStatementClass = LazyStatementClass::new("statement/app/kept");
static STEP: LazyStageClass = LazyStageClass::new("stage/app/kept");

thread_local! {
    // Touched before the thread's first event, so each destructor is
    // registered before the registry's and runs after it.
    static KEPT_WAIT: RefCell<Option<WaitGuard>> = const { RefCell::new(None) };
    static KEPT_STATEMENT: RefCell<Option<StatementGuard>> = const { RefCell::new(None) };
}

fn read() -> SegmentSnapshot {
    let seg = Segment::open(
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap(),
        false,
    )
    .unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

fn count(s: &SegmentSnapshot, name: &str) -> u64 {
    let Some(class) = s.classes.iter().find(|c| c.name == name) else {
        return 0;
    };
    s.summary_rows()
        .filter(|(c, _)| *c == class.index)
        .map(|(_, r)| r.count)
        .sum()
}

#[test]
fn guards_dropped_after_the_thread_record_count_as_lost() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("kept").shm_dir(dir.path())).unwrap();
    let lost_before = read().lost[LostKind::Events as usize];

    std::thread::spawn(|| {
        KEPT_STATEMENT.with(|kept| {
            KEPT_WAIT.with(|kept_wait| {
                let mut stmt = QUERY.start();
                stmt.set_text("SELECT kept");
                STEP.enter();
                drop(LOCK.get().start(Operation::Lock, 0)); // recorded
                *kept_wait.borrow_mut() = Some(LOCK.get().start(Operation::Lock, 1));
                *kept.borrow_mut() = Some(stmt);
            })
        });
        // The thread exits with both guards open.
    })
    .join()
    .expect("the thread exits without crashing");

    let s = read();
    assert_eq!(s.threads_exited, 1, "the thread's record was folded");
    assert_eq!(
        s.lost[LostKind::Events as usize] - lost_before,
        2,
        "the kept wait and the kept statement, ended after the record was folded, are lost"
    );
    assert_eq!(
        count(&s, "wait/synch/mutex/app/kept"),
        1,
        "the wait that ended in time"
    );
    assert_eq!(
        count(&s, "statement/app/kept"),
        0,
        "the kept statement never ended"
    );
    assert_eq!(
        count(&s, "stage/app/kept"),
        1,
        "the open stage ended at thread exit"
    );

    // The process goes on recording on other threads.
    std::thread::spawn(|| drop(LOCK.get().start(Operation::Lock, 2)))
        .join()
        .unwrap();
    assert_eq!(count(&read(), "wait/synch/mutex/app/kept"), 2);
}
