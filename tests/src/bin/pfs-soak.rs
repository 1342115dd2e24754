//! `pfs-soak`: the combined soak (scripts/soak, docs/SOAK.md). One run
//! puts every hazard of the segment together: torn writers, thread churn
//! and page reclamation on every maintenance tick, in a child process,
//! against a validating reader in this process and a real `pfs-agent`
//! scraped over HTTP. It ends with exact totals and one line on stdout:
//!
//! `soak: minutes=M reads_validated=N torn_accepted=0 decreases=0 lost_or_doubled=0`
//!
//! ```text
//! pfs-soak [--minutes M | --seconds S] [--agent PATH] [--torn N] [--burst B]
//! pfs-soak writer --shm-dir D --torn N --burst B     (the child it runs)
//! ```
//!
//! Exit status: 0 when all three figures are 0 (and the run really did
//! churn, reclaim and read), 1 otherwise, 2 when the soak itself could not
//! run (a child died, a timeout).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::channel;
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use pfs_client::LazyWaitClass;
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{Event, ReadOptions, ReadStats, SegmentSnapshot, snapshot};
use pfs_tests::torn::{self, Tally};
use pfs_tests::{ChildGuard, Writer, free_port, get_json, http_get, parse_metrics, rows, sample};
use serde_json::{Value, json};

const SERVICE: &str = "soak";
const CLASS_NAMES: [&str; 3] = [
    "wait/synch/mutex/soak/a",
    "wait/synch/rwlock/soak/b",
    "wait/io/file/soak/c",
];
static CLASS_A: LazyWaitClass = LazyWaitClass::new(CLASS_NAMES[0]);
static CLASS_B: LazyWaitClass = LazyWaitClass::new(CLASS_NAMES[1]);
static CLASS_C: LazyWaitClass = LazyWaitClass::new(CLASS_NAMES[2]);
static CLASSES: [&LazyWaitClass; 3] = [&CLASS_A, &CLASS_B, &CLASS_C];
/// Small pages, so that a burst spreads over several of them.
const RECORDS_PER_PAGE: u32 = 8;
/// How long the trickle between two bursts lasts: longer than the
/// maintenance tick (10 ms), so the burst's pages get reclaimed.
const TRICKLE: Duration = Duration::from_millis(25);
/// Pause between two `/metrics` scrapes.
const SCRAPE_PAUSE: Duration = Duration::from_millis(50);
const TORN_PREFIX: &str = "soak-torn-";
const CHURN_PREFIX: &str = "soak-churn-";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = if args.first().map(String::as_str) == Some("writer") {
        writer_main(&args[1..]).map(|()| ExitCode::SUCCESS)
    } else {
        driver_main(&args)
    };
    r.unwrap_or_else(|e| {
        eprintln!("soak: error: {e:#}");
        ExitCode::from(2)
    })
}

/// `--key value` options.
fn options(args: &[String]) -> Result<HashMap<String, String>> {
    let mut opts = HashMap::new();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let Some(k) = k.strip_prefix("--") else {
            bail!(
                "unexpected argument {k:?} (usage: pfs-soak [--minutes M | --seconds S] [--agent PATH] [--torn N] [--burst B])"
            )
        };
        let v = it.next().ok_or_else(|| anyhow!("--{k} needs a value"))?;
        opts.insert(k.to_string(), v.clone());
    }
    Ok(opts)
}

fn num_opt<T: std::str::FromStr>(opts: &HashMap<String, String>, k: &str, d: T) -> Result<T> {
    match opts.get(k) {
        Some(v) => v
            .parse()
            .map_err(|_| anyhow!("--{k} {v:?} is not a valid number")),
        None => Ok(d),
    }
}

// ---------------------------------------------------------------------------
// The writer (child process)
// ---------------------------------------------------------------------------

fn checkable_wait(id: u64, tally: &mut Tally) -> bool {
    torn::checkable_wait(&CLASSES, id, tally)
}

fn print(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Blocks until the driver writes a line (or closes stdin).
fn wait_stdin_line() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// What the churn threads recorded.
#[derive(Debug, Default)]
struct ChurnReport {
    threads: u64,
    bursts: u64,
    unrecorded: u64,
    tally: Tally,
}

/// A short-lived thread `soak-churn-{seq}`: records `1 + seq % 40`
/// checkable waits, waits for the rest of its burst (if any) and exits.
fn spawn_churn(seq: u64, burst: Option<Arc<Barrier>>) -> Result<JoinHandle<(Tally, bool)>> {
    Ok(std::thread::Builder::new()
        .name(format!("{CHURN_PREFIX}{seq}"))
        .spawn(move || {
            let mut tally = Tally::default();
            let mut recorded = true;
            for id in 1..=1 + seq % 40 {
                if !checkable_wait(id, &mut tally) {
                    recorded = false;
                    break;
                }
            }
            if let Some(b) = burst {
                b.wait();
            }
            (tally, recorded)
        })?)
}

/// Churn until `stop`: a burst of `burst` threads alive at once (spread
/// over several container pages), all exiting together, then a trickle of
/// one short thread at a time, during which the maintenance thread
/// reclaims the pages the burst emptied; the next burst revives them.
fn churn(stop: &AtomicBool, burst: usize) -> Result<ChurnReport> {
    let mut rep = ChurnReport::default();
    let mut seq = 0u64;
    let reap = |rep: &mut ChurnReport, h: JoinHandle<(Tally, bool)>| -> Result<()> {
        let (tally, recorded) = h.join().map_err(|_| anyhow!("a churn thread panicked"))?;
        rep.threads += 1;
        rep.tally.add(&tally);
        rep.unrecorded += u64::from(!recorded);
        Ok(())
    };
    while !stop.load(Relaxed) {
        let barrier = Arc::new(Barrier::new(burst));
        let mut handles = Vec::with_capacity(burst);
        for _ in 0..burst {
            seq += 1;
            handles.push(spawn_churn(seq, Some(barrier.clone()))?);
        }
        for h in handles {
            reap(&mut rep, h)?;
        }
        rep.bursts += 1;
        let until = Instant::now() + TRICKLE;
        while Instant::now() < until && !stop.load(Relaxed) {
            seq += 1;
            let h = spawn_churn(seq, None)?;
            reap(&mut rep, h)?;
        }
    }
    Ok(rep)
}

/// The instrumented child: `torn` threads hammer checkable waits while a
/// driver thread churns. Reclamation runs on every maintenance tick (a
/// quiet time of zero: the tick is then its 10 ms floor). Protocol on
/// stdout/stdin: `{"ready"}`; on a line, stop recording and print
/// `{"stopped", "torn": [{name, tally}], "churn": {..}}` with the torn
/// threads still alive; on a line, let them exit, print `{"done"}`, and
/// exit at stdin EOF.
fn writer_main(args: &[String]) -> Result<()> {
    let opts = options(args)?;
    let dir = opts.get("shm-dir").context("--shm-dir is required")?;
    let torn: usize = num_opt(&opts, "torn", 2)?;
    let burst: usize = num_opt(&opts, "burst", 40)?;
    ensure!(burst > 0, "--burst must be positive");
    let mut cfg = pfs_client::Config::new(SERVICE)
        .shm_dir(dir)
        .reclaim_after(Some(Duration::ZERO));
    cfg.records_per_page = RECORDS_PER_PAGE;
    pfs_client::init_with(cfg).context("pfs_client::init_with")?;
    for c in CLASSES {
        ensure!(c.get().is_enabled(), "class {} is not enabled", c.name());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let release = Arc::new(Barrier::new(torn + 1));
    let (tx, rx) = channel::<(String, Tally)>();
    let mut torn_handles = Vec::new();
    for t in 0..torn {
        let (stop, release, tx) = (stop.clone(), release.clone(), tx.clone());
        let name = format!("{TORN_PREFIX}{t}");
        torn_handles.push(
            std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let mut tally = Tally::default();
                    let mut id = 0u64;
                    while !stop.load(Relaxed) {
                        for _ in 0..64 {
                            id += 1;
                            assert!(
                                checkable_wait(id, &mut tally),
                                "torn writer thread lost its record"
                            );
                        }
                    }
                    let _ = tx.send((name, tally));
                    release.wait();
                })?,
        );
    }
    drop(tx);
    let churner = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("soak-churn-driver".into())
            .spawn(move || churn(&stop, burst))?
    };
    let segment = pfs_client::segment_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    print(json!({"ready": true, "pid": std::process::id(), "segment": segment}));
    wait_stdin_line();
    stop.store(true, Relaxed);
    let churned = churner
        .join()
        .map_err(|_| anyhow!("the churn driver panicked"))??;
    let mut torn_tallies: Vec<(String, Tally)> = rx.iter().take(torn).collect();
    ensure!(torn_tallies.len() == torn, "a torn writer thread died");
    torn_tallies.sort_by(|a, b| a.0.cmp(&b.0));
    let torn_json: Vec<Value> = torn_tallies
        .iter()
        .map(|(n, t)| json!({"name": n, "tally": t.json()}))
        .collect();
    print(json!({
        "stopped": true,
        "torn": torn_json,
        "churn": {
            "threads": churned.threads,
            "bursts": churned.bursts,
            "unrecorded": churned.unrecorded,
            "tally": churned.tally.json(),
        },
    }));
    wait_stdin_line();
    release.wait();
    for h in torn_handles {
        h.join()
            .map_err(|_| anyhow!("a torn writer thread panicked"))?;
    }
    print(json!({"done": true}));
    let mut buf = [0u8; 64];
    while std::io::stdin().lock().read(&mut buf).is_ok_and(|n| n > 0) {}
    Ok(())
}

// ---------------------------------------------------------------------------
// The reader (a thread of the driver, with its own read-only mapping)
// ---------------------------------------------------------------------------

/// Per class: count, timed count, sum of timers, bytes.
type Totals = [(u64, u64, u128, u64); 3];

/// Validates every accepted copy and every figure across snapshots.
#[derive(Default)]
struct Checker {
    /// Accepted copies that fail validation (torn_accepted).
    torn_accepted: u64,
    /// Figures that went down between two snapshots.
    decreases: u64,
    examples: Vec<String>,
    events: u64,
    rows: u64,
    snapshots: u64,
    /// (thread_id, class) -> last count, for threads of the last snapshot.
    last_counts: HashMap<(u64, u32), u64>,
    /// thread_id -> newest EVENT_ID seen.
    last_event: HashMap<u64, u64>,
    /// record -> (version, thread_id) of the newest lifetime seen.
    owners: HashMap<u32, (u64, u64)>,
    prev_totals: Option<Totals>,
}

impl Checker {
    fn note(&mut self, msg: String) {
        if self.examples.len() < 20 {
            self.examples.push(msg);
        }
    }

    fn torn(&mut self, msg: String) {
        self.torn_accepted += 1;
        self.note(msg);
    }

    fn decrease(&mut self, msg: String) {
        self.decreases += 1;
        self.note(msg);
    }

    /// Checks one accepted event copy of thread `tid` (class index ->
    /// position in [`CLASS_NAMES`] in `class_of`).
    fn check_event(&mut self, tid: u64, e: &Event, class_of: &HashMap<u32, usize>, what: &str) {
        self.events += 1;
        let bad = torn::event_flaws(e, class_of);
        if !bad.is_empty() {
            self.torn(format!(
                "thread {tid} {what} event {}: {}",
                e.event_id,
                bad.join(", ")
            ));
        }
    }

    /// Checks one snapshot: every accepted event and row, each record's
    /// owner, and that no count, EVENT_ID or class total went down.
    fn check(&mut self, snap: &SegmentSnapshot) {
        self.snapshots += 1;
        let class_of = class_map(snap);
        if class_of.len() != 3 {
            self.torn(format!(
                "the 3 soak classes are not all registered: {:?}",
                snap.classes
            ));
        }
        let rpp = snap.geometry.records_per_page.max(1);
        let mut seen_threads = HashSet::new();
        for t in &snap.threads {
            let tid = t.thread_id;
            seen_threads.insert(tid);
            let well_formed = [TORN_PREFIX, CHURN_PREFIX].iter().any(|p| {
                t.name
                    .strip_prefix(p)
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            });
            if !well_formed {
                self.torn(format!("accepted a record named {:?}", t.name));
            }
            let page = (t.record / rpp) as usize;
            if snap.page_states.get(page) != Some(&pfs_shm_layout::container::PageState::Active) {
                self.torn(format!(
                    "thread {tid} accepted on page {page} in state {:?}",
                    snap.page_states.get(page)
                ));
            }
            // A record's (index, version) pairs never repeat, and its
            // version never goes back (reclamation keeps it).
            match self.owners.get(&t.record).copied() {
                Some((v, owner)) if t.version == v && owner != tid => self.torn(format!(
                    "record {} version {v} seen as thread {owner} and as thread {tid}",
                    t.record
                )),
                Some((v, _)) if t.version < v => self.torn(format!(
                    "record {} version went back from {v} to {} (thread {tid})",
                    t.record, t.version
                )),
                _ => {
                    self.owners.insert(t.record, (t.version, tid));
                }
            }
            let mut max_id = 0;
            if let Some(e) = &t.waits_current {
                self.check_event(tid, e, &class_of, "current");
                max_id = e.event_id;
            }
            let mut prev = 0;
            for e in &t.waits_history {
                if e.end_event_id.is_none() {
                    self.torn(format!(
                        "thread {tid} history event {} not ended",
                        e.event_id
                    ));
                }
                if e.event_id <= prev {
                    self.torn(format!("thread {tid} history not strictly ordered"));
                }
                prev = e.event_id;
                self.check_event(tid, e, &class_of, "history");
                max_id = max_id.max(e.event_id);
            }
            if snap.stats.skipped_events == 0 && max_id > 0 {
                let last = self.last_event.entry(tid).or_insert(0);
                if max_id < *last {
                    let last = *last;
                    self.decrease(format!(
                        "thread {tid}: newest EVENT_ID went from {last} to {max_id}"
                    ));
                }
                self.last_event.insert(tid, max_id);
            }
            let mut total = 0u64;
            for (class, s) in &t.rows {
                self.rows += 1;
                total += s.count;
                let mut bad = torn::row_flaws(s);
                if !class_of.contains_key(class) {
                    bad.push("not a soak class".to_string());
                }
                if !bad.is_empty() {
                    self.torn(format!(
                        "thread {tid} row of class {class}: {}",
                        bad.join(", ")
                    ));
                }
                let last = self.last_counts.entry((tid, *class)).or_insert(0);
                if s.count < *last {
                    let last = *last;
                    self.decrease(format!(
                        "thread {tid} class {class}: count went from {last} to {}",
                        s.count
                    ));
                }
                self.last_counts.insert((tid, *class), s.count);
            }
            // Rows are copied after the events: every event before the
            // newest one seen is already summarised.
            if max_id > 0 && total + 1 < max_id && t.skipped_rows.is_empty() {
                self.torn(format!(
                    "thread {tid}: rows count {total} lags the newest EVENT_ID {max_id}"
                ));
            }
        }
        self.last_counts
            .retain(|(tid, _), _| seen_threads.contains(tid));
        self.last_event.retain(|tid, _| seen_threads.contains(tid));
        // Live + exited, per class: never down. A snapshot with a skipped
        // row lacks that row: neither compared nor kept as the baseline.
        if snap.stats.skipped_rows == 0 {
            let cur = totals(snap, &class_of);
            if let Some(prev) = self.prev_totals {
                for i in 0..3 {
                    let (p, c) = (prev[i], cur[i]);
                    if c.0 < p.0 || c.1 < p.1 || c.2 < p.2 || c.3 < p.3 {
                        self.decrease(format!(
                            "{}: live + exited went from {p:?} to {c:?}",
                            CLASS_NAMES[i]
                        ));
                    }
                }
            }
            self.prev_totals = Some(cur);
        }
    }
}

/// Live rows + exited rows of the soak classes.
fn totals(snap: &SegmentSnapshot, class_of: &HashMap<u32, usize>) -> Totals {
    let mut out: Totals = Default::default();
    let rows = snap
        .threads
        .iter()
        .flat_map(|t| t.rows.iter())
        .chain(snap.exited.iter())
        .chain(snap.live_rows.iter());
    for (c, r) in rows {
        if let Some(&i) = class_of.get(c) {
            out[i].0 += r.count;
            out[i].1 += r.timed_count;
            out[i].2 += r.sum_ps;
            out[i].3 += r.bytes;
        }
    }
    out
}

fn class_map(snap: &SegmentSnapshot) -> HashMap<u32, usize> {
    snap.classes
        .iter()
        .filter_map(|c| {
            CLASS_NAMES
                .iter()
                .position(|n| *n == c.name)
                .map(|i| (c.index, i))
        })
        .collect()
}

/// Live figures, for the progress lines.
#[derive(Default)]
struct Progress {
    reads_validated: AtomicU64,
    torn_accepted: AtomicU64,
    decreases: AtomicU64,
    snapshots: AtomicU64,
    folds: AtomicU64,
    pages_reclaimed: AtomicU64,
    pages_revived: AtomicU64,
    scrapes: AtomicU64,
}

struct ReaderReport {
    ck: Checker,
    stats: ReadStats,
    errors: u64,
    longest_error_run: u64,
    first_error: Option<String>,
    max_live: usize,
    max_pages: u32,
}

/// Snapshots the segment as fast as it can until `stop`, checking each.
fn reader(path: &Path, stop: &AtomicBool, prog: &Progress) -> Result<ReaderReport> {
    let seg = Segment::open(File::open(path)?, false).context("reader: open the segment")?;
    let opts = ReadOptions::default();
    let mut rep = ReaderReport {
        ck: Checker::default(),
        stats: ReadStats::default(),
        errors: 0,
        longest_error_run: 0,
        first_error: None,
        max_live: 0,
        max_pages: 0,
    };
    let mut run = 0;
    while !stop.load(Relaxed) {
        let s = match snapshot(&seg, &opts) {
            Ok(s) => s,
            Err(e) => {
                // A fold storm is a documented transient: the next pass
                // succeeds. Counted, and reported.
                rep.errors += 1;
                run += 1;
                rep.longest_error_run = rep.longest_error_run.max(run);
                rep.first_error.get_or_insert_with(|| e.to_string());
                continue;
            }
        };
        run = 0;
        rep.stats.add(&s.stats);
        rep.ck.check(&s);
        rep.max_live = rep.max_live.max(s.threads.len());
        rep.max_pages = rep.max_pages.max(s.pages);
        prog.reads_validated
            .store(rep.ck.events + rep.ck.rows, Relaxed);
        prog.torn_accepted.store(rep.ck.torn_accepted, Relaxed);
        prog.decreases.store(rep.ck.decreases, Relaxed);
        prog.snapshots.store(rep.ck.snapshots, Relaxed);
        prog.folds.store(s.threads_exited, Relaxed);
        prog.pages_reclaimed.store(s.pages_reclaimed, Relaxed);
        prog.pages_revived.store(s.pages_revived, Relaxed);
    }
    Ok(rep)
}

// ---------------------------------------------------------------------------
// The agent scraper
// ---------------------------------------------------------------------------

#[derive(Default)]
struct ScrapeReport {
    scrapes: u64,
    table_reads: u64,
    errors: u64,
    first_error: Option<String>,
    decreases: u64,
    examples: Vec<String>,
    /// Series (name and labels) -> last value.
    last: HashMap<String, f64>,
}

impl ScrapeReport {
    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }

    fn observe(&mut self, key: String, v: f64) {
        if let Some(&p) = self.last.get(&key)
            && v < p
        {
            self.decreases += 1;
            if self.examples.len() < 20 {
                self.examples.push(format!("{key} went from {p} to {v}"));
            }
        }
        self.last.insert(key, v);
    }

    /// Every counter and histogram sample of one `/metrics` body.
    fn metrics(&mut self, body: &str) -> Result<()> {
        let mut kinds: HashMap<&str, &str> = HashMap::new();
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut w = rest.split_whitespace();
                if let (Some(f), Some(k)) = (w.next(), w.next()) {
                    kinds.insert(f, k);
                }
            }
        }
        for s in parse_metrics(body)? {
            let monotonic = [("_total", "counter"), ("_bucket", "histogram")]
                .into_iter()
                .chain([("_count", "histogram"), ("_sum", "histogram")])
                .any(|(suffix, kind)| {
                    s.name
                        .strip_suffix(suffix)
                        .is_some_and(|f| kinds.get(f) == Some(&kind))
                });
            if monotonic {
                let key = format!("{}{:?}", s.name, s.labels);
                self.observe(key, s.value);
            }
        }
        Ok(())
    }

    /// COUNT_STAR and SUM_TIMER_WAIT of the global waits summary table.
    fn table(&mut self, t: &Value) -> Result<()> {
        for r in rows(t)? {
            let key = format!(
                "events_waits_summary_global_by_event_name[{} {} {}]",
                r["service"], r["pid"], r["event_name"]
            );
            for col in ["count_star", "sum_timer_wait"] {
                if let Some(v) = r[col].as_f64() {
                    self.observe(format!("{key}.{col}"), v);
                }
            }
        }
        Ok(())
    }
}

/// Scrapes `/metrics` (and, every fifth time, a summary table) until `stop`.
fn scraper(base: &str, stop: &AtomicBool, prog: &Progress) -> ScrapeReport {
    let mut rep = ScrapeReport::default();
    while !stop.load(Relaxed) {
        match http_get(&format!("{base}/metrics")) {
            Ok(r) if r.status == 200 => {
                if let Err(e) = rep.metrics(&r.body) {
                    rep.error(format!("{e:#}"));
                }
                rep.scrapes += 1;
            }
            Ok(r) => rep.error(format!("/metrics answered {}", r.status)),
            Err(e) => rep.error(format!("{e:#}")),
        }
        if rep.scrapes % 5 == 0 {
            let url = format!("{base}/api/v1/tables/events_waits_summary_global_by_event_name");
            match get_json(&url).and_then(|t| rep.table(&t)) {
                Ok(()) => rep.table_reads += 1,
                Err(e) => rep.error(format!("{e:#}")),
            }
        }
        prog.scrapes.store(rep.scrapes, Relaxed);
        std::thread::sleep(SCRAPE_PAUSE);
    }
    rep
}

// ---------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------

/// What the writer says it recorded.
struct Expected {
    torn: Vec<(String, Tally)>,
    total: Tally,
    threads: u64,
}

fn expected(stopped: &Value) -> Result<Expected> {
    ensure!(
        stopped["stopped"] == true,
        "unexpected writer line {stopped}"
    );
    let mut total = Tally::from_json(&stopped["churn"]["tally"])?;
    let mut torn = Vec::new();
    for t in stopped["torn"]
        .as_array()
        .ok_or_else(|| anyhow!("no torn list: {stopped}"))?
    {
        let name = t["name"]
            .as_str()
            .ok_or_else(|| anyhow!("torn entry without a name: {t}"))?;
        let tally = Tally::from_json(&t["tally"])?;
        total.add(&tally);
        torn.push((name.to_string(), tally));
    }
    let churned = stopped["churn"]["threads"]
        .as_u64()
        .ok_or_else(|| anyhow!("no churn thread count: {stopped}"))?;
    Ok(Expected {
        threads: churned + torn.len() as u64,
        torn,
        total,
    })
}

/// Reconciles a row of figures with what was recorded: the events lost or
/// doubled, plus one for a count that matches but whose timer or bytes
/// sums do not (an event counted with another's values).
fn mismatch(
    what: &str,
    want: (u64, u64, u64),
    got: (u64, u128, u64),
    out: &mut Vec<String>,
) -> u64 {
    let lost = want.0.abs_diff(got.0);
    let sums = u64::from(lost == 0 && (u128::from(want.1) != got.1 || want.2 != got.2));
    if lost + sums > 0 {
        out.push(format!(
            "{what}: recorded (count {}, sum_ps {}, bytes {}), summaries show (count {}, sum_ps {}, bytes {})",
            want.0, want.1, want.2, got.0, got.1, got.2
        ));
    }
    lost + sums
}

/// A snapshot with no row skipped, taken within 10 s.
fn settled_snapshot(seg: &Segment) -> Result<SegmentSnapshot> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match snapshot(seg, &ReadOptions::default()) {
            Ok(s) if s.stats.skipped_rows == 0 => return Ok(s),
            Ok(_) => {}
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => {}
        }
        ensure!(
            Instant::now() < deadline,
            "no complete snapshot within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The segment's figures against what was recorded: per class (live +
/// exited) and, while the torn threads are alive, per torn thread.
fn reconcile_segment(
    snap: &SegmentSnapshot,
    exp: &Expected,
    per_thread: bool,
    out: &mut Vec<String>,
) -> u64 {
    let class_of = class_map(snap);
    let mut lod = 0;
    let tot = totals(snap, &class_of);
    for (i, class) in CLASS_NAMES.iter().enumerate() {
        lod += mismatch(
            &format!("reader, {class}"),
            (exp.total.count[i], exp.total.sum_ps[i], exp.total.bytes[i]),
            (tot[i].0, tot[i].2, tot[i].3),
            out,
        );
    }
    if per_thread {
        for (name, tally) in &exp.torn {
            let Some(t) = snap.threads.iter().find(|t| *t.name == **name) else {
                out.push(format!(
                    "reader: torn thread {name} not live before its exit"
                ));
                lod += tally.count.iter().sum::<u64>();
                continue;
            };
            for (i, class) in CLASS_NAMES.iter().enumerate() {
                let row = class_of
                    .iter()
                    .find(|(_, p)| **p == i)
                    .and_then(|(c, _)| t.rows.iter().find(|(rc, _)| rc == c))
                    .map(|(_, s)| (s.count, s.sum_ps, s.bytes))
                    .unwrap_or_default();
                lod += mismatch(
                    &format!("reader, {name}, {class}"),
                    (tally.count[i], tally.sum_ps[i], tally.bytes[i]),
                    row,
                    out,
                );
            }
        }
    }
    lod
}

/// The agent's `/metrics` against what was recorded, per class; polls for
/// up to 20 s for the agent to catch up.
fn reconcile_agent(base: &str, exp: &Expected, out: &mut Vec<String>) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut found = Vec::new();
        let lod = match http_get(&format!("{base}/metrics"))
            .and_then(|r| parse_metrics(&r.body))
        {
            Ok(m) => (0..3)
                .map(|i| {
                    let l = [("service", SERVICE), ("event_name", CLASS_NAMES[i])];
                    let count = sample(&m, "pfs_events_waits_total", &l).unwrap_or(0.0);
                    let secs = sample(&m, "pfs_events_waits_seconds_total", &l).unwrap_or(0.0);
                    let want_secs = exp.total.sum_ps[i] as f64 / 1e12;
                    let lost = exp.total.count[i].abs_diff(count as u64);
                    let sums = u64::from(
                        lost == 0 && (secs - want_secs).abs() > 1e-9 * want_secs.max(1e-12),
                    );
                    if lost + sums > 0 {
                        found.push(format!(
                            "agent, {}: recorded {} waits ({want_secs} s), /metrics shows {count} ({secs} s)",
                            CLASS_NAMES[i], exp.total.count[i]
                        ));
                    }
                    lost + sums
                })
                .sum(),
            Err(e) => {
                found.push(format!("agent: /metrics: {e:#}"));
                exp.total.count.iter().sum()
            }
        };
        if lod == 0 || Instant::now() >= deadline {
            out.extend(found);
            return lod;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The end of a run: what was recorded, what the reconciliation found,
/// and the container's reclamation totals.
struct Outcome {
    exp: Expected,
    lost_or_doubled: u64,
    notes: Vec<String>,
    reclaimed: u64,
    revived: u64,
}

/// `minutes` as printed: at most two decimals, no trailing zeros.
fn minutes_text(m: f64) -> String {
    let s = format!("{m:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn driver_main(args: &[String]) -> Result<ExitCode> {
    let opts = options(args)?;
    let seconds: f64 = match opts.get("seconds") {
        Some(_) => num_opt(&opts, "seconds", 0.0)?,
        None => num_opt(&opts, "minutes", 10.0)? * 60.0,
    };
    ensure!(
        seconds.is_finite() && seconds > 0.0,
        "the duration must be positive"
    );
    let torn: usize = num_opt(&opts, "torn", 2)?;
    let burst: usize = num_opt(&opts, "burst", 40)?;
    let exe = std::env::current_exe()?;
    let agent_path = match opts.get("agent") {
        Some(p) => PathBuf::from(p),
        None => exe
            .parent()
            .map(|d| d.join("pfs-agent"))
            .ok_or_else(|| anyhow!("no directory for {}", exe.display()))?,
    };
    ensure!(
        agent_path.is_file(),
        "no agent at {} (cargo build --release -p pfs-agent, or --agent PATH)",
        agent_path.display()
    );
    // tmpfs, where reclaimed pages really give memory back.
    let dir = if Path::new("/dev/shm").is_dir() {
        tempfile::Builder::new()
            .prefix("pfs-soak")
            .tempdir_in("/dev/shm")?
    } else {
        tempfile::Builder::new().prefix("pfs-soak").tempdir()?
    };
    let d = dir.path().to_str().context("non-UTF-8 temp dir")?;
    let (torn_s, burst_s) = (torn.to_string(), burst.to_string());
    let mut w = Writer::spawn(
        &exe,
        &[
            "writer",
            "--shm-dir",
            d,
            "--torn",
            &torn_s,
            "--burst",
            &burst_s,
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    ensure!(ready["ready"] == true, "writer not ready: {ready}");
    let path = PathBuf::from(ready["segment"].as_str().context("no segment path")?);

    let port = free_port();
    let mut cmd = Command::new(&agent_path);
    cmd.arg("serve")
        .arg("--shm-dir")
        .arg(dir.path())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    let mut agent = ChildGuard::spawn("pfs-agent", cmd, false)?;
    let base = format!("http://127.0.0.1:{port}");
    pfs_tests::wait_healthz(&base, &mut agent, Duration::from_secs(20))?;

    let stop = Arc::new(AtomicBool::new(false));
    let prog = Arc::new(Progress::default());
    let read = {
        let (stop, prog, path) = (stop.clone(), prog.clone(), path.clone());
        std::thread::Builder::new()
            .name("soak-reader".into())
            .spawn(move || reader(&path, &stop, &prog))?
    };
    let scrape = {
        let (stop, prog, base) = (stop.clone(), prog.clone(), base.clone());
        std::thread::Builder::new()
            .name("soak-scraper".into())
            .spawn(move || scraper(&base, &stop, &prog))?
    };
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let every = Duration::from_secs(30).min(Duration::from_secs_f64(seconds / 2.0));
    let mut next_report = started + every;
    let run = (|| -> Result<Outcome> {
        while Instant::now() < end {
            std::thread::sleep(
                Duration::from_millis(100).min(end.saturating_duration_since(Instant::now())),
            );
            if let Some(s) = w.guard.try_wait() {
                bail!("the writer exited early with {s}\n{}", w.guard.describe());
            }
            if let Some(s) = agent.try_wait() {
                bail!("the agent exited with {s}\n{}", agent.describe());
            }
            ensure!(!read.is_finished(), "the reader stopped early");
            if Instant::now() >= next_report {
                next_report += every;
                eprintln!(
                    "soak: {:.0}/{seconds:.0} s reads_validated={} torn_accepted={} decreases={} \
                     snapshots={} folds={} pages_reclaimed={} pages_revived={} scrapes={}",
                    started.elapsed().as_secs_f64(),
                    prog.reads_validated.load(Relaxed),
                    prog.torn_accepted.load(Relaxed),
                    prog.decreases.load(Relaxed),
                    prog.snapshots.load(Relaxed),
                    prog.folds.load(Relaxed),
                    prog.pages_reclaimed.load(Relaxed),
                    prog.pages_revived.load(Relaxed),
                    prog.scrapes.load(Relaxed),
                );
            }
        }
        // Stop recording; the torn threads stay alive, parked.
        w.send_line("stop")?;
        let exp = expected(&w.read_json(Duration::from_secs(60))?)?;
        let seg = Segment::open(File::open(&path)?, false)?;
        let mut notes = Vec::new();
        let mut lod = reconcile_segment(&settled_snapshot(&seg)?, &exp, true, &mut notes);
        lod += reconcile_agent(&base, &exp, &mut notes);
        // Let them exit: everything is folded now.
        w.send_line("exit")?;
        let done = w.read_json(Duration::from_secs(60))?;
        ensure!(done["done"] == true, "unexpected writer line {done}");
        let fin = settled_snapshot(&seg)?;
        lod += reconcile_segment(&fin, &exp, false, &mut notes);
        if fin.threads_exited != exp.threads || !fin.threads.is_empty() {
            notes.push(format!(
                "reader: {} threads ran, {} folds, {} still live",
                exp.threads,
                fin.threads_exited,
                fin.threads.len()
            ));
            lod += fin.threads_exited.abs_diff(exp.threads).max(1);
        }
        lod += reconcile_agent(&base, &exp, &mut notes);
        if fin.lost.iter().any(|&n| n != 0) {
            notes.push(format!("lost counters: {:?}", fin.lost));
        }
        Ok(Outcome {
            exp,
            lost_or_doubled: lod,
            notes,
            reclaimed: fin.pages_reclaimed,
            revived: fin.pages_revived,
        })
    })();
    stop.store(true, Relaxed);
    let rrep = read
        .join()
        .map_err(|_| anyhow!("the reader thread panicked"))?;
    let srep = scrape
        .join()
        .map_err(|_| anyhow!("the scraper thread panicked"))?;
    let Outcome {
        exp,
        lost_or_doubled,
        notes,
        reclaimed,
        revived,
    } = run?;
    let rrep = rrep?;
    w.finish(Duration::from_secs(30))?;
    agent.signal(libc::SIGTERM);
    agent.wait_timeout(Duration::from_secs(10));
    let churn_threads = exp.threads - exp.torn.len() as u64;

    let ck = &rrep.ck;
    let st = &rrep.stats;
    eprintln!(
        "soak: reader: {} snapshots, {} events and {} rows validated, {} rejected torn copies (retries), \
         skipped rows {} events {}, ended records {}, folded copies {}, invalid {}, restarts {}; \
         snapshot errors {} (longest run {}{}); max live threads {}, pages {}",
        ck.snapshots,
        ck.events,
        ck.rows,
        st.retries,
        st.skipped_rows,
        st.skipped_events,
        st.ended_records,
        st.folded_copies,
        st.invalid,
        st.restarts,
        rrep.errors,
        rrep.longest_error_run,
        rrep.first_error
            .as_deref()
            .map(|e| format!(", e.g. {e}"))
            .unwrap_or_default(),
        rrep.max_live,
        rrep.max_pages,
    );
    eprintln!(
        "soak: writer: {} events by {} torn threads and {} churn threads; pages reclaimed {}, revived {}",
        exp.total.count.iter().sum::<u64>(),
        exp.torn.len(),
        churn_threads,
        reclaimed,
        revived,
    );
    eprintln!(
        "soak: agent: {} /metrics scrapes, {} table reads, {} series watched, {} errors{}",
        srep.scrapes,
        srep.table_reads,
        srep.last.len(),
        srep.errors,
        srep.first_error
            .as_deref()
            .map(|e| format!(", e.g. {e}"))
            .unwrap_or_default(),
    );
    for e in ck.examples.iter().chain(&srep.examples).chain(&notes) {
        eprintln!("soak: {e}");
    }
    let torn_accepted = ck.torn_accepted + st.invalid;
    let decreases = ck.decreases + srep.decreases;
    let reads_validated = ck.events + ck.rows;
    println!(
        "soak: minutes={} reads_validated={reads_validated} torn_accepted={torn_accepted} \
         decreases={decreases} lost_or_doubled={lost_or_doubled}",
        minutes_text(seconds / 60.0)
    );
    // A soak that did not churn, reclaim, read or scrape proved nothing.
    let mut idle = Vec::new();
    if churn_threads == 0 {
        idle.push("no churn thread ran");
    }
    if reclaimed == 0 {
        idle.push("no page was reclaimed");
    }
    if reads_validated == 0 {
        idle.push("nothing was read");
    }
    if srep.scrapes == 0 {
        idle.push("the agent was never scraped");
    }
    for i in &idle {
        eprintln!("soak: FAILED: {i}");
    }
    Ok(
        if torn_accepted == 0 && decreases == 0 && lost_or_doubled == 0 && idle.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checker_rejects_torn_events() {
        let class_of: HashMap<u32, usize> = [(0, 0), (1, 1), (2, 2)].into();
        let mut ck = Checker::default();
        ck.check_event(1, &torn::consistent_copy(10), &class_of, "history");
        assert_eq!(ck.torn_accepted, 0, "{:?}", ck.examples);
        for (i, e) in torn::torn_copies(10).iter().enumerate() {
            let before = ck.torn_accepted;
            ck.check_event(1, e, &class_of, "history");
            assert_eq!(ck.torn_accepted, before + 1, "variant {i} accepted: {e:?}");
        }
    }

    #[test]
    fn a_counter_going_down_is_a_decrease() {
        let mut rep = ScrapeReport::default();
        let body =
            "# TYPE pfs_x counter\npfs_x_total{a=\"1\"} 5\n# TYPE pfs_g gauge\npfs_g 9\n# EOF\n";
        rep.metrics(body).unwrap();
        rep.metrics(&body.replace(" 5\n", " 6\n").replace(" 9\n", " 1\n"))
            .unwrap();
        assert_eq!(rep.decreases, 0, "a gauge may go down: {:?}", rep.examples);
        rep.metrics(&body.replace(" 5\n", " 4\n")).unwrap();
        assert_eq!(rep.decreases, 1);
    }

    #[test]
    fn a_mismatch_counts_the_events_lost_or_doubled() {
        let mut out = Vec::new();
        assert_eq!(mismatch("x", (10, 100, 7), (10, 100, 7), &mut out), 0);
        assert_eq!(mismatch("x", (10, 100, 7), (7, 100, 7), &mut out), 3);
        assert_eq!(mismatch("x", (10, 100, 7), (12, 100, 7), &mut out), 2);
        assert_eq!(mismatch("x", (10, 100, 7), (10, 99, 7), &mut out), 1);
        assert_eq!(out.len(), 3);
        assert_eq!(minutes_text(10.0), "10");
        assert_eq!(minutes_text(0.5), "0.5");
        assert_eq!(minutes_text(0.25), "0.25");
    }
}
