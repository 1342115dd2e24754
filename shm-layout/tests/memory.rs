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
