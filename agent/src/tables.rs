//! PFS-style tables built from a snapshot: the same rows for the HTTP JSON
//! API and the `query` CLI. Column names are PFS's, in lower case; timers
//! are picoseconds; NULL is JSON `null`. Every row starts with `service`
//! and `pid`, which tell the processes apart.

use std::collections::HashMap;

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::container::PageState;
use pfs_shm_layout::layout::{TimerId, timer_of};
use pfs_shm_layout::reader::{
    ClassInfo, Event, MemoryStats, SegmentSnapshot, StatementEvent, Summary,
};
use pfs_shm_layout::setup::{TIMER_KINDS, consumers};
use serde::ser::{Serialize, Serializer};
use serde_json::{Map, Value, json};

use crate::aggregate::{segment_global, segment_global_memory};
use crate::snapshot::Snapshot;
use crate::timers;
use crate::truncate::Baselines;

/// The three event kinds, with their table-name word and class kind.
const KINDS: [(&str, ClassKind); 3] = [
    ("waits", ClassKind::OtherWait),
    ("stages", ClassKind::Stage),
    ("statements", ClassKind::Statement),
];

/// Tables served, in display order.
pub fn names() -> Vec<String> {
    let mut v: Vec<String> = [
        "setup_instruments",
        "setup_consumers",
        "setup_timers",
        "setup_actors",
        "performance_timers",
        "threads",
        "container_pages",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (k, _) in KINDS {
        for suffix in [
            "current",
            "history",
            "history_long",
            "summary_by_thread_by_event_name",
            "summary_global_by_event_name",
        ] {
            v.push(format!("events_{k}_{suffix}"));
        }
    }
    for t in MEMORY_TABLES {
        v.push(format!("memory_summary_{t}"));
    }
    v
}

/// The memory tables (after `memory_summary_`).
const MEMORY_TABLES: [&str; 5] = [
    "global_by_event_name",
    "by_thread_by_event_name",
    "by_account_by_event_name",
    "by_user_by_event_name",
    "by_host_by_event_name",
];

const MEMORY_COLUMNS: [&str; 11] = [
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

fn memory_values<'a>(name: &'a str, m: &MemoryStats) -> Vec<Cell<'a>> {
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

/// The memory tables. Global: every memory class, exited threads' memory
/// included, plus `memory/performance_schema/*`. By thread: live threads'
/// touched rows. By account/user/host: the sum of the live threads that
/// declared that actor (threads without an actor, and exited threads,
/// count in the global table only); LOW and HIGH are the sums of the
/// threads' (the manual's aggregation rule).
fn build_memory(
    which: &str,
    segs: &[(&std::path::Path, &SegmentSnapshot)],
    baselines: &Baselines,
    sink: &mut dyn Sink,
) -> bool {
    let group: for<'x> fn(&'x str, &'x str) -> Vec<Cell<'x>> = match which {
        "global_by_event_name" => {
            let mut cols = vec!["service", "pid"];
            cols.extend(MEMORY_COLUMNS);
            sink.columns(&cols);
            for (path, s) in segs {
                for (n, m) in segment_global_memory(s) {
                    let mut row = head(s);
                    row.extend(memory_values(
                        &n,
                        &baselines.memory_global_view(path, &n, &m),
                    ));
                    sink.row(&row);
                }
            }
            return true;
        }
        "by_thread_by_event_name" => {
            let mut cols = vec!["service", "pid", "thread_id"];
            cols.extend(MEMORY_COLUMNS);
            sink.columns(&cols);
            for (path, s) in segs {
                let classes = class_map(&s.classes);
                for t in &s.threads {
                    let mut by_name: Vec<(&str, MemoryStats)> = t
                        .memory
                        .iter()
                        .filter_map(|(c, m)| {
                            let ci = classes.get(c)?;
                            Some((
                                ci.name.as_str(),
                                baselines.memory_thread_view(path, t.record, t.version, *c, m),
                            ))
                        })
                        .collect();
                    by_name.sort_by_key(|(n, _)| *n);
                    for (n, m) in by_name {
                        let mut row = head(s);
                        row.push(t.thread_id.into());
                        row.extend(memory_values(n, &m));
                        sink.row(&row);
                    }
                }
            }
            return true;
        }
        "by_account_by_event_name" => |u, h| vec![u.into(), h.into()],
        "by_user_by_event_name" => |u, _| vec![u.into()],
        "by_host_by_event_name" => |_, h| vec![h.into()],
        _ => return false,
    };
    let mut cols = vec!["service", "pid"];
    cols.extend(match which {
        "by_account_by_event_name" => vec!["user", "host"],
        "by_user_by_event_name" => vec!["user"],
        _ => vec!["host"],
    });
    cols.extend(MEMORY_COLUMNS);
    sink.columns(&cols);
    for (path, s) in segs {
        let classes = class_map(&s.classes);
        let mut agg: std::collections::BTreeMap<(String, &str), (Vec<Cell>, MemoryStats)> =
            Default::default();
        for t in &s.threads {
            let Some((u, h, _)) = &t.actor else { continue };
            let key = group(u, h);
            for (c, m) in &t.memory {
                let Some(ci) = classes.get(c) else { continue };
                let v = baselines.memory_thread_view(path, t.record, t.version, *c, m);
                agg.entry((
                    serde_json::to_string(&key).unwrap_or_default(),
                    ci.name.as_str(),
                ))
                .or_insert_with(|| (key.clone(), MemoryStats::default()))
                .1
                .merge(&v);
            }
        }
        for ((_, n), (key, m)) in agg {
            let mut row = head(s);
            row.extend(key);
            row.extend(memory_values(n, &m));
            sink.row(&row);
        }
    }
    true
}

/// One cell of a table row, borrowed from the snapshot where it can be.
/// Rows are handed to a [`Sink`] as cells, one row at a time, so that a
/// table is never held whole unless a caller collects it ([`build`]). A
/// cell serialises exactly as the `serde_json::Value` it stands for
/// ([`Cell::to_value`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell<'a> {
    /// SQL NULL: JSON `null`.
    Null,
    /// An unsigned number.
    U64(u64),
    /// A signed number.
    I64(i64),
    /// Picoseconds: a number when it fits in 64 bits, else its decimal
    /// text as a string.
    Ps(u128),
    /// Text borrowed from the snapshot.
    Str(&'a str),
    /// Text made for this cell.
    Owned(String),
}

impl Cell<'_> {
    /// The JSON value of this cell.
    pub fn to_value(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::U64(v) => (*v).into(),
            Cell::I64(v) => (*v).into(),
            Cell::Ps(v) => ps(*v),
            Cell::Str(s) => (*s).into(),
            Cell::Owned(s) => s.as_str().into(),
        }
    }
}

impl Serialize for Cell<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Null => ser.serialize_unit(),
            Cell::U64(v) => ser.serialize_u64(*v),
            Cell::I64(v) => ser.serialize_i64(*v),
            Cell::Ps(v) => match u64::try_from(*v) {
                Ok(v) => ser.serialize_u64(v),
                Err(_) => ser.serialize_str(&v.to_string()),
            },
            Cell::Str(s) => ser.serialize_str(s),
            Cell::Owned(s) => ser.serialize_str(s),
        }
    }
}

macro_rules! cell_from {
    ($variant:ident: $($t:ty),*) => {$(
        impl From<$t> for Cell<'_> {
            fn from(v: $t) -> Self {
                Cell::$variant(v.into())
            }
        }
    )*};
}
cell_from!(U64: u64, u32, u8);
cell_from!(I64: i64);
cell_from!(Owned: String);

impl From<usize> for Cell<'_> {
    fn from(v: usize) -> Self {
        Cell::U64(v as u64)
    }
}

impl<'a> From<&'a str> for Cell<'a> {
    fn from(v: &'a str) -> Self {
        Cell::Str(v)
    }
}

impl<'a, T: Into<Cell<'a>>> From<Option<T>> for Cell<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Cell::Null, Into::into)
    }
}

/// Receives a table as it is built: [`Sink::columns`] once, before any
/// row, then [`Sink::row`] for each row (as long as the columns).
pub trait Sink {
    /// The table's column names.
    fn columns(&mut self, columns: &[&'static str]);
    /// One row, cells in column order.
    fn row(&mut self, row: &[Cell<'_>]);
}

/// Collects a [`Table`].
struct Collect(Table);

impl Sink for Collect {
    fn columns(&mut self, columns: &[&'static str]) {
        self.0.columns = columns.to_vec();
    }
    fn row(&mut self, row: &[Cell<'_>]) {
        self.0.rows.push(row.iter().map(Cell::to_value).collect());
    }
}

/// Writes a table as the JSON of [`Table::to_json`] (compact), row by row:
/// each row is made in `row` (its keys written once, in `keys`) and handed
/// to `out` in one write.
struct JsonSink<'w> {
    out: &'w mut dyn std::io::Write,
    name: &'w str,
    /// Per column: `"name":` as serde_json writes a key, with the `{` or
    /// `,` before it.
    keys: Vec<Vec<u8>>,
    row: Vec<u8>,
    rows: usize,
    error: Option<std::io::Error>,
}

impl Sink for JsonSink<'_> {
    fn columns(&mut self, columns: &[&'static str]) {
        self.keys = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut k = vec![if i == 0 { b'{' } else { b',' }];
                serde_json::to_writer(&mut k, c).expect("a str serialises");
                k.push(b':');
                k
            })
            .collect();
        if self.error.is_some() {
            return;
        }
        let out = &mut *self.out;
        let r = (|| {
            out.write_all(b"{\"table\":")?;
            serde_json::to_writer(&mut *out, self.name)?;
            out.write_all(b",\"columns\":")?;
            serde_json::to_writer(&mut *out, columns)?;
            out.write_all(b",\"rows\":[")
        })();
        self.error = r.err();
    }
    fn row(&mut self, cells: &[Cell<'_>]) {
        self.rows += 1;
        if self.error.is_some() {
            return;
        }
        let row = &mut self.row;
        row.clear();
        if self.rows > 1 {
            row.push(b',');
        }
        for (k, c) in self.keys.iter().zip(cells) {
            row.extend_from_slice(k);
            serde_json::to_writer(&mut *row, c).expect("a cell serialises");
        }
        if self.keys.is_empty() || cells.is_empty() {
            row.push(b'{');
        }
        row.push(b'}');
        self.error = self.out.write_all(row).err();
    }
}

/// A table: column names and rows of JSON values in column order.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Table name.
    pub name: String,
    /// Column names.
    pub columns: Vec<&'static str>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Value>>,
}

/// Restricts a table to some processes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this service.
    pub service: Option<String>,
    /// Only this pid.
    pub pid: Option<u32>,
}

impl Filter {
    /// True if `s` passes the filter.
    pub fn accepts(&self, s: &SegmentSnapshot) -> bool {
        self.service.as_ref().is_none_or(|x| *x == s.service) && self.pid.is_none_or(|p| p == s.pid)
    }
}

fn ps(v: u128) -> Value {
    u64::try_from(v)
        .map(Value::from)
        .unwrap_or_else(|_| Value::from(v.to_string()))
}

fn opt<'a, T: Into<Cell<'a>>>(v: Option<T>) -> Cell<'a> {
    v.into()
}

fn yes_no(b: bool) -> Cell<'static> {
    Cell::Str(if b { "YES" } else { "NO" })
}

fn kind_matches(k: usize, c: ClassKind) -> bool {
    match k {
        0 => c.is_wait(),
        _ => c == KINDS[k].1,
    }
}

fn head(s: &SegmentSnapshot) -> Vec<Cell<'_>> {
    vec![s.service.as_str().into(), s.pid.into()]
}

/// Builds table `name` from `snap`; `None` if there is no such table.
/// `baselines` hold what `TRUNCATE` removed from view. Holds every row: a
/// large table is better written with [`write_json`] or [`emit`].
pub fn build(name: &str, snap: &Snapshot, filter: &Filter, baselines: &Baselines) -> Option<Table> {
    let mut t = Collect(Table {
        name: name.to_string(),
        columns: Vec::new(),
        rows: Vec::new(),
    });
    emit(name, snap, filter, baselines, &mut t).then_some(t.0)
}

/// True if `name` is a table ([`names`]): [`emit`] and [`write_json`]
/// answer it.
pub fn exists(name: &str) -> bool {
    names().iter().any(|n| n == name)
}

/// Writes table `name` to `out` as the JSON of [`Table::to_json`]
/// (compact: the bytes of `to_json().to_string()`), one row at a time, so
/// that no more than a row is held beside the snapshot. `Ok(false)` if
/// there is no such table (nothing written).
pub fn write_json(
    name: &str,
    snap: &Snapshot,
    filter: &Filter,
    baselines: &Baselines,
    out: &mut dyn std::io::Write,
) -> std::io::Result<bool> {
    let mut sink = JsonSink {
        out,
        name,
        keys: Vec::new(),
        row: Vec::with_capacity(1024),
        rows: 0,
        error: None,
    };
    if !emit(name, snap, filter, baselines, &mut sink) {
        return Ok(false);
    }
    if let Some(e) = sink.error {
        return Err(e);
    }
    sink.out.write_all(b"]}")?;
    Ok(true)
}

/// Hands table `name` of `snap` to `sink`: its columns, then its rows.
/// `false` (and nothing handed) if there is no such table.
pub fn emit(
    name: &str,
    snap: &Snapshot,
    filter: &Filter,
    baselines: &Baselines,
    sink: &mut dyn Sink,
) -> bool {
    let segs: Vec<(&std::path::Path, &SegmentSnapshot)> = snap
        .segments
        .iter()
        .filter(|v| filter.accepts(&v.data))
        .map(|v| (v.path.as_path(), &*v.data))
        .collect();
    match name {
        "setup_instruments" => {
            sink.columns(&[
                "service",
                "pid",
                "name",
                "enabled",
                "timed",
                "properties",
                "volatility",
                "documentation",
            ]);
            for (_, s) in &segs {
                for c in &s.classes {
                    let mut r = head(s);
                    r.extend([
                        c.name.as_str().into(),
                        yes_no(c.enabled()),
                        yes_no(c.timed()),
                        "".into(),
                        0u64.into(),
                        Cell::Null,
                    ]);
                    sink.row(&r);
                }
            }
        }
        "setup_consumers" => {
            sink.columns(&["service", "pid", "name", "enabled"]);
            for (_, s) in &segs {
                for (n, bit) in consumers() {
                    let mut r = head(s);
                    r.extend([n.into(), yes_no(s.consumers & bit != 0)]);
                    sink.row(&r);
                }
            }
        }
        "setup_timers" => {
            sink.columns(&["service", "pid", "name", "timer_name"]);
            for (_, s) in &segs {
                for (k, n) in TIMER_KINDS.iter().enumerate() {
                    let t = TimerId::from_u32(timer_of(s.timers, k)).unwrap_or(TimerId::Cycle);
                    let mut r = head(s);
                    r.extend([(*n).into(), t.name().into()]);
                    sink.row(&r);
                }
            }
        }
        "setup_actors" => {
            sink.columns(&[
                "service", "pid", "host", "user", "role", "enabled", "history",
            ]);
            for (_, s) in &segs {
                for a in &s.actors {
                    let mut r = head(s);
                    r.extend([
                        a.host.as_str().into(),
                        a.user.as_str().into(),
                        a.role.as_str().into(),
                        yes_no(a.enabled),
                        yes_no(a.history),
                    ]);
                    sink.row(&r);
                }
            }
        }
        "performance_timers" => {
            sink.columns(&[
                "timer_name",
                "timer_frequency",
                "timer_resolution",
                "timer_overhead",
            ]);
            for t in timers::measure() {
                sink.row(&[
                    t.timer.name().into(),
                    opt(t.frequency),
                    opt(t.resolution),
                    opt(t.overhead),
                ]);
            }
        }
        "threads" => {
            sink.columns(&[
                "service",
                "pid",
                "thread_id",
                "name",
                "type",
                "processlist_user",
                "processlist_host",
                "thread_os_id",
                "instrumented",
                "history",
            ]);
            for (_, s) in &segs {
                for t in &s.threads {
                    let (user, host) = match &t.actor {
                        Some((u, h, _)) => (Cell::Str(u), Cell::Str(h)),
                        None => (Cell::Null, Cell::Null),
                    };
                    let mut r = head(s);
                    r.extend([
                        t.thread_id.into(),
                        t.name.as_str().into(),
                        (if t.actor.is_some() {
                            "FOREGROUND"
                        } else {
                            "BACKGROUND"
                        })
                        .into(),
                        user,
                        host,
                        t.os_tid.into(),
                        yes_no(t.instrumented),
                        yes_no(t.history),
                    ]);
                    sink.row(&r);
                }
            }
        }
        "container_pages" => {
            sink.columns(&[
                "service",
                "pid",
                "container",
                "page",
                "state",
                "records",
                "records_used",
                "bytes",
            ]);
            for (_, s) in &segs {
                let rpp = s.geometry.records_per_page;
                let mut used = vec![0u64; s.page_states.len()];
                for t in &s.threads {
                    if let Some(u) = used.get_mut((t.record / rpp) as usize) {
                        *u += 1;
                    }
                }
                for (page, state) in s.page_states.iter().enumerate() {
                    let resident = *state == PageState::Active;
                    let mut r = head(s);
                    r.extend([
                        "threads".into(),
                        page.into(),
                        state.name().to_uppercase().into(),
                        rpp.into(),
                        used[page].into(),
                        (if resident { s.geometry.page_size } else { 0 }).into(),
                    ]);
                    sink.row(&r);
                }
            }
        }
        _ => {
            if let Some(which) = name.strip_prefix("memory_summary_") {
                return build_memory(which, &segs, baselines, sink);
            }
            return build_events(name, &segs, baselines, sink);
        }
    }
    true
}

fn build_events(
    name: &str,
    segs: &[(&std::path::Path, &SegmentSnapshot)],
    baselines: &Baselines,
    sink: &mut dyn Sink,
) -> bool {
    let Some(rest) = name.strip_prefix("events_") else {
        return false;
    };
    let Some((k, word)) = KINDS
        .iter()
        .enumerate()
        .map(|(i, (w, _))| (i, *w))
        .find(|(_, w)| rest.starts_with(w))
    else {
        return false;
    };
    let Some(suffix) = rest[word.len()..].strip_prefix('_') else {
        return false;
    };
    match suffix {
        "current" | "history" | "history_long" => {
            sink.columns(&event_columns(k));
            for (path, s) in segs {
                let classes = class_map(&s.classes);
                let mut push = |tid: u64, e: &Event, st: Option<&StatementEvent>| {
                    sink.row(&event_row(s, &classes, tid, e, st, k));
                };
                if suffix == "history_long" {
                    match k {
                        2 => {
                            for e in s.long_statements.iter().filter(|e| {
                                baselines.keep_long(path, k, e.ev.event_id, e.ev.thread_id)
                            }) {
                                push(e.ev.thread_id, &e.ev, Some(e));
                            }
                        }
                        _ => {
                            for e in s.long[k]
                                .iter()
                                .filter(|e| baselines.keep_long(path, k, e.event_id, e.thread_id))
                            {
                                push(e.thread_id, e, None);
                            }
                        }
                    }
                    continue;
                }
                for t in &s.threads {
                    let min_id = baselines.event_floor(path, t.record, t.version, k);
                    match (k, suffix) {
                        (2, "current") => {
                            for e in t
                                .statements_current
                                .iter()
                                .filter(|e| e.ev.event_id > min_id)
                            {
                                push(t.thread_id, &e.ev, Some(e));
                            }
                        }
                        (2, _) => {
                            for e in t
                                .statements_history
                                .iter()
                                .filter(|e| e.ev.event_id > min_id)
                            {
                                push(t.thread_id, &e.ev, Some(e));
                            }
                        }
                        (_, "current") => {
                            let cur = if k == 0 {
                                &t.waits_current
                            } else {
                                &t.stages_current
                            };
                            for e in cur.iter().filter(|e| e.event_id > min_id) {
                                push(t.thread_id, e, None);
                            }
                        }
                        _ => {
                            let hist = if k == 0 {
                                &t.waits_history
                            } else {
                                &t.stages_history
                            };
                            for e in hist.iter().filter(|e| e.event_id > min_id) {
                                push(t.thread_id, e, None);
                            }
                        }
                    }
                }
            }
        }
        "summary_by_thread_by_event_name" => {
            let mut cols = vec!["service", "pid", "thread_id", "event_name"];
            cols.extend(summary_columns(k));
            sink.columns(&cols);
            // Sorted by reference (a `Summary` is ~350 bytes).
            let mut by_name: Vec<(&str, u32, &Summary)> = Vec::new();
            for (path, s) in segs {
                let classes = class_map(&s.classes);
                for t in &s.threads {
                    by_name.clear();
                    by_name.extend(t.rows.iter().filter_map(|(c, sum)| {
                        let ci = classes.get(c).filter(|ci| kind_matches(k, ci.kind))?;
                        Some((ci.name.as_str(), *c, sum))
                    }));
                    by_name.sort_by_key(|(n, _, _)| *n);
                    for &(n, c, sum) in &by_name {
                        let sum = baselines.thread_view(path, t.record, t.version, c, sum);
                        let mut row = head(s);
                        row.extend([t.thread_id.into(), n.into()]);
                        row.extend(summary_values(&sum, k));
                        sink.row(&row);
                    }
                }
            }
        }
        "summary_global_by_event_name" => {
            let mut cols = vec!["service", "pid", "event_name"];
            cols.extend(summary_columns(k));
            sink.columns(&cols);
            for (path, s) in segs {
                for (n, (kind, sum)) in segment_global(s) {
                    if kind_matches(k, kind) {
                        let sum = baselines.global_view(path, &n, &sum);
                        let mut row = head(s);
                        row.push(n.into());
                        row.extend(summary_values(&sum, k));
                        sink.row(&row);
                    }
                }
            }
        }
        _ => return false,
    }
    true
}

const SUMMARY_COLUMNS: [&str; 5] = [
    "count_star",
    "sum_timer_wait",
    "min_timer_wait",
    "avg_timer_wait",
    "max_timer_wait",
];
const STATEMENT_SUMMARY_COLUMNS: [&str; 5] = [
    "sum_errors",
    "sum_warnings",
    "sum_rows_affected",
    "sum_rows_sent",
    "sum_rows_examined",
];

fn summary_columns(k: usize) -> Vec<&'static str> {
    let mut v = SUMMARY_COLUMNS.to_vec();
    if k == 2 {
        v.extend(STATEMENT_SUMMARY_COLUMNS);
    }
    v
}

fn summary_values(s: &Summary, k: usize) -> Vec<Cell<'static>> {
    let mut v = vec![
        s.count.into(),
        Cell::Ps(s.sum_ps),
        s.min().unwrap_or(0).into(),
        s.avg_ps().into(),
        s.max_ps.into(),
    ];
    if k == 2 {
        let f = &s.statement;
        v.extend([
            f.errors.into(),
            f.warnings.into(),
            f.rows_affected.into(),
            f.rows_sent.into(),
            f.rows_examined.into(),
        ]);
    }
    v
}

fn event_columns(k: usize) -> Vec<&'static str> {
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
    match k {
        0 => v.extend([
            "spins",
            "object_name",
            "object_type",
            "object_instance_begin",
            "nesting_event_id",
            "nesting_event_type",
            "operation",
            "number_of_bytes",
        ]),
        1 => v.extend([
            "work_completed",
            "work_estimated",
            "nesting_event_id",
            "nesting_event_type",
        ]),
        _ => v.extend([
            "sql_text",
            "digest",
            "errors",
            "warnings",
            "rows_affected",
            "rows_sent",
            "rows_examined",
            "nesting_event_id",
            "nesting_event_type",
        ]),
    }
    v
}

fn class_map(classes: &[ClassInfo]) -> HashMap<u32, &ClassInfo> {
    classes.iter().map(|c| (c.index, c)).collect()
}

fn event_row<'a>(
    s: &'a SegmentSnapshot,
    classes: &HashMap<u32, &'a ClassInfo>,
    thread_id: u64,
    e: &Event,
    st: Option<&'a StatementEvent>,
    k: usize,
) -> Vec<Cell<'a>> {
    let class = classes.get(&e.class).copied();
    let string = |i: Option<u32>| opt(i.and_then(|i| s.strings.get(&i).map(String::as_str)));
    let mut row = head(s);
    row.extend([
        thread_id.into(),
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
    match k {
        0 => {
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
        1 => {
            row.extend([opt(e.progress.map(|p| p.0)), opt(e.progress.map(|p| p.1))]);
            row.extend(nesting);
        }
        _ => {
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
        }
    }
    row
}

impl Table {
    /// The JSON form served by the API: `{"table", "columns", "rows": [{..}]}`.
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut m = Map::new();
                for (c, v) in self.columns.iter().zip(r) {
                    m.insert((*c).to_string(), v.clone());
                }
                Value::Object(m)
            })
            .collect();
        json!({ "table": self.name, "columns": self.columns, "rows": rows })
    }

    /// An aligned text table, as the `mysql` client prints one.
    pub fn to_text(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
        t.set_header(self.columns.iter().map(|c| c.to_uppercase()));
        for r in &self.rows {
            t.add_row(r.iter().map(|v| match v {
                Value::Null => "NULL".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }));
        }
        format!(
            "{t}\n{} row{} in set\n",
            self.rows.len(),
            if self.rows.len() == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, EventType, FLAG_ENABLED, FLAG_TIMED};
    use pfs_shm_layout::writer::{
        EventData, KIND_STAGE, KIND_STATEMENT, KIND_WAIT, StatementFigures,
    };
    use pfs_shm_layout::{Segment, SegmentConfig, SegmentWriter, TimerCalibration};
    use std::time::Duration;

    /// A live segment in `dir` with two threads, every kind of event,
    /// strings that need escaping, an actor and memory rows.
    fn populated(dir: &std::path::Path) -> (std::fs::File, SegmentWriter) {
        let path = dir.join("svc\"x.42.pfs");
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
        let cfg = SegmentConfig {
            service_name: "svc\"x".into(),
            ..SegmentConfig::default()
        };
        let w = SegmentWriter::new(
            Segment::create(file.try_clone().unwrap(), &cfg, cal, 42, 0).unwrap(),
        );
        let names = [
            ("wait/io/file/t/f\\ö", KIND_WAIT),
            ("wait/synch/mutex/t/m", KIND_WAIT),
            ("stage/t/s", KIND_STAGE),
            ("statement/t/q", KIND_STATEMENT),
        ];
        let classes: Vec<(u32, usize)> = names
            .iter()
            .map(|(n, k)| {
                let kind = ClassKind::from_name(n).unwrap();
                (
                    w.register_class(n, kind, FLAG_ENABLED | FLAG_TIMED)
                        .unwrap(),
                    *k,
                )
            })
            .collect();
        let mem = w
            .register_class("memory/t/buf", ClassKind::Memory, FLAG_ENABLED)
            .unwrap();
        let source = w.intern("src/a\"b.rs:7\n").unwrap();
        let object = w.intern("/tmp/x\u{1}y").unwrap();
        let (user, host, role) = (
            w.intern("bob").unwrap(),
            w.intern("h\\1").unwrap(),
            w.intern("").unwrap(),
        );
        for t in 0..2u64 {
            let slot = w.alloc_thread(t + 1, 100 + t, &format!("w\t{t}")).unwrap();
            let rec = w.segment().record(slot.index);
            if t == 0 {
                rec.set_actor(user, host, role, 3);
            }
            rec.memory_alloc(mem as usize, 4096, 0);
            rec.memory_free(mem as usize, 100 + t, 0);
            let mut id = 0;
            for round in 0..3u64 {
                for &(class, kind) in &classes {
                    id += 1;
                    let stmt = (kind == KIND_STATEMENT).then_some(StatementFigures {
                        rows_sent: id,
                        digest: if round == 0 { 0 } else { 0xabc },
                        ..StatementFigures::default()
                    });
                    let e = EventData {
                        event_id: id,
                        end_event_id: id,
                        class,
                        timer_start: id * 1_000,
                        timer_end: id * 1_000 + 5,
                        timer_wait: 5_000 * (round + 1),
                        source,
                        object_name: if round == 1 { object } else { NONE },
                        bytes: round * 10,
                        flags: EV_TIMED | if round == 2 { 0 } else { EV_ENDED },
                        event_type: match kind {
                            KIND_WAIT => EventType::Wait,
                            KIND_STAGE => EventType::Stage,
                            _ => EventType::Statement,
                        } as u32,
                        thread_id: t + 1,
                        ..EventData::default()
                    };
                    rec.begin_event(kind, &e);
                    if kind == KIND_STATEMENT && round == 1 {
                        rec.set_statement_text("SELECT \"é\" FROM t WHERE a = '\\'");
                    }
                    rec.end_event(kind, &e, stmt.as_ref(), true, true);
                    rec.summarize(class as usize, true, 5_000 * (round + 1), 0, stmt.as_ref());
                }
            }
        }
        (file, w)
    }

    const NONE: u32 = pfs_shm_layout::layout::NONE_U32;

    #[test]
    fn streamed_json_is_the_collected_tables_json() {
        let dir = tempfile::tempdir().unwrap();
        let _seg = populated(dir.path());
        let snap = crate::snapshot::Snapshotter::new(
            crate::discover::SegmentSet::new(dir.path(), Duration::MAX),
            Duration::ZERO,
        )
        .take();
        assert_eq!(snap.segments.len(), 1, "the segment is read");
        let base = Baselines::default();
        let filters = [
            Filter::default(),
            Filter {
                service: Some("svc\"x".into()),
                pid: Some(42),
            },
            Filter {
                service: Some("other".into()),
                pid: None,
            },
        ];
        let mut rows = 0;
        for f in &filters {
            for name in names() {
                assert!(exists(&name));
                if name == "performance_timers" {
                    continue; // measured anew on every call
                }
                let t = build(&name, &snap, f, &base).unwrap();
                rows += t.rows.len();
                let mut out = Vec::new();
                assert!(write_json(&name, &snap, f, &base, &mut out).unwrap());
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    t.to_json().to_string(),
                    "{name}"
                );
            }
        }
        assert!(rows > 50, "the tables have rows ({rows})");
        for name in [
            "nope",
            "events_waits_",
            "events_waits_nope",
            "memory_summary_x",
        ] {
            assert!(!exists(name));
            let mut out = Vec::new();
            assert!(!write_json(name, &snap, &Filter::default(), &base, &mut out).unwrap());
            assert!(out.is_empty());
        }
    }

    #[test]
    fn cells_serialise_as_their_values() {
        for c in [
            Cell::Null,
            Cell::U64(u64::MAX),
            Cell::I64(-5),
            Cell::I64(5),
            Cell::Ps(7),
            Cell::Ps(u128::from(u64::MAX) + 1),
            Cell::Str("a\"\\\u{0}é"),
            Cell::Owned("x".into()),
        ] {
            assert_eq!(serde_json::to_string(&c).unwrap(), c.to_value().to_string());
        }
        assert_eq!(
            Cell::Ps(u128::from(u64::MAX) + 1).to_value(),
            Value::from("18446744073709551616")
        );
    }
}
