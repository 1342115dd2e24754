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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{Ordering::*, fence};

use crate::error::SegmentError;
use crate::kinds::{ClassKind, Operation};
use crate::layout::*;
use crate::lockword::{self, RecordState};
use crate::segment::{Segment, TimerCalibration, load_string};
use crate::writer::touched_classes;

/// Tuning of a snapshot.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Attempts per sequence-locked item before it is skipped.
    pub attempts: u32,
    /// Copy `events_waits_current` and history rings.
    pub events: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            attempts: 64,
            events: true,
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
}

impl ReadStats {
    fn add(&mut self, o: &ReadStats) {
        self.retries += o.retries;
        self.skipped_rows += o.skipped_rows;
        self.skipped_events += o.skipped_events;
        self.ended_records += o.ended_records;
        self.folded_copies += o.folded_copies;
        self.invalid += o.invalid;
        self.restarts += o.restarts;
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

/// Summary statistics of one class (one thread, or aggregated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// `COUNT_STAR`.
    pub count: u64,
    /// Events with timers (those in sum/min/max/buckets).
    pub timed_count: u64,
    /// `SUM_TIMER_WAIT`, ps.
    pub sum_ps: u128,
    /// `MIN_TIMER_WAIT`, ps; `u64::MAX` when no timed event.
    pub min_ps: u64,
    /// `MAX_TIMER_WAIT`, ps.
    pub max_ps: u64,
    /// Sum of `NUMBER_OF_BYTES`.
    pub bytes: u64,
    /// Per-bucket (non-cumulative) counts; see [`bucket_index`].
    pub buckets: [u64; HISTOGRAM_BUCKETS],
}

impl Default for Summary {
    fn default() -> Self {
        Self {
            count: 0,
            timed_count: 0,
            sum_ps: 0,
            min_ps: u64::MAX,
            max_ps: 0,
            bytes: 0,
            buckets: [0; HISTOGRAM_BUCKETS],
        }
    }
}

impl Summary {
    /// Adds `o` into `self` (the aggregation rule of PFS summaries).
    pub fn merge(&mut self, o: &Summary) {
        self.count += o.count;
        self.timed_count += o.timed_count;
        self.sum_ps += o.sum_ps;
        self.min_ps = self.min_ps.min(o.min_ps);
        self.max_ps = self.max_ps.max(o.max_ps);
        self.bytes += o.bytes;
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            *a += b;
        }
    }

    /// `MIN_TIMER_WAIT` or `None` (PFS shows 0) when nothing was timed.
    pub fn min(&self) -> Option<u64> {
        (self.timed_count > 0).then_some(self.min_ps)
    }

    /// `AVG_TIMER_WAIT` in ps, over timed events.
    pub fn avg_ps(&self) -> u64 {
        if self.timed_count == 0 {
            0
        } else {
            (self.sum_ps / u128::from(self.timed_count)) as u64
        }
    }

    fn load(row: &SummaryRow) -> Self {
        let mut buckets = [0; HISTOGRAM_BUCKETS];
        for (d, s) in buckets.iter_mut().zip(&row.buckets) {
            *d = s.load(Relaxed);
        }
        Self {
            count: row.count.load(Relaxed),
            timed_count: row.timed_count.load(Relaxed),
            sum_ps: u128::from(row.sum_lo.load(Relaxed))
                | (u128::from(row.sum_hi.load(Relaxed)) << 64),
            min_ps: row.min.load(Relaxed),
            max_ps: row.max.load(Relaxed),
            bytes: row.bytes.load(Relaxed),
            buckets,
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
    /// `NESTING_EVENT_TYPE`.
    pub nesting_event_type: EventType,
    /// This event's type.
    pub event_type: EventType,
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
        Some(Self {
            event_id,
            end_event_id: ended.then(|| r.end_event_id.load(Relaxed)),
            class: r.class.load(Relaxed),
            operation: Operation::from_u32(r.operation.load(Relaxed)),
            timer_start: timed.then(|| timer.since_base_ps(r.timer_start.load(Relaxed))),
            timer_end: (timed && ended).then(|| timer.since_base_ps(r.timer_end.load(Relaxed))),
            timer_wait: (timed && ended).then(|| r.timer_wait.load(Relaxed)),
            object_instance: r.object_instance.load(Relaxed),
            bytes: (flags & EV_HAS_BYTES != 0).then(|| r.bytes.load(Relaxed)),
            spins: (flags & EV_HAS_SPINS != 0).then(|| r.spins.load(Relaxed)),
            source: idx(r.source.load(Relaxed)),
            object_name: idx(r.object_name.load(Relaxed)),
            nesting_event_id: (nesting != 0).then_some(nesting),
            nesting_event_type: EventType::from_u32(r.nesting_event_type.load(Relaxed)),
            event_type: EventType::from_u32(r.event_type.load(Relaxed)),
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
    /// Thread name.
    pub name: String,
    /// `events_waits_current`.
    pub waits_current: Option<Event>,
    /// `events_waits_history`, oldest first.
    pub waits_history: Vec<Event>,
    /// Summary rows by class index (touched rows only).
    pub rows: Vec<(u32, Summary)>,
    /// Classes whose row could not be read consistently.
    pub skipped_rows: Vec<u32>,
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
    /// Totals folded in by exited threads, by class index.
    pub exited: Vec<(u32, Summary)>,
    /// Threads that have exited (folds).
    pub threads_exited: u64,
    /// Lost counters by [`LostKind`].
    pub lost: [u64; LOST_COUNTERS],
    /// Container pages added.
    pub pages: u32,
    /// Reading effort.
    pub stats: ReadStats,
}

/// Takes a snapshot of `seg`.
pub fn snapshot(seg: &Segment, opts: &ReadOptions) -> Result<SegmentSnapshot, SegmentError> {
    let mut stats = ReadStats::default();
    let mut folds = 0;
    for _ in 0..4 {
        match try_snapshot(seg, opts, &mut stats) {
            Ok(mut s) => {
                s.stats = stats;
                return Ok(s);
            }
            Err(Retry::LogWrapped(n)) => {
                folds = folds.max(n);
                stats.restarts += 1;
            }
            Err(Retry::GlobalBusy) => stats.restarts += 1,
        }
    }
    Err(SegmentError::FoldStorm(folds))
}

/// Why one snapshot attempt must be retried.
enum Retry {
    /// The global section was being written on every attempt.
    GlobalBusy,
    /// More exits than the fold log holds happened during the walk.
    LogWrapped(u64),
}

fn try_snapshot(
    seg: &Segment,
    opts: &ReadOptions,
    total: &mut ReadStats,
) -> Result<SegmentSnapshot, Retry> {
    let mut st = ReadStats::default();
    let classes = read_classes(seg, &mut st);
    let strings = read_strings(seg, &mut st);
    let mut lost = [0u64; LOST_COUNTERS];
    for (d, s) in lost.iter_mut().zip(&seg.lost().counters) {
        *d = s.load(Relaxed);
    }
    let gh = seg.global_header();
    let f0 = gh.fold_count.load(Acquire);
    let pages = seg.pages_added();
    let states = seg.page_states();
    let g = *seg.geometry();
    let mut threads = Vec::new();
    for page in 0..pages {
        if states[page as usize].load(Acquire) != PAGE_ACTIVE {
            continue;
        }
        for slot in 0..g.records_per_page {
            let idx = page * g.records_per_page + slot;
            if let Some(t) = read_thread(seg, idx, opts, &mut st) {
                threads.push(t);
            }
        }
    }
    // Global section, under its sequence lock. The retried closure only
    // copies words into buffers allocated once, keeping the window in which
    // an exiting thread's fold can invalidate the read as short as possible.
    let rows = seg.global_rows();
    let mut exited: Vec<(u32, Summary)> = Vec::with_capacity(rows.len());
    let mut log_words = [[0u64; 3]; FOLD_LOG_LEN];
    let read = gh.seq.read(opts.attempts.saturating_mul(16), || {
        exited.clear();
        for (i, r) in rows.iter().enumerate() {
            if r.count.load(Relaxed) != 0 {
                exited.push((i as u32, Summary::load(r)));
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
    });
    st.retries += u64::from(read.retries);
    total.add(&st);
    let Some(f2) = read.value else {
        return Err(Retry::GlobalBusy);
    };
    if f2.wrapping_sub(f0) >= FOLD_LOG_LEN as u64 {
        return Err(Retry::LogWrapped(f2.wrapping_sub(f0)));
    }
    let log: HashSet<(u64, u64)> = log_words
        .iter()
        .filter(|[t, _, _]| *t != 0 && *t <= f2)
        .map(|[_, r, v]| (*r, *v))
        .collect();
    let before = threads.len();
    threads.retain(|t| !log.contains(&(u64::from(t.record), t.version)));
    total.folded_copies += (before - threads.len()) as u64;
    Ok(SegmentSnapshot {
        service: seg.service().to_string(),
        pid: seg.pid(),
        start_time_unix_ns: seg.start_time_unix_ns(),
        timer: *seg.timer(),
        classes,
        strings,
        threads,
        exited,
        threads_exited: f2,
        lost,
        pages,
        stats: ReadStats::default(),
    })
}

fn read_classes(seg: &Segment, st: &mut ReadStats) -> Vec<ClassInfo> {
    let mut out = Vec::new();
    for (i, e) in seg.classes().iter().enumerate() {
        if e.state.load(Acquire) != CLASS_READY {
            continue;
        }
        let kind = ClassKind::from_u32(e.kind.load(Relaxed));
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

fn read_thread(
    seg: &Segment,
    idx: u32,
    opts: &ReadOptions,
    st: &mut ReadStats,
) -> Option<ThreadSnapshot> {
    let rec = seg.record(idx);
    let h = rec.header;
    let lw1 = h.lock.load(Acquire);
    let (state, version) = lockword::decode(lw1);
    match state {
        RecordState::Allocated => {}
        RecordState::Invalid => {
            st.invalid += 1;
            return None;
        }
        _ => return None,
    }
    let timer = seg.timer();
    let id = h.seq.read(opts.attempts, || {
        (
            h.thread_id.load(Relaxed),
            h.os_tid.load(Relaxed),
            load_string(&h.name, h.name_len.load(Relaxed)),
        )
    });
    st.retries += u64::from(id.retries);
    let (thread_id, os_tid, name) = id.value?;
    let mut t = ThreadSnapshot {
        record: idx,
        version,
        thread_id,
        os_tid,
        name: name.unwrap_or_default(),
        waits_current: None,
        waits_history: Vec::new(),
        rows: Vec::new(),
        skipped_rows: Vec::new(),
    };
    if opts.events {
        let cur = h
            .waits_current
            .seq
            .read(opts.attempts, || Event::load(&h.waits_current, timer));
        st.retries += u64::from(cur.retries);
        match cur.value {
            Some(e) => t.waits_current = e,
            None => st.skipped_events += 1,
        }
        let count = h.waits_history_count.load(Acquire);
        let len = rec.history.len() as u64;
        let first = count.saturating_sub(len);
        for k in first..count {
            let r = &rec.history[(k % len) as usize];
            let ev = r.seq.read(opts.attempts, || Event::load(r, timer));
            st.retries += u64::from(ev.retries);
            match ev.value {
                Some(Some(e)) => t.waits_history.push(e),
                Some(None) => {}
                None => st.skipped_events += 1,
            }
        }
        // A slot overwritten after `count` was read holds a newer event:
        // keep the ring ordered by event id, as PFS shows it.
        t.waits_history.sort_by_key(|e| e.event_id);
        t.waits_history.dedup_by_key(|e| e.event_id);
    }
    for class in touched_classes(h, rec.rows.len()) {
        let row = &rec.rows[class];
        let r = row.seq.read(opts.attempts, || Summary::load(row));
        st.retries += u64::from(r.retries);
        match r.value {
            Some(s) => t.rows.push((class as u32, s)),
            None => {
                st.skipped_rows += 1;
                t.skipped_rows.push(class as u32);
            }
        }
    }
    fence(Acquire);
    // Acquire: if this observes the FREE store of a lifetime that ended,
    // the global read that follows observes that lifetime's fold.
    if h.lock.load(Acquire) != lw1 {
        st.ended_records += 1;
        return None;
    }
    Some(t)
}
