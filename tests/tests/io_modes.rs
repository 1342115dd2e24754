//! A file's and a socket's waits by mode, the way an operator meets them:
//! a real process (`pfs-test-writer io`) does real file I/O (create,
//! appends, `fsync`, seek, read back, `stat`, close) and real loopback
//! TCP (connect, send, recv, close) through the client's drop-ins, and
//! the real `pfs-agent` shows them split into reads, writes and the rest,
//! exactly as the process counted them, in `file_summary_by_event_name`,
//! `socket_summary_by_event_name`, `pfs_events_waits_io_*` on `/metrics`
//! and `query`, and `pfs.events.waits.io*` pushed to a real OTLP
//! receiver; the modes add up to the instrument's `COUNT_STAR`, and
//! their times to its `SUM_TIMER_WAIT` (each within a nanosecond); a
//! `TRUNCATE` of the file table restarts it and those instruments' rows
//! of the waits' global summary, and nothing else. A baseline that an
//! agent older than layout 8.1 rewrote (no modes) shows the instrument's
//! totals and zeros by mode.

use std::process::Command;

use pfs_tests::{
    Agent, OtlpReceiver, Sample, Writer, agent_bin, free_port, otlp_metrics, rows, sample, str_col,
    u64_col, u128_col, writer_exe,
};
use serde_json::Value;

const SERVICE: &str = "io-svc";
const ROUNDS: u64 = 7;
const WAL: &str = "wait/io/file/test/wal";
const CONN: &str = "wait/io/socket/test/conn";
const MODES: [&str; 3] = ["read", "write", "misc"];

/// The row of `table` for instrument `name` of the test's service.
fn row(agent: &Agent, table: &str, name: &str) -> Value {
    let t = agent.table(&format!("{table}?service={SERVICE}")).unwrap();
    let found: Vec<&Value> = rows(&t)
        .unwrap()
        .iter()
        .filter(|r| r["event_name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{table}: one row for {name}: {t}");
    found[0].clone()
}

/// Checks an I/O summary row against what the writer did (`want`:
/// `{"count":[r,w,m],"bytes":[r,w]}`).
fn check_row(r: &Value, want: &Value, name: &str) {
    let count = |i: usize| want["count"][i].as_u64().unwrap();
    let mut total = 0;
    let mut timed_ps = 0u128;
    for (i, m) in MODES.iter().enumerate() {
        let n = u64_col(r, &format!("count_{m}")).unwrap();
        assert_eq!(n, count(i), "{name} count_{m}: {r}");
        assert!(n > 0, "{name}: the writer did some {m}");
        total += n;
        let sum = u128_col(r, &format!("sum_timer_{m}")).unwrap();
        assert!(sum > 0, "{name} sum_timer_{m}: {r}");
        assert_eq!(sum % 1000, 0, "{name}: kept in ns");
        let avg = u128::from(u64_col(r, &format!("avg_timer_{m}")).unwrap());
        assert_eq!(avg, sum / u128::from(n), "{name} avg_timer_{m}");
        timed_ps += sum;
        if i < 2 {
            assert_eq!(
                u64_col(r, &format!("sum_number_of_bytes_{m}")).unwrap(),
                want["bytes"][i].as_u64().unwrap(),
                "{name} sum_number_of_bytes_{m}"
            );
        } else {
            assert!(r.get("sum_number_of_bytes_misc").is_none(), "{r}");
        }
    }
    // As in MySQL, the table's COUNT_STAR and SUM_TIMER_WAIT are its
    // modes' sums (the modes' times kept in whole ns: within 1 ns a wait,
    // SUM_TIMER_WAIT being the instrument's, to the ps, so MIN <= AVG).
    assert_eq!(
        u64_col(r, "count_star").unwrap(),
        total,
        "{name}: the modes add up"
    );
    let sum = u128_col(r, "sum_timer_wait").unwrap();
    assert!(
        sum >= timed_ps && sum - timed_ps < u128::from(total) * 1000,
        "{name}: sum_timer_wait {sum} vs the modes' {timed_ps}"
    );
    assert!(u64_col(r, "min_timer_wait").unwrap() <= u64_col(r, "avg_timer_wait").unwrap());
}

/// `TRUNCATE` of `table` through the API, with the test's control token.
fn truncate(agent: &Agent, table: &str) {
    let r = ureq::post(&format!("{}/api/v1/tables/{table}/truncate", agent.base))
        .header("Authorization", "Bearer tok")
        .send_empty()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "TRUNCATE {table}");
}

fn metric(m: &[Sample], name: &str, event: &str, mode: &str) -> f64 {
    sample(
        m,
        name,
        &[("service", SERVICE), ("event_name", event), ("mode", mode)],
    )
    .unwrap()
}

#[test]
fn file_and_socket_waits_are_split_by_mode_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "io",
            "--shm-dir",
            d,
            "--service",
            SERVICE,
            "--rounds",
            &ROUNDS.to_string(),
        ],
    )
    .unwrap();
    let ready = w.read_json(std::time::Duration::from_secs(60)).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "tok\n").unwrap();
    // An OTLP receiver that is not our code (`tests/otlp_receiver.py`).
    let port = free_port();
    let mut receiver = OtlpReceiver::start(None, Some(port)).unwrap();
    let env = [
        (
            "PFS_CONTROL_TOKEN_FILE",
            token.to_string_lossy().into_owned(),
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
    ];
    let agent = Agent::serve_with_env(dir.path(), &env).unwrap();

    let file = row(&agent, "file_summary_by_event_name", WAL);
    check_row(&file, &ready["classes"][WAL], WAL);
    // Every round syncs once; the WAL's misc waits are its creates, opens,
    // syncs, seeks, stats and closes: 7 a round.
    assert_eq!(u64_col(&file, "count_misc").unwrap(), 7 * ROUNDS);
    let sock = row(&agent, "socket_summary_by_event_name", CONN);
    check_row(&sock, &ready["classes"][CONN], CONN);
    assert_eq!(str_col(&sock, "service").unwrap(), SERVICE);
    // Each table has its own kind only.
    let files = agent.table("file_summary_by_event_name").unwrap();
    assert!(rows(&files).unwrap().iter().all(|r| {
        str_col(r, "event_name")
            .unwrap()
            .starts_with("wait/io/file/")
    }));

    // The same rows as the waits' global summary.
    for (name, r) in [(WAL, &file), (CONN, &sock)] {
        let g = row(&agent, "events_waits_summary_global_by_event_name", name);
        for c in ["count_star", "min_timer_wait", "max_timer_wait"] {
            assert_eq!(g[c], r[c], "{name} {c}");
        }
        // Every wait has a mode: the same SUM_TIMER_WAIT, to the ps.
        assert_eq!(g["sum_timer_wait"], r["sum_timer_wait"], "{name}");
        let moved = u64_col(r, "sum_number_of_bytes_read").unwrap()
            + u64_col(r, "sum_number_of_bytes_write").unwrap();
        assert_eq!(u64_col(&g, "sum_number_of_bytes").unwrap(), moved);
    }

    // /metrics: the same figures by `mode`.
    let m = agent.metrics().unwrap();
    for (name, r) in [(WAL, &file), (CONN, &sock)] {
        for mode in MODES {
            let n = metric(&m, "pfs_events_waits_io_total", name, mode);
            assert_eq!(n, u64_col(r, &format!("count_{mode}")).unwrap() as f64);
            let secs = metric(&m, "pfs_events_waits_io_seconds_total", name, mode);
            let want = u128_col(r, &format!("sum_timer_{mode}")).unwrap() as f64 / 1e12;
            assert!(
                (secs - want).abs() <= want * 1e-9,
                "{name} {mode}: {secs} vs {want}"
            );
        }
        for mode in ["read", "write"] {
            let b = metric(&m, "pfs_events_waits_io_bytes_total", name, mode);
            let want = u64_col(r, &format!("sum_number_of_bytes_{mode}")).unwrap();
            assert_eq!(b, want as f64, "{name} {mode} bytes");
        }
        assert!(
            sample(
                &m,
                "pfs_events_waits_io_bytes_total",
                &[("event_name", name), ("mode", "misc")]
            )
            .is_err(),
            "misc operations move no bytes"
        );
    }
    // Only file and socket instruments have series by mode (every one,
    // from its first scrape: the writer's unused `wait/io/file/test/c`
    // too, at 0); its mutex and rwlock none.
    let by_mode: Vec<&Sample> = m
        .iter()
        .filter(|s| s.name.starts_with("pfs_events_waits_io_"))
        .collect();
    for s in &by_mode {
        let name = &s.labels["event_name"];
        assert!(name.starts_with("wait/io/"), "{s:?}");
    }
    let unused = [("event_name", "wait/io/file/test/c"), ("mode", "write")];
    assert_eq!(
        sample(&m, "pfs_events_waits_io_total", &unused).unwrap(),
        0.0
    );

    // OTLP: the same figures, `pfs.events.waits.io*` with a `mode`
    // attribute, as /metrics has them.
    let io_point = |req: &Value, metric: &str, name: &str, mode: &str| -> Option<f64> {
        otlp_metrics(req, metric).iter().find_map(|(_, m)| {
            m["points"].as_array()?.iter().find_map(|p| {
                (p["attributes"]["event_name"] == name && p["attributes"]["mode"] == mode)
                    .then(|| p["value"].as_f64())
                    .flatten()
            })
        })
    };
    let want_reads = u64_col(&file, "count_read").unwrap() as f64;
    let req = receiver
        .wait_for(std::time::Duration::from_secs(20), |req| {
            io_point(req, "pfs.events.waits.io", WAL, "read") == Some(want_reads)
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    for name in [WAL, CONN] {
        for mode in MODES {
            for (otlp, prom) in [
                ("pfs.events.waits.io", "pfs_events_waits_io_total"),
                (
                    "pfs.events.waits.io.seconds",
                    "pfs_events_waits_io_seconds_total",
                ),
            ] {
                let want = metric(&m, prom, name, mode);
                let got = io_point(&req, otlp, name, mode).unwrap();
                assert!(
                    (got - want).abs() <= want * 1e-9,
                    "{otlp} {name} {mode}: {got} vs {want}"
                );
            }
        }
        for mode in ["read", "write"] {
            assert_eq!(
                io_point(&req, "pfs.events.waits.io.bytes", name, mode),
                Some(metric(&m, "pfs_events_waits_io_bytes_total", name, mode)),
                "{name} {mode} bytes"
            );
        }
        assert_eq!(
            io_point(&req, "pfs.events.waits.io.bytes", name, "misc"),
            None
        );
    }

    // `query` prints the table with its times formatted.
    let query = |extra: &[&str]| -> String {
        let out = Command::new(agent_bin())
            .args(["query", "file_summary_by_event_name", "--shm-dir", d])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = query(&[]);
    assert!(
        text.contains(WAL) && text.contains("AVG_TIMER_MISC"),
        "{text}"
    );
    // `--format vertical`: a column per line, as MySQL's `\G`.
    let only_wal = format!("event_name={WAL}");
    let text = query(&[
        "--format",
        "vertical",
        "--human-times",
        "--where",
        &only_wal,
    ]);
    assert!(
        text.starts_with("*************************** 1. row ***"),
        "{text}"
    );
    assert!(
        text.contains(&format!("               EVENT_NAME: {WAL}\n")),
        "{text}"
    );
    let line = |col: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{col}: ")))
            .unwrap_or_else(|| panic!("no {col} in {text}"))
            .trim()
            .to_string()
    };
    assert_eq!(line("COUNT_MISC"), format!("COUNT_MISC: {}", 7 * ROUNDS));
    let avg = line("AVG_TIMER_MISC");
    assert!(
        [" ns", " us", " ms", " s"].iter().any(|u| avg.ends_with(u)),
        "{avg}"
    );
    assert!(text.ends_with("\n1 row in set\n"), "{text}");
    // As a DBA types it: the table with its schema, in capitals; values
    // compared as MySQL's `=` does (text regardless of case, numbers by
    // value); spaces in the column list.
    let out = Command::new(agent_bin())
        .args(["query", "PERFORMANCE_SCHEMA.FILE_SUMMARY_BY_EVENT_NAME"])
        .args(["--shm-dir", d, "--format", "json"])
        .args(["--where", &format!("EVENT_NAME={}", WAL.to_uppercase())])
        .args(["--where", &format!("count_misc={}.000", 7 * ROUNDS)])
        .args(["--columns", "event_name, count_misc"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        t["columns"],
        serde_json::json!(["event_name", "count_misc"])
    );
    assert_eq!(
        t["rows"],
        serde_json::json!([{"event_name": WAL, "count_misc": 7 * ROUNDS}])
    );

    // TRUNCATE of the file table restarts it and its instruments' rows
    // of the waits' global summary (one baseline per instrument), and
    // nothing else: not the socket table, not the by-thread summary;
    // /metrics is never truncated.
    let by_thread = |agent: &Agent| -> u64 {
        let t = agent
            .table(&format!(
                "events_waits_summary_by_thread_by_event_name?service={SERVICE}"
            ))
            .unwrap();
        rows(&t)
            .unwrap()
            .iter()
            .filter(|r| r["event_name"] == WAL)
            .map(|r| u64_col(r, "count_star").unwrap())
            .sum()
    };
    let wal_by_thread = by_thread(&agent);
    assert!(wal_by_thread > 0);
    truncate(&agent, "file_summary_by_event_name");
    let after = row(&agent, "file_summary_by_event_name", WAL);
    for c in [
        "count_star",
        "count_read",
        "count_write",
        "count_misc",
        "sum_timer_misc",
    ] {
        assert_eq!(
            u64_col(&after, c).unwrap(),
            0,
            "{c} after TRUNCATE: {after}"
        );
    }
    let g = row(&agent, "events_waits_summary_global_by_event_name", WAL);
    assert_eq!(u64_col(&g, "count_star").unwrap(), 0);
    let s2 = row(&agent, "socket_summary_by_event_name", CONN);
    assert_eq!(
        s2["count_star"], sock["count_star"],
        "the socket table stays"
    );
    let g = row(&agent, "events_waits_summary_global_by_event_name", CONN);
    assert_eq!(g["count_star"], sock["count_star"]);
    assert_eq!(
        by_thread(&agent),
        wal_by_thread,
        "the by-thread summary stays"
    );
    let m = agent.metrics().unwrap();
    assert_eq!(
        metric(&m, "pfs_events_waits_io_total", WAL, "misc"),
        (7 * ROUNDS) as f64
    );
    w.send_line("").unwrap();
    w.finish(std::time::Duration::from_secs(30)).unwrap();
}

/// Removes every `io` member from the JSON value `v`, as an agent older
/// than layout 8.1 does when it saves a file of the agent's (it keeps no
/// figures by mode).
fn strip_io(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("io");
            m.values_mut().for_each(strip_io);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_io),
        _ => {}
    }
}

/// A `TRUNCATE` baseline that an agent older than layout 8.1 rewrote has
/// no figures by mode (an older agent's `TRUNCATE` of any table rewrites
/// every baseline): the I/O tables' rows then show the instrument's
/// totals since the baseline, as the waits' global summary does, and
/// zeros by mode, not the modes since the process started under a
/// `COUNT_STAR` of their own.
#[test]
fn a_baseline_without_modes_shows_the_instruments_totals() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut w = Writer::spawn(
        writer_exe!(),
        &["io", "--shm-dir", d, "--service", SERVICE, "--rounds", "2"],
    )
    .unwrap();
    w.read_json(std::time::Duration::from_secs(60)).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "tok\n").unwrap();
    let env = [(
        "PFS_CONTROL_TOKEN_FILE",
        token.to_string_lossy().into_owned(),
    )];
    let agent = Agent::serve_with_env(dir.path(), &env).unwrap();
    assert!(
        u64_col(
            &row(&agent, "file_summary_by_event_name", WAL),
            "count_read"
        )
        .unwrap()
            > 0
    );
    truncate(&agent, "file_summary_by_event_name");
    drop(agent);
    // The baselines as an older agent saves them.
    let file = dir.path().join(".pfs-agent-truncate.json");
    let mut baselines: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(baselines.to_string().contains("\"io\""), "{baselines}");
    strip_io(&mut baselines);
    std::fs::write(&file, serde_json::to_vec(&baselines).unwrap()).unwrap();

    let agent = Agent::serve_with_env(dir.path(), &env).unwrap();
    let g = row(&agent, "events_waits_summary_global_by_event_name", WAL);
    let r = row(&agent, "file_summary_by_event_name", WAL);
    assert_eq!(u64_col(&g, "count_star").unwrap(), 0, "{g}");
    for c in ["count_star", "count_read", "count_write", "count_misc"] {
        assert_eq!(u64_col(&r, c).unwrap(), 0, "{c}: {r}");
    }
    assert_eq!(u128_col(&r, "sum_timer_wait").unwrap(), 0, "{r}");
    w.send_line("").unwrap();
    w.finish(std::time::Duration::from_secs(30)).unwrap();
}
