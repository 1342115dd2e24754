//! Fuzz harness (proptest) over the agent's whole read path: discovery and
//! validation of a mutated segment file, the snapshot, every PFS table (JSON
//! and text) and the OpenMetrics rendering, then the same after the file is
//! truncated under the mapping. The inputs are those of
//! `shm-layout/tests/fuzz.rs` (real populated segments, biased mutations).
//!
//! Property: no panic, termination, `/metrics` always renders. Runs
//! `PFS_FUZZ_CASES / 5` cases (default 200); prints the counts.

#[path = "../../shm-layout/tests/fuzzgen/mod.rs"]
mod fuzzgen;

use std::io::{Seek, SeekFrom};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuzzgen::{Case, case, case_file, frac};
use pfs_agent::export::prometheus;
use pfs_agent::filter::Filter;
use pfs_agent::segments::SegmentSet;
use pfs_agent::snapshot::Snapshotter;
use pfs_agent::tables;
use pfs_agent::truncate::Baselines;
use proptest::test_runner::{Config, TestRunner};

#[derive(Default)]
struct Tally {
    executions: AtomicU64,
    exported: AtomicU64,
    refused: AtomicU64,
    rows: AtomicU64,
}

fn exercise(snapshotter: &Arc<Snapshotter>, tally: &Tally) {
    let snap = snapshotter.take();
    for table in tables::registry() {
        let name = table.name();
        let t = tables::build(&**table, &snap, &Filter::default(), &Baselines::default());
        tally.rows.fetch_add(t.rows.len() as u64, Ordering::Relaxed);
        let json = t.to_json().to_string();
        if name != "performance_timers" {
            // The API streams the same bytes (timers are measured anew).
            let mut streamed = Vec::new();
            tables::write_json(
                &**table,
                &snap,
                &Filter::default(),
                &Baselines::default(),
                &mut streamed,
            )
            .expect("write to a Vec");
            assert!(streamed == json.as_bytes(), "{name}: streamed JSON differs");
        }
        let _ = t.to_text();
    }
    let registry = prometheus::registry(snapshotter.clone(), Default::default());
    prometheus::render(&registry).expect("/metrics renders");
}

fn run(c: &Case, dir: &std::path::Path, tally: &Tally) {
    let path = dir.join("case.pfs");
    let _ = std::fs::remove_file(&path);
    let mut src = case_file(c);
    src.seek(SeekFrom::Start(0)).unwrap();
    let mut dst = std::fs::File::create(&path).unwrap();
    std::io::copy(&mut src, &mut dst).unwrap();
    drop(dst);
    let len = std::fs::metadata(&path).unwrap().len();
    tally.executions.fetch_add(1, Ordering::Relaxed);
    let snapshotter = Arc::new(Snapshotter::new(
        SegmentSet::new(dir, Duration::MAX),
        Duration::ZERO,
    ));
    let snap = snapshotter.take();
    if snap.segments.is_empty() {
        tally.refused.fetch_add(1, Ordering::Relaxed);
    } else {
        tally.exported.fetch_add(1, Ordering::Relaxed);
    }
    exercise(&snapshotter, tally);
    if let Some(s) = c.shrink_mapped {
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(frac(s, len as usize))
            .unwrap();
        exercise(&snapshotter, tally);
    }
}

#[test]
fn fuzz_agent_read_path() {
    let cases: u32 = std::env::var("PFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(200, |n| (n / 5).max(1));
    let dir = tempfile::tempdir().unwrap();
    let tally = Arc::new(Tally::default());
    let t0 = Instant::now();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let t = tally.clone();
    let d = dir.path().to_path_buf();
    let result = runner.run(&case(), move |c| {
        run(&c, &d, &t);
        Ok(())
    });
    println!(
        "fuzz_agent: {} executions in {:.1?}: {} exported, {} refused, {} table rows built",
        tally.executions.load(Ordering::Relaxed),
        t0.elapsed(),
        tally.exported.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
        tally.rows.load(Ordering::Relaxed),
    );
    if let Err(e) = result {
        panic!("fuzz case failed: {e}");
    }
    assert!(tally.exported.load(Ordering::Relaxed) > 0);
    assert!(tally.refused.load(Ordering::Relaxed) > 0);
}
