//! Columns and cells several tables share: the `service` and `pid` every
//! row starts with, summary columns, histogram columns, memory columns,
//! and event rows; and
//! the [`ColumnKind`] of a column, declared with its definition here.

use std::collections::{HashMap, HashSet};

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::reader::{
    ClassInfo, Event, IoFigures, MemoryStats, SegmentSnapshot, StatementEvent, Summary,
    TaskSnapshot, ThreadSnapshot,
};
use pfs_shm_layout::{EventKind, IoMode};

use super::cell::{Cell, Sink};
use super::view::View;
use crate::aggregate::latest_per_thread;
use crate::truncate::EventsTable;

/// `NULL` for `None`.
pub(super) fn opt<'a, T: Into<Cell<'a>>>(v: Option<T>) -> Cell<'a> {
    v.into()
}

/// `YES` / `NO`.
pub(super) fn yes_no(b: bool) -> Cell<'static> {
    Cell::Str(if b { "YES" } else { "NO" })
}

/// The `service` and `pid` cells every row starts with.
pub(super) fn head(s: &SegmentSnapshot) -> Vec<Cell<'_>> {
    vec![s.service.as_str().into(), s.pid.into()]
}

/// `head`'s columns, then `rest`.
pub(super) fn with_head(rest: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["service", "pid"];
    v.extend_from_slice(rest);
    v
}

pub(super) const MEMORY_COLUMNS: [&str; 11] = [
    "event_name",
    "count_alloc",
    "count_free",
    "sum_number_of_bytes_alloc",
    "sum_number_of_bytes_free",
    "low_count_used",
    "current_count_used",
    "high_count_used",
    "low_number_of_bytes_used",
    "current_number_of_bytes_used",
    "high_number_of_bytes_used",
];

pub(super) fn memory_values<'a>(name: &'a str, m: &MemoryStats) -> Vec<Cell<'a>> {
    vec![
        name.into(),
        m.count_alloc.into(),
        m.count_free.into(),
        m.bytes_alloc.into(),
        m.bytes_free.into(),
        m.low_count.into(),
        m.current_count.into(),
        m.high_count.into(),
        m.low_bytes.into(),
        m.current_bytes.into(),
        m.high_bytes.into(),
    ]
}

/// What a column's numbers are, beyond their JSON type. Every picosecond
/// column is declared with its kind in this file; any other column (of
/// any table) is a [`ColumnKind::Value`] ([`column_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// A number, text or `NULL` shown as it is.
    Value,
    /// A duration in picoseconds (`TIMER_WAIT`, `SUM_TIMER_WAIT`,
    /// `CPU_TIME`, ...): the `query` command shows it as MySQL's
    /// `FORMAT_PICO_TIME` does (`471.87 ms`).
    Duration,
    /// An instant in picoseconds on the process's timer (`TIMER_START`,
    /// `TIMER_END`): shown as it is, so that events can be ordered and
    /// subtracted (MySQL's `sys` views do not format these either).
    Instant,
}

/// A column's name and kind.
type Column = (&'static str, ColumnKind);

const fn value(name: &'static str) -> Column {
    (name, ColumnKind::Value)
}

const fn duration(name: &'static str) -> Column {
    (name, ColumnKind::Duration)
}

const fn instant(name: &'static str) -> Column {
    (name, ColumnKind::Instant)
}

fn names(columns: impl IntoIterator<Item = Column>) -> Vec<&'static str> {
    columns.into_iter().map(|(n, _)| n).collect()
}

/// The kind of the column called `name`. A PFS column name means one thing
/// in every table, so the name is enough; columns not declared here
/// (`threads`, `setup_*`, memory tables, ...) are values.
pub fn column_kind(name: &str) -> ColumnKind {
    declared()
        .find(|(n, _)| *n == name)
        .map_or(ColumnKind::Value, |(_, k)| k)
}

/// The names of the [`ColumnKind::Duration`] columns, each once.
pub fn duration_columns() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = declared()
        .filter(|(_, k)| *k == ColumnKind::Duration)
        .map(|(n, _)| n)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Every column declared with its kind (a name may repeat).
fn declared() -> impl Iterator<Item = Column> {
    SUMMARY_COLUMNS
        .into_iter()
        .chain(WAIT_SUMMARY_COLUMNS)
        .chain(IO_SUMMARY_COLUMNS)
        .chain(STATEMENT_SUMMARY_COLUMNS)
        .chain(QUANTILE_COLUMNS.map(|(c, _, _)| c))
        .chain(HISTOGRAM_COLUMNS)
        .chain(EventKind::ALL.into_iter().flat_map(typed_event_columns))
}

const SUMMARY_COLUMNS: [Column; 5] = [
    value("count_star"),
    duration("sum_timer_wait"),
    duration("min_timer_wait"),
    duration("avg_timer_wait"),
    duration("max_timer_wait"),
];
/// The statement summaries' own columns. MySQL 8.0.28 added
/// `SUM_CPU_TIME` after `SUM_NO_GOOD_INDEX_USED`, the last of its `SUM_*`
/// counters (not after `SUM_LOCK_TIME`); we have neither that nor the
/// columns between, so it follows `SUM_ROWS_EXAMINED`. `COUNT_CANCELLED`
/// is ours (not in MySQL): statements whose future was dropped before
/// they completed (not counted in `SUM_ERRORS`).
const STATEMENT_SUMMARY_COLUMNS: [Column; 7] = [
    value("sum_errors"),
    value("sum_warnings"),
    value("sum_rows_affected"),
    value("sum_rows_sent"),
    value("sum_rows_examined"),
    duration("sum_cpu_time"),
    value("count_cancelled"),
];

/// The wait summaries' own column (not in MySQL's waits summaries; its
/// `file_summary_*` tables split the same figure into `..._READ`,
/// `..._WRITE` and `..._MISC`): the sum of `NUMBER_OF_BYTES`, the data
/// file and socket waits moved (0 for waits that carry no byte count).
const WAIT_SUMMARY_COLUMNS: [Column; 1] = [value("sum_number_of_bytes")];

/// The I/O summaries' own columns (`file_summary_by_event_name`,
/// `socket_summary_by_event_name`), by [`IoMode`] in its order: the
/// count, the time, its average and, for reads and writes, the bytes.
/// MySQL's per-mode `MIN_TIMER_*` and `MAX_TIMER_*` are not kept.
const IO_SUMMARY_COLUMNS: [Column; 11] = [
    value("count_read"),
    duration("sum_timer_read"),
    duration("avg_timer_read"),
    value("sum_number_of_bytes_read"),
    value("count_write"),
    duration("sum_timer_write"),
    duration("avg_timer_write"),
    value("sum_number_of_bytes_write"),
    value("count_misc"),
    duration("sum_timer_misc"),
    duration("avg_timer_misc"),
];

/// The quantiles the global summaries end with, as MySQL's
/// `events_statements_summary_by_digest` does (there only; not the
/// by-thread summaries, the big tables at scale, where three more cells a
/// row cost a quarter more time and a third more size): each a high
/// estimate from the latency histogram ([`Summary::quantile_ps`]: the
/// bound of the bucket that holds it, within MIN and MAX), as
/// `(column, parts, of)`.
const QUANTILE_COLUMNS: [(Column, u64, u64); 3] = [
    (duration("quantile_95"), 95, 100),
    (duration("quantile_99"), 99, 100),
    (duration("quantile_999"), 999, 1000),
];

/// The summary columns of `kind` (waits have one more, statements seven),
/// then the quantiles if `quantiles`.
pub(super) fn summary_columns(kind: EventKind, quantiles: bool) -> Vec<&'static str> {
    let mut v = names(SUMMARY_COLUMNS);
    match kind {
        EventKind::Wait => v.extend(names(WAIT_SUMMARY_COLUMNS)),
        EventKind::Statement => v.extend(names(STATEMENT_SUMMARY_COLUMNS)),
        EventKind::Stage => {}
    }
    if quantiles {
        v.extend(names(QUANTILE_COLUMNS.map(|(c, _, _)| c)));
    }
    v
}

/// A summary row's cells for [`summary_columns`].
pub(super) fn summary_values(s: &Summary, kind: EventKind, quantiles: bool) -> Vec<Cell<'static>> {
    let mut v = common_summary_values(s);
    match kind {
        EventKind::Wait => v.push(s.bytes.into()),
        EventKind::Statement => {
            let f = &s.statement;
            v.extend([
                f.errors.into(),
                f.warnings.into(),
                f.rows_affected.into(),
                f.rows_sent.into(),
                f.rows_examined.into(),
                f.cpu_time_ps.into(),
                f.cancelled.into(),
            ]);
        }
        EventKind::Stage => {}
    }
    if quantiles {
        let q = s.quantiles_ps(QUANTILE_COLUMNS.map(|(_, parts, of)| (parts, of)));
        v.extend(q.map(|q| Cell::Ps(q.into())));
    }
    v
}

/// The cells of [`SUMMARY_COLUMNS`], every summary's.
fn common_summary_values(s: &Summary) -> Vec<Cell<'static>> {
    vec![
        s.count.into(),
        Cell::Ps(s.sum_ps),
        s.min().unwrap_or(0).into(),
        s.avg_ps().into(),
        s.max_ps.into(),
    ]
}

/// The columns of an I/O summary (`file_summary_by_event_name`,
/// `socket_summary_by_event_name`) after `event_name`: the summary's,
/// then its figures by mode.
pub(super) fn io_summary_columns() -> Vec<&'static str> {
    names(SUMMARY_COLUMNS.into_iter().chain(IO_SUMMARY_COLUMNS))
}

/// A file or socket class's cells for [`io_summary_columns`]. As in
/// MySQL's tables, `COUNT_STAR` and `SUM_TIMER_WAIT` are the modes' sums
/// (a wait a C caller gave a lock's or an idle operation on a file or
/// socket instrument is in the waits' summaries only; when there is none,
/// `SUM_TIMER_WAIT` is the instrument's, exact to the ps where the modes'
/// are kept in ns); MIN and MAX are the instrument's. Where the modes are not known for the row's window
/// ([`modes_known`]), `COUNT_STAR`, `SUM_TIMER_WAIT` and `AVG_TIMER_WAIT`
/// are the instrument's, as `events_waits_summary_global_by_event_name`
/// shows them, and every mode shows zero.
pub(super) fn io_summary_values(s: &Summary) -> Vec<Cell<'static>> {
    let (count, sum_ps, avg, io) = if modes_known(s) {
        let io = s.io;
        let count = io.count_all();
        // The modes' times are kept in whole ns: when every wait has a
        // mode, the instrument's own sum, to the ps (so that MIN <= AVG).
        let sum_ps: u128 = if count == s.count {
            s.sum_ps
        } else {
            IoMode::ALL.iter().map(|&m| io.sum_ps(m)).sum()
        };
        let avg = match count {
            0 => 0,
            n => u64::try_from(sum_ps / u128::from(n)).unwrap_or(u64::MAX),
        };
        (count, sum_ps, avg, io)
    } else {
        (s.count, s.sum_ps, s.avg_ps(), IoFigures::ZERO)
    };
    let mut v = vec![
        count.into(),
        Cell::Ps(sum_ps),
        s.min().unwrap_or(0).into(),
        avg.into(),
        s.max_ps.into(),
    ];
    for mode in IoMode::ALL {
        v.extend([
            io.count(mode).into(),
            Cell::Ps(io.sum_ps(mode)),
            io.avg_ps(mode).into(),
        ]);
        v.extend(io.bytes(mode).map(Cell::from));
    }
    v
}

/// Whether the figures by mode of `s`, a file or socket instrument's row
/// (since its process started, or since a `TRUNCATE`), account for its
/// window: no more of its events have a mode than it has events, and some
/// do if it has any. Not so for a process of a client older than layout
/// 8.1, which records no mode, and for a row whose `TRUNCATE` baseline an
/// agent older than 8.1 rewrote (it keeps no modes, so the modes since the
/// process started exceed the events since the baseline).
fn modes_known(s: &Summary) -> bool {
    let with_mode = s.io.count_all();
    with_mode <= s.count && (with_mode > 0 || s.count == 0)
}

/// The columns of a histogram table's rows, after its own key columns,
/// as MySQL's `events_statements_histogram_*` tables have them (times in
/// ps; a bucket holds durations above `bucket_timer_low` up to
/// `bucket_timer_high` included, bucket 0 from 0; `bucket_timer_high` is
/// NULL for the last bucket, which has no bound; `bucket_quantile` is
/// `count_bucket_and_lower` over the timed events).
const HISTOGRAM_COLUMNS: [Column; 6] = [
    value("bucket_number"),
    duration("bucket_timer_low"),
    duration("bucket_timer_high"),
    value("count_bucket"),
    value("count_bucket_and_lower"),
    value("bucket_quantile"),
];

/// [`HISTOGRAM_COLUMNS`]' names.
pub(super) fn histogram_columns() -> Vec<&'static str> {
    names(HISTOGRAM_COLUMNS)
}

/// The cells of [`histogram_columns`] for each bucket of `sum`'s
/// histogram, in order (every bucket, empty ones included, as in MySQL),
/// with the bounds of its scale.
pub(super) fn histogram_rows(sum: &Summary) -> impl Iterator<Item = [Cell<'static>; 6]> + '_ {
    let (buckets, scale) = (&sum.buckets, sum.scale);
    let total: u64 = buckets.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let mut and_lower = 0u64;
    buckets.iter().enumerate().map(move |(i, &count)| {
        and_lower = and_lower.saturating_add(count);
        let low = i
            .checked_sub(1)
            .and_then(|j| scale.upper_ps(j))
            .unwrap_or(0);
        let quantile = if total == 0 {
            0.0
        } else {
            and_lower as f64 / total as f64
        };
        [
            (i as u64).into(),
            Cell::Ps(low.into()),
            scale.upper_ps(i).map_or(Cell::Null, |h| Cell::Ps(h.into())),
            count.into(),
            and_lower.into(),
            Cell::F64(quantile),
        ]
    })
}

/// The columns of the `current`, `history` and `history_long` tables of
/// `kind`.
///
/// Statements end with `cpu_time` and `cancelled`. MySQL 8.0.28 added
/// `CPU_TIME` after `STATEMENT_ID`, which follows the nesting columns (not
/// after `LOCK_TIME`); we have no `NESTING_EVENT_LEVEL` nor `STATEMENT_ID`,
/// so it follows `NESTING_EVENT_TYPE`. It is the time the statement's task
/// was being polled, in ps (0 for a statement of a thread), NULL while the
/// statement runs. `CANCELLED` (`YES`/`NO`) is ours, not MySQL's: the
/// statement's future was dropped before it completed.
pub(super) fn event_columns(kind: EventKind) -> Vec<&'static str> {
    names(typed_event_columns(kind))
}

/// [`event_columns`] with their kinds.
fn typed_event_columns(kind: EventKind) -> Vec<Column> {
    let mut v = vec![
        value("service"),
        value("pid"),
        value("thread_id"),
        value("event_id"),
        value("end_event_id"),
        value("event_name"),
        value("source"),
        instant("timer_start"),
        instant("timer_end"),
        duration("timer_wait"),
    ];
    match kind {
        EventKind::Wait => v.extend([
            value("spins"),
            value("object_name"),
            value("object_type"),
            value("object_instance_begin"),
            value("nesting_event_id"),
            value("nesting_event_type"),
            value("operation"),
            value("number_of_bytes"),
        ]),
        EventKind::Stage => v.extend([
            value("work_completed"),
            value("work_estimated"),
            value("nesting_event_id"),
            value("nesting_event_type"),
        ]),
        EventKind::Statement => v.extend([
            value("sql_text"),
            value("digest"),
            value("errors"),
            value("warnings"),
            value("rows_affected"),
            value("rows_sent"),
            value("rows_examined"),
            value("nesting_event_id"),
            value("nesting_event_type"),
            duration("cpu_time"),
            value("cancelled"),
        ]),
    }
    v
}

/// Classes by index.
pub(super) fn class_map(classes: &[ClassInfo]) -> HashMap<u32, &ClassInfo> {
    classes.iter().map(|c| (c.index, c)).collect()
}

/// One event's row for [`event_columns`]; `st` is the statement part of a
/// statement event. `THREAD_ID` is the event's own: a task's events sit in
/// the records of the threads that polled it, under the task's id.
/// `now`: the segment's timer now, for an event still running in a live
/// process, whose `TIMER_END` is then the current timer value and
/// `TIMER_WAIT` the time elapsed so far, as in PFS (`END_EVENT_ID` stays
/// NULL).
pub(super) fn event_row<'a>(
    s: &'a SegmentSnapshot,
    classes: &HashMap<u32, &'a ClassInfo>,
    e: &Event,
    st: Option<&'a StatementEvent>,
    kind: EventKind,
    now: Option<u128>,
) -> Vec<Cell<'a>> {
    let class = classes.get(&e.class).copied();
    let string = |i: Option<u32>| opt(i.and_then(|i| s.strings.get(&i).map(String::as_str)));
    let mut row = head(s);
    row.extend([
        e.thread_id.into(),
        e.event_id.into(),
        opt(e.end_event_id),
        opt(class.map(|c| c.name.as_str())),
        string(e.source),
        e.timer_start.map_or(Cell::Null, Cell::Ps),
    ]);
    match (e.timer_start, e.end_event_id, now) {
        // Running, timed, in a live process: the time so far.
        (Some(start), None, Some(now)) => {
            let end = now.max(start);
            let so_far = u64::try_from(end - start).unwrap_or(u64::MAX);
            row.extend([Cell::Ps(end), so_far.into()]);
        }
        _ => row.extend([e.timer_end.map_or(Cell::Null, Cell::Ps), opt(e.timer_wait)]),
    }
    let nesting = [
        opt(e.nesting_event_id),
        opt(e.nesting_event_type.map(EventKind::pfs_name)),
    ];
    match kind {
        EventKind::Wait => {
            let object_type = class.and_then(|c| match c.kind {
                ClassKind::File => Some("FILE"),
                ClassKind::Socket => Some("SOCKET"),
                _ => None,
            });
            row.extend([
                opt(e.spins),
                string(e.object_name),
                opt(object_type),
                e.object_instance.into(),
            ]);
            row.extend(nesting);
            row.extend([opt(e.operation.map(|o| o.name())), opt(e.bytes)]);
        }
        EventKind::Stage => {
            row.extend([opt(e.progress.map(|p| p.0)), opt(e.progress.map(|p| p.1))]);
            row.extend(nesting);
        }
        EventKind::Statement => {
            let (text, f) = match st {
                Some(st) => (
                    Some(st.text.as_str()).filter(|t| !t.is_empty()),
                    Some(st.figures),
                ),
                None => (None, None),
            };
            row.extend([
                opt(text),
                opt(f
                    .filter(|f| f.digest != 0)
                    .map(|f| format!("{:016x}", f.digest))),
                opt(f.map(|f| f.errors)),
                opt(f.map(|f| f.warnings)),
                opt(f.map(|f| f.rows_affected)),
                opt(f.map(|f| f.rows_sent)),
                opt(f.map(|f| f.rows_examined)),
            ]);
            row.extend(nesting);
            row.extend([
                opt(e.end_event_id.and(f).map(|f| f.cpu_time_ps)),
                opt(f.map(|f| yes_no(f.cancelled != 0))),
            ]);
        }
    }
    row
}

/// A thread's events of `kind` in `ring`, each with its statement part.
fn thread_events<'a>(
    t: &'a ThreadSnapshot,
    kind: EventKind,
    ring: EventsTable,
) -> Box<dyn Iterator<Item = (&'a Event, Option<&'a StatementEvent>)> + 'a> {
    let plain = |v: &'a [Event]| -> Box<dyn Iterator<Item = _> + 'a> {
        Box::new(v.iter().map(|e| (e, None)))
    };
    let statements = |v: &'a [StatementEvent]| -> Box<dyn Iterator<Item = _> + 'a> {
        Box::new(v.iter().map(|e| (&e.ev, Some(e))))
    };
    match (kind, ring) {
        (EventKind::Wait, EventsTable::Current) => plain(t.waits_current.as_slice()),
        (EventKind::Wait, EventsTable::History) => plain(&t.waits_history),
        (EventKind::Stage, EventsTable::Current) => plain(t.stages_current.as_slice()),
        (EventKind::Stage, EventsTable::History) => plain(&t.stages_history),
        (EventKind::Statement, EventsTable::Current) => statements(t.statements_current.as_slice()),
        (EventKind::Statement, EventsTable::History) => statements(&t.statements_history),
    }
}

/// The current event of `kind` a task slot shows, if any.
fn task_event(t: &TaskSnapshot, kind: EventKind) -> Option<(&Event, Option<&StatementEvent>)> {
    match kind {
        EventKind::Wait => t.waits_current.as_ref().map(|e| (e, None)),
        EventKind::Stage => t.stages_current.as_ref().map(|e| (e, None)),
        EventKind::Statement => t.statements_current.as_ref().map(|e| (&e.ev, Some(e))),
    }
}

/// The `current` or `history` table of `kind`: every thread record's
/// events not hidden by a `TRUNCATE`, each under its own `THREAD_ID` (a
/// record's rows may hold the events of tasks it polled; a history ring is
/// ordered by `THREAD_ID`, `EVENT_ID`). `current` also has the events of
/// tasks that await, from their task slots, and shows one row per
/// logical thread, as MySQL's does: of the rows that show a thread's
/// events (a task's may be in the rows of several workers that polled it,
/// and in its slot), the latest (highest `EVENT_ID`; a worker's row rather
/// than the slot's for the same event, since it may show it ended), and no
/// slot row of an event some thread's rows show ended.
pub(super) fn emit_thread_events(
    view: &View<'_>,
    sink: &mut dyn Sink,
    kind: EventKind,
    ring: EventsTable,
) {
    sink.columns(&event_columns(kind));
    for (path, s) in &view.segments {
        let classes = class_map(&s.classes);
        let baselines = view.baselines_for(path, s);
        let threads = view.threads_of(path, s);
        if ring == EventsTable::History {
            for t in threads {
                let visible = baselines.visible_events(path, t, kind, ring);
                for (e, st) in thread_events(t, kind, ring).filter(|(e, _)| visible(e)) {
                    sink.row(&event_row(s, &classes, e, st, kind, None));
                }
            }
            continue;
        }
        // Events still running show the time so far (a live process only:
        // a dead one's never end).
        let now = view.running_now(path);
        // (event, statement figures, from a thread's row)
        let mut rows = Vec::new();
        for t in threads {
            let visible = baselines.visible_events(path, t, kind, ring);
            rows.extend(
                thread_events(t, kind, ring)
                    .filter(|(e, _)| visible(e))
                    .map(|(e, st)| (e, st, true)),
            );
        }
        let tasks = view.tasks_of(path, s);
        if !tasks.is_empty() {
            let ended = ended_events(threads, kind);
            let visible = baselines.visible_task_events(path, kind);
            rows.extend(
                tasks
                    .iter()
                    .filter_map(|t| task_event(t, kind))
                    .filter(|(e, _)| visible(e) && !ended.contains(&(e.thread_id, e.event_id)))
                    .map(|(e, st)| (e, st, false)),
            );
        }
        for (e, st, _) in latest_per_thread(rows) {
            sink.row(&event_row(s, &classes, e, st, kind, now));
        }
    }
}

/// The events of `kind` that the threads' rows (history rings and current
/// rows) show ended, as (`THREAD_ID`, `EVENT_ID`).
fn ended_events(threads: &[ThreadSnapshot], kind: EventKind) -> HashSet<(u64, u64)> {
    let mut ended = HashSet::new();
    for t in threads {
        for ring in [EventsTable::History, EventsTable::Current] {
            ended.extend(
                thread_events(t, kind, ring)
                    .filter(|(e, _)| e.end_event_id.is_some())
                    .map(|(e, _)| (e.thread_id, e.event_id)),
            );
        }
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The I/O columns are each mode's, in the order of the cells.
    #[test]
    fn the_io_columns_follow_the_modes() {
        let mut want = Vec::new();
        for m in IoMode::ALL {
            let n = m.name();
            want.extend([
                format!("count_{n}"),
                format!("sum_timer_{n}"),
                format!("avg_timer_{n}"),
            ]);
            if m != IoMode::Misc {
                want.push(format!("sum_number_of_bytes_{n}"));
            }
        }
        assert_eq!(names(IO_SUMMARY_COLUMNS), want);
        let cells = io_summary_values(&Summary::default());
        assert_eq!(cells.len(), io_summary_columns().len());
    }

    /// The I/O cells of a file instrument's row: `(COUNT_STAR,
    /// SUM_TIMER_WAIT, AVG_TIMER_WAIT, COUNT_READ, COUNT_MISC)`.
    fn io_cells(s: &Summary) -> (u64, u128, u64, u64, u64) {
        let cells = io_summary_values(s);
        let col = |name: &str| {
            let i = io_summary_columns()
                .iter()
                .position(|c| *c == name)
                .unwrap();
            match &cells[i] {
                Cell::Ps(v) => *v,
                Cell::U64(v) => u128::from(*v),
                _ => panic!("{name} is not a number"),
            }
        };
        let n = |name: &str| u64::try_from(col(name)).unwrap();
        (
            n("count_star"),
            col("sum_timer_wait"),
            n("avg_timer_wait"),
            n("count_read"),
            n("count_misc"),
        )
    }

    /// `COUNT_STAR` and `SUM_TIMER_WAIT` are the modes' sums where the
    /// modes account for the row, else the instrument's (with zeros by
    /// mode): a process of a client older than layout 8.1, and a row
    /// whose `TRUNCATE` baseline has no modes (an older agent wrote it),
    /// where the modes since the process started exceed the row's count.
    #[test]
    fn an_io_row_without_known_modes_shows_the_instruments_totals() {
        let mut s = Summary {
            count: 140,
            timed_count: 140,
            sum_ps: 140_000_000,
            min_ps: 1_000,
            max_ps: 5_000_000,
            ..Summary::default()
        };
        // Layout 8.0: no mode recorded.
        assert_eq!(io_cells(&s), (140, 140_000_000, 1_000_000, 0, 0));
        // 8.1: the modes' sums, as in MySQL (two C lock waits have none).
        s.io.count = [40, 40, 58];
        s.io.sum_ns = [10_000, 20_000, 108_000];
        assert_eq!(io_cells(&s), (138, 138_000_000, 1_000_000, 40, 58));
        // Every wait with a mode: the instrument's sum, to the ps.
        let mut all = s;
        all.io.count = [40, 40, 60];
        all.sum_ps = 140_000_123;
        assert_eq!(io_cells(&all), (140, 140_000_123, 1_000_000, 40, 60));
        // A baseline without modes: the modes since the start (more than
        // the 100 events since the baseline) are not the row's.
        let mut since = s;
        since.count = 100;
        since.timed_count = 100;
        since.sum_ps = 90_000_000;
        assert_eq!(io_cells(&since), (100, 90_000_000, 900_000, 0, 0));
        // No event since such a baseline: zeros, as in the waits' table.
        let none = Summary {
            io: s.io,
            ..Summary::default()
        };
        assert_eq!(io_cells(&none), (0, 0, 0, 0, 0));
        assert_eq!(io_cells(&Summary::default()), (0, 0, 0, 0, 0));
    }

    /// Every picosecond column of every table is declared with its kind:
    /// a new duration column that is not would be printed raw by `query`.
    #[test]
    fn every_picosecond_column_of_every_table_is_declared() {
        let dir = tempfile::tempdir().unwrap();
        let snap = crate::snapshot::Snapshotter::new(
            crate::segments::SegmentSet::new(dir.path(), std::time::Duration::MAX),
            std::time::Duration::ZERO,
        )
        .take();
        let mut durations = 0;
        for table in super::super::registry() {
            let t = super::super::build(&**table, &snap, &Default::default(), &Default::default());
            assert!(!t.columns.is_empty(), "{}", table.name());
            for c in &t.columns {
                let instant = ["timer_start", "timer_end"].contains(c);
                let aggregate = ["sum_", "min_", "avg_", "max_"]
                    .iter()
                    .any(|p| c.starts_with(&format!("{p}timer_")));
                let want = if aggregate
                    || c.ends_with("timer_wait")
                    || c.ends_with("cpu_time")
                    || c.starts_with("quantile_")
                    || c.starts_with("bucket_timer_")
                {
                    ColumnKind::Duration
                } else if instant {
                    ColumnKind::Instant
                } else {
                    ColumnKind::Value
                };
                assert_eq!(column_kind(c), want, "{}.{c}", table.name());
                durations += usize::from(want == ColumnKind::Duration);
            }
        }
        assert!(durations >= 38, "{durations} duration columns");
        assert_eq!(
            duration_columns(),
            [
                "avg_timer_misc",
                "avg_timer_read",
                "avg_timer_wait",
                "avg_timer_write",
                "bucket_timer_high",
                "bucket_timer_low",
                "cpu_time",
                "max_timer_wait",
                "min_timer_wait",
                "quantile_95",
                "quantile_99",
                "quantile_999",
                "sum_cpu_time",
                "sum_timer_misc",
                "sum_timer_read",
                "sum_timer_wait",
                "sum_timer_write",
                "timer_wait"
            ]
        );
    }
}
