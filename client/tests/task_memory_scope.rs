//! A `memory_scope` held across `.await` inside a task belongs to the task:
//! what the task allocates in it is counted under the scope's class,
//! whichever worker polls it, and nothing that other tasks allocate on the
//! same workers meanwhile, nor after the scope ended, lands in it. Its own
//! process, with the wrapper as the global allocator.

use pfs_client::alloc::PfsAllocator;
use pfs_client::task::TaskExt;
use pfs_client::{LazyMemoryClass, LazyStatementClass, memory_scope};
use pfs_shm_layout::reader::{MemoryStats, ReadOptions, snapshot};

#[global_allocator]
static A: PfsAllocator = PfsAllocator::new();

static REQUEST: LazyStatementClass = LazyStatementClass::new("statement/test/request");
static TASKMEM: LazyMemoryClass = LazyMemoryClass::new("memory/test/taskmem");

/// Other tasks: each allocates and frees this many blocks of `OTHER_SIZE`.
const OTHERS: usize = 16;
const OTHER_BLOCKS: usize = 20;
const OTHER_SIZE: usize = 777;

fn totals(name: &str) -> MemoryStats {
    let seg = pfs_shm_layout::Segment::open(
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap(),
        false,
    )
    .unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let idx = s.classes.iter().find(|c| c.name == name).unwrap().index;
    s.memory_of(idx)
}

/// Tasks without a scope, allocating on the runtime's workers.
async fn others() {
    let mut hs = Vec::new();
    for _ in 0..OTHERS {
        hs.push(tokio::spawn(async {
            for _ in 0..OTHER_BLOCKS {
                let b = vec![5u8; OTHER_SIZE];
                std::hint::black_box(&b);
                tokio::task::yield_now().await;
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
}

#[test]
fn a_scope_held_across_await_is_the_tasks_alone() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("task-memory-scope").shm_dir(dir.path()))
        .unwrap();
    TASKMEM.get();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (parked_tx, parked_rx) = tokio::sync::oneshot::channel::<()>();
    let kept = rt.block_on(async move {
        let task = tokio::spawn(
            async move {
                let stmt = REQUEST.start_task();
                let scope = memory_scope(&TASKMEM);
                let first = vec![1u8; 1000];
                parked_tx.send(()).unwrap();
                // Parked, scope open, while the other tasks allocate on
                // both workers; resumed on either.
                go_rx.await.unwrap();
                let second = vec![2u8; 500];
                drop(scope);
                stmt.end();
                (first, second)
            }
            .pfs_task(),
        );
        parked_rx.await.unwrap();
        others().await;
        go_tx.send(()).unwrap();
        let kept = task.await.unwrap();
        // After the scope ended: still nothing of theirs in it.
        others().await;
        kept
    });
    let m = totals("memory/test/taskmem");
    assert_eq!(
        (m.count_alloc, m.bytes_alloc, m.count_free),
        (2, 1500, 0),
        "only the task's own two blocks: {m:?}"
    );
    drop(kept);
    let m = totals("memory/test/taskmem");
    assert_eq!((m.count_free, m.bytes_free), (2, 1500), "{m:?}");
    drop(rt);
}
