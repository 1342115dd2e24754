//! Dying processes: many iterations of a `torn` writer of one service (a
//! new pid each time), seen live by the agent, then killed with `kill -9`
//! at a random point, most likely in the middle of a write, while the
//! agent (dead retention 300 ms) is scraped continuously.
//!
//! * The service's counters (every `_total`, `_count`, `_sum`, `_bucket`
//!   series) never decrease from one scrape to the next, through deaths
//!   and retirements.
//! * No torn record is accepted: every event the tables show carries the
//!   torn writer's invariants (EVENT_ID n has object n*7919, bytes
//!   n^0x5555, spins n+3, END_EVENT_ID n+1, class n%3), and every summary
//!   row has `count*min <= sum <= count*max`.
//! * At the end the agent is alive, every dead segment file is removed
//!   (no accumulation), and the service's totals equal the sum of what the
//!   dead segments hold (read by this test after each death). A row whose
//!   writer died in the middle of updating it cannot be read by anyone;
//!   the agent keeps its last good value, so where that happened the
//!   totals are bounded below instead.
//!
//! `PFS_KILL9_ITERATIONS` (default 30) and `PFS_KILL9_SEED` override the
//! run; the seed is printed.
//!
//! A second test replaces a dead segment's file under the same name (a
//! restarted process that got the same pid): the old segment is folded in
//! at once and the new one exported.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, snapshot};
use pfs_tests::{
    Agent, TEST_CLASSES, Writer, get_json, poll, rows, sample, str_col, u64_col, u128_col,
    writer_exe,
};
use serde_json::Value;

const SERVICE: &str = "k9";

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// What the scraper saw.
#[derive(Default)]
struct Seen {
    scrapes: u64,
    table_checks: u64,
    events_checked: u64,
    rows_checked: u64,
    decreases: Vec<String>,
    torn: Vec<String>,
    errors: Vec<String>,
    max: BTreeMap<String, f64>,
}

impl Seen {
    fn check_metrics(&mut self, body: &str) {
        let samples = match pfs_tests::parse_metrics(body) {
            Ok(s) => s,
            Err(e) => return self.errors.push(format!("unparsable /metrics: {e:#}")),
        };
        self.scrapes += 1;
        for s in samples {
            if s.labels.get("service").map(String::as_str) != Some(SERVICE)
                || !["_total", "_count", "_sum", "_bucket"]
                    .iter()
                    .any(|x| s.name.ends_with(x))
            {
                continue;
            }
            let key = format!("{}{:?}", s.name, s.labels);
            let m = self.max.entry(key.clone()).or_insert(s.value);
            if s.value < *m {
                if self.decreases.len() < 20 {
                    self.decreases.push(format!(
                        "scrape {}: {key} {} -> {}",
                        self.scrapes, *m, s.value
                    ));
                }
            } else {
                *m = s.value;
            }
        }
    }

    fn check_events(&mut self, table: &Value) -> anyhow::Result<()> {
        for r in rows(table)? {
            self.events_checked += 1;
            let n = u64_col(r, "event_id")?;
            let mut bad = Vec::new();
            if u64_col(r, "object_instance_begin")? != n.wrapping_mul(7919) {
                bad.push("object_instance_begin");
            }
            if str_col(r, "event_name")? != TEST_CLASSES[(n % 3) as usize] {
                bad.push("event_name");
            }
            if !r["end_event_id"].is_null() {
                if u64_col(r, "end_event_id")? != n + 1 {
                    bad.push("end_event_id");
                }
                if u64_col(r, "number_of_bytes")? != n ^ 0x5555 {
                    bad.push("number_of_bytes");
                }
                if u64_col(r, "spins")? != n + 3 {
                    bad.push("spins");
                }
            }
            if !bad.is_empty() && self.torn.len() < 20 {
                self.torn.push(format!("torn event {bad:?}: {r}"));
            }
        }
        Ok(())
    }

    fn check_summaries(&mut self, table: &Value) -> anyhow::Result<()> {
        for r in rows(table)? {
            let count = u128::from(u64_col(r, "count_star")?);
            if count == 0 {
                continue;
            }
            self.rows_checked += 1;
            let sum = u128_col(r, "sum_timer_wait")?;
            let (min, max) = (
                u128::from(u64_col(r, "min_timer_wait")?),
                u128::from(u64_col(r, "max_timer_wait")?),
            );
            if (min > max || sum < count * min || sum > count * max) && self.torn.len() < 20 {
                self.torn.push(format!("torn summary row: {r}"));
            }
        }
        Ok(())
    }

    fn check_tables(&mut self, base: &str) -> anyhow::Result<()> {
        let q = format!("?service={SERVICE}");
        for t in ["events_waits_current", "events_waits_history"] {
            self.check_events(&get_json(&format!("{base}/api/v1/tables/{t}{q}"))?)?;
        }
        self.check_summaries(&get_json(&format!(
            "{base}/api/v1/tables/events_waits_summary_by_thread_by_event_name{q}"
        ))?)?;
        self.check_summaries(&get_json(&format!(
            "{base}/api/v1/tables/events_waits_summary_global_by_event_name{q}"
        ))?)?;
        self.table_checks += 1;
        Ok(())
    }
}

fn segment_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pfs"))
        .collect()
}

#[test]
fn kill_9_writers_in_a_loop() {
    let iterations: u64 = std::env::var("PFS_KILL9_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("PFS_KILL9_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill9_loop: {iterations} iterations, seed {seed} (PFS_KILL9_SEED to replay)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut agent =
        Agent::serve_with_env(d, &[("PFS_DEAD_RETENTION", "300ms".to_string())]).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (stop, base) = (stop.clone(), agent.base.clone());
        std::thread::spawn(move || {
            let mut seen = Seen::default();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match pfs_tests::http_get(&format!("{base}/metrics")) {
                    Ok(r) if r.status == 200 => seen.check_metrics(&r.body),
                    Ok(r) => seen.errors.push(format!("/metrics answered {}", r.status)),
                    Err(e) => seen.errors.push(format!("/metrics: {e:#}")),
                }
                if i.is_multiple_of(3)
                    && let Err(e) = seen.check_tables(&base)
                {
                    seen.errors.push(format!("tables: {e:#}"));
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        })
    };

    // Per class: what the dead segments hold, and rows nobody can read.
    let mut expected = [0u64; 3];
    let mut stuck_rows = 0u64;
    let mut killed_with_events = 0u64;
    let d_str = d.to_str().unwrap();
    for i in 0..iterations {
        let mut w = Writer::spawn(
            writer_exe!(),
            &[
                "torn",
                "--shm-dir",
                d_str,
                "--service",
                SERVICE,
                "--threads",
                "2",
                "--seconds",
                "3600",
            ],
        )
        .unwrap();
        let ready = w.read_json(Duration::from_secs(30)).unwrap();
        assert_eq!(ready["ready"], true, "{ready}");
        // Mapped before the kill: the agent may remove the file right after.
        let path = ready["segment"].as_str().unwrap().to_string();
        let seg = Segment::open(File::open(&path).unwrap(), false).unwrap();
        // The agent has exported this process alive (so a value it loses
        // at death would show as a decrease), then a random while later...
        let url = format!(
            "{}/api/v1/tables/events_waits_summary_by_thread_by_event_name?service={SERVICE}&pid={}",
            agent.base,
            w.guard.pid()
        );
        poll(Duration::from_secs(20), || {
            let t = get_json(&url)?;
            Ok(rows(&t)?
                .iter()
                .any(|r| u64_col(r, "count_star").is_ok_and(|c| c > 0))
                .then_some(()))
        })
        .unwrap_or_else(|e| panic!("iteration {i}: agent never showed the writer: {e}"));
        std::thread::sleep(Duration::from_millis(rng.range(5, 250)));
        w.guard.child.kill().unwrap(); // SIGKILL, wherever the threads are
        w.guard.child.wait().unwrap();
        let snap = snapshot(
            &seg,
            &ReadOptions {
                events: false,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("iteration {i}: dead segment unreadable: {e}"));
        let mut any = false;
        for (class, s) in snap
            .threads
            .iter()
            .flat_map(|t| t.rows.iter())
            .chain(snap.exited.iter())
        {
            let name = &snap
                .classes
                .iter()
                .find(|c| c.index == *class)
                .unwrap()
                .name;
            let k = TEST_CLASSES.iter().position(|n| n == name).unwrap();
            expected[k] += s.count;
            any |= s.count > 0;
        }
        killed_with_events += u64::from(any);
        stuck_rows += snap
            .threads
            .iter()
            .map(|t| t.skipped_rows.len() as u64)
            .sum::<u64>();
        assert!(
            agent.guard.try_wait().is_none(),
            "agent died at iteration {i}\n{}",
            agent.guard.describe()
        );
    }

    // Every dead segment is retired and its file removed.
    let fin = poll(Duration::from_secs(30), || {
        let m = agent.metrics()?;
        let retired = sample(&m, "pfs_agent_retired_segments_total", &[])?;
        Ok((retired == iterations as f64 && segment_files(d).is_empty()).then_some(m))
    })
    .unwrap_or_else(|e| {
        panic!(
            "not all dead segments retired: {e}; files left {:?}\n{}",
            segment_files(d),
            agent.guard.describe()
        )
    });
    // Let the scraper see the final state too.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let seen = scraper.join().unwrap();
    assert!(
        agent.guard.try_wait().is_none(),
        "agent exited\n{}",
        agent.guard.describe()
    );
    let got: Vec<u64> = TEST_CLASSES
        .iter()
        .map(|c| {
            sample(
                &fin,
                "pfs_events_waits_total",
                &[("service", SERVICE), ("event_name", c)],
            )
            .unwrap() as u64
        })
        .collect();
    eprintln!(
        "kill9_loop: {iterations} writers killed ({killed_with_events} after recording), \
         {stuck_rows} row(s) left mid-update by a kill; {} scrapes, {} table checks \
         ({} events, {} summary rows validated); final counts {got:?}, dead segments held {expected:?}",
        seen.scrapes, seen.table_checks, seen.events_checked, seen.rows_checked
    );
    assert!(
        seen.errors.is_empty(),
        "scrape errors: {:#?}",
        &seen.errors[..seen.errors.len().min(10)]
    );
    assert!(
        seen.decreases.is_empty(),
        "counters went backwards:\n{}",
        seen.decreases.join("\n")
    );
    assert!(
        seen.torn.is_empty(),
        "torn records accepted:\n{}",
        seen.torn.join("\n")
    );
    assert!(seen.scrapes > iterations, "only {} scrapes", seen.scrapes);
    assert!(seen.events_checked > 0, "no event validated");
    assert!(killed_with_events > 0, "no writer recorded before its kill");
    for k in 0..3 {
        if stuck_rows == 0 {
            assert_eq!(
                got[k], expected[k],
                "final {} == what the dead segments hold",
                TEST_CLASSES[k]
            );
        } else {
            assert!(
                got[k] >= expected[k],
                "final {} {} < {} readable in the dead segments",
                TEST_CLASSES[k],
                got[k],
                expected[k]
            );
        }
    }
    // The retired totals are saved for the next agent.
    assert!(d.join(pfs_agent::retired::STATE_FILE).exists());
    let _ = agent.guard.child.kill();
}

/// A restarted process that gets the same pid (as a container's pid 1
/// does) replaces the old segment file under the same name. The agent
/// notices the new inode, folds the old segment into the service at once
/// (its counters do not drop) and exports the new one, without removing
/// the new process's file.
#[test]
fn a_segment_replaced_under_its_name_is_retired_not_lost() {
    use pfs_tests::spawn_exact;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Long retention: only the replacement can retire the old segment.
    let agent = Agent::serve_with_env(d, &[("PFS_DEAD_RETENTION", "1h".to_string())]).unwrap();
    let (mut old, old_r) = spawn_exact(writer_exe!(), d, "re", 1, 40, 0).unwrap();
    let name = old.segment_in(d, "re");
    let count = |m: &[pfs_tests::Sample]| {
        sample(
            m,
            "pfs_events_waits_total",
            &[("service", "re"), ("event_name", TEST_CLASSES[0])],
        )
        .unwrap_or(0.0) as u64
    };
    let want_old = old_r["classes"][TEST_CLASSES[0]]["count"].as_u64().unwrap();
    poll(Duration::from_secs(20), || {
        Ok((count(&agent.metrics()?) == want_old).then_some(()))
    })
    .unwrap();
    old.guard.child.kill().unwrap();
    old.guard.child.wait().unwrap();
    // The dead segment is kept (retention) ...
    poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        Ok((sample(&m, "pfs_agent_segments", &[("state", "dead")])? == 1.0).then_some(()))
    })
    .unwrap();
    // ... until a new process's segment takes its name.
    let (_new, new_r) = spawn_exact(writer_exe!(), d, "re", 1, 25, 0).unwrap();
    let new_path = std::path::PathBuf::from(new_r["segment"].as_str().unwrap());
    std::fs::rename(&new_path, &name).unwrap();
    let want = want_old + new_r["classes"][TEST_CLASSES[0]]["count"].as_u64().unwrap();
    let m = poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        let retired = sample(&m, "pfs_agent_retired_segments_total", &[])?;
        let live = sample(&m, "pfs_agent_segments", &[("state", "live")])?;
        Ok((retired == 1.0 && live == 1.0).then_some(m))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.guard.describe()));
    assert_eq!(count(&m), want, "old (retired) + new (live)");
    assert!(name.exists(), "the new process's file was removed");
    assert_eq!(segment_files(d).len(), 1);
}
