//! The thread container: allocation without skipping, page reclamation
//! and revival, full volumes (issue 6). The `loom` model of the same
//! protocol lives beside the code in `src/container.rs`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Duration;

mod common;

use pfs_shm_layout::container::PageState;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::{Segment, SegmentConfig, SegmentWriter, ThreadSlot, TimerCalibration};

fn cfg(records_per_page: u32, max_pages: u32) -> SegmentConfig {
    common::config("container", records_per_page, max_pages)
}

/// A directory on tmpfs when there is one (where punched holes are memory
/// given back), else the default temporary directory.
fn shm_tempdir() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn create_in(dir: &Path, cfg: &SegmentConfig) -> std::io::Result<(File, SegmentWriter)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.join("c.pfs"))?;
    let seg = Segment::create(f.try_clone()?, cfg, TimerCalibration::NANOSECONDS, 7, 0)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((f, SegmentWriter::new(seg)))
}

fn states(w: &SegmentWriter) -> Vec<PageState> {
    let seg = w.segment();
    (0..seg.pages_added())
        .map(|p| PageState::of(seg.page_states()[p as usize].load(Acquire)))
        .collect()
}

#[test]
fn empty_pages_are_reclaimed_and_revived_with_versions_continuing() {
    let dir = shm_tempdir();
    let (_f, w) = create_in(dir.path(), &cfg(4, 8)).unwrap();
    let seg = w.segment();
    let page = seg.geometry().page_size as u64;
    let slots: Vec<ThreadSlot> = (0..12)
        .map(|i| w.alloc_thread(i, i, "t").unwrap())
        .collect();
    assert_eq!(seg.pages_added(), 3);
    let full = seg.allocated_bytes().unwrap();
    let versions: HashMap<u32, u64> = slots.iter().map(|s| (s.index, s.version)).collect();
    // One record stays in use on page 0: that page must survive.
    for s in &slots[1..] {
        w.fold_and_free(*s);
    }
    w.set_reclaim_after(Some(Duration::ZERO));
    let st = w.maintain();
    assert_eq!(st.pages_reclaimed, 2, "pages 1 and 2 are empty");
    assert_eq!(
        states(&w),
        [
            PageState::Active,
            PageState::Reclaimed,
            PageState::Reclaimed
        ]
    );
    let after = seg.allocated_bytes().unwrap();
    assert!(
        full >= after + 2 * page,
        "allocated bytes {full} -> {after}: two pages of {page} B must go back"
    );
    // The reader sees the one live thread and nothing of the holes.
    let snap = snapshot(seg, &ReadOptions::default()).unwrap();
    assert_eq!(snap.threads.len(), 1);
    assert_eq!(snap.pages_reclaimed, 2);
    // Allocation fills page 0 first, then revives a page instead of adding.
    let again: Vec<ThreadSlot> = (100..108)
        .map(|i| w.alloc_thread(i, i, "u").unwrap())
        .collect();
    assert_eq!(seg.pages_added(), 3, "revival, not growth");
    assert_eq!(w.reclaim_stats().pages_revived, 2);
    assert!(seg.allocated_bytes().unwrap() >= after + 2 * page);
    for s in &again {
        if let Some(old) = versions.get(&s.index) {
            assert!(
                s.version > *old,
                "record {} reused version {} (had {old})",
                s.index,
                s.version
            );
        }
    }
    let snap = snapshot(seg, &ReadOptions::default()).unwrap();
    assert_eq!(snap.threads.len(), 9);
    assert!(snap.page_states.iter().all(|s| *s == PageState::Active));
}

#[test]
fn quiet_time_and_pages_in_use_are_respected() {
    let dir = shm_tempdir();
    let (_f, w) = create_in(dir.path(), &cfg(2, 4)).unwrap();
    let a = w.alloc_thread(1, 1, "a").unwrap();
    let b = w.alloc_thread(2, 2, "b").unwrap();
    let c = w.alloc_thread(3, 3, "c").unwrap();
    w.fold_and_free(c);
    // Reclamation off by default.
    assert_eq!(w.maintain().pages_reclaimed, 0);
    w.set_reclaim_after(Some(Duration::from_secs(3600)));
    assert_eq!(w.maintain().pages_reclaimed, 0, "page 1 is not quiet yet");
    w.set_reclaim_after(Some(Duration::from_millis(20)));
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(
        w.maintain().pages_reclaimed,
        1,
        "page 1 has been free 40 ms"
    );
    w.fold_and_free(a);
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(w.maintain().pages_reclaimed, 1, "page 0 still holds b");
    w.fold_and_free(b);
    assert_eq!(w.maintain().pages_reclaimed, 1, "b was released just now");
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(w.maintain().pages_reclaimed, 2);
}

/// Many threads allocate and free under churn while a maintainer reclaims
/// (quiet time zero: as aggressive as it gets) and a reader scans. The
/// container never holds more than `ceil(peak / records_per_page) + 1`
/// pages, no record has two owners, and the reader never accepts a record
/// whose owner was not alive with that version.
#[test]
fn churn_with_reclamation_stays_within_optimal_plus_one() {
    const RPP: u32 = 8;
    const THREADS: u64 = 12;
    let dir = shm_tempdir();
    let (_f, w) = create_in(dir.path(), &cfg(RPP, 64)).unwrap();
    w.set_reclaim_after(Some(Duration::ZERO));
    let w = Arc::new(w);
    let live = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Ownership marks, by record index: the thread id owning it, or 0.
    let owners: Arc<Vec<AtomicU64>> = Arc::new((0..512).map(|_| AtomicU64::new(0)).collect());
    let maintainer = {
        let (w, stop) = (w.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                w.maintain();
                std::thread::yield_now();
            }
        })
    };
    let reader = {
        let (w, stop) = (w.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0u64;
            let mut by_version: HashMap<(u32, u64), u64> = HashMap::new();
            while !stop.load(Relaxed) {
                let Ok(s) = snapshot(w.segment(), &ReadOptions::default()) else {
                    continue;
                };
                for t in &s.threads {
                    seen += 1;
                    let page = (t.record / RPP) as usize;
                    assert_eq!(s.page_states[page], PageState::Active);
                    let first = *by_version
                        .entry((t.record, t.version))
                        .or_insert(t.thread_id);
                    assert_eq!(
                        first, t.thread_id,
                        "record {} version {} had two owners",
                        t.record, t.version
                    );
                }
            }
            seen
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let (w, live, peak, owners) = (w.clone(), live.clone(), peak.clone(), owners.clone());
            std::thread::spawn(move || {
                let mut rng = 0x2545_F491_4F6C_DD1D_u64 ^ (i + 1);
                let mut held = Vec::new();
                for round in 0..400u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let k = 1 + rng % 6;
                    for j in 0..k {
                        let n = live.fetch_add(1, SeqCst) + 1;
                        peak.fetch_max(n, SeqCst);
                        let id = (i << 32) | (round << 8) | j | 1 << 62;
                        let s = w.alloc_thread(id, id, "churn").expect("container has room");
                        assert_eq!(
                            owners[s.index as usize].swap(id, SeqCst),
                            0,
                            "record {} handed to two owners",
                            s.index
                        );
                        held.push((s, id));
                    }
                    std::thread::yield_now();
                    for (s, id) in held.drain(..) {
                        assert_eq!(owners[s.index as usize].swap(0, SeqCst), id);
                        w.fold_and_free(s);
                        live.fetch_sub(1, SeqCst);
                    }
                }
            })
        })
        .collect();
    for h in workers {
        h.join().unwrap();
    }
    stop.store(true, Relaxed);
    maintainer.join().unwrap();
    let seen = reader.join().unwrap();
    let peak = peak.load(SeqCst);
    let optimal = peak.div_ceil(u64::from(RPP));
    let pages = u64::from(w.segment().pages_added());
    let st = w.reclaim_stats();
    eprintln!(
        "churn: peak {peak} live, {pages} pages added (optimal {optimal}), {} reclaimed, {} revived, reader accepted {seen} copies",
        st.pages_reclaimed, st.pages_revived
    );
    assert!(
        pages <= optimal + 1,
        "{pages} pages for a peak of {peak} records ({RPP} per page)"
    );
    assert_eq!(
        w.segment().lost().counters[LostKind::Threads as usize].load(Relaxed),
        0
    );
}

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// On a size-limited tmpfs, a reclaimed page whose space another file took
/// cannot be revived: allocation fails cleanly with the loss counted, and
/// works again once space is back. Needs permission to mount (root or
/// CAP_SYS_ADMIN), as in CI and `scripts/test`.
#[test]
fn revival_on_a_full_volume_counts_a_loss_instead_of_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs"])
        .arg(dir.path())
        .status()
        .expect("run mount");
    assert!(
        status.success(),
        "cannot mount a size-limited tmpfs: this test needs root or CAP_SYS_ADMIN"
    );
    let _mount = Mount(dir.path().to_path_buf());
    let c = SegmentConfig {
        history_long_len: 1,
        task_slots: 4,
        max_strings: 4,
        ..cfg(2, 4)
    };
    let (_f, w) = create_in(dir.path(), &c).expect("the fixed part fits in 2 MiB");
    let seg = w.segment();
    let a = w.alloc_thread(1, 1, "a").unwrap();
    w.fold_and_free(a);
    w.set_reclaim_after(Some(Duration::ZERO));
    assert_eq!(w.maintain().pages_reclaimed, 1);
    // Another file takes every free byte.
    let filler = dir.path().join("filler");
    let _ = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", filler.display()))
        .args(["bs=4096", "count=100000"])
        .stderr(std::process::Stdio::null())
        .status();
    assert!(
        matches!(
            w.alloc_thread(2, 2, "b"),
            Err(pfs_shm_layout::NoRecord::Volume(_))
        ),
        "no space to revive"
    );
    let lost = |k: LostKind| seg.lost().counters[k as usize].load(Relaxed);
    assert_eq!(lost(LostKind::Threads), 1);
    assert_eq!(lost(LostKind::Pages), 1);
    assert_eq!(states(&w), [PageState::Reclaimed]);
    // The reader is unharmed.
    assert!(
        snapshot(seg, &ReadOptions::default())
            .unwrap()
            .threads
            .is_empty()
    );
    std::fs::remove_file(&filler).unwrap();
    let b = w.alloc_thread(3, 3, "c").expect("space is back");
    assert_eq!(states(&w), [PageState::Active]);
    assert!(b.version > 1, "version continues after revival");
}
