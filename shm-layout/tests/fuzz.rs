//! Fuzz harness (proptest) over the segment validator and every read path
//! the agent uses: `Segment::open`, `reader::snapshot` (with and without
//! events), `setup::read_actors`, the setup writers on a writable mapping,
//! and `Segment::check`.
//!
//! Each case starts from a real, populated segment made with this crate's
//! writer API (classes of every kind, strings, threads with current and
//! history events, statements with text, memory rows, actors, exited
//! threads folded into the global rows, `history_long` rings), applies
//! 1 to 8 mutations biased toward the fields that steer the reader (header,
//! section directory, container header, page directory, lock words, string
//! and name lengths, ring counters), optionally truncates or extends the
//! file before the open, optionally truncates it while mapped, and reads.
//! The property: no panic, termination (a watchdog aborts a case stuck for
//! minutes), and results bounded by the file.
//!
//! `PFS_FUZZ_CASES` sets the number of cases (default 1500, a few seconds
//! in a debug build). The counts of executions, accepted and rejected
//! files are printed (`cargo test -p pfs-shm-layout --test fuzz --
//! --nocapture`).

mod fuzzgen;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuzzgen::{Case, bases, case, case_file, frac};
use pfs_shm_layout::layout::*;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::{Segment, SegmentError, setup};
use proptest::test_runner::{Config, TestRunner};

#[derive(Default)]
struct Tally {
    executions: AtomicU64,
    accepted: AtomicU64,
    snapshots_ok: AtomicU64,
    snapshots_err: AtomicU64,
    shrunk_mapped: AtomicU64,
    rejected: Mutex<BTreeMap<&'static str, u64>>,
}

fn kind(e: &SegmentError) -> &'static str {
    match e {
        SegmentError::Truncated { .. } => "truncated",
        SegmentError::BadMagic(_) => "bad_magic",
        SegmentError::ByteOrder(_) => "byte_order",
        SegmentError::UnsupportedVersion { .. } => "unsupported_version",
        SegmentError::NotReady => "not_ready",
        SegmentError::Corrupt(_) => "corrupt",
        SegmentError::Shrunk { .. } => "shrunk",
        SegmentError::Unreadable => "unreadable",
        _ => "other",
    }
}

/// Runs one case; panics (the property fails) on any violation.
fn run(c: &Case, tally: &Tally) {
    let f = case_file(c);
    let file_len = f.metadata().unwrap().len();
    tally.executions.fetch_add(1, Ordering::Relaxed);
    let seg = match Segment::open(f.try_clone().unwrap(), c.writable) {
        Ok(s) => s,
        Err(e) => {
            *tally.rejected.lock().unwrap().entry(kind(&e)).or_default() += 1;
            let _ = e.to_string();
            return;
        }
    };
    tally.accepted.fetch_add(1, Ordering::Relaxed);
    let sg = *seg.geometry();
    assert!(
        sg.total_size as u64 <= file_len,
        "accepted geometry {} exceeds the file {file_len}",
        sg.total_size
    );
    assert!(sg.max_classes <= MAX_CLASSES_LIMIT && sg.history_len <= 1024);
    if let Some(s) = c.shrink_mapped {
        f.set_len(frac(s, file_len as usize)).unwrap();
        tally.shrunk_mapped.fetch_add(1, Ordering::Relaxed);
    }
    for events in [true, false] {
        match snapshot(
            &seg,
            &ReadOptions {
                events,
                ..Default::default()
            },
        ) {
            Ok(s) => {
                tally.snapshots_ok.fetch_add(1, Ordering::Relaxed);
                // Results are bounded by what the file can hold.
                assert!(s.threads.len() as u64 <= u64::from(sg.max_records()));
                assert!(s.classes.len() <= sg.max_classes as usize);
                assert!(s.strings.len() <= sg.max_strings as usize);
                assert!(s.exited.len() + s.exited_memory.len() <= sg.max_classes as usize);
                assert!(s.long.iter().all(|l| l.len() <= sg.long_len as usize));
                for t in &s.threads {
                    assert!(t.waits_history.len() <= sg.history_len as usize);
                    assert!(t.rows.len() + t.memory.len() <= sg.max_classes as usize);
                }
            }
            Err(e) => {
                tally.snapshots_err.fetch_add(1, Ordering::Relaxed);
                let _ = e.to_string();
            }
        }
    }
    let _ = setup::read_actors(&seg);
    if c.writable {
        setup::set_instruments(&seg, "%", Some(true), Some(false));
        setup::set_consumers(&seg, "events_%", true);
        setup::set_timers(&seg, "%", TimerId::Nanosecond);
        let _ = setup::set_actor(&seg, "h", "u", "r", Some((Some(true), Some(false))));
        let _ = setup::set_actor(&seg, "%", "alice", "%", None);
    }
    let shrunk = c
        .shrink_mapped
        .is_some_and(|s| frac(s, file_len as usize) < sg.total_size as u64);
    match seg.check() {
        Ok(()) => assert!(!shrunk, "a segment truncated while mapped passed check()"),
        Err(e) => assert!(
            shrunk,
            "check() failed on a file that was not shrunk: {e} ({c:?})"
        ),
    }
}

#[test]
fn fuzz_validator_and_reader() {
    let cases: u32 = std::env::var("PFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let _ = bases();
    let tally = Arc::new(Tally::default());
    // Termination: a case that runs for minutes is a hang, not slowness.
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = Instant::now();
    {
        let (started, done) = (started.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last = (0, Instant::now());
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let n = started.load(Ordering::Relaxed);
                if n != last.0 {
                    last = (n, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(120) {
                    eprintln!("fuzz: case {n} has not terminated after 120 s");
                    std::process::abort();
                }
            }
        });
    }
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let t = tally.clone();
    let result = runner.run(&case(), move |c| {
        started.fetch_add(1, Ordering::Relaxed);
        run(&c, &t);
        Ok(())
    });
    done.store(true, Ordering::Relaxed);
    let rejected = tally.rejected.lock().unwrap().clone();
    let rejected_total: u64 = rejected.values().sum();
    println!(
        "fuzz: {} executions in {:.1?}: {} accepted ({} snapshots ok, {} failed cleanly, {} truncated while mapped), {} rejected {:?}",
        tally.executions.load(Ordering::Relaxed),
        t0.elapsed(),
        tally.accepted.load(Ordering::Relaxed),
        tally.snapshots_ok.load(Ordering::Relaxed),
        tally.snapshots_err.load(Ordering::Relaxed),
        tally.shrunk_mapped.load(Ordering::Relaxed),
        rejected_total,
        rejected,
    );
    if let Err(e) = result {
        panic!("fuzz case failed: {e}");
    }
    // The harness exercised both outcomes (a harness that only ever
    // rejects, or only accepts, tests nothing).
    assert!(tally.accepted.load(Ordering::Relaxed) > 0);
    assert!(rejected_total > 0);
}
