//! Issue 4 across processes: nesting (statement → stage → wait), live
//! setup through the agent's control API (instruments, TIMED, consumers),
//! and the control API's refusals.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_shm_layout::{EventKind, Segment};
use pfs_tests::{Agent, ChildGuard, Writer, get_json, rows, u64_col, writer_exe};
use serde_json::{Value, json};

/// `pfs-agent serve` with extra arguments.
fn serve(dir: &Path, extra: &[&str]) -> Result<(ChildGuard, String)> {
    let Agent { guard, base } = Agent::serve_with_args(dir, extra)?;
    Ok((guard, base))
}

fn post(url: &str, token: Option<&str>, body: Value) -> Result<(u16, Value)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut req = agent.post(url).header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    let mut r = req
        .send(body.to_string())
        .with_context(|| format!("POST {url}"))?;
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string()?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

fn global_row(base: &str, event: &str) -> Result<Value> {
    let t = get_json(&format!(
        "{base}/api/v1/tables/events_waits_summary_global_by_event_name"
    ))?;
    rows(&t)?
        .iter()
        .find(|r| r["event_name"] == event)
        .cloned()
        .with_context(|| format!("no row for {event}"))
}

fn count(base: &str) -> Result<u64> {
    u64_col(&global_row(base, "wait/synch/mutex/test/a")?, "count_star")
}

/// A `pfs-test-writer loop` of `service` with `threads` threads in `dir`,
/// once it is ready.
fn loop_writer(dir: &str, service: &str, threads: &str) -> Result<Writer> {
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "loop",
            "--shm-dir",
            dir,
            "--service",
            service,
            "--threads",
            threads,
        ],
    )?;
    w.read_json(Duration::from_secs(20))?;
    Ok(w)
}

/// `pfs-agent` run with `args`, to its end.
fn agent_cli(args: &[&str]) -> Result<std::process::Output> {
    Ok(std::process::Command::new(pfs_tests::agent_bin())
        .args(args)
        .output()?)
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("timed out waiting for {what}")
}

#[test]
fn nesting_is_consistent_across_processes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "nested",
            "--shm-dir",
            d,
            "--service",
            "nest",
            "--threads",
            "3",
            "--statements",
            "40",
            "--history",
            "256",
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    let seg = Segment::open(
        std::fs::File::open(ready["segment"].as_str().unwrap())?,
        false,
    )?;
    let s = snapshot(&seg, &ReadOptions::default())?;
    let name = |c: u32| {
        s.classes
            .iter()
            .find(|x| x.index == c)
            .map(|x| x.name.clone())
            .unwrap_or_default()
    };
    let mut checked = (0, 0, 0);
    for t in s.threads.iter().filter(|t| t.name.starts_with("nested-")) {
        let stmts: HashMap<u64, _> = t
            .statements_history
            .iter()
            .map(|e| (e.ev.event_id, e))
            .collect();
        let stages: HashMap<u64, _> = t.stages_history.iter().map(|e| (e.event_id, e)).collect();
        assert_eq!(
            stmts.len(),
            40,
            "all statements of thread {} in history",
            t.thread_id
        );
        assert_eq!(stages.len(), 80);
        // Event ids increase through each ring, and every event lies inside its parent.
        for w in t.statements_history.windows(2) {
            assert!(
                w[0].ev.event_id < w[1].ev.event_id
                    && w[0].ev.end_event_id <= Some(w[1].ev.event_id)
            );
        }
        for st in &t.stages_history {
            assert_eq!(
                st.nesting_event_type,
                Some(EventKind::Statement),
                "stage {st:?}"
            );
            let parent = stmts
                .get(&st.nesting_event_id.unwrap())
                .expect("stage's parent is a statement of the same thread");
            assert!(parent.ev.event_id < st.event_id && st.end_event_id <= parent.ev.end_event_id);
            checked.1 += 1;
        }
        let mut in_statement = 0;
        for wt in &t.waits_history {
            let pid = wt.nesting_event_id.expect("every wait is nested");
            match wt.nesting_event_type {
                Some(EventKind::Stage) => {
                    let p = stages
                        .get(&pid)
                        .expect("wait's parent stage is in this thread's history");
                    assert!(p.event_id < wt.event_id && wt.end_event_id <= p.end_event_id);
                    let stage = name(p.class);
                    assert!(
                        (stage == "stage/test/parse" && wt.object_instance == 2)
                            || (stage == "stage/test/exec" && wt.object_instance >= 3),
                        "wait {} in {stage}",
                        wt.object_instance
                    );
                }
                Some(EventKind::Statement) => {
                    assert!(stmts.contains_key(&pid));
                    assert_eq!(
                        wt.object_instance, 1,
                        "only the first wait precedes the stages"
                    );
                    in_statement += 1;
                }
                other => panic!("wait nested in {other:?}"),
            }
            checked.2 += 1;
        }
        assert!(in_statement > 0);
        checked.0 += stmts.len();
        assert!(stmts.values().all(|e| e.text.starts_with("SELECT ")));
    }
    assert_eq!(checked.0, 120, "3 threads x 40 statements checked");
    eprintln!(
        "nesting: {} statements, {} stages, {} waits checked",
        checked.0, checked.1, checked.2
    );
    w.finish(Duration::from_secs(10))?;
    Ok(())
}

#[test]
fn control_api_refuses_without_the_right_token_and_changes_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    let mut w = loop_writer(d, "ctl", "1")?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n")?;
    let (_a, base) = serve(
        dir.path(),
        &["--control-token-file", token_file.to_str().unwrap()],
    )?;
    let (_b, open_base) = serve(dir.path(), &[])?;
    let body = json!({"name": "wait/%", "enabled": false});
    let url = |b: &str| format!("{b}/api/v1/setup/instruments");
    assert_eq!(post(&url(&base), None, body.clone())?.0, 401, "no token");
    assert_eq!(
        post(&url(&base), Some("wrong"), body.clone())?.0,
        401,
        "wrong token"
    );
    let (code, reply) = post(&url(&open_base), Some("s3cret-token"), body.clone())?;
    assert_eq!(code, 403, "no token configured: control refused ({reply})");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("--control-token-file")
    );
    assert_eq!(
        post(
            &format!("{base}/api/v1/tables/events_waits_history/truncate"),
            None,
            json!({})
        )?
        .0,
        401
    );
    let inst = get_json(&format!("{base}/api/v1/tables/setup_instruments"))?;
    assert!(
        rows(&inst)?.iter().all(|r| r["enabled"] == "YES"),
        "nothing changed: {inst}"
    );
    // Malformed requests with the right token are 400, and still change nothing.
    let (code, reply) = post(
        &url(&base),
        Some("s3cret-token"),
        json!({"name": "wait/%", "enabled": "maybe"}),
    )?;
    assert_eq!(code, 400, "{reply}");
    // An array (several changes at once) says what the body must be, not
    // the name of a type of ours.
    let (code, reply) = post(
        &url(&base),
        Some("s3cret-token"),
        json!([{"name": "wait/%", "enabled": false}]),
    )?;
    assert_eq!(code, 400, "{reply}");
    let said = reply.to_string();
    assert!(
        said.contains("must be one JSON object") && !said.contains("InstrumentChange"),
        "{said}"
    );
    let (code, _) = post(
        &format!("{base}/api/v1/setup/timers"),
        Some("s3cret-token"),
        json!({"name": "wait", "timer_name": "SUNDIAL"}),
    )?;
    assert_eq!(code, 400);
    assert!(
        rows(&get_json(&format!(
            "{base}/api/v1/tables/setup_instruments"
        ))?)?
        .iter()
        .all(|r| r["enabled"] == "YES")
    );
    w.finish(Duration::from_secs(10))?;
    Ok(())
}

#[test]
fn toggling_instruments_timers_and_consumers_takes_effect_at_the_next_event() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    const THREADS: u64 = 2;
    let mut w = loop_writer(d, "tog", "2")?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t0ken")?;
    let (_a, base) = serve(
        dir.path(),
        &["--control-token-file", token_file.to_str().unwrap()],
    )?;
    let tok = Some("t0ken");
    let setup = |what: &str, body: Value| -> Result<Value> {
        let (code, reply) = post(&format!("{base}/api/v1/setup/{what}"), tok, body)?;
        assert_eq!(code, 200, "{reply}");
        Ok(reply)
    };
    wait_until("events flowing", Duration::from_secs(10), || {
        Ok(count(&base)? > 100)
    })?;

    // ENABLED off: within one in-flight event per thread, counting stops.
    let reply = setup("instruments", json!({"name": "wait/%", "enabled": false}))?;
    assert_eq!(
        reply["matched"], 3,
        "three wait classes match wait/%: {reply}"
    );
    std::thread::sleep(Duration::from_millis(300)); // snapshot cache and in-flight waits
    let c1 = count(&base)?;
    std::thread::sleep(Duration::from_millis(500));
    let c2 = count(&base)?;
    assert!(
        c2 - c1 <= THREADS,
        "disabled instrument still counting: {c1} -> {c2}"
    );
    let inst = get_json(&format!("{base}/api/v1/tables/setup_instruments"))?;
    assert!(
        rows(&inst)?
            .iter()
            .filter(|r| r["name"].as_str().unwrap().starts_with("wait/"))
            .all(|r| r["enabled"] == "NO")
    );
    setup(
        "instruments",
        json!({"name": "wait/synch/mutex/test/a", "enabled": true}),
    )?;
    wait_until("counting resumes", Duration::from_secs(5), || {
        Ok(count(&base)? > c2 + 50)
    })?;

    // TIMED off: COUNT_STAR grows, SUM_TIMER_WAIT does not.
    setup("instruments", json!({"name": "wait/%", "timed": false}))?;
    std::thread::sleep(Duration::from_millis(300));
    let r1 = global_row(&base, "wait/synch/mutex/test/a")?;
    std::thread::sleep(Duration::from_millis(500));
    let r2 = global_row(&base, "wait/synch/mutex/test/a")?;
    assert!(u64_col(&r2, "count_star")? > u64_col(&r1, "count_star")? + 50);
    assert_eq!(
        r1["sum_timer_wait"], r2["sum_timer_wait"],
        "untimed waits left out of the sum"
    );
    let hist = get_json(&format!("{base}/api/v1/tables/events_waits_history"))?;
    assert!(
        rows(&hist)?.iter().any(|r| r["timer_wait"].is_null()),
        "untimed events have NULL timers"
    );
    setup("instruments", json!({"name": "wait/%", "timed": true}))?;
    wait_until("timing resumes", Duration::from_secs(5), || {
        Ok(global_row(&base, "wait/synch/mutex/test/a")?["sum_timer_wait"] != r2["sum_timer_wait"])
    })?;

    // Consumers: events_waits_current off freezes current and history; on resumes.
    let ids = |t: &str| -> Result<Vec<u64>> {
        let v = get_json(&format!("{base}/api/v1/tables/{t}"))?;
        rows(&v)?.iter().map(|r| u64_col(r, "event_id")).collect()
    };
    let reply = setup(
        "consumers",
        json!({"name": "events_waits_current", "enabled": false}),
    )?;
    assert_eq!(reply["matched"], 1);
    std::thread::sleep(Duration::from_millis(300));
    let (cur1, hist1) = (ids("events_waits_current")?, ids("events_waits_history")?);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ids("events_waits_current")?, cur1, "current frozen");
    assert_eq!(
        ids("events_waits_history")?,
        hist1,
        "history depends on current: frozen"
    );
    let c3 = count(&base)?;
    std::thread::sleep(Duration::from_millis(300));
    assert!(count(&base)? > c3, "summaries still counting");
    setup(
        "consumers",
        json!({"name": "events_waits_current", "enabled": true}),
    )?;
    wait_until("current advances", Duration::from_secs(5), || {
        Ok(ids("events_waits_current")? != cur1)
    })?;
    let consumers = get_json(&format!("{base}/api/v1/tables/setup_consumers"))?;
    assert_eq!(rows(&consumers)?.len(), 15);

    // Timers: stage timer to MICROSECOND shows in setup_timers.
    setup(
        "timers",
        json!({"name": "stage", "timer_name": "MICROSECOND"}),
    )?;
    let timers = get_json(&format!("{base}/api/v1/tables/setup_timers"))?;
    assert!(
        rows(&timers)?
            .iter()
            .any(|r| r["name"] == "stage" && r["timer_name"] == "MICROSECOND")
    );
    w.finish(Duration::from_secs(10))?;
    Ok(())
}

/// `setup_actors` through the control API and the CLI as MySQL's
/// statements: an update keeps the columns it does not give, a full table
/// is an error that says so; a service filter that matches nothing says
/// that, not that the directory is empty.
#[test]
fn actors_updates_keep_other_columns_a_full_table_is_an_error_and_filters_are_named() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    let mut w = loop_writer(d, "act", "1")?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t0ken")?;
    let (_a, base) = serve(
        dir.path(),
        &["--control-token-file", token_file.to_str().unwrap()],
    )?;
    let tok = Some("t0ken");
    let actors = |body: Value| post(&format!("{base}/api/v1/setup/actors"), tok, body);
    let app_row = || -> Result<(String, String)> {
        let t = get_json(&format!("{base}/api/v1/tables/setup_actors"))?;
        let r = rows(&t)?
            .iter()
            .find(|r| r["user"] == "app")
            .cloned()
            .context("no row for app")?;
        Ok((
            r["enabled"].as_str().unwrap_or_default().to_string(),
            r["history"].as_str().unwrap_or_default().to_string(),
        ))
    };
    let (code, reply) = actors(json!({"host": "%", "user": "app", "enabled": false}))?;
    assert_eq!(code, 200, "{reply}");
    assert_eq!(app_row()?, ("NO".into(), "YES".into()));
    let (code, reply) = actors(json!({"host": "%", "user": "app", "history": false}))?;
    assert_eq!(code, 200, "{reply}");
    assert_eq!(
        app_row()?,
        ("NO".into(), "NO".into()),
        "updating HISTORY kept ENABLED"
    );

    // Fill the table: the row that does not fit is refused, saying why.
    let existing = rows(&get_json(&format!("{base}/api/v1/tables/setup_actors"))?)?.len();
    for i in existing..pfs_shm_layout::layout::MAX_ACTORS {
        let (code, reply) = actors(json!({"host": "%", "user": format!("u{i}")}))?;
        assert_eq!(code, 200, "{reply}");
    }
    let (code, reply) = actors(json!({"host": "%", "user": "one-too-many"}))?;
    assert_eq!(code, 409, "{reply}");
    assert!(reply.to_string().contains("full"), "{reply}");
    let cli = agent_cli(&["setup", "actors", "--user", "another", "--shm-dir", d])?;
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(!cli.status.success() && err.contains("full"), "{err}");

    // A filter that leaves every live segment out is named as such.
    let (code, reply) = post(
        &format!("{base}/api/v1/setup/instruments?service=nosuch"),
        tok,
        json!({"name": "wait/%", "enabled": false}),
    )?;
    assert_eq!(code, 200, "{reply}");
    assert_eq!(reply["segments"], 0);
    let warning = reply["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("filter") && warning.contains("act (pid"),
        "{reply}"
    );
    let cli = agent_cli(&[
        "setup",
        "instruments",
        "wait/%",
        "--enabled",
        "no",
        "--service",
        "nosuch",
        "--shm-dir",
        d,
    ])?;
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(
        err.contains("filter") && !err.contains("no live segment in"),
        "{err}"
    );
    assert!(
        !cli.status.success(),
        "a filter that leaves every live process out fails the command"
    );
    // So does a pattern that names nothing (a typo), saying so.
    let cli = agent_cli(&[
        "setup",
        "instruments",
        "wait/no/such/%",
        "--enabled",
        "no",
        "--shm-dir",
        d,
    ])?;
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(
        !cli.status.success() && err.contains("no instrument matched"),
        "{err}"
    );
    w.finish(Duration::from_secs(10))?;
    Ok(())
}

/// `serve --instrument/--consumer/--actor` defaults are applied once per
/// segment: an agent started again with the same defaults keeps the live
/// changes made since (its own before the restart included); started with
/// other defaults, it applies those.
#[test]
fn an_agent_restart_keeps_live_changes_over_its_defaults() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    let mut w = loop_writer(d, "keep", "1")?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t0ken")?;
    let token = token_file.to_str().unwrap();
    let defaults = [
        "--control-token-file",
        token,
        "--instrument",
        "wait/synch/mutex/test/a=OFF",
        "--consumer",
        "events_waits_history_long=ON",
        "--actor",
        "batch@%/etl=NO_HISTORY",
    ];
    // The batch row's ENABLED and HISTORY ("-" when the row is not there).
    let actor = |base: &str| -> Result<String> {
        let t = get_json(&format!("{base}/api/v1/tables/setup_actors"))?;
        Ok(rows(&t)?
            .iter()
            .find(|r| r["user"] == "batch" && r["host"] == "%" && r["role"] == "etl")
            .map(|r| {
                format!(
                    "{}/{}",
                    r["enabled"].as_str().unwrap_or("?"),
                    r["history"].as_str().unwrap_or("?")
                )
            })
            .unwrap_or_else(|| "-".into()))
    };
    let state = |base: &str| -> Result<(String, String)> {
        let inst = get_json(&format!("{base}/api/v1/tables/setup_instruments"))?;
        let a = rows(&inst)?
            .iter()
            .find(|r| r["name"] == "wait/synch/mutex/test/a")
            .map(|r| r["enabled"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        let cons = get_json(&format!("{base}/api/v1/tables/setup_consumers"))?;
        let long = rows(&cons)?
            .iter()
            .find(|r| r["name"] == "events_waits_history_long")
            .map(|r| r["enabled"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        Ok((a, long))
    };
    {
        let (_a, base) = serve(dir.path(), &defaults)?;
        wait_until("the defaults applied", Duration::from_secs(10), || {
            Ok(state(&base)? == ("NO".into(), "YES".into()))
        })?;
        assert_eq!(actor(&base)?, "YES/NO", "the --actor row");
        // Live changes against the defaults.
        for (what, body) in [
            (
                "instruments",
                json!({"name": "wait/synch/mutex/test/a", "enabled": true}),
            ),
            (
                "consumers",
                json!({"name": "events_waits_history_long", "enabled": false}),
            ),
        ] {
            let (code, reply) = post(&format!("{base}/api/v1/setup/{what}"), Some("t0ken"), body)?;
            assert_eq!(code, 200, "{reply}");
        }
        let delete = json!({"host": "%", "user": "batch", "role": "etl", "delete": true});
        let (code, reply) = post(
            &format!("{base}/api/v1/setup/actors"),
            Some("t0ken"),
            delete,
        )?;
        assert_eq!(code, 200, "{reply}");
        assert_eq!(state(&base)?, ("YES".into(), "NO".into()));
        assert_eq!(actor(&base)?, "-");
    }
    // The same defaults again: the live changes stay, pass after pass.
    {
        let (_a, base) = serve(dir.path(), &defaults)?;
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(
            state(&base)?,
            ("YES".into(), "NO".into()),
            "a restarted agent undid live changes"
        );
        assert_eq!(
            actor(&base)?,
            "-",
            "a restarted agent put a deleted row back"
        );
    }
    // Other defaults: applied.
    {
        let mut other = defaults.to_vec();
        other.extend(["--instrument", "wait/io/file/%=OFF"]);
        let (_a, base) = serve(dir.path(), &other)?;
        wait_until("the new defaults applied", Duration::from_secs(10), || {
            Ok(state(&base)? == ("NO".into(), "YES".into()))
        })?;
        assert_eq!(actor(&base)?, "YES/NO");
    }
    w.finish(Duration::from_secs(10))?;
    Ok(())
}

/// `pfs-agent setup` never writes into a segment `serve` would refuse to
/// read (here a world-writable one), and says why it skipped it.
#[test]
fn setup_skips_a_segment_serve_refuses() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    let mut w = loop_writer(d, "ww", "1")?;
    let file = w.segment_in(dir.path(), "ww");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))?;
    let out = agent_cli(&[
        "setup",
        "instruments",
        "wait/%",
        "--enabled",
        "no",
        "--shm-dir",
        d,
    ])?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stdout.contains("matched 0 row(s) in 0 segment(s)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("skipping") && stderr.contains("0666"),
        "{stderr}"
    );
    assert!(!stderr.contains("no live segment in"), "{stderr}");
    let seg = Segment::open(std::fs::File::open(&file)?, false)?;
    let s = snapshot(&seg, &ReadOptions::default())?;
    assert!(
        s.classes
            .iter()
            .filter(|c| c.name.starts_with("wait/"))
            .all(|c| c.enabled()),
        "the refused segment was changed"
    );
    w.finish(Duration::from_secs(10))?;
    Ok(())
}

/// Malformed setup defaults stop `serve` before it listens, naming the
/// rule and what is expected: a mistyped `--actor` never leaves a fleet
/// of sidecars running without it.
#[test]
fn malformed_setup_defaults_stop_the_agent() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().unwrap();
    let too_many: Vec<String> = (0..48).map(|i| format!("u{i}@%=OFF")).collect();
    for (flag, value, says) in [
        ("--actor", "batch=OFF".to_string(), "USER@HOST"),
        ("--actor", "batch@%=MAYBE".to_string(), "NO_HISTORY"),
        ("--actor", too_many.join(";"), "at most 47"),
        (
            "--consumer",
            "events_nosuch=ON".to_string(),
            "matches no consumer",
        ),
        ("--instrument", "wait/%=SOMETIMES".to_string(), "COUNTED"),
        (
            "--instrument",
            "statements/%=OFF".to_string(),
            "matches no instrument name",
        ),
    ] {
        let mut child = std::process::Command::new(pfs_tests::agent_bin())
            .args([
                "serve",
                "--shm-dir",
                d,
                "--listen",
                "127.0.0.1:0",
                flag,
                &value,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let end = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("serve {flag} {value:?} kept running");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err)?;
        assert_eq!(status.code(), Some(1), "{flag} {value}: {err}");
        assert!(
            err.contains("invalid --instrument/--consumer/--actor") && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
    Ok(())
}
