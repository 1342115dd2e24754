//! Statements owned by async tasks, on a real multi-threaded tokio
//! runtime: tasks forced to migrate between workers (yields,
//! `spawn_blocking`, channels between tasks), read back from the real
//! segment. Counts are exact and every event in `*_history_long` nests in
//! its own task's events, never in another's. One test function: `init` is
//! once per process.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::read;
use pfs_client::task::TaskExt;
use pfs_client::{LazyStageClass, LazyStatementClass, LazyWaitClass, Operation};
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{Event, SegmentSnapshot, StatementEvent};

static REQ: LazyStatementClass = LazyStatementClass::new("statement/test/request");
static CANCELLED: LazyStatementClass = LazyStatementClass::new("statement/test/cancelled");
static INNER: LazyStatementClass = LazyStatementClass::new("statement/test/inner");
static PARSE: LazyStageClass = LazyStageClass::new("stage/test/parse");
static EXECUTE: LazyStageClass = LazyStageClass::new("stage/test/execute");
static SPIN: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/spin");
static BLOCKING: LazyWaitClass = LazyWaitClass::new("wait/io/file/test/blocking");
static NOISE: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/test/noise");

const TASKS: u64 = 200;
/// Synchronous waits per task, in the PARSE stage.
const SPINS: u64 = 3;
/// The time each task spends in `spawn_blocking`, not being polled.
const BLOCKED: Duration = Duration::from_millis(2);

fn class_index(s: &SegmentSnapshot, name: &str) -> u32 {
    s.classes
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{name} registered"))
        .index
}

/// One task's work: a statement held across every kind of `.await`.
async fn request(i: u64, polled_on: Arc<Mutex<HashMap<u64, HashSet<std::thread::ThreadId>>>>) {
    let note = |polled_on: &Mutex<HashMap<u64, HashSet<std::thread::ThreadId>>>| {
        polled_on
            .lock()
            .unwrap()
            .entry(i)
            .or_default()
            .insert(std::thread::current().id());
    };
    let mut stmt = REQ.start_task();
    assert!(stmt.is_recording());
    // Inside the task, the ids a program sees are the task's, on every
    // worker it is polled on.
    assert_eq!(pfs_client::thread_id(), Some(stmt.id().0));
    assert_eq!(pfs_client::statement_event_id(), Some(stmt.id().1));
    stmt.set_text(&format!("request {i}"));
    stmt.set_rows_sent(i);
    PARSE.enter();
    for _ in 0..SPINS {
        note(&polled_on);
        SPIN.get().start(Operation::Lock, i as usize).end();
        tokio::task::yield_now().await;
    }
    EXECUTE.enter();
    assert_eq!(pfs_client::thread_id(), Some(stmt.id().0));
    let w = BLOCKING.get().start_async(Operation::Read, i as usize);
    tokio::task::spawn_blocking(|| std::thread::sleep(BLOCKED))
        .await
        .unwrap();
    w.end();
    note(&polled_on);
    // A nested statement, and a message from another task.
    let inner = INNER.start_task();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        let _ = tx.send(());
    });
    rx.await.unwrap();
    note(&polled_on);
    drop(inner);
    stmt.end();
}

#[test]
fn task_statements_nest_exactly_across_workers() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("tasks-test")
            .shm_dir(dir.path())
            .consumer("events_%_history_long", true)
            .consumer("events_%_history", true),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    // The history_long rings on at init are reserved by init, not by the
    // first event appended (whose statement would count the time).
    let seg = Segment::open(std::fs::File::open(&path).unwrap(), false).unwrap();
    assert_eq!(
        seg.header()
            .long_reserved
            .load(std::sync::atomic::Ordering::Acquire),
        0b111
    );
    drop(seg);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let polled_on = Arc::new(Mutex::new(HashMap::new()));
    rt.block_on(async {
        let mut handles = Vec::new();
        for i in 1..=TASKS {
            handles.push(tokio::spawn(request(i, polled_on.clone()).pfs_task()));
            // Noise: tasks without a context of their own, recording on
            // the workers' own state meanwhile. None of it may land in a
            // task's statement.
            handles.push(tokio::spawn(async move {
                NOISE.get().start(Operation::Lock, 0).end();
                tokio::task::yield_now().await;
                NOISE.get().start(Operation::Lock, 0).end();
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        // Cancellation: a task dropped while its statement is open.
        let pending = async {
            let _stmt = CANCELLED.start_task();
            std::future::pending::<()>().await;
        };
        let r = tokio::time::timeout(Duration::from_millis(5), pending.pfs_task()).await;
        assert!(r.is_err(), "the pending task timed out");
    });
    // Read while the workers (and their records) are alive.
    let s = read(&path);
    drop(rt);

    let migrated = polled_on
        .lock()
        .unwrap()
        .values()
        .filter(|threads| threads.len() > 1)
        .count();
    assert!(migrated > 0, "no task was polled on two workers");

    let req = class_index(&s, REQ.name());
    let inner = class_index(&s, INNER.name());
    let parse = class_index(&s, PARSE.name());
    let execute = class_index(&s, EXECUTE.name());
    let spin = class_index(&s, SPIN.name());
    let blocking = class_index(&s, BLOCKING.name());
    let noise = class_index(&s, NOISE.name());
    let cancelled = class_index(&s, CANCELLED.name());

    // Nothing was lost: every event of every kind is in history_long.
    assert_eq!(&s.lost[5..8], &[0, 0, 0], "history_long lost events");

    // Statements: one per task, each under its own task THREAD_ID.
    let stmts: Vec<&StatementEvent> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == req)
        .collect();
    assert_eq!(stmts.len() as u64, TASKS);
    let thread_ids: HashSet<u64> = s.threads.iter().map(|t| t.thread_id).collect();
    let mut by_task: HashMap<u64, &StatementEvent> = HashMap::new();
    let blocked_ps = BLOCKED.as_nanos() as u64 * 1000;
    let mut poll_time_excludes_blocked = 0;
    for st in &stmts {
        assert!(
            !thread_ids.contains(&st.ev.thread_id),
            "a task's THREAD_ID is never a thread's"
        );
        assert_eq!(st.ev.event_id, 1, "a task's first event is its statement");
        assert_eq!(st.ev.nesting_event_type, None);
        assert_eq!(st.text, format!("request {}", st.figures.rows_sent));
        assert_eq!(st.figures.cancelled, 0);
        assert!(
            by_task.insert(st.ev.thread_id, st).is_none(),
            "one statement per task THREAD_ID"
        );
        let wait = st.ev.timer_wait.unwrap();
        let cpu = st.figures.cpu_time_ps;
        assert!(cpu > 0, "a task statement has CPU_TIME");
        assert!(wait >= cpu, "TIMER_WAIT {wait} >= CPU_TIME {cpu}");
        assert!(wait >= blocked_ps, "TIMER_WAIT {wait} >= the time blocked");
        // The blocked time is not poll time. (Only mostly disjoint from
        // it: the blocking sleep starts while the poll that spawned it is
        // still running, and a preempted poll can outlast it.)
        if wait >= cpu + blocked_ps {
            poll_time_excludes_blocked += 1;
        }
    }
    assert!(
        poll_time_excludes_blocked * 2 > stmts.len(),
        "CPU_TIME + the time blocked <= TIMER_WAIT in only {poll_time_excludes_blocked} of {} statements",
        stmts.len()
    );
    // A worker's events_statements_current row is whole: the statement
    // it shows ended there, with its own ids, text and figures (tasks'
    // statements all have EVENT_ID 1: only the THREAD_ID tells them apart).
    let mut shown = 0;
    for t in &s.threads {
        if let Some(cur) = t.statements_current.as_ref().filter(|c| c.ev.class == req) {
            let st = by_task[&cur.ev.thread_id];
            assert_eq!(cur.figures, st.figures);
            assert_eq!(cur.text, st.text);
            assert_eq!(cur.ev.timer_wait, st.ev.timer_wait);
            shown += 1;
        }
    }
    assert!(shown > 0, "a worker shows a task's statement");
    let rows: HashSet<u64> = stmts.iter().map(|s| s.figures.rows_sent).collect();
    assert_eq!(rows.len() as u64, TASKS, "every task's own figures");

    // Every event of a task nests in an event of the same task, inside
    // its parent's [EVENT_ID, END_EVENT_ID).
    let mut events: HashMap<(u64, u64), Event> = HashMap::new();
    for e in s.long.iter().flatten() {
        assert!(events.insert((e.thread_id, e.event_id), *e).is_none());
    }
    for e in &s.long_statements {
        assert!(
            events
                .insert((e.ev.thread_id, e.ev.event_id), e.ev)
                .is_none()
        );
    }
    let mut per_task: HashMap<u64, HashMap<u32, u64>> = HashMap::new();
    for e in events.values() {
        if e.class == noise {
            assert_eq!(e.nesting_event_id, None, "noise nests in nothing");
            assert!(thread_ids.contains(&e.thread_id) || !by_task.contains_key(&e.thread_id));
            continue;
        }
        if e.class == cancelled {
            continue;
        }
        let st = by_task
            .get(&e.thread_id)
            .unwrap_or_else(|| panic!("{e:?} belongs to a task"));
        *per_task
            .entry(e.thread_id)
            .or_default()
            .entry(e.class)
            .or_default() += 1;
        if e.class == req {
            continue;
        }
        let parent = events
            .get(&(e.thread_id, e.nesting_event_id.expect("nested")))
            .expect("the parent is in the same task");
        assert_eq!(parent.event_type, e.nesting_event_type);
        assert!(parent.event_id < e.event_id);
        assert!(e.event_id < parent.end_event_id.unwrap());
        let expected_parent = match e.class {
            c if c == spin => parse,
            c if c == blocking => execute,
            c if c == parse || c == execute || c == inner => req,
            other => panic!("unexpected class {other}"),
        };
        assert_eq!(parent.class, expected_parent, "{e:?}");
        if e.class == parse || e.class == execute {
            assert!(st.ev.timer_wait.unwrap() >= e.timer_wait.unwrap());
        }
        if e.class == blocking {
            assert!(e.timer_wait.unwrap() >= BLOCKED.as_nanos() as u64 * 1000);
        }
    }
    // The workers' current wait and stage rows are whole too: each equals
    // the event of the same (THREAD_ID, EVENT_ID) in history_long.
    let mut compared = 0;
    for t in &s.threads {
        for cur in [t.waits_current, t.stages_current].into_iter().flatten() {
            if cur.end_event_id.is_none() || !by_task.contains_key(&cur.thread_id) {
                continue;
            }
            let long = events[&(cur.thread_id, cur.event_id)];
            assert_eq!(
                (cur.class, cur.timer_wait, cur.nesting_event_id),
                (long.class, long.timer_wait, long.nesting_event_id)
            );
            compared += 1;
        }
    }
    assert!(compared > 0, "a worker shows a task's wait or stage");
    assert_eq!(per_task.len() as u64, TASKS);
    for counts in per_task.values() {
        let n = |c: u32| counts.get(&c).copied().unwrap_or(0);
        assert_eq!(
            (n(req), n(parse), n(execute), n(inner), n(spin), n(blocking)),
            (1, 1, 1, 1, SPINS, 1)
        );
    }
    let noise_events = events.values().filter(|e| e.class == noise).count() as u64;
    assert_eq!(noise_events, 2 * TASKS);

    // The cancelled statement: flagged, not an error, in the summaries.
    let c: Vec<&StatementEvent> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == cancelled)
        .collect();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].figures.cancelled, 1);
    assert_eq!(c[0].figures.errors, 0);

    // Summaries (by the threads that polled): exact counts and figures.
    let mut sums: HashMap<u32, pfs_shm_layout::reader::Summary> = HashMap::new();
    for (class, row) in s
        .exited
        .iter()
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
    {
        sums.entry(*class).or_default().merge(row);
    }
    assert_eq!(sums[&req].count, TASKS);
    assert_eq!(sums[&req].statement.rows_sent, TASKS * (TASKS + 1) / 2);
    let cpu_sum: u64 = stmts.iter().map(|s| s.figures.cpu_time_ps).sum();
    assert_eq!(sums[&req].statement.cpu_time_ps, cpu_sum);
    assert_eq!(sums[&spin].count, TASKS * SPINS);
    assert_eq!(sums[&blocking].count, TASKS);
    assert_eq!(sums[&noise].count, 2 * TASKS);
    assert_eq!(sums[&cancelled].count, 1);
    assert_eq!(sums[&cancelled].statement.cancelled, 1);
    assert_eq!(sums[&req].statement.cancelled, 0);
}
