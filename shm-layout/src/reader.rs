//! The reader side of the protocol: a lock-free, version-checked snapshot
//! of a whole segment into plain data.
//!
//! The reader never writes the segment and never waits for a writer: every
//! sequence-locked read is retried at most `attempts` times, then the item
//! is skipped and counted in [`ReadStats`].
//!
//! # Reconciling exiting threads
//!
//! A thread that exits folds its rows into the global section and frees its
//! record. To count each event exactly once, a snapshot:
//!
//! 1. reads `fold_count` (`F0`);
//! 2. copies every ALLOCATED record, keeping a copy only if the record's
//!    lock word is unchanged after the copy (a changed word means the
//!    lifetime ended, and its fold completed before the re-check);
//! 3. reads the global section under its sequence lock: rows, `fold_count`
//!    (`F2`) and the fold log;
//! 4. drops every copy whose `(record, version)` appears in the fold log
//!    with a ticket `<= F2`: those events are already in the global rows.
//!
//! If more than [`FOLD_LOG_LEN`] folds happened between steps 1 and 3, the
//! log may have lost entries and the snapshot is retried.
//!
//! Layer 5, the top (see the crate docs): builds on [`crate::segment`],
//! [`crate::setup`], [`crate::container`], [`crate::lockword`],
//! [`crate::values`] and the layers below. It shares no code with the
//! writer, only the format.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{Ordering::*, fence};

use crate::container::PageState;
use crate::error::SegmentError;
use crate::kinds::{ClassKind, EventKind, Operation};
use crate::layout::*;
use crate::lockword::{self, RecordState};
use crate::rowcache::{CachePart, Changes, Delta, KeptRecord, NOT_KEPT, RowCache, Rows, Walked};
use crate::segment::{
    RowCopy, RowReader, RowsCopy, Segment, TimerCalibration, io_tail, prefetch, touched_classes,
};
use crate::seqlock::SeqLock;
use crate::setup::{Actor, consumers_in_effect, read_actors};
use crate::text::{load_string, shared_str_of_words};
use crate::values::StatementFigures;

// Moved to `values` (below the reader and the writer); re-exported at
// their old paths.
pub use crate::values::{IoFigures, MemoryStats, Summary};

/// Tuning of a snapshot.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Attempts per sequence-locked item before it is skipped.
    pub attempts: u32,
    /// Copy the current rows (`events_*_current`), the history rings,
    /// `history_long` and the task slots.
    pub events: bool,
    /// Copy the current rows and the task slots only (what the running
    /// events' gauges need), without the history rings; implied by
    /// [`ReadOptions::events`]. Without `events`, a current statement is
    /// its event only: its figures zero and its text empty. Three
    /// sequence-locked rows per thread, read whether or not the thread's
    /// summary rows changed.
    pub current: bool,
    /// Keep every live thread's summary rows in [`ThreadSnapshot::rows`].
    /// When false they are summed by class, as they are read, into
    /// [`SegmentSnapshot::live_rows`], so that the snapshot's size does not
    /// grow with threads × instruments (all `/metrics` needs). Memory rows
    /// are kept per thread either way.
    pub per_thread_rows: bool,
    /// Give back the mapping of each container page once it has been read
    /// ([`Segment::release_page`]): the reader's resident memory then does
    /// not grow with the segment's size.
    pub release_pages: bool,
    /// Read the global section as it is if its sequence lock still holds
    /// this odd value. Only for a segment whose writers are known to be
    /// gone (its process died) after a snapshot failed with
    /// [`SegmentError::GlobalLockStuck`]: a writer killed in the middle of
    /// a thread-exit fold leaves the lock odd forever, and nobody can
    /// finish the write. The result may be torn (see the crate docs,
    /// "A global lock that stays odd"). `None` (the default): never.
    pub global_stuck_at: Option<u64>,
    /// The segment's writers are gone (its process died): a thread's
    /// summary or memory row whose sequence stays odd for every attempt
    /// is read as it is instead of skipped. Its writer was killed in the
    /// middle of one update, which nobody can finish; each field then
    /// holds its value from before or after that update (fields are
    /// written one store each), so the row is off by at most that one
    /// event, where skipping it would lose every event it counted.
    /// Counted in [`ReadStats::torn_rows`]. `false` (the default): skip.
    pub dead_writers: bool,
    /// Threads one walk may use: the segment's container pages are split
    /// among them in contiguous ranges, each with at least
    /// `records_per_thread` records (each thread reads its pages' records
    /// whole; the parts are merged in page order, so the snapshot is the
    /// one a single thread would take). The default: the CPUs this process
    /// may use, at most [`MAX_WALK_THREADS`]. 1 (or 0): the caller's thread
    /// only.
    pub threads: usize,
    /// The fewest records (ACTIVE container pages × records per page) a
    /// walk gives each of its threads. Default
    /// [`PARALLEL_MIN_RECORDS`].
    pub records_per_thread: u32,
}

/// The most threads a walk uses by default ([`ReadOptions::threads`]).
pub const MAX_WALK_THREADS: usize = 4;

/// [`ReadOptions::records_per_thread`]'s default: starting and joining a
/// thread costs about 12 us (measured on a 2-CPU VM), what an incremental
/// walk of about 10 unchanged records of 200 rows spends; with 64 records
/// a thread at least, it stays a small part of any walk.
pub const PARALLEL_MIN_RECORDS: u32 = 64;

/// [`ReadOptions::threads`]'s default, found once per process (finding
/// it reads the cgroup's CPU limit from files).
fn default_walk_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WALK_THREADS))
    })
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            attempts: 256,
            events: true,
            current: true,
            per_thread_rows: true,
            release_pages: false,
            global_stuck_at: None,
            dead_writers: false,
            threads: default_walk_threads(),
            records_per_thread: PARALLEL_MIN_RECORDS,
        }
    }
}

impl ReadOptions {
    /// What an exporter of summaries needs: no history, rows summed by
    /// class, pages given back after reading; the current rows and task
    /// slots, for the events running now.
    pub fn summaries() -> Self {
        Self {
            events: false,
            current: true,
            per_thread_rows: false,
            release_pages: true,
            ..Self::default()
        }
    }
}

/// Counters describing one snapshot's reading effort.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Sequence-locked reads rejected because a write overlapped them.
    pub retries: u64,
    /// Summary rows skipped after exhausting their attempts.
    pub skipped_rows: u64,
    /// Event rows (current/history) skipped after exhausting attempts.
    pub skipped_events: u64,
    /// Records whose lifetime ended while they were being copied.
    pub ended_records: u64,
    /// Copies dropped because their thread had already been folded.
    pub folded_copies: u64,
    /// Entries (classes, strings, records) with invalid content.
    pub invalid: u64,
    /// Whole-snapshot restarts: the fold log wrapped during the walk, or
    /// exiting threads kept the global section busy for every attempt.
    pub restarts: u64,
    /// Summary and memory rows copied from the segment.
    pub rows_read: u64,
    /// Rows an [`IncrementalReader`] did not copy: their sequence showed
    /// them unchanged since it kept them.
    pub rows_reused: u64,
    /// Rows of a dead process read as they are, their sequence left odd
    /// by a writer killed in the middle of an update
    /// ([`ReadOptions::dead_writers`]).
    pub torn_rows: u64,
    /// Page ranges walked ([`ReadOptions::threads`]): the first on the
    /// caller's thread, each other on one of its own (or, if no thread
    /// could be started, the caller's too); 1 per walk of a small segment.
    /// Summed over a snapshot's attempts.
    pub parts: u64,
}

impl ReadStats {
    /// Adds another snapshot's counters (totals over many snapshots).
    ///
    /// ```
    /// use pfs_shm_layout::reader::ReadStats;
    ///
    /// let mut total = ReadStats::default();
    /// total.add(&ReadStats { retries: 2, ..ReadStats::default() });
    /// total.add(&ReadStats { retries: 3, ..ReadStats::default() });
    /// assert_eq!(total.retries, 5);
    /// ```
    pub fn add(&mut self, o: &ReadStats) {
        self.retries += o.retries;
        self.skipped_rows += o.skipped_rows;
        self.skipped_events += o.skipped_events;
        self.ended_records += o.ended_records;
        self.folded_copies += o.folded_copies;
        self.invalid += o.invalid;
        self.restarts += o.restarts;
        self.parts += o.parts;
        self.rows_read += o.rows_read;
        self.torn_rows += o.torn_rows;
        self.rows_reused += o.rows_reused;
    }
}

/// One registered instrument class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassInfo {
    /// Index in the registry.
    pub index: u32,
    /// PFS instrument name.
    pub name: String,
    /// Kind.
    pub kind: ClassKind,
    /// `FLAG_*` bits at the time of the snapshot.
    pub flags: u32,
}

impl ClassInfo {
    /// PFS `ENABLED`.
    pub fn enabled(&self) -> bool {
        self.flags & FLAG_ENABLED != 0
    }

    /// PFS `TIMED`.
    pub fn timed(&self) -> bool {
        self.flags & FLAG_TIMED != 0
    }
}

/// What a class's summary row slot holds, for reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowKind {
    /// A summary of events of this kind, with the last eight words read
    /// as the tail says.
    Events(EventKind, Tail),
    /// A memory row ([`MemoryRow`]).
    Memory,
}

/// What the last eight words of a summary row hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Nothing (stages, waits other than file and socket I/O).
    None,
    /// The statement figures of a statement class.
    Statement,
    /// The figures by I/O mode of a file or socket class ([`IoTail`]).
    Io,
}

impl RowKind {
    /// An untouched row, or one of a class not published: read as a
    /// wait summary (nothing in it).
    const DEFAULT: RowKind = RowKind::Events(EventKind::Wait, Tail::None);

    fn of(kind: ClassKind) -> Self {
        let tail = match kind {
            ClassKind::Statement => Tail::Statement,
            k if k.is_io() => Tail::Io,
            _ => Tail::None,
        };
        EventKind::of_class(kind).map_or(Self::Memory, |k| Self::Events(k, tail))
    }
}

/// Each class slot's [`RowKind`], as the class table stood when a walk
/// started; a slot not published then is looked up again when a row of
/// it is read. A class registered while the walk runs can have touched
/// rows (a writer publishes a class before it records any event of it):
/// they are read with the class's own kind, never a default one.
struct Kinds<'s> {
    seg: &'s Segment,
    /// `None`: not published at the walk's start.
    known: Vec<Option<RowKind>>,
}

impl<'s> Kinds<'s> {
    fn new(seg: &'s Segment) -> Self {
        let known = seg
            .classes()
            .iter()
            .map(|e| published_kind(e).map(RowKind::of))
            .collect();
        Self { seg, known }
    }

    fn len(&self) -> usize {
        self.known.len()
    }

    /// `class`'s row kind (a slot still unpublished, or out of range:
    /// an event summary, which an untouched row is read as).
    fn get(&self, class: usize) -> RowKind {
        match self.known.get(class) {
            Some(Some(k)) => *k,
            Some(None) => {
                published_kind(&self.seg.classes()[class]).map_or(RowKind::DEFAULT, RowKind::of)
            }
            None => RowKind::DEFAULT,
        }
    }
}

impl Summary {
    /// Loads `row`, reading only the cache lines that can hold figures:
    /// the histogram buckets from MIN's to MAX's (every timed event lies
    /// between the two, so the others are zero), plus one in the bucket
    /// `pending` names (the latest timed event, not yet in `buckets`:
    /// layout 7.0), and the last line only for a statement class (its
    /// statement figures) or a file or socket class (its figures by I/O
    /// mode), as `tail` says. A row is 6 lines, a wait row typically 2 or
    /// 3 of them. Its histogram comes in the scale this crate's writers use for
    /// `kind` ([`BucketScale::of`]): a row of a segment of major version
    /// `major` written in another ([`BucketScale::written`]) is moved to
    /// it.
    fn load(row: &SummaryRow, kind: EventKind, tail: Tail, major: u32) -> Self {
        let mut s = Self::default();
        let _ = s.load_into(row, kind, tail, major);
        s
    }

    /// [`Summary::load`] into `self` (no 432-byte value moved around: the
    /// walk loads every row into one buffer). Returns the buckets loaded:
    /// every other one is zero (a span [`Summary::nonzero_buckets`] would
    /// find only by looking at the others).
    #[inline(always)]
    fn load_into(
        &mut self,
        row: &SummaryRow,
        kind: EventKind,
        tail: Tail,
        major: u32,
    ) -> Range<usize> {
        self.scale = BucketScale::written(kind, major);
        let pending = pending_bucket(row.pending.load(Relaxed));
        self.count = row.count.load(Relaxed);
        self.timed_count = row.timed_count.load(Relaxed);
        self.sum_ps =
            u128::from(row.sum_lo.load(Relaxed)) | (u128::from(row.sum_hi.load(Relaxed)) << 64);
        self.min_ps = row.min.load(Relaxed);
        self.max_ps = row.max.load(Relaxed);
        self.bytes = row.bytes.load(Relaxed);
        self.buckets = [0; HISTOGRAM_BUCKETS];
        let mut range = self.filled_buckets();
        if pending.is_some_and(|p| !range.contains(&p)) {
            // Outside MIN..MAX: not a writer's row (a dead writer's, torn);
            // every bucket, as it is.
            range = 0..HISTOGRAM_BUCKETS;
        }
        // The pending bucket is added as its counter is loaded: one store
        // per bucket, none just before the caller's wide loads of them.
        let p = pending.unwrap_or(usize::MAX);
        for ((i, d), s) in range
            .clone()
            .zip(&mut self.buckets[range.clone()])
            .zip(&row.buckets[range.clone()])
        {
            *d = s.load(Relaxed).wrapping_add(u64::from(i == p));
        }
        self.io = if tail == Tail::Io {
            let t = io_tail(row);
            IoFigures {
                count: t.count.each_ref().map(|a| a.load(Relaxed)),
                sum_ns: t.sum_ns.each_ref().map(|a| a.load(Relaxed)),
                bytes: t.bytes.each_ref().map(|a| a.load(Relaxed)),
            }
        } else {
            IoFigures::ZERO
        };
        self.statement = if tail == Tail::Statement {
            StatementFigures {
                errors: row.errors.load(Relaxed),
                warnings: row.warnings.load(Relaxed),
                rows_affected: row.rows_affected.load(Relaxed),
                rows_sent: row.rows_sent.load(Relaxed),
                rows_examined: row.rows_examined.load(Relaxed),
                digest: 0,
                cpu_time_ps: row.cpu_time.load(Relaxed),
                cancelled: row.cancelled.load(Relaxed),
            }
        } else {
            StatementFigures::default()
        };
        let scale = BucketScale::of(kind);
        if self.scale != scale {
            // An older layout's scale (7.x stages and statements).
            *self = self.rescaled(scale);
            return self.nonzero_buckets();
        }
        range
    }
}

impl MemoryStats {
    /// Loads `row` of a segment of major version `major`; if its
    /// truncation generation is older than `tgen`, the writer has not
    /// touched it since a TRUNCATE, so LOW = HIGH = CURRENT. Counts and
    /// sums are at the same offsets in every layout; 5.x stored CURRENT
    /// ([`MemoryRowV5`]), 6.0 derives it ([`MemoryRow::current`]).
    fn load(row: &MemoryRow, major: u32, tgen: u64) -> Self {
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Relaxed);
        // (LOW, CURRENT, HIGH) of the counts and of the bytes, and the
        // row's truncation generation.
        let (count, bytes, row_tgen) = if major == 5 {
            let r = crate::segment::v5_memory_row(row);
            (
                [&r.low_count_used, &r.current_count_used, &r.high_count_used].map(ld),
                [&r.low_bytes_used, &r.current_bytes_used, &r.high_bytes_used].map(ld),
                ld(&r.truncate_gen),
            )
        } else {
            let (cc, cb) = row.current();
            (
                [ld(&row.low_count_used), cc, ld(&row.high_count_used)],
                [ld(&row.low_bytes_used), cb, ld(&row.high_bytes_used)],
                ld(&row.truncate_gen),
            )
        };
        let s = Self {
            count_alloc: ld(&row.count_alloc),
            count_free: ld(&row.count_free),
            bytes_alloc: ld(&row.sum_bytes_alloc),
            bytes_free: ld(&row.sum_bytes_free),
            low_count: count[0] as i64,
            current_count: count[1] as i64,
            high_count: count[2] as i64,
            low_bytes: bytes[0] as i64,
            current_bytes: bytes[1] as i64,
            high_bytes: bytes[2] as i64,
        };
        if row_tgen < tgen {
            s.reset_watermarks()
        } else {
            s
        }
    }
}

/// One event row, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// `EVENT_ID`.
    pub event_id: u64,
    /// `END_EVENT_ID`, `None` while running.
    pub end_event_id: Option<u64>,
    /// Class index.
    pub class: u32,
    /// Operation.
    pub operation: Option<Operation>,
    /// `TIMER_START`, ps since segment creation.
    pub timer_start: Option<u128>,
    /// `TIMER_END`, ps since segment creation.
    pub timer_end: Option<u128>,
    /// `TIMER_WAIT`, ps.
    pub timer_wait: Option<u64>,
    /// `OBJECT_INSTANCE_BEGIN`.
    pub object_instance: u64,
    /// `NUMBER_OF_BYTES`.
    pub bytes: Option<u64>,
    /// `SPINS`.
    pub spins: Option<u64>,
    /// `SOURCE` string index.
    pub source: Option<u32>,
    /// `OBJECT_NAME` string index.
    pub object_name: Option<u32>,
    /// `NESTING_EVENT_ID`.
    pub nesting_event_id: Option<u64>,
    /// `NESTING_EVENT_TYPE`: the parent's kind (`None`: no parent, or a
    /// value this reader does not know).
    pub nesting_event_type: Option<EventKind>,
    /// This event's kind, if the writer said (and this reader knows it).
    pub event_type: Option<EventKind>,
    /// The timer that produced the timestamps.
    pub timer: TimerId,
    /// Stages: `WORK_COMPLETED` and `WORK_ESTIMATED`.
    pub progress: Option<(u64, u64)>,
    /// `THREAD_ID`: the thread or task the event belongs to (in a thread
    /// record's rows, a row that does not say is the record's thread).
    pub thread_id: u64,
}

/// A statement event: the common fields plus the statement's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatementEvent {
    /// Common event fields.
    pub ev: Event,
    /// Figures (`ERRORS`, `ROWS_SENT`, ..., `DIGEST`).
    pub figures: StatementFigures,
    /// `SQL_TEXT` (empty if none was supplied).
    pub text: String,
}

impl StatementEvent {
    /// The event alone ([`ReadOptions::current`] without
    /// [`ReadOptions::events`]): no figures, no text.
    fn load_event(r: &StatementRecord, timer: &TimerCalibration) -> Option<Self> {
        Some(Self {
            ev: Event::load(&r.ev, timer)?,
            figures: StatementFigures::default(),
            text: String::new(),
        })
    }

    fn load(r: &StatementRecord, timer: &TimerCalibration) -> Option<Self> {
        let ev = Event::load(&r.ev, timer)?;
        Some(Self {
            ev,
            figures: StatementFigures {
                errors: r.errors.load(Relaxed),
                warnings: r.warnings.load(Relaxed),
                rows_affected: r.rows_affected.load(Relaxed),
                rows_sent: r.rows_sent.load(Relaxed),
                rows_examined: r.rows_examined.load(Relaxed),
                digest: r.digest.load(Relaxed),
                cpu_time_ps: if ev.end_event_id.is_some() {
                    r.ev.cpu_time.load(Relaxed)
                } else {
                    0
                },
                cancelled: u64::from(r.ev.flags.load(Relaxed) & EV_CANCELLED != 0),
            },
            text: load_string(&r.text, r.text_len.load(Relaxed)).unwrap_or_default(),
        })
    }
}

impl Event {
    fn load(r: &EventRecord, timer: &TimerCalibration) -> Option<Self> {
        let flags = r.flags.load(Relaxed);
        let event_id = r.event_id.load(Relaxed);
        if event_id == 0 {
            return None;
        }
        let timed = flags & EV_TIMED != 0;
        let ended = flags & EV_ENDED != 0;
        let idx = |v: u32| (v != NONE_U32).then_some(v);
        let nesting = r.nesting_event_id.load(Relaxed);
        let tid =
            TimerId::from_u32((flags & EV_TIMER_MASK) >> EV_TIMER_SHIFT).unwrap_or(TimerId::Cycle);
        let progress = flags & EV_HAS_PROGRESS != 0;
        Some(Self {
            event_id,
            end_event_id: ended.then(|| r.end_event_id.load(Relaxed)),
            class: r.class.load(Relaxed),
            operation: Operation::from_u32(r.operation.load(Relaxed)),
            timer_start: timed.then(|| timer.timestamp_ps(tid, r.timer_start.load(Relaxed))),
            timer_end: (timed && ended).then(|| timer.timestamp_ps(tid, r.timer_end.load(Relaxed))),
            timer_wait: (timed && ended).then(|| r.timer_wait.load(Relaxed)),
            object_instance: r.object_instance.load(Relaxed),
            bytes: (flags & EV_HAS_BYTES != 0 && !progress).then(|| r.bytes.load(Relaxed)),
            spins: (flags & EV_HAS_SPINS != 0 && !progress).then(|| r.spins.load(Relaxed)),
            source: idx(r.source.load(Relaxed)),
            object_name: idx(r.object_name.load(Relaxed)),
            nesting_event_id: (nesting != 0).then_some(nesting),
            nesting_event_type: EventKind::from_wire(r.nesting_event_type.load(Relaxed)),
            event_type: EventKind::from_wire(r.event_type.load(Relaxed)),
            timer: tid,
            progress: progress.then(|| (r.bytes.load(Relaxed), r.spins.load(Relaxed))),
            thread_id: r.thread_id.load(Relaxed),
        })
    }
}

/// A live thread, copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSnapshot {
    /// Record index.
    pub record: u32,
    /// Lock-word version (record lifetime).
    pub version: u64,
    /// `THREAD_ID`.
    pub thread_id: u64,
    /// `THREAD_OS_ID`.
    pub os_tid: u64,
    /// Thread name (shared with the incremental reader's kept copy while
    /// it does not change).
    pub name: Arc<str>,
    /// `INSTRUMENTED`.
    pub instrumented: bool,
    /// `HISTORY`.
    pub history: bool,
    /// Declared actor: `PROCESSLIST_USER`, `PROCESSLIST_HOST`, role.
    pub actor: Option<(String, String, String)>,
    /// `events_waits_current`.
    pub waits_current: Option<Event>,
    /// `events_waits_history`, oldest first.
    pub waits_history: Vec<Event>,
    /// `events_stages_current`.
    pub stages_current: Option<Event>,
    /// `events_stages_history`, oldest first.
    pub stages_history: Vec<Event>,
    /// `events_statements_current`.
    pub statements_current: Option<StatementEvent>,
    /// `events_statements_history`, oldest first.
    pub statements_history: Vec<StatementEvent>,
    /// Summary rows by class index (touched rows only).
    pub rows: Vec<(u32, Summary)>,
    /// Memory rows by class index (touched memory classes only).
    pub memory: Vec<(u32, MemoryStats)>,
    /// Classes whose row could not be read consistently.
    pub skipped_rows: Vec<u32>,
    actor_ids: Option<(u32, u32, u32)>,
}

/// A thread's three current rows ([`ThreadSnapshot::take_current`]).
type CurrentRows = (Option<Event>, Option<Event>, Option<StatementEvent>);

impl ThreadSnapshot {
    /// The current event of `kind` (`events_*_current`), if read and any.
    pub fn current(&self, kind: EventKind) -> Option<&Event> {
        match kind {
            EventKind::Wait => self.waits_current.as_ref(),
            EventKind::Stage => self.stages_current.as_ref(),
            EventKind::Statement => self.statements_current.as_ref().map(|s| &s.ev),
        }
    }

    /// Takes the current rows out (an incremental walk keeps the rest).
    fn take_current(&mut self) -> CurrentRows {
        (
            self.waits_current.take(),
            self.stages_current.take(),
            self.statements_current.take(),
        )
    }

    /// Puts back what [`ThreadSnapshot::take_current`] took.
    fn put_current(&mut self, (w, s, st): CurrentRows) {
        (
            self.waits_current,
            self.stages_current,
            self.statements_current,
        ) = (w, s, st);
    }
}

/// What an async task that awaits has open, from its task slot (since
/// 7.1; see the crate docs, *Task slots*). The same event may also be in the current
/// row of a thread polling the task at that instant: show it from there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSnapshot {
    /// Slot index.
    pub slot: u32,
    /// The wait the task is queued in.
    pub waits_current: Option<Event>,
    /// The task's open stage.
    pub stages_current: Option<Event>,
    /// The task's open statement.
    pub statements_current: Option<StatementEvent>,
}

impl TaskSnapshot {
    /// The event of `kind` the task has open, if any.
    pub fn current(&self, kind: EventKind) -> Option<&Event> {
        match kind {
            EventKind::Wait => self.waits_current.as_ref(),
            EventKind::Stage => self.stages_current.as_ref(),
            EventKind::Statement => self.statements_current.as_ref().map(|s| &s.ev),
        }
    }
}

/// Everything a segment held at one instant (per item).
#[derive(Debug, Clone)]
pub struct SegmentSnapshot {
    /// Service name.
    pub service: String,
    /// Creator pid.
    pub pid: u32,
    /// Creation time, ns since the epoch.
    pub start_time_unix_ns: u64,
    /// Timer calibration.
    pub timer: TimerCalibration,
    /// Registered classes, by index.
    pub classes: Vec<ClassInfo>,
    /// Interned strings by index.
    pub strings: HashMap<u32, String>,
    /// Live threads.
    pub threads: Vec<ThreadSnapshot>,
    /// Tasks that await with an event open (read with
    /// [`ReadOptions::events`]; slots with no row are left out).
    pub tasks: Vec<TaskSnapshot>,
    /// Summary rows of the live threads summed by class index, when read
    /// without [`ReadOptions::per_thread_rows`] (empty otherwise: the rows
    /// are in [`ThreadSnapshot::rows`]). Classes no live thread touched
    /// have no entry.
    pub live_rows: Vec<(u32, Summary)>,
    /// Totals folded in by exited threads, by class index.
    pub exited: Vec<(u32, Summary)>,
    /// Memory totals folded in by exited threads, by class index.
    pub exited_memory: Vec<(u32, MemoryStats)>,
    /// The segment's `memory_truncate_gen` when the snapshot was taken.
    pub memory_truncate_gen: u64,
    /// Threads that have exited (folds).
    pub threads_exited: u64,
    /// Lost counters by [`LostKind`].
    pub lost: [u64; LOST_COUNTERS],
    /// `setup_consumers` word.
    pub consumers: u32,
    /// `setup_timers` word.
    pub timers: u32,
    /// `setup_actors` rows.
    pub actors: Vec<Actor>,
    /// `events_waits_history_long` and `events_stages_history_long` (by
    /// [`EventKind::index`]), oldest first.
    pub long: [Vec<Event>; 2],
    /// `events_statements_history_long`, oldest first.
    pub long_statements: Vec<StatementEvent>,
    /// Tickets taken per `history_long` ring (events offered to it), by
    /// [`EventKind::index`].
    pub long_tickets: [u64; 3],
    /// Container pages added.
    pub pages: u32,
    /// State of each added page (ACTIVE, RECLAIMED, ...), by page index.
    pub page_states: Vec<PageState>,
    /// Pages reclaimed since creation (the owner's running count).
    pub pages_reclaimed: u64,
    /// Reclaimed pages revived since creation.
    pub pages_revived: u64,
    /// The segment's geometry (sizes of its sections).
    pub geometry: crate::segment::Geometry,
    /// Reading effort.
    pub stats: ReadStats,
}

impl SegmentSnapshot {
    /// Every summary row of the segment: what exited threads folded in,
    /// then each live thread's rows, as (class index, figures).
    pub fn summary_rows(&self) -> impl Iterator<Item = &(u32, Summary)> {
        self.exited
            .iter()
            .chain(self.threads.iter().flat_map(|t| t.rows.iter()))
    }

    /// The process's summary of class `class`: the merge of its
    /// [`summary_rows`](Self::summary_rows).
    pub fn summary_of(&self, class: u32) -> Summary {
        let mut sum = Summary::default();
        for (_, r) in self.summary_rows().filter(|(c, _)| *c == class) {
            sum.merge(r);
        }
        sum
    }

    /// Every memory row of the segment: what exited threads folded in,
    /// then each live thread's rows, as (class index, figures).
    pub fn memory_rows(&self) -> impl Iterator<Item = &(u32, MemoryStats)> {
        self.exited_memory
            .iter()
            .chain(self.threads.iter().flat_map(|t| t.memory.iter()))
    }

    /// The process's memory figures of class `class`: the sum of its
    /// [`memory_rows`](Self::memory_rows) (LOW and HIGH add, as the
    /// children's sum).
    pub fn memory_of(&self, class: u32) -> MemoryStats {
        let mut m = MemoryStats::default();
        for (_, r) in self.memory_rows().filter(|(c, _)| *c == class) {
            m.merge(r);
        }
        m
    }
}

/// Takes a snapshot of `seg`.
pub fn snapshot(seg: &Segment, opts: &ReadOptions) -> Result<SegmentSnapshot, SegmentError> {
    let mut stats = ReadStats::default();
    let mut watch = GlobalWatch::default();
    // Summing rows during the walk cannot take back a copy that the fold
    // log then shows as folded already: after two such walks, keep the
    // rows per thread during the walk and sum them afterwards.
    let mut folded_walks = 0;
    let mut failures = 0;
    let mut budget = 4;
    while failures < budget || watch.again(seg, &mut budget) {
        let mode = if opts.per_thread_rows || folded_walks >= 2 {
            RowMode::PerThread
        } else {
            RowMode::Summed
        };
        match try_snapshot(seg, opts, mode, None, &mut stats) {
            Ok((mut s, _, _)) => {
                s.stats = stats;
                return Ok(s);
            }
            Err((Retry::LogWrapped(n), _)) => {
                watch.wrapped(n);
                failures += 1;
            }
            Err((Retry::GlobalBusy, _)) => {
                watch.busy(seg);
                failures += 1;
            }
            Err((Retry::FoldedCopy, _)) => folded_walks += 1,
        }
        stats.restarts += 1;
    }
    Err(watch.error())
}

/// What the failed attempts of one snapshot saw of the global section:
/// tells a lock that stays odd at one value (a fold that does not finish:
/// its writer is stopped, or was killed in the middle of it) from folds
/// that keep it busy (exits faster than a snapshot).
#[derive(Debug, Default)]
struct GlobalWatch {
    /// Attempts that found the fold log wrapped.
    wrapped: u32,
    /// The lock word and `fold_count` after the first busy attempt, then
    /// after the last one.
    first: Option<(u64, u64)>,
    last: (u64, u64),
    /// Most folds seen during one wrapped attempt.
    folds: u64,
    /// Whether the lock was watched for [`STUCK_AFTER`] after the
    /// attempts, and did not move.
    stuck: bool,
    /// Whether the attempts were extended once already.
    extended: bool,
}

/// How long a global lock seen at one odd value by every attempt of a
/// snapshot is watched before it is called stuck: a fold takes
/// microseconds, but its thread may be preempted in the middle of it for
/// a scheduler slice or two; a stuck lock then costs one snapshot this
/// much (the reader sleeps: it never spins on a writer).
pub const STUCK_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

impl GlobalWatch {
    fn busy(&mut self, seg: &Segment) {
        let gh = seg.global_header();
        let now = (gh.seq.sequence(), gh.fold_count.load(Acquire));
        self.first.get_or_insert(now);
        self.last = now;
    }

    /// After the attempts ran out: if every one found the lock at one odd
    /// value, watches it for [`STUCK_AFTER`]; if it moved (a slow fold, not
    /// a stuck one), grants two more attempts (once) and returns true.
    fn again(&mut self, seg: &Segment, budget: &mut u32) -> bool {
        let Some(first) = self.first else {
            return false;
        };
        if self.extended || self.wrapped > 0 || first != self.last || first.0 & 1 == 0 {
            return false;
        }
        self.extended = true;
        let gh = seg.global_header();
        let start = std::time::Instant::now();
        while start.elapsed() < STUCK_AFTER {
            if (gh.seq.sequence(), gh.fold_count.load(Acquire)) != first {
                *budget += 2;
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.stuck = true;
        false
    }

    fn wrapped(&mut self, folds: u64) {
        self.folds = self.folds.max(folds);
        self.wrapped += 1;
    }

    /// The error after the last failed attempt.
    fn error(&self) -> SegmentError {
        match self.first {
            Some(first) if self.stuck => SegmentError::GlobalLockStuck { seq: first.0 },
            Some(first) => {
                SegmentError::FoldStorm(self.folds.max(self.last.1.wrapping_sub(first.1)))
            }
            None => SegmentError::FoldStorm(self.folds),
        }
    }
}

/// Summaries snapshots of one segment that cost what changed since the
/// previous one: the rows of [`SegmentSnapshot::live_rows`] are read from
/// the segment only if their sequence moved (the record's row sequence
/// array, 8 bytes per row, tells which, without touching the rows); the
/// others, and the sums by class, are kept between snapshots
/// ([`crate::rowcache`], about 45 bytes per kept row). Each snapshot
/// equals what [`snapshot`] with [`ReadOptions::summaries`] would give at
/// the same instant: the same exit reconciliation (fold log), the same
/// exactness.
///
/// One reader per segment: its kept rows are that segment's.
///
/// ```no_run
/// use pfs_shm_layout::Segment;
/// use pfs_shm_layout::reader::{IncrementalReader, ReadOptions};
///
/// let seg = Segment::open(std::fs::File::open("/dev/shm/pfs/app.1.pfs")?, false)?;
/// let mut reader = IncrementalReader::default();
/// let first = reader.snapshot(&seg, &ReadOptions::summaries())?; // reads every row
/// let next = reader.snapshot(&seg, &ReadOptions::summaries())?; // reads what changed
/// assert_eq!(next.stats.rows_read + next.stats.rows_reused, first.stats.rows_read);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct IncrementalReader {
    cache: RowCache<Box<Kept>>,
}

/// What an [`IncrementalReader`] keeps of a live thread beside its
/// summary rows: its copy (identity and memory rows), and the sequence
/// each memory row was read at.
#[derive(Debug)]
struct Kept {
    thread: ThreadSnapshot,
    memory_seqs: Vec<u64>,
    tgen: u64,
    /// The sequence the thread's identity was read at (`None`: not read
    /// under its lock): while the record's identity lock still holds it,
    /// the identity is the kept one.
    id_seq: Option<u64>,
    /// The record's `touched` bitmap when every touched row was kept
    /// (zeros otherwise): while the record's bitmap still equals it, only
    /// the kept rows can have changed.
    touched: Touched,
}

/// A copy of a record's `touched` bitmap.
type Touched = [u64; MAX_CLASSES_LIMIT as usize / 64];

impl IncrementalReader {
    /// A summaries snapshot of `seg` (`opts` as [`ReadOptions::summaries`]:
    /// with `events` or `per_thread_rows` set, this is a plain
    /// [`snapshot`], and nothing is kept).
    pub fn snapshot(
        &mut self,
        seg: &Segment,
        opts: &ReadOptions,
    ) -> Result<SegmentSnapshot, SegmentError> {
        if opts.events || opts.per_thread_rows {
            return snapshot(seg, opts);
        }
        let mut stats = ReadStats::default();
        let mut watch = GlobalWatch::default();
        let mut attempts = 0;
        let mut budget = 4;
        while attempts < budget || watch.again(seg, &mut budget) {
            attempts += 1;
            // A walk's thread that panics leaves rows put in place without
            // their delta: the cache is dropped before the panic goes on
            // (a caller that catches it reads everything again next time).
            let walk = std::panic::catch_unwind(AssertUnwindSafe(|| {
                try_snapshot(
                    seg,
                    opts,
                    RowMode::Changed,
                    Some(&mut self.cache),
                    &mut stats,
                )
            }));
            let walk = walk.unwrap_or_else(|panic| {
                self.cache = RowCache::default();
                std::panic::resume_unwind(panic)
            });
            match walk {
                Ok((mut s, walked, delta)) => {
                    self.cache.commit(walked, delta);
                    s.live_rows = self.cache.totals();
                    s.stats = stats;
                    return Ok(s);
                }
                Err((why, delta)) => {
                    // The rows the walk put in place stay: the sums take them.
                    self.cache.settle(delta);
                    match why {
                        Retry::LogWrapped(n) => watch.wrapped(n),
                        Retry::GlobalBusy => watch.busy(seg),
                        Retry::FoldedCopy => {}
                    }
                }
            }
            stats.restarts += 1;
        }
        Err(watch.error())
    }

    /// Live records whose rows are kept.
    pub fn kept_records(&self) -> usize {
        self.cache.len()
    }

    /// Heap bytes of the kept records and sums (the threads' names and
    /// memory rows aside).
    pub fn heap_bytes(&self) -> usize {
        self.cache.heap_bytes()
    }

    /// Heap bytes of the kept summary rows alone (compact: about 45 bytes
    /// a row).
    pub fn row_bytes(&self) -> usize {
        self.cache.row_bytes()
    }
}

/// One walk's result: the snapshot, and for an incremental walk, the
/// live records it found and what their rows changed in the sums.
type Walk = (SegmentSnapshot, Vec<Walked<Box<Kept>>>, Delta);

/// Where one walk puts the live threads' summary rows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RowMode {
    /// In each thread's [`ThreadSnapshot::rows`].
    PerThread,
    /// Summed by class as they are read.
    Summed,
    /// Only rows new or changed since the cache kept them are read; those
    /// of kept records are put in place in the cache as the walk goes
    /// ([`CachePart::apply`]), those of the others come back as fresh
    /// [`Walked`] records.
    Changed,
}

/// Where [`read_thread`] puts the rows it reads.
enum Sink<'a, 'c> {
    Keep,
    Sum(&'a mut ClassSums),
    Changed {
        cache: &'a CachePart<'c, Box<Kept>>,
        /// The rows of a record the cache did not keep.
        read: &'a mut Rows,
        /// The changed rows of a record the cache kept.
        changes: &'a mut Changes,
        /// What the changed rows of kept records change in the sums.
        delta: &'a mut Delta,
        /// What the rows of records not kept add to them.
        fresh: &'a mut Delta,
        /// The record's `touched` bitmap as this walk read it.
        touched: &'a mut Touched,
        /// Set if it is the kept one (the walk visited only the kept rows
        /// whose sequence moved, and the memory rows).
        same_touched: &'a mut bool,
        /// The sequence its identity was read at, if read under its lock.
        id_seq: &'a mut Option<u64>,
        memory_seqs: &'a mut Vec<u64>,
        /// The walk's buffer for rows copied by `pread`, and the file
        /// description this thread of the walk reads them through.
        copy: &'a mut RowCopy,
        via: &'a mut Via,
        /// The walk's buffer for the rows of a record not kept, copied at
        /// once (when it gives its pages back).
        bulk: &'a mut RowsCopy,
        /// The walk's buffer for the classes to visit in a kept record.
        visit: &'a mut Vec<usize>,
    },
}

/// How many changed rows of a kept record an incremental walk copies with
/// `pread` (about 1 µs each here) before it reads the rest through the
/// mapping. A row read through the mapping faults in its page and, by
/// fault-around, up to 15 neighbours, which the walk then gives back: about
/// 2 µs for one row, amortised over every row in those 64 KiB when many
/// changed. Measured at 1 000 threads × 200 classes with 1 % of the rows
/// changed: `take_incremental` 8.8 → 6.0 ms.
const PREAD_ROWS: u32 = 8;

/// The file description a thread of an incremental walk copies rows
/// through ([`Segment::copy_row_via`]): the segment's own (the walk's
/// first thread), or one of its own, opened at its first copy and closed
/// with the walk (threads that share one pass its reference count back and
/// forth); where none can be opened, the segment's.
enum Via {
    Shared,
    /// `None` until the first copy.
    Own(Option<Option<RowReader>>),
}

impl Via {
    fn get(&mut self, seg: &Segment) -> Option<&RowReader> {
        match self {
            Via::Shared => None,
            Via::Own(r) => r.get_or_insert_with(|| seg.row_reader().ok()).as_ref(),
        }
    }
}

/// A row to copy with `pread` ([`Segment::copy_row_via`]): row `class`
/// of record `idx`, through `via`, into `copy`.
struct Pread<'a> {
    seg: &'a Segment,
    via: Option<&'a RowReader>,
    idx: u32,
    class: usize,
    copy: &'a mut RowCopy,
}

impl Pread<'_> {
    fn copy(&mut self) -> bool {
        self.seg
            .copy_row_via(self.via, self.idx, self.class, self.copy)
    }
}

/// How to copy row `class` of record `idx` by `pread`: into an
/// incremental walk's buffer, for a record it kept (`kept`), while fewer
/// than [`PREAD_ROWS`] of the record's rows were copied so (counted in
/// `preads`); `None`: read the row through the mapping.
fn pread_slot<'s>(
    sink: &'s mut Sink<'_, '_>,
    seg: &'s Segment,
    (idx, class): (u32, usize),
    kept: bool,
    preads: &mut u32,
) -> Option<Pread<'s>> {
    match sink {
        Sink::Changed { copy, via, .. } if kept && *preads < PREAD_ROWS => {
            *preads += 1;
            Some(Pread {
                seg,
                via: via.get(seg),
                idx,
                class,
                copy,
            })
        }
        _ => None,
    }
}

/// How many rows ahead of the one being read a walk asks the CPU to fetch
/// (touched rows are mostly adjacent). Each row's load otherwise waits for
/// two dependent misses (its first line, then the histogram lines MIN and
/// MAX select); with the fetch in flight for the rows to come, the misses
/// overlap.
const PREFETCH_ROWS: usize = 3;

/// The histogram buckets a walk fetches ahead: 0 to 15, up to 244 us,
/// where most events' durations lie (a row's others are read when its
/// MAX says so).
const PREFETCH_BUCKETS: usize = 16;

/// A record not kept is copied at once ([`Segment::copy_rows_via`]) only
/// if at least one of every this many rows up to its last touched one is
/// touched.
const BULK_DENSITY: usize = 4;

/// How [`read_row`] read a row.
struct RowRead<T> {
    /// The row and the sequence it was read at; `None`: skipped.
    value: Option<(u64, T)>,
    /// Attempts rejected.
    retries: u32,
    /// Read as it is: its sequence stayed odd and its writers are gone
    /// ([`ReadOptions::dead_writers`]).
    torn: bool,
}

/// One row's copy under its sequence lock `seq`, loaded by `load`: taken
/// with `pread` (seen through `view`) if `pread` is given, else from `mapped`,
/// the row in the mapping. A failed `pread` gives no copy: the row is
/// skipped, as one found torn on every attempt (unless its writers are
/// gone: [`ReadOptions::dead_writers`]).
fn read_row<R, T>(
    seq: &SeqLock,
    opts: &ReadOptions,
    mut pread: Option<Pread<'_>>,
    view: fn(&RowCopy) -> &R,
    mapped: &R,
    mut load: impl FnMut(&R) -> T,
) -> RowRead<T> {
    let r = match &mut pread {
        None => seq.read_versioned(opts.attempts, || Some(load(mapped))),
        Some(p) => seq.read_versioned(opts.attempts, || p.copy().then(|| load(view(p.copy)))),
    };
    let value = r.value.and_then(|(s, v)| Some((s, v?)));
    if value.is_none() && opts.dead_writers {
        // Nobody can finish the write: the row as it is, at the odd
        // sequence it stays at (so a reader that keeps it sees it
        // unchanged from now on).
        let s = seq.sequence();
        let as_is = match &mut pread {
            None => Some(load(mapped)),
            Some(p) => p.copy().then(|| load(view(p.copy))),
        };
        if s & 1 == 1
            && let Some(v) = as_is
        {
            return RowRead {
                value: Some((s, v)),
                retries: r.retries,
                torn: true,
            };
        }
    }
    RowRead {
        value,
        retries: r.retries,
        torn: false,
    }
}

/// Why one snapshot attempt must be retried.
enum Retry {
    /// The global section was being written on every attempt.
    GlobalBusy,
    /// More exits than the fold log holds happened during the walk.
    LogWrapped(u64),
    /// A copy summed during the walk turned out to be folded already, or
    /// its record's lifetime ended while it was being summed.
    FoldedCopy,
}

/// Live threads' summary rows summed by class during a walk.
struct ClassSums {
    sums: Vec<Option<Summary>>,
}

impl ClassSums {
    fn new(classes: usize) -> Self {
        Self {
            sums: vec![None; classes],
        }
    }

    #[inline]
    fn add(&mut self, class: u32, s: &Summary) {
        if let Some(slot) = self.sums.get_mut(class as usize) {
            match slot {
                Some(sum) => sum.merge(s),
                None => *slot = Some(*s),
            }
        }
    }

    /// Adds `o`'s sums into these.
    fn merge(&mut self, o: ClassSums) {
        for (d, s) in self.sums.iter_mut().zip(o.sums) {
            match (d.as_mut(), s) {
                (Some(d), Some(s)) => d.merge(&s),
                (None, s) => *d = s,
                (Some(_), None) => {}
            }
        }
    }

    fn into_rows(self) -> Vec<(u32, Summary)> {
        self.sums
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i as u32, s)))
            .collect()
    }
}

/// One walk's fixed inputs, shared by the threads that read its parts.
#[derive(Clone, Copy)]
struct Walker<'w> {
    seg: &'w Segment,
    opts: &'w ReadOptions,
    mode: RowMode,
    kinds: &'w Kinds<'w>,
    tgen: u64,
}

/// What a walk read of a range of container pages.
struct Part {
    threads: Vec<ThreadSnapshot>,
    page_states: Vec<PageState>,
    sums: ClassSums,
    walked: Vec<Walked<Box<Kept>>>,
    /// What the rows put in place in kept records changed in the sums.
    delta: Delta,
    /// What the rows of the records not kept add to them.
    fresh: Delta,
    st: ReadStats,
}

/// Why the walk of a part stopped, what it read until then, and what the
/// rows it put in place changed in the sums.
struct PartFailed {
    why: Retry,
    st: ReadStats,
    delta: Delta,
}

impl Part {
    /// Appends `next`, the part of the pages that follow this one's.
    fn absorb(&mut self, next: Part) {
        self.threads.extend(next.threads);
        self.page_states.extend(next.page_states);
        self.sums.merge(next.sums);
        self.walked.extend(next.walked);
        self.delta.merge(next.delta);
        self.fresh.merge(next.fresh);
        self.st.add(&next.st);
    }
}

impl Walker<'_> {
    /// The walk's container pages `0..pages` in contiguous ranges, one per
    /// thread: the ACTIVE pages (the only ones read) shared evenly, each
    /// range with at least [`ReadOptions::records_per_thread`] records, at most
    /// [`ReadOptions::threads`] ranges.
    fn split(&self, pages: u32) -> Vec<Range<u32>> {
        let states = self.seg.page_states();
        let active: Vec<u32> = (0..pages)
            .filter(|&p| PageState::of(states[p as usize].load(Relaxed)) == PageState::Active)
            .collect();
        // Pages each range needs for `records_per_thread` records.
        let per_page = self.seg.geometry().records_per_page.max(1);
        let pages_each = self.opts.records_per_thread.max(1).div_ceil(per_page) as usize;
        let n = self.opts.threads.min(active.len() / pages_each).max(1);
        let mut starts: Vec<u32> = (1..n).map(|k| active[k * active.len() / n]).collect();
        starts.insert(0, 0);
        starts.push(pages);
        starts.windows(2).map(|w| w[0]..w[1]).collect()
    }

    /// Reads the records of container pages `pages` (an incremental walk
    /// puts the rows it finds changed in the records of `cache`, the kept
    /// records of those pages, as it goes). `first`: on the walk's first
    /// thread (which copies rows through the segment's own file
    /// description: [`Via`]). `room`: the live threads to make room for
    /// (the first part's lists take the others' after the walk). A walk
    /// that fails gives back what its rows put in place changed in the
    /// sums.
    fn pages(
        &self,
        first: bool,
        pages: Range<u32>,
        mut cache: CachePart<'_, Box<Kept>>,
        room: usize,
    ) -> Result<Part, Box<PartFailed>> {
        let Walker {
            seg,
            opts,
            mode,
            kinds,
            tgen,
        } = *self;
        let states = seg.page_states();
        let g = *seg.geometry();
        let mut st = ReadStats::default();
        let mut threads = Vec::new();
        let mut page_states = Vec::with_capacity(pages.len());
        let mut sums = ClassSums::new(kinds.len());
        let mut walked: Vec<Walked<Box<Kept>>> = Vec::new();
        let mut delta = Delta::default();
        let mut fresh = Delta::default();
        let mut changes = Changes::default();
        let mut copy = RowCopy::new();
        let mut via = if first { Via::Shared } else { Via::Own(None) };
        // (Room made at the first record copied.)
        let mut bulk = RowsCopy::default();
        let mut visit = Vec::new();
        // The rows of a record not kept, read into one buffer for the walk and
        // copied out at their exact size (not grown by doubling, record by
        // record).
        let mut read = Rows::default();
        if mode == RowMode::Changed {
            let room = room.max(cache.len()) + 16;
            walked.reserve(room);
            threads.reserve(room);
        }
        for page in pages {
            // Only ACTIVE pages are read: touching a reclaimed page's hole
            // would make the filesystem allocate it again.
            let state = PageState::of(states[page as usize].load(Acquire));
            page_states.push(state);
            if state != PageState::Active {
                continue;
            }
            // (An incremental walk copies the records it did not keep at
            // once instead: `copy_rows_via`.)
            if opts.release_pages && mode != RowMode::Changed {
                populate_unkept(seg, page, &cache);
            }
            for slot in 0..g.records_per_page {
                let idx = page * g.records_per_page + slot;
                read.clear();
                changes.clear();
                cache.seek(idx);
                if mode == RowMode::Changed && slot + 1 < g.records_per_page {
                    // (After the seek: the cursor is at this record, the
                    // next one kept is at most one further.)
                    fetch_ahead(seg, &cache, idx + 1);
                }
                let mut memory_seqs = Vec::new();
                let mut touched = [0; MAX_CLASSES_LIMIT as usize / 64];
                let mut id_seq = None;
                let mut same_touched = false;
                let sink = match mode {
                    RowMode::PerThread => Sink::Keep,
                    RowMode::Summed => Sink::Sum(&mut sums),
                    RowMode::Changed => Sink::Changed {
                        cache: &cache,
                        read: &mut read,
                        changes: &mut changes,
                        delta: &mut delta,
                        fresh: &mut fresh,
                        touched: &mut touched,
                        same_touched: &mut same_touched,
                        id_seq: &mut id_seq,
                        memory_seqs: &mut memory_seqs,
                        copy: &mut copy,
                        bulk: &mut bulk,
                        via: &mut via,
                        visit: &mut visit,
                    },
                };
                match read_thread(seg, idx, kinds, tgen, opts, sink, &mut st) {
                    Ok(Some(mut t)) => {
                        if mode == RowMode::Changed {
                            // The current rows change with every event and
                            // are read every walk: they are neither kept
                            // nor compared.
                            let current = t.take_current();
                            // The thread's copy is kept again only if it changed.
                            if !t.skipped_rows.is_empty() {
                                // A row not kept: the next walk visits every
                                // touched row.
                                touched = [0; MAX_CLASSES_LIMIT as usize / 64];
                                same_touched = false;
                            }
                            let kept = cache.kept(idx, t.version);
                            let is_kept = kept.is_some();
                            let same = kept.is_some_and(|k| {
                                let e = &k.extra;
                                // (`same_touched`: the kept bitmap, found
                                // equal by the walk, not compared again.)
                                let found = e.tgen == tgen
                                    && (same_touched || e.touched == touched)
                                    && e.memory_seqs == memory_seqs;
                                // The identity under the same lock value is
                                // the kept one; the rest of a summaries walk's
                                // copy is its memory rows, each reused (same
                                // sequences, same generation), and no row
                                // skipped (a skip zeroes `touched`).
                                let same_id = id_seq.is_some()
                                    && e.id_seq == id_seq
                                    && t.skipped_rows.is_empty();
                                debug_assert!(
                                    !(found && same_id) || e.thread == t,
                                    "same identity lock value, same thread"
                                );
                                // (Equal but read at another lock value, or
                                // kept from a busy read: kept again, with the
                                // value, so that the next walk need not compare.)
                                found && (same_id || (e.id_seq == id_seq && e.thread == t))
                            });
                            let extra = (!same).then(|| {
                                let mut thread = t.clone();
                                thread.memory.shrink_to_fit();
                                Box::new(Kept {
                                    thread,
                                    memory_seqs,
                                    tgen,
                                    id_seq,
                                    touched,
                                })
                            });
                            // A kept record takes its changes now (its lines
                            // are in this CPU's cache); one not kept is kept
                            // by the commit.
                            let fresh = if is_kept {
                                cache.apply(idx, t.version, &changes, extra);
                                None
                            } else {
                                extra.map(|extra| (extra, read.to_kept()))
                            };
                            walked.push(Walked {
                                record: t.record,
                                version: t.version,
                                fresh,
                            });
                            t.put_current(current);
                        }
                        threads.push(t);
                    }
                    Ok(None) => {}
                    // (Only a walk that sums as it goes fails here: an
                    // incremental one never does, so no record's changed
                    // rows are left accounted in `delta` but not put.)
                    Err(why) => {
                        debug_assert!(mode != RowMode::Changed, "an incremental walk never fails");
                        return Err(Box::new(PartFailed { why, st, delta }));
                    }
                }
            }
            if opts.release_pages {
                if mode == RowMode::Changed {
                    seg.release_page_bodies(page);
                } else {
                    seg.release_page(page);
                }
            }
        }
        Ok(Part {
            threads,
            page_states,
            sums,
            walked,
            delta,
            fresh,
            st,
        })
    }
}

/// Asks the CPU for the first lines an incremental walk reads of record
/// `idx`, the next one, while it reads the current one: the record's lock,
/// identity and `touched` bitmap, its current rows and its first row
/// sequences, and the kept
/// copy's bitmap, identity lock value and first row references (cold
/// lines: each read otherwise waits for its miss).
#[inline]
fn fetch_ahead(seg: &Segment, cache: &CachePart<'_, Box<Kept>>, idx: u32) {
    let rec = seg.record(idx);
    prefetch(&rec.header.lock);
    prefetch(&rec.header.touched);
    prefetch(&rec.row_seqs[..rec.row_seqs.len().min(32)]);
    // (The current rows' first lines: their sequence and event words.)
    prefetch(&rec.header.waits_current.seq);
    prefetch(&rec.header.stages_current.seq);
    prefetch(&rec.header.statements_current.ev.seq);
    if let Some(k) = cache.ahead(idx) {
        prefetch(&k.extra.touched);
        prefetch(&k.extra.id_seq);
        prefetch(k.refs_head());
    }
}

/// Maps in, a run of records at a time, the bodies of the records of
/// container page `page` that a walk giving its pages back reads through
/// the mapping: those in use and not kept by `cache` for their current
/// lifetime (a first snapshot reads them all; a later one, the records
/// of threads new since).
fn populate_unkept(seg: &Segment, page: u32, cache: &CachePart<'_, Box<Kept>>) {
    let rpp = seg.geometry().records_per_page;
    let mut run: Option<(u32, u32)> = None;
    for idx in page * rpp..(page + 1) * rpp {
        let (state, version) = lockword::decode(seg.record(idx).header.lock.load(Acquire));
        let read = state == RecordState::Allocated && cache.kept(idx, version).is_none();
        run = match (run, read) {
            (Some((first, n)), true) => Some((first, n + 1)),
            (None, true) => Some((idx, 1)),
            (Some((first, n)), false) => {
                seg.populate_bodies(first, n);
                None
            }
            (None, false) => None,
        };
    }
    if let Some((first, n)) = run {
        seg.populate_bodies(first, n);
    }
}

/// One walk of `seg`. An incremental walk (`mode` `Changed`) reads the
/// rows that changed since `cache` (an empty one if `None`) kept them, and
/// puts those of kept records in place as it goes: a walk that fails gives
/// back, with why, what they changed in the sums (for
/// [`RowCache::settle`]).
fn try_snapshot(
    seg: &Segment,
    opts: &ReadOptions,
    mode: RowMode,
    cache: Option<&mut RowCache<Box<Kept>>>,
    total: &mut ReadStats,
) -> Result<Walk, (Retry, Delta)> {
    let sum_while_walking = matches!(mode, RowMode::Summed);
    let mut st = ReadStats::default();
    let mut lost = [0u64; LOST_COUNTERS];
    for (d, s) in lost.iter_mut().zip(&seg.lost().counters) {
        *d = s.load(Relaxed);
    }
    let kinds = Kinds::new(seg);
    let tgen = seg.setup().memory_truncate_gen.load(Acquire);
    let gh = seg.global_header();
    let f0 = gh.fold_count.load(Acquire);
    let pages = seg.pages_added();
    let g = *seg.geometry();
    let walk = Walker {
        seg,
        opts,
        mode,
        kinds: &kinds,
        tgen,
    };
    let parts = walk.split(pages);
    st.parts += parts.len() as u64;
    // Each part's kept records, by record index (none but in an
    // incremental walk).
    let starts: Vec<u32> = parts
        .iter()
        .map(|r| r.start.saturating_mul(g.records_per_page))
        .collect();
    let mut none = RowCache::default();
    let cache = match mode {
        RowMode::Changed => cache.unwrap_or(&mut none),
        _ => &mut none,
    };
    let kept = cache.len();
    let mut results = std::thread::scope(|scope| {
        let walk = &walk;
        let mut cached = cache.split(&starts).into_iter();
        let own = cached.next().expect("one part");
        // The first part on this thread, each other on one of its own.
        let handles: Vec<_> = parts
            .iter()
            .skip(1)
            .zip(cached)
            .map(|(range, part)| {
                let range = range.clone();
                std::thread::Builder::new()
                    .name("pfs-walk".into())
                    .spawn_scoped(scope, move || walk.pages(false, range, part, 0))
                    .ok()
            })
            .collect();
        let mut results = vec![Some(walk.pages(true, parts[0].clone(), own, kept))];
        for h in handles {
            results.push(h.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))));
        }
        results
    });
    // (A part no thread could be started for: on this one, now; its kept
    // records, untouched, are borrowed again.)
    if results.iter().any(Option::is_none) {
        for (k, part) in cache.split(&starts).into_iter().enumerate() {
            if results[k].is_none() {
                results[k] = Some(walk.pages(true, parts[k].clone(), part, 0));
            }
        }
    }
    // The parts in page order.
    let mut first: Option<Part> = None;
    let mut retry = None;
    let mut put = Delta::default();
    for r in results.into_iter().flatten() {
        match r {
            Ok(p) => match &mut first {
                None => first = Some(p),
                Some(f) => f.absorb(p),
            },
            Err(f) => {
                st.add(&f.st);
                put.merge(f.delta);
                retry.get_or_insert(f.why);
            }
        }
    }
    if let Some(why) = retry {
        if let Some(f) = first {
            st.add(&f.st);
            put.merge(f.delta);
        }
        total.add(&st);
        return Err((why, put));
    }
    let Part {
        mut threads,
        page_states,
        mut sums,
        mut walked,
        delta,
        mut fresh,
        st: walk_st,
    } = first.expect("one part");
    st.add(&walk_st);
    // Global section, under its sequence lock. The retried closure only
    // copies words into buffers allocated once, keeping the window in which
    // an exiting thread's fold can invalidate the read as short as possible.
    let rows = seg.global_rows();
    let mut exited: Vec<(u32, Summary)> = Vec::with_capacity(rows.len());
    let mem_rows = seg.global_memory_rows();
    let mut exited_memory: Vec<(u32, MemoryStats)> = Vec::new();
    let mut log_words = [[0u64; 3]; FOLD_LOG_LEN];
    let mut copy_global = || {
        exited.clear();
        exited_memory.clear();
        for (i, r) in rows.iter().enumerate() {
            let kind = kinds.get(i);
            if kind == RowKind::Memory {
                let m = MemoryStats::load(&mem_rows[i], seg.major_version(), tgen);
                if !m.is_empty() {
                    exited_memory.push((i as u32, m));
                }
            } else if let RowKind::Events(k, tail) = kind
                && r.count.load(Relaxed) != 0
            {
                exited.push((i as u32, Summary::load(r, k, tail, seg.major_version())));
            }
        }
        for (d, e) in log_words.iter_mut().zip(&gh.fold_log) {
            *d = [
                e.ticket.load(Relaxed),
                e.record.load(Relaxed),
                e.version.load(Relaxed),
            ];
        }
        gh.fold_count.load(Relaxed)
    };
    let read = gh
        .seq
        .read(opts.attempts.saturating_mul(16), &mut copy_global);
    st.retries += u64::from(read.retries);
    total.add(&st);
    let f2 = match (read.value, opts.global_stuck_at) {
        (Some(f2), _) => f2,
        // The section's writer is gone (its process died) and left the
        // lock odd: nobody can finish that write, so the section is read
        // as it is, if the lock still holds the value the caller saw.
        (None, Some(stuck)) if stuck & 1 == 1 && gh.seq.sequence() == stuck => {
            let f2 = copy_global();
            fence(Acquire);
            if gh.seq.sequence() != stuck {
                return Err((Retry::GlobalBusy, delta));
            }
            // A fold logs its entry after merging every row, then
            // publishes `fold_count`: a logged but unpublished fold is
            // complete in the rows, and its record (never freed) must be
            // dropped as folded.
            let next = f2.wrapping_add(1);
            if log_words[(next % FOLD_LOG_LEN as u64) as usize][0] == next {
                next
            } else {
                f2
            }
        }
        (None, _) => return Err((Retry::GlobalBusy, delta)),
    };
    if f2.wrapping_sub(f0) >= FOLD_LOG_LEN as u64 {
        return Err((Retry::LogWrapped(f2.wrapping_sub(f0)), delta));
    }
    let log: HashSet<(u64, u64)> = log_words
        .iter()
        .filter(|[t, _, _]| *t != 0 && *t <= f2)
        .map(|[_, r, v]| (*r, *v))
        .collect();
    let before = threads.len();
    threads.retain(|t| !log.contains(&(u64::from(t.record), t.version)));
    // A folded record's fresh rows are not kept (a kept one's changes,
    // put in place, leave with it at the commit).
    walked.retain(|w| {
        let folded = log.contains(&(u64::from(w.record), w.version));
        if folded {
            w.forget(&mut fresh);
        }
        !folded
    });
    let folded = (before - threads.len()) as u64;
    total.folded_copies += folded;
    if sum_while_walking && folded > 0 {
        return Err((Retry::FoldedCopy, delta));
    }
    if matches!(mode, RowMode::PerThread) && !opts.per_thread_rows {
        for t in &mut threads {
            for (class, s) in std::mem::take(&mut t.rows) {
                sums.add(class, &s);
            }
        }
    }
    // (An incremental walk's live rows are the cache's sums, once the
    // caller committed the walk.)
    let live_rows = if opts.per_thread_rows || mode == RowMode::Changed {
        Vec::new()
    } else {
        sums.into_rows()
    };
    // Unreserved rings are holes: never touched (see `long_reserved`).
    let reserved = seg.header().long_reserved.load(Acquire);
    let long_tickets = EventKind::ALL.map(|k| {
        if reserved & (1 << k.index()) != 0 {
            seg.long_header(k).next.load(Acquire)
        } else {
            0
        }
    });
    let (long, long_statements) = if opts.events {
        read_long(seg, &long_tickets, opts, total)
    } else {
        Default::default()
    };
    let tasks = if opts.events || opts.current {
        read_tasks(seg, opts, total)
    } else {
        Vec::new()
    };
    // The class and string tables last: every class or string a row read
    // above names was published before that row was written, so it is
    // here (read first, one registered during the walk was missing).
    let classes = read_classes(seg, total);
    let strings = read_strings(seg, total);
    for t in &mut threads {
        t.actor = t.actor_ids.map(|(u, h, r)| {
            let get = |i: u32| strings.get(&i).cloned().unwrap_or_default();
            (get(u), get(h), get(r))
        });
    }
    Ok((
        SegmentSnapshot {
            consumers: consumers_in_effect(seg),
            timers: seg.setup().timers.load(Relaxed),
            actors: read_actors(seg),
            long,
            long_statements,
            long_tickets,
            service: seg.service().to_string(),
            pid: seg.pid(),
            start_time_unix_ns: seg.start_time_unix_ns(),
            timer: *seg.timer(),
            classes,
            strings,
            threads,
            tasks,
            live_rows,
            exited,
            exited_memory,
            memory_truncate_gen: tgen,
            threads_exited: f2,
            lost,
            pages,
            page_states,
            pages_reclaimed: seg.container_header().pages_reclaimed.load(Acquire),
            pages_revived: seg.container_header().pages_revived.load(Acquire),
            geometry: g,
            stats: ReadStats::default(),
        },
        walked,
        {
            let mut delta = delta;
            delta.merge(fresh);
            delta
        },
    ))
}

/// The rows of the task slots handed out so far (`used`), each read under
/// its sequence lock; slots with no row shown are left out.
fn read_tasks(seg: &Segment, opts: &ReadOptions, st: &mut ReadStats) -> Vec<TaskSnapshot> {
    let Some((header, slots)) = seg.tasks() else {
        return Vec::new();
    };
    let timer = seg.timer();
    let used = (header.used.load(Acquire) as usize).min(slots.len());
    let mut out = Vec::new();
    for (i, slot) in slots[..used].iter().enumerate() {
        let mut cur = |r: &EventRecord| {
            let c = r.seq.read(opts.attempts, || Event::load(r, timer));
            st.retries += u64::from(c.retries);
            if c.value.is_none() {
                st.skipped_events += 1;
            }
            c.value.flatten()
        };
        let waits_current = cur(&slot.waits_current);
        let stages_current = cur(&slot.stages_current);
        let sc = &slot.statements_current;
        let c = sc.ev.seq.read(opts.attempts, || {
            if opts.events {
                StatementEvent::load(sc, timer)
            } else {
                StatementEvent::load_event(sc, timer)
            }
        });
        st.retries += u64::from(c.retries);
        if c.value.is_none() {
            st.skipped_events += 1;
        }
        let statements_current = c.value.flatten();
        if waits_current.is_some() || stages_current.is_some() || statements_current.is_some() {
            out.push(TaskSnapshot {
                slot: i as u32,
                waits_current,
                stages_current,
                statements_current,
            });
        }
    }
    out
}

/// The name of a published class entry, if valid UTF-8.
pub fn class_name(e: &ClassEntry) -> Option<String> {
    load_string(&e.name, e.name_len.load(Relaxed))
}

/// The kind of a published class entry (`None`: not published, or an
/// invalid kind).
fn published_kind(e: &ClassEntry) -> Option<ClassKind> {
    if e.state.load(Acquire) != CLASS_READY {
        return None;
    }
    ClassKind::from_u32(e.kind.load(Relaxed))
}

fn read_classes(seg: &Segment, st: &mut ReadStats) -> Vec<ClassInfo> {
    let mut out = Vec::new();
    for (i, e) in seg.classes().iter().enumerate() {
        if e.state.load(Acquire) != CLASS_READY {
            continue;
        }
        let kind = published_kind(e);
        let name = load_string(&e.name, e.name_len.load(Relaxed));
        match (kind, name) {
            (Some(kind), Some(name)) => out.push(ClassInfo {
                index: i as u32,
                name,
                kind,
                flags: e.flags.load(Relaxed),
            }),
            _ => st.invalid += 1,
        }
    }
    out
}

fn read_strings(seg: &Segment, st: &mut ReadStats) -> HashMap<u32, String> {
    let mut out = HashMap::new();
    for (i, e) in seg.strings().iter().enumerate() {
        match e.state.load(Acquire) {
            0 => break, // strings are published in index order
            STRING_READY => match load_string(&e.bytes, e.len.load(Relaxed)) {
                Some(s) => {
                    out.insert(i as u32, s);
                }
                None => st.invalid += 1,
            },
            _ => st.invalid += 1,
        }
    }
    out
}

fn read_ring<R, T>(
    ring: &[R],
    count: u64,
    seq: impl Fn(&R) -> &crate::seqlock::SeqLock,
    load: impl Fn(&R) -> Option<T>,
    id: impl Fn(&T) -> (u64, u64),
    opts: &ReadOptions,
    st: &mut ReadStats,
) -> Vec<T> {
    let len = ring.len() as u64;
    let mut out = Vec::new();
    if len == 0 {
        return out;
    }
    for k in count.saturating_sub(len)..count {
        let r = &ring[(k % len) as usize];
        let ev = seq(r).read(opts.attempts, || load(r));
        st.retries += u64::from(ev.retries);
        match ev.value {
            Some(Some(e)) => out.push(e),
            Some(None) => {}
            None => st.skipped_events += 1,
        }
    }
    // Ordered by (THREAD_ID, EVENT_ID): each logical thread's events in
    // id order, as PFS shows them, even if a slot was overwritten by a
    // newer event after `count` was read (a task's events share the ring
    // of the thread that polled it).
    out.sort_by_key(|e| id(e));
    out.dedup_by_key(|e| id(e));
    out
}

fn read_thread(
    seg: &Segment,
    idx: u32,
    kinds: &Kinds<'_>,
    tgen: u64,
    opts: &ReadOptions,
    mut sink: Sink<'_, '_>,
    st: &mut ReadStats,
) -> Result<Option<ThreadSnapshot>, Retry> {
    let rec = seg.record(idx);
    let h = rec.header;
    let lw1 = h.lock.load(Acquire);
    let (state, version) = lockword::decode(lw1);
    match state {
        RecordState::Allocated => {}
        RecordState::Invalid => {
            st.invalid += 1;
            return Ok(None);
        }
        _ => return Ok(None),
    }
    let timer = seg.timer();
    let load_id = || {
        (
            h.thread_id.load(Relaxed),
            h.os_tid.load(Relaxed),
            // (The name's words, made a string only if it is not the kept one.)
            (
                h.name.each_ref().map(|w| w.load(Relaxed)),
                h.name_len.load(Relaxed),
            ),
            h.flags.load(Relaxed),
            [
                h.user.load(Relaxed),
                h.host.load(Relaxed),
                h.role.load(Relaxed),
            ],
        )
    };
    let read = h.seq.read_versioned(opts.attempts, load_id);
    st.retries += u64::from(read.retries);
    let (read_at, id) = read.value.unzip();
    if let Sink::Changed { id_seq, .. } = &mut sink {
        **id_seq = read_at;
    }
    let kept: Option<&KeptRecord<Box<Kept>>> = match &sink {
        Sink::Changed { cache, .. } => cache.kept(idx, version),
        _ => None,
    };
    // The name: the kept one if the identity was read at the lock value it
    // was kept at (unchanged since: no string made), else the words read.
    let kept_name = kept
        .filter(|k| read_at.is_some() && k.extra.id_seq == read_at)
        .map(|k| k.extra.thread.name.clone());
    let id = id.map(|(tid, os, (words, len), flags, actor)| {
        let name = kept_name.or_else(|| shared_str_of_words(&words, len));
        (tid, os, name, flags, actor)
    });
    // An identity the writer kept busy: an incremental reader uses the
    // one it kept for this lifetime.
    let id = id.or_else(|| {
        kept.map(|k| {
            let t = &k.extra.thread;
            let flags = (u32::from(t.instrumented) * THREAD_INSTRUMENTED)
                | (u32::from(t.history) * THREAD_HISTORY);
            let actor = t.actor_ids.map_or([NONE_U32; 3], |(u, h, r)| [u, h, r]);
            (t.thread_id, t.os_tid, Some(t.name.clone()), flags, actor)
        })
    });
    // A dead writer killed while naming its thread (or declaring its
    // actor) left the identity's sequence odd: read it as it is, as its
    // rows are (a name torn or not UTF-8 reads as empty), rather than
    // drop every row of the thread.
    let id = id.or_else(|| {
        (opts.dead_writers && h.seq.sequence() & 1 == 1).then(|| {
            st.torn_rows += 1;
            let (tid, os, (words, len), flags, actor) = load_id();
            let name = shared_str_of_words(&words, len);
            (tid, os, name, flags, actor)
        })
    });
    let Some((thread_id, os_tid, name, flags, actor)) = id else {
        return Ok(None);
    };
    let mut t = ThreadSnapshot {
        record: idx,
        version,
        thread_id,
        os_tid,
        name: name.unwrap_or_default(),
        instrumented: flags & THREAD_INSTRUMENTED != 0,
        history: flags & THREAD_HISTORY != 0,
        actor: None,
        waits_current: None,
        waits_history: Vec::new(),
        stages_current: None,
        stages_history: Vec::new(),
        statements_current: None,
        statements_history: Vec::new(),
        rows: Vec::new(),
        memory: Vec::new(),
        skipped_rows: Vec::new(),
        actor_ids: (actor[0] != NONE_U32).then_some((actor[0], actor[1], actor[2])),
    };
    // A row's THREAD_ID: its own (a task's events), else the record's.
    let own = |mut e: Event| {
        if e.thread_id == 0 {
            e.thread_id = thread_id;
        }
        e
    };
    let own_stmt = |mut s: StatementEvent| {
        s.ev = own(s.ev);
        s
    };
    if opts.events || opts.current {
        let mut cur = |r: &EventRecord| {
            let c = r.seq.read(opts.attempts, || Event::load(r, timer).map(own));
            st.retries += u64::from(c.retries);
            if c.value.is_none() {
                st.skipped_events += 1;
            }
            c.value.flatten()
        };
        t.waits_current = cur(&h.waits_current);
        t.stages_current = cur(&h.stages_current);
        let sc = &h.statements_current;
        let c = sc.ev.seq.read(opts.attempts, || {
            if opts.events {
                StatementEvent::load(sc, timer).map(own_stmt)
            } else {
                StatementEvent::load_event(sc, timer).map(own_stmt)
            }
        });
        st.retries += u64::from(c.retries);
        t.statements_current = c.value.flatten();
    }
    if opts.events {
        let counts = EventKind::ALL.map(|k| h.history_count[k.index()].load(Acquire));
        let ev = |r: &EventRecord| Event::load(r, timer).map(own);
        t.waits_history = read_ring(
            rec.history,
            counts[EventKind::Wait.index()],
            |r| &r.seq,
            ev,
            |e| (e.thread_id, e.event_id),
            opts,
            st,
        );
        t.stages_history = read_ring(
            rec.stages_history,
            counts[EventKind::Stage.index()],
            |r| &r.seq,
            ev,
            |e| (e.thread_id, e.event_id),
            opts,
            st,
        );
        t.statements_history = read_ring(
            rec.statements_history,
            counts[EventKind::Statement.index()],
            |r| &r.ev.seq,
            |r| StatementEvent::load(r, timer).map(own_stmt),
            |e| (e.ev.thread_id, e.ev.event_id),
            opts,
            st,
        );
    }
    let mem_rows = rec.memory_rows();
    let mut summed = false;
    let mut cursor = kept.map(|k| k.cursor());
    // Every row is loaded into this one buffer.
    let mut buf = Summary::default();
    let mut preads = 0;
    // An incremental walk of a kept record whose touched rows are all kept
    // visits only its memory rows and the kept rows whose sequence moved
    // (one tight pass over the kept rows); any other walk visits every
    // touched row.
    // (An incremental walk lends its buffer.)
    let mut visit: Vec<usize> = match &mut sink {
        Sink::Changed { visit, .. } => std::mem::take(*visit),
        _ => Vec::new(),
    };
    visit.clear();
    let mut fast = false;
    if let Sink::Changed {
        touched,
        same_touched,
        ..
    } = &mut sink
    {
        for (d, w) in touched.iter_mut().zip(&h.touched) {
            *d = w.load(Acquire);
        }
        if let Some(k) = kept.filter(|k| k.extra.touched == **touched) {
            fast = true;
            **same_touched = true;
            visit.extend(k.extra.thread.memory.iter().map(|(c, _)| *c as usize));
            let seq_of = |c: usize| rec.row_seqs.get(c).map_or(0, |s| s.sequence());
            st.rows_reused += k.changed(seq_of, &mut visit) as u64;
            visit.sort_unstable();
            // (A class in both lists, kept as a summary row and now a
            // memory class: registered while a walk ran. Visited once.)
            visit.dedup();
        }
    }
    // A record not kept, in a walk that gives its pages back: its rows up
    // to the last touched one are copied at once, and each is read from
    // the copy if no write overlapped it.
    // (The walk lends its buffer.)
    let mut rows_copy = match &mut sink {
        Sink::Changed { bulk, .. } => std::mem::take(*bulk),
        _ => RowsCopy::default(),
    };
    let mut copied_ok = false;
    if let Sink::Changed { touched, via, .. } = &mut sink
        && kept.is_none()
        && opts.release_pages
    {
        let n = rec.rows.len();
        let last = touched
            .iter()
            .enumerate()
            .rev()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| (i * 64 + 63 - w.leading_zeros() as usize).min(n.saturating_sub(1)));
        let touched_rows: usize = touched.iter().map(|w| w.count_ones() as usize).sum();
        // (Rows touched sparsely, a few among many: read through the
        // mapping, as a copy of every row up to the last would cost more.)
        if let Some(last) = last.filter(|l| touched_rows * BULK_DENSITY > *l) {
            if rows_copy.room() < n {
                rows_copy = RowsCopy::new(n);
            }
            copied_ok = seg.copy_rows_via(via.get(seg), idx, last + 1, &mut rows_copy);
        }
    }
    let bulk = copied_ok.then_some(&rows_copy);
    let mut general = touched_classes(h, rec.rows.len());
    let mut listed = visit.iter().copied();
    let classes: &mut dyn Iterator<Item = usize> = if fast { &mut listed } else { &mut general };
    for class in classes {
        let seq = &rec.row_seqs[class];
        let kind = kinds.get(class);
        if kind == RowKind::Memory {
            // Kept and unchanged (same sequence, same truncation
            // generation): the kept copy.
            let now = kept.map(|_| seq.sequence());
            let same = kept.filter(|k| k.extra.tgen == tgen).and_then(|k| {
                let i = k
                    .extra
                    .thread
                    .memory
                    .iter()
                    .position(|(c, _)| *c == class as u32)?;
                (Some(k.extra.memory_seqs[i]) == now).then(|| k.extra.thread.memory[i].1)
            });
            let r = match same {
                Some(m) => {
                    st.rows_reused += 1;
                    Some((now.unwrap_or(0), (class as u32, m)))
                }
                None => {
                    let row = &mem_rows[class];
                    let pread =
                        pread_slot(&mut sink, seg, (idx, class), kept.is_some(), &mut preads);
                    let r = read_row(seq, opts, pread, RowCopy::memory, row, |r| {
                        MemoryStats::load(r, seg.major_version(), tgen)
                    });
                    st.retries += u64::from(r.retries);
                    st.rows_read += u64::from(r.value.is_some());
                    st.torn_rows += u64::from(r.torn);
                    r.value.map(|(s, m)| (s, (class as u32, m)))
                }
            };
            match r {
                Some((s, m)) => {
                    t.memory.push(m);
                    if let Sink::Changed { memory_seqs, .. } = &mut sink {
                        memory_seqs.push(s);
                    }
                }
                None => {
                    st.skipped_rows += 1;
                    t.skipped_rows.push(class as u32);
                }
            }
            continue;
        }
        let keptseq = cursor.as_mut().and_then(|c| c.seq(class as u32));
        let found = cursor
            .as_ref()
            .filter(|_| keptseq.is_some())
            .map(|c| c.found());
        if keptseq.is_some() && keptseq == Some(seq.sequence()) {
            // Unchanged since kept: not even touched.
            st.rows_reused += 1;
            continue;
        }
        let (RowKind::Events(ev, tail), major) = (kind, seg.major_version()) else {
            continue; // (memory rows are read above)
        };
        let copied = bulk.and_then(|b| b.summary(class, seq));
        let row = &rec.rows[class];
        // (Not in a walk of the changed rows alone: the rows it visits are
        // scattered, mostly copied by `pread`, and their pages released.)
        if let Some(ahead) = rec
            .rows
            .get(class + PREFETCH_ROWS)
            .filter(|_| !fast && bulk.is_none())
        {
            // The head and the buckets up to 244 us (most events'
            // durations).
            prefetch(&ahead.count);
            prefetch(&ahead.buckets[..PREFETCH_BUCKETS]);
        }
        if let Some(old) = found.and_then(|at| kept?.bytes_at(at)) {
            // Its kept value, compared with the new one below: fetched
            // while the row is copied (a `pread` takes about 1 us).
            prefetch(old);
        }
        let r = match copied {
            Some((v, copy)) => RowRead {
                value: Some((v, buf.load_into(copy, ev, tail, major))),
                retries: 0,
                torn: false,
            },
            None => {
                let pread = pread_slot(&mut sink, seg, (idx, class), kept.is_some(), &mut preads);
                read_row(seq, opts, pread, RowCopy::summary, row, |r| {
                    buf.load_into(r, ev, tail, major)
                })
            }
        };
        st.retries += u64::from(r.retries);
        st.rows_read += u64::from(r.value.is_some());
        st.torn_rows += u64::from(r.torn);
        let s = &buf;
        match (r.value, &mut sink) {
            (Some(_), Sink::Sum(sums)) => {
                sums.add(class as u32, s);
                summed = true;
            }
            (Some(_), Sink::Keep) => t.rows.push((class as u32, *s)),
            (
                Some((v, span)),
                Sink::Changed {
                    read,
                    changes,
                    delta,
                    fresh,
                    ..
                },
            ) => {
                if kept.is_some() {
                    let old = found.and_then(|at| kept?.get_hinted(class as u32, Some(at)));
                    delta.row(class as u32, old.as_ref(), s);
                    changes.push(class as u32, v, s, found.unwrap_or(NOT_KEPT));
                } else {
                    fresh.fresh_row(class as u32, v, s, span, read);
                }
            }
            (None, _) => {
                st.skipped_rows += 1;
                // An incremental reader keeps its older copy (a lower
                // bound of the row, which only grows).
                if keptseq.is_none() {
                    t.skipped_rows.push(class as u32);
                }
            }
        }
    }
    if let Sink::Changed {
        visit: lent,
        bulk: lent_rows,
        ..
    } = &mut sink
    {
        **lent = visit;
        **lent_rows = rows_copy;
    }
    fence(Acquire);
    // Acquire: if this observes the FREE store of a lifetime that ended,
    // the global read that follows observes that lifetime's fold.
    let ended = h.lock.load(Acquire) != lw1;
    if let (
        true,
        Sink::Changed {
            cache,
            read,
            changes,
            delta,
            fresh,
            ..
        },
    ) = (ended, &mut sink)
    {
        // The rows of a lifetime that ended are not kept: take back what
        // they added to the sums (and forget them).
        cache.undo_rows(idx, version, changes.values(), delta);
        cache.undo_rows(idx, version, read.values(), fresh);
        changes.clear();
        read.clear();
    }
    if ended {
        st.ended_records += 1;
        // Rows already summed cannot be taken back: walk again.
        return if summed {
            Err(Retry::FoldedCopy)
        } else {
            Ok(None)
        };
    }
    Ok(Some(t))
}

/// Reads the `history_long` rings that have ever been used. Each accepted
/// slot's sequence value names its ticket; rows are returned by ticket.
fn read_long(
    seg: &Segment,
    tickets: &[u64; 3],
    opts: &ReadOptions,
    st: &mut ReadStats,
) -> ([Vec<Event>; 2], Vec<StatementEvent>) {
    let timer = seg.timer();
    let mut events: [Vec<Event>; 2] = Default::default();
    for (kind, out) in [EventKind::Wait, EventKind::Stage]
        .into_iter()
        .zip(events.iter_mut())
    {
        if tickets[kind.index()] == 0 {
            continue;
        }
        let mut rows: Vec<(u64, Event)> = Vec::new();
        for r in seg.long_events(kind) {
            let v = r
                .seq
                .read_versioned(opts.attempts, || Event::load(r, timer));
            st.retries += u64::from(v.retries);
            match v.value {
                Some((s, Some(e))) if s != 0 => rows.push((s, e)),
                Some(_) => {}
                None => st.skipped_events += 1,
            }
        }
        rows.sort_by_key(|(s, _)| *s);
        *out = rows.into_iter().map(|(_, e)| e).collect();
    }
    let mut stmts: Vec<(u64, StatementEvent)> = Vec::new();
    if tickets[EventKind::Statement.index()] != 0 {
        for r in seg.long_statements() {
            let v =
                r.ev.seq
                    .read_versioned(opts.attempts, || StatementEvent::load(r, timer));
            st.retries += u64::from(v.retries);
            match v.value {
                Some((s, Some(e))) if s != 0 => stmts.push((s, e)),
                Some(_) => {}
                None => st.skipped_events += 1,
            }
        }
        stmts.sort_by_key(|(s, _)| *s);
    }
    (events, stmts.into_iter().map(|(_, e)| e).collect())
}
