//! Layer 4: snapshots of every segment, taken lock-free, cached briefly and shared
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

use pfs_shm_layout::reader::{ReadOptions, ReadStats, SegmentSnapshot};

use crate::aggregate::Retired;
use crate::carry::{carry_forward, carry_forward_summed};
use crate::segments::{ListFailure, Refusal, SegmentSet};
use crate::util::heap::release_free_memory;

/// How long a snapshot is shared between requests by default: scrapes
/// and table requests within this time cost one walk of the segments.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(250);

/// One segment in a snapshot.
#[derive(Debug, Clone)]
pub struct SegmentView {
    /// File path.
    pub path: PathBuf,
    /// False once the owning process has died.
    pub live: bool,
    /// The segment's timer when the snapshot was taken (ps on its time
    /// line): the `TIMER_END` of its events still running.
    pub timer_now_ps: u128,
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
    /// Refused files: path, reason, message.
    pub invalid: Vec<(PathBuf, Refusal, String)>,
    /// Totals of retired segments.
    pub retired: Retired,
    /// Segment errors by reason, since the agent started.
    pub errors: HashMap<Refusal, u64>,
    /// Discovery passes that could not list the directory, by reason,
    /// since the agent started.
    pub list_errors: HashMap<ListFailure, u64>,
    /// Segments retired since the agent started.
    pub retired_segments: u64,
    /// Reading effort of this snapshot, summed over segments.
    pub stats: ReadStats,
    /// Segments that could not be read this time.
    pub failed_reads: u64,
    /// The segment volume at the last discovery pass.
    pub volume: Option<crate::segments::volume::Volume>,
    /// The retired totals could not be saved at the last attempt.
    pub state_unsaved: bool,
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
    /// Rows copied from the segments.
    pub rows_read: u64,
    /// Rows kept from the previous summaries snapshot, unchanged.
    pub rows_reused: u64,
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
    /// When the last [`Snapshotter::refresh`] ended (at first, when the
    /// snapshotter was made).
    last_refresh: Mutex<Instant>,
    /// The problems the last discovery pass found (kept apart from the
    /// set, so that `/healthz` reads them without waiting for a pass in
    /// progress).
    problems: Mutex<Vec<String>>,
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
            last_refresh: Mutex::new(Instant::now()),
            problems: Mutex::new(Vec::new()),
            max_age,
            full_keep: FULL_KEEP,
        }
    }

    /// How long a snapshot is reused.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// Cumulative figures.
    pub fn totals(&self) -> Totals {
        *self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long ago the last background discovery pass
    /// ([`Snapshotter::refresh`]) ended, or the snapshotter was made if
    /// none has: what `/healthz` checks, so that a stuck discovery (a
    /// hung filesystem, a pass that never ends) shows.
    pub fn since_refresh(&self) -> Duration {
        self.last_refresh
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// What the last discovery pass found wrong that a restart would not
    /// fix (see [`SegmentSet::problems`]): what `/healthz` reports besides
    /// [`Snapshotter::since_refresh`]. Never waits for a pass in progress.
    pub fn problems(&self) -> Vec<String> {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A discovery pass over `set`, its problems recorded.
    fn discover(&self, set: &mut SegmentSet) {
        set.refresh();
        let problems = set.problems();
        *self.problems.lock().unwrap_or_else(|p| p.into_inner()) = problems;
    }

    /// Paths of the segments whose processes live.
    pub fn live_paths(&self) -> Vec<PathBuf> {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        self.discover(&mut set);
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
    /// (glibc keeps it otherwise). Its end is recorded
    /// ([`Snapshotter::since_refresh`]).
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
        self.discover(&mut set);
        if stale {
            for t in set.tracked.values_mut() {
                dropped |= t.last.take().is_some();
            }
        }
        drop(set);
        if dropped {
            release_free_memory();
        }
        *self.last_refresh.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
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

    /// Forgets the summary rows kept between summaries snapshots, so that
    /// the next one reads every row (what a first scrape pays; the
    /// benchmarks compare the two).
    pub fn forget_kept(&self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        for t in set.tracked.values_mut() {
            t.forget_kept();
        }
    }

    /// Heap bytes of the summary rows kept between summaries snapshots,
    /// over every segment.
    pub fn kept_bytes(&self) -> usize {
        let set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        set.tracked.values().map(|t| t.kept_bytes()).sum()
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
        self.discover(&mut set);
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
        // Tracked segments with nothing to export (never read): listed
        // with the refused files, so that every file is counted somewhere.
        let mut unread = Vec::new();
        for t in set.tracked.values_mut() {
            let live = t.dead_since.is_none();
            let prev = match mode {
                Mode::Full => t.last.clone(),
                Mode::Summaries => t.last_summaries.clone(),
            };
            let prev = prev.as_ref();
            let fresh = if !live && prev.is_some() {
                // A dead process's segment no longer changes.
                None
            } else {
                let read = match mode {
                    Mode::Full => t.snapshot(&opts),
                    Mode::Summaries => t.snapshot_summaries(),
                };
                match read {
                    Ok(mut s) => {
                        carried += match (mode, prev) {
                            (Mode::Full, _) => carry_forward(&mut s, prev.map(|p| &**p)),
                            (Mode::Summaries, Some(p)) => carry_forward_summed(&mut s, p),
                            (Mode::Summaries, None) => 0,
                        };
                        stats.add(&s.stats);
                        Some(Arc::new(s))
                    }
                    Err(e) => {
                        failed += 1;
                        let message = e.to_string();
                        let exported = if prev.is_some() {
                            "exporting its previous snapshot"
                        } else {
                            "nothing read from it yet, so it is not exported (counted as invalid)"
                        };
                        // Logged when it starts (or changes), not on
                        // every scrape while it lasts; a global section
                        // busy for a moment while a previous snapshot is
                        // exported is reported only if it stays so
                        // (`SegmentSet::report_stuck`).
                        let passing = prev.is_some()
                            && matches!(e, pfs_shm_layout::SegmentError::GlobalLockStuck { .. });
                        if !passing && t.failure.as_deref() != Some(message.as_str()) {
                            tracing::warn!(path = %crate::util::shown::path(&t.path), reason = Refusal::of(&e).label(), error = %e, "segment snapshot failed; {exported}; retried on every read");
                        } else {
                            tracing::debug!(path = %crate::util::shown::path(&t.path), reason = Refusal::of(&e).label(), error = %e, "segment snapshot failed again; {exported}");
                        }
                        if prev.is_none() {
                            unread.push((t.path.clone(), Refusal::of(&e), message.clone()));
                        }
                        t.failure = Some(message);
                        None
                    }
                }
            };
            if fresh.is_some() && t.failure.take().is_some() {
                tracing::info!(path = %crate::util::shown::path(&t.path), "segment read again");
            }
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
                    timer_now_ps: data.timer.now_ps(),
                    data,
                });
            }
        }
        segments.sort_by(|a, b| a.path.cmp(&b.path));
        set.report_stuck();
        let mut invalid: Vec<_> = set
            .invalid
            .iter()
            .map(|(p, i)| (p.clone(), i.reason, i.message.clone()))
            .chain(unread)
            .collect();
        invalid.sort_by(|a, b| a.0.cmp(&b.0));
        let snap = Snapshot {
            taken_at: Instant::now(),
            duration: start.elapsed(),
            segments,
            invalid,
            retired: set.retired().clone(),
            errors: set.errors.clone(),
            list_errors: set.list_errors.clone(),
            retired_segments: set.retired_segments(),
            stats,
            failed_reads: failed,
            volume: set.volume,
            state_unsaved: set.state_unsaved(),
        };
        drop(set);
        let mut tot = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        tot.snapshots += 1;
        tot.retries += stats.retries;
        tot.skipped_rows += stats.skipped_rows;
        tot.skipped_events += stats.skipped_events;
        tot.carried_rows += carried;
        tot.rows_read += stats.rows_read;
        tot.rows_reused += stats.rows_reused;
        tot.failed_reads += failed;
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{mutex_class, record_waits as record, segment_at};

    #[test]
    fn an_unused_full_snapshot_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (_file, w) = segment_at(&dir.path().join("t.1.pfs"), &Default::default(), 1, true);
        let c = mutex_class(&w, "a");
        let slot = w.alloc_thread(1, 1, "t").unwrap();
        record(&w, slot.index, c, 3);
        let mut snap = Snapshotter::new(
            SegmentSet::new(dir.path(), Duration::MAX),
            Duration::from_secs(60),
        );
        let full = snap.get();
        assert_eq!(full.segments[0].data.threads[0].rows.len(), 1);
        let kept = |s: &Snapshotter| {
            let set = s.set.lock().unwrap();
            set.tracked.values().filter(|t| t.last.is_some()).count()
        };
        std::thread::sleep(Duration::from_millis(20));
        let before = snap.since_refresh();
        snap.refresh();
        assert!(snap.since_refresh() < before, "a pass is recorded");
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
}
