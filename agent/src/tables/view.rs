//! What every table is: the [`PfsTable`] trait, and the [`View`] of a
//! snapshot a table is built from.

use std::path::Path;

use pfs_shm_layout::EventKind;
use pfs_shm_layout::reader::{SegmentSnapshot, TaskSnapshot, ThreadSnapshot};

use super::cell::Sink;
use crate::filter::Filter;
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;

/// The segments a table shows (those that pass the request's filter), and
/// what `TRUNCATE` removed from view.
#[derive(Debug)]
pub struct View<'a> {
    /// Segment file and content, in path order.
    pub segments: Vec<(&'a Path, &'a SegmentSnapshot)>,
    /// `TRUNCATE` baselines.
    pub baselines: &'a Baselines,
    /// No baselines: what a segment that replaced a truncated one (a
    /// reused file name) shows through.
    none: Baselines,
    /// The segments whose process lives, with their timer at the
    /// snapshot.
    live: std::collections::HashMap<&'a Path, u128>,
}

impl<'a> View<'a> {
    /// The segments of `snap` that pass `filter`.
    pub fn new(snap: &'a Snapshot, filter: &Filter, baselines: &'a Baselines) -> Self {
        Self {
            segments: snap
                .segments
                .iter()
                .filter(|v| filter.accepts(&v.data))
                .map(|v| (v.path.as_path(), &*v.data))
                .collect(),
            baselines,
            none: Baselines::default(),
            live: snap
                .segments
                .iter()
                .filter(|v| v.live)
                .map(|v| (v.path.as_path(), v.timer_now_ps))
                .collect(),
        }
    }

    /// The timer of the segment at `path` when the snapshot was taken, if
    /// its process lives: the `TIMER_END` of its events still running.
    pub fn running_now(&self, path: &Path) -> Option<u128> {
        self.live.get(path).copied()
    }

    /// The segments whose process lives: those the setup tables and
    /// `performance_timers` show (a dead process's setup can no longer be
    /// changed, nor its timers read).
    pub fn live_segments(&self) -> impl Iterator<Item = &(&'a Path, &'a SegmentSnapshot)> + '_ {
        self.segments
            .iter()
            .filter(|(path, _)| self.live.contains_key(path))
    }

    /// The threads of segment `s` at `path` that the per-thread tables
    /// show (`threads`, `events_*_current` and `_history`,
    /// `*_summary_by_thread_*`, `memory_summary_by_{account,user,host}_*`):
    /// all of them while its process lives, none
    /// once it is dead. A process that exits folds its threads' records;
    /// one that is killed leaves them allocated, but its threads are gone
    /// all the same (its totals stay in the global summaries).
    pub fn threads_of<'s>(&self, path: &Path, s: &'s SegmentSnapshot) -> &'s [ThreadSnapshot] {
        if self.live.contains_key(path) {
            &s.threads
        } else {
            &[]
        }
    }

    /// The task slots of `s` at `path` that show events: only for a live
    /// process, as [`View::threads_of`].
    pub fn tasks_of<'s>(&self, path: &Path, s: &'s SegmentSnapshot) -> &'s [TaskSnapshot] {
        if self.live.contains_key(path) {
            &s.tasks
        } else {
            &[]
        }
    }

    /// The baselines of the segment `s` at `path`: none if they were kept
    /// for an earlier segment of that file name (a process whose pid a new
    /// one reused).
    pub fn baselines_for(&self, path: &Path, s: &SegmentSnapshot) -> &Baselines {
        if self.baselines.belong_to(path, s) {
            self.baselines
        } else {
            &self.none
        }
    }
}

/// `TRUNCATE` of a table that has nothing to truncate (setup tables,
/// `threads`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0} cannot be truncated; the events_*, file_summary_*, socket_summary_*, memory_summary_* and setup_actors tables can"
)]
pub struct NotTruncatable(pub String);

/// The processes a `TRUNCATE` could not change, each with why (a table
/// whose `TRUNCATE` writes the segments, `setup_actors`, cannot open one
/// read-write: its rows stay). Empty for the others, which only record
/// baselines.
pub type Unreached = Vec<String>;

/// A PFS table the agent serves: one implementation per table (or per
/// table of each event kind), listed once in the registry
/// ([`super::registry`]).
pub trait PfsTable: Send + Sync {
    /// The table's name (`events_waits_current`).
    fn name(&self) -> &str;

    /// Hands the table to `sink`: [`Sink::columns`], then each row.
    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink);

    /// Whether the table shows live processes only (their threads, task
    /// slots or setup; a dead process's totals stay in the global
    /// summaries): a `service`/`pid` filter that matches only dead ones
    /// leaves it empty, and says so ([`super::unmatched`]).
    fn live_only(&self) -> bool {
        false
    }

    /// `TRUNCATE TABLE`: records in `baselines` what the table stops
    /// showing as of `snap` (or changes the segments), and says which
    /// processes it could not change. Tables without anything to
    /// truncate refuse.
    fn truncate(
        &self,
        baselines: &mut Baselines,
        snap: &Snapshot,
    ) -> Result<Unreached, NotTruncatable> {
        let _ = (baselines, snap);
        Err(NotTruncatable(self.name().to_string()))
    }
}

/// A table of one event kind, `events_{kind}_{suffix}`, defined by what it
/// shows and what its `TRUNCATE` hides.
#[derive(Debug)]
pub struct KindTable {
    kind: EventKind,
    name: String,
    live_only: bool,
    emit: fn(&View<'_>, &mut dyn Sink, EventKind),
    truncate: fn(&mut Baselines, &Snapshot, EventKind),
}

impl KindTable {
    /// The table `events_{kind}_{suffix}`.
    pub fn new(
        kind: EventKind,
        suffix: &str,
        emit: fn(&View<'_>, &mut dyn Sink, EventKind),
        truncate: fn(&mut Baselines, &Snapshot, EventKind),
    ) -> Self {
        Self {
            kind,
            name: format!("events_{}_{suffix}", kind.table_word()),
            live_only: false,
            emit,
            truncate,
        }
    }

    /// The table shows live processes only ([`PfsTable::live_only`]).
    pub fn live_only(mut self) -> Self {
        self.live_only = true;
        self
    }
}

impl PfsTable for KindTable {
    fn name(&self) -> &str {
        &self.name
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        (self.emit)(view, sink, self.kind)
    }

    fn live_only(&self) -> bool {
        self.live_only
    }

    fn truncate(
        &self,
        baselines: &mut Baselines,
        snap: &Snapshot,
    ) -> Result<Unreached, NotTruncatable> {
        (self.truncate)(baselines, snap, self.kind);
        Ok(Unreached::new())
    }
}
