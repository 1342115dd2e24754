//! Memory rows through the real writer and reader: the manual's
//! aggregation example, with the truncation generation.

use std::sync::atomic::Ordering::Relaxed;

mod common;

use pfs_shm_layout::layout::FLAG_ENABLED;
use pfs_shm_layout::reader::{MemoryStats, ReadOptions, snapshot};
use pfs_shm_layout::{ClassKind, Segment, SegmentConfig};

const MB: u64 = 1 << 20;

#[test]
fn manual_example_account_low_high_are_sums() {
    let (file, w) = common::create(&SegmentConfig::default());
    let c = w
        .register_class("memory/test/m", ClassKind::Memory, FLAG_ENABLED)
        .unwrap() as usize;
    let gen_word = &w.segment().setup().memory_truncate_gen;
    let (s1, s2) = (
        w.alloc_thread(1, 1, "t1").unwrap(),
        w.alloc_thread(2, 2, "t2").unwrap(),
    );
    let (r1, r2) = (w.segment().record(s1.index), w.segment().record(s2.index));
    r1.memory_alloc(c, MB, 0);
    r2.memory_alloc(c, 10 * MB, 0);
    // TRUNCATE: LOW = HIGH = CURRENT (1 MB and 10 MB).
    gen_word.store(1, Relaxed);
    let g = gen_word.load(Relaxed);
    r1.memory_alloc(c, MB, g); // 2 MB
    r1.memory_free(c, MB, g); // back to 1 MB
    r2.memory_alloc(c, 2 * MB, g); // 12 MB
    r2.memory_free(c, 2 * MB, g); // back to 10 MB
    let reader = Segment::open(file, false).unwrap();
    let snap = snapshot(&reader, &ReadOptions::default()).unwrap();
    let mut account = MemoryStats::default();
    for t in &snap.threads {
        for (_, m) in &t.memory {
            account.merge(m);
        }
    }
    assert_eq!(
        (account.low_bytes, account.high_bytes),
        (11 * MB as i64, 14 * MB as i64)
    );
    assert_eq!(account.current_bytes, 11 * MB as i64);
    // Thread 2 exits: its row folds into the global row, watermarks add.
    w.fold_and_free(s2);
    let snap = snapshot(&reader, &ReadOptions::default()).unwrap();
    assert_eq!(snap.exited_memory.len(), 1);
    let (_, g2) = snap.exited_memory[0];
    assert_eq!(
        (g2.low_bytes, g2.current_bytes, g2.high_bytes),
        (10 * MB as i64, 10 * MB as i64, 12 * MB as i64)
    );
    // Another truncation: rows not touched since read LOW = HIGH = CURRENT.
    gen_word.store(2, Relaxed);
    let snap = snapshot(&reader, &ReadOptions::default()).unwrap();
    let m = snap.threads[0].memory[0].1;
    assert_eq!((m.low_bytes, m.high_bytes), (MB as i64, MB as i64));
    let g3 = snap.exited_memory[0].1;
    assert_eq!(
        (g3.low_bytes, g3.high_bytes),
        (10 * MB as i64, 10 * MB as i64)
    );
    assert_eq!(g3.count_alloc, 2);
}

/// A segment of layout 5.x (a process built with the previous client,
/// during a rolling upgrade) is read, its memory rows at their 5.x
/// offsets, CURRENT as stored; majors this reader does not know are
/// refused.
#[test]
fn a_5x_segment_is_read_with_its_own_memory_rows() {
    use pfs_shm_layout::SegmentError;
    use pfs_shm_layout::layout::LAYOUT_MAJOR;
    use pfs_shm_layout::segment::v5_memory_row;

    let (file, w) = common::create(&SegmentConfig::default());
    let c = w
        .register_class("memory/test/v5", ClassKind::Memory, FLAG_ENABLED)
        .unwrap() as usize;
    let t = w.alloc_thread(1, 1, "t1").unwrap();
    let rec = w.segment().record(t.index);
    // A real update marks the row touched and moves its sequence; then
    // the words are rewritten as a 5.x writer would have left them.
    rec.memory_alloc(c, 1, 0);
    let v5 = v5_memory_row(&rec.memory_rows()[c]);
    let words: [(&std::sync::atomic::AtomicU64, i64); 11] = [
        (&v5.count_alloc, 5),
        (&v5.count_free, 2),
        (&v5.sum_bytes_alloc, 500),
        (&v5.sum_bytes_free, 150),
        (&v5.low_count_used, -1),
        (&v5.current_count_used, 3),
        (&v5.high_count_used, 4),
        (&v5.low_bytes_used, -50),
        (&v5.current_bytes_used, 350),
        (&v5.high_bytes_used, 420),
        (&v5.truncate_gen, 0),
    ];
    for (a, v) in words {
        a.store(v as u64, Relaxed);
    }
    let header = &w.segment().header().major;
    header.store(5, Relaxed);
    let reader = Segment::open(file.try_clone().unwrap(), false).unwrap();
    assert_eq!(reader.major_version(), 5);
    let snap = snapshot(&reader, &ReadOptions::default()).unwrap();
    let m = snap.threads[0].memory[0].1;
    assert_eq!(
        (m.count_alloc, m.count_free, m.bytes_alloc, m.bytes_free),
        (5, 2, 500, 150)
    );
    assert_eq!(
        (m.low_count, m.current_count, m.high_count),
        (-1, 3, 4),
        "counts at their 5.x offsets"
    );
    assert_eq!(
        (m.low_bytes, m.current_bytes, m.high_bytes),
        (-50, 350, 420),
        "bytes at their 5.x offsets"
    );
    for major in [4, LAYOUT_MAJOR + 1] {
        header.store(major, Relaxed);
        assert!(
            matches!(
                Segment::open(file.try_clone().unwrap(), false),
                Err(SegmentError::UnsupportedVersion { found, .. }) if found == major
            ),
            "major {major} is refused"
        );
    }
}
