//! Columns and cells several tables share: the `service` and `pid` every
//! row starts with, summary columns, memory columns, and event rows.

use std::collections::HashMap;

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::reader::{
    ClassInfo, Event, MemoryStats, SegmentSnapshot, StatementEvent, Summary, ThreadSnapshot,
};

use super::cell::{Cell, Sink};
use super::view::View;
use crate::event_kind::EventKind;

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

pub(super) const SUMMARY_COLUMNS: [&str; 5] = [
    "count_star",
    "sum_timer_wait",
    "min_timer_wait",
    "avg_timer_wait",
    "max_timer_wait",
];
/// The statement summaries' own columns. MySQL 8.0.28 added
/// `SUM_CPU_TIME` after `SUM_NO_GOOD_INDEX_USED`, the last of its `SUM_*`
/// counters (not after `SUM_LOCK_TIME`); we have neither that nor the
/// columns between, so it follows `SUM_ROWS_EXAMINED`. `COUNT_CANCELLED`
/// is ours (not in MySQL): statements whose future was dropped before
/// they completed (not counted in `SUM_ERRORS`).
pub(super) const STATEMENT_SUMMARY_COLUMNS: [&str; 7] = [
    "sum_errors",
    "sum_warnings",
    "sum_rows_affected",
    "sum_rows_sent",
    "sum_rows_examined",
    "sum_cpu_time",
    "count_cancelled",
];

/// The summary columns of `kind` (statements have seven more).
pub(super) fn summary_columns(kind: EventKind) -> Vec<&'static str> {
    let mut v = SUMMARY_COLUMNS.to_vec();
    if kind == EventKind::Statement {
        v.extend(STATEMENT_SUMMARY_COLUMNS);
    }
    v
}

/// A summary row's cells for [`summary_columns`].
pub(super) fn summary_values(s: &Summary, kind: EventKind) -> Vec<Cell<'static>> {
    let mut v = vec![
        s.count.into(),
        Cell::Ps(s.sum_ps),
        s.min().unwrap_or(0).into(),
        s.avg_ps().into(),
        s.max_ps.into(),
    ];
    if kind == EventKind::Statement {
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
    v
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
    let mut v = vec![
        "service",
        "pid",
        "thread_id",
        "event_id",
        "end_event_id",
        "event_name",
        "source",
        "timer_start",
        "timer_end",
        "timer_wait",
    ];
    match kind {
        EventKind::Wait => v.extend([
            "spins",
            "object_name",
            "object_type",
            "object_instance_begin",
            "nesting_event_id",
            "nesting_event_type",
            "operation",
            "number_of_bytes",
        ]),
        EventKind::Stage => v.extend([
            "work_completed",
            "work_estimated",
            "nesting_event_id",
            "nesting_event_type",
        ]),
        EventKind::Statement => v.extend([
            "sql_text",
            "digest",
            "errors",
            "warnings",
            "rows_affected",
            "rows_sent",
            "rows_examined",
            "nesting_event_id",
            "nesting_event_type",
            "cpu_time",
            "cancelled",
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
pub(super) fn event_row<'a>(
    s: &'a SegmentSnapshot,
    classes: &HashMap<u32, &'a ClassInfo>,
    e: &Event,
    st: Option<&'a StatementEvent>,
    kind: EventKind,
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
        e.timer_end.map_or(Cell::Null, Cell::Ps),
        opt(e.timer_wait),
    ]);
    let nesting = [
        opt(e.nesting_event_id),
        opt(e.nesting_event_type.pfs_name()),
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

/// Which per-thread events a table shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ring {
    /// The thread's current event.
    Current,
    /// The thread's history ring.
    History,
}

/// A thread's events of `kind` in `ring`, each with its statement part.
fn thread_events<'a>(
    t: &'a ThreadSnapshot,
    kind: EventKind,
    ring: Ring,
) -> Box<dyn Iterator<Item = (&'a Event, Option<&'a StatementEvent>)> + 'a> {
    let plain = |v: &'a [Event]| -> Box<dyn Iterator<Item = _> + 'a> {
        Box::new(v.iter().map(|e| (e, None)))
    };
    let statements = |v: &'a [StatementEvent]| -> Box<dyn Iterator<Item = _> + 'a> {
        Box::new(v.iter().map(|e| (&e.ev, Some(e))))
    };
    match (kind, ring) {
        (EventKind::Wait, Ring::Current) => plain(t.waits_current.as_slice()),
        (EventKind::Wait, Ring::History) => plain(&t.waits_history),
        (EventKind::Stage, Ring::Current) => plain(t.stages_current.as_slice()),
        (EventKind::Stage, Ring::History) => plain(&t.stages_history),
        (EventKind::Statement, Ring::Current) => statements(t.statements_current.as_slice()),
        (EventKind::Statement, Ring::History) => statements(&t.statements_history),
    }
}

/// The `current` or `history` table of `kind`: every thread record's
/// events not hidden by a `TRUNCATE`, each under its own `THREAD_ID` (a
/// record's rows may hold the events of tasks it polled; a history ring is
/// ordered by `THREAD_ID`, `EVENT_ID`).
pub(super) fn emit_thread_events(
    view: &View<'_>,
    sink: &mut dyn Sink,
    kind: EventKind,
    ring: Ring,
) {
    sink.columns(&event_columns(kind));
    for (path, s) in &view.segments {
        let classes = class_map(&s.classes);
        for t in &s.threads {
            let visible = view.baselines.visible_events(path, t, kind);
            for (e, st) in thread_events(t, kind, ring).filter(|(e, _)| visible(e)) {
                sink.row(&event_row(s, &classes, e, st, kind));
            }
        }
    }
}
