//! A segment whose header is sound but whose rows hold any bytes (a buggy
//! or compromised writer scribbling over its own records) never takes the
//! agent down: every table, `/metrics` and `query` answer, over rows of
//! every kind of instrument (waits, file and socket waits with their
//! figures by mode, stages, statements, memory) whose words are all ones
//! or random. The agent binary under test is a debug build, so an
//! arithmetic overflow on such figures would panic here, not only wrap.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use pfs_agent::testing::segment_at;
use pfs_shm_layout::layout::{
    EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32, SummaryRow, rows_offset,
};
use pfs_shm_layout::writer::{EventData, RowExtra};
use pfs_shm_layout::{ClassKind, EventKind, IoMode, SegmentConfig, SegmentWriter};
use pfs_tests::{Agent, agent_bin};

/// Every kind of row the agent reads, by class name.
const CLASSES: [(&str, ClassKind); 7] = [
    ("wait/synch/mutex/hostile/m", ClassKind::Mutex),
    ("wait/io/file/hostile/f", ClassKind::File),
    ("wait/io/socket/hostile/s", ClassKind::Socket),
    ("idle", ClassKind::Idle),
    ("stage/hostile/s", ClassKind::Stage),
    ("statement/hostile/q", ClassKind::Statement),
    ("memory/hostile/m", ClassKind::Memory),
];

/// A live segment at `path` with two threads that each recorded one event
/// of every class (so every row is touched and read); returns its file
/// (holding its lock) and writer.
fn make_segment(path: &Path) -> (File, SegmentWriter) {
    let cfg = SegmentConfig {
        service_name: "hostile-rows".into(),
        history_len: 4,
        max_classes: 16,
        max_strings: 16,
        records_per_page: 2,
        max_pages: 2,
        history_long_len: 4,
        task_slots: 4,
    };
    let (file, w) = segment_at(path, &cfg, std::process::id(), true);
    let classes: Vec<(u32, ClassKind)> = CLASSES
        .iter()
        .map(|(n, k)| {
            let c = w.register_class(n, *k, FLAG_ENABLED | FLAG_TIMED).unwrap();
            (c, *k)
        })
        .collect();
    for t in 1..=2 {
        let slot = w.alloc_thread(t, t, "scribbler").unwrap();
        let rec = w.segment().record(slot.index);
        for (i, &(c, kind)) in classes.iter().enumerate() {
            let id = i as u64 + 1;
            let ev = match kind {
                ClassKind::Memory => {
                    rec.memory_alloc(c as usize, 64, 0);
                    continue;
                }
                ClassKind::Stage => EventKind::Stage,
                ClassKind::Statement => EventKind::Statement,
                _ => EventKind::Wait,
            };
            let e = EventData {
                event_id: id,
                end_event_id: id + 1,
                class: c,
                timer_wait: 1000,
                flags: EV_TIMED | EV_ENDED,
                event_type: EventKind::wire(Some(ev)),
                source: NONE_U32,
                object_name: NONE_U32,
                ..Default::default()
            };
            rec.end_event(ev, &e, None, true, true);
            match kind {
                ClassKind::File => {
                    rec.summarize(c as usize, ev, true, 1000, 10, RowExtra::Io(IoMode::Read))
                }
                _ => rec.summarize(c as usize, ev, true, 1000, 0, None),
            }
        }
    }
    (file, w)
}

/// Overwrites, through the file, every row of the segment's records (the
/// summary and memory rows, not their sequences) with `byte(i)` for the
/// `i`-th byte: the row sequences stay even, so the reader takes them.
fn scribble_rows(path: &Path, w: &SegmentWriter, byte: impl Fn(usize) -> u8) {
    let seg = w.segment();
    let g = *seg.geometry();
    let f = File::options().write(true).open(path).unwrap();
    for idx in 0..2 {
        let off = g.record_body_off(idx) + rows_offset(g.history_len);
        let len = g.max_classes as usize * size_of::<SummaryRow>();
        let junk: Vec<u8> = (0..len).map(&byte).collect();
        f.write_all_at(&junk, off as u64).unwrap();
    }
}

/// Every table and `/metrics` answer 200 over the segment in `dir`, and
/// `query` prints every table; then the agent is still healthy.
fn every_view_answers(dir: &Path, what: &str) {
    let agent = Agent::serve(dir).unwrap();
    for t in pfs_agent::tables::names() {
        let r = agent.get(&format!("/api/v1/tables/{t}")).unwrap();
        assert_eq!(r.status, 200, "{what}: {t}: {}", r.body);
        let out = Command::new(agent_bin())
            .args(["query", t, "--shm-dir", dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: query {t}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The rows are read: the mutex's two events, or what was scribbled.
    let t = agent
        .table("events_waits_summary_global_by_event_name")
        .unwrap();
    let count = pfs_tests::rows(&t)
        .unwrap()
        .iter()
        .find(|r| r["event_name"] == CLASSES[0].0)
        .map(|r| r["count_star"].clone());
    let count = count.unwrap_or_else(|| panic!("{what}: no row for the mutex: {t}"));
    assert_eq!(
        count.as_u64() == Some(2),
        what == "before",
        "{what}: {count}"
    );
    let m = agent.get("/metrics").unwrap();
    assert_eq!(m.status, 200, "{what}: /metrics: {}", m.body);
    assert!(
        m.body.contains("hostile-rows"),
        "{what}: the segment is read"
    );
    let mut agent = agent;
    let h = agent.get("/healthz").unwrap();
    assert_eq!(h.status, 200, "{what}: {}", h.body);
    assert!(agent.guard.try_wait().is_none(), "{what}: the agent runs");
    assert!(
        !agent.guard.stderr().contains("panicked"),
        "{what}: {}",
        agent.guard.describe()
    );
}

#[test]
fn rows_of_any_bytes_never_take_the_agent_down() {
    for (what, byte) in [
        ("all ones", (|_| 0xff) as fn(usize) -> u8),
        ("random", |i| {
            (i as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(17)
                .wrapping_mul(0x2545_f491_4f6c_dd1d)
                .to_le_bytes()[7]
        }),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostile-rows.1.pfs");
        let (_file, w) = make_segment(&path);
        every_view_answers(dir.path(), "before");
        scribble_rows(&path, &w, byte);
        every_view_answers(dir.path(), what);
    }
}
