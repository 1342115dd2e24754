//! A segment file truncated under the running application (by a stray
//! `: > file`, a clean-up script, or a sidecar with write access) must not
//! kill it: the client's `SIGBUS` handler turns the mapping into private
//! zeros, the application's threads, old and new, run on recording
//! nothing, the file is not grown again, and the log says why, once.
//! With `PFS_SIGBUS_HANDLER=no` (`Config::sigbus_handler(false)`) the
//! process dies of `SIGBUS`, as any process touching a truncated shared
//! mapping does: what the handler prevents.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::Warnings;
use pfs_client::{LazyWaitClass, sync::Mutex};

static M: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/trunc/m");

/// `threads` threads that each lock an instrumented mutex `n` times.
fn work(threads: usize, n: usize) {
    let m = Arc::new(Mutex::new(&M, 0u64));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for _ in 0..n {
                    *m.lock().unwrap() += 1;
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(*m.lock().unwrap(), (threads * n) as u64);
}

/// Truncates the segment file this process writes.
fn truncate_own_segment() -> std::path::PathBuf {
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    path
}

#[test]
fn a_truncated_segment_leaves_the_application_running_and_says_why() {
    if std::env::var_os("PFS_TRUNC_CHILD").is_some() {
        return;
    }
    let warnings = Arc::new(StdMutex::new(Vec::new()));
    {
        use tracing_subscriber::layer::SubscriberExt;
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(Warnings(Arc::clone(&warnings))),
        )
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("trunc")
            .shm_dir(dir.path())
            .reclaim_after(Some(Duration::from_millis(40))),
    )
    .unwrap();
    // Threads with records, and the main thread's, before.
    work(4, 10_000);
    let path = truncate_own_segment();
    // The same threads' events, and more threads than a page of records
    // holds (the zeroed container reads as having no page: a new one is
    // needed, and not reserved in the truncated file).
    work(4, 10_000);
    work(40, 1_000);
    assert!(
        pfs_shm_layout::sigbus::recovered_faults() >= 1,
        "the truncation was met and recovered"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "the client grows the truncated file no more"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = warnings.lock().unwrap().clone();
        let said: Vec<_> = seen.iter().filter(|m| m.contains("SIGBUS")).collect();
        if let [one] = said[..] {
            assert!(
                one.contains(&path.display().to_string()) && one.contains("restart"),
                "names the file and what to do: {one}"
            );
            break;
        }
        assert!(said.len() < 2, "said once: {said:?}");
        assert!(Instant::now() < deadline, "no warning: {seen:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Later work is still fine, and says nothing more.
    work(2, 1_000);
    std::thread::sleep(Duration::from_millis(100));
    let n = (warnings.lock().unwrap().iter())
        .filter(|m| m.contains("SIGBUS"))
        .count();
    assert_eq!(n, 1);
}

/// Run as a child of the test below: without the handler, the same
/// truncation kills the process.
#[test]
fn child_without_handler() {
    if std::env::var_os("PFS_TRUNC_CHILD").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // (`PFS_SIGBUS_HANDLER=no` from the parent: the variable is read.)
    let cfg = pfs_client::Config::from_env().unwrap().shm_dir(dir.path());
    assert!(!cfg.sigbus_handler);
    pfs_client::init_with(cfg).unwrap();
    work(2, 1_000);
    truncate_own_segment();
    work(2, 1_000);
    std::process::exit(0);
}

#[test]
fn without_the_handler_a_truncation_kills_as_before() {
    if std::env::var_os("PFS_TRUNC_CHILD").is_some() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_without_handler", "--nocapture"])
        .env("PFS_TRUNC_CHILD", "1")
        .env("PFS_SIGBUS_HANDLER", "no")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
