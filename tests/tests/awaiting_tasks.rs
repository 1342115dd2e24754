//! Requests of an async service that wait, seen from outside the way an
//! operator meets them: a real process (`pfs-test-writer awaiting`) whose
//! tokio tasks each hold a statement and a stage and wait for a pool, read
//! by the real `pfs-agent` (`query` and `serve`'s HTTP tables). While they
//! wait, `events_statements_current` shows every request once, running,
//! with its text; `events_stages_current` its stage nested in it, and
//! `events_waits_current` the wait for the pool nested in the stage, its
//! time so far growing; `/metrics` counts them in `pfs_events_*_running`
//! with how long the longest has run. Once they end, none is shown
//! running (and they are counted as ended), and TRUNCATE of a current
//! table hides the requests waiting at that moment, in that table only.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use pfs_tests::{Agent, Sample, Writer, agent_bin, rows, sample, str_col, u64_col, writer_exe};
use serde_json::Value;

const TASKS: usize = 30;

fn query(dir: &std::path::Path, table: &str) -> Value {
    query_with(dir, table, &[])
}

/// `pfs-agent query TABLE --format json` with `extra` arguments.
fn query_with(dir: &std::path::Path, table: &str, extra: &[&str]) -> Value {
    let out = Command::new(agent_bin())
        .args(["query", table, "--format", "json"])
        .args(extra)
        .arg("--shm-dir")
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

const REQUEST: &str = "statement/test/request";

/// Checks that `pfs_events_*_running` of the request, its stage and its
/// wait is `n` each; returns their `..._running_longest_seconds` (0 when
/// none runs).
fn in_progress(m: &[Sample], n: f64) -> Vec<(&'static str, f64)> {
    let mut longest = Vec::new();
    for (kind, name) in [
        ("statements", REQUEST),
        ("stages", "stage/test/backend"),
        ("waits", "wait/synch/mutex/test/pool"),
    ] {
        let want = [("service", "orders"), ("event_name", name)];
        let family = format!("pfs_events_{kind}_running");
        assert_eq!(sample(m, &family, &want).unwrap(), n, "{family} of {name}");
        let age = sample(m, &format!("{family}_longest_seconds"), &want).unwrap();
        assert_eq!(
            age > 0.0,
            n > 0.0,
            "{family}_longest_seconds of {name}: {age}"
        );
        longest.push((name, age));
    }
    longest
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
    let spawned = Instant::now();
    let ready = w.read_json(Duration::from_secs(60)).unwrap();
    let started = Instant::now();
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
        assert_eq!(str_col(s, "event_name").unwrap(), REQUEST);
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

    // `query` as SQL: WHERE, ORDER BY, LIMIT and a column list.
    let top = query_with(
        dir.path(),
        "events_statements_current",
        &[
            "--where",
            "end_event_id=NULL",
            "--where",
            "event_name=statement/test/request",
            "--order-by",
            "TIMER_WAIT",
            "--desc",
            "--limit",
            "3",
            "--columns",
            "thread_id,timer_wait,sql_text",
        ],
    );
    assert_eq!(
        top["columns"],
        serde_json::json!(["thread_id", "timer_wait", "sql_text"])
    );
    let top = rows(&top).unwrap();
    assert_eq!(top.len(), 3);
    let waits: Vec<u64> = top
        .iter()
        .map(|r| u64_col(r, "timer_wait").unwrap())
        .collect();
    assert!(
        waits.windows(2).all(|w| w[0] >= w[1]),
        "longest first: {waits:?}"
    );
    for r in top {
        let tid = u64_col(r, "thread_id").unwrap();
        assert_eq!(str_col(r, "sql_text").unwrap(), texts[&tid], "{r}");
    }
    let out = Command::new(agent_bin())
        .args([
            "query",
            "events_statements_current",
            "--order-by",
            "nope",
            "--shm-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no column \"nope\"") && err.contains("sql_text"),
        "{err}"
    );

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

    // /metrics has them as in progress: every request, its stage and its
    // wait, and how long the longest has run (at least since the writer
    // said they had started, at most since it was spawned; the snapshot
    // may be up to its cache age old).
    let asked = started.elapsed().as_secs_f64();
    let m = agent.metrics().unwrap();
    let longest = in_progress(&m, TASKS as f64);
    let bound = spawned.elapsed().as_secs_f64();
    for (name, age) in &longest {
        assert!(
            *age >= asked - 0.3 && *age <= bound,
            "{name}: longest {age} s, not within [{asked} - 0.3, {bound}]"
        );
    }

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
    // (Not in /metrics: a TRUNCATE hides rows of that table only.)
    std::thread::sleep(Duration::from_millis(300)); // past the snapshot cache
    in_progress(&agent.metrics().unwrap(), TASKS as f64);

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
    std::thread::sleep(Duration::from_millis(300));
    let m = agent.metrics().unwrap();
    in_progress(&m, 0.0);
    assert_eq!(
        sample(
            &m,
            "pfs_events_statements_total",
            &[("event_name", REQUEST)]
        )
        .unwrap(),
        TASKS as f64,
        "ended, now counted"
    );
    w.finish(Duration::from_secs(10)).unwrap();
}
