//! The library's own `pfs-maintenance` thread stays out of the
//! application's way: it takes no thread record (with `PfsAllocator`
//! installed its allocations would otherwise register it, counting it in
//! `pfs_threads` and against `max_threads`), and it blocks every
//! asynchronous signal (so a process-directed `SIGTERM` is never delivered
//! to it, where its default action would kill a service that waits for it
//! with `sigwait`). Its own process, with the wrapper as the global
//! allocator.

use std::time::Duration;

use pfs_client::alloc::PfsAllocator;
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, snapshot};

#[global_allocator]
static A: PfsAllocator = PfsAllocator::new();

static WORK: pfs_client::LazyWaitClass =
    pfs_client::LazyWaitClass::new("wait/synch/mutex/app/work");

/// The `SigBlk` mask of this process's thread named `name`.
fn blocked_signals(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            let hex = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
            return u64::from_str_radix(hex.trim(), 16).ok();
        }
    }
    None
}

#[test]
fn the_maintenance_thread_takes_no_record_and_no_signal() {
    let dir = tempfile::tempdir().unwrap();
    // A quiet time of 40 ms: the thread runs every 10 ms.
    let mut cfg = pfs_client::Config::new("maintenance").shm_dir(dir.path());
    cfg.reclaim_after = Some(Duration::from_millis(40));
    pfs_client::init_with(cfg).unwrap();
    // Threads that come and go give it pages to reclaim.
    for _ in 0..40 {
        std::thread::spawn(|| drop(WORK.get().start(pfs_client::Operation::Lock, 0)))
            .join()
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let seg = Segment::open(
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap(),
        false,
    )
    .unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let names: Vec<&str> = s.threads.iter().map(|t| &*t.name).collect();
    assert!(
        !names.contains(&"pfs-maintenance"),
        "the library's thread has a record: {names:?}"
    );
    let mask = blocked_signals("pfs-maintenance").expect("the pfs-maintenance thread runs");
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
        assert!(
            mask & (1 << (sig - 1)) != 0,
            "signal {sig} not blocked: {mask:#x}"
        );
    }
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        assert!(
            mask & (1 << (sig - 1)) == 0,
            "fault signal {sig} blocked: {mask:#x}"
        );
    }
}
