//! Protocol tests of the segment: validation of hostile files, container
//! growth and reuse, history rings, and exit-time folding under concurrent
//! snapshots, read per thread or summed by class.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

mod common;

use common::{config, record_wait, wait_event};
use pfs_shm_layout::layout::*;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::values::Summary;
use pfs_shm_layout::writer::EventData;
use pfs_shm_layout::{ClassKind, EventKind, Segment, SegmentConfig, SegmentError};

fn small() -> SegmentConfig {
    config("t", 2, 3)
}

fn file_with(bytes: &[u8]) -> File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f
}

fn good_bytes() -> Vec<u8> {
    let (mut f, _w) = common::create(&small());
    let mut v = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    std::io::Read::read_to_end(&mut f, &mut v).unwrap();
    v
}

#[test]
fn refuses_hostile_files_with_typed_errors() {
    let good = good_bytes();
    assert!(Segment::open(file_with(&good), false).is_ok());

    let err = |b: &[u8]| Segment::open(file_with(b), false).unwrap_err();
    assert!(matches!(err(&[]), SegmentError::Truncated { len: 0, .. }));
    assert!(matches!(
        err(&good[..100]),
        SegmentError::Truncated { len: 100, .. }
    ));
    assert!(matches!(err(&vec![0xA5; 8192]), SegmentError::BadMagic(_)));
    assert!(matches!(
        err(&good[..good.len() / 2]),
        SegmentError::Truncated { .. }
    ));

    let mut b = good.clone();
    b[8..12].copy_from_slice(&99u32.to_le_bytes());
    let e = err(&b);
    assert!(
        matches!(
            e,
            SegmentError::UnsupportedVersion {
                found: 99,
                supported: LAYOUT_MAJOR,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("upgrade pfs-agent")
            && e.to_string().contains(&format!(
                "reads versions {} to {LAYOUT_MAJOR}",
                pfs_shm_layout::layout::LAYOUT_MAJORS_READ.start()
            )),
        "message tells what to do: {e}"
    );

    let mut b = good.clone();
    b[0x10..0x14].copy_from_slice(&0x0403_0201u32.to_le_bytes());
    assert!(matches!(err(&b), SegmentError::ByteOrder(0x0403_0201)));

    let mut b = good.clone();
    b[0x20..0x28].copy_from_slice(&0u64.to_le_bytes());
    assert!(matches!(err(&b), SegmentError::NotReady));

    // Absurd section offset / size / count.
    for (field_off, value) in [(8usize, u64::MAX - 10), (16, 1 << 60)] {
        let mut b = good.clone();
        let entry = 0x100 + 32; // classes section entry
        b[entry + field_off..entry + field_off + 8].copy_from_slice(&value.to_le_bytes());
        assert!(
            matches!(err(&b), SegmentError::Corrupt(_)),
            "field {field_off}"
        );
    }
    let mut b = good.clone();
    b[0x2C..0x30].copy_from_slice(&1000u32.to_le_bytes()); // section_count
    assert!(matches!(err(&b), SegmentError::Corrupt(_)));
    let mut b = good.clone();
    b[0x58..0x5C].copy_from_slice(&65u32.to_le_bytes()); // service_name_len
    assert!(matches!(err(&b), SegmentError::Corrupt(_)));
}

/// A small segment with one mutex class and one thread that recorded
/// `waits` waits of it, the i-th (from 1) lasting i × 5000 ps: the file,
/// the writer, the class and the thread's record.
fn one_thread_of_waits(waits: u64) -> (File, pfs_shm_layout::SegmentWriter, u32, u32) {
    let (f, w) = common::create(&small());
    let c = w
        .register_class(
            "wait/synch/mutex/t/a",
            ClassKind::Mutex,
            FLAG_ENABLED | FLAG_TIMED,
        )
        .unwrap();
    let slot = w.alloc_thread(1, 1, "x").unwrap();
    for id in 1..=waits {
        record_wait(
            w.segment().record(slot.index),
            &wait_event(c, id, 5000 * id),
        );
    }
    (f, w, c, slot.index)
}

#[test]
fn hostile_record_contents_never_panic_the_reader() {
    let (f, w, _, _) = one_thread_of_waits(1);
    let g = *w.segment().geometry();
    // Scribble over everything after the header with a pattern, as a
    // compromised writer could, then read.
    // Everything but the header and the container geometry: counters,
    // classes, strings, global rows, page directory, records.
    let junk: Vec<u8> = (0..g.total_size).map(|i| (i * 31 % 251) as u8).collect();
    f.write_all_at(&junk[PAGE..g.threads_off], PAGE as u64)
        .unwrap();
    f.write_all_at(&junk[g.threads_off + 64..], (g.threads_off + 64) as u64)
        .unwrap();
    let r = Segment::open(f.try_clone().unwrap(), false).unwrap();
    let _ = snapshot(&r, &ReadOptions::default());
}

/// `Segment::copy_row` gives the row as the mapping holds it, through the
/// segment's own file description or another (`row_reader`), even one
/// opened after the file was unlinked (a temporary file has no name), from
/// several threads at once.
#[test]
fn every_row_reader_copies_the_row_the_mapping_holds() {
    use pfs_shm_layout::segment::RowCopy;
    let (f, _w, c, idx) = one_thread_of_waits(3);
    let r = Segment::open(f.try_clone().unwrap(), false).unwrap();
    let row = &r.record(idx).rows[c as usize];
    let fields = |row: &SummaryRow| -> Vec<u64> {
        [&row.count, &row.sum_lo, &row.max]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    };
    let want = fields(row);
    assert_eq!(want, [3, 30_000, 15_000]);
    let readers: Vec<_> = (0..3).map(|_| r.row_reader().unwrap()).collect();
    std::thread::scope(|s| {
        for via in std::iter::once(None).chain(readers.iter().map(Some)) {
            let (r, want) = (&r, &want);
            s.spawn(move || {
                for _ in 0..100 {
                    let mut copy = RowCopy::new();
                    assert!(r.copy_row_via(via, idx, c as usize, &mut copy));
                    assert_eq!(&fields(copy.summary()), want);
                }
            });
        }
    });
    let mut copy = RowCopy::new();
    assert!(r.copy_row(idx, c as usize, &mut copy));
    assert_eq!(fields(copy.summary()), want);
    // Another segment's reader copies nothing from this one.
    let (other, _w2, _, _) = one_thread_of_waits(1);
    let other = Segment::open(other, false).unwrap();
    let theirs = other.row_reader().unwrap();
    assert!(!r.copy_row_via(Some(&theirs), idx, c as usize, &mut copy));
    assert!(other.copy_row_via(Some(&theirs), idx, c as usize, &mut copy));
    assert_eq!(fields(copy.summary()), [1, 5_000, 5_000]);
}

/// A reader's `pread`s leave the segment file's access time alone
/// (`O_NOATIME`, which the file's owner may set): each would otherwise ask
/// whether the time is due an update. A writable open (the agent changing
/// setup flags) leaves the file's flags as they were.
#[test]
fn a_reader_reads_the_segment_without_access_time_updates() {
    use rustix::fs::{OFlags, fcntl_getfl};
    let (f, _w, _, _) = one_thread_of_waits(1);
    assert!(!fcntl_getfl(&f).unwrap().contains(OFlags::NOATIME));
    let _rw = Segment::open(f.try_clone().unwrap(), true).unwrap();
    assert!(!fcntl_getfl(&f).unwrap().contains(OFlags::NOATIME));
    // (A clone shares the open file description, and so its flags.)
    let _r = Segment::open(f.try_clone().unwrap(), false).unwrap();
    assert!(fcntl_getfl(&f).unwrap().contains(OFlags::NOATIME));
}

#[test]
fn container_adds_pages_only_when_full_and_reuses_records() {
    let (_f, w) = common::create(&small()); // 2 records/page, 3 pages
    let seg = w.segment();
    let a = w.alloc_thread(1, 1, "a").unwrap();
    assert_eq!(seg.pages_added(), 1);
    let b = w.alloc_thread(2, 2, "b").unwrap();
    assert_eq!(seg.pages_added(), 1, "second record fits page 0");
    let c = w.alloc_thread(3, 3, "c").unwrap();
    assert_eq!(seg.pages_added(), 2);
    w.fold_and_free(a);
    let d = w.alloc_thread(4, 4, "d").unwrap();
    assert_eq!(
        d.index, a.index,
        "a freed record is reused before adding pages"
    );
    assert_eq!(d.version, a.version + 1, "each lifetime has a new version");
    assert_eq!(seg.pages_added(), 2);
    let _e = w.alloc_thread(5, 5, "e").unwrap();
    let _f2 = w.alloc_thread(6, 6, "f").unwrap();
    assert_eq!(seg.pages_added(), 3);
    let _g = w.alloc_thread(7, 7, "g").unwrap();
    assert_eq!(seg.pages_added(), 3, "page 2 still had a free record");
    assert!(
        matches!(
            w.alloc_thread(8, 8, "h"),
            Err(pfs_shm_layout::NoRecord::Full { records: 6 })
        ),
        "container full"
    );
    assert_eq!(
        seg.lost().counters[LostKind::Threads as usize].load(Ordering::Relaxed),
        1
    );
    let _ = (b, c);
}

#[test]
fn history_ring_keeps_the_last_n_in_order() {
    let (f, w) = common::create(&small()); // history_len 4
    let c = w
        .register_class(
            "wait/io/file/t/f",
            ClassKind::File,
            FLAG_ENABLED | FLAG_TIMED,
        )
        .unwrap();
    let slot = w.alloc_thread(1, 1, "t").unwrap();
    let rec = w.segment().record(slot.index);
    for id in 1..=10 {
        record_wait(rec, &wait_event(c, id, id * 1000));
    }
    let r = Segment::open(f, false).unwrap();
    let s = snapshot(&r, &ReadOptions::default()).unwrap();
    let t = &s.threads[0];
    let ids: Vec<u64> = t.waits_history.iter().map(|e| e.event_id).collect();
    assert_eq!(ids, vec![7, 8, 9, 10]);
    assert_eq!(t.waits_current.unwrap().event_id, 10);
    let row = t.rows[0].1;
    assert_eq!(row.count, 10);
    assert_eq!(row.sum_ps, (1..=10).map(|i| i * 1000).sum::<u64>() as u128);
    assert_eq!((row.min_ps, row.max_ps), (1000, 10_000));
    assert_eq!(row.buckets.iter().sum::<u64>(), 10);
}

/// Layout 7.0's pending bucket: the row's latest timed event is in
/// `pending`, not yet in `buckets`, and every reader (per thread, summed
/// by class, folded at the thread's exit) counts it in its bucket, after
/// every event.
#[test]
fn the_latest_timed_event_is_counted_in_its_bucket() {
    let (f, w) = common::create(&small());
    let c = w
        .register_class(
            "wait/synch/mutex/t/p",
            ClassKind::Mutex,
            FLAG_ENABLED | FLAG_TIMED,
        )
        .unwrap();
    let slot = w.alloc_thread(1, 1, "p").unwrap();
    let rec = w.segment().record(slot.index);
    let reader = Segment::open(f.try_clone().unwrap(), false).unwrap();
    // Durations over eight buckets, in an order that changes bucket at
    // almost every event, and repeats some.
    let durations = [
        5_000u64,
        2_000_000,
        7_450,
        7_451,
        900_000_000,
        2_000_000,
        5_000,
        10_000_000_000_000,
        40_000,
        40_000,
    ];
    let mut model = [0u64; HISTOGRAM_BUCKETS];
    for (n, &d) in durations.iter().enumerate() {
        record_wait(rec, &wait_event(c, n as u64 + 1, d));
        model[bucket_index(d)] += 1;
        // The row as stored: the latest event's bucket pending, the
        // others in their counters.
        let row = &rec.rows[c as usize];
        assert_eq!(
            row.pending.load(Ordering::Relaxed),
            pending_word(bucket_index(d))
        );
        let stored: Vec<u64> = row
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let mut without_latest = model;
        without_latest[bucket_index(d)] -= 1;
        assert_eq!(stored, without_latest, "after event {}", n + 1);
        // As every reader reads it.
        for opts in [ReadOptions::default(), ReadOptions::summaries()] {
            let s = snapshot(&reader, &opts).unwrap();
            let row = totals(&s)[&c];
            assert_eq!(row.buckets, model, "after event {}", n + 1);
            assert_eq!(row.buckets.iter().sum::<u64>(), row.timed_count);
        }
    }
    // Folded at the thread's exit: the global row has it in its buckets,
    // and no pending bucket of its own.
    w.fold_and_free(slot);
    let s = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert_eq!(s.exited.len(), 1);
    assert_eq!(s.exited[0].1.buckets, model);
    let global = &reader.global_rows()[c as usize];
    assert_eq!(global.pending.load(Ordering::Relaxed), 0);
    assert_eq!(
        global
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum::<u64>(),
        durations.len() as u64
    );
}

/// A pending word no live writer leaves (its bucket outside MIN..MAX, or
/// beyond the last bucket) is read without a panic: counted where it
/// points if it names a bucket, ignored otherwise.
#[test]
fn a_pending_bucket_outside_min_max_is_read_as_it_is() {
    let (f, w, c, idx) = one_thread_of_waits(3); // 5, 10, 15 ns: buckets 0, 1 and 2
    let row = &w.segment().record(idx).rows[c as usize];
    let reader = Segment::open(f, false).unwrap();
    let buckets = |opts: &ReadOptions| totals(&snapshot(&reader, opts).unwrap())[&c].buckets;
    let base = buckets(&ReadOptions::default());
    assert_eq!(base.iter().sum::<u64>(), 3);
    row.pending.store(pending_word(30), Ordering::Relaxed);
    for opts in [ReadOptions::default(), ReadOptions::summaries()] {
        let b = buckets(&opts);
        assert_eq!(b[30], 1);
        let pending_before = bucket_index(15_000);
        assert_eq!(
            b.iter().sum::<u64>(),
            3,
            "the latest event's bucket was replaced"
        );
        assert_eq!(b[pending_before], base[pending_before] - 1);
    }
    row.pending
        .store(HISTOGRAM_BUCKETS as u64 + 1, Ordering::Relaxed);
    let b = buckets(&ReadOptions::default());
    assert_eq!(b.iter().sum::<u64>(), 2);
}

/// A 6.x writer's row (every timed event in `buckets`, the first word
/// zero: no pending bucket) reads exactly, in a 6.x segment.
#[test]
fn a_6x_summary_row_reads_as_written() {
    let (f, w, c, idx) = one_thread_of_waits(3); // 5, 10, 15 ns
    let row = &w.segment().record(idx).rows[c as usize];
    // As a 6.x writer leaves it: the latest event in its counter.
    let p = pending_bucket(row.pending.swap(0, Ordering::Relaxed)).unwrap();
    row.buckets[p].fetch_add(1, Ordering::Relaxed);
    let header = w.segment().header();
    header.major.store(6, Ordering::Relaxed);
    header.minor.store(2, Ordering::Relaxed);
    let reader = Segment::open(f, false).unwrap();
    assert_eq!(reader.major_version(), 6);
    let mut want = [0u64; HISTOGRAM_BUCKETS];
    for d in [5_000, 10_000, 15_000] {
        want[bucket_index(d)] += 1;
    }
    for opts in [ReadOptions::default(), ReadOptions::summaries()] {
        let row = totals(&snapshot(&reader, &opts).unwrap())[&c];
        assert_eq!(row.buckets, want);
        assert_eq!(row.timed_count, 3);
    }
}

/// Totals by class of a snapshot: folded rows, plus live rows however
/// they were read (per thread, or summed by class).
fn totals(s: &SegmentSnapshot) -> BTreeMap<u32, Summary> {
    let mut out = BTreeMap::new();
    let rows = s
        .exited
        .iter()
        .chain(&s.live_rows)
        .chain(s.threads.iter().flat_map(|t| &t.rows));
    for (c, r) in rows {
        out.entry(*c).or_insert_with(Summary::default).merge(r);
    }
    out
}

/// Every event of a snapshot, of every class.
fn total_count(s: &SegmentSnapshot) -> u64 {
    totals(s).values().map(|r| r.count).sum()
}

#[test]
fn summed_rows_equal_per_thread_rows() {
    let cfg = SegmentConfig {
        records_per_page: 4,
        max_pages: 4,
        ..SegmentConfig::default()
    };
    let (f, w) = common::create(&cfg);
    let classes = common::timed_classes(&w, "wait/synch/mutex/t/m", ClassKind::Mutex, 5);
    let mut slots = Vec::new();
    for t in 0..10u64 {
        let slot = w.alloc_thread(t + 1, t + 1, "w").unwrap();
        let rec = w.segment().record(slot.index);
        for (k, &c) in classes.iter().enumerate().skip(t as usize % 3) {
            for n in 0..=t {
                record_wait(
                    rec,
                    &wait_event(c, n + 1, (k as u64 + 1) * 1_000_000 * (n + t + 1)),
                );
            }
        }
        slots.push(slot);
    }
    // Two threads exit: their rows are folded into the global section.
    w.fold_and_free(slots[3]);
    w.fold_and_free(slots[7]);
    let reader = Segment::open(f, false).unwrap();
    let full = snapshot(&reader, &ReadOptions::default()).unwrap();
    let summed = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert!(full.live_rows.is_empty());
    assert_eq!(summed.threads.len(), 8);
    assert!(summed.threads.iter().all(|t| t.rows.is_empty()));
    assert!(summed.threads.iter().all(|t| t.waits_history.is_empty()));
    assert_eq!(summed.live_rows.len(), classes.len());
    assert_eq!(totals(&full), totals(&summed));
    // Pages given back are read again from the file, unchanged.
    let again = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert_eq!(totals(&again), totals(&full));
    // Every thread's every event, folded or live.
    assert_eq!(totals(&full)[&classes[4]].count, (1..=10).sum::<u64>());
}

#[test]
fn folding_under_concurrent_snapshots_never_loses_or_double_counts() {
    let opts = ReadOptions {
        events: false,
        ..Default::default()
    };
    fold_churn_under_snapshots(opts);
}

/// As above, with the live rows summed by class while they are read (what
/// `/metrics` does): a copy summed during the walk cannot be taken back
/// when the fold log shows it folded, so the reader must walk again.
#[test]
fn summed_rows_under_folding_never_lose_or_double_count() {
    fold_churn_under_snapshots(ReadOptions::summaries());
}

/// Two writers allocate, write and fold thread records in a loop while a
/// reader takes snapshots with `opts` for 3 s: totals never go down, and at
/// the end every event is counted exactly once.
fn fold_churn_under_snapshots(opts: ReadOptions) {
    let cfg = SegmentConfig {
        records_per_page: 4,
        max_pages: 8,
        ..small()
    };
    let (f, w) = common::create(&cfg);
    let w = Arc::new(w);
    let c = w
        .register_class(
            "wait/synch/mutex/t/m",
            ClassKind::Mutex,
            FLAG_ENABLED | FLAG_TIMED,
        )
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    const PER_THREAD: u64 = 200;
    let writers: Vec<_> = (0..2)
        .map(|k| {
            let (w, stop) = (w.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut lifetimes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let slot = w.alloc_thread(k, k, "churn").unwrap();
                    let rec = w.segment().record(slot.index);
                    for id in 1..=PER_THREAD {
                        record_wait(rec, &wait_event(c, id, 1000));
                    }
                    w.fold_and_free(slot);
                    lifetimes += 1;
                    // Real threads live for at least tens of microseconds
                    // (creating one costs about that much).
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
                lifetimes
            })
        })
        .collect();
    let reader = Segment::open(f, false).unwrap();
    let (mut last, mut snapshots, mut storms, mut skipped, mut restarts) = (0, 0, 0, 0, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let s = match snapshot(&reader, &opts) {
            Ok(s) => s,
            Err(SegmentError::FoldStorm(_)) => {
                storms += 1;
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        restarts += s.stats.restarts;
        if s.stats.skipped_rows > 0 {
            // A row skipped after its retry budget is missing from this
            // snapshot (the agent carries the previous value forward); it
            // cannot be compared and must not become the baseline.
            skipped += 1;
            continue;
        }
        let n = total_count(&s);
        assert!(
            n >= last,
            "total went backwards: {last} -> {n} (stats {:?})",
            s.stats
        );
        last = n;
        snapshots += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let lifetimes: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    let s = snapshot(&reader, &opts).unwrap();
    assert_eq!(
        total_count(&s),
        lifetimes * PER_THREAD,
        "every event counted exactly once"
    );
    assert_eq!(s.threads_exited, lifetimes);
    assert!(
        snapshots > 10 && lifetimes > 1000,
        "{snapshots} snapshots, {lifetimes} lifetimes"
    );
    assert!(
        storms * 10 < snapshots,
        "{storms} snapshots gave up out of {snapshots}"
    );
    eprintln!(
        "fold test ({opts:?}): {snapshots} snapshots over {lifetimes} thread lifetimes; {restarts} restarts, {storms} gave up, {skipped} had a skipped row"
    );
}

#[test]
fn history_long_never_publishes_torn_or_duplicate_slots_and_counts_losses_exactly() {
    let cfg = SegmentConfig {
        history_long_len: 64, // small: writers lap each other constantly
        task_slots: 4,
        ..small()
    };
    let (f, w) = common::create(&cfg);
    let w = Arc::new(w);
    const WRITERS: u64 = 4;
    const PER_WRITER: u64 = 50_000;
    let stop = Arc::new(AtomicBool::new(false));
    // Writers go on past PER_WRITER until the reader has checked enough
    // slots (on a loaded machine it may not run at all before 200 000
    // appends are done), for at most 60 s.
    let checked = Arc::new(AtomicU64::new(0));
    let reader = {
        let (f, stop, checked) = (f.try_clone().unwrap(), stop.clone(), checked.clone());
        std::thread::spawn(move || {
            let seg = Segment::open(f, false).unwrap();
            let (mut snapshots, mut validated) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                checked.store(validated, Ordering::Relaxed);
                let s = snapshot(&seg, &ReadOptions::default()).unwrap();
                let mut seen = std::collections::HashSet::new();
                for e in &s.long[EventKind::Wait.index()] {
                    let (t, id) = (e.thread_id, e.event_id);
                    assert!(
                        seen.insert((t, id)),
                        "slot published twice: thread {t} event {id}"
                    );
                    assert_eq!(e.object_instance, t * 1_000_003 + id, "torn slot {e:?}");
                    assert_eq!(e.timer_wait, Some(id * 7), "torn slot {e:?}");
                    assert_eq!(e.end_event_id, Some(id + 1), "torn slot {e:?}");
                    validated += 1;
                }
                snapshots += 1;
            }
            (snapshots, validated)
        })
    };
    let start = std::time::Instant::now();
    let writers: Vec<_> = (1..=WRITERS)
        .map(|t| {
            let (w, checked) = (w.clone(), checked.clone());
            std::thread::spawn(move || {
                let (mut written, mut id) = (0u64, 0u64);
                while id < PER_WRITER
                    || (checked.load(Ordering::Relaxed) <= 1000
                        && start.elapsed() < std::time::Duration::from_secs(60))
                {
                    id += 1;
                    let e = EventData {
                        object_instance: t * 1_000_003 + id,
                        thread_id: t,
                        ..wait_event(0, id, id * 7)
                    };
                    let e = EventData {
                        end_event_id: id + 1,
                        ..e
                    };
                    written += u64::from(w.append_long(EventKind::Wait, &e, None));
                }
                (written, id)
            })
        })
        .collect();
    let (mut written, mut appended) = (0, 0);
    for h in writers {
        let (w, a) = h.join().unwrap();
        (written, appended) = (written + w, appended + a);
    }
    stop.store(true, Ordering::Relaxed);
    let (snapshots, validated) = reader.join().unwrap();
    let seg = w.segment();
    let tickets = seg
        .long_header(EventKind::Wait)
        .next
        .load(Ordering::Relaxed);
    let lost = seg.lost().counters[LostKind::WaitsLong as usize].load(Ordering::Relaxed);
    assert_eq!(tickets, appended, "one ticket per append");
    assert!(appended >= WRITERS * PER_WRITER);
    assert_eq!(
        written + lost,
        tickets,
        "every ticket written once or counted lost: {written} + {lost}"
    );
    let s = snapshot(&Segment::open(f, false).unwrap(), &ReadOptions::default()).unwrap();
    assert_eq!(
        s.long[EventKind::Wait.index()].len(),
        64,
        "a full ring after the storm"
    );
    assert!(
        validated > 1000,
        "reader validated {validated} slots in {snapshots} snapshots"
    );
    eprintln!(
        "history_long: {tickets} appends by {WRITERS} writers into 64 slots: {written} written, {lost} lost (lapped or busy); reader validated {validated} slots in {snapshots} snapshots"
    );
}
