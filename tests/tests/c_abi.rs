//! The C ABI end to end: `tests/c/pfs_c_demo.c` is compiled with `cc`
//! against `client-c/include/pfs.h` and `libpfs.so`, through the flags of
//! `client-c/pfs.pc.in` rendered for a staged install, and runs as a
//! separate process. A real `pfs-agent` reads its segment: every count,
//! sum of figures and memory total is exact in the tables and in
//! `/metrics`, every event nests where the program opened it (wait →
//! stage → statement, by `NESTING_EVENT_ID` and the parent's
//! `[EVENT_ID, END_EVENT_ID)`), and the totals stay exact once the C
//! threads have exited (their records folded).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pfs_tests::{Agent, Writer, poll, rows, sample, str_col, u64_col, workspace_root};
use serde_json::Value;

const SERVICE: &str = "c-demo";
const THREADS: u64 = 3;
const ITERATIONS: u64 = 200;

/// Builds `pfs-client-c` and returns the path of `libpfs.so`.
fn build_libpfs() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "pfs-client-c",
            "--lib",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p pfs-client-c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("cargo prints UTF-8");
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "pfs")
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
        })
        .find(|f| f.extension().is_some_and(|e| e == "so"))
        .unwrap_or_else(|| panic!("no libpfs.so among cargo's artifacts:\n{stdout}"))
}

/// `pfs.pc.in` rendered for `prefix`, and the values of its variables and
/// keywords with `${var}` expanded (what `pkg-config` reads).
fn render_pc(prefix: &Path) -> (String, BTreeMap<String, String>) {
    let template = std::fs::read_to_string(workspace_root().join("client-c/pfs.pc.in"))
        .expect("client-c/pfs.pc.in");
    let pc = template
        .replace("@PREFIX@", prefix.to_str().expect("UTF-8 temp dir"))
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for line in pc.lines().filter(|l| !l.starts_with('#')) {
        let Some(i) = line.find(['=', ':']) else {
            continue;
        };
        let (key, value) = (line[..i].trim(), line[i + 1..].trim());
        let mut v = value.to_string();
        for (k, val) in &vars {
            v = v.replace(&format!("${{{k}}}"), val);
        }
        vars.insert(key.to_string(), v);
    }
    (pc, vars)
}

/// Compiles the demo program against a staged install (`prefix/include`,
/// `prefix/lib`, `prefix/lib/pkgconfig/pfs.pc`), with the `.pc` file's
/// flags; checks them against `pkg-config`'s where it is installed.
fn compile_demo(prefix: &Path) -> PathBuf {
    let lib = build_libpfs();
    let root = workspace_root();
    std::fs::create_dir_all(prefix.join("lib/pkgconfig")).unwrap();
    std::fs::create_dir_all(prefix.join("include")).unwrap();
    std::fs::copy(&lib, prefix.join("lib/libpfs.so")).unwrap();
    std::fs::copy(
        root.join("client-c/include/pfs.h"),
        prefix.join("include/pfs.h"),
    )
    .unwrap();
    let (pc, vars) = render_pc(prefix);
    std::fs::write(prefix.join("lib/pkgconfig/pfs.pc"), &pc).unwrap();
    assert_eq!(vars["Version"], env!("CARGO_PKG_VERSION"));
    let cflags = vars["Cflags"].clone();
    let libs = vars["Libs"].clone();
    if let Ok(out) = Command::new("pkg-config")
        .args(["--cflags", "--libs", "pfs"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
    {
        assert!(out.status.success(), "pkg-config rejects pfs.pc:\n{pc}");
        let got = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            got.split_whitespace().collect::<Vec<_>>(),
            format!("{cflags} {libs}")
                .split_whitespace()
                .collect::<Vec<_>>(),
            "pkg-config reads pfs.pc as we do"
        );
    }
    let exe = prefix.join("pfs_c_demo");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .args(cflags.split_whitespace())
        .arg(root.join("tests/c/pfs_c_demo.c"))
        .arg("-o")
        .arg(&exe)
        .args(libs.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", vars["libdir"]))
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The rows of `table` for the demo's service, keyed by `event_name`,
/// once `ready` accepts them.
fn by_name(
    agent: &Agent,
    table: &str,
    ready: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    poll(Duration::from_secs(20), || {
        let t = agent.table(table)?;
        let m: BTreeMap<String, Value> = rows(&t)?
            .iter()
            .filter(|r| r["service"] == SERVICE)
            .map(|r| {
                (
                    str_col(r, "event_name").unwrap_or("").to_string(),
                    r.clone(),
                )
            })
            .collect();
        Ok(ready(&m).then_some(m))
    })
    .unwrap_or_else(|e| panic!("{table}: {e:#}\n{}", agent.guard.describe()))
}

fn col(rows: &BTreeMap<String, Value>, name: &str, column: &str) -> u64 {
    let r = rows
        .get(name)
        .unwrap_or_else(|| panic!("no row {name} in {rows:?}"));
    u64_col(r, column).unwrap()
}

/// Checks every exact total; `Ok(())` once they all hold. `alive`: the
/// program still runs.
fn check_totals(agent: &Agent, alive: bool) {
    let n = THREADS * ITERATIONS;
    let waits = by_name(agent, "events_waits_summary_global_by_event_name", |m| {
        m.get("wait/synch/cond/capp/changed")
            .is_some_and(|r| r["count_star"] == THREADS)
    });
    assert_eq!(col(&waits, "wait/synch/mutex/capp/lock", "count_star"), n);
    assert_eq!(col(&waits, "wait/io/file/capp/data", "count_star"), 2 * n);
    assert_eq!(
        col(&waits, "wait/synch/cond/capp/changed", "count_star"),
        THREADS
    );
    for name in ["wait/synch/mutex/capp/lock", "wait/io/file/capp/data"] {
        assert!(col(&waits, name, "sum_timer_wait") > 0, "{name} is timed");
    }

    let stages = by_name(agent, "events_stages_summary_global_by_event_name", |m| {
        m.len() >= 2
    });
    assert_eq!(col(&stages, "stage/capp/parsing", "count_star"), n);
    assert_eq!(col(&stages, "stage/capp/executing", "count_star"), n);

    let st = by_name(
        agent,
        "events_statements_summary_global_by_event_name",
        |m| !m.is_empty(),
    );
    let q = "statement/capp/query";
    assert_eq!(col(&st, q, "count_star"), n);
    assert_eq!(col(&st, q, "sum_errors"), THREADS * ITERATIONS.div_ceil(5));
    assert_eq!(col(&st, q, "sum_rows_sent"), 2 * n);
    assert_eq!(col(&st, q, "sum_rows_examined"), 10 * n);
    assert_eq!(col(&st, q, "sum_warnings"), 0);

    let mem = by_name(agent, "memory_summary_global_by_event_name", |m| {
        m.contains_key("memory/capp/buffer")
    });
    let b = "memory/capp/buffer";
    assert_eq!(col(&mem, b, "count_alloc"), 3 * THREADS);
    assert_eq!(col(&mem, b, "count_free"), THREADS);
    assert_eq!(col(&mem, b, "sum_number_of_bytes_alloc"), 3000 * THREADS);
    assert_eq!(col(&mem, b, "current_number_of_bytes_used"), 2000 * THREADS);

    let m = agent.metrics().unwrap();
    let total = |family: &str, name: &str| {
        sample(&m, family, &[("service", SERVICE), ("event_name", name)])
            .unwrap_or_else(|e| panic!("{family} {name}: {e:#}"))
    };
    assert_eq!(
        total("pfs_events_waits_total", "wait/synch/mutex/capp/lock"),
        n as f64
    );
    assert_eq!(
        total("pfs_events_waits_total", "wait/io/file/capp/data"),
        (2 * n) as f64
    );
    assert_eq!(
        total("pfs_events_waits_total", "wait/synch/cond/capp/changed"),
        THREADS as f64
    );
    assert_eq!(
        total("pfs_events_stages_total", "stage/capp/parsing"),
        n as f64
    );
    assert_eq!(
        total("pfs_events_stages_total", "stage/capp/executing"),
        n as f64
    );
    assert_eq!(total("pfs_events_statements_total", q), n as f64);
    assert_eq!(
        total("pfs_memory_allocations_total", b),
        (3 * THREADS) as f64
    );
    assert_eq!(total("pfs_memory_frees_total", b), THREADS as f64);
    if alive {
        assert_eq!(total("pfs_memory_used_bytes", b), (2000 * THREADS) as f64);
    } else {
        // Once the agent sees the program has exited, what it had in use is
        // gone with it (the in-use gauges count live processes); its counts
        // stay (above).
        poll(Duration::from_secs(20), || {
            let m = agent.metrics()?;
            let used = sample(
                &m,
                "pfs_memory_used_bytes",
                &[("service", SERVICE), ("event_name", b)],
            )?;
            Ok((used == 0.0).then_some(()))
        })
        .unwrap_or_else(|e| panic!("memory in use of an exited program: {e:#}"));
    }
}

/// Rows of a history table for the demo, by (thread, event id).
fn history(agent: &Agent, table: &str) -> BTreeMap<(u64, u64), Value> {
    let t = agent.table(table).unwrap();
    rows(&t)
        .unwrap()
        .iter()
        .filter(|r| r["service"] == SERVICE)
        .map(|r| {
            (
                (
                    u64_col(r, "thread_id").unwrap(),
                    u64_col(r, "event_id").unwrap(),
                ),
                r.clone(),
            )
        })
        .collect()
}

/// The event `child` nests in `parent`: by type, id and id range.
fn nests_in(child: &Value, parent: &Value, parent_type: &str) {
    assert_eq!(child["nesting_event_type"], parent_type, "{child}");
    assert_eq!(child["nesting_event_id"], parent["event_id"], "{child}");
    let id = u64_col(child, "event_id").unwrap();
    let (lo, hi) = (
        u64_col(parent, "event_id").unwrap(),
        u64_col(parent, "end_event_id").unwrap(),
    );
    assert!(lo < id && id < hi, "{child} inside {parent}");
    // Times: each row's TIMER_WAIT is its TIMER_END − TIMER_START, exactly
    // (as PFS shows them), and the child lies within its parent.
    let times = |r: &Value| {
        let col = |c: &str| u64_col(r, c).unwrap_or_else(|e| panic!("{c} of {r}: {e}"));
        let (start, end, wait) = (col("timer_start"), col("timer_end"), col("timer_wait"));
        assert_eq!(
            wait,
            end - start,
            "TIMER_WAIT = TIMER_END - TIMER_START: {r}"
        );
        (start, end)
    };
    let ((cs, ce), (ps, pe)) = (times(child), times(parent));
    assert!(ps <= cs && ce <= pe, "{child} within {parent} in time");
}

/// Every wait, stage and statement of the histories nests as the program
/// opened it; each thread's history is under the `THREAD_ID` that
/// `pfs_thread_id` gave it, and its last statement under the `EVENT_ID`
/// that `pfs_statement_event_id` gave.
fn check_nesting(agent: &Agent, ready: &Value) {
    let waits = history(agent, "events_waits_history");
    let stages = history(agent, "events_stages_history");
    let statements = history(agent, "events_statements_history");
    let threads: std::collections::BTreeSet<u64> = waits.keys().map(|k| k.0).collect();
    let reported: Vec<&Value> = ready["threads"].as_array().unwrap().iter().collect();
    let ids: std::collections::BTreeSet<u64> = reported
        .iter()
        .map(|t| t["thread_id"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, ids, "pfs_thread_id: {ready}");
    for (t, want) in reported.iter().enumerate() {
        let key = (
            want["thread_id"].as_u64().unwrap(),
            want["last_statement"].as_u64().unwrap(),
        );
        let last = statements
            .get(&key)
            .unwrap_or_else(|| panic!("pfs_statement_event_id {key:?} is in no history row"));
        assert_eq!(
            last["sql_text"],
            format!("SELECT {} FROM t{t}", ITERATIONS - 1),
            "{last}"
        );
    }
    let (mut nested_waits, mut nested_stages) = (0, 0);
    for ((thread, _), w) in &waits {
        let name = str_col(w, "event_name").unwrap();
        if name == "wait/synch/cond/capp/changed" {
            assert!(w["nesting_event_id"].is_null(), "{w}");
            continue;
        }
        let parent = &stages[&(*thread, u64_col(w, "nesting_event_id").unwrap())];
        let want = match name {
            "wait/synch/mutex/capp/lock" => "stage/capp/parsing",
            "wait/io/file/capp/data" => {
                assert_eq!(w["number_of_bytes"], 512, "{w}");
                assert_eq!(w["operation"], "write", "{w}");
                "stage/capp/executing"
            }
            other => panic!("unexpected wait {other}"),
        };
        assert_eq!(parent["event_name"], want, "{w}");
        nests_in(w, parent, "STAGE");
        nested_waits += 1;
    }
    for ((thread, _), s) in &stages {
        let Some(parent) = statements.get(&(*thread, u64_col(s, "nesting_event_id").unwrap()))
        else {
            continue; // its statement left the (shorter) statement ring
        };
        assert_eq!(parent["event_name"], "statement/capp/query");
        nests_in(s, parent, "STATEMENT");
        nested_stages += 1;
    }
    assert!(
        nested_waits >= 30 * THREADS as usize,
        "{nested_waits} waits checked"
    );
    assert!(
        nested_stages >= 30 * THREADS as usize,
        "{nested_stages} stages checked"
    );
    let digests: std::collections::BTreeSet<String> = statements
        .values()
        .map(|s| s["digest"].to_string())
        .collect();
    assert_eq!(digests.len(), 1, "one digest text, one DIGEST: {digests:?}");
    for s in statements.values() {
        let text = str_col(s, "sql_text").unwrap();
        assert!(
            text.starts_with("SELECT ") && text.contains(" FROM t"),
            "{s}"
        );
        assert!(s["nesting_event_id"].is_null(), "top-level statements: {s}");
    }
}

#[test]
fn a_c_program_is_read_exactly_by_the_agent() {
    let install = tempfile::tempdir().unwrap();
    let exe = compile_demo(install.path());
    let dir = tempfile::tempdir().unwrap();
    let mut demo = Writer::spawn(
        &exe,
        &[
            dir.path().to_str().unwrap(),
            SERVICE,
            &THREADS.to_string(),
            &ITERATIONS.to_string(),
        ],
    )
    .unwrap();
    let ready = demo.read_json(Duration::from_secs(30)).unwrap();
    assert_eq!(ready["ready"], true, "{ready}");
    let segment = ready["segment"].as_str().unwrap();
    assert_eq!(
        Path::new(segment),
        demo.segment_in(dir.path(), SERVICE),
        "pfs_segment_path"
    );

    let agent = Agent::serve(dir.path()).unwrap();
    check_totals(&agent, true);
    check_nesting(&agent, &ready);

    // The C threads exit (Rust's thread-exit hook runs on C pthreads too)
    // and the process ends: the totals, folded, are still exact.
    demo.finish(Duration::from_secs(20)).unwrap();
    assert_eq!(
        demo.read_json(Duration::from_secs(5)).unwrap()["done"],
        true
    );
    check_totals(&agent, false);
    assert!(
        demo.guard.stderr().is_empty(),
        "the demo complained:\n{}",
        demo.guard.describe()
    );
}
