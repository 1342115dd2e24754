//! How a statement ends when its future does not complete, on a real
//! multi-threaded tokio runtime, read back from the real segment:
//!
//! * dropped inside a task by `select!` or a timeout: completed, unless the
//!   dropped future is `Cancellable` (then cancelled, not an error);
//! * a `Cancellable` future that completes: completed;
//! * ended by a panic's unwinding (a task's statement, a thread's): one
//!   error, not cancelled; unless errors were added already.
//!
//! One test function: `init` is once per process.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::read;
use pfs_client::LazyStatementClass;
use pfs_client::task::TaskExt;
use pfs_shm_layout::reader::{StatementEvent, Summary};

static PLAIN: LazyStatementClass = LazyStatementClass::new("statement/test/plain_dropped");
static GUARDED: LazyStatementClass = LazyStatementClass::new("statement/test/cancellable_dropped");
static TIMED_OUT: LazyStatementClass = LazyStatementClass::new("statement/test/timed_out");
static FINISHED: LazyStatementClass = LazyStatementClass::new("statement/test/cancellable_done");
static PANICKED: LazyStatementClass = LazyStatementClass::new("statement/test/task_panicked");
static PANICKED_ERR: LazyStatementClass =
    LazyStatementClass::new("statement/test/task_panicked_with_errors");
static THREAD_PANICKED: LazyStatementClass =
    LazyStatementClass::new("statement/test/thread_panicked");

const N: u64 = 5;

/// Holds a statement of `class` until dropped: never completes.
async fn stuck(class: &'static LazyStatementClass) {
    let _stmt = class.start_task();
    std::future::pending::<()>().await;
}

#[test]
fn statements_dropped_early_are_cancelled_only_when_cancellable_and_panics_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("cancel-test")
            .shm_dir(dir.path())
            .consumer("events_statements_history_long", true),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let handler = async {
            for _ in 0..N {
                // The losing branch of a select!, dropped inside the task.
                tokio::select! {
                    _ = stuck(&PLAIN) => unreachable!(),
                    _ = tokio::task::yield_now() => {}
                }
                tokio::select! {
                    _ = stuck(&GUARDED).pfs_cancellable() => unreachable!(),
                    _ = tokio::task::yield_now() => {}
                }
                // A timeout that expires.
                let r = tokio::time::timeout(
                    Duration::from_millis(1),
                    stuck(&TIMED_OUT).pfs_cancellable(),
                )
                .await;
                assert!(r.is_err());
                // A cancellable future that completes.
                async {
                    let _stmt = FINISHED.start_task();
                    tokio::task::yield_now().await;
                }
                .pfs_cancellable()
                .await;
            }
        };
        tokio::spawn(handler.pfs_task()).await.unwrap();

        // Panics in tasks: the statement is dropped by the unwinding.
        for i in 0..N {
            let r = tokio::spawn(
                async move {
                    let mut stmt = if i % 2 == 0 {
                        PANICKED.start_task()
                    } else {
                        PANICKED_ERR.start_task()
                    };
                    if i % 2 == 1 {
                        stmt.add_errors(3);
                    }
                    tokio::task::yield_now().await;
                    panic!("handler failed");
                }
                .pfs_task(),
            )
            .await;
            assert!(r.unwrap_err().is_panic());
        }
    });
    // A thread's statement dropped by a panic.
    for _ in 0..N {
        let r = std::thread::spawn(|| {
            let _stmt = THREAD_PANICKED.start();
            panic!("worker failed");
        })
        .join();
        assert!(r.is_err());
    }
    let s = read(&path);
    drop(rt);

    let mut sums: HashMap<&str, Summary> = HashMap::new();
    let name_of: HashMap<u32, &str> = s
        .classes
        .iter()
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    for (class, row) in s
        .exited
        .iter()
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
    {
        sums.entry(name_of[class]).or_default().merge(row);
    }
    let figures = |class: &LazyStatementClass| {
        let sum = &sums[class.name()];
        (sum.count, sum.statement.cancelled, sum.statement.errors)
    };
    // (COUNT_STAR, COUNT_CANCELLED, SUM_ERRORS)
    assert_eq!(
        figures(&PLAIN),
        (N, 0, 0),
        "a plain future dropped by select!"
    );
    assert_eq!(
        figures(&GUARDED),
        (N, N, 0),
        "a Cancellable dropped by select!"
    );
    assert_eq!(figures(&TIMED_OUT), (N, N, 0), "a Cancellable timed out");
    assert_eq!(
        figures(&FINISHED),
        (N, 0, 0),
        "a Cancellable that completed"
    );
    let half = N.div_ceil(2);
    assert_eq!(figures(&PANICKED), (half, 0, half), "a task's panic");
    assert_eq!(
        figures(&PANICKED_ERR),
        (N - half, 0, 3 * (N - half)),
        "a panic after errors were added: no more"
    );
    assert_eq!(figures(&THREAD_PANICKED), (N, 0, N), "a thread's panic");

    // The events carry the same: the CANCELLED flag on the cancelled ones.
    let events = |class: &LazyStatementClass| -> Vec<&StatementEvent> {
        let idx = s
            .classes
            .iter()
            .find(|c| c.name == class.name())
            .unwrap()
            .index;
        s.long_statements
            .iter()
            .filter(|e| e.ev.class == idx)
            .collect()
    };
    assert!(events(&GUARDED).iter().all(|e| e.figures.cancelled == 1));
    assert!(events(&PLAIN).iter().all(|e| e.figures.cancelled == 0));
    assert!(
        events(&THREAD_PANICKED)
            .iter()
            .all(|e| e.figures.errors == 1 && e.figures.cancelled == 0)
    );
    assert_eq!(events(&GUARDED).len() as u64, N);
}
