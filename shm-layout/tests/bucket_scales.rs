//! The histogram scales of layout 8.0 through the real writer and reader:
//! a wait's buckets span 7.45 ns to 8 s, a stage's and a statement's
//! 954 ns to 1024 s; a 7.x segment (every kind in the wait scale) is read
//! in the new scales, by a plain snapshot, an incremental one, and from
//! the global rows an exiting thread folded into.

use std::sync::atomic::Ordering::Relaxed;

mod common;

use pfs_shm_layout::layout::{BucketScale, FLAG_ENABLED, FLAG_TIMED, HISTOGRAM_BUCKETS};
use pfs_shm_layout::reader::{IncrementalReader, ReadOptions, Summary, snapshot};
use pfs_shm_layout::values::StatementFigures;
use pfs_shm_layout::{ClassKind, EventKind, Segment, SegmentConfig};

const US: u64 = 1_000_000;
const S: u64 = 1_000_000_000_000;

/// A wait of 100 ns, a stage of 5 ms and statements of 1 µs, 3 s and 20 s,
/// summarised as a writer of major `major` does (a 7.x writer put every
/// kind in the wait scale). Returns the file, the writer, the classes
/// (wait, stage, statement) and the thread's slot.
fn segment(
    major: u32,
) -> (
    std::fs::File,
    pfs_shm_layout::SegmentWriter,
    [usize; 3],
    pfs_shm_layout::writer::ThreadSlot,
) {
    let (file, w) = common::create(&SegmentConfig::default());
    let on = FLAG_ENABLED | FLAG_TIMED;
    let reg = |name, kind| w.register_class(name, kind, on).unwrap() as usize;
    let classes = [
        reg("wait/synch/mutex/t/m", ClassKind::Mutex),
        reg("stage/t/s", ClassKind::Stage),
        reg("statement/t/q", ClassKind::Statement),
    ];
    let t = w.alloc_thread(1, 1, "t1").unwrap();
    let rec = w.segment().record(t.index);
    // As its writer: 8.x by kind; 7.x the wait scale for all.
    let as_written = |kind| if major >= 8 { kind } else { EventKind::Wait };
    rec.summarize(
        classes[0],
        as_written(EventKind::Wait),
        true,
        100_000,
        0,
        None,
    );
    rec.summarize(
        classes[1],
        as_written(EventKind::Stage),
        true,
        5_000 * US,
        0,
        None,
    );
    let f = StatementFigures {
        rows_sent: 1,
        ..StatementFigures::default()
    };
    for ps in [US, 3 * S, 20 * S] {
        rec.summarize(
            classes[2],
            as_written(EventKind::Statement),
            true,
            ps,
            0,
            Some(&f),
        );
    }
    w.segment().header().major.store(major, Relaxed);
    (file, w, classes, t)
}

/// The row of `class` in `rows`.
fn row(rows: &[(u32, Summary)], class: usize) -> Summary {
    rows.iter().find(|(c, _)| *c as usize == class).unwrap().1
}

/// The buckets with one event each, in `s`'s scale, and what they sum to.
fn filled(s: &Summary) -> (Vec<usize>, u64) {
    let at = (0..HISTOGRAM_BUCKETS)
        .filter(|&i| s.buckets[i] != 0)
        .collect();
    (at, s.buckets.iter().sum())
}

/// What a reader of this crate must find, whatever the segment's major:
/// the wait in the wait scale, the stage and the statements in the long
/// one; a 7.x statement above 8 s in (8 s, 16 s], an 8.x one in its own
/// bucket.
fn check(rows: &[(u32, Summary)], classes: [usize; 3], major: u32) {
    let (short, long) = (BucketScale::Short, BucketScale::Long);
    let wait = row(rows, classes[0]);
    assert_eq!(wait.scale, short);
    assert_eq!(filled(&wait), (vec![short.index(100_000)], 1));
    let stage = row(rows, classes[1]);
    assert_eq!(stage.scale, long);
    assert_eq!(filled(&stage), (vec![long.index(5_000 * US)], 1));
    let stmt = row(rows, classes[2]);
    assert_eq!(stmt.scale, long);
    let top = if major >= 8 { 20 * S } else { 16 * S };
    assert_eq!(
        filled(&stmt),
        (vec![long.index(US), long.index(3 * S), long.index(top)], 3),
        "major {major}"
    );
    assert_eq!(stmt.statement.rows_sent, 3);
    assert_eq!((stmt.count, stmt.timed_count), (3, 3));
    assert_eq!(stmt.max_ps, 20 * S, "MAX exact, whatever the buckets");
    assert!(stmt.quantile_ps(999, 1000) >= 16 * S);
}

#[test]
fn every_reader_gives_the_long_scale_to_stages_and_statements_of_7x_and_8x() {
    for major in [7, 8] {
        let (file, w, classes, t) = segment(major);
        let reader = Segment::open(file.try_clone().unwrap(), false).unwrap();
        assert_eq!(reader.major_version(), major);
        let full = snapshot(&reader, &ReadOptions::default()).unwrap();
        check(&full.threads[0].rows, classes, major);
        let mut inc = IncrementalReader::default();
        for _ in 0..2 {
            // The second time from what it kept.
            let s = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
            check(&s.live_rows, classes, major);
        }
        // Folded into the global rows when the thread exits.
        w.fold_and_free(t);
        let after = snapshot(&reader, &ReadOptions::default()).unwrap();
        check(&after.exited, classes, major);
    }
}
