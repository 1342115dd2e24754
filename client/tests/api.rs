//! The client API against a real segment, read back with the protocol
//! reader. One test function: `init` is once per process.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;

use common::read;
use pfs_client::{
    LazyWaitClass, Operation,
    fs::File,
    sync::{Condvar, Mutex, RwLock},
};
use pfs_shm_layout::reader::{SegmentSnapshot, Summary};

static M: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/api/m");
static RW: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/api/rw");
static CV: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/api/cv");
static F: LazyWaitClass = LazyWaitClass::new("wait/io/file/api/f");
static CUSTOM: LazyWaitClass = LazyWaitClass::new("wait/io/socket/api/send");
static NOT_A_WAIT: LazyWaitClass = LazyWaitClass::new("stage/api/not_a_wait");
static Q: pfs_client::LazyStatementClass = pfs_client::LazyStatementClass::new("statement/api/q");

fn global(s: &SegmentSnapshot, name: &str) -> Summary {
    let class = s
        .classes
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{name} registered"));
    let mut sum = Summary::default();
    for (c, r) in s
        .exited
        .iter()
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
    {
        if *c == class.index {
            sum.merge(r);
        }
    }
    sum
}

#[test]
fn waits_are_recorded_with_their_details() {
    // Before init every instrument is a no-op.
    assert!(!M.get().is_enabled());
    assert!(!M.get().start(Operation::Lock, 0).is_recording());

    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("api-test").shm_dir(dir.path())).unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        format!("api-test.{}.pfs", std::process::id())
    );
    assert!(pfs_client::init_with(pfs_client::Config::new("again").shm_dir(dir.path())).is_err());

    // A custom wait: SOURCE is this file and line, bytes are kept.
    let line = line!() + 1;
    let mut w = CUSTOM.get().start(Operation::Send, 0xABC);
    w.set_bytes(512);
    let ps = w.end().expect("timed");
    let s = read(&path);
    let me = s
        .threads
        .iter()
        .find(|t| t.waits_current.is_some_and(|e| e.object_instance == 0xABC))
        .unwrap();
    let ev = me.waits_current.unwrap();
    assert_eq!(ev.timer_wait, Some(ps));
    assert_eq!(ev.bytes, Some(512));
    assert_eq!(ev.operation, Some(Operation::Send));
    assert_eq!(s.strings[&ev.source.unwrap()], format!("api.rs:{line}"));

    // Mutex: an uncontended lock has SPINS 0, a contended one SPINS 1.
    let m = Arc::new(Mutex::new(&M, 0u32));
    *m.lock().unwrap() += 1;
    let held = m.lock().unwrap();
    let m2 = m.clone();
    let t = std::thread::spawn(move || {
        *m2.lock().unwrap() += 1;
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(held);
    t.join().unwrap(); // thread exit folds its record
    let s = read(&path);
    let g = global(&s, "wait/synch/mutex/api/m");
    assert_eq!(g.count, 3);
    assert!(
        g.max_ps >= 40_000_000_000,
        "the contended wait lasted >= 40 ms: {}",
        g.max_ps
    );
    assert_eq!(s.threads_exited, 1);
    let spins: Vec<_> = s
        .threads
        .iter()
        .flat_map(|t| t.waits_history.iter())
        .filter(|e| e.operation == Some(Operation::Lock))
        .map(|e| e.spins)
        .collect();
    assert_eq!(
        spins,
        vec![Some(0), Some(0)],
        "this thread's two locks were uncontended"
    );

    // RwLock and Condvar.
    let rw = RwLock::new(&RW, 5);
    assert_eq!(*rw.read().unwrap(), 5);
    *rw.write().unwrap() = 6;
    let cv = Condvar::new(&CV);
    let g2 = m.lock().unwrap();
    let (_g2, timeout) = cv
        .wait_timeout(g2, std::time::Duration::from_millis(5))
        .unwrap();
    assert!(timeout.timed_out());
    let s = read(&path);
    assert_eq!(global(&s, "wait/synch/rwlock/api/rw").count, 2);
    let cvs = global(&s, "wait/synch/cond/api/cv");
    assert_eq!(cvs.count, 1);
    assert!(cvs.sum_ps >= 5_000_000_000, "timed_wait lasted >= 5 ms");

    // File I/O: byte counts and the object name.
    let fpath = dir.path().join("data.bin");
    let mut f = File::create(&F, &fpath).unwrap();
    f.write_all(&[7u8; 1000]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut f = File::open(&F, &fpath).unwrap();
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    drop(f);
    let s = read(&path);
    let fs = global(&s, "wait/io/file/api/f");
    assert_eq!(fs.count, 7, "create, write, sync, close, open, read, close");
    assert_eq!(fs.bytes, 2000);
    let me = s
        .threads
        .iter()
        .find(|t| t.waits_history.iter().any(|e| e.bytes == Some(1000)))
        .unwrap();
    let w = me
        .waits_history
        .iter()
        .find(|e| e.operation == Some(Operation::Write))
        .unwrap();
    assert!(s.strings[&w.object_name.unwrap()].ends_with("data.bin"));

    // `write!` and `read_to_string` are one wait each, with their bytes,
    // attributed to the caller (not to std's loops inside them).
    let mut f = File::create(&F, &fpath).unwrap();
    let (word, n) = ("ab", 12345);
    let write_line = line!() + 1;
    write!(f, "{word}-{n}").unwrap();
    drop(f);
    let mut f = File::open(&F, &fpath).unwrap();
    let mut text = String::new();
    let read_line = line!() + 1;
    f.read_to_string(&mut text).unwrap();
    drop(f);
    assert_eq!(text, "ab-12345");
    let s = read(&path);
    let fs = global(&s, "wait/io/file/api/f");
    assert_eq!(fs.count, 13, "and create, write, close, open, read, close");
    assert_eq!(fs.bytes, 2016);
    let mut sites: Vec<_> = s
        .threads
        .iter()
        .flat_map(|t| t.waits_history.iter())
        .filter(|e| e.bytes == Some(8))
        .map(|e| (e.operation, s.strings[&e.source.unwrap()].clone()))
        .collect();
    sites.sort_by_key(|(op, _)| *op != Some(Operation::Write));
    assert_eq!(
        sites,
        [
            (Some(Operation::Write), format!("api.rs:{write_line}")),
            (Some(Operation::Read), format!("api.rs:{read_line}")),
        ]
    );

    // A program knows its own ids: the thread's THREAD_ID (the key of
    // its `threads` row) and its open statement's EVENT_ID.
    let tid = pfs_client::thread_id().expect("registered");
    assert_eq!(pfs_client::statement_event_id(), None, "no statement open");
    let mut stmt = Q.start();
    stmt.set_text("SELECT 1");
    let (stmt_tid, stmt_id) = stmt.id();
    assert_eq!(stmt_tid, tid);
    assert_eq!(pfs_client::statement_event_id(), Some(stmt_id));
    let s = read(&path);
    let me = s.threads.iter().find(|t| t.thread_id == tid).unwrap();
    let cur = me.statements_current.as_ref().expect("statement open");
    assert_eq!((cur.ev.thread_id, cur.ev.event_id), (tid, stmt_id));
    assert_eq!(cur.text, "SELECT 1");
    // A nested statement takes the current row (with its own text); the
    // outer one, ended after it, never shows the inner's text.
    let mut inner = Q.start();
    inner.set_text("INNER");
    let (_, inner_id) = inner.id();
    drop(inner);
    drop(stmt);
    assert_eq!(pfs_client::statement_event_id(), None, "ended");
    let s = read(&path);
    let me = s.threads.iter().find(|t| t.thread_id == tid).unwrap();
    let text_of = |id: u64| {
        me.statements_history
            .iter()
            .find(|e| e.ev.event_id == id)
            .map(|e| e.text.clone())
            .unwrap()
    };
    assert_eq!(text_of(inner_id), "INNER");
    assert_ne!(text_of(stmt_id), "INNER", "the outer statement's text");
    let cur = me.statements_current.as_ref().unwrap();
    assert_eq!(cur.ev.event_id, stmt_id);
    assert_ne!(cur.text, "INNER");
    // Another thread has another id.
    let other = std::thread::spawn(pfs_client::thread_id).join().unwrap();
    assert!(other.is_some_and(|o| o != tid));

    // A name outside the wait taxonomy is refused, not registered.
    assert!(!NOT_A_WAIT.get().is_enabled());
    assert!(
        !read(&path)
            .classes
            .iter()
            .any(|c| c.name.starts_with("stage/"))
    );
}
