//! PFS-style tables built from a snapshot: the same rows for the HTTP JSON
//! API and the `query` CLI. Column names are PFS's, in lower case; timers
//! are picoseconds; NULL is JSON `null`. Every row starts with `service`
//! and `pid`, which tell the processes apart.

use std::collections::HashMap;

use pfs_shm_layout::reader::{ClassInfo, Event, SegmentSnapshot, Summary};
use serde_json::{Map, Value, json};

use crate::aggregate::segment_global;
use crate::snapshot::Snapshot;

/// Tables served, in display order.
pub const TABLES: &[&str] = &[
    "setup_instruments",
    "threads",
    "events_waits_current",
    "events_waits_history",
    "events_waits_summary_by_thread_by_event_name",
    "events_waits_summary_global_by_event_name",
];

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
    fn accepts(&self, s: &SegmentSnapshot) -> bool {
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

/// Builds table `name` from `snap`; `None` if there is no such table.
pub fn build(name: &str, snap: &Snapshot, filter: &Filter) -> Option<Table> {
    let segs = snap
        .segments
        .iter()
        .map(|v| &v.data)
        .filter(|s| filter.accepts(s));
    let (columns, rows): (Vec<&'static str>, Vec<Vec<Value>>) = match name {
        "setup_instruments" => (
            vec![
                "service",
                "pid",
                "name",
                "enabled",
                "timed",
                "properties",
                "volatility",
                "documentation",
            ],
            segs.flat_map(|s| {
                s.classes.iter().map(move |c| {
                    vec![
                        s.service.clone().into(),
                        s.pid.into(),
                        c.name.clone().into(),
                        yes_no(c.enabled()),
                        yes_no(c.timed()),
                        "".into(),
                        0.into(),
                        Value::Null,
                    ]
                })
            })
            .collect(),
        ),
        "threads" => (
            vec![
                "service",
                "pid",
                "thread_id",
                "name",
                "type",
                "thread_os_id",
                "instrumented",
                "history",
            ],
            segs.flat_map(|s| {
                s.threads.iter().map(move |t| {
                    vec![
                        s.service.clone().into(),
                        s.pid.into(),
                        t.thread_id.into(),
                        t.name.clone().into(),
                        "FOREGROUND".into(),
                        t.os_tid.into(),
                        yes_no(true),
                        yes_no(true),
                    ]
                })
            })
            .collect(),
        ),
        "events_waits_current" | "events_waits_history" => {
            let current = name == "events_waits_current";
            let mut rows = Vec::new();
            for s in segs {
                let classes = class_map(&s.classes);
                for t in &s.threads {
                    let events: Vec<&Event> = if current {
                        t.waits_current.iter().collect()
                    } else {
                        t.waits_history.iter().collect()
                    };
                    for e in events {
                        rows.push(event_row(s, &classes, t.thread_id, e));
                    }
                }
            }
            (EVENT_COLUMNS.to_vec(), rows)
        }
        "events_waits_summary_by_thread_by_event_name" => {
            let mut rows = Vec::new();
            for s in segs {
                let classes = class_map(&s.classes);
                for t in &s.threads {
                    let mut by_name: Vec<(&str, &Summary)> = t
                        .rows
                        .iter()
                        .filter_map(|(c, sum)| {
                            classes
                                .get(c)
                                .filter(|c| c.kind.is_wait())
                                .map(|ci| (ci.name.as_str(), sum))
                        })
                        .collect();
                    by_name.sort_by_key(|(n, _)| *n);
                    for (n, sum) in by_name {
                        let mut row = vec![
                            s.service.clone().into(),
                            s.pid.into(),
                            t.thread_id.into(),
                            n.into(),
                        ];
                        row.extend(summary_values(sum));
                        rows.push(row);
                    }
                }
            }
            let mut cols = vec!["service", "pid", "thread_id", "event_name"];
            cols.extend(SUMMARY_COLUMNS);
            (cols, rows)
        }
        "events_waits_summary_global_by_event_name" => {
            let mut rows = Vec::new();
            for s in segs {
                for (n, (kind, sum)) in segment_global(s) {
                    if kind.is_wait() {
                        let mut row = vec![s.service.clone().into(), s.pid.into(), n.into()];
                        row.extend(summary_values(&sum));
                        rows.push(row);
                    }
                }
            }
            let mut cols = vec!["service", "pid", "event_name"];
            cols.extend(SUMMARY_COLUMNS);
            (cols, rows)
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

fn summary_values(s: &Summary) -> [Value; 5] {
    [
        s.count.into(),
        ps(s.sum_ps),
        s.min().unwrap_or(0).into(),
        s.avg_ps().into(),
        s.max_ps.into(),
    ]
}

const EVENT_COLUMNS: [&str; 18] = [
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
    "spins",
    "object_name",
    "object_type",
    "object_instance_begin",
    "nesting_event_id",
    "nesting_event_type",
    "operation",
    "number_of_bytes",
];

fn class_map(classes: &[ClassInfo]) -> HashMap<u32, &ClassInfo> {
    classes.iter().map(|c| (c.index, c)).collect()
}

fn event_row(
    s: &SegmentSnapshot,
    classes: &HashMap<u32, &ClassInfo>,
    thread_id: u64,
    e: &Event,
) -> Vec<Value> {
    let class = classes.get(&e.class);
    let string = |i: Option<u32>| opt(i.and_then(|i| s.strings.get(&i).cloned()));
    let object_type = class.map(|c| match c.kind {
        pfs_shm_layout::ClassKind::File => "FILE",
        pfs_shm_layout::ClassKind::Socket => "SOCKET",
        _ => "",
    });
    vec![
        s.service.clone().into(),
        s.pid.into(),
        thread_id.into(),
        e.event_id.into(),
        opt(e.end_event_id),
        opt(class.map(|c| c.name.clone())),
        string(e.source),
        e.timer_start.map(ps).unwrap_or(Value::Null),
        e.timer_end.map(ps).unwrap_or(Value::Null),
        opt(e.timer_wait),
        opt(e.spins),
        string(e.object_name),
        opt(object_type.filter(|t| !t.is_empty())),
        e.object_instance.into(),
        opt(e.nesting_event_id),
        opt(e.nesting_event_type.pfs_name()),
        opt(e.operation.map(|o| o.name())),
        opt(e.bytes),
    ]
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
