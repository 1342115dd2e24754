//! OTLP start times and the first delta after an agent (re)start, against
//! the independent receiver (`tests/otlp_receiver.py`): counts made before
//! the agent started are never sent as a delta (a restart must not re-add
//! history), a process started after the agent has its whole count in its
//! deltas, and cumulative points start no later than the first counted
//! event (the process start, not the agent's). A process that starts and
//! is retired between two exports still has its whole count in the deltas.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pfs_tests::{
    Agent, OtlpReceiver, TEST_CLASSES, free_port, otlp_metrics, spawn_exact, writer_exe,
};
use serde_json::Value;

const N: u64 = 2;
const K: u64 = 300;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The `pfs.events.waits` points of `service` (one resource per service)
/// in `req`, for the test classes: (event_name, value, start).
fn waits(req: &Value, service: &str) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for (res, m) in otlp_metrics(req, "pfs.events.waits") {
        if res["service.name"] != service {
            continue;
        }
        for p in m["points"].as_array().into_iter().flatten() {
            let name = p["attributes"]["event_name"].as_str().unwrap_or_default();
            if TEST_CLASSES.contains(&name) {
                out.push((
                    name.to_string(),
                    p["value"].as_u64().unwrap(),
                    p["start"].as_u64().unwrap(),
                ));
            }
        }
    }
    out
}

fn agent_env(port: u16, temporality: &str) -> Vec<(&'static str, String)> {
    agent_env_every(port, temporality, 1000)
}

fn agent_env_every(port: u16, temporality: &str, interval_ms: u32) -> Vec<(&'static str, String)> {
    vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_string()),
        ("OTEL_METRIC_EXPORT_INTERVAL", interval_ms.to_string()),
        (
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            temporality.to_string(),
        ),
    ]
}

#[test]
fn otlp_first_delta_after_agent_start_carries_no_history() {
    let dir = tempfile::tempdir().unwrap();
    let old = "otlp-delta-before-agent";
    let new = "otlp-delta-after-agent";
    let (mut before, _) =
        spawn_exact(writer_exe!(), dir.path(), old, N as u32, K as u32, 0).unwrap();
    let port = free_port();
    let mut receiver = OtlpReceiver::start(None, Some(port)).unwrap();
    let agent = Agent::serve_with_env(dir.path(), &agent_env(port, "delta")).unwrap();
    // Let the agent export (and take its baseline) before the second
    // process starts.
    let mut resent = Vec::new();
    receiver
        .wait_for(Duration::from_secs(20), |r| {
            resent.extend(waits(r, old).into_iter().filter(|(_, v, _)| *v > 0));
            !otlp_metrics(r, "pfs.agent.snapshots").is_empty()
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    assert!(
        resent.is_empty(),
        "counts made before the agent started were sent as a delta: {resent:?}"
    );
    let (mut after, _) =
        spawn_exact(writer_exe!(), dir.path(), new, N as u32, K as u32, 0).unwrap();

    // Every delta of both services for a few exports after the new
    // process's counts arrived.
    let mut old_total = 0;
    let mut new_total: std::collections::BTreeMap<String, u64> = Default::default();
    let mut first_new: Option<Vec<(String, u64, u64)>> = None;
    let mut quiet_exports = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while quiet_exports < 3 {
        assert!(
            Instant::now() < deadline,
            "the new process's counts never arrived in full: {new_total:?}\n{}",
            agent.guard.describe()
        );
        let Some(req) = receiver.next(Duration::from_secs(5)).unwrap() else {
            continue;
        };
        for (c, v, _) in waits(&req, old) {
            assert_eq!(v, 0, "{c} of {old}: history re-sent as a delta\n{req}");
            old_total += v;
        }
        let pts = waits(&req, new);
        if !pts.is_empty() && first_new.is_none() {
            first_new = Some(pts.clone());
        }
        for (c, v, _) in pts {
            *new_total.entry(c).or_default() += v;
        }
        if new_total.len() == TEST_CLASSES.len() && new_total.values().all(|v| *v == N * K) {
            quiet_exports += 1;
        }
    }
    assert_eq!(old_total, 0);
    // The process started after the agent: its whole count is sent, and its
    // first delta starts when the process started (after the agent did).
    let first = first_new.unwrap();
    assert!(first.iter().all(|(_, v, _)| *v > 0), "{first:?}");
    let log = agent.guard.stderr();
    assert!(!log.contains("panicked"), "{log}");
    before.finish(Duration::from_secs(10)).unwrap();
    after.finish(Duration::from_secs(10)).unwrap();
}

#[test]
fn otlp_cumulative_start_time_is_the_process_start() {
    let dir = tempfile::tempdir().unwrap();
    let service = "otlp-cumulative-start";
    let spawned = now_ns();
    let (mut writer, _) =
        spawn_exact(writer_exe!(), dir.path(), service, N as u32, K as u32, 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let agent_launched = now_ns();
    let port = free_port();
    let mut receiver = OtlpReceiver::start(None, Some(port)).unwrap();
    let agent = Agent::serve_with_env(dir.path(), &agent_env(port, "cumulative")).unwrap();
    let req = receiver
        .wait_for(Duration::from_secs(20), |r| {
            waits(r, service).iter().any(|(_, v, _)| *v == N * K)
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    for (c, v, start) in waits(&req, service) {
        assert_eq!(v, N * K, "{c}");
        // The counts began when the writer started, before the agent: the
        // start time says so (not the agent's start).
        assert!(
            (spawned..agent_launched).contains(&start),
            "{c}: start {start} not within the writer's start [{spawned}, {agent_launched})"
        );
    }
    writer.finish(Duration::from_secs(10)).unwrap();
}

#[test]
fn otlp_delta_counts_a_process_retired_between_two_exports() {
    let dir = tempfile::tempdir().unwrap();
    let brief = "otlp-delta-brief-process";
    let port = free_port();
    let mut receiver = OtlpReceiver::start(None, Some(port)).unwrap();
    // A dead process is retired 300 ms after it exits: well within one
    // export interval.
    let mut env = agent_env_every(port, "delta", 4000);
    env.push(("PFS_DEAD_RETENTION", "300ms".to_string()));
    let agent = Agent::serve_with_env(dir.path(), &env).unwrap();
    receiver
        .wait_for(Duration::from_secs(20), |r| {
            !otlp_metrics(r, "pfs.agent.snapshots").is_empty()
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.describe()));
    // Right after an export: the process lives, exits and is retired
    // (its file removed) before the next one, which is the first to see
    // its service, and then only as retired totals.
    let (mut writer, _) =
        spawn_exact(writer_exe!(), dir.path(), brief, N as u32, K as u32, 0).unwrap();
    let file = writer.segment_in(dir.path(), brief);
    writer.finish(Duration::from_secs(10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while file.exists() {
        assert!(
            Instant::now() < deadline,
            "the dead process was never retired\n{}",
            agent.guard.describe()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut total: std::collections::BTreeMap<String, u64> = Default::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(total.len() == TEST_CLASSES.len() && total.values().all(|v| *v == N * K)) {
        assert!(
            Instant::now() < deadline,
            "the retired process's counts never arrived in full: {total:?}\n{}",
            agent.guard.describe()
        );
        let Some(req) = receiver.next(Duration::from_secs(5)).unwrap() else {
            continue;
        };
        for (c, v, _) in waits(&req, brief) {
            *total.entry(c).or_default() += v;
        }
    }
    for (c, v) in &total {
        assert_eq!(*v, N * K, "{c}: counted twice");
    }
}
