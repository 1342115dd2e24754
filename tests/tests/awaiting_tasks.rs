//! Requests of an async service that wait, seen from outside the way an
//! operator meets them: a real process (`pfs-test-writer awaiting`) whose
//! tokio tasks each hold a statement and a stage and wait for a pool, read
//! by the real `pfs-agent` (`query` and `serve`'s HTTP tables). While they
//! wait, `events_statements_current` shows every request once, running,
//! with its text; `events_stages_current` its stage nested in it, and
//! `events_waits_current` the wait for the pool nested in the stage, its
//! time so far growing. Once they end, none is shown running, and TRUNCATE
//! of a current table hides the requests waiting at that moment.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use pfs_tests::{Agent, Writer, agent_bin, rows, str_col, u64_col, writer_exe};
use serde_json::Value;

const TASKS: usize = 30;

fn query(dir: &std::path::Path, table: &str) -> Value {
    let out = Command::new(agent_bin())
        .args(["query", table, "--format", "json", "--shm-dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pfs-agent query {table}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The rows of `table` still running (`END_EVENT_ID` NULL) of the tasks
/// in `tids`, by `THREAD_ID`; each task at most once.
fn running<'a>(table: &'a Value, tids: &BTreeSet<u64>) -> BTreeMap<u64, &'a Value> {
    let mut out = BTreeMap::new();
    for r in rows(table).unwrap() {
        let tid = u64_col(r, "thread_id").unwrap();
        if tids.contains(&tid) && r["end_event_id"].is_null() {
            assert!(
                out.insert(tid, r).is_none(),
                "task {tid} shown twice: {table}"
            );
        }
    }
    out
}

#[test]
fn waiting_requests_are_in_the_current_tables_until_they_end() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "awaiting",
            "--shm-dir",
            d,
            "--service",
            "orders",
            "--tasks",
            &TASKS.to_string(),
        ],
    )
    .unwrap();
    let ready = w.read_json(Duration::from_secs(60)).unwrap();
    let texts: BTreeMap<u64, String> = ready["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["thread_id"].as_u64().unwrap(),
                t["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let tids: BTreeSet<u64> = texts.keys().copied().collect();
    assert_eq!(tids.len(), TASKS);

    // Every task parks when its first poll returns, just after it said
    // its id: poll the CLI until all are shown.
    let statements = pfs_tests::poll(Duration::from_secs(20), || {
        let t = query(dir.path(), "events_statements_current");
        Ok((running(&t, &tids).len() == TASKS).then_some(t))
    })
    .unwrap();
    let stages = query(dir.path(), "events_stages_current");
    let waits = query(dir.path(), "events_waits_current");
    let (st, sg, wt) = (
        running(&statements, &tids),
        running(&stages, &tids),
        running(&waits, &tids),
    );
    assert_eq!((sg.len(), wt.len()), (TASKS, TASKS));
    for tid in &tids {
        let (s, g, w) = (st[tid], sg[tid], wt[tid]);
        assert_eq!(str_col(s, "event_name").unwrap(), "statement/test/request");
        assert_eq!(str_col(s, "sql_text").unwrap(), texts[tid]);
        assert!(u64_col(s, "timer_wait").unwrap() > 0, "time so far: {s}");
        assert_eq!(str_col(g, "event_name").unwrap(), "stage/test/backend");
        assert_eq!(
            u64_col(g, "nesting_event_id").unwrap(),
            u64_col(s, "event_id").unwrap()
        );
        assert_eq!(
            str_col(w, "event_name").unwrap(),
            "wait/synch/mutex/test/pool"
        );
        assert_eq!(str_col(w, "operation").unwrap(), "lock");
        assert_eq!(u64_col(w, "object_instance_begin").unwrap(), 0x5000);
        assert_eq!(
            u64_col(w, "nesting_event_id").unwrap(),
            u64_col(g, "event_id").unwrap()
        );
        assert_eq!(str_col(w, "nesting_event_type").unwrap(), "STAGE");
    }

    // The same through `serve`'s HTTP tables, and the wait's time so far
    // grows while it waits.
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, "tok\n").unwrap();
    let env = [(
        "PFS_CONTROL_TOKEN_FILE",
        token_file.to_string_lossy().into_owned(),
    )];
    let agent = Agent::serve_with_env(dir.path(), &env).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let later = agent.table("events_waits_current").unwrap();
    let later = running(&later, &tids);
    assert_eq!(later.len(), TASKS);
    for tid in &tids {
        assert!(
            u64_col(later[tid], "timer_wait").unwrap() > u64_col(wt[tid], "timer_wait").unwrap(),
            "task {tid}'s wait does not grow"
        );
    }
    let http = agent.table("events_statements_current").unwrap();
    assert_eq!(running(&http, &tids).len(), TASKS);

    // TRUNCATE hides the requests waiting now, in that table only.
    let r = ureq::post(&format!(
        "{}/api/v1/tables/events_statements_current/truncate",
        agent.base
    ))
    .header("Authorization", "Bearer tok")
    .send_empty()
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let after = agent.table("events_statements_current").unwrap();
    assert_eq!(running(&after, &tids).len(), 0, "truncated: {after}");
    let stages = agent.table("events_stages_current").unwrap();
    assert_eq!(running(&stages, &tids).len(), TASKS);

    // Released: every request ends, none is shown running.
    w.send_line("release").unwrap();
    let released = w.read_json(Duration::from_secs(30)).unwrap();
    assert_eq!(released["released"], true);
    for table in [
        "events_statements_current",
        "events_stages_current",
        "events_waits_current",
    ] {
        let t = query(dir.path(), table);
        assert_eq!(running(&t, &tids).len(), 0, "{table} after the end: {t}");
    }
    w.finish(Duration::from_secs(10)).unwrap();
}
