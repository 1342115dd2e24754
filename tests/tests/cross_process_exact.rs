//! Exact cross-process accounting: a writer process records a known number
//! of waits (and knows every TIMER_WAIT it recorded); `pfs-agent` must
//! report exactly those counts and sums in its tables, in `/metrics`, and
//! in `pfs-agent query`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use pfs_tests::{
    Agent, TEST_CLASSES, agent_bin, poll, rows, sample, spawn_exact, str_col, u64_col, u128_col,
    writer_exe,
};
use serde_json::Value;

const N: u64 = 4;
const K: u64 = 500;
const M: u64 = 2;
const SERVICE: &str = "exact-xp";

/// Rows of `table` belonging to `service`, once at least `min` exist.
fn service_rows(agent: &Agent, table: &str, min: usize) -> (Value, Vec<Value>) {
    poll(Duration::from_secs(15), || {
        let t = agent.table(table)?;
        let r: Vec<Value> = rows(&t)?
            .iter()
            .filter(|r| r["service"] == SERVICE)
            .cloned()
            .collect();
        Ok((r.len() >= min).then_some((t, r)))
    })
    .unwrap_or_else(|e| {
        panic!(
            "table {table}: no {min} rows for {SERVICE}: {e:#}\n{}",
            agent.guard.describe()
        )
    })
}

fn check_columns(table: &Value, name: &str, want: &[&str]) {
    assert_eq!(table["table"], name, "{table}");
    let cols: Vec<&str> = table["columns"]
        .as_array()
        .unwrap_or_else(|| panic!("{name}: no columns array"))
        .iter()
        .map(|c| c.as_str().expect("column names are strings"))
        .collect();
    assert_eq!(
        &cols[..2],
        &["service", "pid"],
        "{name}: every row starts with service, pid"
    );
    for w in want {
        assert!(cols.contains(w), "{name}: missing column {w} in {cols:?}");
    }
    for r in rows(table).unwrap() {
        let keys: BTreeSet<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        let colset: BTreeSet<&str> = cols.iter().copied().collect();
        assert_eq!(keys, colset, "{name}: row keys differ from columns: {r}");
    }
}

/// `events_waits_histogram_by_event_name`'s rows for `name` are the
/// buckets of its `/metrics` histogram (`(le, cumulative)`, +Inf last):
/// every bound `/metrics` shows has a row whose `bucket_timer_high` is that
/// bound in ps and whose `count_bucket_and_lower` is its count; the rows
/// add up to `count_star`, and the summary's `quantile_*` columns name the
/// bucket of their rank.
fn histogram_table_is_the_metrics_histogram(
    agent: &Agent,
    name: &str,
    metrics: &[(f64, f64)],
    summary_rows: &[Value],
) {
    let table = "events_waits_histogram_by_event_name";
    let (t, rows) = service_rows(agent, table, 32);
    check_columns(
        &t,
        table,
        &[
            "event_name",
            "bucket_number",
            "bucket_timer_low",
            "bucket_timer_high",
            "count_bucket",
            "count_bucket_and_lower",
            "bucket_quantile",
        ],
    );
    let mine: Vec<&Value> = rows.iter().filter(|r| r["event_name"] == name).collect();
    assert_eq!(mine.len(), 32, "{table}: every bucket of {name}");
    let total = N * K;
    assert_eq!(
        mine.iter()
            .map(|r| u64_col(r, "count_bucket").unwrap())
            .sum::<u64>(),
        total,
        "{table}: {name}'s buckets add up to count_star"
    );
    for &(le, count) in metrics {
        let row = if le.is_infinite() {
            mine.last().copied()
        } else {
            let ps = (le * 1e12).floor() as u64;
            mine.iter()
                .copied()
                .find(|r| u64_col(r, "bucket_timer_high").ok() == Some(ps))
        };
        let row = row.unwrap_or_else(|| panic!("{table}: no row for le={le} of {name}"));
        assert_eq!(
            u64_col(row, "count_bucket_and_lower").unwrap() as f64,
            count,
            "{table}: {name} at le={le}"
        );
    }
    let summary = summary_rows
        .iter()
        .find(|r| r["event_name"] == name)
        .unwrap();
    let max = u64_col(summary, "max_timer_wait").unwrap();
    for (column, rank) in [
        ("quantile_95", (total * 95).div_ceil(100)),
        ("quantile_99", (total * 99).div_ceil(100)),
        ("quantile_999", (total * 999).div_ceil(1000)),
    ] {
        let holds = mine
            .iter()
            .find(|r| u64_col(r, "count_bucket_and_lower").unwrap() >= rank)
            .unwrap();
        let want = u64_col(holds, "bucket_timer_high")
            .ok()
            .unwrap_or(u64::MAX)
            .min(max);
        let q = u64_col(summary, column).unwrap();
        assert!(
            q == want || q == u64_col(summary, "min_timer_wait").unwrap(),
            "{name}: {column} {q}, want {want} (rank {rank} of {total})"
        );
    }
}

fn sorted_rows(t: &Value) -> Vec<Value> {
    let mut r = rows(t).unwrap().clone();
    r.sort_by_key(|r| r.to_string());
    r
}

#[test]
fn agent_reports_exact_counts_and_sums() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, ready) = spawn_exact(
        writer_exe!(),
        dir.path(),
        SERVICE,
        N as u32,
        K as u32,
        M as u32,
    )
    .unwrap();
    let pid = ready["pid"].as_u64().unwrap();
    let agent = Agent::serve(dir.path()).unwrap();

    // --- events_waits_summary_global_by_event_name -------------------------
    let table = "events_waits_summary_global_by_event_name";
    let (global, grows) = service_rows(&agent, table, 3);
    check_columns(
        &global,
        table,
        &[
            "event_name",
            "count_star",
            "sum_timer_wait",
            "min_timer_wait",
            "avg_timer_wait",
            "max_timer_wait",
            "sum_number_of_bytes",
        ],
    );
    for name in TEST_CLASSES {
        let want = &ready["classes"][name];
        let r: Vec<&Value> = grows.iter().filter(|r| r["event_name"] == name).collect();
        assert_eq!(r.len(), 1, "{table}: one row for {name}: {grows:?}");
        let r = r[0];
        assert_eq!(
            u64_col(r, "sum_number_of_bytes").unwrap(),
            want["bytes"].as_u64().unwrap(),
            "{table}: {name} sum_number_of_bytes, exact"
        );
        assert_eq!(u64_col(r, "pid").unwrap(), pid, "{r}");
        let count = u64_col(r, "count_star").unwrap();
        let sum = u128_col(r, "sum_timer_wait").unwrap();
        assert_eq!(count, N * K, "{name} count_star");
        assert_eq!(count, want["count"].as_u64().unwrap());
        assert_eq!(
            sum,
            u128::from(want["sum_ps"].as_u64().unwrap()),
            "{name} sum_timer_wait, exact ps"
        );
        let (min, avg, max) = (
            u64_col(r, "min_timer_wait").unwrap(),
            u64_col(r, "avg_timer_wait").unwrap(),
            u64_col(r, "max_timer_wait").unwrap(),
        );
        assert!(
            min <= avg && avg <= max,
            "{name}: min {min} avg {avg} max {max}"
        );
        assert!(
            (u128::from(avg)).abs_diff(sum / u128::from(count)) <= 1,
            "{name}: avg {avg} != sum/count {}",
            sum / u128::from(count)
        );
    }

    // --- /metrics ------------------------------------------------------------
    let resp = agent.get("/metrics").unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.content_type.as_deref(),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        "content type of /metrics"
    );
    assert!(
        resp.body.trim_end().ends_with("# EOF"),
        "OpenMetrics text must end with # EOF"
    );
    classic_text_passes_promtool(&agent.base, &resp.body);
    let m = pfs_tests::parse_metrics(&resp.body).unwrap();
    for name in TEST_CLASSES {
        let want = &ready["classes"][name];
        let l = [("service", SERVICE), ("event_name", name)];
        let total = sample(&m, "pfs_events_waits_total", &l).unwrap();
        assert_eq!(total, (N * K) as f64, "pfs_events_waits_total {name}");
        let secs = sample(&m, "pfs_events_waits_seconds_total", &l).unwrap();
        let want_secs = want["sum_ps"].as_u64().unwrap() as f64 / 1e12;
        assert!(
            ((secs - want_secs) / want_secs).abs() < 1e-9,
            "pfs_events_waits_seconds_total {name}: {secs} vs {want_secs}"
        );
        // Bytes: a series for the file instrument, exact; none for the
        // mutex and the rwlock, which move no data.
        let bytes = want["bytes"].as_u64().unwrap();
        match sample(&m, "pfs_events_waits_bytes_total", &l).ok() {
            Some(b) if name.starts_with("wait/io/") => {
                assert!(bytes > 0, "the writer's file waits carry bytes");
                assert_eq!(b, bytes as f64, "pfs_events_waits_bytes_total {name}");
            }
            None if !name.starts_with("wait/io/") => assert_eq!(bytes, 0),
            got => panic!("pfs_events_waits_bytes_total {name}: {got:?} (want {bytes})"),
        }
        let hcount = sample(&m, "pfs_events_waits_duration_seconds_count", &l).unwrap();
        assert_eq!(hcount, (N * K) as f64, "histogram _count {name}");
        let hsum = sample(&m, "pfs_events_waits_duration_seconds_sum", &l).unwrap();
        assert!(
            ((hsum - want_secs) / want_secs).abs() < 1e-9,
            "histogram _sum {name}: {hsum} vs {want_secs}"
        );
        let mut buckets: Vec<(f64, f64)> = m
            .iter()
            .filter(|s| s.name == "pfs_events_waits_duration_seconds_bucket" && s.has_labels(&l))
            .map(|s| {
                let le = &s.labels["le"];
                (
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap()
                    },
                    s.value,
                )
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.len() >= 2, "{name}: histogram buckets {buckets:?}");
        assert_eq!(
            buckets.last().unwrap(),
            &(f64::INFINITY, (N * K) as f64),
            "{name}: +Inf bucket"
        );
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{name}: buckets are cumulative: {buckets:?}"
        );
        histogram_table_is_the_metrics_histogram(&agent, name, &buckets, &grows);
    }
    assert_eq!(
        sample(&m, "pfs_threads", &[("service", SERVICE)]).unwrap(),
        (N - M) as f64,
        "pfs_threads"
    );
    assert_eq!(
        sample(&m, "pfs_agent_segments", &[("state", "live")]).unwrap(),
        1.0
    );

    // --- setup_instruments -----------------------------------------------------
    let (setup, srows) = service_rows(&agent, "setup_instruments", 3);
    check_columns(&setup, "setup_instruments", &["name", "enabled", "timed"]);
    for name in TEST_CLASSES {
        let r = srows
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("setup_instruments lacks {name}"));
        assert_eq!(r["enabled"], "YES", "{r}");
        assert_eq!(r["timed"], "YES", "{r}");
    }

    // --- threads -----------------------------------------------------------------
    let (threads, trows) = service_rows(&agent, "threads", (N - M) as usize);
    check_columns(
        &threads,
        "threads",
        &["thread_id", "name", "type", "thread_os_id", "instrumented"],
    );
    let live: BTreeSet<String> = ready["per_thread"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["live"] == true)
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    let names: BTreeSet<String> = trows
        .iter()
        .map(|r| str_col(r, "name").unwrap().to_string())
        .collect();
    assert_eq!(names, live, "threads table shows exactly the live threads");
    assert_eq!(trows.len() as u64, N - M);
    let id_to_name: BTreeMap<u64, String> = trows
        .iter()
        .map(|r| {
            (
                u64_col(r, "thread_id").unwrap(),
                str_col(r, "name").unwrap().to_string(),
            )
        })
        .collect();

    // --- events_waits_summary_by_thread_by_event_name ------------------------------
    let table = "events_waits_summary_by_thread_by_event_name";
    let (bythread, brows) = service_rows(&agent, table, ((N - M) * 3) as usize);
    check_columns(
        &bythread,
        table,
        &[
            "thread_id",
            "event_name",
            "count_star",
            "sum_timer_wait",
            "min_timer_wait",
            "avg_timer_wait",
            "max_timer_wait",
        ],
    );
    let per_thread: BTreeMap<String, &Value> = ready["per_thread"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), &t["classes"]))
        .collect();
    for name in TEST_CLASSES {
        let mut count = 0;
        let mut sum = 0u128;
        for r in brows.iter().filter(|r| r["event_name"] == name) {
            let tid = u64_col(r, "thread_id").unwrap();
            let tname = id_to_name
                .get(&tid)
                .unwrap_or_else(|| panic!("{table}: thread_id {tid} is not a live thread: {r}"));
            let want = &per_thread[tname][name];
            assert_eq!(u64_col(r, "count_star").unwrap(), K, "{tname} {name}");
            assert_eq!(
                u128_col(r, "sum_timer_wait").unwrap(),
                u128::from(want["sum_ps"].as_u64().unwrap()),
                "{tname} {name} sum"
            );
            assert_eq!(
                u64_col(r, "sum_number_of_bytes").unwrap(),
                want["bytes"].as_u64().unwrap(),
                "{tname} {name} bytes"
            );
            count += u64_col(r, "count_star").unwrap();
            sum += u128_col(r, "sum_timer_wait").unwrap();
        }
        let live_sum: u128 = ready["per_thread"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["live"] == true)
            .map(|t| u128::from(t["classes"][name]["sum_ps"].as_u64().unwrap()))
            .sum();
        assert_eq!(
            count,
            (N - M) * K,
            "{table}: {name} rows cover the live threads only"
        );
        assert_eq!(sum, live_sum, "{table}: {name} sum over live threads");
    }

    // --- pfs-agent query --format json == HTTP ------------------------------------
    let table = "events_waits_summary_global_by_event_name";
    let out = Command::new(agent_bin())
        .args(["query", table, "--shm-dir"])
        .arg(dir.path())
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pfs-agent query failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "query output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let http = agent.table(table).unwrap();
    assert_eq!(cli["table"], http["table"]);
    assert_eq!(cli["columns"], http["columns"]);
    assert_eq!(
        sorted_rows(&cli),
        sorted_rows(&http),
        "query JSON and HTTP JSON differ"
    );

    // Text format: every test class appears, with its exact count.
    let out = Command::new(agent_bin())
        .args(["query", table, "--shm-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pfs-agent query (text) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for name in TEST_CLASSES {
        let line = text
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("text query lacks {name}:\n{text}"));
        assert!(
            line.contains(&(N * K).to_string()),
            "text row of {name} lacks count {}: {line}",
            N * K
        );
        // Into a pipe, durations stay picoseconds: the exact sum.
        let sum = ready["classes"][name]["sum_ps"].as_u64().unwrap();
        assert!(
            line.contains(&format!(" {sum} ")),
            "piped text of {name} lacks its sum {sum} ps: {line}"
        );
    }
    // JSON stays picoseconds, as numbers.
    for r in cli["rows"].as_array().unwrap() {
        for c in [
            "sum_timer_wait",
            "min_timer_wait",
            "avg_timer_wait",
            "max_timer_wait",
        ] {
            assert!(r[c].is_u64(), "{c} in JSON: {r}");
        }
    }

    // `--human-times`: durations as FORMAT_PICO_TIME writes them (two
    // decimals and a unit), counts untouched; `--raw-times` is the piped
    // default.
    let query_text = |flag: &str| {
        let out = Command::new(agent_bin())
            .args(["query", table, flag, "--shm-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pfs-agent query {flag} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(query_text("--raw-times"), text);
    let human = query_text("--human-times");
    for name in TEST_CLASSES {
        let line = human
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("human query lacks {name}:\n{human}"));
        let cells: Vec<&str> = line
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        // service, pid, event_name, count_star, then the four durations.
        assert_eq!(cells[3], (N * K).to_string(), "{line}");
        for d in &cells[4..8] {
            let (num, unit) = d
                .split_once(' ')
                .unwrap_or_else(|| panic!("{d:?} has no unit: {line}"));
            assert!(
                ["ns", "us", "ms", "s", "min", "h", "d"].contains(&unit),
                "{d:?}: {line}"
            );
            let (int, frac) = num.split_once('.').unwrap_or_else(|| panic!("{d:?}"));
            assert!(
                int.parse::<u32>().is_ok() && frac.len() == 2 && frac.parse::<u8>().is_ok(),
                "{d:?}: {line}"
            );
        }
    }

    writer.finish(Duration::from_secs(10)).unwrap();
}

/// `/metrics` asked for in the classic text format (`Accept: text/plain`)
/// has its content type, the same samples as the OpenMetrics text, and
/// passes `promtool check metrics` (Debian's `prometheus` package, which
/// `scripts/test` installs), which reads only that format.
fn classic_text_passes_promtool(base: &str, openmetrics: &str) {
    let mut r = ureq::get(&format!("{base}/metrics"))
        .header("Accept", "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")
        .call()
        .expect("GET /metrics as classic text");
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    assert_eq!(
        ct.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = r
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .unwrap();
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "classic text"
    );
    // The same series (values may have moved between the two scrapes).
    let series = |t: &str| -> BTreeSet<String> {
        t.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty() && !l.contains("_created"))
            .map(|l| l.split_once(" # {").map_or(l, |(s, _)| s))
            .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_string())
            .filter(|s| !s.starts_with("pfs_agent_"))
            .collect()
    };
    assert_eq!(
        series(&text),
        series(openmetrics),
        "the same series in both formats"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("promtool check metrics < {}", file.display()))
        .output()
        .expect("run promtool (install Debian's prometheus package; scripts/test does)");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !report.contains("error") && !report.contains("not found"),
        "promtool check metrics: {report}"
    );
}

/// A segment of hundreds of thread records: the agent's walk of it is
/// split across threads (on a machine with two CPUs or more) and its rows
/// fetched ahead; what it reports is still exact, on the first scrape and
/// on every later one, and a thread table has every live thread's rows.
#[test]
fn a_segment_of_many_threads_is_reported_exactly() {
    const THREADS: u64 = 300;
    const EXITED: u64 = 40;
    const PER_CLASS: u64 = 20;
    const MANY: &str = "exact-many";
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, ready) = spawn_exact(
        writer_exe!(),
        dir.path(),
        MANY,
        THREADS as u32,
        PER_CLASS as u32,
        EXITED as u32,
    )
    .unwrap();
    let agent = Agent::serve(dir.path()).unwrap();
    let totals = |m: &[pfs_tests::Sample]| -> Vec<(f64, f64)> {
        TEST_CLASSES
            .iter()
            .map(|name| {
                let l = [("service", MANY), ("event_name", *name)];
                (
                    sample(m, "pfs_events_waits_total", &l).unwrap_or(-1.0),
                    sample(m, "pfs_events_waits_seconds_total", &l).unwrap_or(-1.0),
                )
            })
            .collect()
    };
    let want: Vec<(f64, f64)> = TEST_CLASSES
        .iter()
        .map(|name| {
            let c = &ready["classes"][name];
            (
                c["count"].as_u64().unwrap() as f64,
                c["sum_ps"].as_u64().unwrap() as f64 / 1e12,
            )
        })
        .collect();
    for (count, _) in &want {
        assert_eq!(*count, (THREADS * PER_CLASS) as f64);
    }
    // Three scrapes past the agent's cache: the first reads every row, the
    // others only what changed (nothing).
    for scrape in 0..3 {
        let m = poll(Duration::from_secs(15), || {
            let m = pfs_tests::parse_metrics(&agent.get("/metrics")?.body)?;
            Ok(sample(&m, "pfs_threads", &[("service", MANY)])
                .is_ok()
                .then_some(m))
        })
        .unwrap();
        let got = totals(&m);
        for ((name, (gc, gs)), (wc, ws)) in TEST_CLASSES.iter().zip(&got).zip(&want) {
            assert_eq!(gc, wc, "scrape {scrape}: {name} count");
            assert!(
                ((gs - ws) / ws).abs() < 1e-9,
                "scrape {scrape}: {name} seconds {gs} vs {ws}"
            );
        }
        assert_eq!(
            sample(&m, "pfs_threads", &[("service", MANY)]).unwrap(),
            (THREADS - EXITED) as f64,
            "scrape {scrape}: live threads"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let t = agent
        .table("events_waits_summary_by_thread_by_event_name")
        .unwrap();
    let mine: Vec<&Value> = rows(&t)
        .unwrap()
        .iter()
        .filter(|r| r["service"] == MANY && u64_col(r, "count_star").unwrap_or(0) > 0)
        .collect();
    assert_eq!(
        mine.len() as u64,
        (THREADS - EXITED) * TEST_CLASSES.len() as u64,
        "a row per live thread and class"
    );
    for r in mine {
        assert_eq!(u64_col(r, "count_star").unwrap(), PER_CLASS, "{r}");
    }
    writer.finish(Duration::from_secs(10)).unwrap();
}
