//! Snapshots of every segment, taken lock-free, cached briefly and shared
//! by all readers so that concurrent scrapes cost one walk of the segments.
//!
//! Two kinds, each with its own cache:
//!
//! * [`Snapshotter::get`]: everything (events, history rings, every live
//!   thread's summary rows), for the PFS tables and `TRUNCATE`.
//! * [`Snapshotter::summaries`]: what the metric exporters (`/metrics`,
//!   OTLP) need: no events, live threads' summary rows summed by class as
//!   they are read ([`ReadOptions::summaries`]), and each container page's
//!   mapping given back once read. Its size depends on instruments, not on
//!   threads × instruments, and the agent's resident memory stays flat
//!   whatever the segments' size.
//!
//! Segment snapshots are shared (`Arc`) between the cache, the previous
//! snapshot kept for carry-forward, and every reader: never copied.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_shm_layout::reader::{ReadOptions, ReadStats, SegmentSnapshot, Summary};

use crate::aggregate::Retired;
use crate::discover::SegmentSet;

/// One segment in a snapshot.
#[derive(Debug, Clone)]
pub struct SegmentView {
    /// File path.
    pub path: PathBuf,
    /// False once the owning process has died.
    pub live: bool,
    /// Its content (shared with the cache; never copied).
    pub data: Arc<SegmentSnapshot>,
}

/// Everything the agent exports at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When it was taken.
    pub taken_at: Instant,
    /// How long the walk took.
    pub duration: Duration,
    /// Live and retained-dead segments.
    pub segments: Vec<SegmentView>,
    /// Refused files: path, reason label, message.
    pub invalid: Vec<(PathBuf, &'static str, String)>,
    /// Totals of retired segments.
    pub retired: Retired,
    /// Segment errors by reason, since the agent started.
    pub errors: HashMap<&'static str, u64>,
    /// Segments retired since the agent started.
    pub retired_segments: u64,
    /// Reading effort of this snapshot, summed over segments.
    pub stats: ReadStats,
    /// Segments that could not be read this time.
    pub failed_reads: u64,
}

/// Cumulative reading figures (the agent's own counters).
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    /// Snapshots taken.
    pub snapshots: u64,
    /// Sequence-lock retries.
    pub retries: u64,
    /// Summary rows skipped (then carried forward from the previous snapshot).
    pub skipped_rows: u64,
    /// Event rows skipped.
    pub skipped_events: u64,
    /// Rows carried forward.
    pub carried_rows: u64,
    /// Snapshot failures.
    pub failed_reads: u64,
}

/// Owns the segment set and the snapshot caches.
#[derive(Debug)]
pub struct Snapshotter {
    set: Mutex<SegmentSet>,
    cache: Mutex<Option<Arc<Snapshot>>>,
    summaries_cache: Mutex<Option<Arc<Snapshot>>>,
    totals: Mutex<Totals>,
    max_age: Duration,
    /// [`FULL_KEEP`] (shorter in tests).
    full_keep: Duration,
}

/// How long an unused full snapshot is kept (see [`Snapshotter::refresh`]).
pub const FULL_KEEP: Duration = Duration::from_secs(10);

/// What a snapshot copies of each segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Full,
    Summaries,
}

impl Snapshotter {
    /// A snapshotter over `set`; snapshots younger than `max_age` are reused.
    pub fn new(set: SegmentSet, max_age: Duration) -> Self {
        Self {
            set: Mutex::new(set),
            cache: Mutex::new(None),
            summaries_cache: Mutex::new(None),
            totals: Mutex::new(Totals::default()),
            max_age,
            full_keep: FULL_KEEP,
        }
    }

    /// Cumulative figures.
    pub fn totals(&self) -> Totals {
        *self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Paths of the segments whose processes live.
    pub fn live_paths(&self) -> Vec<PathBuf> {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.refresh();
        set.tracked
            .values()
            .filter(|t| t.dead_since.is_none())
            .map(|t| t.path.clone())
            .collect()
    }

    /// Drops the cached snapshot (after a setup change, so that the next
    /// read shows it).
    pub fn invalidate(&self) {
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self
            .summaries_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Discovery pass without a snapshot (background tick). Also drops
    /// the full snapshot (the cache and each segment's copy kept for
    /// carry-forward) once nobody asked for one for [`FULL_KEEP`]: at scale
    /// it holds every thread's rows and events, and one table request
    /// should not keep that memory for good.
    /// Once dropped, the allocator is asked to give the freed memory back
    /// (glibc keeps it otherwise).
    pub fn refresh(&self) {
        let mut dropped = false;
        let stale = {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache
                .as_ref()
                .is_some_and(|s| s.taken_at.elapsed() >= self.full_keep)
            {
                dropped |= cache.take().is_some();
            }
            cache.is_none()
        };
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.refresh();
        if stale {
            for t in set.tracked.values_mut() {
                dropped |= t.last.take().is_some();
            }
        }
        drop(set);
        if dropped {
            pfs_shm_layout::heap::release_free_memory();
        }
    }

    /// Retires dead segments immediately.
    pub fn retire_all_dead(&self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.refresh();
        set.retire_all_dead();
    }

    /// The current full snapshot (events and per-thread rows: the PFS
    /// tables), fresh or at most `max_age` old.
    pub fn get(&self) -> Arc<Snapshot> {
        self.cached(&self.cache, Mode::Full)
    }

    /// The current summaries snapshot (what `/metrics` and OTLP export),
    /// fresh or at most `max_age` old. Its segments have no events and
    /// their live threads' summary rows summed by class in
    /// [`SegmentSnapshot::live_rows`]; memory rows are per thread.
    pub fn summaries(&self) -> Arc<Snapshot> {
        self.cached(&self.summaries_cache, Mode::Summaries)
    }

    fn cached(&self, cache: &Mutex<Option<Arc<Snapshot>>>, mode: Mode) -> Arc<Snapshot> {
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cache.as_ref()
            && s.taken_at.elapsed() < self.max_age
        {
            return s.clone();
        }
        // Drop the previous snapshot before taking the next one, so that
        // two are never held at once by the cache.
        *cache = None;
        let s = Arc::new(self.take_mode(mode));
        *cache = Some(s.clone());
        s
    }

    /// Takes a new full snapshot now.
    pub fn take(&self) -> Snapshot {
        self.take_mode(Mode::Full)
    }

    /// Takes a new summaries snapshot now (see [`Snapshotter::summaries`]).
    pub fn take_summaries(&self) -> Snapshot {
        self.take_mode(Mode::Summaries)
    }

    fn take_mode(&self, mode: Mode) -> Snapshot {
        let start = Instant::now();
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.refresh();
        let opts = match mode {
            // Pages given back too: a table request at scale would
            // otherwise keep the whole segment resident (RssShmem) until
            // the next scrape releases it.
            Mode::Full => ReadOptions {
                release_pages: true,
                ..ReadOptions::default()
            },
            Mode::Summaries => ReadOptions::summaries(),
        };
        let mut segments = Vec::with_capacity(set.tracked.len());
        let mut stats = ReadStats::default();
        let mut failed = 0u64;
        let mut carried = 0u64;
        for t in set.tracked.values_mut() {
            let live = t.dead_since.is_none();
            let prev = match mode {
                Mode::Full => t.last.as_ref(),
                Mode::Summaries => t.last_summaries.as_ref(),
            };
            let fresh = if !live && prev.is_some() {
                // A dead process's segment no longer changes.
                None
            } else {
                match t.snapshot(&opts) {
                    Ok(mut s) => {
                        carried += match (mode, prev) {
                            (Mode::Full, _) => carry_forward(&mut s, prev.map(|p| &**p)),
                            (Mode::Summaries, Some(p)) => carry_forward_summed(&mut s, p),
                            (Mode::Summaries, None) => 0,
                        };
                        add_stats(&mut stats, &s.stats);
                        Some(Arc::new(s))
                    }
                    Err(e) => {
                        failed += 1;
                        tracing::warn!(path = %t.path.display(), error = %e, "segment snapshot failed; exporting its previous snapshot");
                        None
                    }
                }
            };
            let data = match (fresh, mode) {
                (Some(s), Mode::Full) => {
                    t.last = Some(s.clone());
                    Some(s)
                }
                (Some(s), Mode::Summaries) => {
                    t.last_summaries = Some(s.clone());
                    Some(s)
                }
                (None, _) => prev.cloned(),
            };
            if let Some(data) = data {
                segments.push(SegmentView {
                    path: t.path.clone(),
                    live,
                    data,
                });
            }
        }
        segments.sort_by(|a, b| a.path.cmp(&b.path));
        let mut invalid: Vec<_> = set
            .invalid
            .iter()
            .map(|(p, i)| (p.clone(), i.reason, i.message.clone()))
            .collect();
        invalid.sort_by(|a, b| a.0.cmp(&b.0));
        let snap = Snapshot {
            taken_at: Instant::now(),
            duration: start.elapsed(),
            segments,
            invalid,
            retired: set.retired.clone(),
            errors: set.errors.clone(),
            retired_segments: set.retired_segments,
            stats,
            failed_reads: failed,
        };
        drop(set);
        let mut tot = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        tot.snapshots += 1;
        tot.retries += stats.retries;
        tot.skipped_rows += stats.skipped_rows;
        tot.skipped_events += stats.skipped_events;
        tot.carried_rows += carried;
        tot.failed_reads += failed;
        snap
    }
}

fn add_stats(a: &mut ReadStats, b: &ReadStats) {
    a.retries += b.retries;
    a.skipped_rows += b.skipped_rows;
    a.skipped_events += b.skipped_events;
    a.ended_records += b.ended_records;
    a.folded_copies += b.folded_copies;
    a.invalid += b.invalid;
    a.restarts += b.restarts;
}

/// A row skipped because its writer kept it busy is replaced by the same
/// thread's row from the previous snapshot, so totals never dip. Returns
/// the number of rows carried.
pub(crate) fn carry_forward(s: &mut SegmentSnapshot, prev: Option<&SegmentSnapshot>) -> u64 {
    let Some(prev) = prev else { return 0 };
    let mut carried = 0;
    for t in s.threads.iter_mut().filter(|t| !t.skipped_rows.is_empty()) {
        let Some(p) = prev
            .threads
            .iter()
            .find(|p| p.record == t.record && p.version == t.version)
        else {
            continue;
        };
        for class in std::mem::take(&mut t.skipped_rows) {
            if let Some(row) = p.memory.iter().find(|(c, _)| *c == class) {
                t.memory.push(*row);
                carried += 1;
                continue;
            }
            match p.rows.iter().find(|(c, _)| *c == class) {
                Some(row) => {
                    t.rows.push(*row);
                    carried += 1;
                }
                None => t.skipped_rows.push(class),
            }
        }
    }
    carried
}

/// Carry-forward for a summaries snapshot, whose summary rows are summed
/// by class: memory rows as in [`carry_forward`] (they stay per thread);
/// for a class with a skipped summary row, the segment's total (folded
/// rows plus live sum) is raised field by field to at least the previous
/// snapshot's. Both are lower bounds of the true total (which only grows),
/// so the result is too, and the exported total never dips. Returns the
/// number of rows carried.
pub(crate) fn carry_forward_summed(s: &mut SegmentSnapshot, prev: &SegmentSnapshot) -> u64 {
    let mut carried = carry_forward(s, Some(prev));
    let mut classes: Vec<u32> = s
        .threads
        .iter_mut()
        .flat_map(|t| std::mem::take(&mut t.skipped_rows))
        .collect();
    classes.sort_unstable();
    classes.dedup();
    // Memory rows stay per thread: only summary classes are summed.
    classes.retain(|c| {
        s.classes
            .iter()
            .any(|i| i.index == *c && i.kind != pfs_shm_layout::ClassKind::Memory)
    });
    for class in classes {
        let total = |rows: &[(u32, Summary)], exited: &[(u32, Summary)]| {
            let mut sum = Summary::default();
            for (_, r) in rows.iter().chain(exited).filter(|(c, _)| *c == class) {
                sum.merge(r);
            }
            sum
        };
        let now = total(&s.live_rows, &s.exited);
        let before = total(&prev.live_rows, &prev.exited);
        let folded = total(&[], &s.exited);
        let want = at_least(&now, &before);
        // Express the raised total as the live part: total - folded
        // (`want` >= `now` >= `folded` field by field).
        let live = minus(&want, &folded);
        match s.live_rows.iter_mut().find(|(c, _)| *c == class) {
            Some((_, r)) => *r = live,
            None => {
                s.live_rows.push((class, live));
                s.live_rows.sort_by_key(|(c, _)| *c);
            }
        }
        carried += 1;
    }
    carried
}

/// Field-wise the larger of two totals of one class (smaller minimum).
fn at_least(a: &Summary, b: &Summary) -> Summary {
    let mut r = *a;
    r.count = a.count.max(b.count);
    r.timed_count = a.timed_count.max(b.timed_count);
    r.sum_ps = a.sum_ps.max(b.sum_ps);
    r.min_ps = a.min_ps.min(b.min_ps);
    r.max_ps = a.max_ps.max(b.max_ps);
    r.bytes = a.bytes.max(b.bytes);
    for (x, y) in r.buckets.iter_mut().zip(&b.buckets) {
        *x = (*x).max(*y);
    }
    let (x, y) = (&mut r.statement, &b.statement);
    x.errors = x.errors.max(y.errors);
    x.warnings = x.warnings.max(y.warnings);
    x.rows_affected = x.rows_affected.max(y.rows_affected);
    x.rows_sent = x.rows_sent.max(y.rows_sent);
    x.rows_examined = x.rows_examined.max(y.rows_examined);
    r
}

/// `a - b` for the additive fields (saturating); `a`'s minimum and maximum.
fn minus(a: &Summary, b: &Summary) -> Summary {
    let mut r = *a;
    r.count = a.count.saturating_sub(b.count);
    r.timed_count = a.timed_count.saturating_sub(b.timed_count);
    r.sum_ps = a.sum_ps.saturating_sub(b.sum_ps);
    r.bytes = a.bytes.saturating_sub(b.bytes);
    for (x, y) in r.buckets.iter_mut().zip(&b.buckets) {
        *x = x.saturating_sub(*y);
    }
    let (x, y) = (&mut r.statement, &b.statement);
    x.errors = x.errors.saturating_sub(y.errors);
    x.warnings = x.warnings.saturating_sub(y.warnings);
    x.rows_affected = x.rows_affected.saturating_sub(y.rows_affected);
    x.rows_sent = x.rows_sent.saturating_sub(y.rows_sent);
    x.rows_examined = x.rows_examined.saturating_sub(y.rows_examined);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED, NONE_U32};
    use pfs_shm_layout::reader::snapshot;
    use pfs_shm_layout::writer::EventData;
    use pfs_shm_layout::{ClassKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration};

    fn segment() -> (std::fs::File, SegmentWriter, [u32; 2]) {
        let cal = TimerCalibration {
            kind: 2,
            base_ticks: 0,
            ps_per_tick_q32: 1000 << 32,
            frequency_hz: 1_000_000_000,
            base_ns: 0,
        };
        let f = tempfile::tempfile().unwrap();
        let seg =
            Segment::create(f.try_clone().unwrap(), &SegmentConfig::default(), cal, 1, 0).unwrap();
        let w = SegmentWriter::new(seg);
        let c = ["a", "b"].map(|n| {
            w.register_class(
                &format!("wait/synch/mutex/t/{n}"),
                ClassKind::Mutex,
                FLAG_ENABLED | FLAG_TIMED,
            )
            .unwrap()
        });
        (f, w, c)
    }

    fn record(w: &SegmentWriter, slot: u32, class: u32, n: u64) {
        let rec = w.segment().record(slot);
        for i in 0..n {
            let e = EventData {
                event_id: i + 1,
                class,
                source: NONE_U32,
                object_name: NONE_U32,
                flags: EV_TIMED | EV_ENDED,
                ..Default::default()
            };
            rec.end_event(0, &e, None, true, true);
            rec.summarize(class as usize, true, 1_000_000 * (i + 1), 0, None);
        }
    }

    fn total(s: &SegmentSnapshot, class: u32) -> Summary {
        let mut t = Summary::default();
        for (_, r) in s
            .exited
            .iter()
            .chain(&s.live_rows)
            .filter(|(c, _)| *c == class)
        {
            t.merge(r);
        }
        t
    }

    #[test]
    fn an_unused_full_snapshot_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.1.pfs");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        let cal = TimerCalibration {
            kind: 2,
            base_ticks: 0,
            ps_per_tick_q32: 1000 << 32,
            frequency_hz: 1_000_000_000,
            base_ns: 0,
        };
        let cfg = SegmentConfig::default();
        let w = SegmentWriter::new(Segment::create(file, &cfg, cal, 1, 0).unwrap());
        let c = w
            .register_class("wait/synch/mutex/t/a", ClassKind::Mutex, FLAG_ENABLED)
            .unwrap();
        let slot = w.alloc_thread(1, 1, "t").unwrap();
        record(&w, slot.index, c, 3);
        let mut snap = Snapshotter::new(
            crate::discover::SegmentSet::new(dir.path(), Duration::MAX),
            Duration::from_secs(60),
        );
        let full = snap.get();
        assert_eq!(full.segments[0].data.threads[0].rows.len(), 1);
        let kept = |s: &Snapshotter| {
            let set = s.set.lock().unwrap();
            set.tracked.values().filter(|t| t.last.is_some()).count()
        };
        snap.refresh();
        assert_eq!(kept(&snap), 1, "a fresh full snapshot is kept");
        assert!(Arc::ptr_eq(&snap.get(), &full), "and served from the cache");
        snap.full_keep = Duration::ZERO;
        snap.refresh();
        assert_eq!(kept(&snap), 0, "an unused one is dropped");
        assert!(snap.cache.lock().unwrap().is_none());
        // Summaries are not affected, and a new full snapshot is taken.
        assert_eq!(snap.summaries().segments[0].data.live_rows.len(), 1);
        assert!(!Arc::ptr_eq(&snap.get(), &full));
    }

    #[test]
    fn a_skipped_summed_row_never_lowers_the_total() {
        let (f, w, [a, b]) = segment();
        let t1 = w.alloc_thread(1, 1, "t1").unwrap();
        let t2 = w.alloc_thread(2, 2, "t2").unwrap();
        record(&w, t1.index, a, 5);
        record(&w, t2.index, a, 3);
        record(&w, t2.index, b, 2);
        let reader = Segment::open(f, false).unwrap();
        let prev = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        assert_eq!(total(&prev, a).count, 8);
        // More events, then a snapshot that missed thread 1's row of `a`
        // (its writer kept it busy): the live sum lacks those 7 events.
        record(&w, t1.index, a, 2);
        record(&w, t2.index, a, 1);
        let mut now = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        assert_eq!(total(&now, a).count, 11);
        let t1_row = 7;
        for (c, r) in &mut now.live_rows {
            if *c == a {
                r.count -= t1_row;
            }
        }
        let i = now
            .threads
            .iter()
            .position(|t| t.record == t1.index)
            .unwrap();
        now.threads[i].skipped_rows.push(a);
        let b_before = total(&now, b);
        assert_eq!(carry_forward_summed(&mut now, &prev), 1);
        // At least the previous total (8), never the dip (4); `b` untouched.
        assert_eq!(total(&now, a).count, 8);
        assert!(now.threads.iter().all(|t| t.skipped_rows.is_empty()));
        assert_eq!(total(&now, b), b_before);
        // After thread 2 exits, its rows are folded: the raised total is
        // expressed over the folded part.
        w.fold_and_free(t2);
        let mut later = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        for (c, r) in &mut later.live_rows {
            if *c == a {
                *r = Summary::default();
            }
        }
        let i = later
            .threads
            .iter()
            .position(|t| t.record == t1.index)
            .unwrap();
        later.threads[i].skipped_rows.push(a);
        carry_forward_summed(&mut later, &now);
        assert_eq!(total(&later, a).count, 8);
        assert_eq!(total(&later, a).min_ps, 1_000_000);
    }
}
