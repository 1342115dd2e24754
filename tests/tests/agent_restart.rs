//! Agent restart: the data lives in the segments and in the agent's state
//! file, so killing the agent (`kill -9`) and starting it again on the same
//! directory loses nothing. `/metrics` after the restart equals `/metrics`
//! before it, series by series, with a retired service in the mix (one
//! whose only process exited and was removed) and a service that lost one
//! of its two processes to `kill -9`. New activity afterwards only adds.
//!
//! `TRUNCATE` baselines persist as well (tables keep their truncation).
//!
//! The restart also covers an agent that died between saving the state
//! and removing a retired file: the file (restored through a hard link
//! taken before retirement, so it is the same inode) is recognised and
//! removed without being counted twice.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use pfs_tests::{Agent, Sample, TEST_CLASSES, poll, sample, spawn_exact, writer_exe};
use serde_json::Value;

type Series = BTreeMap<String, f64>;

/// Every series the segments determine: the agent's own figures (reads,
/// snapshots, its timer measurements) restart with the agent and are left
/// out, except the retired-segment count, which is persisted.
fn series(samples: &[Sample]) -> Series {
    samples
        .iter()
        .filter(|s| {
            s.name == "pfs_agent_retired_segments_total"
                || s.name == "pfs_agent_segments"
                || !(s.name.starts_with("pfs_agent_") || s.name.starts_with("pfs_timer_overhead"))
        })
        .map(|s| (format!("{}{:?}", s.name, s.labels), s.value))
        .collect()
}

fn is_counter(key: &str) -> bool {
    let name = key.split('{').next().unwrap_or(key);
    ["_total", "_count", "_sum", "_bucket"]
        .iter()
        .any(|x| name.ends_with(x))
}

fn count(samples: &[Sample], service: &str, class: &str) -> u64 {
    sample(
        samples,
        "pfs_events_waits_total",
        &[("service", service), ("event_name", class)],
    )
    .unwrap_or_else(|e| panic!("{e}")) as u64
}

fn ready_count(ready: &Value, class: &str) -> u64 {
    ready["classes"][class]["count"].as_u64().unwrap()
}

fn segment_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pfs"))
        .collect();
    v.sort();
    v
}

#[test]
fn metrics_survive_an_agent_kill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let links = tempfile::tempdir_in(dir.path().parent().unwrap()).unwrap();
    let d = dir.path();
    let env = [("PFS_DEAD_RETENTION", "300ms".to_string())];
    let mut agent = Agent::serve_with_env(d, &env).unwrap();

    // svc-a: two processes, one stays; svc-b: one process, exits cleanly.
    let (_a1, a1) = spawn_exact(writer_exe!(), d, "svc-a", 3, 150, 1).unwrap();
    let (mut a2, a2r) = spawn_exact(writer_exe!(), d, "svc-a", 2, 70, 0).unwrap();
    let (mut b, br) = spawn_exact(writer_exe!(), d, "svc-b", 2, 40, 1).unwrap();
    // Hard links keep the doomed segments' inodes for the crash replay.
    let seg_a2 = a2.segment_in(d, "svc-a");
    let seg_b = b.segment_in(d, "svc-b");
    for s in [&seg_a2, &seg_b] {
        std::fs::hard_link(s, links.path().join(s.file_name().unwrap())).unwrap();
    }
    // Let the agent see them live first.
    poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        Ok((count(&m, "svc-b", TEST_CLASSES[0]) > 0).then_some(()))
    })
    .unwrap();
    a2.guard.child.kill().unwrap(); // SIGKILL
    a2.guard.child.wait().unwrap();
    b.finish(Duration::from_secs(10)).unwrap();

    // Both are retired: folded into their services and removed.
    let before = poll(Duration::from_secs(30), || {
        let m = agent.metrics()?;
        let retired = sample(&m, "pfs_agent_retired_segments_total", &[])?;
        Ok((retired == 2.0 && segment_files(d).len() == 1).then_some(m))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.guard.describe()));
    for class in TEST_CLASSES {
        assert_eq!(
            count(&before, "svc-a", class),
            ready_count(&a1, class) + ready_count(&a2r, class),
            "svc-a {class} = live + retired process"
        );
        assert_eq!(
            count(&before, "svc-b", class),
            ready_count(&br, class),
            "svc-b {class} = its retired process"
        );
    }
    let state_path = d.join(pfs_agent::retired::STATE_FILE);
    let state: Value = serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    assert_eq!(state["retired_segments"], 2, "{state}");
    assert_eq!(
        std::fs::metadata(&state_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let before = series(&before);

    // kill -9 the agent, and replay a crash between saving the state and
    // removing a file: put back every file the state still lists.
    agent.guard.child.kill().unwrap();
    agent.guard.child.wait().unwrap();
    let mut replayed = Vec::new();
    for a in state["absorbed"].as_array().unwrap() {
        let name = a["file"].as_str().unwrap();
        let link = links.path().join(name);
        if link.exists() {
            std::fs::rename(&link, d.join(name)).unwrap();
            replayed.push(name.to_string());
        }
    }
    assert!(
        !replayed.is_empty(),
        "the state lists the last retired file(s): {state}"
    );

    let mut agent = Agent::serve_with_env(d, &env).unwrap();
    let after = series(&agent.metrics().unwrap());
    let mut diffs = Vec::new();
    for (k, v) in &before {
        match after.get(k) {
            Some(w) if w == v => {}
            Some(w) => diffs.push(format!("{k}: {v} -> {w}")),
            None => diffs.push(format!("{k}: {v} -> missing")),
        }
    }
    for k in after.keys().filter(|k| !before.contains_key(*k)) {
        diffs.push(format!("{k}: new after restart"));
    }
    assert!(
        diffs.is_empty(),
        "{} series differ after the restart (of {}):\n{}\n{}",
        diffs.len(),
        before.len(),
        diffs[..diffs.len().min(20)].join("\n"),
        agent.guard.describe()
    );
    poll(Duration::from_secs(10), || {
        Ok((segment_files(d).len() == 1).then_some(()))
    })
    .unwrap_or_else(|_| panic!("replayed files not removed: {:?}", segment_files(d)));

    // New activity (a new svc-b process) only adds, exactly its own counts.
    let (_b2, b2r) = spawn_exact(writer_exe!(), d, "svc-b", 2, 25, 0).unwrap();
    let later = poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        Ok((count(&m, "svc-b", TEST_CLASSES[0]) > ready_count(&br, TEST_CLASSES[0])).then_some(m))
    })
    .unwrap();
    for class in TEST_CLASSES {
        assert_eq!(
            count(&later, "svc-b", class),
            ready_count(&br, class) + ready_count(&b2r, class),
            "svc-b {class} after new activity"
        );
    }
    let later = series(&later);
    let dips: Vec<String> = before
        .iter()
        .filter(|(k, _)| is_counter(k))
        .filter_map(|(k, v)| match later.get(k) {
            Some(w) if w >= v => None,
            w => Some(format!("{k}: {v} -> {w:?}")),
        })
        .collect();
    assert!(dips.is_empty(), "counters went backwards: {dips:#?}");
    eprintln!(
        "agent_restart: {} series equal across kill -9 and restart; {} replayed file(s) removed without double counting",
        before.len(),
        replayed.len()
    );
    let _ = agent.guard.child.kill();
}

/// A dead process's segment, exported but not retired yet (within
/// `--dead-retention`), goes away while the agent is down: a process
/// restarted under the same pid (every container's pid 1) replaces it. Its
/// counts come back with the restarted agent, from the state file that
/// kept them aside when the process died; the file the agent still finds
/// stays dead, as it was.
#[test]
fn a_dead_segment_replaced_while_the_agent_is_down_keeps_its_counts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let env = [("PFS_DEAD_RETENTION", "10m".to_string())];
    let mut agent = Agent::serve_with_env(d, &env).unwrap();
    let (mut gone, gone_r) = spawn_exact(writer_exe!(), d, "svc", 2, 60, 1).unwrap();
    let (mut kept, kept_r) = spawn_exact(writer_exe!(), d, "svc", 1, 30, 0).unwrap();
    let gone_file = gone.segment_in(d, "svc");
    gone.finish(Duration::from_secs(10)).unwrap();
    kept.finish(Duration::from_secs(10)).unwrap();
    let total = |class: &str| ready_count(&gone_r, class) + ready_count(&kept_r, class);
    let before = poll(Duration::from_secs(30), || {
        let m = agent.metrics()?;
        let dead = sample(&m, "pfs_agent_segments", &[("state", "dead")])?;
        Ok(
            (dead == 2.0 && count(&m, "svc", TEST_CLASSES[0]) == total(TEST_CLASSES[0]))
                .then_some(m),
        )
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.guard.describe()));
    // Which service lost them.
    let processes = |m: &[Sample], state: &str| {
        sample(m, "pfs_processes", &[("service", "svc"), ("state", state)]).unwrap()
    };
    assert_eq!(
        (processes(&before, "live"), processes(&before, "dead")),
        (0.0, 2.0)
    );
    // The state file keeps the dead segments' totals aside.
    let state_path = d.join(pfs_agent::retired::STATE_FILE);
    poll(Duration::from_secs(10), || {
        let state: Value = serde_json::from_slice(&std::fs::read(&state_path)?)?;
        Ok((state["pending"].as_array().map(Vec::len) == Some(2)).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.guard.describe()));

    agent.guard.child.kill().unwrap(); // kill -9
    agent.guard.child.wait().unwrap();
    std::fs::remove_file(&gone_file).unwrap(); // what a restarted process does

    let agent = Agent::serve_with_env(d, &env).unwrap();
    let after = poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        let retired = sample(&m, "pfs_agent_retired_segments_total", &[])?;
        Ok((retired == 1.0).then_some(m))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.guard.describe()));
    for class in TEST_CLASSES {
        assert_eq!(
            count(&after, "svc", class),
            count(&before, "svc", class),
            "svc {class}: the removed dead segment's counts are kept"
        );
        assert_eq!(count(&after, "svc", class), total(class));
    }
    assert_eq!(
        sample(&after, "pfs_agent_segments", &[("state", "dead")]).unwrap(),
        1.0,
        "the dead segment still there stays dead (retained)"
    );
    assert_eq!(
        (processes(&after, "live"), processes(&after, "dead")),
        (0.0, 1.0)
    );
}

/// A second agent on the same directory follows the first: same numbers,
/// no retiring of its own, and it takes over (lock and state) when the
/// first one dies.
#[test]
fn a_second_agent_follows_then_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let env = [("PFS_DEAD_RETENTION", "300ms".to_string())];
    let mut first = Agent::serve_with_env(d, &env).unwrap();
    let second = Agent::serve_with_env(d, &env).unwrap();
    assert!(
        poll(Duration::from_secs(10), || Ok(second
            .guard
            .stderr()
            .contains("another pfs-agent owns this directory")
            .then_some(())))
        .is_ok(),
        "{}",
        second.guard.describe()
    );
    let (_live, live) = spawn_exact(writer_exe!(), d, "svc", 1, 30, 0).unwrap();
    let (mut gone, goner) = spawn_exact(writer_exe!(), d, "svc", 1, 20, 0).unwrap();
    gone.finish(Duration::from_secs(10)).unwrap();
    let want = ready_count(&live, TEST_CLASSES[0]) + ready_count(&goner, TEST_CLASSES[0]);
    // The owner retires the dead one; the follower shows the same totals.
    for a in [&first, &second] {
        poll(Duration::from_secs(20), || {
            let m = a.metrics()?;
            let retired = sample(&m, "pfs_agent_retired_segments_total", &[])?;
            Ok((retired == 1.0 && count(&m, "svc", TEST_CLASSES[0]) == want).then_some(()))
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", a.guard.describe()));
    }
    assert_eq!(segment_files(d).len(), 1);
    // The owner dies; the follower takes over and retires the next one.
    first.guard.child.kill().unwrap();
    first.guard.child.wait().unwrap();
    let (mut gone2, gone2r) = spawn_exact(writer_exe!(), d, "svc", 1, 10, 0).unwrap();
    gone2.finish(Duration::from_secs(10)).unwrap();
    let want = want + ready_count(&gone2r, TEST_CLASSES[0]);
    poll(Duration::from_secs(20), || {
        let m = second.metrics()?;
        let retired = sample(&m, "pfs_agent_retired_segments_total", &[])?;
        Ok((retired == 2.0
            && count(&m, "svc", TEST_CLASSES[0]) == want
            && segment_files(d).len() == 1)
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", second.guard.describe()));
}

/// `TRUNCATE` baselines survive a restart too: the tables keep showing
/// counts since the truncation; `/metrics` keeps the lifetime counts.
#[test]
fn truncate_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let d = dir.path();
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, "tok\n").unwrap();
    let env = [(
        "PFS_CONTROL_TOKEN_FILE",
        token_file.to_string_lossy().into_owned(),
    )];
    let (_w, ready) = spawn_exact(writer_exe!(), d, "trunc", 2, 30, 0).unwrap();
    let lifetime = ready_count(&ready, TEST_CLASSES[0]);
    let table = "events_waits_summary_global_by_event_name";
    let count_star = |agent: &Agent| -> u64 {
        let t = agent.table(&format!("{table}?service=trunc")).unwrap();
        let rows = pfs_tests::rows(&t).unwrap();
        let row = rows
            .iter()
            .find(|r| r["event_name"] == TEST_CLASSES[0])
            .unwrap_or_else(|| panic!("no {} row in {t}", TEST_CLASSES[0]));
        pfs_tests::u64_col(row, "count_star").unwrap()
    };
    let mut agent = Agent::serve_with_env(d, &env).unwrap();
    assert_eq!(count_star(&agent), lifetime);
    let r = ureq::post(&format!("{}/api/v1/tables/{table}/truncate", agent.base))
        .header("Authorization", "Bearer tok")
        .send_empty()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(count_star(&agent), 0, "truncated");
    let file = d.join(pfs_agent::truncate::BASELINES_FILE);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    agent.guard.child.kill().unwrap();
    agent.guard.child.wait().unwrap();
    let agent = Agent::serve_with_env(d, &env).unwrap();
    assert_eq!(count_star(&agent), 0, "still truncated after the restart");
    assert_eq!(
        count(&agent.metrics().unwrap(), "trunc", TEST_CLASSES[0]),
        lifetime,
        "/metrics is never truncated"
    );
}
