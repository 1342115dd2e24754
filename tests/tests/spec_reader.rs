//! The segment specification is enough to read a segment: the reader
//! written from it alone, `tests/spec_reader/pfs_read.py` (Python standard
//! library), agrees with `pfs-agent query
//! events_waits_summary_global_by_event_name --format json`:
//!
//! * exactly, on a segment whose writer is stopped (SIGSTOP) with live
//!   threads and threads that exited (folded totals), and with the counts
//!   the writer itself reports;
//! * within bounds, on a live segment being written: read between two
//!   agent queries, its counts lie between theirs (its sequence checks and
//!   retries hold up against a writer).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pfs_tests::{TEST_CLASSES, Writer, agent_bin, spawn_exact, workspace_root, writer_exe};
use serde_json::{Value, json};

/// The columns both readers give.
const COLUMNS: [&str; 5] = [
    "event_name",
    "count_star",
    "sum_timer_wait",
    "min_timer_wait",
    "max_timer_wait",
];

/// Keeps `COLUMNS` of each row and sorts by event name.
fn normalise(rows: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = rows
        .iter()
        .map(|r| {
            let m: serde_json::Map<String, Value> = COLUMNS
                .iter()
                .map(|c| (c.to_string(), r[*c].clone()))
                .collect();
            Value::Object(m)
        })
        .collect();
    out.sort_by(|a, b| a["event_name"].as_str().cmp(&b["event_name"].as_str()));
    out
}

/// `pfs_read.py SEGMENT`'s rows.
fn spec_reader(segment: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/spec_reader/pfs_read.py"))
        .arg(segment)
        .output()
        .expect("run python3");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pfs_read.py failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("pfs_read.py prints JSON");
    normalise(v.as_array().expect("a JSON list"))
}

/// `pfs-agent query events_waits_summary_global_by_event_name --format
/// json`'s rows for process `pid`.
fn agent_query(dir: &Path, pid: u32) -> Vec<Value> {
    let out = Command::new(agent_bin())
        .args(["query", "events_waits_summary_global_by_event_name"])
        .args(["--format", "json", "--pid", &pid.to_string(), "--shm-dir"])
        .arg(dir)
        .output()
        .expect("run pfs-agent query");
    assert!(
        out.status.success(),
        "pfs-agent query failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("query prints JSON");
    let rows = v["rows"].as_array().expect("a rows array");
    assert!(rows.iter().all(|r| r["pid"] == pid), "{v}");
    normalise(rows)
}

/// The `count_star` of `name` in `rows`.
fn count(rows: &[Value], name: &str) -> u64 {
    rows.iter()
        .find(|r| r["event_name"] == name)
        .and_then(|r| r["count_star"].as_u64())
        .unwrap_or_else(|| panic!("no {name} in {rows:?}"))
}

#[test]
fn the_spec_reader_equals_the_agent_on_a_stopped_writer() {
    let dir = tempfile::tempdir().unwrap();
    // 4 threads × 300 waits per class; 2 exit (folded), 2 stay alive.
    let (mut w, ready) = spawn_exact(writer_exe!(), dir.path(), "spec-exact", 4, 300, 2).unwrap();
    let segment = w.segment_in(dir.path(), "spec-exact");
    w.guard.signal(libc::SIGSTOP);

    let ours = spec_reader(&segment);
    let agent = agent_query(dir.path(), w.guard.pid());
    assert_eq!(
        ours,
        agent,
        "pfs_read.py (left) and pfs-agent query (right) differ:\n{}\n{}",
        serde_json::to_string_pretty(&ours).unwrap(),
        serde_json::to_string_pretty(&agent).unwrap()
    );
    for name in TEST_CLASSES {
        let want = &ready["classes"][name];
        let row = ours.iter().find(|r| r["event_name"] == name).unwrap();
        assert_eq!(row["count_star"], want["count"], "{name}");
        assert_eq!(row["sum_timer_wait"], want["sum_ps"], "{name}");
    }
    let mut names: Vec<Value> = TEST_CLASSES.iter().map(|n| json!(n)).collect();
    names.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
    assert_eq!(
        ours.iter()
            .map(|r| r["event_name"].clone())
            .collect::<Vec<_>>(),
        names,
        "one row per wait class, nothing else"
    );

    w.guard.signal(libc::SIGCONT);
    w.finish(Duration::from_secs(20)).unwrap();
}

#[test]
fn the_spec_reader_reads_a_live_segment_consistently() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "loop",
            "--shm-dir",
            d,
            "--service",
            "spec-live",
            "--threads",
            "2",
        ],
    )
    .unwrap();
    let ready = w.read_json(Duration::from_secs(30)).unwrap();
    assert_eq!(ready["ready"], true, "{ready}");
    let segment = w.segment_in(dir.path(), "spec-live");
    let pid = w.guard.pid();
    let a = TEST_CLASSES[0];
    let mut last = 0;
    for _ in 0..5 {
        let before = count(&agent_query(dir.path(), pid), a);
        let ours = count(&spec_reader(&segment), a);
        let after = count(&agent_query(dir.path(), pid), a);
        assert!(
            before <= ours && ours <= after,
            "{a}: agent {before}, then pfs_read.py {ours}, then agent {after}"
        );
        assert!(ours >= last, "counts never go down: {last} then {ours}");
        last = ours;
    }
    assert!(last > 0, "the writer wrote");
    w.finish(Duration::from_secs(20)).unwrap();
}
