//! Issue 5 across processes: the scripted `pfs-test-writer memory`
//! workload (see its doc comment) read back through every memory table of
//! the agent, every column equal to the hand-computed value; then TRUNCATE.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use pfs_tests::memory_tables::{Values, expect, memory_rows, serve, truncate};
use pfs_tests::{Writer, get_json, rows};
use serde_json::Value;

#[test]
fn memory_tables_are_exact() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm)?;
    let shm_s = shm.to_str().unwrap();
    let mut w = Writer::spawn(
        pfs_tests::writer_exe!(),
        &["memory", "--shm-dir", shm_s, "--service", "memtest"],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    if ready["ready"] != true {
        bail!("unexpected first line {ready}");
    }
    let (_agent, base) = serve(&shm)?;

    // Global: exited mem-3 plus live mem-1, mem-2 and main. CURRENT is
    // exactly alloc − free; LOW and HIGH are sums of the threads', and
    // the global LOW is clamped at 0 (buf: −2 blocks, −600 B summed).
    const BUF: &str = "memory/test/buf";
    const CACHE: &str = "memory/test/cache";
    expect(
        memory_rows(&base, "memory_summary_global_by_event_name", &[])?,
        &[
            (BUF, [4, 4, 750, 750, 0, 0, 3, 0, 0, 700]),
            (CACHE, [3, 2, 1017, 17, 0, 1, 3, 0, 1000, 1017]),
        ],
        "global",
    );

    // By thread: names through the threads table.
    let threads = get_json(&format!("{base}/api/v1/tables/threads"))?;
    let id = |name: &str| -> Result<String> {
        rows(&threads)?
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["thread_id"].to_string())
            .with_context(|| format!("thread {name} in {threads}"))
    };
    let (t1, t2, tm) = (id("mem-1")?, id("mem-2")?, id("main")?);
    let k = |t: &str, n: &str| format!("{t} {n}");
    let mut want = [
        (k(&t1, BUF), [2, 1, 300, 100, 0, 1, 2, 0, 200, 300]),
        (k(&t1, CACHE), [1, 0, 1000, 0, 0, 1, 1, 0, 1000, 1000]),
        (k(&t2, BUF), [1, 2, 50, 250, -1, -1, 0, -200, -200, 0]),
        (k(&tm, BUF), [0, 1, 0, 400, -1, -1, 0, -400, -400, 0]),
        (k(&tm, CACHE), [1, 1, 7, 7, 0, 0, 1, 0, 0, 7]),
    ];
    want.sort();
    let want_ref: Vec<(&str, Values)> = want.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    expect(
        memory_rows(
            &base,
            "memory_summary_by_thread_by_event_name",
            &["thread_id"],
        )?,
        &want_ref,
        "by thread",
    );

    // By account/user/host: mem-1 + mem-2 (alice@h1); mem-3 (bob@h2)
    // exited, so its memory is in the global table only; main declared no
    // actor.
    let alice_buf = [3, 3, 350, 350, -1, 0, 2, -200, 0, 300];
    let alice_cache = [1, 0, 1000, 0, 0, 1, 1, 0, 1000, 1000];
    expect(
        memory_rows(
            &base,
            "memory_summary_by_account_by_event_name",
            &["user", "host"],
        )?,
        &[
            ("alice h1 memory/test/buf", alice_buf),
            ("alice h1 memory/test/cache", alice_cache),
        ],
        "by account",
    );
    expect(
        memory_rows(&base, "memory_summary_by_user_by_event_name", &["user"])?,
        &[
            ("alice memory/test/buf", alice_buf),
            ("alice memory/test/cache", alice_cache),
        ],
        "by user",
    );
    expect(
        memory_rows(&base, "memory_summary_by_host_by_event_name", &["host"])?,
        &[
            ("h1 memory/test/buf", alice_buf),
            ("h1 memory/test/cache", alice_cache),
        ],
        "by host",
    );

    // The instrumentation's own memory: global table only.
    let g = get_json(&format!(
        "{base}/api/v1/tables/memory_summary_global_by_event_name"
    ))?;
    let own: Vec<&Value> = rows(&g)?
        .iter()
        .filter(|r| {
            r["event_name"]
                .as_str()
                .is_some_and(|n| n.starts_with("memory/performance_schema/"))
        })
        .collect();
    assert!(
        own.iter().any(|r| r["current_number_of_bytes_used"]
            .as_i64()
            .is_some_and(|b| b > 0)),
        "{own:?}"
    );
    assert!(own.iter().all(|r| r["count_free"] == 0));

    // Metrics: the global values by instrument.
    let m = pfs_tests::parse_metrics(&pfs_tests::http_get(&format!("{base}/metrics"))?.body)?;
    let labels = [("service", "memtest"), ("event_name", CACHE)];
    assert_eq!(
        pfs_tests::sample(&m, "pfs_memory_allocations_total", &labels)?,
        3.0
    );
    assert_eq!(
        pfs_tests::sample(&m, "pfs_memory_freed_bytes_total", &labels)?,
        17.0
    );
    assert_eq!(
        pfs_tests::sample(&m, "pfs_memory_used_bytes", &labels)?,
        1000.0
    );
    assert_eq!(
        pfs_tests::sample(&m, "pfs_memory_used_high_bytes", &labels)?,
        1017.0
    );

    // TRUNCATE the global table: COUNT_ALLOC and COUNT_FREE are both
    // reduced by the smaller of the two (and so are the SUM_* pair), so
    // CURRENT stays ALLOC − FREE; LOW = HIGH = CURRENT; nothing is freed;
    // the dependent tables are truncated too.
    truncate(&base, "memory_summary_global_by_event_name")?;
    expect(
        memory_rows(&base, "memory_summary_global_by_event_name", &[])?,
        &[
            (BUF, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            (CACHE, [1, 0, 1000, 0, 1, 1, 1, 1000, 1000, 1000]),
        ],
        "global after truncate",
    );
    let mut want = [
        (k(&t1, BUF), [1, 0, 200, 0, 1, 1, 1, 200, 200, 200]),
        (k(&t1, CACHE), [1, 0, 1000, 0, 1, 1, 1, 1000, 1000, 1000]),
        (k(&t2, BUF), [0, 1, 0, 200, -1, -1, -1, -200, -200, -200]),
        (k(&tm, BUF), [0, 1, 0, 400, -1, -1, -1, -400, -400, -400]),
        (k(&tm, CACHE), [0; 10]),
    ];
    want.sort();
    let want_ref: Vec<(&str, Values)> = want.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    expect(
        memory_rows(
            &base,
            "memory_summary_by_thread_by_event_name",
            &["thread_id"],
        )?,
        &want_ref,
        "by thread after truncate",
    );
    // /metrics never go backwards.
    let m = pfs_tests::parse_metrics(&pfs_tests::http_get(&format!("{base}/metrics"))?.body)?;
    assert_eq!(
        pfs_tests::sample(&m, "pfs_memory_allocations_total", &labels)?,
        3.0
    );
    w.finish(Duration::from_secs(20))?;
    // Once the process has ended, nothing is in use, but its peak stays
    // until the segment is retired (a batch job's peak, scraped after it
    // exited): the global table's HIGH, 1000 since the truncation.
    let used = |m: &[pfs_tests::Sample], name| pfs_tests::sample(m, name, &labels);
    let m = pfs_tests::poll(Duration::from_secs(20), || {
        let m = pfs_tests::parse_metrics(&pfs_tests::http_get(&format!("{base}/metrics"))?.body)?;
        Ok((used(&m, "pfs_memory_used_bytes")? == 0.0).then_some(m))
    })?;
    assert_eq!(used(&m, "pfs_memory_used_high_bytes")?, 1000.0);
    assert_eq!(used(&m, "pfs_memory_used_low_bytes")?, 0.0);
    assert_eq!(used(&m, "pfs_memory_allocations_total")?, 3.0);
    let g = get_json(&format!(
        "{base}/api/v1/tables/memory_summary_global_by_event_name"
    ))?;
    let row = (rows(&g)?.iter())
        .find(|r| r["event_name"] == CACHE)
        .expect("the ended process's row");
    assert_eq!(row["high_number_of_bytes_used"], 1000);
    Ok(())
}
