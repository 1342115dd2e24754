//! Classes and strings registered while a snapshot runs: a writer keeps
//! registering statement classes (and interning source strings) and
//! recording one statement of each at once, while readers snapshot. Every
//! row a snapshot holds must name a class (and a string) that snapshot
//! has, and every statement summary must be read as one (its errors
//! figure, one per statement, equal to its count), whether the snapshot
//! is a full one or an incremental one that keeps rows between
//! snapshots.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

mod common;

use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
use pfs_shm_layout::reader::{IncrementalReader, ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::values::StatementFigures;
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{ClassKind, EventKind, Segment, SegmentConfig};

const CLASSES: u32 = 1000;

fn check(s: &SegmentSnapshot, what: &str) -> usize {
    let named = |c: u32| s.classes.iter().any(|k| k.index == c);
    let mut rows = 0;
    for t in &s.threads {
        for e in t.statements_current.iter().chain(&t.statements_history) {
            assert!(
                named(e.ev.class),
                "{what}: an event of class {} has no class",
                e.ev.class
            );
            let source = e.ev.source.expect("every statement has a source");
            assert!(
                s.strings.contains_key(&source),
                "{what}: an event's SOURCE {source} is not among the strings"
            );
        }
        for (c, r) in &t.rows {
            assert!(named(*c), "{what}: a summary row of class {c} has no class");
            assert_eq!(
                r.statement.errors, r.count,
                "{what}: class {c} read as a statement"
            );
            rows += 1;
        }
    }
    for (c, r) in &s.live_rows {
        assert!(named(*c), "{what}: a live row of class {c} has no class");
        assert_eq!(
            r.statement.errors, r.count,
            "{what}: class {c} read as a statement"
        );
        rows += 1;
    }
    rows
}

#[test]
fn rows_of_classes_registered_during_a_snapshot_are_named_and_read_as_their_kind() {
    let cfg = SegmentConfig {
        max_classes: CLASSES + 8,
        max_strings: CLASSES + 8,
        ..common::config("classes", 4, 2)
    };
    let (file, w) = common::create(&cfg);
    let slot = w.alloc_thread(1, 1, "registrar").unwrap();
    let done = AtomicBool::new(false);
    let reading = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let rec = w.segment().record(slot.index);
            while !reading.load(Relaxed) {
                std::hint::spin_loop();
            }
            for i in 0..CLASSES {
                let name = format!("statement/test/s{i}");
                let class = w
                    .register_class(&name, ClassKind::Statement, FLAG_ENABLED | FLAG_TIMED)
                    .unwrap();
                let source = w.intern(&format!("registrar.rs:{i}")).unwrap();
                let id = u64::from(i) + 1;
                let e = EventData {
                    event_id: id,
                    end_event_id: id,
                    class,
                    timer_start: id * 10,
                    timer_end: id * 10 + 5,
                    timer_wait: 5_000,
                    source,
                    object_name: NONE_U32,
                    flags: EV_TIMED | EV_ENDED,
                    event_type: EventKind::Statement as u32,
                    thread_id: 1,
                    ..Default::default()
                };
                let f = StatementFigures {
                    errors: 1,
                    ..Default::default()
                };
                rec.end_event(EventKind::Statement, &e, Some(&f), true, true);
                rec.summarize(
                    class as usize,
                    EventKind::Statement,
                    true,
                    5_000,
                    0,
                    Some(&f),
                );
                // Leave the readers time to start snapshots between two
                // registrations.
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_micros(50) {
                    std::hint::spin_loop();
                }
            }
            done.store(true, Relaxed);
        });
        scope.spawn(|| {
            let seg = Segment::open(file.try_clone().unwrap(), false).unwrap();
            let mut inc = IncrementalReader::default();
            let mut snaps = 0;
            while !done.load(Relaxed) {
                let full = snapshot(&seg, &ReadOptions::default()).unwrap();
                check(&full, "full snapshot");
                let summed = inc.snapshot(&seg, &ReadOptions::summaries()).unwrap();
                check(&summed, "incremental snapshot");
                snaps += 1;
                reading.store(true, Relaxed);
            }
            // The incremental reader's kept rows, once everything is
            // written: one statement, one error per class.
            let last = inc.snapshot(&seg, &ReadOptions::summaries()).unwrap();
            assert_eq!(check(&last, "last incremental snapshot"), CLASSES as usize);
            assert!(
                snaps > 2,
                "the readers overlapped the writer: {snaps} snapshots"
            );
        });
    });
}
