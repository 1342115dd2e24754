//! Issue 6 across processes: page reclamation under a scanning reader.
//!
//! A real `pfs-test-writer reclaim` process runs waves of 48 threads (three
//! 16-record pages) that are all alive at once, then all exit. Its
//! maintenance thread reclaims the emptied pages after 100 ms of quiet and
//! revives them for the next wave. Throughout, a reader (this process,
//! with its own read-only mapping) takes snapshot after snapshot, and a
//! real agent serves the same directory. Checked:
//!
//! * the file's allocated blocks (`stat`) shrink by the three pages after
//!   each quiet phase, and the agent shows them as `reclaimed` in
//!   `pfs_container_pages`, the `container_pages` table and the
//!   `memory/performance_schema/thread_container_pages` row;
//! * later waves revive those pages: the container never grows past the
//!   three pages its peak needs;
//! * the reader never accepts a record of a reclaimed page, never sees one
//!   `(record, version)` pair with two different owners (versions survive
//!   reclamation), and never crashes.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use pfs_shm_layout::Segment;
use pfs_shm_layout::container::PageState;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_tests::{Agent, Writer, poll, rows, sample, str_col, u64_col, writer_exe};

const THREADS: usize = 48;
const WAVES: usize = 3;
const RPP: usize = 16;

#[derive(Debug, Default)]
struct ReaderReport {
    snapshots: u64,
    failed: u64,
    accepted_threads: u64,
    /// Problems found (must stay empty).
    problems: Vec<String>,
}

/// Scans the segment until `stop`, checking every accepted record.
fn reader(path: &Path, stop: &AtomicBool) -> Result<ReaderReport> {
    let seg = Segment::open(File::open(path)?, false).context("reader: open segment")?;
    let opts = ReadOptions::default();
    let mut owners: HashMap<(u32, u64), String> = HashMap::new();
    let mut rep = ReaderReport::default();
    while !stop.load(Relaxed) {
        let snap = match snapshot(&seg, &opts) {
            Ok(s) => s,
            Err(_) => {
                rep.failed += 1;
                continue;
            }
        };
        rep.snapshots += 1;
        for t in &snap.threads {
            rep.accepted_threads += 1;
            let page = (t.record as usize) / RPP;
            if snap.page_states.get(page) != Some(&PageState::Active) {
                rep.problems.push(format!(
                    "accepted thread {:?} on page {page} in state {:?}",
                    t.name,
                    snap.page_states.get(page)
                ));
            }
            let well_formed = t
                .name
                .strip_prefix('w')
                .and_then(|r| r.split_once('-'))
                .is_some_and(|(w, i)| w.parse::<usize>().is_ok() && i.parse::<usize>().is_ok());
            if !well_formed {
                rep.problems
                    .push(format!("accepted a record with name {:?}", t.name));
            }
            let prev = owners
                .entry((t.record, t.version))
                .or_insert_with(|| t.name.to_string());
            if **prev != *t.name {
                rep.problems.push(format!(
                    "record {} version {} seen as {prev:?} and as {:?}",
                    t.record, t.version, t.name
                ));
            }
        }
        if rep.problems.len() > 20 {
            break;
        }
    }
    Ok(rep)
}

fn allocated_bytes(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)?.blocks() * 512)
}

fn page_states(agent: &Agent) -> Result<Vec<String>> {
    let t = agent.table("container_pages")?;
    rows(&t)?
        .iter()
        .map(|r| str_col(r, "state").map(str::to_string))
        .collect()
}

#[test]
fn pages_are_reclaimed_and_revived_under_a_scanning_reader() -> Result<()> {
    // tmpfs, where the memory really is the file's.
    let base = if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm")?
    } else {
        tempfile::tempdir()?
    };
    let dir = base.path();
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "reclaim",
            "--shm-dir",
            dir.to_str().unwrap(),
            "--service",
            "reclaim",
            "--waves",
            &WAVES.to_string(),
            "--threads",
            &THREADS.to_string(),
            "--reclaim-ms",
            "100",
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    let path = w.segment_in(dir, "reclaim");
    ensure!(
        ready["segment"].as_str() == path.to_str(),
        "unexpected ready line {ready}"
    );
    let agent = Agent::serve(dir)?;
    let stop = Arc::new(AtomicBool::new(false));
    let scan = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || reader(&path, &stop))
    };
    let page_size = {
        let seg = Segment::open(File::open(&path)?, false)?;
        seg.geometry().page_size as u64
    };
    let pages = THREADS.div_ceil(RPP);
    let mut peak_blocks = Vec::new();
    let mut idle_blocks = Vec::new();
    for wave in 0..WAVES {
        let peak = w.read_json(Duration::from_secs(60))?;
        ensure!(peak["phase"] == "peak" && peak["wave"] == wave, "{peak}");
        // All 48 threads are alive: the agent sees them on 3 active pages.
        poll(Duration::from_secs(20), || {
            let states = page_states(&agent)?;
            let threads = agent.table("threads")?;
            let live = rows(&threads)?.len();
            Ok(
                (live == THREADS && states.len() == pages && states.iter().all(|s| s == "ACTIVE"))
                    .then_some(()),
            )
        })
        .with_context(|| {
            format!("wave {wave}: waiting for {THREADS} threads on {pages} active pages")
        })?;
        peak_blocks.push(allocated_bytes(&path)?);
        w.send_line("exit")?;
        let idle = w.read_json(Duration::from_secs(60))?;
        ensure!(idle["phase"] == "idle" && idle["wave"] == wave, "{idle}");
        // Quiet: the maintenance thread reclaims all three pages.
        let reclaimed = poll(Duration::from_secs(20), || {
            let states = page_states(&agent)?;
            Ok(
                (states.len() == pages && states.iter().all(|s| s == "RECLAIMED"))
                    .then_some(states),
            )
        })
        .with_context(|| format!("wave {wave}: waiting for the pages to be reclaimed"))?;
        ensure!(
            reclaimed.len() == pages,
            "the container grew: {reclaimed:?}"
        );
        let blocks = allocated_bytes(&path)?;
        idle_blocks.push(blocks);
        ensure!(
            peak_blocks[wave] >= blocks + pages as u64 * page_size,
            "wave {wave}: allocated bytes went from {} at the peak to {blocks} when idle; \
             expected a drop of at least {} ({pages} pages of {page_size} B)",
            peak_blocks[wave],
            pages as u64 * page_size
        );
        let metrics = agent.metrics()?;
        for (state, want) in [("active", 0.0), ("reclaimed", pages as f64)] {
            let v = poll(Duration::from_secs(5), || {
                let m = agent.metrics()?;
                let v = sample(
                    &m,
                    "pfs_container_pages",
                    &[("service", "reclaim"), ("state", state)],
                )?;
                Ok((v == want).then_some(v))
            })
            .with_context(|| {
                format!(
                    "pfs_container_pages{{state={state}}} (last scrape {} samples)",
                    metrics.len()
                )
            })?;
            ensure!(v == want);
        }
        let mem = agent.table("memory_summary_global_by_event_name")?;
        let row = rows(&mem)?
            .iter()
            .find(|r| r["event_name"] == "memory/performance_schema/thread_container_pages")
            .context("no thread_container_pages memory row")?;
        ensure!(
            u64_col(row, "current_number_of_bytes_used")? == 0
                && u64_col(row, "count_free")? == (wave as u64 + 1) * pages as u64
                && u64_col(row, "high_number_of_bytes_used")? == pages as u64 * page_size,
            "thread_container_pages row after wave {wave}: {row}"
        );
        w.send_line("next")?;
    }
    let done = w.read_json(Duration::from_secs(60))?;
    ensure!(done["done"] == true, "{done}");
    stop.store(true, Relaxed);
    let rep = scan.join().expect("reader thread panicked")?;
    eprintln!(
        "reader: {} snapshots ({} failed), {} accepted thread copies; allocated bytes at peaks {:?}, idle {:?} (page {} B)",
        rep.snapshots, rep.failed, rep.accepted_threads, peak_blocks, idle_blocks, page_size
    );
    if !rep.problems.is_empty() {
        bail!("reader found problems: {:#?}", rep.problems);
    }
    ensure!(rep.snapshots > 0 && rep.accepted_threads > 0, "{rep:?}");
    let lost = sample(
        &agent.metrics()?,
        "pfs_lost_total",
        &[("service", "reclaim"), ("kind", "thread_instances")],
    )?;
    ensure!(lost == 0.0, "threads lost: {lost}");
    w.finish(Duration::from_secs(30))?;
    Ok(())
}
