//! A process forked (without `exec`) from an instrumented one records
//! nothing: a segment has one writer per thread record and one process
//! behind its lock, and a forked child holds copies of its parent's
//! mappings and of the forking thread's context. The child's events, its
//! memory accounting and its exit (the context's destructor, which folds a
//! thread's record at thread exit) must not reach the parent's segment, and
//! `init` in the child says why.

use pfs_client::{LazyMemoryClass, LazyWaitClass, Operation};
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

static W: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/fork/m");
static MEM: LazyMemoryClass = LazyMemoryClass::new("memory/fork/buf");

/// Exit code of a child whose `init` did not refuse as expected.
const BAD_INIT: i32 = 3;

#[test]
fn a_forked_child_never_writes_into_its_parents_segment() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("forker").shm_dir(dir.path())).unwrap();
    for i in 0..10 {
        drop(W.get().start(Operation::Lock, i));
    }
    let kept = MEM.alloc(100); // the parent's: counted once
    // SAFETY: `fork` has no memory-safety precondition. The child runs on
    // the forking thread alone and calls only code whose locks `fork`
    // handlers reset (the allocator's) or that the client's fork handler
    // keeps it from reaching (the client's own), then exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let init = pfs_client::init_with(pfs_client::Config::new("child").shm_dir(dir.path()));
        let said = init.err().map(|e| e.to_string()).unwrap_or_default();
        if !said.contains("forked from one that initialised pfs-client") {
            eprintln!("init in the child: {said:?}");
            std::process::exit(BAD_INIT);
        }
        for i in 0..5_000 {
            drop(W.get().start(Operation::Lock, i));
        }
        drop(MEM.alloc(4096));
        std::mem::forget(MEM.alloc(512));
        // `exit` runs this thread's thread-local destructors: the
        // context's owner, which folds a record at thread exit.
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: `pid` is this process's child; `status` is a valid pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed (status {status}; {BAD_INIT}: its init did not refuse)"
    );
    for i in 0..100 {
        drop(W.get().start(Operation::Lock, i));
    }

    let path = pfs_client::segment_path().unwrap();
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let class = |name: &str| {
        s.classes
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.index)
            .unwrap_or_else(|| panic!("{name} registered"))
    };
    let (w, m) = (class(W.name()), class(MEM.name()));
    assert_eq!(s.threads.len(), 1, "one live thread, the parent's");
    let count: u64 = s.threads[0]
        .rows
        .iter()
        .filter(|(c, _)| *c == w)
        .map(|(_, r)| r.count)
        .sum();
    assert_eq!(count, 110, "the parent's waits only");
    assert_eq!(s.threads_exited, 0, "the child's exit folded nothing");
    let mem: Vec<_> = s.threads[0]
        .memory
        .iter()
        .filter(|(c, _)| *c == m)
        .collect();
    assert_eq!(mem.len(), 1);
    assert_eq!(
        (mem[0].1.count_alloc, mem[0].1.bytes_alloc),
        (1, 100),
        "the parent's allocation only"
    );
    let events = &s.threads[0].waits_history;
    assert!(
        events.iter().all(|e| e.event_id <= 110 + 2),
        "no event id from the child: {events:?}"
    );
    drop(kept);
}
