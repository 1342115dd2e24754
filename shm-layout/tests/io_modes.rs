//! A file or socket class's waits by I/O mode (layout 8.1, the row's I/O
//! words): written with the row's other figures, read exactly by full and
//! incremental snapshots, folded into the global row when a thread exits,
//! and never written for other classes.

mod common;

use pfs_shm_layout::layout::{FLAG_ENABLED, FLAG_TIMED};
use pfs_shm_layout::reader::{IncrementalReader, ReadOptions, snapshot};
use pfs_shm_layout::values::IoFigures;
use pfs_shm_layout::writer::StatementFigures;
use pfs_shm_layout::{ClassKind, EventKind, IoMode, Segment, SegmentConfig};

#[test]
fn waits_by_mode_are_exact_through_reads_and_folds() {
    let cfg = SegmentConfig {
        max_classes: 16,
        records_per_page: 4,
        max_pages: 2,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let on = FLAG_ENABLED | FLAG_TIMED;
    let wal = w
        .register_class("wait/io/file/t/wal", ClassKind::File, on)
        .unwrap();
    let sock = w
        .register_class("wait/io/socket/t/conn", ClassKind::Socket, on)
        .unwrap();
    let mutex = w
        .register_class("wait/synch/mutex/t/m", ClassKind::Mutex, on)
        .unwrap();
    let stmt = w
        .register_class("statement/t/q", ClassKind::Statement, on)
        .unwrap();
    let reader = Segment::open(file, false).unwrap();
    let mut inc = IncrementalReader::default();

    // (mode, wait in ps, bytes) of each wait, on two threads; the first
    // exits half way.
    let waits = [
        (IoMode::Write, 3_000_000, 4096),
        (IoMode::Misc, 2_000_000_000, 0), // a 2 ms fsync
        (IoMode::Read, 1_500, 100),       // 1.5 ns: 1 ns once in ns
        (IoMode::Write, 7_000_000, 512),
        (IoMode::Misc, 9_000, 0),
    ];
    let mut want = IoFigures::default();
    let (mut count, mut bytes) = (0, 0);
    let a = w.alloc_thread(1, 1, "a").unwrap();
    let b = w.alloc_thread(2, 2, "b").unwrap();
    let mut id = 0;
    for (i, &(mode, ps, n)) in waits.iter().enumerate() {
        // (Thread a's waits before it exits, b's after.)
        let rec = w.segment().record(if i % 2 == 0 && i <= 2 {
            a.index
        } else {
            b.index
        });
        for class in [wal, sock] {
            id += 1;
            common::record_io(rec, &common::wait_event(class, id, ps), mode, n);
        }
        want.count[mode.index()] += 1;
        want.sum_ns[mode.index()] += ps / 1000;
        if let Some(b) = want.bytes.get_mut(mode.index()) {
            *b += n;
        }
        count += 1;
        bytes += n;
        // A lock's wait and a statement beside them: no I/O words.
        id += 1;
        common::record_wait(rec, &common::wait_event(mutex, id, ps));
        let f = StatementFigures {
            errors: 1,
            rows_sent: 3,
            ..StatementFigures::default()
        };
        rec.summarize(stmt as usize, EventKind::Statement, true, ps, 0, &f);
        if i == 2 {
            // Thread a exits: its rows fold into the global section.
            let full = snapshot(&reader, &ReadOptions::summaries()).unwrap();
            assert_eq!(common::total(&full, wal).io.count(mode), 1);
            w.fold_and_free(a);
        }
    }
    let full = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    let kept = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
    let again = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
    for s in [&full, &kept, &again] {
        for class in [wal, sock] {
            let t = common::total(s, class);
            assert_eq!(t.io, want, "class {class}");
            assert_eq!(t.count, count);
            assert_eq!(t.bytes, bytes);
            assert_eq!(t.io.count.iter().sum::<u64>(), t.count, "the modes add up");
            assert_eq!(t.statement, StatementFigures::default());
        }
        assert_eq!(common::total(s, mutex).io, IoFigures::ZERO);
        let q = common::total(s, stmt);
        assert_eq!(q.io, IoFigures::ZERO);
        assert_eq!((q.statement.errors, q.statement.rows_sent), (5, 15));
    }
    assert_eq!(want.sum_ns, [1, 10_000, 2_000_009]);
    assert_eq!(want.bytes, [100, 4608]);
    assert!(!full.exited.is_empty(), "a thread's rows were folded");
}

/// A record reused by a new thread starts with zero I/O words (the
/// previous thread's were folded), like its other figures.
#[test]
fn a_reused_record_starts_from_zero() {
    let cfg = SegmentConfig {
        max_classes: 8,
        records_per_page: 1,
        max_pages: 1,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let on = FLAG_ENABLED | FLAG_TIMED;
    let wal = w
        .register_class("wait/io/file/t/wal", ClassKind::File, on)
        .unwrap();
    let reader = Segment::open(file, false).unwrap();
    let first = w.alloc_thread(1, 1, "first").unwrap();
    let rec = w.segment().record(first.index);
    common::record_io(rec, &common::wait_event(wal, 1, 5_000), IoMode::Read, 10);
    w.fold_and_free(first);
    let second = w.alloc_thread(2, 2, "second").unwrap();
    assert_eq!(second.index, first.index, "the record is reused");
    let rec = w.segment().record(second.index);
    common::record_io(rec, &common::wait_event(wal, 2, 7_000), IoMode::Write, 20);
    let s = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    let live: Vec<_> = s.live_rows.iter().filter(|(c, _)| *c == wal).collect();
    assert_eq!(live.len(), 1);
    let io = live[0].1.io;
    assert_eq!(
        (io.count, io.bytes, io.sum_ns),
        ([0, 1, 0], [0, 20], [0, 7, 0])
    );
    assert_eq!(common::total(&s, wal).io.count, [1, 1, 0]);
}
