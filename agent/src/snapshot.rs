//! Snapshots of every segment, taken lock-free, cached briefly and shared
//! by all readers (`/metrics`, tables, OTLP later) so that concurrent
//! scrapes cost one walk of the segments.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_shm_layout::reader::{ReadOptions, ReadStats, SegmentSnapshot};

use crate::aggregate::Retired;
use crate::discover::SegmentSet;

/// One segment in a snapshot.
#[derive(Debug, Clone)]
pub struct SegmentView {
    /// File path.
    pub path: PathBuf,
    /// False once the owning process has died.
    pub live: bool,
    /// Its content.
    pub data: SegmentSnapshot,
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

/// Owns the segment set and the snapshot cache.
#[derive(Debug)]
pub struct Snapshotter {
    set: Mutex<SegmentSet>,
    cache: Mutex<Option<Arc<Snapshot>>>,
    totals: Mutex<Totals>,
    max_age: Duration,
}

impl Snapshotter {
    /// A snapshotter over `set`; snapshots younger than `max_age` are reused.
    pub fn new(set: SegmentSet, max_age: Duration) -> Self {
        Self {
            set: Mutex::new(set),
            cache: Mutex::new(None),
            totals: Mutex::new(Totals::default()),
            max_age,
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
    }

    /// Discovery pass without a snapshot (background tick).
    pub fn refresh(&self) {
        self.set.lock().unwrap_or_else(|p| p.into_inner()).refresh();
    }

    /// Retires dead segments immediately.
    pub fn retire_all_dead(&self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.refresh();
        set.retire_all_dead();
    }

    /// The current snapshot, fresh or at most `max_age` old.
    pub fn get(&self) -> Arc<Snapshot> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cache.as_ref()
            && s.taken_at.elapsed() < self.max_age
        {
            return s.clone();
        }
        let s = Arc::new(self.take());
        *cache = Some(s.clone());
        s
    }

    /// Takes a new snapshot now.
    pub fn take(&self) -> Snapshot {
        let start = Instant::now();
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.refresh();
        let mut segments = Vec::with_capacity(set.tracked.len());
        let mut stats = ReadStats::default();
        let mut failed = 0u64;
        let mut carried = 0u64;
        for t in set.tracked.values_mut() {
            let live = t.dead_since.is_none();
            if !live && t.last.is_some() {
                // A dead process's segment no longer changes.
            } else {
                match t.snapshot(&ReadOptions::default()) {
                    Ok(mut s) => {
                        carried += carry_forward(&mut s, t.last.as_ref());
                        add_stats(&mut stats, &s.stats);
                        t.last = Some(s);
                    }
                    Err(e) => {
                        failed += 1;
                        tracing::warn!(path = %t.path.display(), error = %e, "segment snapshot failed; exporting its previous snapshot");
                    }
                }
            }
            if let Some(s) = &t.last {
                segments.push(SegmentView {
                    path: t.path.clone(),
                    live,
                    data: s.clone(),
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
