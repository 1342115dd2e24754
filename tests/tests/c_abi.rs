//! The C ABI end to end, each C program compiled with the real compiler
//! against a staged install made by `client-c/install.sh` (header,
//! `libpfs.so.VERSION` with its SONAME links, `pfs.pc`), with the flags of
//! its `pfs.pc`, and run as a separate process:
//!
//! * `tests/c/pfs_c_demo.c`: a real `pfs-agent` reads its segment: every
//!   count, sum of figures and memory total is exact in the tables and in
//!   `/metrics`, every event nests where the program opened it (wait →
//!   stage → statement, by `NESTING_EVENT_ID` and the parent's
//!   `[EVENT_ID, END_EVENT_ID)`), and the totals stay exact once the C
//!   threads have exited (their records folded).
//! * `tests/c/pfs_c_edges.c`: the API's edges, read from the segment:
//!   ends by a thread that did not begin (no-ops, no crash), lost events
//!   of threads without a record (counted exactly), thread names,
//!   `pfs_config_t` checks, the ABI check, async tasks (`pfs_task_t`)
//!   resumed on two threads; and the SONAME, with `readelf`.
//! * `tests/c/pfs_asyncio.py`: Python `asyncio` tasks through `ctypes`,
//!   each coroutine's steps entered in a `pfs_task_t` of its own.
//! * `tests/c/pfs_cxx_config.cpp`: the header from C++ under `-Wextra
//!   -Werror`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use pfs_shm_layout::Segment;
use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};
use pfs_shm_layout::values::Summary;
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

/// The variables and keywords of a `.pc` file, `${var}` expanded (what
/// `pkg-config` reads).
fn parse_pc(pc: &str) -> BTreeMap<String, String> {
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
    vars
}

/// libpfs installed under `prefix` by `client-c/install.sh`, as the docs
/// say, with the variables of its `pfs.pc`.
struct Install {
    prefix: PathBuf,
    pc: BTreeMap<String, String>,
}

/// The staged install, made once per test process (in Cargo's temporary
/// directory for tests, replaced each run). Checks the `.pc` file against
/// `pkg-config` where it is installed.
fn install() -> &'static Install {
    static INSTALL: OnceLock<Install> = OnceLock::new();
    INSTALL.get_or_init(|| {
        let lib = build_libpfs();
        let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_abi_install");
        let _ = std::fs::remove_dir_all(&prefix);
        let out = Command::new("sh")
            .arg(workspace_root().join("client-c/install.sh"))
            .arg(&prefix)
            .env("PFS_BUILD_DIR", lib.parent().unwrap())
            .current_dir(workspace_root())
            .output()
            .expect("run client-c/install.sh");
        assert!(
            out.status.success(),
            "install.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let pc_path = prefix.join("lib/pkgconfig/pfs.pc");
        let pc_text = std::fs::read_to_string(&pc_path).expect("install.sh wrote pfs.pc");
        let pc = parse_pc(&pc_text);
        assert_eq!(pc["Version"], env!("CARGO_PKG_VERSION"), "{pc_text}");
        assert_eq!(Path::new(&pc["prefix"]), prefix, "{pc_text}");
        if let Ok(out) = Command::new("pkg-config")
            .args(["--cflags", "--libs", "pfs"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .output()
        {
            assert!(
                out.status.success(),
                "pkg-config rejects pfs.pc:\n{pc_text}"
            );
            let got = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                got.split_whitespace().collect::<Vec<_>>(),
                format!("{} {}", pc["Cflags"], pc["Libs"])
                    .split_whitespace()
                    .collect::<Vec<_>>(),
                "pkg-config reads pfs.pc as we do"
            );
        }
        Install { prefix, pc }
    })
}

/// Compiles `tests/c/<source>` against the staged install with `compiler`
/// and its warnings as errors, with the `.pc` file's flags; returns the
/// executable. Once per source and test process (tests running in
/// parallel share it: none overwrites a program another runs).
fn compile_with(compiler: &str, std: &str, source: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(exe) = built.get(source) {
        return exe.clone();
    }
    let inst = install();
    let exe = inst
        .prefix
        .join("bin")
        .join(Path::new(source).file_stem().expect("a source file name"));
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    build_c(
        compiler,
        std,
        &workspace_root().join("tests/c").join(source),
        &exe,
    );
    built.insert(source.to_string(), exe.clone());
    exe
}

/// Compiles and links `src` into `exe` with `compiler` in standard `std`,
/// warnings as errors, with the staged install's `pfs.pc` flags and an
/// rpath to its library.
fn build_c(compiler: &str, std: &str, src: &Path, exe: &Path) {
    let inst = install();
    let out = Command::new(compiler)
        .args([std, "-Wall", "-Wextra", "-Werror", "-pthread"])
        .args(inst.pc["Cflags"].split_whitespace())
        .arg(src)
        .arg("-o")
        .arg(exe)
        .args(inst.pc["Libs"].split_whitespace())
        .arg(format!("-Wl,-rpath,{}", inst.pc["libdir"]))
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles a C program of `tests/c` (C11).
fn compile(source: &str) -> PathBuf {
    compile_with("cc", "-std=c11", source)
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
    for (family, want) in [
        (
            "pfs_events_statements_errors_total",
            THREADS * ITERATIONS.div_ceil(5),
        ),
        ("pfs_events_statements_rows_sent_total", 2 * n),
        ("pfs_events_statements_rows_examined_total", 10 * n),
        ("pfs_events_statements_warnings_total", 0),
    ] {
        assert_eq!(total(family, q), want as f64, "{family}");
    }
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

/// The `SOURCE` of what `pfs_c_demo.c` begins on the line containing
/// `call` (a `PFS_*` macro call there, unique in the file).
fn demo_source(call: &str) -> String {
    let src = std::fs::read_to_string(workspace_root().join("tests/c/pfs_c_demo.c")).unwrap();
    let mut lines = src.lines().enumerate().filter(|(_, l)| l.contains(call));
    let (i, _) = lines
        .next()
        .unwrap_or_else(|| panic!("{call} is in pfs_c_demo.c"));
    assert!(
        lines.next().is_none(),
        "{call} is on one line of pfs_c_demo.c"
    );
    format!("pfs_c_demo.c:{}", i + 1)
}

/// Every wait, stage and statement of the histories nests as the program
/// opened it, with the `SOURCE` of the `PFS_*` macro that began it (none
/// for a plain `pfs_wait_begin`); each thread's history is under the `THREAD_ID` that
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
    let (mut nested_waits, mut nested_stages, mut named_waits) = (0, 0, 0);
    let source = |call: &str| Value::from(demo_source(call));
    for ((thread, _), w) in &waits {
        let name = str_col(w, "event_name").unwrap();
        if name == "wait/synch/cond/capp/changed" {
            assert!(w["nesting_event_id"].is_null(), "{w}");
            assert!(w["source"].is_null(), "pfs_wait_begin: no SOURCE: {w}");
            continue;
        }
        let parent = &stages[&(*thread, u64_col(w, "nesting_event_id").unwrap())];
        let want = match name {
            "wait/synch/mutex/capp/lock" => {
                assert_eq!(w["source"], source("PFS_WAIT_BEGIN(&w, MUTEX"), "{w}");
                "stage/capp/parsing"
            }
            "wait/io/file/capp/data" => {
                assert_eq!(w["number_of_bytes"], 512, "{w}");
                assert_eq!(w["operation"], "write", "{w}");
                // One unnamed write and one named, per statement.
                if w["source"] == source("PFS_WAIT_BEGIN(&io, FILE_IO") {
                    assert!(w["object_name"].is_null(), "{w}");
                } else {
                    assert_eq!(
                        w["source"],
                        source("PFS_WAIT_BEGIN_NAMED(&io, FILE_IO"),
                        "{w}"
                    );
                    assert_eq!(w["object_name"], "/var/lib/capp/data.db", "{w}");
                    named_waits += 1;
                }
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
        let call = match str_col(s, "event_name").unwrap() {
            "stage/capp/parsing" => "PFS_STAGE_ENTER(PARSING)",
            _ => "PFS_STAGE_ENTER(EXECUTING)",
        };
        assert_eq!(s["source"], source(call), "{s}");
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
    assert!(
        named_waits >= 5 * THREADS as usize,
        "{named_waits} named waits checked"
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
        assert_eq!(
            s["source"],
            source("PFS_STATEMENT_BEGIN(&st, QUERY)"),
            "{s}"
        );
    }
}

#[test]
fn a_c_program_is_read_exactly_by_the_agent() {
    let exe = compile("pfs_c_demo.c");
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
    // Its four misnamed registrations said, nothing else.
    warned_exactly(
        &demo.guard.stderr(),
        &[
            "not a PFS wait instrument name: \"stage/capp/parsing\"",
            "not a PFS stage instrument name: \"statement/capp/query\"",
            "not a PFS statement instrument name: \"memory/capp/x\"",
            "not a PFS memory instrument name: \"wait/io/file/capp/x\"",
        ],
    );
}

/// A C program's warnings go to standard error, one line each, from the
/// library's load (a misnamed class, twice, and a statement before
/// `pfs_init` are said, each once); to the
/// program's handler once it names one (`pfs_set_warning_handler`), which
/// may name another from inside its call (no lock is held then: no hang);
/// and nowhere once it names NULL.
#[test]
fn c_warnings_go_to_stderr_or_the_programs_handler() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("pfs_c_edges.c");
    let out = Command::new(&exe)
        .args(["warnings", dir.path().to_str().unwrap()])
        .output()
        .expect("run pfs_c_edges warnings");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    warned_exactly(
        &stderr,
        &[
            "not a PFS wait instrument name: \"stage/cedge/early\"; instrument disabled (not counted: the client is not initialised yet)",
            "pfs-client is not initialised: statement \"statement/cedge/early\"",
        ],
    );
    let got: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(got["handled"], 1, "{got}");
    assert_eq!(got["after_none"], 1, "the NULL handler drops it: {got}");
    assert_eq!(
        got["names_it"], true,
        "the last handled names its class: {got}"
    );
}

/// Runs `pfs_c_edges` in `mode` with `args` to completion: its one JSON
/// line. It must exit cleanly and say nothing on standard error.
fn run_edges(mode: &str, args: &[&str]) -> Value {
    let exe = compile("pfs_c_edges.c");
    let out = Command::new(&exe)
        .arg(mode)
        .args(args)
        .output()
        .expect("run pfs_c_edges");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "pfs_c_edges {mode}: {}\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

/// `pfs_init()` sizes the string table (`SOURCE` call sites and object
/// names) from `PFS_MAX_STRINGS`, and refuses a value out of range naming
/// the variable.
#[test]
fn pfs_init_reads_pfs_max_strings() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("pfs_c_edges.c");
    let run = |max_strings: &str| -> Value {
        let out = Command::new(&exe)
            .arg("env")
            .env("PFS_SHM_DIR", dir.path())
            .env("PFS_SERVICE_NAME", "c-env")
            .env("PFS_MAX_STRINGS", max_strings)
            .output()
            .expect("run pfs_c_edges env");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("one JSON line")
    };
    let got = run("5000");
    assert_eq!(got["rc"], 0, "{got}");
    let file = std::fs::File::open(got["segment"].as_str().unwrap()).unwrap();
    let seg = Segment::open(file, false).unwrap();
    assert_eq!(seg.geometry().max_strings, 5000);
    for bad in ["0", "2000000", "lots"] {
        let got = run(bad);
        assert_eq!(got["rc"], -3, "PFS_ERR_BAD_ENV: {got}");
        let error = got["error"].as_str().unwrap();
        assert!(
            error.contains("PFS_MAX_STRINGS") && error.contains("1 to 1048576"),
            "{error}"
        );
    }
}

/// `pfs_init()` sizes the task slots (segment layout 7.1) from
/// `PFS_TASK_SLOTS`: 0 leaves the Tasks section out, and a value out of
/// range is refused naming the variable.
#[test]
fn pfs_init_reads_pfs_task_slots() {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("pfs_c_edges.c");
    let run = |slots: &str| -> Value {
        let out = Command::new(&exe)
            .arg("env")
            .env("PFS_SHM_DIR", dir.path())
            .env("PFS_SERVICE_NAME", "c-slots")
            .env("PFS_TASK_SLOTS", slots)
            .output()
            .expect("run pfs_c_edges env");
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("one JSON line")
    };
    let slots = |got: &Value| {
        assert_eq!(got["rc"], 0, "{got}");
        let file = std::fs::File::open(got["segment"].as_str().unwrap()).unwrap();
        let seg = Segment::open(file, false).unwrap();
        seg.tasks().map(|(_, s)| s.len())
    };
    assert_eq!(slots(&run("100")), Some(100));
    assert_eq!(slots(&run("0")), None);
    for bad in ["65537", "-1", "many"] {
        let got = run(bad);
        assert_eq!(got["rc"], -3, "PFS_ERR_BAD_ENV: {got}");
        let error = got["error"].as_str().unwrap();
        assert!(
            error.contains("PFS_TASK_SLOTS") && error.contains("0 to 65536"),
            "{error}"
        );
    }
}

/// A `PFS_*` value that is not UTF-8 is refused, naming the variable (it
/// was taken as unset: the default directory, the executable's name, the
/// default size), except `PFS_SHM_DIR`, a path: any bytes name it.
#[test]
fn pfs_init_refuses_non_utf8_settings_and_takes_any_directory() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("pfs_c_edges.c");
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"nu\xffdir"));
    let run = |k: &str, v: &std::ffi::OsStr| {
        let mut cmd = Command::new(&exe);
        cmd.arg("env")
            .env("PFS_SHM_DIR", dir.path())
            .env("PFS_SERVICE_NAME", "c-env8")
            .env(k, v);
        let out = cmd.output().expect("run pfs_c_edges env");
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    for k in ["PFS_MAX_THREADS", "PFS_SERVICE_NAME", "PFS_CONSUMERS"] {
        let out = run(k, std::ffi::OsStr::from_bytes(b"x\xff"));
        let got: Value = serde_json::from_slice(&out).expect("one JSON line");
        assert_eq!(got["rc"], -3, "PFS_ERR_BAD_ENV for {k}: {got}");
        let error = got["error"].as_str().unwrap();
        assert!(error.contains(k) && error.contains("not UTF-8"), "{error}");
    }
    // PFS_ACTORS: setup_actors rows the segment starts with; a malformed
    // one is refused, naming the variable and the form.
    let too_many: Vec<String> = (0..48).map(|i| format!("u{i}@h=OFF")).collect();
    let too_many = too_many.join(";");
    for (bad, says) in [
        ("batch=OFF", "USER@HOST"),
        ("batch@%=MAYBE", "NO_HISTORY"),
        (too_many.as_str(), "48 rows"),
    ] {
        let out = run("PFS_ACTORS", std::ffi::OsStr::new(bad));
        let got: Value = serde_json::from_slice(&out).expect("one JSON line");
        assert_eq!(got["rc"], -3, "PFS_ACTORS={bad}: {got}");
        let error = got["error"].as_str().unwrap();
        assert!(
            error.contains("PFS_ACTORS") && error.contains(says),
            "{error}"
        );
    }
    let out = run("PFS_ACTORS", std::ffi::OsStr::new("batch@%=OFF"));
    let got: Value = serde_json::from_slice(&out).expect("one JSON line");
    assert_eq!(got["rc"], 0, "{got}");
    let seg = std::fs::File::open(got["segment"].as_str().unwrap()).unwrap();
    let seg = Segment::open(seg, false).unwrap();
    let actors: Vec<(String, String, bool, bool)> = snapshot(&seg, &ReadOptions::default())
        .unwrap()
        .actors
        .iter()
        .map(|a| (a.user.clone(), a.host.clone(), a.enabled, a.history))
        .collect();
    assert!(
        actors.contains(&("batch".into(), "%".into(), false, false))
            && actors.contains(&("%".into(), "%".into(), true, true)),
        "{actors:?}"
    );
    let out = run("PFS_SHM_DIR", odd.as_os_str());
    assert!(
        out.starts_with(b"{\"rc\":0,"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let segments = std::fs::read_dir(&odd).unwrap().count();
    assert_eq!(segments, 1, "the segment is in the directory named");
}

/// Starts `pfs_c_edges` in a mode that records, keeps its threads alive
/// and prints `{"ready":true,"segment":...}`: the program (ended by
/// `finish`), that line, and a snapshot of its segment.
fn start_edges(mode: &str, args: &[&str]) -> (Writer, Value, SegmentSnapshot) {
    let exe = compile("pfs_c_edges.c");
    let mut all = vec![mode];
    all.extend_from_slice(args);
    let mut w = Writer::spawn(&exe, &all).unwrap();
    let ready = w
        .read_json(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("pfs_c_edges {mode}: {e:#}"));
    assert_eq!(ready["ready"], true, "{ready}");
    let file = std::fs::File::open(ready["segment"].as_str().unwrap()).unwrap();
    let seg = Segment::open(file, false).unwrap();
    let snap = snapshot(&seg, &ReadOptions::default()).unwrap();
    (w, ready, snap)
}

/// Ends a program of [`start_edges`]: a clean exit, nothing on stderr
/// but the library's warnings `warned` ([`warned_exactly`]).
fn finish_edges(mut w: Writer, warned: &[&str]) {
    w.finish(Duration::from_secs(20)).unwrap();
    warned_exactly(&w.guard.stderr(), warned);
}

/// Whether a C program's standard error holds exactly the library's
/// warnings `warned`, once each, in any order: one line `pfs: ...` per
/// warning, each containing one of `warned`, and nothing else.
fn warned_exactly(stderr: &str, warned: &[&str]) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), warned.len(), "warnings:\n{stderr}");
    for w in warned {
        let n = lines
            .iter()
            .filter(|l| l.starts_with("pfs: ") && l.contains(w))
            .count();
        assert_eq!(n, 1, "{w:?} once in:\n{stderr}");
    }
}

/// The index of class `name` (panics if it is not registered).
fn class_index(s: &SegmentSnapshot, name: &str) -> u32 {
    s.classes
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("class {name} not registered"))
        .index
}

/// The process total of class `name`: exited threads' folds and live
/// threads' rows.
fn class_total(s: &SegmentSnapshot, name: &str) -> Summary {
    let class = class_index(s, name);
    let mut total = Summary::ZERO;
    for (_, r) in s
        .exited
        .iter()
        .chain(s.live_rows.iter())
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
        .filter(|(c, _)| *c == class)
    {
        total.count += r.count;
        total.timed_count += r.timed_count;
        total.bytes += r.bytes;
        total.statement.rows_sent += r.statement.rows_sent;
        total.statement.errors += r.statement.errors;
    }
    total
}

/// `readelf -d` of `file`.
fn dynamic_section(file: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .expect("run readelf");
    assert!(out.status.success(), "readelf -d {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The library's SONAME is `libpfs.so.<PFS_ABI_VERSION>`, install.sh
/// lays out the usual names, a program linked with `-lpfs` needs the
/// SONAME, and the ABI check refuses a header that does not match.
#[test]
fn libpfs_is_versioned_and_checks_the_abi() {
    let inst = install();
    let lib = inst.prefix.join("lib");
    let real = format!("libpfs.so.{}", env!("CARGO_PKG_VERSION"));
    assert!(
        dynamic_section(&lib.join(&real)).contains("Library soname: [libpfs.so.0]"),
        "no SONAME libpfs.so.0 in {real}"
    );
    assert_eq!(
        std::fs::read_link(lib.join("libpfs.so.0")).unwrap(),
        Path::new(&real)
    );
    assert_eq!(
        std::fs::read_link(lib.join("libpfs.so")).unwrap(),
        Path::new("libpfs.so.0")
    );
    let exe = compile("pfs_c_edges.c");
    assert!(
        dynamic_section(&exe).contains("Shared library: [libpfs.so.0]"),
        "the program needs libpfs.so.0"
    );
    let dir = tempfile::tempdir().unwrap();
    let got = run_edges("abi", &[dir.path().to_str().unwrap()]);
    assert_eq!(got["abi"], 0, "{got}");
    // Checked late (after pfs_init): the program's structs are left alone
    // and nothing more is recorded (the wait before the check is).
    let late = tempfile::tempdir().unwrap();
    let (w, got, snap) = start_edges("abi_late", &[late.path().to_str().unwrap()]);
    assert_eq!(
        (&got["untouched"], &got["counted"]),
        (&Value::from(1), &Value::from(0)),
        "{got}"
    );
    // (Classes register at their first use: one not registered recorded
    // nothing.)
    let registered = |name: &str| snap.classes.iter().any(|c| c.name == name);
    assert_eq!(class_total(&snap, "wait/synch/mutex/c/late").count, 1);
    for name in ["statement/c/late", "stage/c/late"] {
        assert!(
            !registered(name) || class_total(&snap, name).count == 0,
            "{name} recorded after the failed check"
        );
    }
    assert!(
        !registered("memory/c/late") || memory_total(&snap, "memory/c/late") == (0, 0, 0),
        "memory counted after the failed check"
    );
    finish_edges(w, &[]);
}

/// The memory of class `name` over the process's threads, live and
/// exited: (COUNT_ALLOC, COUNT_FREE, CURRENT_NUMBER_OF_BYTES_USED).
fn memory_total(s: &SegmentSnapshot, name: &str) -> (u64, u64, i64) {
    let m = s.memory_of(class_index(s, name));
    (m.count_alloc, m.count_free, m.current_bytes)
}

/// Sessions in thread-specific data, ended by their `pthread_key_create`
/// destructor after the library's thread-exit hook has folded the
/// thread's record (glibc's order), run under valgrind: no read or write
/// of freed memory, no crash. The wait and the statement ended then are
/// not recorded (their thread's context is gone); each memory free is, on
/// the process's row, so the class's CURRENT comes back to zero.
#[test]
fn events_ended_by_a_key_destructor_touch_nothing_freed() {
    const SESSIONS: u64 = 3;
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("pfs_c_edges.c");
    let args = [
        "-q",
        "--error-exitcode=99",
        exe.to_str().unwrap(),
        "key_dtor",
        dir.path().to_str().unwrap(),
        "c-key-dtor",
        &SESSIONS.to_string(),
    ];
    let mut w = Writer::spawn(Path::new("valgrind"), &args).unwrap();
    let ready = w
        .read_json(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("pfs_c_edges key_dtor: {e:#}"));
    let file = std::fs::File::open(ready["segment"].as_str().unwrap()).unwrap();
    let seg = Segment::open(file, false).unwrap();
    let snap = snapshot(&seg, &ReadOptions::default()).unwrap();
    assert_eq!(
        class_total(&snap, "wait/synch/mutex/cedge/session").count,
        0
    );
    assert_eq!(class_total(&snap, "statement/cedge/session").count, 0);
    assert_eq!(
        memory_total(&snap, "memory/cedge/session"),
        (SESSIONS, SESSIONS, 0)
    );
    w.finish(Duration::from_secs(120)).unwrap();
    assert!(
        w.guard.stderr().is_empty(),
        "valgrind or pfs_c_edges complained:\n{}",
        w.guard.describe()
    );
}

/// An end (or a statement's set) on a thread that did not begin the
/// struct is a no-op: a wait begun on a live thread (which still ends
/// it), one begun on a thread that has exited since (its context freed
/// and overwritten), stale memory an exited thread left (ended by a later
/// thread and by main), and garbage. Nothing crashes, nothing phantom is
/// recorded.
#[test]
fn an_end_by_a_thread_that_did_not_begin_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _, snap) = start_edges("owner", &[dir.path().to_str().unwrap(), "c-owner"]);
    let waits = class_total(&snap, "wait/synch/mutex/cedge/owned");
    assert_eq!(
        (waits.count, waits.bytes),
        (2, 7),
        "the owner's end (7 bytes) and leaves_a_copy's, nothing else"
    );
    let st = class_total(&snap, "statement/cedge/owned");
    assert_eq!(
        (st.count, st.statement.rows_sent, st.statement.errors),
        (1, 1, 0),
        "the owner's statement, without main's figures"
    );
    assert_eq!(
        snap.lost[LostKind::ForeignEnds as usize],
        6,
        "the refused ends of structs another thread began: main's two of the \
         shared wait and one of the shared statement, the orphan's, and the \
         stale copy ended by a later thread and by main; not the garbage"
    );
    finish_edges(w, &[]);
}

/// docs/C-API.md's Python recipe, as a Python developer copies it: cffi
/// loads `pfs.h` preprocessed without its `#include` lines (with them,
/// cffi cannot parse glibc's headers), then records ten statements, which
/// the segment holds.
#[test]
fn the_documented_cffi_recipe_loads_the_header_and_records() {
    let inst = install();
    let doc = std::fs::read_to_string(workspace_root().join("docs/C-API.md")).unwrap();
    let start = doc.find("```python\n").expect("a python block in C-API.md") + "```python\n".len();
    let recipe = &doc[start..start + doc[start..].find("```").unwrap()];
    let recipe: String = recipe
        .lines()
        .map(|l| format!("{}\n", l.trim_start()))
        .collect();
    assert!(recipe.contains("/usr/local/include/pfs.h") && recipe.contains("\"libpfs.so.0\""));
    let header = inst.prefix.join("include/pfs.h");
    let lib = inst.prefix.join("lib/libpfs.so.0");
    let dir = tempfile::tempdir().unwrap();
    let script = recipe
        .replace("/usr/local/include/pfs.h", header.to_str().unwrap())
        .replace("\"libpfs.so.0\"", &format!("{:?}", lib.to_str().unwrap()))
        + &format!(
            "cfg = ffi.new(\"pfs_config_t *\")\n\
             name, shm = ffi.new(\"char[]\", b\"py-cffi\"), ffi.new(\"char[]\", {:?}.encode())\n\
             cfg.service_name, cfg.shm_dir = name, shm\n\
             buf = ffi.new(\"char[4096]\")\n\
             assert lib.pfs_init_with(cfg) == 0, (lib.pfs_init_error(buf, 4096), ffi.string(buf))\n\
             cls = lib.pfs_statement_class_register(b\"statement/py/req\")\n\
             st = ffi.new(\"pfs_statement_t *\")\n\
             for i in range(10):\n\
             \x20   lib.pfs_statement_begin(st, cls)\n\
             \x20   lib.pfs_statement_set_rows_sent(st, i)\n\
             \x20   lib.pfs_statement_end(st)\n\
             import json, sys\n\
             lib.pfs_segment_path(buf, 4096)\n\
             print(json.dumps({{\"ready\": True, \"segment\": ffi.string(buf).decode()}}), flush=True)\n\
             sys.stdin.read()\n",
            dir.path().to_str().unwrap()
        );
    let path = dir.path().join("recipe.py");
    std::fs::write(&path, &script).unwrap();
    let mut w = Writer::spawn(Path::new("python3"), &[path.to_str().unwrap()]).unwrap();
    let ready = w
        .read_json(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e:#}\n{script}\n{}", w.guard.describe()));
    let file = std::fs::File::open(ready["segment"].as_str().unwrap()).unwrap();
    let snap = snapshot(
        &Segment::open(file, false).unwrap(),
        &ReadOptions::default(),
    )
    .unwrap();
    let st = class_total(&snap, "statement/py/req");
    assert_eq!((st.count, st.statement.rows_sent), (10, 45));
    w.finish(Duration::from_secs(20)).unwrap();
}

/// A statement left open (an exception between begin and end) and its
/// struct begun again: the open one ends first, with one error, and the
/// statements begun inside it and left open with it are forgotten, so that
/// the thread's later statements nest in none of them.
#[test]
fn a_statement_begun_again_while_open_ends_first_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (w, _, snap) = start_edges("abandoned", &[dir.path().to_str().unwrap(), "c-abandoned"]);
    let st = class_total(&snap, "statement/cedge/abandoned");
    assert_eq!(
        (st.count, st.statement.rows_sent, st.statement.errors),
        (12, 10, 4),
        "twelve statements, four ended by the next begin as errors"
    );
    assert_eq!(
        st.timed_count, 8,
        "the four ended by the next begin have no duration (when they ended is not known)"
    );
    assert_eq!(
        class_total(&snap, "statement/cedge/inner").count,
        0,
        "abandoned inside one begun again: forgotten"
    );
    let after = class_index(&snap, "statement/cedge/after");
    let history = &snap.threads[0].statements_history;
    let last = history
        .iter()
        .find(|e| e.ev.class == after)
        .expect("the last statement in the history");
    assert_eq!(
        (last.ev.nesting_event_id, last.ev.nesting_event_type),
        (None, None),
        "nested in none of the abandoned ones"
    );
    let abandoned = class_index(&snap, "statement/cedge/abandoned");
    for e in history.iter().filter(|e| e.ev.class == abandoned) {
        assert_eq!(e.ev.nesting_event_id, None, "{e:?}");
    }
    finish_edges(w, &[]);
}

/// Threads that find no free record count every event as lost, exactly
/// and at once (`pfs_lost_total{kind="events_no_thread_record"}`): 40
/// threads alive together, 16 records.
#[test]
fn events_of_threads_without_a_record_are_counted_exactly() {
    const THREADS: u64 = 40;
    const EVENTS: u64 = 250;
    let dir = tempfile::tempdir().unwrap();
    let (w, _, snap) = start_edges(
        "lost",
        &[
            dir.path().to_str().unwrap(),
            "c-lost",
            &THREADS.to_string(),
            &EVENTS.to_string(),
        ],
    );
    let recorded = snap.threads.len() as u64;
    assert_eq!(recorded, 16, "max_threads 16: 16 records");
    let busy = class_total(&snap, "wait/synch/mutex/cedge/busy");
    assert_eq!(busy.count, recorded * EVENTS);
    assert_eq!(snap.lost[LostKind::Threads as usize], THREADS - recorded);
    assert_eq!(
        snap.lost[LostKind::Events as usize],
        (THREADS - recorded) * EVENTS,
        "every event of every thread without a record, the first included"
    );
    finish_edges(w, &["all 16 thread records of the segment are in use"]);
}

/// A C thread's row is named by its OS name (`pthread_setname_np`) or by
/// `pfs_set_thread_name`, before or after its first event, cut to 32
/// bytes.
#[test]
fn c_threads_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (w, ready, snap) = start_edges("names", &[dir.path().to_str().unwrap(), "c-names"]);
    let name_of = |key: &str| {
        let id = ready[key].as_u64().unwrap();
        snap.threads
            .iter()
            .find(|t| t.thread_id == id)
            .unwrap_or_else(|| panic!("no thread {id} ({key}) in {:?}", snap.threads))
            .name
            .to_string()
    };
    assert_eq!(name_of("os"), "c-os-named");
    assert_eq!(name_of("api"), "pfs-named-worker");
    assert_eq!(name_of("renamed"), "renamed-later");
    assert_eq!(name_of("long"), "a-thread-name-of-forty-bytes-lon");
    assert_eq!(
        snap.lost[LostKind::Classes as usize],
        4,
        "the four misnamed registrations are counted, as a Rust program's are"
    );
    // And said, on standard error (a C program has no subscriber).
    finish_edges(
        w,
        &[
            "not a PFS wait instrument name: \"stage/cedge/not_a_wait\"",
            "not a PFS stage instrument name: \"wait/synch/mutex/cedge/not_a_stage\"",
            "not a PFS statement instrument name: \"statement/\"",
            "not a PFS memory instrument name: \"mem/cedge/buf\"",
        ],
    );
}

/// `pfs_init_with` checks every field as the `PFS_*` variables are
/// checked (a consumer typo, unknown flags, numbers out of range: an
/// invalid argument naming the C field), `pfs_strerror` describes each
/// code, negative codes are parenthesised, and a 399-byte service name is
/// cut to 64 bytes instead of failing on the file name.
#[test]
fn pfs_config_t_is_checked_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let got = run_edges("config", &[dir.path().to_str().unwrap()]);
    let segment = PathBuf::from(got["segment"].as_str().unwrap());
    assert_eq!(
        segment.file_name().unwrap().to_str().unwrap(),
        format!("{}.{}.pfs", "s".repeat(64), got["pid"])
    );
}

/// C++ includes pfs.h warning-free under -Wall -Wextra -Werror, with
/// `PFS_CONFIG_INIT` for a config, `PFS_CHECK_ABI()` and the `SOURCE`
/// macros.
#[test]
fn cxx_programs_initialise_a_config_without_warnings() {
    let exe = compile_with("c++", "-std=c++11", "pfs_cxx_config.cpp");
    let out = Command::new(&exe).output().expect("run pfs_cxx_config");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"ok":true}"#
    );
}

/// Runs `pfs_c_posix_threads` with `args`; its exit status and stdout.
fn run_posix(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let exe = compile("pfs_c_posix_threads.c");
    let out = Command::new(&exe).args(args).output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A service that blocks SIGTERM after `pfs_init` and waits for it with
/// `sigwait` gets it: the library's thread blocks every asynchronous
/// signal, so the kernel never delivers the process's SIGTERM to it
/// (where its default action would kill the process).
#[test]
fn sigterm_reaches_the_applications_sigwait() {
    let dir = tempfile::tempdir().unwrap();
    let (status, out, err) = run_posix(&["sigwait", dir.path().to_str().unwrap()]);
    assert!(
        status.success() && out.trim() == "sigwait 15",
        "{status}: {out}{err}"
    );
}

/// Threads cancelled (`pthread_cancel`) while their first event registers
/// them do not abort the process: the library's slow paths hold
/// cancellation off.
#[test]
fn threads_cancelled_in_their_first_event_do_not_abort_the_process() {
    // On tmpfs, as segments usually are (every page reservation is a
    // `fallocate`, a cancellation point).
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let (status, out, err) = run_posix(&["cancel", dir.path().to_str().unwrap(), "2000"]);
    assert!(
        status.success() && out.trim() == "survived 2000",
        "{status}: {out}{err}"
    );
}

/// The README's C example is a whole program: it compiles as written
/// against the staged install, and runs (into a temporary directory).
#[test]
fn the_readme_c_example_compiles_and_runs() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let section = readme
        .split("## Instrumenting C, C++ and other languages")
        .nth(1)
        .expect("the README's C section");
    let code = section
        .split("```c\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a C block");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("readme_example.c");
    std::fs::write(&src, code).unwrap();
    let exe = dir.path().join("readme_example");
    build_c("cc", "-std=c11", &src, &exe);
    let shm = dir.path().join("shm");
    let run = Command::new(&exe)
        .env("PFS_SHM_DIR", &shm)
        .env("PFS_SERVICE_NAME", "readme-c")
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let segments = std::fs::read_dir(&shm).unwrap().count();
    assert_eq!(segments, 1, "it wrote its segment");
}

/// docs/C-API.md's full example, compiled as it is written (its segment
/// directory pointed at a temporary one) and run: its statement, its named
/// log write (`OBJECT_NAME`, bytes) are in its segment.
#[test]
fn the_c_api_full_example_compiles_and_runs() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/C-API.md")).unwrap();
    let code = doc
        .split("## A full example")
        .nth(1)
        .and_then(|s| s.split("```c\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("a C block under C-API.md's \"A full example\"");
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let code = code.replace(
        "cfg.shm_dir = \"/dev/shm/pfs\";",
        &format!("cfg.shm_dir = \"{}\";", shm.display()),
    );
    assert!(
        code.contains(&shm.display().to_string()),
        "the example sets shm_dir"
    );
    let src = dir.path().join("c_api_example.c");
    std::fs::write(&src, code).unwrap();
    let exe = dir.path().join("c_api_example");
    build_c("cc", "-std=c11", &src, &exe);
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success(), "{run:?}");
    assert_eq!(String::from_utf8_lossy(&run.stdout), "GET user:42\n");
    let segment = std::fs::read_dir(&shm)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "pfs"))
        .expect("it wrote its segment");
    let s = snapshot(
        &Segment::open(std::fs::File::open(&segment).unwrap(), false).unwrap(),
        &ReadOptions::default(),
    )
    .unwrap();
    let log = class_total(&s, "wait/io/file/capp/log");
    assert_eq!((log.count, log.bytes), (1, 12), "one write of 12 bytes");
    assert_eq!(class_total(&s, "statement/capp/get").count, 1);
    assert!(
        s.strings.values().any(|t| t == "/dev/stdout"),
        "the log's OBJECT_NAME is interned: {:?}",
        s.strings
    );
}

/// Async tasks from C (`pfs_task_t`): two tasks resumed in turn by two
/// threads, each resume entered. Each task's statement is under a
/// `THREAD_ID` of its own (not a thread's), and every stage and wait of
/// every resume, on either thread, nests in its own task's statement,
/// never in the statement the resuming thread has open meanwhile; the
/// statement's figures, text and `SOURCE` come through; `CPU_TIME` is at
/// most the wall time; a task freed with its statement open records it
/// cancelled, its open stage ended; a statement ended after the task's
/// last resume is still ended inside it; and a task entered on one thread
/// is refused to the others.
#[test]
fn c_tasks_keep_their_events_across_threads() {
    use pfs_shm_layout::EventKind;
    let dir = tempfile::tempdir().unwrap();
    let (w, ready, s) = start_edges("tasks", &[dir.path().to_str().unwrap(), "c-tasks"]);
    let request = class_index(&s, "statement/cedge/task_request");
    let own = class_index(&s, "statement/cedge/thread_own");
    let step = class_index(&s, "stage/cedge/task_step");
    let lock = class_index(&s, "wait/synch/mutex/cedge/task_lock");
    let statements: BTreeMap<&str, _> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == request)
        .map(|e| (e.text.as_str(), e))
        .collect();
    assert_eq!(
        statements.keys().copied().collect::<Vec<_>>(),
        ["task one", "task three", "task two", "task zero"]
    );
    let threads: Vec<u64> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == own)
        .map(|e| e.ev.thread_id)
        .chain([ready["main"].as_u64().unwrap()])
        .collect();
    assert_eq!(threads.len(), 3, "two resuming threads' own statements");
    for (k, text) in ["task zero", "task one"].into_iter().enumerate() {
        let st = statements[text];
        assert!(
            !threads.contains(&st.ev.thread_id),
            "a task's own THREAD_ID"
        );
        assert_eq!(
            st.ev.nesting_event_id, None,
            "a task's statement has no parent"
        );
        assert_eq!(st.figures.rows_sent, 10 + k as u64);
        assert_eq!(st.figures.errors, k as u64);
        assert_eq!(st.figures.cancelled, 0);
        assert!(st.figures.cpu_time_ps <= st.ev.timer_wait.unwrap());
        assert!(st.figures.cpu_time_ps > 0, "entered time counted");
        let source = st
            .ev
            .source
            .and_then(|id| s.strings.get(&id))
            .cloned()
            .unwrap_or_default();
        assert!(source.starts_with("pfs_c_edges.c:"), "SOURCE {source}");
        // Four resumes, each a stage holding a wait, all the task's.
        let stages: Vec<_> = s.long[EventKind::Stage.index()]
            .iter()
            .filter(|e| e.class == step && e.thread_id == st.ev.thread_id)
            .collect();
        assert_eq!(stages.len(), 4, "{text}: {stages:?}");
        for g in &stages {
            assert_eq!(g.nesting_event_id, Some(st.ev.event_id));
            assert_eq!(g.nesting_event_type, Some(EventKind::Statement));
        }
        let waits: Vec<_> = s.long[EventKind::Wait.index()]
            .iter()
            .filter(|e| e.class == lock && e.object_instance == k as u64)
            .collect();
        assert_eq!(waits.len(), 4, "{text}");
        for wt in &waits {
            assert_eq!(wt.thread_id, st.ev.thread_id, "{text}: {wt:?}");
            assert_eq!(wt.nesting_event_type, Some(EventKind::Stage));
            assert!(
                stages
                    .iter()
                    .any(|g| Some(g.event_id) == wt.nesting_event_id),
                "{text}: the wait nests in one of its task's stages"
            );
        }
    }
    // Freed with its statement and stage open: both end, the statement
    // cancelled. Ended after its last resume, outside it: inside all the
    // same (its stage ends with it), not cancelled.
    // (A NULL digest text set after the text changed neither.)
    assert_eq!(statements["task three"].figures.digest, 0);
    for (text, cancelled) in [("task two", 1), ("task three", 0)] {
        let st = statements[text];
        assert_eq!(st.figures.cancelled, cancelled, "{text}");
        assert!(!threads.contains(&st.ev.thread_id), "{text}");
        let stage = s.long[EventKind::Stage.index()]
            .iter()
            .find(|e| e.class == step && e.thread_id == st.ev.thread_id)
            .unwrap_or_else(|| panic!("{text}: its stage ended"));
        assert_eq!(stage.nesting_event_id, Some(st.ev.event_id), "{text}");
        assert!(
            stage
                .end_event_id
                .is_some_and(|e| e <= st.ev.end_event_id.unwrap())
        );
    }
    finish_edges(w, &[]);
}

/// Python `asyncio` through `ctypes`, as docs/C-API.md ("Async tasks")
/// says to: every coroutine wrapped so that each step runs entered in a
/// `pfs_task_t` of its own. Twenty tasks interleave on the one event-loop
/// thread; each one's statement has its own `THREAD_ID`, and its stage
/// and three waits (recorded in different steps, between other tasks'
/// steps) nest in it, none in another task's; a task cancelled while it
/// sleeps records its statement as cancelled.
#[test]
fn python_asyncio_tasks_keep_their_events() {
    use pfs_shm_layout::EventKind;
    let install = install();
    let dir = tempfile::tempdir().unwrap();
    let script = workspace_root().join("tests/c/pfs_asyncio.py");
    let lib = install.prefix.join("lib/libpfs.so");
    let header = install.prefix.join("include/pfs.h");
    let args = [
        script.to_str().unwrap(),
        lib.to_str().unwrap(),
        header.to_str().unwrap(),
        dir.path().to_str().unwrap(),
        "py-asyncio",
    ];
    let mut w = Writer::spawn(Path::new("python3"), &args).unwrap();
    let ready = w
        .read_json(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("pfs_asyncio.py: {e:#}"));
    let requests = ready["requests"].as_u64().unwrap();
    let file = std::fs::File::open(ready["segment"].as_str().unwrap()).unwrap();
    let s = snapshot(
        &Segment::open(file, false).unwrap(),
        &ReadOptions::default(),
    )
    .unwrap();
    let request = class_index(&s, "statement/pyasync/request");
    let work = class_index(&s, "stage/pyasync/work");
    let lock = class_index(&s, "wait/synch/mutex/pyasync/lock");
    let statements: Vec<_> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == request)
        .collect();
    assert_eq!(statements.len() as u64, requests + 1);
    let mut threads = std::collections::BTreeSet::new();
    for st in &statements {
        assert!(threads.insert(st.ev.thread_id), "a THREAD_ID per task");
        if st.text == "cancelled" {
            assert_eq!(st.figures.cancelled, 1);
            continue;
        }
        assert_eq!(st.figures.cancelled, 0, "{}", st.text);
        let i: u64 = st.text.strip_prefix("request ").unwrap().parse().unwrap();
        let in_task = |kind: EventKind, class: u32| -> Vec<_> {
            s.long[kind.index()]
                .iter()
                .filter(|e| e.class == class && e.thread_id == st.ev.thread_id)
                .collect()
        };
        let stages = in_task(EventKind::Stage, work);
        assert_eq!(stages.len(), 1, "{}", st.text);
        assert_eq!(stages[0].nesting_event_id, Some(st.ev.event_id));
        let waits = in_task(EventKind::Wait, lock);
        assert_eq!(waits.len(), 3, "{}", st.text);
        for wt in waits {
            assert_eq!(wt.object_instance, i, "{}: another task's wait", st.text);
            assert_eq!(wt.nesting_event_id, Some(stages[0].event_id));
        }
    }
    w.finish(Duration::from_secs(20)).unwrap();
}
