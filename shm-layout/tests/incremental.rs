//! Incremental summaries snapshots (`IncrementalReader`) against full
//! ones (`snapshot` with `ReadOptions::summaries()`): equal after every
//! kind of change (rows that grow, new rows, thread exits and folds,
//! records reused by new threads, threads renamed or given another actor,
//! memory rows and their truncation), and,
//! read while writers run, totals that never go down and end equal, and
//! records copied at once never torn.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

mod common;

use pfs_shm_layout::layout::{FLAG_ENABLED, NONE_U32};
use pfs_shm_layout::reader::{IncrementalReader, ReadOptions, SegmentSnapshot, Summary, snapshot};
use pfs_shm_layout::{ClassKind, IoMode, Segment, SegmentConfig};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a summaries snapshot says, in a comparable form: the live sums,
/// the folded totals, and every live thread's identity and memory rows.
type Rows = Vec<(u32, Summary)>;

fn view(s: &SegmentSnapshot) -> (Rows, Rows, Vec<String>) {
    let mut threads: Vec<String> = s
        .threads
        .iter()
        .map(|t| {
            let mut m = t.memory.clone();
            m.sort_by_key(|(c, _)| *c);
            format!(
                "{} {} {} {} {:?} {:?} {} {}",
                t.record, t.version, t.thread_id, t.name, m, t.actor, t.instrumented, t.history
            )
        })
        .collect();
    threads.sort();
    (s.live_rows.clone(), s.exited.clone(), threads)
}

/// Summaries read by four threads, a record or more each: every walk of
/// these small segments is split.
fn split_walks() -> ReadOptions {
    ReadOptions {
        threads: 4,
        records_per_thread: 1,
        ..ReadOptions::summaries()
    }
}

#[test]
fn equals_a_full_read_after_every_kind_of_change() {
    let cfg = SegmentConfig {
        max_classes: 64,
        records_per_page: 4,
        max_pages: 8,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let waits = common::timed_classes(&w, "wait/synch/mutex/t/m", ClassKind::Mutex, 40);
    let files = common::timed_classes(&w, "wait/io/file/t/f", ClassKind::File, 4);
    let mem = w
        .register_class("memory/t/buf", ClassKind::Memory, FLAG_ENABLED)
        .unwrap() as usize;
    let reader = Segment::open(file, false).unwrap();
    let mut inc = IncrementalReader::default();
    let mut par = IncrementalReader::default();
    let mut split_seen = 0;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut live = Vec::new();
    let mut next_tid = 1u64;
    let mut id = 0u64;
    let tgen = &w.segment().setup().memory_truncate_gen;
    for step in 0..300 {
        match rng.below(20) {
            // A new thread (possibly in a record an exited one left).
            0 | 1 if live.len() < 30 => {
                let slot = w
                    .alloc_thread(next_tid, next_tid, &format!("t{next_tid}"))
                    .unwrap();
                next_tid += 1;
                live.push(slot);
            }
            // An exit: the thread's rows fold into the global section.
            2 if !live.is_empty() => {
                let i = rng.below(live.len() as u64) as usize;
                w.fold_and_free(live.swap_remove(i));
            }
            // A memory TRUNCATE.
            3 => {
                tgen.fetch_add(1, Relaxed);
            }
            // Quiet: nothing changes.
            4 => {}
            // A thread renamed, or its actor and flags changed (its
            // identity, under the record's identity lock).
            5 if !live.is_empty() => {
                let slot = live[rng.below(live.len() as u64) as usize];
                let rec = w.segment().record(slot.index);
                if rng.below(2) == 0 {
                    rec.set_name(&format!("renamed{}", rng.below(1000)));
                } else {
                    let flags = rng.below(4) as u32;
                    rec.set_actor(NONE_U32, NONE_U32, NONE_U32, flags);
                }
            }
            // Events on a few threads, a few classes each.
            _ => {
                for _ in 0..rng.below(4) + 1 {
                    let Some(slot) = live.get(rng.below(live.len().max(1) as u64) as usize) else {
                        break;
                    };
                    let rec = w.segment().record(slot.index);
                    for _ in 0..rng.below(5) + 1 {
                        id += 1;
                        let c = waits[rng.below(waits.len() as u64) as usize];
                        let bits = 10 + rng.below(30);
                        let ps = 1 + rng.below(1 << bits);
                        common::record_wait(rec, &common::wait_event(c, id, ps));
                    }
                    // A file wait in one of the I/O modes.
                    if rng.below(2) == 0 {
                        id += 1;
                        let c = files[rng.below(files.len() as u64) as usize];
                        let mode = IoMode::ALL[rng.below(3) as usize];
                        let e = common::wait_event(c, id, 1 + rng.below(1 << 30));
                        common::record_io(rec, &e, mode, rng.below(1 << 20));
                    }
                    let g = tgen.load(Relaxed);
                    if rng.below(2) == 0 {
                        rec.memory_alloc(mem, 64 + rng.below(4096), g);
                    } else {
                        rec.memory_free(mem, 64, g);
                    }
                }
            }
        }
        let a = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
        let b = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        assert_eq!(view(&a), view(&b), "step {step}");
        assert_eq!(inc.kept_records(), b.threads.len(), "step {step}");
        // Split walks (a few pages per thread) read the same.
        let split = split_walks();
        let p = par.snapshot(&reader, &split).unwrap();
        assert_eq!(view(&p), view(&b), "step {step}, split incremental");
        assert_eq!(par.kept_records(), b.threads.len(), "step {step}");
        let one = ReadOptions {
            threads: 1,
            ..ReadOptions::summaries()
        };
        let q = snapshot(&reader, &split).unwrap();
        assert_eq!(view(&q), view(&b), "step {step}, split full");
        assert_eq!(q.threads, snapshot(&reader, &one).unwrap().threads);
        if q.stats.restarts == 0 && p.stats.restarts == 0 {
            split_seen = split_seen.max(q.stats.parts.min(p.stats.parts));
        }
        // Read again at once: nothing changed, nothing is read.
        let again = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
        assert_eq!(view(&again), view(&b), "step {step}, again");
        assert_eq!(
            again.stats.rows_read, 0,
            "step {step}: unchanged rows were read"
        );
        assert_eq!(again.stats.rows_reused, b.stats.rows_read, "step {step}");
    }
    assert!(id > 1000, "the scenario recorded events ({id})");
    assert!(
        split_seen >= 2,
        "walks were split ({split_seen} parts at most)"
    );
}

#[test]
fn reads_only_the_rows_that_changed() {
    let cfg = SegmentConfig {
        max_classes: 64,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let classes = common::timed_classes(&w, "wait/io/file/t/f", ClassKind::File, 50);
    let slots: Vec<_> = (0..20)
        .map(|t| w.alloc_thread(t + 1, t + 1, "w").unwrap())
        .collect();
    let mut id = 0;
    for s in &slots {
        for &c in &classes {
            id += 1;
            common::record_wait(
                w.segment().record(s.index),
                &common::wait_event(c, id, 5_000),
            );
        }
    }
    let reader = Segment::open(file, false).unwrap();
    let mut inc = IncrementalReader::default();
    let first = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert_eq!((first.stats.rows_read, first.stats.rows_reused), (1000, 0));
    // 1 % of the rows change: 10 rows on 10 threads.
    for (k, s) in slots.iter().take(10).enumerate() {
        id += 1;
        let e = common::wait_event(classes[k * 3], id, 9_000_000);
        common::record_wait(w.segment().record(s.index), &e);
    }
    let next = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert_eq!((next.stats.rows_read, next.stats.rows_reused), (10, 990));
    let full = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert_eq!(next.live_rows, full.live_rows);
    assert_eq!(common::total(&next, classes[0]).max_ps, 9_000_000);
    // About 45 bytes per kept row.
    let rows = inc.row_bytes();
    assert!(rows < 1000 * 48, "{rows} bytes kept for 1000 rows");
    assert!(inc.heap_bytes() > rows);
}

#[test]
fn totals_never_go_down_while_writers_run_and_exit() {
    let cfg = SegmentConfig {
        max_classes: 16,
        records_per_page: 4,
        max_pages: 16,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let w = Arc::new(w);
    let classes = common::timed_classes(&w, "wait/synch/mutex/t/c", ClassKind::Mutex, 8);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|n| {
            let (w, stop, classes) = (w.clone(), stop.clone(), classes.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(n + 11);
                let mut tid = n * 1_000_000;
                let mut events = 0u64;
                while !stop.load(Relaxed) {
                    tid += 1;
                    let slot = w.alloc_thread(tid, tid, "churn").unwrap();
                    let rec = w.segment().record(slot.index);
                    for id in 1..=rng.below(200) + 1 {
                        let c = classes[rng.below(classes.len() as u64) as usize];
                        common::record_wait(
                            rec,
                            &common::wait_event(c, id, 1 + rng.below(1 << 20)),
                        );
                        events += 1;
                    }
                    w.fold_and_free(slot);
                }
                events
            })
        })
        .collect();
    let reader = Segment::open(file, false).unwrap();
    let mut inc = IncrementalReader::default();
    let mut last = vec![0u64; classes.len()];
    let mut par = IncrementalReader::default();
    let mut last_split = vec![0u64; classes.len()];
    let mut taken = 0;
    for _ in 0..400 {
        // On 2 cores a writer preempted inside a fold can keep the global
        // section busy past the retry budget: the snapshot is then refused
        // (the agent exports the previous one), never wrong.
        let Ok(s) = inc.snapshot(&reader, &ReadOptions::summaries()) else {
            continue;
        };
        taken += 1;
        for (i, &c) in classes.iter().enumerate() {
            let n = common::total(&s, c).count;
            assert!(n >= last[i], "class {c}: {n} after {}", last[i]);
            last[i] = n;
        }
        // A split walk, as exact: never below an earlier total.
        if let Ok(p) = par.snapshot(&reader, &split_walks()) {
            for (i, &c) in classes.iter().enumerate() {
                let n = common::total(&p, c).count;
                assert!(
                    n >= last_split[i],
                    "split, class {c}: {n} after {}",
                    last_split[i]
                );
                last_split[i] = n;
            }
        }
    }
    assert!(taken > 100, "{taken} of 400 snapshots taken");
    stop.store(true, Relaxed);
    let events: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    let s = inc.snapshot(&reader, &ReadOptions::summaries()).unwrap();
    let full = snapshot(&reader, &ReadOptions::summaries()).unwrap();
    assert_eq!(view(&s), view(&full));
    let p = par.snapshot(&reader, &split_walks()).unwrap();
    assert_eq!(view(&p), view(&full), "split");
    let counted: u64 = classes.iter().map(|&c| common::total(&s, c).count).sum();
    assert_eq!(counted, events, "every event counted once");
}

/// A walk is split only into ranges of `records_per_thread` records or
/// more (whole pages of records), never into more than `threads`, and a
/// walk told 0 threads uses one.
#[test]
fn walks_are_split_into_ranges_of_enough_records() {
    let cfg = SegmentConfig {
        max_classes: 8,
        records_per_page: 16,
        max_pages: 16,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let reader = Segment::open(file, false).unwrap();
    let parts = |threads: usize, records_per_thread: u32| {
        let opts = ReadOptions {
            threads,
            records_per_thread,
            ..ReadOptions::summaries()
        };
        let s = snapshot(&reader, &opts).unwrap();
        assert_eq!(s.stats.restarts, 0);
        s.stats.parts
    };
    let mut tid = 0;
    for (pages, want) in [(4, 1), (5, 1), (8, 2), (9, 2), (12, 3), (16, 4)] {
        while tid < pages * 16 {
            tid += 1;
            w.alloc_thread(tid, tid, "t").unwrap();
        }
        let active = snapshot(&reader, &ReadOptions::summaries())
            .unwrap()
            .page_states
            .iter()
            .filter(|s| **s == pfs_shm_layout::container::PageState::Active)
            .count();
        assert_eq!(active as u64, pages, "{pages} pages of threads");
        assert_eq!(parts(4, 64), want, "{pages} pages, 64 records a thread");
        assert_eq!(parts(2, 64), want.min(2), "{pages} pages, two threads");
        // 24 records take two pages of 16 (5 pages: two ranges, not three).
        assert_eq!(
            parts(4, 24),
            (pages / 2).min(4),
            "{pages} pages, 24 records"
        );
    }
    assert_eq!(parts(0, 1), 1, "0 threads: the caller's");
    assert_eq!(parts(usize::MAX, 1), 16, "one range per page at most");
}

/// Records not kept are copied at once (one `pread` of their rows, each
/// row validated by its sequence): never a torn row, while writers keep
/// writing the very rows being copied. Every event of a class lasts the
/// same, so a consistent row (and any sum of them) has `SUM_TIMER_WAIT`
/// = `COUNT_STAR` × that time and as many events in its buckets; a new
/// reader each time copies every record.
#[test]
fn rows_copied_at_once_are_never_torn() {
    let cfg = SegmentConfig {
        max_classes: 16,
        records_per_page: 4,
        max_pages: 4,
        ..SegmentConfig::default()
    };
    let (file, w) = common::create(&cfg);
    let w = Arc::new(w);
    let classes = common::timed_classes(&w, "wait/synch/mutex/t/c", ClassKind::Mutex, 8);
    let wait_ps = |c: u32| 1_000 * (u64::from(c) + 1);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|n| {
            let (w, stop, classes) = (w.clone(), stop.clone(), classes.clone());
            std::thread::spawn(move || {
                let slot = w.alloc_thread(n + 1, n + 1, "writer").unwrap();
                let rec = w.segment().record(slot.index);
                let mut id = 0;
                while !stop.load(Relaxed) {
                    for &c in &classes {
                        id += 1;
                        common::record_wait(rec, &common::wait_event(c, id, wait_ps(c)));
                    }
                }
            })
        })
        .collect();
    let reader = Segment::open(file, false).unwrap();
    let mut copied = 0;
    for _ in 0..300 {
        let Ok(s) = IncrementalReader::default().snapshot(&reader, &ReadOptions::summaries())
        else {
            continue;
        };
        copied += s.stats.rows_read;
        for &c in &classes {
            let t = common::total(&s, c);
            assert_eq!(
                t.sum_ps,
                u128::from(t.count) * u128::from(wait_ps(c)),
                "class {c}: {t:?}"
            );
            assert_eq!(t.timed_count, t.count, "class {c}: {t:?}");
            assert_eq!(t.buckets.iter().sum::<u64>(), t.count, "class {c}: {t:?}");
        }
    }
    stop.store(true, Relaxed);
    for h in writers {
        h.join().unwrap();
    }
    assert!(copied > 0);
}
