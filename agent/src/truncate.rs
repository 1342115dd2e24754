//! Layer 5: `TRUNCATE TABLE` with PFS's meaning, as baselines the
//! tables subtract (which table truncates what is the table's own
//! decision: each table implements its `TRUNCATE`).
//!
//! The agent never writes a thread's rows (each has exactly one writer, the
//! thread), and Prometheus counters must never go backwards, so truncation
//! is a baseline kept by the agent and subtracted from the tables' view:
//!
//! * summary tables show counts, sums and the histogram since the
//!   truncation; MIN and MAX since then are known to histogram-bucket
//!   precision (the lifetime value when it lies in that bucket range);
//!   truncating a global table also truncates the by-thread table of the
//!   same kind;
//! * `current`, `history` and `history_long` tables hide the events that
//!   existed at truncation time, each table on its own (truncating
//!   `events_waits_history` leaves `events_waits_current` whole): per logical thread, its events up to the
//!   newest id then seen (event ids count per thread, and per task: a
//!   task's events are written into the records of whichever threads
//!   polled it, under the task's `THREAD_ID`, so one record's ring may
//!   hold several logical threads' ids from 1). A thread's own events are
//!   keyed by its record lifetime, a task's by the task's `THREAD_ID` in
//!   its segment (in whatever record they appear); each `TRUNCATE`
//!   replaces a segment's task baselines of that kind, so that tasks long
//!   gone do not accumulate.
//!
//! * memory tables (`memory_summary_*`) follow the manual: COUNT_ALLOC
//!   and COUNT_FREE are both reduced by the same value (the smaller of
//!   the two at the truncation), and so are the SUM_* pair, so CURRENT
//!   stays ALLOC − FREE; LOW = HIGH = CURRENT at truncation time (then
//!   moving again). Nothing is freed. The agent bumps the segment's
//!   `memory_truncate_gen`, and each writer resets its row's watermarks
//!   on its next memory operation (a reader shows a row not touched since
//!   with LOW = HIGH = CURRENT). The dependencies go the manual's way:
//!   truncating the global table truncates every memory table (thread
//!   counts, global counts, all watermarks); truncating a by-thread or
//!   by-actor table truncates the thread rows (and so the account, user
//!   and host tables, which are sums of thread rows) but not the global
//!   table. Since the global row is a sum of the thread rows, whose
//!   watermarks the segment-wide reset lowers, the agent keeps the global
//!   watermarks seen at such a truncation and widens the global view by
//!   them, until the next truncation of the global table: the global HIGH
//!   stays at least the highest use since then, the global LOW at most
//!   the lowest.
//!
//! `/metrics` and OTLP are unaffected. `pfs-agent serve` keeps the
//! baselines in [`BASELINES_FILE`] in the segment directory (written
//! atomically after every `TRUNCATE`, keyed by segment file name with the
//! creator's start time, entries of removed files dropped), so a restarted
//! agent shows the same tables, and a new process whose file took an old
//! one's name (a reused pid, as in containers) shows its own figures whole. With
//! two agents on one directory, the last `TRUNCATE` of either is what a
//! restarted agent loads.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use pfs_shm_layout::layout::BucketScale;
use pfs_shm_layout::reader::{Event, MemoryStats, SegmentSnapshot, Summary, ThreadSnapshot};
use pfs_shm_layout::{ClassKind, EventKind};
use serde::{Deserialize, Serialize};

use crate::aggregate::{OWN_MEMORY_PREFIX, segment_global, segment_global_memory};
use crate::persist::{JsonError, MemoryJson, SummaryJson};
use crate::setup::open_rw;
use crate::snapshot::Snapshot;
use crate::util::fs::{DIR_ACCESS_HINT, ReadError, read_capped, set_aside, write_atomic};

/// The per-thread event tables a `TRUNCATE` hides events of, each on its
/// own (as in MySQL, truncating `events_waits_history` leaves
/// `events_waits_current` whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsTable {
    /// `events_*_current`.
    Current,
    /// `events_*_history`.
    History,
}

/// The events one table hides: per logical thread, its ids up to the
/// newest seen at the truncation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Hidden {
    /// Per record lifetime: the newest event id of the record's own thread.
    own: HashMap<(PathBuf, u32, u64, EventKind), u64>,
    /// Per segment: the newest event id of each task (by `THREAD_ID`).
    tasks: HashMap<(PathBuf, EventKind), HashMap<u64, u64>>,
}

/// A hidden record's own thread in the file: (segment, record, version,
/// kind, newest id).
type OwnRow = (Name, u32, u64, usize, u64);
/// A hidden task in the file: (segment, kind, task `THREAD_ID`, newest id).
type TaskRow = (Name, usize, u64, u64);

impl Hidden {
    fn own_rows(&self) -> Vec<OwnRow> {
        self.own
            .iter()
            .map(|(k, v)| (name_of(&k.0), k.1, k.2, k.3.index(), *v))
            .collect()
    }

    fn task_rows(&self) -> Vec<TaskRow> {
        self.tasks
            .iter()
            .flat_map(|(k, m)| {
                m.iter()
                    .map(|(tid, id)| (name_of(&k.0), k.1.index(), *tid, *id))
            })
            .collect()
    }
}

/// What TRUNCATE removed from view.
#[derive(Debug, Default, Clone)]
pub struct Baselines {
    thread: HashMap<(PathBuf, u32, u64, u32), Summary>,
    global: HashMap<(PathBuf, String), Summary>,
    /// `events_*_current`.
    current: Hidden,
    /// `events_*_history`.
    history: Hidden,
    long: HashMap<(PathBuf, EventKind, u64), u64>,
    mem_thread: HashMap<(PathBuf, u32, u64, u32), MemoryStats>,
    mem_global: HashMap<(PathBuf, String), MemoryStats>,
    /// Global watermarks kept across truncations of the other memory
    /// tables (only LOW and HIGH are used), until a global truncation.
    mem_global_marks: HashMap<(PathBuf, String), MemoryStats>,
    /// Segments whose watermarks could not be reset in the segment (dead
    /// or read-only): the view resets them (they no longer change).
    mem_reset: HashSet<PathBuf>,
    /// The segment each file's baselines belong to (its creator's start
    /// time): a file of the same name made by another process (a pid
    /// reused, as in containers) has none of them.
    owners: HashMap<PathBuf, u64>,
    /// The directory's file was written by a newer agent: it is left as
    /// it is, and these baselines are never saved over it.
    newer_file: bool,
}

impl Baselines {
    /// Whether the baselines kept for `path` belong to the segment `s`
    /// there now (true when no owner was recorded: a file written before
    /// owners were kept).
    pub fn belong_to(&self, path: &Path, s: &SegmentSnapshot) -> bool {
        self.owners
            .get(path)
            .is_none_or(|&t| t == s.start_time_unix_ns)
    }

    /// Before truncating the segment `s` at `path`: drops what was kept
    /// for an earlier segment of that name, and records `s` as the owner.
    fn claim(&mut self, path: &Path, s: &SegmentSnapshot) {
        if !self.belong_to(path, s) {
            self.forget(|p| p != path);
        }
        self.owners.insert(path.to_path_buf(), s.start_time_unix_ns);
    }

    /// Keeps only the baselines of the files `keep` says yes to.
    fn forget(&mut self, mut keep: impl FnMut(&PathBuf) -> bool) {
        self.thread.retain(|k, _| keep(&k.0));
        self.global.retain(|k, _| keep(&k.0));
        for h in [&mut self.current, &mut self.history] {
            h.own.retain(|k, _| keep(&k.0));
            h.tasks.retain(|k, _| keep(&k.0));
        }
        self.long.retain(|k, _| keep(&k.0));
        self.mem_thread.retain(|k, _| keep(&k.0));
        self.mem_global.retain(|k, _| keep(&k.0));
        self.mem_global_marks.retain(|k, _| keep(&k.0));
        self.mem_reset.retain(|p| keep(p));
        self.owners.retain(|p, _| keep(p));
    }

    /// Truncates the summaries of `kind` as of `snap`: the by-thread rows,
    /// and with `global` the global rows too (truncating a global table
    /// also truncates the by-thread table of the same kind, as in PFS).
    pub fn truncate_summaries(&mut self, snap: &Snapshot, kind: EventKind, global: bool) {
        self.truncate_rows(snap, |ck| kind.matches(ck), true, global);
    }

    /// Truncates the global rows of the instruments of kind `class_kind`
    /// only (`file_summary_by_event_name`, `socket_summary_by_event_name`:
    /// their rows are those instruments' global rows, which
    /// `events_waits_summary_global_by_event_name` shows too); the
    /// by-thread rows and every other instrument's stay.
    pub fn truncate_global_of(&mut self, snap: &Snapshot, class_kind: ClassKind) {
        self.truncate_rows(snap, |ck| ck == class_kind, false, true);
    }

    /// Truncates, as of `snap`, the rows of the instruments whose kind
    /// `which` takes: by thread if `threads`, global if `global`.
    fn truncate_rows(
        &mut self,
        snap: &Snapshot,
        which: impl Fn(ClassKind) -> bool,
        threads: bool,
        global: bool,
    ) {
        for v in &snap.segments {
            self.claim(&v.path, &v.data);
            let (path, s) = (&v.path, &v.data);
            let kinds: HashMap<u32, ClassKind> =
                s.classes.iter().map(|c| (c.index, c.kind)).collect();
            for t in s.threads.iter().filter(|_| threads) {
                for (c, sum) in &t.rows {
                    if kinds.get(c).is_some_and(|ck| which(*ck)) {
                        self.thread
                            .insert((path.clone(), t.record, t.version, *c), *sum);
                    }
                }
            }
            if global {
                for (name, (ck, sum)) in segment_global(s) {
                    if which(ck) {
                        self.global.insert((path.clone(), name), sum);
                    }
                }
            }
        }
    }

    /// Hides the events of `kind` in `table` that exist in `snap`: each
    /// logical thread's events (a thread's own, or a task's in any record)
    /// up to its newest id, over every kind.
    pub fn truncate_events(&mut self, snap: &Snapshot, kind: EventKind, table: EventsTable) {
        for v in &snap.segments {
            self.claim(&v.path, &v.data);
            let hidden = match table {
                EventsTable::Current => &mut self.current,
                EventsTable::History => &mut self.history,
            };
            let old = hidden
                .tasks
                .remove(&(v.path.clone(), kind))
                .unwrap_or_default();
            let mut tasks: HashMap<u64, u64> = HashMap::new();
            for t in &v.data.threads {
                let mut own = 0;
                for (tid, id) in event_ids(t) {
                    let newest = if tid == t.thread_id {
                        &mut own
                    } else {
                        tasks.entry(tid).or_default()
                    };
                    *newest = (*newest).max(id);
                }
                let e = hidden
                    .own
                    .entry((v.path.clone(), t.record, t.version, kind))
                    .or_default();
                *e = (*e).max(own);
            }
            // Tasks that await show in their slots (current rows only).
            if table == EventsTable::Current {
                for t in &v.data.tasks {
                    let rows = [t.waits_current.as_ref(), t.stages_current.as_ref()];
                    let statement = t.statements_current.as_ref().map(|s| &s.ev);
                    for e in rows.into_iter().chain([statement]).flatten() {
                        let newest = tasks.entry(e.thread_id).or_default();
                        *newest = (*newest).max(e.event_id);
                    }
                }
            }
            // Tasks seen now; a task seen in no record nor slot has nothing
            // left to hide (its ids only grow).
            for (tid, id) in &mut tasks {
                *id = (*id).max(old.get(tid).copied().unwrap_or(0));
            }
            if !tasks.is_empty() {
                hidden.tasks.insert((v.path.clone(), kind), tasks);
            }
        }
    }

    /// Hides the `history_long` events of `kind` that exist in `snap`.
    pub fn truncate_long(&mut self, snap: &Snapshot, kind: EventKind) {
        for v in &snap.segments {
            self.claim(&v.path, &v.data);
            let s = &v.data;
            let mut max: HashMap<u64, u64> = HashMap::new();
            let ids: Vec<(u64, u64)> = match kind {
                EventKind::Statement => s
                    .long_statements
                    .iter()
                    .map(|e| (e.ev.thread_id, e.ev.event_id))
                    .collect(),
                _ => s.long[kind.index()]
                    .iter()
                    .map(|e| (e.thread_id, e.event_id))
                    .collect(),
            };
            for (tid, id) in ids {
                let m = max.entry(tid).or_default();
                *m = (*m).max(id);
            }
            for (tid, id) in max {
                self.long.insert((v.path.clone(), kind, tid), id);
            }
        }
    }

    /// Truncates the memory tables as of `snap`: counts by thread (the
    /// by-thread, account, user and host tables), with `global` the global
    /// counts and watermarks too; without, the global watermarks are kept
    /// (see the module docs). The watermarks of every live segment are
    /// reset by its writers.
    pub fn truncate_memory(&mut self, snap: &Snapshot, global: bool) {
        for v in &snap.segments {
            self.claim(&v.path, &v.data);
            let path = &v.path;
            let s = &v.data;
            for t in &s.threads {
                for (c, m) in &t.memory {
                    self.mem_thread
                        .insert((path.clone(), t.record, t.version, *c), *m);
                }
            }
            let rows = segment_global_memory(s);
            if global {
                self.mem_global_marks.retain(|k, _| k.0 != *path);
                for (name, m) in rows {
                    self.mem_global.insert((path.clone(), name), m);
                }
            } else {
                for (name, m) in rows {
                    let shown = self.memory_global_marked(path, &name, &m);
                    self.mem_global_marks.insert((path.clone(), name), shown);
                }
            }
            let bumped = v.live
                && open_rw(path).is_ok_and(|seg| {
                    seg.setup()
                        .memory_truncate_gen
                        .fetch_add(1, std::sync::atomic::Ordering::Release);
                    true
                });
            if !bumped {
                self.mem_reset.insert(path.clone());
            }
        }
    }

    /// A thread's memory row as the memory tables show it.
    pub fn memory_thread_view(
        &self,
        path: &Path,
        record: u32,
        version: u64,
        class: u32,
        m: &MemoryStats,
    ) -> MemoryStats {
        let m = self.memory_reset(path, m);
        match self
            .mem_thread
            .get(&(path.to_path_buf(), record, version, class))
        {
            Some(base) => m.rebased(base),
            None => m,
        }
    }

    /// A global memory row as the global memory table shows it.
    pub fn memory_global_view(&self, path: &Path, name: &str, m: &MemoryStats) -> MemoryStats {
        let m = self.memory_global_marked(path, name, m);
        match self.mem_global.get(&(path.to_path_buf(), name.to_string())) {
            // The instrumentation's own rows, computed by the agent: no
            // writer resets their watermarks, so since the truncation they
            // span the use then and now.
            Some(base) if name.starts_with(OWN_MEMORY_PREFIX) => {
                let then = MemoryStats {
                    current_count: base.current_count,
                    current_bytes: base.current_bytes,
                    ..MemoryStats::default()
                }
                .reset_watermarks();
                m.rebased(base).reset_watermarks().widened(&then)
            }
            Some(base) => m.rebased(base),
            None => m,
        }
    }

    /// A global memory row's watermarks as shown: reset if the segment
    /// could not reset them, widened by those kept across truncations of
    /// the other memory tables.
    fn memory_global_marked(&self, path: &Path, name: &str, m: &MemoryStats) -> MemoryStats {
        let m = self.memory_reset(path, m);
        match self
            .mem_global_marks
            .get(&(path.to_path_buf(), name.to_string()))
        {
            Some(marks) => m.widened(marks),
            None => m,
        }
    }

    fn memory_reset(&self, path: &Path, m: &MemoryStats) -> MemoryStats {
        if self.mem_reset.contains(path) {
            m.reset_watermarks()
        } else {
            *m
        }
    }

    /// A thread's row as the by-thread table shows it.
    pub fn thread_view(
        &self,
        path: &Path,
        record: u32,
        version: u64,
        class: u32,
        sum: &Summary,
    ) -> Summary {
        match self
            .thread
            .get(&(path.to_path_buf(), record, version, class))
        {
            Some(base) => sum.since(base),
            None => *sum,
        }
    }

    /// A global row as the global table shows it.
    pub fn global_view(&self, path: &Path, name: &str, sum: &Summary) -> Summary {
        match self.global.get(&(path.to_path_buf(), name.to_string())) {
            Some(base) => sum.since(base),
            None => *sum,
        }
    }

    /// Which events of `kind` in `table` of thread record `t` are still
    /// visible: those of a logical thread (the record's own, or a task it
    /// polled) newer than its newest at the table's last `TRUNCATE`.
    pub fn visible_events<'a>(
        &'a self,
        path: &Path,
        t: &ThreadSnapshot,
        kind: EventKind,
        table: EventsTable,
    ) -> impl Fn(&Event) -> bool + 'a {
        let hidden = match table {
            EventsTable::Current => &self.current,
            EventsTable::History => &self.history,
        };
        let path = path.to_path_buf();
        let own = hidden
            .own
            .get(&(path.clone(), t.record, t.version, kind))
            .copied()
            .unwrap_or(0);
        let tasks = hidden.tasks.get(&(path, kind));
        let thread_id = t.thread_id;
        move |e: &Event| {
            let floor = if e.thread_id == thread_id {
                own
            } else {
                tasks
                    .and_then(|m| m.get(&e.thread_id).copied())
                    .unwrap_or(0)
            };
            e.event_id > floor
        }
    }

    /// Whether an event of a task slot is still visible in
    /// `events_*_current` of `kind` (see [`Baselines::visible_events`]).
    pub fn visible_task_events<'a>(
        &'a self,
        path: &Path,
        kind: EventKind,
    ) -> impl Fn(&Event) -> bool + 'a {
        let tasks = self.current.tasks.get(&(path.to_path_buf(), kind));
        move |e: &Event| {
            e.event_id
                > tasks
                    .and_then(|m| m.get(&e.thread_id).copied())
                    .unwrap_or(0)
        }
    }

    /// Whether a `history_long` row is still visible.
    pub fn keep_long(&self, path: &Path, kind: EventKind, event_id: u64, thread_id: u64) -> bool {
        self.long
            .get(&(path.to_path_buf(), kind, thread_id))
            .is_none_or(|&floor| event_id > floor)
    }
}

/// The file, in the segment directory, that keeps the baselines.
pub const BASELINES_FILE: &str = ".pfs-agent-truncate.json";
const FORMAT: &str = "pfs-agent-truncate";
/// Version 2 (layout 8.0) says each baseline's histogram scale, as the
/// retired totals' file does (see there); version 1 files are read too.
const VERSION: u32 = 2;
/// The oldest version read.
const OLDEST_VERSION: u32 = 1;
/// A larger baselines file is refused as corrupt.
pub const MAX_BASELINES_BYTES: u64 = 16 << 20;

/// A baselines file that cannot be used (it is then set aside, see
/// [`Baselines::load`]).
#[derive(Debug, thiserror::Error)]
pub enum BaselinesError {
    /// Opening or reading it failed, or it is too large.
    #[error(transparent)]
    File(#[from] ReadError),
    /// Not JSON of the expected shape.
    #[error("not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Another file's format, or a version this agent does not read.
    #[error("format {format:?} version {version}, expected {FORMAT:?} version {VERSION}")]
    Format {
        /// The format found.
        format: String,
        /// The version found.
        version: u32,
    },
    /// A segment name that is not a plain file name.
    #[error("{0:?} is not a segment file name")]
    Name(String),
    /// An event kind this agent does not know.
    #[error("event kind {0} is unknown")]
    Kind(usize),
    /// A summary that cannot be read back.
    #[error(transparent)]
    Summary(#[from] JsonError),
    /// Owned by another user than this agent's, under `--require-owner`.
    #[error(
        "owned by uid {0}, not by this agent's user: another user wrote it, and under --require-owner only the agent's own TRUNCATE baselines are read"
    )]
    ForeignOwner(u32),
}

type Name = String;

/// The file's content: keys by segment file name (the directory is the
/// agent's `--shm-dir`, wherever it is mounted). Fields added later are
/// `#[serde(default)]`: files of older agents still load (and older agents
/// ignore them).
#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: String,
    version: u32,
    thread: Vec<(Name, u32, u64, u32, SummaryJson)>,
    global: Vec<(Name, String, SummaryJson)>,
    /// `events_*_current`, a record's own thread. (Before `history_events`:
    /// both tables.)
    events: Vec<OwnRow>,
    /// `events_*_current`, tasks (since layout 3.1).
    #[serde(default)]
    task_events: Vec<TaskRow>,
    /// `events_*_history`, as `events`; absent in files of agents that
    /// kept one set for both tables (it is then `events`).
    #[serde(default)]
    history_events: Option<Vec<OwnRow>>,
    /// `events_*_history`, as `task_events`.
    #[serde(default)]
    history_task_events: Option<Vec<TaskRow>>,
    long: Vec<(Name, usize, u64, u64)>,
    mem_thread: Vec<(Name, u32, u64, u32, MemoryJson)>,
    mem_global: Vec<(Name, String, MemoryJson)>,
    /// Kept global watermarks (since the manual's TRUNCATE dependencies).
    #[serde(default)]
    mem_global_marks: Vec<(Name, String, MemoryJson)>,
    mem_reset: Vec<Name>,
    /// The segment (creator's start time) each file's baselines belong to.
    #[serde(default)]
    owners: Vec<(Name, u64)>,
}

fn name_of(p: &Path) -> Name {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl Baselines {
    /// Whether nothing was truncated.
    pub fn is_empty(&self) -> bool {
        self.thread.is_empty()
            && self.global.is_empty()
            && self.current == Hidden::default()
            && self.history == Hidden::default()
            && self.long.is_empty()
            && self.mem_thread.is_empty()
            && self.mem_global.is_empty()
            && self.mem_global_marks.is_empty()
            && self.mem_reset.is_empty()
            && self.owners.is_empty()
    }

    /// Forgets the baselines of segment files that no longer exist.
    pub fn retain_existing(&mut self) {
        let mut exists: HashMap<PathBuf, bool> = HashMap::new();
        self.forget(|p| *exists.entry(p.clone()).or_insert_with(|| p.exists()));
    }

    /// The baselines as the file's JSON text.
    pub fn encode(&self) -> Vec<u8> {
        let f = FileV1 {
            format: FORMAT.into(),
            version: VERSION,
            thread: self
                .thread
                .iter()
                .map(|(k, v)| (name_of(&k.0), k.1, k.2, k.3, SummaryJson::of(v)))
                .collect(),
            global: self
                .global
                .iter()
                .map(|(k, v)| (name_of(&k.0), k.1.clone(), SummaryJson::of(v)))
                .collect(),
            events: self.current.own_rows(),
            task_events: self.current.task_rows(),
            history_events: Some(self.history.own_rows()),
            history_task_events: Some(self.history.task_rows()),
            long: self
                .long
                .iter()
                .map(|(k, v)| (name_of(&k.0), k.1.index(), k.2, *v))
                .collect(),
            mem_thread: self
                .mem_thread
                .iter()
                .map(|(k, v)| (name_of(&k.0), k.1, k.2, k.3, MemoryJson::from(v)))
                .collect(),
            mem_global: self
                .mem_global
                .iter()
                .map(|(k, v)| (name_of(&k.0), k.1.clone(), MemoryJson::from(v)))
                .collect(),
            mem_global_marks: self
                .mem_global_marks
                .iter()
                .map(|(k, v)| (name_of(&k.0), k.1.clone(), MemoryJson::from(v)))
                .collect(),
            mem_reset: self.mem_reset.iter().map(|p| name_of(p)).collect(),
            owners: self.owners.iter().map(|(p, t)| (name_of(p), *t)).collect(),
        };
        serde_json::to_vec(&f).expect("baselines always serialize")
    }

    /// Parses the file's JSON text, placing the segments in `dir`.
    pub fn decode(bytes: &[u8], dir: &Path) -> Result<Self, BaselinesError> {
        // The format and version first: another version's file may have
        // another shape.
        let head: crate::util::json::FileHead = serde_json::from_slice(bytes)?;
        if head.format != FORMAT || !(OLDEST_VERSION..=VERSION).contains(&head.version) {
            return Err(BaselinesError::Format {
                format: head.format,
                version: head.version,
            });
        }
        let f: FileV1 = serde_json::from_slice(bytes)?;
        // A name must stay a name: no path can be smuggled in.
        let path = |n: &str| -> Result<PathBuf, BaselinesError> {
            if n.is_empty() || n.contains('/') || n == "." || n == ".." {
                return Err(BaselinesError::Name(n.to_string()));
            }
            Ok(dir.join(n))
        };
        let kind = |k: usize| EventKind::from_index(k).ok_or(BaselinesError::Kind(k));
        let mut b = Baselines::default();
        for (n, r, v, c, s) in &f.thread {
            b.thread.insert((path(n)?, *r, *v, *c), s.get(n)?);
        }
        for (n, class, s) in &f.global {
            // In the class's scale (a file from before layout 8.0 has its
            // stages' and statements' in the wait scale). A thread row's
            // baseline, by class index, takes it from the row it is
            // taken from (`Summary::since` adds up in the coarser).
            let scale =
                ClassKind::from_name(class).map_or(BucketScale::Short, BucketScale::of_class);
            b.global
                .insert((path(n)?, class.clone()), s.get(n)?.rescaled(scale));
        }
        let hidden = |own: &[OwnRow], tasks: &[TaskRow]| -> Result<Hidden, BaselinesError> {
            let mut h = Hidden::default();
            for (n, r, v, k, id) in own {
                h.own.insert((path(n)?, *r, *v, kind(*k)?), *id);
            }
            for (n, k, t, id) in tasks {
                h.tasks
                    .entry((path(n)?, kind(*k)?))
                    .or_default()
                    .insert(*t, *id);
            }
            Ok(h)
        };
        b.current = hidden(&f.events, &f.task_events)?;
        // A file of an agent that kept one set for both tables: both.
        b.history = hidden(
            f.history_events.as_deref().unwrap_or(&f.events),
            f.history_task_events.as_deref().unwrap_or(&f.task_events),
        )?;
        for (n, k, t, id) in &f.long {
            b.long.insert((path(n)?, kind(*k)?, *t), *id);
        }
        for (n, r, v, c, m) in &f.mem_thread {
            b.mem_thread.insert((path(n)?, *r, *v, *c), m.into());
        }
        for (n, class, m) in &f.mem_global {
            b.mem_global.insert((path(n)?, class.clone()), m.into());
        }
        for (n, class, m) in &f.mem_global_marks {
            b.mem_global_marks
                .insert((path(n)?, class.clone()), m.into());
        }
        for n in &f.mem_reset {
            b.mem_reset.insert(path(n)?);
        }
        for (n, t) in &f.owners {
            b.owners.insert(path(n)?, *t);
        }
        Ok(b)
    }

    /// `dir`'s baselines file, if there is one (of existing segments);
    /// `own_only`: refused unless this agent's effective user owns it.
    fn read(dir: &Path, own_only: bool) -> Result<Option<Self>, BaselinesError> {
        use std::os::unix::fs::MetadataExt;
        let file = dir.join(BASELINES_FILE);
        let b = match read_capped(&file, MAX_BASELINES_BYTES)? {
            None => None,
            Some((_, meta)) if own_only && meta.uid() != rustix::process::geteuid().as_raw() => {
                return Err(BaselinesError::ForeignOwner(meta.uid()));
            }
            Some((buf, _)) => Some(Self::decode(&buf, dir)?),
        };
        Ok(b.map(|mut b| {
            b.retain_existing();
            b
        }))
    }

    /// Loads `dir`'s baselines file (the agent that owns the directory):
    /// empty if there is none; a file that cannot be used is logged, set
    /// aside (`.corrupt`, never replacing an earlier one) and read as empty.
    /// `own_only` (under `--require-owner`, where other users may write
    /// the directory but are not trusted): a file another user owns (one
    /// planted to forge what the tables show) cannot be used.
    pub fn load(dir: &Path, own_only: bool) -> Self {
        match Self::read(dir, own_only) {
            Ok(b) => b.unwrap_or_default(),
            Err(BaselinesError::Format { format, version })
                if format == FORMAT && version > VERSION =>
            {
                tracing::error!(path = %dir.join(BASELINES_FILE).display(), version, "TRUNCATE baselines file written by a newer pfs-agent (version {version}; this agent reads version {VERSION}): it is left as it is and not overwritten; tables show lifetime values, and a TRUNCATE here is not saved");
                Self {
                    newer_file: true,
                    ..Self::default()
                }
            }
            Err(BaselinesError::File(ReadError::DirDenied(e))) => {
                tracing::error!(dir = %crate::util::shown::path(dir), error = %e, "cannot read the TRUNCATE baselines file {BASELINES_FILE}: the segment directory cannot be searched, so tables show lifetime values; {DIR_ACCESS_HINT}");
                Self::default()
            }
            Err(msg) => {
                let file = dir.join(BASELINES_FILE);
                let aside = dir.join(format!("{BASELINES_FILE}.corrupt"));
                match set_aside(&file, &aside) {
                    Ok(to) => {
                        tracing::error!(path = %crate::util::shown::path(&file), set_aside = %crate::util::shown::path(&to), "TRUNCATE baselines file is unusable ({msg}); tables show lifetime values again")
                    }
                    Err(e) => {
                        tracing::error!(path = %crate::util::shown::path(&file), error = %e, "TRUNCATE baselines file is unusable ({msg}) and cannot be set aside; tables show lifetime values; move it away")
                    }
                }
                Self::default()
            }
        }
    }

    /// Reads `dir`'s baselines file without changing anything (a reader
    /// such as `pfs-agent query`, beside the agent that owns the
    /// directory): empty, with a warning, if it cannot be used (`own_only`
    /// as in [`Baselines::load`]).
    pub fn peek(dir: &Path, own_only: bool) -> Self {
        match Self::read(dir, own_only) {
            Ok(b) => b.unwrap_or_default(),
            Err(BaselinesError::File(ReadError::DirDenied(e))) => {
                tracing::warn!(dir = %crate::util::shown::path(dir), error = %e, "cannot read the TRUNCATE baselines file {BASELINES_FILE}: the segment directory cannot be searched; showing lifetime values; {DIR_ACCESS_HINT}");
                Self::default()
            }
            Err(msg) => {
                tracing::warn!(path = %dir.join(BASELINES_FILE).display(), "TRUNCATE baselines file is unusable ({msg}); showing lifetime values");
                Self::default()
            }
        }
    }

    /// Saves the baselines (of existing segments) in `dir`, atomically;
    /// never over a file a newer agent wrote (an error while it is there).
    pub fn save(&mut self, dir: &Path) -> std::io::Result<()> {
        let path = dir.join(BASELINES_FILE);
        if self.newer_file && std::fs::symlink_metadata(&path).is_ok() {
            return Err(std::io::Error::other(format!(
                "{} was written by a newer pfs-agent and is not overwritten",
                path.display()
            )));
        }
        self.retain_existing();
        write_atomic(&dir.join(BASELINES_FILE), &self.encode())
    }
}

/// Every event of a thread record, of every kind, as (`THREAD_ID`,
/// `EVENT_ID`): the record's own thread's and the tasks' it polled.
fn event_ids(t: &ThreadSnapshot) -> impl Iterator<Item = (u64, u64)> + '_ {
    t.waits_history
        .iter()
        .chain(&t.stages_history)
        .chain(t.waits_current.iter())
        .chain(t.stages_current.iter())
        .chain(
            t.statements_history
                .iter()
                .chain(t.statements_current.iter())
                .map(|e| &e.ev),
        )
        .map(|e| (e.thread_id, e.event_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_file_round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("svc.7.pfs");
        std::fs::write(&seg, b"x").unwrap();
        let gone = dir.path().join("svc.8.pfs");
        let mut b = Baselines::default();
        let mut sum = Summary {
            count: 3,
            timed_count: 3,
            sum_ps: 3 << 70,
            min_ps: 5,
            max_ps: 9,
            ..Summary::default()
        };
        sum.buckets[1] = 3;
        b.thread.insert((seg.clone(), 1, 2, 3), sum);
        b.thread.insert((gone.clone(), 1, 2, 3), sum);
        b.global.insert((seg.clone(), "wait/x".into()), sum);
        b.current
            .own
            .insert((seg.clone(), 1, 2, EventKind::Wait), 77);
        b.history
            .own
            .insert((seg.clone(), 1, 2, EventKind::Wait), 66);
        b.current.tasks.insert(
            (seg.clone(), EventKind::Statement),
            [(9, 5), (11, 6)].into(),
        );
        b.current
            .tasks
            .insert((gone.clone(), EventKind::Statement), [(9, 5)].into());
        b.long.insert((seg.clone(), EventKind::Stage, 4), 88);
        let m = MemoryStats {
            count_alloc: 4,
            low_bytes: -3,
            ..MemoryStats::default()
        };
        b.mem_thread.insert((seg.clone(), 1, 2, 5), m);
        b.mem_global.insert((seg.clone(), "memory/x".into()), m);
        b.mem_global_marks
            .insert((seg.clone(), "memory/x".into()), m);
        b.mem_reset.insert(seg.clone());
        b.save(dir.path()).unwrap();
        let back = Baselines::load(dir.path(), false);
        assert_eq!(
            back.thread.len(),
            1,
            "the removed segment's entry is dropped"
        );
        assert_eq!(back.thread[&(seg.clone(), 1, 2, 3)], sum);
        assert_eq!(back.global[&(seg.clone(), "wait/x".to_string())], sum);
        assert_eq!(back.current.own[&(seg.clone(), 1, 2, EventKind::Wait)], 77);
        assert_eq!(back.history.own[&(seg.clone(), 1, 2, EventKind::Wait)], 66);
        assert!(back.history.tasks.is_empty(), "the tables are apart");
        assert_eq!(
            back.current.tasks,
            HashMap::from([(
                (seg.clone(), EventKind::Statement),
                [(9, 5), (11, 6)].into()
            )])
        );
        assert_eq!(back.long[&(seg.clone(), EventKind::Stage, 4)], 88);
        assert_eq!(back.mem_thread[&(seg.clone(), 1, 2, 5)], m);
        assert_eq!(back.mem_global[&(seg.clone(), "memory/x".to_string())], m);
        assert_eq!(
            back.mem_global_marks[&(seg.clone(), "memory/x".to_string())],
            m
        );
        assert!(back.mem_reset.contains(&seg));
        // A name with a path in it is refused; the file is set aside.
        let mut f: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(BASELINES_FILE)).unwrap())
                .unwrap();
        f["mem_reset"] = serde_json::json!(["../../etc/passwd"]);
        std::fs::write(dir.path().join(BASELINES_FILE), f.to_string()).unwrap();
        assert!(Baselines::load(dir.path(), false).is_empty());
        assert!(
            dir.path()
                .join(format!("{BASELINES_FILE}.corrupt"))
                .exists()
        );
        assert!(
            Baselines::load(dir.path(), false).is_empty(),
            "no file: empty"
        );
    }

    /// Under `--require-owner`, a baselines file another user planted (to
    /// hide or forge what the tables show) is neither used nor shown by
    /// `query`, and is set aside; the agent's own is read. (The planted
    /// file needs root to make: without root, only the agent's own file
    /// is checked.)
    #[test]
    fn only_the_agents_own_baselines_file_is_read_when_owners_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("svc.7.pfs");
        std::fs::write(&seg, b"x").unwrap();
        let mut b = Baselines::default();
        b.long.insert((seg.clone(), EventKind::Stage, 4), 88);
        b.save(dir.path()).unwrap();
        assert_eq!(Baselines::load(dir.path(), true).long.len(), 1, "its own");
        assert_eq!(Baselines::peek(dir.path(), true).long.len(), 1);
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let path = dir.path().join(BASELINES_FILE);
        std::os::unix::fs::chown(&path, Some(12345), None).unwrap();
        assert!(Baselines::peek(dir.path(), true).is_empty(), "not shown");
        assert!(path.exists(), "peek changes nothing");
        assert_eq!(
            Baselines::peek(dir.path(), false).long.len(),
            1,
            "any owner without the check"
        );
        assert!(Baselines::load(dir.path(), true).is_empty(), "not used");
        assert!(!path.exists(), "set aside");
        assert!(
            dir.path()
                .join(format!("{BASELINES_FILE}.corrupt"))
                .exists()
        );
    }

    /// A file of a newer version (an agent downgrade) is left as it is for
    /// that agent: not set aside, not overwritten by a TRUNCATE here.
    #[test]
    fn a_newer_agents_baselines_file_is_kept_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(BASELINES_FILE);
        let newer = serde_json::json!({
            "format": FORMAT, "version": VERSION + 1, "something": "new"
        })
        .to_string();
        std::fs::write(&path, &newer).unwrap();
        let mut b = Baselines::load(dir.path(), false);
        assert!(b.is_empty());
        assert!(b.save(dir.path()).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), newer);
        assert!(
            !dir.path()
                .join(format!("{BASELINES_FILE}.corrupt"))
                .exists()
        );
    }

    /// A file written before tasks (no `task_events`) loads as it was.
    #[test]
    fn a_baselines_file_without_task_events_loads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("svc.7.pfs"), b"x").unwrap();
        let old = serde_json::json!({
            "format": FORMAT, "version": 1, "thread": [], "global": [],
            "events": [["svc.7.pfs", 1, 2, 2, 41]],
            "long": [], "mem_thread": [], "mem_global": [], "mem_reset": []
        });
        let b = Baselines::decode(old.to_string().as_bytes(), dir.path()).unwrap();
        let seg = dir.path().join("svc.7.pfs");
        // One set for both tables, as the agent that wrote it had.
        assert_eq!(
            b.current.own[&(seg.clone(), 1, 2, EventKind::Statement)],
            41
        );
        assert_eq!(b.history.own[&(seg, 1, 2, EventKind::Statement)], 41);
        assert!(b.current.tasks.is_empty());
    }

    /// A live segment at `path` with history rings of `history` rows, a
    /// statement instrument and thread 1's record.
    fn thread_with_tasks(
        path: &Path,
        history: u32,
    ) -> (std::fs::File, pfs_shm_layout::SegmentWriter, u32, u32) {
        let cfg = pfs_shm_layout::SegmentConfig {
            history_len: history,
            ..Default::default()
        };
        let (f, w) = crate::testing::segment_at(path, &cfg, 7, true);
        let q = crate::testing::statement_class(&w, "q");
        let slot = w.alloc_thread(1, 1, "t").unwrap().index;
        (f, w, q, slot)
    }

    fn snap(dir: &Path) -> Snapshot {
        crate::snapshot::Snapshotter::new(
            crate::segments::SegmentSet::new(dir, std::time::Duration::MAX),
            std::time::Duration::ZERO,
        )
        .take()
    }

    #[test]
    fn each_truncate_keeps_the_tasks_still_seen() {
        use crate::testing::statement;
        let done = Some(Default::default());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.7.pfs");
        let (_f, w, q, slot) = thread_with_tasks(&path, 3);
        statement(&w, slot, q, (1, 1), 10, done);
        statement(&w, slot, q, (7, 4), 10, done);
        statement(&w, slot, q, (8, 2), 10, done);
        let mut b = Baselines::default();
        b.truncate_events(
            &snap(dir.path()),
            EventKind::Statement,
            EventsTable::History,
        );
        let key = (path.clone(), EventKind::Statement);
        // Tasks by id; the record's own thread by its lifetime.
        assert_eq!(b.history.tasks[&key], [(7, 4), (8, 2)].into());
        let t = &snap(dir.path()).segments[0].data.threads[0];
        assert_eq!(
            b.history.own[&(path.clone(), t.record, t.version, EventKind::Statement)],
            1
        );
        // Task 8's next statements push task 7 (and thread 1) out of the
        // ring (3 rows): the next TRUNCATE forgets task 7, and keeps task
        // 8's newest and thread 1's.
        statement(&w, slot, q, (8, 3), 10, done);
        statement(&w, slot, q, (8, 4), 10, done);
        b.truncate_events(
            &snap(dir.path()),
            EventKind::Statement,
            EventsTable::History,
        );
        assert_eq!(b.history.tasks[&key], [(8, 4)].into());
        assert_eq!(
            b.history.own[&(path.clone(), t.record, t.version, EventKind::Statement)],
            1
        );
        // Other kinds keep their own.
        b.truncate_events(&snap(dir.path()), EventKind::Wait, EventsTable::History);
        assert_eq!(b.history.tasks[&key], [(8, 4)].into());
        assert_eq!(b.history.tasks[&(path, EventKind::Wait)], [(8, 4)].into());
    }

    #[test]
    fn a_file_name_reused_by_another_process_has_none_of_the_baselines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.7.pfs");
        let (_f, w, q, slot) = thread_with_tasks(&path, 4);
        crate::testing::statement(&w, slot, q, (1, 1), 5_000, Some(Default::default()));
        let mut old = snap(dir.path());
        let mut b = Baselines::default();
        b.truncate_summaries(&old, EventKind::Statement, true);
        assert!(!b.global.is_empty());
        let seg = old.segments[0].clone();
        assert!(b.belong_to(&seg.path, &seg.data));
        // The same name, another process (a reused pid).
        let mut other = (*seg.data).clone();
        other.start_time_unix_ns += 1;
        assert!(!b.belong_to(&seg.path, &other));
        // The owner survives the file.
        let back = Baselines::decode(&b.encode(), dir.path()).unwrap();
        assert!(back.belong_to(&seg.path, &seg.data) && !back.belong_to(&seg.path, &other));
        // Truncating the new process drops what was kept for the old one.
        old.segments[0].data = std::sync::Arc::new(other.clone());
        b.truncate_events(&old, EventKind::Statement, EventsTable::History);
        assert!(b.global.is_empty() && b.thread.is_empty());
        assert!(b.belong_to(&seg.path, &other));
    }

    #[test]
    fn since_subtracts_and_bounds_min_max() {
        let mut base = Summary {
            count: 10,
            timed_count: 10,
            sum_ps: 10_000,
            min_ps: 1000,
            max_ps: 1000,
            ..Summary::default()
        };
        base.buckets[0] = 10;
        let mut cur = base;
        cur.count = 12;
        cur.timed_count = 12;
        cur.sum_ps = 10_000 + 2 * 50_000;
        cur.buckets[3] += 2; // (2^-25, 2^-24] s = (29802, 59604] ps
        cur.max_ps = 50_000;
        let v = cur.since(&base);
        assert_eq!((v.count, v.sum_ps), (2, 100_000));
        assert_eq!(v.max_ps, 50_000, "lifetime max lies in the new top bucket");
        // The lifetime MIN predates the truncation: the bucket gives a bound,
        // and COUNT, SUM and MAX pin it (two events of 100 000 ps in all,
        // neither above 50 000: both are 50 000).
        assert_eq!(
            v.min_ps, 50_000,
            "narrowed from the bucket bound by SUM and MAX"
        );
        assert_eq!(v.avg_ps(), 50_000);
        // Four events where the sum leaves room: the bucket bound stays.
        let mut cur3 = cur;
        cur3.count += 2;
        cur3.timed_count += 2;
        cur3.sum_ps += 2 * 30_000;
        cur3.buckets[3] += 2;
        let v = cur3.since(&base);
        assert_eq!(
            v.min_ps,
            pfs_shm_layout::layout::BUCKET_UPPER_PS[2] + 1,
            "lifetime min predates truncation: bucket bound"
        );
        assert_eq!(v.max_ps, 50_000);
    }
}
