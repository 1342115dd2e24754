//! The memory section of the MySQL manual, rule by rule, across
//! processes: `pfs-test-writer memscript` runs one memory operation at a
//! time on named threads, and after each phase every column of the
//! memory tables is compared with values computed by hand here (see the
//! comments: `[COUNT_ALLOC, COUNT_FREE, SUM_ALLOC, SUM_FREE, LOW, CURRENT,
//! HIGH (blocks), LOW, CURRENT, HIGH (bytes)]`). The rules checked:
//!
//! * per thread, LOW and HIGH start at 0 and follow CURRENT; a thread that
//!   frees another's memory goes negative;
//! * the global table sums the threads' and the exited threads' rows, and
//!   clamps LOW at 0 ("possible for values to go negative ... in summary
//!   tables other than memory_summary_global_by_event_name"), as do the
//!   service's `pfs_memory_used_low_*` gauges;
//! * TRUNCATE reduces COUNT_ALLOC and COUNT_FREE by the same value (and the
//!   SUM_* pair), so CURRENT stays ALLOC − FREE, and sets LOW = HIGH =
//!   CURRENT;
//! * truncating the by-thread table does not truncate the global one: the
//!   global HIGH stays at least the highest use since the last global
//!   truncation; truncating the global table truncates the by-thread one;
//! * a thread's exit folds its row into the global row, counts and
//!   watermarks.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use pfs_tests::memory_tables::{Values, expect, memory_rows, serve, truncate};
use pfs_tests::{Writer, get_json, rows};

const SCRIPT: &str = "memory/test/script";
const GLOBAL: &str = "memory_summary_global_by_event_name";
const BY_THREAD: &str = "memory_summary_by_thread_by_event_name";

/// Runs one script line in the writer.
fn step(w: &mut Writer, line: &str) -> Result<()> {
    w.send_line(line)?;
    let r = w.read_json(Duration::from_secs(20))?;
    if r["ok"] != line {
        bail!("{line}: {r}");
    }
    Ok(())
}

/// Runs script lines, then waits out the agent's snapshot cache.
fn steps(w: &mut Writer, lines: &[&str]) -> Result<()> {
    lines.iter().try_for_each(|l| step(w, l))?;
    std::thread::sleep(Duration::from_millis(1100));
    Ok(())
}

/// `THREAD_ID` of each named thread, from the threads table.
fn thread_ids(base: &str, names: &[&str]) -> Result<Vec<String>> {
    let t = get_json(&format!("{base}/api/v1/tables/threads"))?;
    let rows = rows(&t)?;
    names
        .iter()
        .map(|n| {
            rows.iter()
                .find(|r| r["name"] == *n)
                .map(|r| r["thread_id"].to_string())
                .with_context(|| format!("thread {n} in {t}"))
        })
        .collect()
}

fn check_global(base: &str, want: Values, what: &str) -> Result<()> {
    expect(memory_rows(base, GLOBAL, &[])?, &[(SCRIPT, want)], what);
    Ok(())
}

fn check_threads(base: &str, want: &[(&str, Values)], what: &str) -> Result<()> {
    let keyed: Vec<(String, Values)> = want
        .iter()
        .map(|(t, v)| (format!("{t} {SCRIPT}"), *v))
        .collect();
    let want: Vec<(&str, Values)> = keyed.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    expect(memory_rows(base, BY_THREAD, &["thread_id"])?, &want, what);
    Ok(())
}

fn gauge(base: &str, name: &str) -> Result<f64> {
    let m = pfs_tests::parse_metrics(&pfs_tests::http_get(&format!("{base}/metrics"))?.body)?;
    pfs_tests::sample(
        &m,
        name,
        &[("service", "memmanual"), ("event_name", SCRIPT)],
    )
}

#[test]
fn memory_tables_follow_the_manual() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm)?;
    let mut w = Writer::spawn(
        pfs_tests::writer_exe!(),
        &[
            "memscript",
            "--shm-dir",
            shm.to_str().unwrap(),
            "--service",
            "memmanual",
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    if ready["ready"] != true {
        bail!("unexpected first line {ready}");
    }
    let (_agent, base) = serve(&shm)?;

    // Phase 1, a transfer: A allocates two 1000 B blocks, B frees them.
    steps(
        &mut w,
        &[
            "spawn A",
            "spawn B",
            "alloc A a1 1000",
            "alloc A a2 1000",
            "free B a1",
            "free B a2",
        ],
    )?;
    let ids = thread_ids(&base, &["A", "B"])?;
    let (a, b) = (ids[0].as_str(), ids[1].as_str());
    check_threads(
        &base,
        &[
            (a, [2, 0, 2000, 0, 0, 2, 2, 0, 2000, 2000]),
            (b, [0, 2, 0, 2000, -2, -2, 0, -2000, -2000, 0]),
        ],
        "phase 1 by thread: B's LOW is negative",
    )?;
    // LOW sums to −2 / −2000: clamped at 0 in the global row only.
    check_global(
        &base,
        [2, 2, 2000, 2000, 0, 0, 2, 0, 0, 2000],
        "phase 1 global: LOW clamped at 0",
    )?;
    assert_eq!(gauge(&base, "pfs_memory_used_low_bytes")?, 0.0);
    assert_eq!(gauge(&base, "pfs_memory_used_low_blocks")?, 0.0);
    assert_eq!(gauge(&base, "pfs_memory_used_high_bytes")?, 2000.0);

    // Phase 2, the manual's TRUNCATE of a by-thread table: C holds 4
    // blocks (4500 B), none freed.
    steps(
        &mut w,
        &[
            "spawn C",
            "alloc C c1 1000",
            "alloc C c2 1000",
            "alloc C c3 1000",
            "alloc C c4 1500",
        ],
    )?;
    let c_id = thread_ids(&base, &["C"])?.remove(0);
    let c = c_id.as_str();
    // Global before: LOW 0 + −2 + 0 → 0; HIGH 2 + 0 + 4 = 6, 6500 B.
    let global_before = [6, 2, 6500, 2000, 0, 4, 6, 0, 4500, 6500];
    check_global(&base, global_before, "phase 2 global")?;
    truncate(&base, BY_THREAD)?;
    // Counts reduced by the smaller of ALLOC and FREE (0 for A and C, 0
    // for B): CURRENT = ALLOC − FREE still; LOW = HIGH = CURRENT.
    check_threads(
        &base,
        &[
            (a, [2, 0, 2000, 0, 2, 2, 2, 2000, 2000, 2000]),
            (b, [0, 2, 0, 2000, -2, -2, -2, -2000, -2000, -2000]),
            (c, [4, 0, 4500, 0, 4, 4, 4, 4500, 4500, 4500]),
        ],
        "phase 2 by thread after its TRUNCATE",
    )?;
    // The global table is not truncated: counts and watermarks unchanged
    // (the threads' watermarks now sum to LOW 4, HIGH 4, but the global
    // HIGH stays 6 / 6500 and LOW 0 / 0).
    check_global(
        &base,
        global_before,
        "phase 2 global after a by-thread TRUNCATE",
    )?;

    // Phase 3: C frees c4 (1500) and allocates 2000.
    steps(&mut w, &["free C c4", "alloc C c5 2000"])?;
    check_threads(
        &base,
        &[
            (a, [2, 0, 2000, 0, 2, 2, 2, 2000, 2000, 2000]),
            (b, [0, 2, 0, 2000, -2, -2, -2, -2000, -2000, -2000]),
            (c, [5, 1, 6500, 1500, 3, 4, 4, 3000, 5000, 5000]),
        ],
        "phase 3 by thread",
    )?;
    // Sums: LOW 2 − 2 + 3 = 3 (kept 0), HIGH 4 (kept 6); bytes LOW 3000
    // (kept 0), HIGH 5000 (kept 6500).
    check_global(
        &base,
        [7, 3, 8500, 3500, 0, 4, 6, 0, 5000, 6500],
        "phase 3 global",
    )?;

    // Phase 4: TRUNCATE the global table: every memory table.
    truncate(&base, GLOBAL)?;
    // Global counts reduced by min(7, 3) = 3 and min(8500, 3500) = 3500;
    // LOW = HIGH = CURRENT (sums of the reset threads: 2 − 2 + 4).
    check_global(
        &base,
        [4, 0, 5000, 0, 4, 4, 4, 5000, 5000, 5000],
        "phase 4 global after its TRUNCATE",
    )?;
    check_threads(
        &base,
        &[
            (a, [2, 0, 2000, 0, 2, 2, 2, 2000, 2000, 2000]),
            (b, [0, 2, 0, 2000, -2, -2, -2, -2000, -2000, -2000]),
            (c, [4, 0, 5000, 0, 4, 4, 4, 5000, 5000, 5000]),
        ],
        "phase 4 by thread, truncated with the global table",
    )?;
    // `pfs-agent query` shows the tables as the API does: since the
    // TRUNCATE (it reads the baselines the agent keeps in the directory).
    for table in [GLOBAL, BY_THREAD] {
        let out = std::process::Command::new(pfs_tests::agent_bin())
            .args(["query", table, "--format", "json", "--shm-dir"])
            .arg(&shm)
            .output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cli: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let http = get_json(&format!("{base}/api/v1/tables/{table}"))?;
        let sorted = |v: &serde_json::Value| {
            let mut r: Vec<String> = rows(v).unwrap().iter().map(|r| r.to_string()).collect();
            r.sort();
            r
        };
        assert_eq!(
            sorted(&cli),
            sorted(&http),
            "{table}: query and the API agree after TRUNCATE"
        );
    }

    // Phase 5, exit: B allocates 300 B, exits; A frees that block.
    steps(&mut w, &["alloc B b1 300", "exit B", "free A b1"])?;
    // B is gone from the by-thread table; A: FREE 1, LOW 1 / 1700.
    check_threads(
        &base,
        &[
            (a, [2, 1, 2000, 300, 1, 1, 2, 1700, 1700, 2000]),
            (c, [4, 0, 5000, 0, 4, 4, 4, 5000, 5000, 5000]),
        ],
        "phase 5 by thread",
    )?;
    // Global = exited B [1, 2, 300, 2000, −2, −1, −1, −2000, −1700, −1700]
    // + A + C, counts reduced by the phase 4 baseline (3 and 3500):
    // LOW −2 + 1 + 4 = 3, HIGH −1 + 2 + 4 = 5; bytes LOW −2000 + 1700 +
    // 5000 = 4700, HIGH −1700 + 2000 + 5000 = 5300 (the real peak: 5300,
    // while B's block was alive).
    check_global(
        &base,
        [5, 1, 5300, 300, 3, 4, 5, 4700, 5000, 5300],
        "phase 5 global after an exit",
    )?;
    assert_eq!(gauge(&base, "pfs_memory_used_bytes")?, 5000.0);
    assert_eq!(gauge(&base, "pfs_memory_used_high_bytes")?, 5300.0);
    assert_eq!(gauge(&base, "pfs_memory_used_low_bytes")?, 4700.0);
    // /metrics never go backwards: lifetime counts.
    assert_eq!(gauge(&base, "pfs_memory_allocations_total")?, 8.0);
    w.finish(Duration::from_secs(20))?;
    Ok(())
}
