//! A statement that never ends on its thread (a C caller whose end came
//! from another thread, an unpinned goroutine, a forgotten guard) while an
//! outer one ends first must not make the thread's bookkeeping grow: each
//! such round kept the inner statement's text aside forever, so memory
//! and the cost of every later statement grew without bound. Counted by
//! a global allocator that tracks live bytes. One test function: `init`
//! is once per process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use pfs_client::LazyStatementClass;

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards every call to `System` unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

static OUTER: LazyStatementClass = LazyStatementClass::new("statement/app/outer");
static INNER: LazyStatementClass = LazyStatementClass::new("statement/app/inner");

#[test]
fn statements_left_open_keep_the_thread_bounded() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("bounded").shm_dir(dir.path())).unwrap();
    let round = || {
        let mut outer = OUTER.start();
        outer.set_text("SELECT outer");
        let mut inner = INNER.start();
        inner.set_text("SELECT inner");
        drop(outer); // ends first
        std::mem::forget(inner); // never ends on this thread
    };
    for _ in 0..100 {
        round();
    }
    let before = LIVE.load(Relaxed);
    for _ in 0..10_000 {
        round();
    }
    let grown = LIVE.load(Relaxed) - before;
    assert!(
        grown < 16 * 1024,
        "10 000 rounds grew the heap by {grown} bytes"
    );
}
