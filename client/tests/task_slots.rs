//! Task slots, read back from the real segment: many tasks awaiting at
//! once each show their open statement (with its own text) and stage in a
//! slot; beyond the configured number of slots a task is counted lost
//! (once) instead, never shown twice or with another's text; slots come
//! back when tasks end and serve the next ones. One test function: `init`
//! is once per process.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::read;
use pfs_client::task::TaskExt;
use pfs_client::{LazyStageClass, LazyStatementClass};
use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::SegmentSnapshot;

static REQUEST: LazyStatementClass = LazyStatementClass::new("statement/test/slot_request");
static BACKEND: LazyStageClass = LazyStageClass::new("stage/test/backend");

const SLOTS: u32 = 24;

/// Statements shown by task slots: `THREAD_ID` → (text, stage shown).
fn parked(s: &SegmentSnapshot) -> BTreeMap<u64, (String, bool)> {
    let mut out = BTreeMap::new();
    for t in &s.tasks {
        if let Some(c) = &t.statements_current {
            let stage = t.stages_current.as_ref().is_some_and(|g| {
                g.thread_id == c.ev.thread_id && g.nesting_event_id == Some(c.ev.event_id)
            });
            let old = out.insert(c.ev.thread_id, (c.text.clone(), stage));
            assert!(old.is_none(), "task {} shown twice", c.ev.thread_id);
        }
    }
    out
}

fn lost_of(s: &SegmentSnapshot) -> u64 {
    s.lost[LostKind::TaskSlots as usize]
}

/// Spawns `n` tasks that open a statement (text `"<wave> <i>"`) and a
/// stage, and await `go`; returns when all have started, with their ids.
fn wave(
    rt: &tokio::runtime::Runtime,
    wave: &str,
    n: usize,
) -> (
    Vec<tokio::task::JoinHandle<()>>,
    tokio::sync::watch::Sender<bool>,
    BTreeMap<u64, String>,
) {
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let (ids_tx, ids_rx) = std::sync::mpsc::channel();
    let handles = (0..n)
        .map(|i| {
            let mut go = go_rx.clone();
            let ids = ids_tx.clone();
            let text = format!("{wave} {i}");
            rt.spawn(
                async move {
                    let mut stmt = REQUEST.start_task();
                    stmt.set_text(&text);
                    BACKEND.enter();
                    ids.send((stmt.id().0, text)).unwrap();
                    go.wait_for(|go| *go).await.unwrap();
                    tokio::task::yield_now().await;
                    drop(stmt);
                }
                .pfs_task(),
            )
        })
        .collect();
    let ids = (0..n)
        .map(|_| ids_rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    (handles, go_tx, ids)
}

/// Reads until every task of `ids` is either shown by a slot or counted
/// lost (a task parks when its first poll returns, just after it said its
/// id): returns what the slots show and the losses of this wave.
fn settled(
    path: &std::path::Path,
    ids: &BTreeMap<u64, String>,
    lost_before: u64,
) -> (BTreeMap<u64, (String, bool)>, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = read(path);
        let shown: BTreeMap<_, _> = parked(&s)
            .into_iter()
            .filter(|(tid, _)| ids.contains_key(tid))
            .collect();
        let lost = lost_of(&s) - lost_before;
        if shown.len() as u64 + lost == ids.len() as u64 {
            return (shown, lost);
        }
        assert!(
            Instant::now() < deadline,
            "{} shown + {lost} lost of {} tasks",
            shown.len(),
            ids.len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn awaiting_tasks_show_in_slots_up_to_the_limit_and_slots_come_back() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new("task-slots")
            .shm_dir(dir.path())
            .task_slots(SLOTS),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // Fewer tasks than slots: every one is shown, with its own text and
    // its stage nested in its statement; none is lost.
    let (handles, go, ids) = wave(&rt, "first", 10);
    let (shown, lost) = settled(&path, &ids, 0);
    assert_eq!(lost, 0);
    for (tid, text) in &ids {
        assert_eq!(shown.get(tid), Some(&(text.clone(), true)), "task {tid}");
    }
    go.send(true).unwrap();
    for h in handles {
        rt.block_on(h).unwrap();
    }
    assert!(
        parked(&read(&path)).is_empty(),
        "ended tasks' slots are empty"
    );

    // More tasks than slots: each is shown or counted lost, once.
    let (handles, go, ids) = wave(&rt, "second", 60);
    let (shown, lost) = settled(&path, &ids, 0);
    assert_eq!((shown.len(), lost), (SLOTS as usize, 60 - u64::from(SLOTS)));
    for (tid, (text, stage)) in &shown {
        assert_eq!(Some(text), ids.get(tid), "task {tid} shows another's text");
        assert!(stage);
    }
    go.send(true).unwrap();
    for h in handles {
        rt.block_on(h).unwrap();
    }
    let s = read(&path);
    assert!(parked(&s).is_empty());
    assert_eq!(lost_of(&s), lost, "nothing lost after the tasks ended");
    let used = Segment::open(std::fs::File::open(&path).unwrap(), false)
        .unwrap()
        .tasks()
        .map(|(h, _)| h.used.load(std::sync::atomic::Ordering::Relaxed))
        .unwrap();
    assert_eq!(used, SLOTS, "every slot was handed out");

    // The slots came back: a new wave is shown again.
    let lost_before = lost_of(&s);
    let (handles, go, ids) = wave(&rt, "third", 8);
    let (shown, lost) = settled(&path, &ids, lost_before);
    assert_eq!((shown.len(), lost), (8, 0));
    go.send(true).unwrap();
    for h in handles {
        rt.block_on(h).unwrap();
    }

    // A task refused a slot (all taken) takes one at a later poll, once
    // one is free, and is counted lost once.
    let lost_before = lost_of(&read(&path));
    let (handles, go, ids) = wave(&rt, "fourth", SLOTS as usize);
    settled(&path, &ids, lost_before);
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let late = rt.spawn(
        async move {
            let mut stmt = REQUEST.start_task();
            stmt.set_text("late");
            id_tx.send(stmt.id().0).unwrap();
            while !*done_rx.borrow() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        .pfs_task(),
    );
    let late_id = id_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lost_of(&read(&path)) == lost_before {
        assert!(Instant::now() < deadline, "the late task was not refused");
        std::thread::sleep(Duration::from_millis(5));
    }
    go.send(true).unwrap();
    for h in handles {
        rt.block_on(h).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = read(&path);
        if let Some(shown) = parked(&s).get(&late_id) {
            assert_eq!(shown.0, "late");
            assert_eq!(lost_of(&s), lost_before + 1, "counted once");
            break;
        }
        assert!(Instant::now() < deadline, "the late task never got a slot");
        std::thread::sleep(Duration::from_millis(5));
    }
    done_tx.send(true).unwrap();
    rt.block_on(late).unwrap();
    drop(rt);
}
