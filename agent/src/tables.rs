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

fn memory_values(name: &str, m: &MemoryStats) -> Vec<Value> {
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
) -> Option<(Vec<&'static str>, Vec<Vec<Value>>)> {
    let mut rows = Vec::new();
    let group: fn(&str, &str) -> Vec<Value> = match which {
        "global_by_event_name" => {
            for (path, s) in segs {
                for (n, m) in segment_global_memory(s) {
                    let mut row = head(s);
                    row.extend(memory_values(
                        &n,
                        &baselines.memory_global_view(path, &n, &m),
                    ));
                    rows.push(row);
                }
            }
            let mut cols = vec!["service", "pid"];
            cols.extend(MEMORY_COLUMNS);
            return Some((cols, rows));
        }
        "by_thread_by_event_name" => {
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
                        rows.push(row);
                    }
                }
            }
            let mut cols = vec!["service", "pid", "thread_id"];
            cols.extend(MEMORY_COLUMNS);
            return Some((cols, rows));
        }
        "by_account_by_event_name" => |u, h| vec![u.into(), h.into()],
        "by_user_by_event_name" => |u, _| vec![u.into()],
        "by_host_by_event_name" => |_, h| vec![h.into()],
        _ => return None,
    };
    for (path, s) in segs {
        let classes = class_map(&s.classes);
        let mut agg: std::collections::BTreeMap<(String, &str), (Vec<Value>, MemoryStats)> =
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
            rows.push(row);
        }
    }
    let mut cols = vec!["service", "pid"];
    cols.extend(match which {
        "by_account_by_event_name" => vec!["user", "host"],
        "by_user_by_event_name" => vec!["user"],
        _ => vec!["host"],
    });
    cols.extend(MEMORY_COLUMNS);
    Some((cols, rows))
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

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map(Into::into).unwrap_or(Value::Null)
}

fn yes_no(b: bool) -> Value {
    Value::from(if b { "YES" } else { "NO" })
}

fn kind_matches(k: usize, c: ClassKind) -> bool {
    match k {
        0 => c.is_wait(),
        _ => c == KINDS[k].1,
    }
}

fn head(s: &SegmentSnapshot) -> Vec<Value> {
    vec![s.service.clone().into(), s.pid.into()]
}

/// Builds table `name` from `snap`; `None` if there is no such table.
/// `baselines` hold what `TRUNCATE` removed from view.
pub fn build(name: &str, snap: &Snapshot, filter: &Filter, baselines: &Baselines) -> Option<Table> {
    let segs: Vec<(&std::path::Path, &SegmentSnapshot)> = snap
        .segments
        .iter()
        .filter(|v| filter.accepts(&v.data))
        .map(|v| (v.path.as_path(), &*v.data))
        .collect();
    let mut rows = Vec::new();
    let columns: Vec<&'static str> = match name {
        "setup_instruments" => {
            for (_, s) in &segs {
                for c in &s.classes {
                    let mut r = head(s);
                    r.extend([
                        c.name.clone().into(),
                        yes_no(c.enabled()),
                        yes_no(c.timed()),
                        "".into(),
                        0.into(),
                        Value::Null,
                    ]);
                    rows.push(r);
                }
            }
            vec![
                "service",
                "pid",
                "name",
                "enabled",
                "timed",
                "properties",
                "volatility",
                "documentation",
            ]
        }
        "setup_consumers" => {
            for (_, s) in &segs {
                for (n, bit) in consumers() {
                    let mut r = head(s);
                    r.extend([n.into(), yes_no(s.consumers & bit != 0)]);
                    rows.push(r);
                }
            }
            vec!["service", "pid", "name", "enabled"]
        }
        "setup_timers" => {
            for (_, s) in &segs {
                for (k, n) in TIMER_KINDS.iter().enumerate() {
                    let t = TimerId::from_u32(timer_of(s.timers, k)).unwrap_or(TimerId::Cycle);
                    let mut r = head(s);
                    r.extend([(*n).into(), t.name().into()]);
                    rows.push(r);
                }
            }
            vec!["service", "pid", "name", "timer_name"]
        }
        "setup_actors" => {
            for (_, s) in &segs {
                for a in &s.actors {
                    let mut r = head(s);
                    r.extend([
                        a.host.clone().into(),
                        a.user.clone().into(),
                        a.role.clone().into(),
                        yes_no(a.enabled),
                        yes_no(a.history),
                    ]);
                    rows.push(r);
                }
            }
            vec![
                "service", "pid", "host", "user", "role", "enabled", "history",
            ]
        }
        "performance_timers" => {
            for t in timers::measure() {
                rows.push(vec![
                    t.timer.name().into(),
                    opt(t.frequency),
                    opt(t.resolution),
                    opt(t.overhead),
                ]);
            }
            vec![
                "timer_name",
                "timer_frequency",
                "timer_resolution",
                "timer_overhead",
            ]
        }
        "threads" => {
            for (_, s) in &segs {
                for t in &s.threads {
                    let (user, host) = match &t.actor {
                        Some((u, h, _)) => (Value::from(u.clone()), Value::from(h.clone())),
                        None => (Value::Null, Value::Null),
                    };
                    let mut r = head(s);
                    r.extend([
                        t.thread_id.into(),
                        t.name.clone().into(),
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
                    rows.push(r);
                }
            }
            vec![
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
            ]
        }
        "container_pages" => {
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
                    rows.push(r);
                }
            }
            vec![
                "service",
                "pid",
                "container",
                "page",
                "state",
                "records",
                "records_used",
                "bytes",
            ]
        }
        _ => {
            if let Some(which) = name.strip_prefix("memory_summary_") {
                let (columns, rows) = build_memory(which, &segs, baselines)?;
                return Some(Table {
                    name: name.to_string(),
                    columns,
                    rows,
                });
            }
            return build_events(name, &segs, baselines);
        }
    };
    Some(Table {
        name: name.to_string(),
        columns,
        rows,
    })
}

fn build_events(
    name: &str,
    segs: &[(&std::path::Path, &SegmentSnapshot)],
    baselines: &Baselines,
) -> Option<Table> {
    let rest = name.strip_prefix("events_")?;
    let (k, word) = KINDS
        .iter()
        .enumerate()
        .map(|(i, (w, _))| (i, *w))
        .find(|(_, w)| rest.starts_with(w))?;
    let suffix = rest[word.len()..].strip_prefix('_')?;
    let mut rows = Vec::new();
    let columns = match suffix {
        "current" | "history" | "history_long" => {
            for (path, s) in segs {
                let classes = class_map(&s.classes);
                let mut push = |tid: u64, e: &Event, st: Option<&StatementEvent>| {
                    rows.push(event_row(s, &classes, tid, e, st, k));
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
            event_columns(k)
        }
        "summary_by_thread_by_event_name" => {
            for (path, s) in segs {
                let classes = class_map(&s.classes);
                for t in &s.threads {
                    let mut by_name: Vec<(&str, Summary)> = t
                        .rows
                        .iter()
                        .filter_map(|(c, sum)| {
                            let ci = classes.get(c).filter(|ci| kind_matches(k, ci.kind))?;
                            Some((
                                ci.name.as_str(),
                                baselines.thread_view(path, t.record, t.version, *c, sum),
                            ))
                        })
                        .collect();
                    by_name.sort_by_key(|(n, _)| *n);
                    for (n, sum) in by_name {
                        let mut row = head(s);
                        row.extend([t.thread_id.into(), n.into()]);
                        row.extend(summary_values(&sum, k));
                        rows.push(row);
                    }
                }
            }
            let mut cols = vec!["service", "pid", "thread_id", "event_name"];
            cols.extend(summary_columns(k));
            cols
        }
        "summary_global_by_event_name" => {
            for (path, s) in segs {
                for (n, (kind, sum)) in segment_global(s) {
                    if kind_matches(k, kind) {
                        let sum = baselines.global_view(path, &n, &sum);
                        let mut row = head(s);
                        row.push(n.into());
                        row.extend(summary_values(&sum, k));
                        rows.push(row);
                    }
                }
            }
            let mut cols = vec!["service", "pid", "event_name"];
            cols.extend(summary_columns(k));
            cols
        }
        _ => return None,
    };
    Some(Table {
        name: name.to_string(),
        columns,
        rows,
    })
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

fn summary_values(s: &Summary, k: usize) -> Vec<Value> {
    let mut v = vec![
        s.count.into(),
        ps(s.sum_ps),
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

fn event_row(
    s: &SegmentSnapshot,
    classes: &HashMap<u32, &ClassInfo>,
    thread_id: u64,
    e: &Event,
    st: Option<&StatementEvent>,
    k: usize,
) -> Vec<Value> {
    let class = classes.get(&e.class);
    let string = |i: Option<u32>| opt(i.and_then(|i| s.strings.get(&i).cloned()));
    let mut row = head(s);
    row.extend([
        thread_id.into(),
        e.event_id.into(),
        opt(e.end_event_id),
        opt(class.map(|c| c.name.clone())),
        string(e.source),
        e.timer_start.map(ps).unwrap_or(Value::Null),
        e.timer_end.map(ps).unwrap_or(Value::Null),
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
                    Some(st.text.clone()).filter(|t| !t.is_empty()),
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
