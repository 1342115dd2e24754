//! The `tokio` drop-ins (`pfs_client::tokio`, feature `tokio`) on a real
//! multi-threaded runtime, read back from the real segment.
//!
//! Each case holds a primitive while a known number of tasks queue on it
//! (every waiter says it arrived just before it tries; the holder waits
//! for all of them, then holds on for `HOLD`), so the number of
//! acquisitions that waited is known exactly: each class must have exactly
//! that many waits, in `events_waits_history_long` and in the summaries,
//! each under its own task's `THREAD_ID`, nested in that task's statement
//! (or its open stage), and lasting at least `HOLD`. Acquisitions that
//! found the primitive free record nothing. Waiters dropped while queued
//! (a timeout, a losing `select!` branch, an aborted task) record one
//! wait each, up to the drop.
//!
//! `init` is once per process: the test functions share it through a
//! `OnceLock`, and each uses classes of its own.

#![cfg(feature = "tokio")]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pfs_client::task::TaskExt;
use pfs_client::tokio::{Mutex, Notify, OwnedMutexGuard, RwLock, Semaphore, mpsc};
use pfs_client::{LazyStageClass, LazyStatementClass, LazyWaitClass, Operation};
use pfs_shm_layout::reader::{Event, ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::{EventKind, Segment};

static REQ: LazyStatementClass = LazyStatementClass::new("statement/tokio_test/request");
static ABORTED: LazyStatementClass = LazyStatementClass::new("statement/tokio_test/aborted");
static LOCKING: LazyStageClass = LazyStageClass::new("stage/tokio_test/locking");

static MUTEX: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/mutex");
static MUTEX_OWNED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/mutex_owned");
static RWLOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/tokio_test/rwlock");
static SEMAPHORE: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/semaphore");
static NOTIFY: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/notify");
static CHANNEL: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/channel");
static UNBOUNDED: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/unbounded");
static TIMED_OUT: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/timed_out");
static SELECTED: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/selected");
static ABORT: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/abort");
static FREE_MUTEX: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/free_mutex");
static FREE_RWLOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/rwlock/tokio_test/free_rwlock");
static FREE_SEMAPHORE: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/free_semaphore");
static FREE_NOTIFY: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/free_notify");
static JOINED_A: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/joined_a");
static JOINED_B: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/tokio_test/joined_b");
static OWNED_BLOCKING_MUTEX: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/owned_blocking_mutex");
static OWNED_BLOCKING_SEMAPHORE: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/owned_blocking_semaphore");
static OWNED_BLOCKING_RWLOCK: LazyWaitClass =
    LazyWaitClass::new("wait/synch/rwlock/tokio_test/owned_blocking_rwlock");
static PANICKING_MUTEX: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/panicking_mutex");
static SPAWN_BLOCKING_MUTEX: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/spawn_blocking_mutex");
static SPAWN_BLOCKING_SEMAPHORE: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/spawn_blocking_semaphore");
static SPAWN_BLOCKING_CHANNEL: LazyWaitClass =
    LazyWaitClass::new("wait/synch/cond/tokio_test/spawn_blocking_channel");
static FREE_CHANNEL: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/free_channel");

/// Tasks queued on each primitive.
const WAITERS: usize = 16;
/// How long a holder keeps holding once every waiter has arrived.
const HOLD: Duration = Duration::from_millis(60);
/// The timeout of a cancelled waiter.
const TIMEOUT: Duration = Duration::from_millis(50);
/// Slack above `TIMEOUT` for a loaded machine.
const SLACK: Duration = Duration::from_millis(500);

/// The segment, initialised once for the whole process with the
/// `history_long` consumers on, opened for reading. Its directory is
/// removed at once: the mapping and this handle keep the file alive until
/// the process exits, and nothing is left behind.
fn segment() -> &'static std::fs::File {
    static FILE: OnceLock<std::fs::File> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        pfs_client::init_with(
            pfs_client::Config::new("tokio-waits")
                .shm_dir(dir.path())
                .consumer("events_%_history_long", true),
        )
        .unwrap();
        std::fs::File::open(pfs_client::segment_path().unwrap()).unwrap()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    segment();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn read() -> SegmentSnapshot {
    let seg = Segment::open(segment().try_clone().unwrap(), false).unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

fn class_index(s: &SegmentSnapshot, name: &str) -> Option<u32> {
    s.classes.iter().find(|c| c.name == name).map(|c| c.index)
}

/// Counts tasks about to wait, so that a holder knows they all queued.
#[derive(Default)]
struct Gate(AtomicUsize);

impl Gate {
    fn arrive(&self) {
        self.0.fetch_add(1, SeqCst);
    }

    /// Returns once `n` tasks arrived and `HOLD` more passed: each of them
    /// tried (and failed) to acquire right after arriving, in the same poll.
    async fn all_queued(&self, n: usize) {
        while self.0.load(SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(HOLD).await;
    }
}

/// What a waiting task knows of itself.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    /// Its statement's `THREAD_ID` and `EVENT_ID`.
    statement: (u64, u64),
    /// Whether it waited in the `LOCKING` stage (else in the statement).
    staged: bool,
    operation: Operation,
}

/// Opens the task's statement (and, for every other task, a stage).
fn begin(i: usize, operation: Operation) -> (pfs_client::TaskStatement, Waiter) {
    let stmt = REQ.start_task();
    assert!(stmt.is_recording());
    let staged = i.is_multiple_of(2);
    if staged {
        LOCKING.enter();
    }
    let w = Waiter {
        statement: stmt.id(),
        staged,
        operation,
    };
    (stmt, w)
}

/// Checks that `class` recorded exactly one wait per entry of `waiters`
/// (a task that waited twice is in it twice) and nothing else, each under
/// its task's `THREAD_ID`, nested where the task was, lasting `[min,
/// max]`; returns the waits.
fn check_waits(
    s: &SegmentSnapshot,
    class: &LazyWaitClass,
    waiters: &[Waiter],
    min: Duration,
    max: Option<Duration>,
) -> Vec<Event> {
    let name = class.name();
    let idx = class_index(s, name).unwrap_or_else(|| panic!("{name} registered"));
    let locking = class_index(s, LOCKING.name()).expect("stage registered");
    let waits: Vec<Event> = s.long[EventKind::Wait.index()]
        .iter()
        .filter(|e| e.class == idx)
        .copied()
        .collect();
    assert_eq!(waits.len(), waiters.len(), "{name}: waits in history_long");
    assert_eq!(
        s.summary_of(idx).count,
        waiters.len() as u64,
        "{name}: COUNT_STAR"
    );
    let mut expected: HashMap<u64, (Waiter, usize)> = HashMap::new();
    for w in waiters {
        expected.entry(w.statement.0).or_insert((*w, 0)).1 += 1;
    }
    let mut found: HashMap<u64, usize> = HashMap::new();
    for e in &waits {
        let (w, _) = expected
            .get(&e.thread_id)
            .unwrap_or_else(|| panic!("{name}: {e:?} is under a waiting task's THREAD_ID"));
        let (thread_id, statement_id) = w.statement;
        *found.entry(thread_id).or_default() += 1;
        assert_eq!(e.operation, Some(w.operation), "{name}");
        assert_eq!(e.event_type, Some(EventKind::Wait));
        assert!(e.end_event_id.is_some(), "{name}: ended");
        assert!(e.event_id > statement_id, "{name}: after its statement");
        let stmt = s
            .long_statements
            .iter()
            .find(|st| st.ev.thread_id == thread_id && st.ev.event_id == statement_id)
            .unwrap_or_else(|| panic!("{name}: the task's statement {w:?}"));
        assert!(
            e.event_id < stmt.ev.end_event_id.unwrap(),
            "{name}: inside it"
        );
        if w.staged {
            assert_eq!(
                e.nesting_event_type,
                Some(EventKind::Stage),
                "{name}: {e:?}"
            );
            let stage = s.long[EventKind::Stage.index()]
                .iter()
                .find(|st| st.thread_id == thread_id && Some(st.event_id) == e.nesting_event_id)
                .unwrap_or_else(|| panic!("{name}: the task's stage {e:?}"));
            assert_eq!(stage.class, locking);
            assert_eq!(stage.nesting_event_id, Some(statement_id));
        } else {
            assert_eq!(
                e.nesting_event_type,
                Some(EventKind::Statement),
                "{name}: {e:?}"
            );
            assert_eq!(e.nesting_event_id, Some(statement_id), "{name}");
        }
        // SOURCE: the line that called the drop-in's method, in this file.
        let source = e.source.and_then(|i| s.strings.get(&i));
        assert!(
            source.is_some_and(|f| f.starts_with("tokio_waits.rs:")),
            "{name}: SOURCE {source:?} is the caller's line"
        );
        let wait = e.timer_wait.expect("timed");
        // A waiter can be preempted between saying it arrived (or the
        // timeout's start) and its failing try, where its wait starts: on
        // a loaded machine a wait may be shorter than `min` by that much.
        // Half of `min` still tells a measured wait from a zero one.
        let floor = min / 2;
        assert!(
            wait >= floor.as_nanos() as u64 * 1000,
            "{name}: TIMER_WAIT {wait} ps >= {floor:?}"
        );
        if let Some(max) = max {
            assert!(
                wait <= max.as_nanos() as u64 * 1000,
                "{name}: TIMER_WAIT {wait} ps <= {max:?}"
            );
        }
    }
    for (thread_id, (_, n)) in &expected {
        assert_eq!(
            found.get(thread_id),
            Some(n),
            "{name}: waits of task {thread_id}"
        );
    }
    let objects: HashSet<u64> = waits.iter().map(|e| e.object_instance).collect();
    assert!(objects.len() <= 1, "{name}: one object");
    waits
}

/// Checks that `class` is registered and recorded nothing.
fn check_nothing(s: &SegmentSnapshot, class: &LazyWaitClass) {
    let name = class.name();
    let idx = class_index(s, name).unwrap_or_else(|| panic!("{name} registered"));
    assert_eq!(
        s.long[EventKind::Wait.index()]
            .iter()
            .filter(|e| e.class == idx)
            .count(),
        0,
        "{name}"
    );
    assert_eq!(s.summary_of(idx).count, 0, "{name}");
}

fn no_lost_events(s: &SegmentSnapshot) {
    assert_eq!(&s.lost[5..8], &[0, 0, 0], "history_long lost events");
}

#[test]
fn mutex_waits_are_the_contended_locks() {
    let rt = runtime();
    let (waiters, owned_waiters) = rt.block_on(async {
        let m = Arc::new(Mutex::new(&MUTEX, 0usize));
        let gate = Arc::new(Gate::default());
        let held = m.lock().await; // free: records nothing
        let mut handles = Vec::new();
        for i in 0..WAITERS {
            let (m, gate) = (m.clone(), gate.clone());
            handles.push(tokio::spawn(
                async move {
                    let (stmt, w) = begin(i, Operation::Lock);
                    gate.arrive();
                    *m.lock().await += 1;
                    drop(stmt);
                    w
                }
                .pfs_task(),
            ));
        }
        gate.all_queued(WAITERS).await;
        drop(held);
        let mut waiters = Vec::new();
        for h in handles {
            waiters.push(h.await.unwrap());
        }
        assert_eq!(*m.lock().await, WAITERS); // free again
        assert!(m.try_lock().is_ok());

        // `lock_owned`: the guard moves into another task.
        let m = Arc::new(Mutex::new(&MUTEX_OWNED, Vec::new()));
        let gate = Arc::new(Gate::default());
        let held = m.clone().lock_owned().await;
        assert!(m.clone().try_lock_owned().is_err());
        let mut handles = Vec::new();
        for i in 0..WAITERS {
            let (m, gate) = (m.clone(), gate.clone());
            handles.push(tokio::spawn(
                async move {
                    let (stmt, w) = begin(i, Operation::Lock);
                    gate.arrive();
                    let mut g = m.lock_owned().await;
                    g.push(i);
                    let g = tokio::spawn(async move { g }).await.unwrap();
                    assert!(OwnedMutexGuard::mutex(&g).try_lock().is_err(), "held");
                    drop(g);
                    drop(stmt);
                    w
                }
                .pfs_task(),
            ));
        }
        gate.all_queued(WAITERS).await;
        drop(held);
        let mut owned_waiters = Vec::new();
        for h in handles {
            owned_waiters.push(h.await.unwrap());
        }
        let m = Arc::try_unwrap(m).unwrap();
        assert_eq!(m.into_inner().len(), WAITERS);
        (waiters, owned_waiters)
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    check_waits(&s, &MUTEX, &waiters, HOLD, None);
    check_waits(&s, &MUTEX_OWNED, &owned_waiters, HOLD, None);
}

#[test]
fn rwlock_waits_are_the_contended_reads_and_writes() {
    let rt = runtime();
    let waiters = rt.block_on(async {
        let rw = Arc::new(RwLock::new(&RWLOCK, 0usize));
        let gate = Arc::new(Gate::default());
        {
            // Free: shared reads and a write record nothing.
            let (a, b) = (rw.read().await, rw.read().await);
            assert_eq!(*a + *b, 0);
            assert!(rw.try_write().is_err());
        }
        let held = rw.write().await;
        assert!(rw.try_read().is_err());
        let mut handles = Vec::new();
        for i in 0..WAITERS {
            let (rw, gate) = (rw.clone(), gate.clone());
            let op = if i.is_multiple_of(3) {
                Operation::WriteLock
            } else {
                Operation::ReadLock
            };
            handles.push(tokio::spawn(
                async move {
                    let (stmt, w) = begin(i, op);
                    gate.arrive();
                    if op == Operation::WriteLock {
                        *rw.write().await += 1;
                    } else {
                        let _ = *rw.read().await;
                    }
                    drop(stmt);
                    w
                }
                .pfs_task(),
            ));
        }
        gate.all_queued(WAITERS).await;
        drop(held);
        let mut waiters = Vec::new();
        for h in handles {
            waiters.push(h.await.unwrap());
        }
        assert_eq!(*rw.read().await, WAITERS.div_ceil(3));
        let mut rw = Arc::try_unwrap(rw).unwrap();
        *rw.get_mut() += 1;
        assert_eq!(rw.into_inner(), WAITERS.div_ceil(3) + 1);
        waiters
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    let waits = check_waits(&s, &RWLOCK, &waiters, HOLD, None);
    assert!(
        waits
            .iter()
            .any(|e| e.operation == Some(Operation::ReadLock))
    );
    assert!(
        waits
            .iter()
            .any(|e| e.operation == Some(Operation::WriteLock))
    );
}

#[test]
fn semaphore_waits_are_the_contended_acquisitions() {
    let rt = runtime();
    let waiters = rt.block_on(async {
        let sem = Arc::new(Semaphore::new(&SEMAPHORE, 2));
        let gate = Arc::new(Gate::default());
        let held = sem.acquire_many(2).await.unwrap(); // free: nothing
        assert!(sem.try_acquire().is_err());
        let mut handles = Vec::new();
        for i in 0..WAITERS {
            let (sem, gate) = (sem.clone(), gate.clone());
            handles.push(tokio::spawn(
                async move {
                    let (stmt, w) = begin(i, Operation::Lock);
                    gate.arrive();
                    match i % 3 {
                        0 => drop(sem.acquire().await.unwrap()),
                        1 => drop(sem.acquire_many(2).await.unwrap()),
                        _ => drop(sem.acquire_owned().await.unwrap()),
                    }
                    drop(stmt);
                    w
                }
                .pfs_task(),
            ));
        }
        gate.all_queued(WAITERS).await;
        drop(held);
        let mut waiters = Vec::new();
        for h in handles {
            waiters.push(h.await.unwrap());
        }
        assert_eq!(sem.available_permits(), 2);
        sem.add_permits(1);
        drop(sem.clone().acquire_many_owned(3).await.unwrap()); // free
        sem.close();
        assert!(sem.is_closed());
        assert!(sem.acquire().await.is_err()); // closed: nothing recorded
        waiters
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    check_waits(&s, &SEMAPHORE, &waiters, HOLD, None);
}

#[test]
fn notify_waits_are_the_notified_that_waited() {
    let rt = runtime();
    let waiters = rt.block_on(async {
        let notify = Arc::new(Notify::new(&NOTIFY));
        // A stored permit: taken at once, nothing recorded.
        notify.notify_one();
        notify.notified().await;
        let gate = Arc::new(Gate::default());
        let mut handles = Vec::new();
        for i in 0..WAITERS {
            let (notify, gate) = (notify.clone(), gate.clone());
            handles.push(tokio::spawn(
                async move {
                    let (stmt, w) = begin(i, Operation::Wait);
                    gate.arrive();
                    notify.notified().await;
                    drop(stmt);
                    w
                }
                .pfs_task(),
            ));
        }
        gate.all_queued(WAITERS).await;
        notify.notify_waiters();
        let mut waiters = Vec::new();
        for h in handles {
            waiters.push(h.await.unwrap());
        }
        waiters
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    check_waits(&s, &NOTIFY, &waiters, HOLD, None);
}

#[test]
fn channel_waits_are_the_receives_from_an_empty_channel() {
    const MESSAGES: usize = 6;
    const PRE_SENT: usize = 3;
    let rt = runtime();
    let (waiter, unbounded_waiter) = rt.block_on(async {
        let (tx, mut rx) = mpsc::channel::<usize>(&CHANNEL, 4);
        for i in 0..PRE_SENT {
            tx.send(i).await.unwrap(); // received without waiting
        }
        let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
        let receiver = tokio::spawn(
            async move {
                let (stmt, w) = begin(1, Operation::Wait); // not staged
                for i in 0..PRE_SENT {
                    assert_eq!(rx.recv().await, Some(i));
                }
                assert!(rx.is_empty());
                assert_eq!(rx.len(), 0);
                for i in 0..MESSAGES {
                    // The channel is empty: the sender waits for this ack,
                    // then for HOLD, before it sends.
                    ack_tx.send(()).unwrap();
                    assert_eq!(rx.recv().await, Some(PRE_SENT + i));
                }
                closed_rx.await.unwrap();
                assert!(rx.is_closed());
                assert_eq!(rx.recv().await, None); // closed: nothing recorded
                drop(stmt);
                w
            }
            .pfs_task(),
        );
        for i in 0..MESSAGES {
            ack_rx.recv().await.unwrap();
            tokio::time::sleep(HOLD).await;
            tx.send(PRE_SENT + i).await.unwrap();
        }
        drop(tx);
        closed_tx.send(()).unwrap();
        let waiter = receiver.await.unwrap();

        // Unbounded, `recv_many`: one receive that waits, one that does not.
        let (tx, mut rx) = mpsc::unbounded_channel::<usize>(&UNBOUNDED);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let (got_one_tx, got_one_rx) = tokio::sync::oneshot::channel::<()>();
        let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
        let receiver = tokio::spawn(
            async move {
                let (stmt, w) = begin(0, Operation::Wait); // staged
                let mut got = Vec::new();
                ready_tx.send(()).unwrap();
                assert_eq!(rx.recv_many(&mut got, 10).await, 1); // waits
                got_one_tx.send(()).unwrap();
                sent_rx.await.unwrap();
                assert_eq!(rx.recv_many(&mut got, 10).await, 2); // does not
                assert_eq!(got, [1, 2, 3]);
                drop(stmt);
                w
            }
            .pfs_task(),
        );
        ready_rx.await.unwrap();
        tokio::time::sleep(HOLD).await;
        tx.send(1).unwrap();
        got_one_rx.await.unwrap();
        tx.send(2).unwrap();
        tx.send(3).unwrap();
        sent_tx.send(()).unwrap();
        (waiter, receiver.await.unwrap())
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    check_waits(&s, &CHANNEL, &[waiter; MESSAGES], HOLD, None);
    check_waits(&s, &UNBOUNDED, &[unbounded_waiter], HOLD, None);
}

#[test]
fn acquisitions_that_do_not_wait_record_nothing() {
    let rt = runtime();
    let classes = [
        &FREE_MUTEX,
        &FREE_RWLOCK,
        &FREE_SEMAPHORE,
        &FREE_NOTIFY,
        &FREE_CHANNEL,
    ];
    for c in classes {
        assert!(c.get().is_enabled(), "{} registered and enabled", c.name());
    }
    let m = Arc::new(Mutex::new(&FREE_MUTEX, 0u32));
    let rw = Arc::new(RwLock::new(&FREE_RWLOCK, 0u32));
    let sem = Arc::new(Semaphore::new(&FREE_SEMAPHORE, 3));
    let notify = Arc::new(Notify::new(&FREE_NOTIFY));
    let (tx, mut rx) = mpsc::channel::<u32>(&FREE_CHANNEL, 8);
    let mut handles = Vec::new();
    for i in 0..WAITERS {
        let (m, rw, sem, notify) = (m.clone(), rw.clone(), sem.clone(), notify.clone());
        handles.push(
            rt.spawn(
                async move {
                    let (stmt, _) = begin(i, Operation::Lock);
                    // One task at a time: every acquisition finds it free.
                    let _turn = TURN.lock().await;
                    *m.lock().await += 1;
                    *m.clone().lock_owned().await += 1;
                    drop(m.try_lock().unwrap());
                    let (a, b) = (rw.read().await, rw.read().await);
                    drop((a, b));
                    *rw.write().await += 1;
                    let (a, b) = (
                        sem.acquire().await.unwrap(),
                        sem.acquire_many(2).await.unwrap(),
                    );
                    drop((a, b));
                    drop(sem.clone().acquire_owned().await.unwrap());
                    drop(sem.clone().acquire_many_owned(3).await.unwrap());
                    notify.notify_one();
                    notify.notified().await;
                    drop(stmt);
                }
                .pfs_task(),
            ),
        );
    }
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    rt.block_on(async {
        for h in handles {
            h.await.unwrap();
        }
        for i in 0..4 {
            tx.send(i).await.unwrap();
        }
        let mut got = Vec::new();
        assert_eq!(rx.recv().await, Some(0));
        assert_eq!(rx.recv_many(&mut got, 2).await, 2);
        assert_eq!(rx.try_recv().unwrap(), 3);
        drop(tx);
        assert_eq!(rx.recv().await, None);
        assert_eq!(rx.recv_many(&mut got, 2).await, 0);
    });
    assert_eq!(*m.try_lock().unwrap(), 2 * WAITERS as u32);
    let s = read();
    drop(rt);
    for c in classes {
        check_nothing(&s, c);
    }
}

#[test]
fn waiters_dropped_while_queued_record_their_wait_up_to_the_drop() {
    let rt = runtime();
    let (timed_out, selected, aborted) = rt.block_on(async {
        // A lock that times out.
        let m = Arc::new(Mutex::new(&TIMED_OUT, ()));
        let held = m.lock().await;
        let m2 = m.clone();
        let timed_out = tokio::spawn(
            async move {
                let (stmt, w) = begin(0, Operation::Lock); // staged
                let r = tokio::time::timeout(TIMEOUT, m2.lock()).await;
                assert!(r.is_err(), "timed out");
                drop(stmt);
                w
            }
            .pfs_task(),
        )
        .await
        .unwrap();
        drop(held);
        assert!(m.try_lock().is_ok(), "the dropped waiter holds nothing");

        // A `select!` whose notification branch loses.
        let notify = Arc::new(Notify::new(&SELECTED));
        let n2 = notify.clone();
        let selected = tokio::spawn(
            async move {
                let (stmt, w) = begin(1, Operation::Wait); // not staged
                tokio::select! {
                    _ = n2.notified() => panic!("nobody notifies"),
                    _ = tokio::time::sleep(TIMEOUT) => {}
                }
                drop(stmt);
                w
            }
            .pfs_task(),
        )
        .await
        .unwrap();
        notify.notify_one(); // no waiter left: stores a permit

        // A task aborted while it waits: its wait is recorded by the drop,
        // nested in its statement, which ends cancelled.
        let sem = Arc::new(Semaphore::new(&ABORT, 0));
        let gate = Arc::new(Gate::default());
        let id = Arc::new(std::sync::Mutex::new(None));
        let (sem2, gate2, id2) = (sem.clone(), gate.clone(), id.clone());
        let task = tokio::spawn(
            async move {
                let stmt = ABORTED.start_task();
                *id2.lock().unwrap() = Some(stmt.id());
                gate2.arrive();
                let _permit = sem2.acquire().await;
                unreachable!("no permit is ever added");
            }
            .pfs_task(),
        );
        gate.all_queued(1).await;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(sem.available_permits(), 0);
        let aborted = Waiter {
            statement: id.lock().unwrap().expect("started"),
            staged: false,
            operation: Operation::Lock,
        };
        (timed_out, selected, aborted)
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    check_waits(&s, &TIMED_OUT, &[timed_out], TIMEOUT, Some(TIMEOUT + SLACK));
    check_waits(&s, &SELECTED, &[selected], TIMEOUT, Some(TIMEOUT + SLACK));
    check_waits(&s, &ABORT, &[aborted], HOLD, None);
    let stmt = s
        .long_statements
        .iter()
        .find(|st| (st.ev.thread_id, st.ev.event_id) == aborted.statement)
        .expect("the aborted statement");
    assert_eq!(stmt.figures.cancelled, 1, "the aborted task's statement");
}

/// Every drop-in's futures are `Send` (so they work in `tokio::spawn`),
/// and so are the channel receivers and the owned guard.
#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let m = Arc::new(Mutex::new(&MUTEX, 0u8));
    let rw = RwLock::new(&RWLOCK, 0u8);
    let sem = Arc::new(Semaphore::new(&SEMAPHORE, 1));
    let notify = Notify::new(&NOTIFY);
    let (_tx, mut rx) = mpsc::channel::<u8>(&CHANNEL, 1);
    let (_utx, mut urx) = mpsc::unbounded_channel::<u8>(&UNBOUNDED);
    send(&m.lock());
    send(&m.clone().lock_owned());
    send(&rw.read());
    send(&rw.write());
    send(&sem.acquire());
    send(&sem.acquire_many(1));
    send(&sem.clone().acquire_owned());
    send(&sem.clone().acquire_many_owned(1));
    send(&notify.notified());
    send(&rx);
    send(&urx);
    send(&rx.recv());
    send(&urx.recv());
    let mut buf = Vec::new();
    send(&rx.recv_many(&mut buf, 1));
    let guard = m.try_lock_owned().unwrap();
    send(&guard);
}

static BLOCKING_MUTEX: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/blocking_mutex");
static BLOCKING_RWLOCK: LazyWaitClass =
    LazyWaitClass::new("wait/synch/rwlock/tokio_test/blocking_rwlock");
static BLOCKING_SEMAPHORE: LazyWaitClass =
    LazyWaitClass::new("wait/synch/mutex/tokio_test/blocking_semaphore");
static BLOCKING_CHANNEL: LazyWaitClass =
    LazyWaitClass::new("wait/synch/cond/tokio_test/blocking_channel");
static POLLED: LazyWaitClass = LazyWaitClass::new("wait/synch/cond/tokio_test/polled");

/// Holds `held` while `n` threads run `f` (each arrives, then acquires):
/// releases it once all arrived and `HOLD` passed, so each of them waited.
fn contend<G>(held: G, n: usize, f: impl Fn() + Sync) {
    let gate = Gate::default();
    std::thread::scope(|sc| {
        for _ in 0..n {
            let (gate, f) = (&gate, &f);
            sc.spawn(move || {
                gate.arrive();
                f();
            });
        }
        while gate.0.load(SeqCst) < n {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(HOLD);
        drop(held);
    });
}

/// The blocking forms, from plain threads: each acquisition that had to
/// wait is one wait of the calling thread, with its operation; one that
/// found the lock free records nothing.
#[test]
fn blocking_locks_record_the_waits_of_their_threads() {
    segment();
    let m = Mutex::new(&BLOCKING_MUTEX, 0u32);
    let rw = RwLock::new(&BLOCKING_RWLOCK, 0u32);
    drop(m.blocking_lock()); // free: nothing recorded
    drop(rw.blocking_read());
    drop(rw.blocking_write());
    contend(m.try_lock().unwrap(), 3, || *m.blocking_lock() += 1);
    contend(rw.try_write().unwrap(), 2, || drop(rw.blocking_read()));
    contend(rw.try_read().unwrap(), 1, || *rw.blocking_write() += 1);
    assert_eq!((*m.try_lock().unwrap(), *rw.try_read().unwrap()), (3, 1));
    let sem = Semaphore::new(&BLOCKING_SEMAPHORE, 1);
    drop(sem.blocking_acquire().unwrap()); // free: nothing recorded
    contend(sem.try_acquire().unwrap(), 2, || {
        drop(sem.blocking_acquire_many(1).unwrap())
    });
    // A channel: two receives find a message, two find it empty and wait
    // (one of them for several), one finds it closed.
    let (tx, mut rx) = mpsc::channel::<u32>(&BLOCKING_CHANNEL, 4);
    let (mut got, mut many) = (Vec::new(), Vec::new());
    tx.blocking_send(1).unwrap();
    got.push(rx.blocking_recv());
    tx.blocking_send(2).unwrap();
    assert_eq!(rx.blocking_recv_many(&mut many, 4), 1);
    // The sender pauses long enough (SLACK) for the receiver to be blocked
    // before each send, even on a loaded machine.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(SLACK);
            tx.blocking_send(3).unwrap();
            std::thread::sleep(SLACK);
            tx.blocking_send(4).unwrap();
            std::thread::sleep(SLACK);
            tx.blocking_send(5).unwrap();
        });
        got.push(rx.blocking_recv()); // waits for 3
        assert_eq!(rx.blocking_recv_many(&mut many, 4), 1); // waits for 4
    });
    drop(tx);
    got.push(rx.blocking_recv()); // 5, buffered
    got.push(rx.blocking_recv()); // closed
    assert_eq!(
        (got, many),
        (vec![Some(1), Some(3), Some(5), None], vec![2, 4])
    );
    let s = read();
    let count = |class: &LazyWaitClass, op: Operation| {
        let idx = class_index(&s, class.name()).unwrap();
        s.long[EventKind::Wait.index()]
            .iter()
            .filter(|e| e.class == idx && e.operation == Some(op))
            .count()
    };
    assert_eq!(count(&BLOCKING_MUTEX, Operation::Lock), 3);
    assert_eq!(count(&BLOCKING_RWLOCK, Operation::ReadLock), 2);
    assert_eq!(count(&BLOCKING_RWLOCK, Operation::WriteLock), 1);
    assert_eq!(count(&BLOCKING_SEMAPHORE, Operation::Lock), 2);
    assert_eq!(count(&BLOCKING_CHANNEL, Operation::Wait), 2);
    let idx = class_index(&s, BLOCKING_MUTEX.name()).unwrap();
    assert_eq!(s.summary_of(idx).count, 3);
    no_lost_events(&s);
}

/// Two waits of one task at once (`join!` of two contended locks): each
/// wait's range is itself (`END_EVENT_ID` = `EVENT_ID` + 1), not the
/// sibling's ids taken meanwhile; both nest in the task's statement.
#[test]
fn concurrent_waits_of_one_task_do_not_contain_each_other() {
    segment();
    let rt = runtime();
    let (a, b) = (
        Arc::new(Mutex::new(&JOINED_A, ())),
        Arc::new(Mutex::new(&JOINED_B, ())),
    );
    let statement = rt.block_on(async {
        let (held_a, held_b) = (a.lock().await, b.lock().await);
        let gate = Arc::new(Gate::default());
        let (a2, b2, g2) = (a.clone(), b.clone(), gate.clone());
        let task = tokio::spawn(
            async move {
                let stmt = REQ.start_task();
                let id = stmt.id();
                g2.arrive();
                let (ga, gb) = tokio::join!(a2.lock(), b2.lock());
                drop((ga, gb, stmt));
                id
            }
            .pfs_task(),
        );
        gate.all_queued(1).await;
        drop(held_a);
        tokio::time::sleep(HOLD).await;
        drop(held_b);
        task.await.unwrap()
    });
    let s = read();
    for class in [&JOINED_A, &JOINED_B] {
        let idx = class_index(&s, class.name()).unwrap();
        let waits: Vec<_> = s.long[EventKind::Wait.index()]
            .iter()
            .filter(|e| e.class == idx)
            .collect();
        assert_eq!(waits.len(), 1, "{}", class.name());
        let w = waits[0];
        assert_eq!(w.end_event_id, Some(w.event_id + 1), "{w:?}");
        assert_eq!(
            (w.thread_id, w.nesting_event_id),
            (statement.0, Some(statement.1))
        );
    }
}

/// The owned blocking forms and the `const` constructors under tokio's
/// names: an acquisition that had to wait is one wait of the calling
/// thread, a free one records nothing.
#[test]
fn owned_blocking_forms_record_their_waits() {
    segment();
    static RW: RwLock<u32> = RwLock::const_with_max_readers(&OWNED_BLOCKING_RWLOCK, 0, 2);
    static N: Notify = Notify::const_new(&FREE_NOTIFY);
    N.notify_one();
    let m = Arc::new(Mutex::new(&OWNED_BLOCKING_MUTEX, 0u32));
    let sem = Arc::new(Semaphore::new(&OWNED_BLOCKING_SEMAPHORE, 1));
    *m.clone().blocking_lock_owned() += 1; // free: nothing recorded
    drop(sem.clone().blocking_acquire_owned().unwrap());
    contend(m.try_lock().unwrap(), 2, || {
        *m.clone().blocking_lock_owned() += 1
    });
    contend(sem.try_acquire().unwrap(), 1, || {
        drop(sem.clone().blocking_acquire_many_owned(1).unwrap())
    });
    // Two readers at most: a third waits.
    let (r1, r2) = (RW.try_read().unwrap(), RW.try_read().unwrap());
    assert!(RW.try_read().is_err(), "max_readers is 2");
    contend((r1, r2), 1, || drop(RW.blocking_read()));
    assert_eq!(*m.try_lock().unwrap(), 3);
    let s = read();
    let count = |class: &LazyWaitClass| s.summary_of(class_index(&s, class.name()).unwrap()).count;
    assert_eq!(count(&OWNED_BLOCKING_MUTEX), 2);
    assert_eq!(count(&OWNED_BLOCKING_SEMAPHORE), 1);
    assert_eq!(count(&OWNED_BLOCKING_RWLOCK), 1);
    no_lost_events(&s);
}

/// Inside async code, a blocking form panics as tokio's does when it
/// would have to wait; one that finds the lock free returns it (it is
/// tokio's `try_lock`).
#[test]
fn blocking_locks_in_async_code_panic_when_they_would_wait() {
    segment();
    let m = Mutex::new(&PANICKING_MUTEX, 0u32);
    let rt = runtime();
    let (free, contended) = rt.block_on(async {
        let free = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            *m.blocking_lock() += 1;
        }));
        let held = m.lock().await;
        let contended =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(m.blocking_lock())));
        drop(held);
        (free, contended)
    });
    assert!(free.is_ok(), "a free lock is taken");
    assert!(
        contended.is_err(),
        "tokio's blocking_lock panics in async code"
    );
    assert_eq!(*m.try_lock().unwrap(), 1);
    // The panicking acquisition waited for nothing: no wait recorded.
    let s = read();
    let idx = class_index(&s, PANICKING_MUTEX.name()).unwrap();
    assert_eq!(s.summary_of(idx).count, 0);
}

/// `spawn_blocking` is where tokio's blocking forms are meant to be used:
/// there (a thread with a runtime handle, not a worker) each acquisition
/// that had to wait is one wait of the blocking thread; a free one records
/// nothing.
#[test]
fn blocking_locks_in_spawn_blocking_record_their_waits() {
    segment();
    let rt = runtime();
    let m = Arc::new(Mutex::new(&SPAWN_BLOCKING_MUTEX, 0u32));
    let sem = Arc::new(Semaphore::new(&SPAWN_BLOCKING_SEMAPHORE, 1));
    let (tx, mut rx) = mpsc::channel::<u32>(&SPAWN_BLOCKING_CHANNEL, 1);
    let taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gate = Arc::new(Gate::default());
    let got = rt.block_on(async {
        let (m2, sem2, g2, t2) = (m.clone(), sem.clone(), gate.clone(), taken.clone());
        let blocked = tokio::task::spawn_blocking(move || {
            *m2.blocking_lock() += 1; // free: nothing recorded
            drop(sem2.blocking_acquire().unwrap()); // free
            g2.arrive();
            while !t2.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            *m2.blocking_lock() += 1; // waits for the lock's holder
            drop(sem2.blocking_acquire().unwrap()); // waits for the permit's
            rx.blocking_recv() // waits for the send
        });
        while gate.0.load(SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let held = m.lock().await;
        let permit = sem.acquire().await.unwrap();
        taken.store(true, SeqCst);
        tokio::time::sleep(HOLD).await;
        drop(held);
        tokio::time::sleep(HOLD).await;
        drop(permit);
        tokio::time::sleep(HOLD).await;
        tx.send(7).await.unwrap();
        blocked.await.unwrap()
    });
    assert_eq!(got, Some(7));
    let s = read();
    let count = |class: &LazyWaitClass| {
        let idx = class_index(&s, class.name()).unwrap();
        s.summary_of(idx).count
    };
    assert_eq!(count(&SPAWN_BLOCKING_MUTEX), 1);
    assert_eq!(count(&SPAWN_BLOCKING_SEMAPHORE), 1);
    assert_eq!(count(&SPAWN_BLOCKING_CHANNEL), 1);
    assert_eq!(*m.try_lock().unwrap(), 2);
    no_lost_events(&s);
}

/// `poll_recv` and `poll_recv_many`, as a hand-written future polls them:
/// a receive that found the channel empty is one wait however many polls
/// it took, nested in the task's statement; one that found a message (or
/// the channel closed) records nothing.
#[test]
fn polled_receives_record_one_wait_each() {
    segment();
    let rt = runtime();
    let waiter = rt.block_on(async {
        let (tx, mut rx) = mpsc::unbounded_channel::<u32>(&POLLED);
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let receiver = tokio::spawn(
            async move {
                let (stmt, w) = begin(1, Operation::Wait); // not staged
                let mut polls = 0;
                ready_tx.send(()).unwrap();
                let v = std::future::poll_fn(|cx| {
                    polls += 1;
                    rx.poll_recv(cx)
                })
                .await;
                assert_eq!(v, Some(1));
                assert!(polls >= 2, "waited across polls");
                ready_tx.send(()).unwrap();
                let mut got = Vec::new();
                let n = std::future::poll_fn(|cx| rx.poll_recv_many(cx, &mut got, 4)).await;
                assert_eq!((n, &got[..]), (1, &[2][..]));
                ready_tx.send(()).unwrap();
                // Buffered: nothing recorded.
                tx_wait(&mut rx, 3).await;
                drop(stmt);
                w
            }
            .pfs_task(),
        );
        for v in 1..=2 {
            ready_rx.recv().await.unwrap();
            tokio::time::sleep(HOLD).await;
            tx.send(v).unwrap();
        }
        ready_rx.recv().await.unwrap();
        tx.send(3).unwrap();
        drop(tx);
        receiver.await.unwrap()
    });
    let s = read();
    drop(rt);
    no_lost_events(&s);
    check_waits(&s, &POLLED, &[waiter; 2], HOLD, None);
}

/// Receives `want`, already buffered, then finds the channel closed,
/// through `poll_recv`.
async fn tx_wait(rx: &mut mpsc::UnboundedReceiver<u32>, want: u32) {
    // The sender sends `want` and drops once it has seen the second
    // receive; wait for that without polling the channel.
    while !rx.is_closed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        std::future::poll_fn(|cx| rx.poll_recv(cx)).await,
        Some(want)
    );
    assert_eq!(std::future::poll_fn(|cx| rx.poll_recv(cx)).await, None);
}
