//! `events_statements_cpu` (MySQL 8.0.28's consumer) decides whether a
//! task statement's polls are timed: off, its `CPU_TIME` is 0 and its
//! `TIMER_WAIT` still wall time; turned on live (as the agent does, by
//! the segment's setup word), the next statements have it again, never
//! above `TIMER_WAIT`. One test function: `init` is once per process.

use std::time::{Duration, Instant};

use pfs_client::LazyStatementClass;
use pfs_client::task::TaskExt;
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, StatementEvent, snapshot};

static OFF: LazyStatementClass = LazyStatementClass::new("statement/test/cpu_off");
static ON: LazyStatementClass = LazyStatementClass::new("statement/test/cpu_on");

/// A statement whose task is busy (polled) for `busy`, then idle (not
/// polled) as long.
async fn busy_statement(class: &'static LazyStatementClass, busy: Duration) {
    let stmt = class.start_task();
    let t = Instant::now();
    while t.elapsed() < busy {
        std::hint::spin_loop();
    }
    tokio::time::sleep(busy).await;
    drop(stmt);
}

fn statements(path: &std::path::Path, class: &str) -> Vec<StatementEvent> {
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    let s = snapshot(&seg, &ReadOptions::default()).unwrap();
    let index = s.classes.iter().find(|c| c.name == class).unwrap().index;
    s.long_statements
        .into_iter()
        .filter(|e| e.ev.class == index)
        .collect()
}

#[test]
fn the_cpu_consumer_decides_whether_polls_are_timed() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("cpu-consumer-test")
            .shm_dir(dir.path())
            .consumer("events_statements_history_long", true)
            .consumer("events_statements_cpu", false),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let busy = Duration::from_millis(20);
    let run = |class: &'static LazyStatementClass| {
        rt.block_on(async {
            let tasks: Vec<_> = (0..4)
                .map(|_| tokio::spawn(busy_statement(class, busy).pfs_task()))
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        })
    };
    run(&OFF);
    let off = statements(&path, OFF.name());
    assert_eq!(off.len(), 4);
    for s in &off {
        assert_eq!(s.figures.cpu_time_ps, 0, "consumer off: no CPU_TIME");
        assert!(s.ev.timer_wait.unwrap() >= 2 * busy.as_nanos() as u64 * 1000);
    }

    // On, live: as `pfs-agent setup consumers events_statements_cpu`.
    let seg = Segment::open(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap(),
        true,
    )
    .unwrap();
    assert_eq!(
        pfs_shm_layout::setup::set_consumers(&seg, "events_statements_cpu", true),
        1
    );
    run(&ON);
    let on = statements(&path, ON.name());
    assert_eq!(on.len(), 4);
    for s in &on {
        let (cpu, wait) = (s.figures.cpu_time_ps, s.ev.timer_wait.unwrap());
        assert!(
            cpu >= busy.as_nanos() as u64 * 1000,
            "consumer on: CPU_TIME {cpu} covers the busy poll"
        );
        assert!(cpu <= wait, "CPU_TIME {cpu} <= TIMER_WAIT {wait}");
        assert!(
            wait >= cpu + busy.as_nanos() as u64 * 1000 / 2,
            "the idle time is not poll time: CPU_TIME {cpu}, TIMER_WAIT {wait}"
        );
    }
}
