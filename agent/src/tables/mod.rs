//! Layer 6: the PFS-style tables, as pure functions of a snapshot: the
//! same rows for the HTTP JSON API and the `query` command. Column names
//! are PFS's, in lower case; timers are picoseconds; NULL is JSON `null`.
//! Every row of a per-process table starts with `service` and `pid`.
//!
//! One file per table (or per table of each event kind), each an
//! implementation of [`PfsTable`], listed once in [`registry`]: the list
//! of names, the lookup of a request's table and `TRUNCATE TABLE` all
//! come from it. Shared pieces: [`cell`] (how rows are handed out),
//! [`view`] (the trait and its input), [`columns`] (columns several tables
//! share).

pub mod cell;
mod columns;
pub mod view;

mod container_pages;
mod events_current;
mod events_histogram_by_event_name;
mod events_histogram_global;
mod events_history;
mod events_history_long;
mod events_summary_by_thread_by_event_name;
mod events_summary_global_by_event_name;
mod io_summary_by_event_name;
mod memory_summary_by_actor;
mod memory_summary_by_thread_by_event_name;
mod memory_summary_global_by_event_name;
mod performance_timers;
mod setup_actors;
mod setup_consumers;
mod setup_instruments;
mod setup_timers;
mod threads;

use std::sync::OnceLock;

pub use cell::{Cell, Sink, Table};
pub use columns::{ColumnKind, column_kind, duration_columns};
pub use view::{KindTable, NotTruncatable, PfsTable, Unreached, View};

use pfs_shm_layout::EventKind;

use crate::filter::{Filter, Spelling};
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;
use cell::{Collect, JsonSink};
use memory_summary_by_actor::{Actor, MemoryByActor};

/// Every table served, in display order (the order of
/// `GET /api/v1/tables`).
pub fn registry() -> &'static [Box<dyn PfsTable>] {
    static REGISTRY: OnceLock<Vec<Box<dyn PfsTable>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut v: Vec<Box<dyn PfsTable>> = vec![
            Box::new(setup_instruments::SetupInstruments),
            Box::new(setup_consumers::SetupConsumers),
            Box::new(setup_timers::SetupTimers),
            Box::new(setup_actors::SetupActors),
            Box::new(performance_timers::PerformanceTimers),
            Box::new(threads::Threads),
            Box::new(container_pages::ContainerPages),
        ];
        for kind in EventKind::ALL {
            v.push(Box::new(events_current::table(kind)));
            v.push(Box::new(events_history::table(kind)));
            v.push(Box::new(events_history_long::table(kind)));
            v.push(Box::new(events_summary_by_thread_by_event_name::table(
                kind,
            )));
            v.push(Box::new(events_summary_global_by_event_name::table(kind)));
            v.push(Box::new(events_histogram_global::table(kind)));
            v.push(Box::new(events_histogram_by_event_name::table(kind)));
        }
        for t in io_summary_by_event_name::IoSummary::ALL {
            v.push(Box::new(t));
        }
        v.push(Box::new(memory_summary_global_by_event_name::MemoryGlobal));
        v.push(Box::new(
            memory_summary_by_thread_by_event_name::MemoryByThread,
        ));
        for actor in Actor::ALL {
            v.push(Box::new(MemoryByActor::new(actor)));
        }
        v
    })
}

/// The names of every table, in display order.
pub fn names() -> Vec<&'static str> {
    registry().iter().map(|t| t.name()).collect()
}

/// Why there is no table called `name`: what it most likely meant (a
/// table whose name is within a few edits of it), and every table.
///
/// ```
/// let msg = pfs_agent::tables::not_found("events_wait_current");
/// assert!(msg.starts_with(r#"no table "events_wait_current"; did you mean events_waits_current?"#));
/// let msg = pfs_agent::tables::not_found("PERFORMANCE_SCHEMA.thread");
/// assert!(msg.contains("did you mean threads?"), "{msg}");
/// ```
pub fn not_found(name: &str) -> String {
    let bare = unqualified(name).to_ascii_lowercase();
    let closest = names()
        .into_iter()
        .map(|t| (strsim::levenshtein(&bare, t), t))
        .min()
        .filter(|(d, t)| *d <= (t.len() / 4).max(2));
    let hint = closest.map_or(String::new(), |(_, t)| format!(" did you mean {t}?"));
    format!("no table {name:?};{hint} tables: {}", names().join(", "))
}

/// `name` without spaces around it and without `performance_schema.` (any
/// case) in front.
fn unqualified(name: &str) -> &str {
    let name = name.trim();
    let schema = "performance_schema.";
    match name.get(..schema.len()) {
        Some(s) if s.eq_ignore_ascii_case(schema) => &name[schema.len()..],
        _ => name,
    }
}

/// The table called `name`, if there is one: regardless of ASCII case,
/// and with or without the schema's name in front, as a DBA may write it.
///
/// ```
/// use pfs_agent::tables::lookup;
/// assert!(lookup("events_waits_current").is_some());
/// assert!(lookup("EVENTS_WAITS_CURRENT").is_some());
/// assert!(lookup("performance_schema.threads").is_some());
/// assert!(lookup("events_waits_nope").is_none());
/// ```
pub fn lookup(name: &str) -> Option<&'static dyn PfsTable> {
    let name = unqualified(name);
    registry()
        .iter()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .map(|t| &**t)
}

/// Builds `table` from `snap`, every row held (a large table is better
/// written with [`write_json`]). `baselines` hold what `TRUNCATE` removed
/// from view.
pub fn build(
    table: &dyn PfsTable,
    snap: &Snapshot,
    filter: &Filter,
    baselines: &Baselines,
) -> Table {
    let mut t = Collect(Table {
        name: table.name().to_string(),
        columns: Vec::new(),
        rows: Vec::new(),
    });
    table.emit(&View::new(snap, filter, baselines), &mut t);
    t.0
}

/// Writes `table` to `out` as the JSON of [`Table::to_json`] (compact:
/// the bytes of `to_json().to_string()`), one row at a time, so that no
/// more than a row is held beside the snapshot. When `filter` leaves out
/// every segment, a `"warning"` member follows the rows
/// ([`Filter::unmatched`]: what was asked, what there is).
pub fn write_json(
    table: &dyn PfsTable,
    snap: &Snapshot,
    filter: &Filter,
    baselines: &Baselines,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let mut sink = JsonSink::new(out, table.name());
    table.emit(&View::new(snap, filter, baselines), &mut sink);
    sink.finish(unmatched(table, snap, filter, Spelling::Query).as_deref())
}

/// The warning for a `service`/`pid` filter that leaves every process
/// `table` shows out of `snap` ([`Filter::unmatched`]; for a table of
/// live processes only, every live one: [`Filter::unmatched_live`]).
pub fn unmatched(
    table: &dyn PfsTable,
    snap: &Snapshot,
    filter: &Filter,
    spelling: Spelling,
) -> Option<String> {
    let found = |live_only: bool| {
        snap.segments
            .iter()
            .filter(move |s| s.live || !live_only)
            .map(|s| (s.data.service.as_str(), s.data.pid))
    };
    if !table.live_only() {
        return filter.unmatched(found(false), spelling);
    }
    let w = filter.unmatched_live(found(true), spelling)?;
    let exited = snap
        .segments
        .iter()
        .filter(|s| !s.live && filter.matches(&s.data.service, s.data.pid))
        .count();
    Some(match exited {
        0 => w,
        n => format!(
            "{w}; {n} exited process(es) match: this table shows live processes only (their totals stay in the *_global_* summaries)"
        ),
    })
}
#[cfg(test)]
mod tests {
    use super::*;
    use pfs_shm_layout::layout::{EV_ENDED, EV_TIMED, FLAG_ENABLED, FLAG_TIMED};
    use pfs_shm_layout::writer::{EventData, StatementFigures};
    use pfs_shm_layout::{ClassKind, Segment, SegmentConfig, SegmentWriter, TimerCalibration};
    use std::time::Duration;

    /// A snapshot of every segment in `dir`, as the agent takes it.
    pub(super) fn snap(dir: &std::path::Path) -> Snapshot {
        crate::snapshot::Snapshotter::new(
            crate::segments::SegmentSet::new(dir, Duration::MAX),
            Duration::ZERO,
        )
        .take()
    }

    /// Table `name` of the segments in `dir`: every process, nothing
    /// truncated.
    pub(super) fn built(dir: &std::path::Path, name: &str) -> Table {
        build(
            lookup(name).unwrap(),
            &snap(dir),
            &Filter::default(),
            &Baselines::default(),
        )
    }

    /// A live segment in `dir` with two threads, every kind of event,
    /// strings that need escaping, an actor and memory rows.
    pub(super) fn populated(dir: &std::path::Path) -> (std::fs::File, SegmentWriter) {
        let path = dir.join("svc\"x.42.pfs");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        let cfg = SegmentConfig {
            service_name: "svc\"x".into(),
            ..SegmentConfig::default()
        };
        let w = SegmentWriter::new(
            Segment::create(
                file.try_clone().unwrap(),
                &cfg,
                TimerCalibration::NANOSECONDS,
                42,
                0,
            )
            .unwrap(),
        );
        let names = [
            ("wait/io/file/t/f\\ö", EventKind::Wait),
            ("wait/synch/mutex/t/m", EventKind::Wait),
            ("stage/t/s", EventKind::Stage),
            ("statement/t/q", EventKind::Statement),
        ];
        let classes: Vec<(u32, EventKind)> = names
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
                    let stmt = (kind == EventKind::Statement).then_some(StatementFigures {
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
                        event_type: kind as u32,
                        thread_id: t + 1,
                        ..EventData::default()
                    };
                    rec.begin_event(kind, &e);
                    if kind == EventKind::Statement && round == 1 {
                        rec.set_statement_text("SELECT \"é\" FROM t WHERE a = '\\'");
                    }
                    rec.end_event(kind, &e, stmt.as_ref(), true, true);
                    rec.summarize(
                        class as usize,
                        kind,
                        true,
                        5_000 * (round + 1),
                        0,
                        stmt.as_ref(),
                    );
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
        let snap = snap(dir.path());
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
            for table in registry() {
                let name = table.name();
                assert!(lookup(name).is_some());
                if name == "performance_timers" {
                    continue; // measured anew on every call
                }
                let t = build(&**table, &snap, f, &base);
                rows += t.rows.len();
                let mut out = Vec::new();
                write_json(&**table, &snap, f, &base, &mut out).unwrap();
                // A filter that leaves out every segment adds a warning
                // after the rows.
                let mut want = t.to_json();
                if f.service.as_deref() == Some("other") {
                    // (The segment is live: the tables of live processes
                    // only find it too.)
                    let among = if table.live_only() {
                        "live process"
                    } else {
                        "segment"
                    };
                    want["warning"] = serde_json::json!(format!(
                        "no {among} matches service=\"other\": the table is empty; services found: \"svc\\\"x\""
                    ));
                }
                assert_eq!(String::from_utf8(out).unwrap(), want.to_string(), "{name}");
            }
        }
        assert!(rows > 50, "the tables have rows ({rows})");
        for name in [
            "nope",
            "events_waits_",
            "events_waits_nope",
            "memory_summary_x",
        ] {
            assert!(lookup(name).is_none());
        }
    }
}

#[cfg(test)]
mod threads_tests {
    use super::tests::{built, populated};
    use serde_json::{Value, json};

    /// `threads` has MySQL's columns in MySQL's order (those it keeps),
    /// the declared actor's role among them.
    #[test]
    fn threads_have_mysqls_column_order_and_the_actors_role() {
        let dir = tempfile::tempdir().unwrap();
        let _seg = populated(dir.path());
        let t = built(dir.path(), "threads");
        let at = t.columns.iter().position(|c| *c == "thread_id").unwrap();
        assert_eq!(
            t.columns[at..],
            [
                "thread_id",
                "name",
                "type",
                "processlist_user",
                "processlist_host",
                "role",
                "instrumented",
                "history",
                "thread_os_id",
            ]
        );
        let col = |name: &str| -> Vec<Value> {
            let i = t.columns.iter().position(|c| *c == name).unwrap();
            t.rows.iter().map(|r| r[i].clone()).collect()
        };
        // Thread 1 declared user "bob" with an empty role; thread 2 none.
        assert_eq!(col("processlist_user"), [json!("bob"), Value::Null]);
        assert_eq!(col("role"), [json!(""), Value::Null]);
        assert_eq!(col("thread_os_id"), [json!(100), json!(101)]);
    }
}

#[cfg(test)]
mod histogram_tests {
    use super::tests::{built, populated};
    use serde_json::{Value, json};

    fn table(dir: &std::path::Path, name: &str) -> Vec<serde_json::Map<String, Value>> {
        let t = built(dir, name);
        t.rows
            .iter()
            .map(|r| {
                t.columns
                    .iter()
                    .map(|c| c.to_string())
                    .zip(r.iter().cloned())
                    .collect()
            })
            .collect()
    }

    /// Each class timed 5, 10 and 15 ns events on two threads: buckets 0
    /// (≤ 7.45 ns), 1 (≤ 14.9 ns) and 2 (≤ 29.8 ns) hold two each.
    #[test]
    fn histograms_and_quantiles_are_the_summaries_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let _seg = populated(dir.path());
        let rows = table(dir.path(), "events_waits_histogram_by_event_name");
        let mutex: Vec<_> = rows
            .iter()
            .filter(|r| r["event_name"] == "wait/synch/mutex/t/m")
            .collect();
        assert_eq!(mutex.len(), 32, "every bucket of a class that timed events");
        let first = |r: &serde_json::Map<String, Value>| {
            [
                "bucket_number",
                "bucket_timer_low",
                "bucket_timer_high",
                "count_bucket",
                "count_bucket_and_lower",
                "bucket_quantile",
            ]
            .map(|c| r[c].clone())
            .to_vec()
        };
        assert_eq!(json!(first(mutex[0])), json!([0, 0, 7450, 2, 2, 0.333333]));
        assert_eq!(
            json!(first(mutex[1])),
            json!([1, 7450, 14901, 2, 4, 0.666667])
        );
        assert_eq!(json!(first(mutex[2])), json!([2, 14901, 29802, 2, 6, 1.0]));
        assert_eq!(
            first(mutex[31])[2],
            Value::Null,
            "the last bucket has no bound"
        );
        assert_eq!(first(mutex[31])[4], 6);
        // Two wait classes, summed.
        let global = table(dir.path(), "events_waits_histogram_global");
        assert_eq!(global.len(), 32);
        let counts: Vec<_> = global.iter().map(|r| r["count_bucket"].clone()).collect();
        assert_eq!(json!(counts[..4]), json!([4, 4, 4, 0]));
        assert_eq!(global[0]["service"], "svc\"x");
        // The quantiles: the 6th of 6 events, in bucket 2, capped by MAX.
        let sums = table(dir.path(), "events_statements_summary_global_by_event_name");
        let q = &sums[0];
        assert_eq!(q["max_timer_wait"], 15_000);
        for c in ["quantile_95", "quantile_99", "quantile_999"] {
            assert_eq!(q[c], 15_000, "{c}");
        }
        // Each kind's table has its own classes.
        assert!(rows.iter().all(|r| r["event_name"] != "stage/t/s"));
        let stages = table(dir.path(), "events_stages_histogram_by_event_name");
        assert_eq!(stages.len(), 32, "stage/t/s only");
        assert!(stages.iter().all(|r| r["event_name"] == "stage/t/s"));
        // The text table shows a fraction as MySQL's DECIMAL(7,6).
        let text = built(dir.path(), "events_waits_histogram_global").to_text();
        assert!(
            text.contains("| 0.333333 ") && text.contains("| 1.000000 "),
            "{text}"
        );
    }
}

#[cfg(test)]
mod live_only_tests {
    use super::*;

    /// A dead process keeps its figures in the summaries and
    /// `history_long` during its retention, but the setup tables and
    /// `performance_timers` list live processes only (a dead one's setup
    /// cannot be changed, nor its timers read).
    #[test]
    fn setup_tables_and_timers_list_live_processes_only() {
        let dir = tempfile::tempdir().unwrap();
        let _live = crate::testing::segment_at(
            &dir.path().join("live.1.pfs"),
            &crate::testing::tiny_config("live"),
            1,
            true,
        );
        crate::testing::mutex_class(&_live.1, "a");
        crate::testing::dead_segment(dir.path(), "dead", 2, 3);
        let snap = super::tests::snap(dir.path());
        let services = |name: &str| -> Vec<String> {
            let t = build(
                lookup(name).unwrap(),
                &snap,
                &Filter::default(),
                &Baselines::default(),
            );
            let mut v: Vec<String> = t
                .rows
                .iter()
                .map(|r| r[0].as_str().unwrap().to_string())
                .collect();
            v.dedup();
            v
        };
        for name in [
            "setup_instruments",
            "setup_consumers",
            "setup_timers",
            "performance_timers",
        ] {
            assert_eq!(services(name), ["live"], "{name}");
        }
        let mut summaries = services("events_waits_summary_global_by_event_name");
        summaries.sort();
        assert_eq!(summaries, ["dead", "live"]);
    }
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    /// The served names, as they were before the registry (clients and
    /// dashboards rely on them and on their order).
    #[test]
    fn names_are_the_pfs_tables_in_display_order() {
        let mut want: Vec<String> = [
            "setup_instruments",
            "setup_consumers",
            "setup_timers",
            "setup_actors",
            "performance_timers",
            "threads",
            "container_pages",
        ]
        .map(String::from)
        .to_vec();
        for k in ["waits", "stages", "statements"] {
            for suffix in [
                "current",
                "history",
                "history_long",
                "summary_by_thread_by_event_name",
                "summary_global_by_event_name",
                "histogram_global",
                "histogram_by_event_name",
            ] {
                want.push(format!("events_{k}_{suffix}"));
            }
        }
        want.push("file_summary_by_event_name".into());
        want.push("socket_summary_by_event_name".into());
        for t in [
            "global_by_event_name",
            "by_thread_by_event_name",
            "by_account_by_event_name",
            "by_user_by_event_name",
            "by_host_by_event_name",
        ] {
            want.push(format!("memory_summary_{t}"));
        }
        assert_eq!(names(), want);
    }

    #[test]
    fn only_event_io_memory_and_actor_tables_truncate() {
        let snap = crate::snapshot::Snapshotter::new(
            crate::segments::SegmentSet::new("/nonexistent-pfs-dir", std::time::Duration::MAX),
            std::time::Duration::ZERO,
        )
        .take();
        for t in registry() {
            let truncatable = t.name().starts_with("events_")
                || t.name().starts_with("memory_")
                || t.name().ends_with("_summary_by_event_name")
                || t.name() == "setup_actors";
            let r = t.truncate(&mut Baselines::default(), &snap);
            assert_eq!(r.is_ok(), truncatable, "{}", t.name());
            if let Err(e) = r {
                assert!(e.to_string().starts_with(t.name()));
            }
        }
    }
}

/// Tasks (layout 3.1): events under their own `THREAD_ID`, `CPU_TIME`,
/// cancellation, and `TRUNCATE` per logical thread.
#[cfg(test)]
mod task_tests {
    use super::tests::snap;
    use super::*;
    use crate::testing::{segment_at, statement, statement_class};
    use pfs_shm_layout::values::StatementFigures;
    use pfs_shm_layout::{SegmentConfig, SegmentWriter};
    use serde_json::{Value, json};
    use std::path::Path;

    /// A task's id: from the threads' sequence, never a thread's.
    const TASK: u64 = 7;

    fn cpu(ps: u64) -> Option<StatementFigures> {
        Some(StatementFigures {
            cpu_time_ps: ps,
            ..StatementFigures::default()
        })
    }

    fn cancelled(ps: u64) -> Option<StatementFigures> {
        Some(StatementFigures {
            cpu_time_ps: ps,
            cancelled: 1,
            ..StatementFigures::default()
        })
    }

    /// Thread 1 (record `slot`) runs its own statements 1 and 2 and, in
    /// between, task 7's statements 1 (3 µs on CPU) and 2 (cancelled, 2 µs
    /// on CPU); task 7's statement 3 is running on it.
    fn segment(dir: &Path) -> (std::fs::File, SegmentWriter, u32, u32) {
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..SegmentConfig::default()
        };
        let (f, w) = segment_at(&dir.join("svc.9.pfs"), &cfg, 9, true);
        let q = statement_class(&w, "q");
        let slot = w.alloc_thread(1, 100, "worker-1").unwrap().index;
        statement(&w, slot, q, (1, 1), 5_000_000, cpu(0));
        statement(&w, slot, q, (TASK, 1), 8_000_000, cpu(3_000_000));
        statement(&w, slot, q, (TASK, 2), 9_000_000, cancelled(2_000_000));
        statement(&w, slot, q, (1, 2), 1_000_000, cpu(0));
        statement(&w, slot, q, (TASK, 3), 0, None);
        (f, w, q, slot)
    }

    /// `TRUNCATE` of table `name` as of a snapshot of `dir`, into `b`.
    fn truncate(dir: &Path, name: &str, b: &mut Baselines) {
        let unreached = lookup(name).unwrap().truncate(b, &snap(dir)).unwrap();
        assert!(unreached.is_empty(), "{unreached:?}");
    }

    fn table(dir: &Path, name: &str, b: &Baselines) -> Table {
        build(lookup(name).unwrap(), &snap(dir), &Filter::default(), b)
    }

    fn col(t: &Table, name: &str) -> Vec<Value> {
        let i = t.columns.iter().position(|c| *c == name).unwrap();
        t.rows.iter().map(|r| r[i].clone()).collect()
    }

    /// (THREAD_ID, EVENT_ID) of each row, in table order.
    fn ids(t: &Table) -> Vec<(u64, u64)> {
        col(t, "thread_id")
            .iter()
            .zip(col(t, "event_id"))
            .map(|(t, e)| (t.as_u64().unwrap(), e.as_u64().unwrap()))
            .collect()
    }

    #[test]
    fn statement_tables_pin_their_columns() {
        let dir = tempfile::tempdir().unwrap();
        let _seg = segment(dir.path());
        let events = [
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
        ];
        for t in [
            "events_statements_current",
            "events_statements_history",
            "events_statements_history_long",
        ] {
            assert_eq!(table(dir.path(), t, &Baselines::default()).columns, events);
        }
        let sums = [
            "count_star",
            "sum_timer_wait",
            "min_timer_wait",
            "avg_timer_wait",
            "max_timer_wait",
            "sum_errors",
            "sum_warnings",
            "sum_rows_affected",
            "sum_rows_sent",
            "sum_rows_examined",
            "sum_cpu_time",
            "count_cancelled",
            "quantile_95",
            "quantile_99",
            "quantile_999",
        ];
        let global = table(
            dir.path(),
            "events_statements_summary_global_by_event_name",
            &Baselines::default(),
        );
        assert_eq!(global.columns[..3], ["service", "pid", "event_name"]);
        assert_eq!(global.columns[3..], sums);
        let by_thread = table(
            dir.path(),
            "events_statements_summary_by_thread_by_event_name",
            &Baselines::default(),
        );
        assert_eq!(by_thread.columns[2..4], ["thread_id", "event_name"]);
        // The quantiles are the global summaries' only.
        assert_eq!(by_thread.columns[4..], sums[..sums.len() - 3]);
        // Waits and stages have neither.
        for t in [
            "events_waits_history",
            "events_stages_summary_global_by_event_name",
        ] {
            let cols = table(dir.path(), t, &Baselines::default()).columns;
            assert!(
                !cols
                    .iter()
                    .any(|c| c.contains("cpu") || c.contains("cancel"))
            );
        }
    }

    #[test]
    fn task_events_have_their_own_thread_id_cpu_time_and_cancelled_flag() {
        let dir = tempfile::tempdir().unwrap();
        let _seg = segment(dir.path());
        let none = Baselines::default();
        let h = table(dir.path(), "events_statements_history", &none);
        // Ordered by (THREAD_ID, EVENT_ID), though written interleaved.
        assert_eq!(ids(&h), [(1, 1), (1, 2), (TASK, 1), (TASK, 2)]);
        assert_eq!(
            col(&h, "cpu_time"),
            [json!(0), json!(0), json!(3_000_000), json!(2_000_000)]
        );
        assert_eq!(col(&h, "cancelled"), ["NO", "NO", "NO", "YES"]);
        assert_eq!(col(&h, "timer_wait")[3], json!(9_000_000));
        assert_eq!(col(&h, "errors")[3], json!(0), "a cancellation is no error");
        // The running statement is the task's: no CPU_TIME yet.
        let c = table(dir.path(), "events_statements_current", &none);
        assert_eq!(ids(&c), [(TASK, 3)]);
        assert_eq!(col(&c, "end_event_id"), [Value::Null]);
        assert_eq!(col(&c, "cpu_time"), [Value::Null]);
        assert_eq!(col(&c, "cancelled"), ["NO"]);
        // Running, timed: TIMER_END is the timer now, TIMER_WAIT the time
        // so far (PFS); the timer is the segment's, on its time line.
        let (start, end, wait) = (
            col(&c, "timer_start")[0].as_u64().unwrap(),
            col(&c, "timer_end")[0].as_u64().unwrap(),
            col(&c, "timer_wait")[0].as_u64().unwrap(),
        );
        assert!(end > start && wait == end - start, "{start} {end} {wait}");
        // A task is not a thread.
        let th = table(dir.path(), "threads", &none);
        assert_eq!(col(&th, "thread_id"), [json!(1)]);
        // Summaries: SUM_CPU_TIME and COUNT_CANCELLED, globally and under
        // the thread that polled the task.
        for name in [
            "events_statements_summary_global_by_event_name",
            "events_statements_summary_by_thread_by_event_name",
        ] {
            let s = table(dir.path(), name, &none);
            assert_eq!(col(&s, "count_star"), [json!(4)], "{name}");
            assert_eq!(col(&s, "sum_cpu_time"), [json!(5_000_000)], "{name}");
            assert_eq!(col(&s, "count_cancelled"), [json!(1)], "{name}");
            assert_eq!(col(&s, "sum_errors"), [json!(0)], "{name}");
        }
        let s = table(
            dir.path(),
            "events_statements_summary_by_thread_by_event_name",
            &none,
        );
        assert_eq!(col(&s, "thread_id"), [json!(1)]);
    }

    #[test]
    fn truncating_setup_actors_removes_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, w, _q, _slot) = segment(dir.path());
        for user in ["app", "batch"] {
            pfs_shm_layout::setup::set_actor(w.segment(), "%", user, "%", Some((None, None)))
                .unwrap();
        }
        let none = Baselines::default();
        assert!(table(dir.path(), "setup_actors", &none).rows.len() >= 2);
        let mut b = Baselines::default();
        truncate(dir.path(), "setup_actors", &mut b);
        assert!(table(dir.path(), "setup_actors", &none).rows.is_empty());
        assert!(b.is_empty(), "no baselines: the rows are gone");
    }

    /// A table of live processes only shows nothing of a dead one, and a
    /// filter that matches only the dead one says so; the others show it
    /// and say nothing.
    #[test]
    fn live_only_tables_leave_dead_processes_out_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let (_live, _w, _q, _slot) = segment(dir.path());
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..SegmentConfig::default()
        };
        let (_dead, w) = segment_at(&dir.path().join("svc.8.pfs"), &cfg, 8, false);
        let q = statement_class(&w, "q");
        let slot = w.alloc_thread(1, 80, "dead-worker").unwrap().index;
        statement(&w, slot, q, (1, 1), 5_000_000, cpu(0));
        let s = snap(dir.path());
        assert!(s.segments.iter().any(|v| !v.live) && s.segments.iter().any(|v| v.live));
        let dead = Filter {
            service: None,
            pid: Some(8),
        };
        let b = Baselines::default();
        for t in registry() {
            let rows = build(&**t, &s, &dead, &b).rows.len();
            let warning = unmatched(&**t, &s, &dead, Spelling::Query);
            if t.live_only() {
                assert_eq!(rows, 0, "{} shows a dead process", t.name());
                let w = warning.unwrap_or_else(|| panic!("{}: no warning", t.name()));
                assert!(
                    w.starts_with("no live process matches pid=8")
                        && w.contains("(pid 9)")
                        && w.contains("1 exited process(es) match"),
                    "{}: {w}",
                    t.name()
                );
            } else {
                assert_eq!(warning, None, "{}", t.name());
            }
        }
        assert!(
            build(
                lookup("events_statements_summary_global_by_event_name").unwrap(),
                &s,
                &dead,
                &b
            )
            .rows
            .iter()
            .any(|r| r.iter().any(|v| v == &json!("statement/t/q"))),
            "a dead process's totals stay in the global summaries"
        );
    }

    #[test]
    fn truncating_setup_actors_says_which_processes_it_could_not_change() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, _w, _q, _slot) = segment(dir.path());
        let s = snap(dir.path());
        assert!(s.segments.iter().any(|v| v.live));
        // The file goes between the snapshot and the TRUNCATE.
        std::fs::remove_file(dir.path().join("svc.9.pfs")).unwrap();
        let unreached = lookup("setup_actors")
            .unwrap()
            .truncate(&mut Baselines::default(), &s)
            .unwrap();
        assert_eq!(unreached.len(), 1, "{unreached:?}");
        assert!(unreached[0].contains("svc.9.pfs"), "{unreached:?}");
        let events = lookup("events_waits_history")
            .unwrap()
            .truncate(&mut Baselines::default(), &s)
            .unwrap();
        assert!(events.is_empty(), "baselines reach every process");
    }

    #[test]
    fn truncating_global_memory_resets_the_own_rows_watermarks_too() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, _w, _q, _slot) = segment(dir.path());
        let mut b = Baselines::default();
        truncate(dir.path(), "memory_summary_global_by_event_name", &mut b);
        let t = table(dir.path(), "memory_summary_global_by_event_name", &b);
        let names = col(&t, "event_name");
        let i = names
            .iter()
            .position(|n| n == "memory/performance_schema/segment_fixed_sections")
            .unwrap();
        let v = |c: &str| col(&t, c)[i].clone();
        // The manual: ALLOC and FREE drop by the smaller (0): CURRENT stays.
        assert_eq!(v("count_alloc"), json!(1));
        assert_eq!(v("current_count_used"), json!(1));
        assert_eq!(v("low_count_used"), json!(1), "LOW = CURRENT at TRUNCATE");
        assert_eq!(v("high_count_used"), json!(1));
        assert_eq!(
            v("low_number_of_bytes_used"),
            v("current_number_of_bytes_used")
        );
    }

    #[test]
    fn memory_instruments_have_no_timed_flag() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, w, _q, _slot) = segment(dir.path());
        w.register_class(
            "memory/t/buf",
            pfs_shm_layout::ClassKind::Memory,
            pfs_shm_layout::layout::FLAG_ENABLED,
        )
        .unwrap();
        let t = table(dir.path(), "setup_instruments", &Baselines::default());
        let names = col(&t, "name");
        let timed = col(&t, "timed");
        let of = |n: &str| timed[names.iter().position(|x| x == n).unwrap()].clone();
        assert_eq!(of("memory/t/buf"), Value::Null);
        assert_eq!(of("statement/t/q"), json!("YES"));
    }

    #[test]
    fn a_new_process_under_a_truncated_ones_file_name_shows_its_own_figures() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = Baselines::default();
        {
            let (_f, _w, _q, _slot) = segment(dir.path());
            for name in [
                "events_statements_summary_global_by_event_name",
                "events_statements_history",
            ] {
                truncate(dir.path(), name, &mut b);
            }
            assert!(
                table(dir.path(), "events_statements_history", &b)
                    .rows
                    .is_empty()
            );
        }
        // The process is gone; another gets its pid, so its file name, and
        // runs two statements. (The creation time tells them apart.)
        std::fs::remove_file(dir.path().join("svc.9.pfs")).unwrap();
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..SegmentConfig::default()
        };
        let (_f, w) = crate::testing::segment_started_at(
            &dir.path().join("svc.9.pfs"),
            &cfg,
            9,
            true,
            1_700_000_000_000_000_000,
        );
        let q = statement_class(&w, "q");
        let slot = w.alloc_thread(1, 100, "worker-1").unwrap().index;
        statement(&w, slot, q, (1, 1), 5_000_000, cpu(0));
        statement(&w, slot, q, (1, 2), 1_000_000, cpu(0));
        let g = table(
            dir.path(),
            "events_statements_summary_global_by_event_name",
            &b,
        );
        assert_eq!(col(&g, "count_star"), [json!(2)]);
        assert_eq!(col(&g, "sum_timer_wait"), [json!(6_000_000)]);
        let h = table(dir.path(), "events_statements_history", &b);
        assert_eq!(ids(&h), [(1, 1), (1, 2)]);
    }

    #[test]
    fn truncate_hides_each_logical_threads_events_wherever_they_end() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, w, q, slot) = segment(dir.path());
        let slot2 = w.alloc_thread(2, 200, "worker-2").unwrap().index;
        let mut b = Baselines::default();
        let current_before = ids(&table(dir.path(), "events_statements_current", &b));
        assert!(!current_before.is_empty());
        truncate(dir.path(), "events_statements_history", &mut b);
        assert!(
            table(dir.path(), "events_statements_history", &b)
                .rows
                .is_empty()
        );
        // Each table truncates on its own, as in MySQL.
        assert_eq!(
            ids(&table(dir.path(), "events_statements_current", &b)),
            current_before,
            "truncating the history left the current table whole"
        );
        truncate(dir.path(), "events_statements_current", &mut b);
        assert!(
            table(dir.path(), "events_statements_current", &b)
                .rows
                .is_empty()
        );
        // Thread 1's next statement, a new task's first (ids from 1 again),
        // thread 2's own; task 7's statement 3 (running at TRUNCATE) ends
        // on thread 2, then its statement 4 runs there.
        statement(&w, slot, q, (1, 3), 1_000, cpu(0));
        statement(&w, slot, q, (9, 1), 1_000, cpu(500));
        statement(&w, slot2, q, (2, 1), 1_000, cpu(0));
        statement(&w, slot2, q, (TASK, 3), 1_000, cpu(700));
        statement(&w, slot2, q, (TASK, 4), 1_000, cancelled(100));
        // Records in any order.
        let sorted = |t: Table| {
            let mut v = ids(&t);
            v.sort_unstable();
            v
        };
        let want = [(1, 3), (2, 1), (TASK, 4), (9, 1)];
        assert_eq!(
            sorted(table(dir.path(), "events_statements_history", &b)),
            want
        );
        assert_eq!(
            sorted(table(dir.path(), "events_statements_current", &b)),
            [(TASK, 4), (9, 1)]
        );
        // The same after an agent restart (the baselines file).
        b.save(dir.path()).unwrap();
        let back = Baselines::load(dir.path(), false);
        assert_eq!(
            sorted(table(dir.path(), "events_statements_history", &back)),
            want
        );
        // Other kinds were not truncated; summaries neither.
        let s = table(
            dir.path(),
            "events_statements_summary_global_by_event_name",
            &back,
        );
        assert_eq!(col(&s, "count_star"), [json!(9)]);
    }

    #[test]
    fn truncating_statement_summaries_restarts_cpu_time_and_cancellations() {
        let dir = tempfile::tempdir().unwrap();
        let (_f, w, q, slot) = segment(dir.path());
        let mut b = Baselines::default();
        truncate(
            dir.path(),
            "events_statements_summary_global_by_event_name",
            &mut b,
        );
        statement(&w, slot, q, (TASK, 3), 4_000_000, cancelled(1_500_000));
        for name in [
            "events_statements_summary_global_by_event_name",
            "events_statements_summary_by_thread_by_event_name",
        ] {
            let s = table(dir.path(), name, &b);
            assert_eq!(col(&s, "count_star"), [json!(1)], "{name}");
            assert_eq!(col(&s, "sum_cpu_time"), [json!(1_500_000)], "{name}");
            assert_eq!(col(&s, "count_cancelled"), [json!(1)], "{name}");
            // Untruncated: lifetime values.
            let s = table(dir.path(), name, &Baselines::default());
            assert_eq!(col(&s, "sum_cpu_time"), [json!(6_500_000)], "{name}");
            assert_eq!(col(&s, "count_cancelled"), [json!(2)], "{name}");
        }
    }
}
