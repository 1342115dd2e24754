//! An instrument whose name is not a PFS name of its family (a typo, a
//! wait named like a statement) is disabled and counted in
//! `pfs_lost_total{kind="instrument_classes"}`, where an operator looks,
//! not only logged. One test function: `init` is once per process.

use pfs_client::{LazyStageClass, LazyWaitClass, Operation, WaitClass};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static WRONG_FAMILY: LazyWaitClass = LazyWaitClass::new("statement/app/query");
static NO_PREFIX: LazyWaitClass = LazyWaitClass::new("mutex/app/lock");
static NO_NAME: LazyStageClass = LazyStageClass::new("stage/");
static GOOD: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/lock");

#[test]
fn misnamed_instruments_are_counted_as_lost_classes() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("names").shm_dir(dir.path())).unwrap();
    for _ in 0..3 {
        drop(WRONG_FAMILY.get().start(Operation::Lock, 0));
        drop(NO_PREFIX.get().start(Operation::Lock, 0));
        NO_NAME.enter();
        drop(GOOD.get().start(Operation::Lock, 0));
    }
    // Registered again and again (a C program's loop): counted once.
    for _ in 0..3 {
        assert!(!WaitClass::register("wait/synch/mutex/").is_enabled());
    }
    let seg = Segment::open(
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap(),
        false,
    )
    .unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    assert_eq!(
        s.lost[LostKind::Classes as usize],
        4,
        "each misnamed instrument once (a lazy one registers once; a name registered again is counted once)"
    );
    let good = s
        .classes
        .iter()
        .find(|c| c.name == "wait/synch/mutex/app/lock")
        .unwrap();
    let count: u64 = s.threads[0]
        .rows
        .iter()
        .filter(|(c, _)| *c == good.index)
        .map(|(_, r)| r.count)
        .sum();
    assert_eq!(count, 3);
}
