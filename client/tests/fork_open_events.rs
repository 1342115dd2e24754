//! Events open at a `fork` and ended in the child (a wait, a statement
//! whose text the child sets, a memory block the child frees) do not
//! reach the parent's segment: the child's view of the segment becomes a
//! private copy at the fork, so whatever the child's copies of the guards
//! write lands nowhere the parent or an agent reads.

use pfs_client::{LazyMemoryClass, LazyStatementClass, LazyWaitClass, Operation};
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static W: LazyWaitClass = LazyWaitClass::new("wait/io/file/forkopen/f");
static S: LazyStatementClass = LazyStatementClass::new("statement/forkopen/req");
static MEM: LazyMemoryClass = LazyMemoryClass::new("memory/forkopen/buf");

#[test]
fn events_open_at_a_fork_and_ended_in_the_child_stay_out_of_the_parents_segment() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("forkopen").shm_dir(dir.path())).unwrap();
    let block = MEM.alloc(100);
    let mut stmt = S.start();
    stmt.set_text("PARENT TEXT");
    let wait = W.get().start(Operation::Write, 1);
    // SAFETY: `fork` has no memory-safety precondition. The child runs on
    // the forking thread alone, ends what it inherited and exits without
    // running anything that could wait for another thread's lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop(wait);
        let mut stmt = stmt;
        stmt.set_text("WRITTEN BY CHILD");
        stmt.add_errors(7);
        drop(stmt);
        block.free();
        // SAFETY: `_exit` ends the process at once; nothing is shared.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: `pid` is this process's child; `status` is a valid pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );

    let path = pfs_client::segment_path().unwrap();
    let read = || {
        let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
        snapshot(&seg, &ReadOptions::default()).unwrap()
    };
    let s = read();
    let index = |name: &str| s.classes.iter().find(|c| c.name == name).map(|c| c.index);
    let count = |s: &pfs_shm_layout::reader::SegmentSnapshot, c: Option<u32>| -> u64 {
        s.threads[0]
            .rows
            .iter()
            .filter(|(i, _)| Some(*i) == c)
            .map(|(_, r)| r.count)
            .sum()
    };
    assert_eq!(count(&s, index(W.name())), 0, "the child's end of the wait");
    assert_eq!(
        count(&s, index(S.name())),
        0,
        "the child's end of the statement"
    );
    let cur = s.threads[0]
        .statements_current
        .as_ref()
        .expect("the parent's statement is running");
    assert_eq!(cur.text, "PARENT TEXT");
    assert_eq!(cur.figures.errors, 0);
    let m = s.threads[0]
        .memory
        .iter()
        .find(|(c, _)| Some(*c) == index(MEM.name()))
        .map(|(_, r)| r.count_free);
    assert_eq!(m, Some(0), "the child's free");

    // The parent's own ends are counted once.
    drop(wait);
    drop(stmt);
    block.free();
    let s = read();
    assert_eq!(count(&s, index(W.name())), 1);
    assert_eq!(count(&s, index(S.name())), 1);
}
