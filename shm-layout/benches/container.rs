//! `cargo bench -p pfs-shm-layout --bench container`: our thread container
//! against MySQL's `PFS_buffer_scalable_container`, side by side in one
//! run, under the same concurrent churn.
//!
//! Every worker thread repeats, for R rounds: take k (1..=12, seeded)
//! records from *both* containers, hold them briefly, release them all. So
//! both containers see the same demand at the same moments. A live count
//! (raised before a record is requested, lowered after it is released)
//! bounds the true number of records held at any instant; its maximum is
//! the peak, and `optimal_pages = ceil(peak / records_per_page)`.
//!
//! Then the quiet phase: every record is free; after the quiet time our
//! container's maintenance pass reclaims the pages, and `reclaimed_bytes`
//! is the drop in the segment file's allocated blocks (`st_blocks`).
//! MySQL's container never frees a page.
//!
//! The MySQL baseline below follows `PFS_buffer_scalable_container::
//! allocate` and `PFS_buffer_default_array::allocate` (storage/perfschema/
//! pfs_buffer_container.h): one shared `m_monotonic` per container and per
//! page, bumped with a fetch-add after each failed probe, and `m_full`
//! flags set by a scan that failed. Written for this benchmark.
//!
//! Environment: `PFS_BENCH_THREADS` (default 32), `PFS_BENCH_ROUNDS`
//! (default 2000). The last line reads
//! `container-churn: threads=T rounds=R ours_pages=A mysql_pages=B optimal_pages=C reclaimed_bytes=D`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pfs_shm_layout::lockword;
use pfs_shm_layout::{Segment, SegmentConfig, SegmentWriter, ThreadSlot, TimerCalibration};

const RECORDS_PER_PAGE: u32 = 16;
const MAX_PAGES: u32 = 64;
const MAX_HELD: u64 = 12;

// ---------------------------------------------------------------------------
// The MySQL baseline.
// ---------------------------------------------------------------------------

/// `PFS_buffer_default_array`: one page of `n` records of
/// `record_words` words each (the size of our thread record, as MySQL's
/// `PFS_thread` is large too), the lock word first in each record.
struct MysqlPage {
    words: Vec<AtomicU64>,
    record_words: usize,
    n: usize,
    monotonic: AtomicUsize,
    full: AtomicBool,
}

impl MysqlPage {
    fn new(n: usize, record_words: usize) -> Self {
        Self {
            words: (0..n * record_words).map(|_| AtomicU64::new(0)).collect(),
            record_words,
            n,
            monotonic: AtomicUsize::new(0),
            full: AtomicBool::new(false),
        }
    }

    fn lock(&self, slot: usize) -> &AtomicU64 {
        &self.words[slot * self.record_words]
    }

    /// `PFS_buffer_default_array::allocate`.
    fn allocate(&self) -> Option<(usize, u64)> {
        if self.full.load(Relaxed) {
            return None;
        }
        let max = self.n;
        let mut monotonic = self.monotonic.load(Relaxed);
        let monotonic_max = monotonic + max;
        while monotonic < monotonic_max {
            let index = monotonic % max;
            if let Some(v) = lockword::try_acquire(self.lock(index)) {
                return Some((index, v));
            }
            // PFS_atomic::add_u64 returns the value before the addition.
            monotonic = self.monotonic.fetch_add(1, Relaxed);
        }
        self.full.store(true, Relaxed);
        None
    }
}

/// `PFS_buffer_scalable_container`.
struct MysqlContainer {
    pages: Vec<OnceLock<MysqlPage>>,
    max_page_index: AtomicU32,
    monotonic: AtomicU32,
    full: AtomicBool,
    lost: AtomicU64,
    critical_section: Mutex<()>,
    rpp: usize,
    record_words: usize,
}

impl MysqlContainer {
    fn new(max_pages: usize, rpp: usize, record_words: usize) -> Self {
        Self {
            pages: (0..max_pages).map(|_| OnceLock::new()).collect(),
            max_page_index: AtomicU32::new(0),
            monotonic: AtomicU32::new(0),
            full: AtomicBool::new(false),
            lost: AtomicU64::new(0),
            critical_section: Mutex::new(()),
            rpp,
            record_words,
        }
    }

    /// Returns (page, slot, version).
    fn allocate(&self) -> Option<(usize, usize, u64)> {
        if self.full.load(Relaxed) {
            self.lost.fetch_add(1, Relaxed);
            return None;
        }
        // 1: try to find an available record within the existing pages.
        let mut current_page_count = self.max_page_index.load(Relaxed);
        if current_page_count != 0 {
            let mut monotonic = self.monotonic.load(Relaxed);
            let monotonic_max = monotonic.wrapping_add(current_page_count);
            while monotonic < monotonic_max {
                let index = (monotonic % current_page_count) as usize;
                if let Some(page) = self.pages[index].get()
                    && let Some((slot, v)) = page.allocate()
                {
                    return Some((index, slot, v));
                }
                monotonic = self.monotonic.fetch_add(1, Relaxed);
            }
        }
        // 2: try to add a new page, beyond the m_max_page_index limit.
        while (current_page_count as usize) < self.pages.len() {
            let cell = &self.pages[current_page_count as usize];
            if cell.get().is_none() {
                let _g = self.critical_section.lock().unwrap();
                if cell.get().is_none() {
                    let _ = cell.set(MysqlPage::new(self.rpp, self.record_words));
                    self.max_page_index.fetch_add(1, Relaxed);
                }
            }
            if let Some((slot, v)) = cell.get().unwrap().allocate() {
                return Some((current_page_count as usize, slot, v));
            }
            current_page_count += 1;
        }
        self.lost.fetch_add(1, Relaxed);
        self.full.store(true, Relaxed);
        None
    }

    fn deallocate(&self, page: usize, slot: usize, version: u64) {
        let p = self.pages[page].get().unwrap();
        let v = lockword::publish(p.lock(slot), version);
        lockword::release(p.lock(slot), v);
        p.full.store(false, Relaxed);
        self.full.store(false, Relaxed);
    }

    fn pages(&self) -> u32 {
        self.max_page_index.load(Relaxed)
    }
}

// ---------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: a deterministic per-thread sequence.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

struct Shared {
    ours: SegmentWriter,
    mysql: MysqlContainer,
    live: AtomicU64,
    peak: AtomicU64,
    ours_ns: AtomicU64,
    mysql_ns: AtomicU64,
    ours_lost: AtomicU64,
    next_id: AtomicU64,
}

fn worker(sh: &Shared, seed: u64, rounds: u64) {
    let mut rng = seed | 1;
    let mut ours: Vec<ThreadSlot> = Vec::with_capacity(MAX_HELD as usize);
    let mut theirs = Vec::with_capacity(MAX_HELD as usize);
    for _ in 0..rounds {
        let k = 1 + next(&mut rng) % MAX_HELD;
        for _ in 0..k {
            let live = sh.live.fetch_add(1, SeqCst) + 1;
            sh.peak.fetch_max(live, SeqCst);
            let id = sh.next_id.fetch_add(1, Relaxed);
            let t0 = Instant::now();
            let a = sh.ours.alloc_thread(id, id, "churn");
            let t1 = Instant::now();
            let b = sh.mysql.allocate();
            let t2 = Instant::now();
            sh.ours_ns.fetch_add((t1 - t0).as_nanos() as u64, Relaxed);
            sh.mysql_ns.fetch_add((t2 - t1).as_nanos() as u64, Relaxed);
            match a {
                Ok(s) => ours.push(s),
                Err(_) => {
                    sh.ours_lost.fetch_add(1, Relaxed);
                }
            }
            theirs.extend(b);
        }
        // Hold briefly so that threads overlap.
        for _ in 0..(next(&mut rng) % 4) {
            std::thread::yield_now();
        }
        let n = k;
        for s in ours.drain(..) {
            sh.ours.fold_and_free(s);
        }
        for (p, s, v) in theirs.drain(..) {
            sh.mysql.deallocate(p, s, v);
        }
        sh.live.fetch_sub(n, SeqCst);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; accept and ignore arguments.
    let threads = env("PFS_BENCH_THREADS", 32);
    let rounds = env("PFS_BENCH_ROUNDS", 2000);
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm")
    } else {
        tempfile::tempdir().expect("tempdir")
    };
    let path = dir.path().join("bench.pfs");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("create segment file");
    let cfg = SegmentConfig {
        service_name: "bench".into(),
        history_len: 10,
        max_classes: 64,
        max_strings: 16,
        records_per_page: RECORDS_PER_PAGE,
        max_pages: MAX_PAGES,
        history_long_len: 8,
        task_slots: 4,
    };
    let timer = TimerCalibration::NANOSECONDS;
    let seg = Segment::create(file, &cfg, timer, std::process::id(), 0).expect("create segment");
    let page_size = seg.geometry().page_size as u64;
    let record_words = seg.geometry().record_size / 8;
    let ours = SegmentWriter::new(seg);
    let quiet = Duration::from_millis(100);
    ours.set_reclaim_after(Some(quiet));
    let sh = Arc::new(Shared {
        ours,
        mysql: MysqlContainer::new(MAX_PAGES as usize, RECORDS_PER_PAGE as usize, record_words),
        live: AtomicU64::new(0),
        peak: AtomicU64::new(0),
        ours_ns: AtomicU64::new(0),
        mysql_ns: AtomicU64::new(0),
        ours_lost: AtomicU64::new(0),
        next_id: AtomicU64::new(1),
    });

    // Peak phase.
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let sh = sh.clone();
            std::thread::spawn(move || worker(&sh, 0x9E37_79B9 ^ ((i + 1) * 0x1000_0001), rounds))
        })
        .collect();
    for h in handles {
        h.join().expect("worker panicked");
    }
    let elapsed = start.elapsed();
    let seg = sh.ours.segment();
    let ours_pages = seg.pages_added();
    let mysql_pages = sh.mysql.pages();
    let peak = sh.peak.load(SeqCst);
    let optimal = peak.div_ceil(u64::from(RECORDS_PER_PAGE));
    let allocs = sh.next_id.load(Relaxed) - 1;

    // Quiet phase: everything is free; wait out the quiet time, reclaim.
    let before = seg.allocated_bytes().expect("stat");
    std::thread::sleep(quiet + Duration::from_millis(50));
    let stats = sh.ours.maintain();
    let after = seg.allocated_bytes().expect("stat");
    let reclaimed = before.saturating_sub(after);

    println!(
        "peak phase: {threads} threads x {rounds} rounds, {allocs} allocations in {:.2?}; peak live {peak} records ({} per page)",
        elapsed, RECORDS_PER_PAGE
    );
    println!(
        "allocation cost (alloc call, incl. timer overhead): ours {:.0} ns, mysql {:.0} ns (ratio {:.2})",
        sh.ours_ns.load(Relaxed) as f64 / allocs as f64,
        sh.mysql_ns.load(Relaxed) as f64 / allocs as f64,
        sh.ours_ns.load(Relaxed) as f64 / sh.mysql_ns.load(Relaxed).max(1) as f64,
    );
    println!(
        "lost: ours {}, mysql {}",
        sh.ours_lost.load(Relaxed),
        sh.mysql.lost.load(Relaxed)
    );
    println!(
        "memory: ours {} pages at peak, {} reclaimed ({} B -> {} B allocated); mysql keeps {} pages = {} B of records for good",
        ours_pages,
        stats.pages_reclaimed,
        before,
        after,
        mysql_pages,
        u64::from(mysql_pages) * page_size
    );
    println!(
        "container-churn: threads={threads} rounds={rounds} ours_pages={ours_pages} mysql_pages={mysql_pages} optimal_pages={optimal} reclaimed_bytes={reclaimed}"
    );
}
