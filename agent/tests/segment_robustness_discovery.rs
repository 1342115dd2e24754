//! Segment discovery against damaged or half-written segment files: real
//! segments written by the writer API, then modified byte-wise, read by the
//! agent's library (`SegmentSet`, `Snapshotter`).
//!
//! * a global section whose sequence lock is left odd (a writer killed in
//!   the middle of a thread-exit fold): counted and reported, never
//!   hidden; for a dead owner read as it is and retired with its figures;
//! * a file still being created (first page all zeros): not refused;
//! * an undefined header state: corrupt at once;
//! * a misaligned section, or one overlapping the header: said so.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use pfs_agent::aggregate::segment_global;
use pfs_agent::segments::{Refusal, SegmentSet};
use pfs_agent::snapshot::Snapshotter;
use pfs_agent::testing::record_waits;
use pfs_shm_layout::layout::{FLAG_ENABLED, FLAG_TIMED};
use pfs_shm_layout::{
    ClassKind, Segment, SegmentConfig, SegmentWriter, ThreadSlot, TimerCalibration,
};

const CLASS: &str = "wait/synch/mutex/t/robust";

/// A real segment at `path`: one thread that recorded 3 waits and exited
/// (folded into the global section), one live thread with 2 waits. With
/// `live`, the returned file holds the owner's lock.
fn segment(path: &Path, live: bool) -> (File, SegmentWriter, ThreadSlot) {
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap();
    if live {
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    }
    let cfg = SegmentConfig {
        service_name: "robust".into(),
        history_len: 2,
        max_classes: 8,
        max_strings: 8,
        records_per_page: 4,
        max_pages: 2,
        history_long_len: 1,
        task_slots: 4,
    };
    let seg = Segment::create(
        file.try_clone().unwrap(),
        &cfg,
        TimerCalibration::NANOSECONDS,
        4242,
        0,
    )
    .unwrap();
    let w = SegmentWriter::new(seg);
    let class = w
        .register_class(CLASS, ClassKind::Mutex, FLAG_ENABLED | FLAG_TIMED)
        .unwrap();
    let gone = w.alloc_thread(1, 11, "gone").unwrap();
    record_waits(&w, gone.index, class, 3);
    w.fold_and_free(gone);
    let stays = w.alloc_thread(2, 12, "stays").unwrap();
    record_waits(&w, stays.index, class, 2);
    (file, w, stays)
}

/// Byte offset in the file of a field of the writer's mapping.
fn offset_of_field<T>(w: &SegmentWriter, field: &T) -> u64 {
    let base = w.segment().header() as *const _ as usize;
    (field as *const T as usize - base) as u64
}

/// Sets the global section's sequence lock to `seq`, as a writer killed
/// in the middle of a fold leaves it (odd).
fn set_global_seq(file: &File, w: &SegmentWriter, seq: u64) {
    let at = offset_of_field(w, &w.segment().global_header().seq);
    assert_eq!(
        at,
        w.segment().geometry().global_off as u64,
        "seq is the section's first word"
    );
    file.write_all_at(&seq.to_le_bytes(), at).unwrap();
}

fn global_seq(w: &SegmentWriter) -> u64 {
    w.segment().global_header().seq.sequence()
}

#[test]
fn a_stuck_global_lock_of_a_live_process_is_counted_and_reported_not_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.1.pfs");
    let (file, w, _) = segment(&path, true);
    let even = global_seq(&w);
    assert_eq!(even & 1, 0);
    set_global_seq(&file, &w, even + 1);
    let snap = Snapshotter::new(
        SegmentSet::new(dir.path(), Duration::from_secs(60)).with_not_ready_grace(Duration::ZERO),
        Duration::ZERO,
    );
    let s = snap.take_summaries();
    assert!(s.segments.is_empty(), "nothing consistent to export yet");
    assert_eq!(
        s.invalid
            .iter()
            .map(|(p, r, _)| (p.clone(), *r))
            .collect::<Vec<_>>(),
        vec![(path.clone(), Refusal::GlobalLockStuck)],
        "the segment is counted (as invalid), with its real reason"
    );
    let msg = &s.invalid[0].2;
    assert!(
        msg.contains("stayed locked") && !msg.contains("0 folds"),
        "not reported as a fold storm: {msg}"
    );
    assert_eq!(s.errors.get(&Refusal::GlobalLockStuck), Some(&1));
    assert_eq!(s.errors.get(&Refusal::FoldStorm), None);
    // Still stuck: reported once, still counted; the file stays.
    let s = snap.take_summaries();
    assert_eq!(s.errors.get(&Refusal::GlobalLockStuck), Some(&1));
    assert_eq!(s.invalid.len(), 1);
    assert!(path.exists());
    // The fold finishes (a stopped process resumed): exported again.
    set_global_seq(&file, &w, even + 2);
    let s = snap.take_summaries();
    assert!(s.invalid.is_empty());
    assert_eq!(s.segments.len(), 1);
    assert_eq!(segment_global(&s.segments[0].data)[CLASS].1.count, 5);
    drop(file);
}

#[test]
fn a_stuck_global_lock_of_a_dead_process_is_read_as_it_is_and_retired_with_its_totals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.2.pfs");
    let (file, w, _) = segment(&path, false); // nobody holds the lock: dead
    set_global_seq(&file, &w, global_seq(&w) + 1);
    let mut set = SegmentSet::new(dir.path(), Duration::ZERO);
    set.refresh();
    assert_eq!(set.retired_segments(), 1, "{:?}", set.errors);
    let retired = &set.retired().by_service["robust"];
    assert_eq!(
        retired.classes[CLASS].1.count, 5,
        "the exited thread's 3 (global rows, read as they are) and the live thread's 2"
    );
    assert_eq!(set.errors.get(&Refusal::GlobalLockStuck), Some(&1));
    drop(file);
}

#[test]
fn a_dead_process_killed_after_logging_its_fold_is_read_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.3.pfs");
    let (file, w, stays) = segment(&path, false);
    // Thread "stays" exits and its fold is killed after it
    // merged its rows and wrote its fold-log entry, before it published
    // `fold_count` and released the lock; its record was never freed.
    let rec = w.segment().record(stays.index);
    let lock_at = offset_of_field(&w, &rec.header.lock);
    let allocated = rec.header.lock.load(std::sync::atomic::Ordering::Acquire);
    let gh = w.segment().global_header();
    let count_at = offset_of_field(&w, &gh.fold_count);
    let before = gh.fold_count.load(std::sync::atomic::Ordering::Acquire);
    let seq = global_seq(&w);
    assert_eq!(allocated >> 2, stays.version);
    w.fold_and_free(stays);
    file.write_all_at(&allocated.to_le_bytes(), lock_at)
        .unwrap();
    file.write_all_at(&before.to_le_bytes(), count_at).unwrap();
    set_global_seq(&file, &w, seq + 1);
    let seg = Segment::open(File::open(&path).unwrap(), false).unwrap();
    let opts = pfs_shm_layout::reader::ReadOptions::summaries();
    let err = pfs_shm_layout::reader::snapshot(&seg, &opts).unwrap_err();
    assert!(
        matches!(err, pfs_shm_layout::SegmentError::GlobalLockStuck { seq: s } if s == seq + 1),
        "{err}"
    );
    let s = pfs_shm_layout::reader::snapshot(
        &seg,
        &pfs_shm_layout::reader::ReadOptions {
            global_stuck_at: Some(seq + 1),
            ..opts
        },
    )
    .unwrap();
    assert_eq!(
        segment_global(&s)[CLASS].1.count,
        5,
        "the logged fold is complete: its record is not counted twice"
    );
    drop(file);
}

#[test]
fn a_file_whose_header_is_still_zeros_is_not_ready_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.4.pfs");
    let (file, _w, _) = segment(&path, true);
    let mut page = vec![0u8; 4096];
    file.read_exact_at(&mut page, 0).unwrap();
    file.write_all_at(&[0u8; 4096], 0).unwrap();
    let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60));
    set.refresh();
    set.refresh();
    assert!(
        set.errors.is_empty() && set.invalid.is_empty() && set.tracked.is_empty(),
        "{:?} {:?}",
        set.errors,
        set.invalid
    );
    // The creator writes the header: picked up.
    file.write_all_at(&page, 0).unwrap();
    set.refresh();
    assert_eq!(set.tracked.len(), 1);
    assert!(set.errors.is_empty());
    drop(file);
}

#[test]
fn a_file_still_zeros_after_the_grace_is_reported_once_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.5.pfs");
    // Its creator holds it still (a file nobody holds is removed instead).
    let (file, _w, _) = segment(&path, true);
    file.write_all_at(&[0u8; 4096], 0).unwrap();
    let mut set =
        SegmentSet::new(dir.path(), Duration::from_secs(60)).with_not_ready_grace(Duration::ZERO);
    set.refresh();
    set.refresh();
    assert_eq!(
        set.errors.get(&Refusal::NotReady),
        Some(&1),
        "{:?}",
        set.errors
    );
    assert_eq!(set.errors.get(&Refusal::BadMagic), None);
    assert_eq!(set.invalid[&path].reason, Refusal::NotReady);
    drop(file);
}

#[test]
fn an_undefined_state_word_is_corrupt_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.6.pfs");
    let (file, _w, _) = segment(&path, false);
    file.write_all_at(&0x6b1d_2e9f_0c3a_7755u64.to_le_bytes(), 0x20)
        .unwrap();
    let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60));
    set.refresh();
    let inv = &set.invalid[&path];
    assert_eq!(inv.reason, Refusal::Corrupt, "{}", inv.message);
    assert!(inv.message.contains("state"), "{}", inv.message);
    assert_eq!(set.errors.get(&Refusal::Corrupt), Some(&1));
    assert_eq!(set.errors.get(&Refusal::NotReady), None);
    drop(file);
}

#[test]
fn a_misplaced_section_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // The classes section's directory entry (the second), offset at +8.
    let at = 0x100 + 32 + 8;
    for (name, off) in [("robust.7.pfs", 0x2001u64), ("robust.8.pfs", 0)] {
        let path = dir.path().join(name);
        let (file, _w, _) = segment(&path, false);
        file.write_all_at(&off.to_le_bytes(), at).unwrap();
        drop(file);
    }
    let mut set = SegmentSet::new(dir.path(), Duration::from_secs(60));
    set.refresh();
    for (name, want) in [
        ("robust.7.pfs", "not aligned"),
        ("robust.8.pfs", "overlaps the"),
    ] {
        let inv = &set.invalid[&dir.path().join(name)];
        assert_eq!(inv.reason, Refusal::Corrupt);
        assert!(
            inv.message.contains(want) && !inv.message.contains("lies outside"),
            "{name}: {}",
            inv.message
        );
    }
}

/// A thread's summary row, and its identity, left odd by a writer killed
/// in the middle of an update (a process that exits while its threads
/// record) are read as they are once the process is dead: the thread's events of that class are
/// kept (off by at most the one being written), not dropped, and the
/// segment is kept for its dead retention like any dead one.
#[test]
fn a_row_left_mid_update_by_a_dead_writer_is_read_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.5.pfs");
    let (file, w, stays) = segment(&path, false); // nobody holds the lock: dead
    let rec = w.segment().record(stays.index);
    let c = rec
        .row_seqs
        .iter()
        .position(|s| s.sequence() != 0)
        .expect("the live thread's row was written");
    let seq = rec.row_seqs[c].sequence();
    assert_eq!(seq & 1, 0);
    file.write_all_at(
        &(seq + 1).to_le_bytes(),
        offset_of_field(&w, &rec.row_seqs[c]),
    )
    .unwrap();
    // And its identity, as a kill inside `set_name` leaves it.
    let id_seq = rec.header.seq.sequence();
    file.write_all_at(
        &(id_seq + 1).to_le_bytes(),
        offset_of_field(&w, &rec.header.seq),
    )
    .unwrap();
    let snapper = Snapshotter::new(
        SegmentSet::new(dir.path(), Duration::from_secs(60)),
        Duration::ZERO,
    );
    let s = snapper.take_summaries();
    assert_eq!(
        s.segments.len(),
        1,
        "kept for the dead retention, not retired at once"
    );
    assert!(!s.segments[0].live);
    assert_eq!(
        segment_global(&s.segments[0].data)[CLASS].1.count,
        5,
        "the exited thread's 3 and the torn row's 2"
    );
    assert_eq!(
        s.segments[0].data.stats.torn_rows, 2,
        "the row and the thread's identity"
    );
    drop(file);
}

/// A second name (hard link) of a segment in the directory is read once:
/// refused as `duplicate` while the segment is read under its first name,
/// and removed with it when it is retired, so its counts are folded once.
#[test]
fn a_hard_link_to_a_segment_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robust.6.pfs");
    let (file, w, _) = segment(&path, true); // live: the lock is held
    let mut set = SegmentSet::new(dir.path(), Duration::ZERO);
    set.refresh();
    assert_eq!(set.tracked.len(), 1);
    std::fs::hard_link(&path, dir.path().join("copy.7.pfs")).unwrap();
    set.refresh();
    assert_eq!(set.tracked.len(), 1, "the link is not read");
    assert_eq!(set.errors.get(&Refusal::Duplicate), Some(&1));
    // The process dies (every descriptor of its locked file closed):
    // retired once, both names removed.
    drop(w);
    drop(file);
    set.refresh();
    set.refresh();
    assert_eq!(set.retired_segments(), 1, "{:?}", set.errors);
    assert_eq!(set.retired().by_service["robust"].classes[CLASS].1.count, 5);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".pfs"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    set.refresh();
    assert_eq!(set.retired_segments(), 1, "never folded twice");
}
