//! A full segment directory (a private tmpfs, so this needs root, as the
//! suite runs): the agent cannot save its retired totals, so a dead
//! segment's file must stay (removing it would lose its counters at the
//! next restart). The failure is logged once, saying to free space; once
//! there is room, the segment is retired, saved and removed.
//!
//! An agent that owned the directory before it filled up kept space for
//! its state file: it gives that back to save, and the dead segment is
//! retired and removed at once, which frees room for new processes.

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use pfs_tests::{Agent, Tmpfs, sample};

const CLASS: &str = "wait/synch/mutex/t/a";

fn poll(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

#[test]
fn a_dead_segment_stays_while_the_disk_is_full() {
    let fs = Tmpfs::mount(4 << 20);
    let d = fs.0.path();
    let seg = pfs_agent::testing::dead_segment(d, "svc", 4242, 5);
    // Fill the volume (the segment's pages are written already).
    let filler = d.join("filler");
    let mut f = File::create(&filler).unwrap();
    while f.write_all(&[0u8; 4096]).is_ok() {}
    drop(f);

    let agent = Agent::serve_with_args(d, &["--dead-retention", "1s"]).unwrap();
    assert!(
        poll(Duration::from_secs(15), || agent
            .guard
            .stderr()
            .contains("cannot save the retired totals")),
        "{}",
        agent.guard.describe()
    );
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.guard.stderr();
    assert!(seg.exists(), "removed although not saved:\n{log}");
    assert_eq!(
        log.matches("cannot save the retired totals").count(),
        1,
        "logged once:\n{log}"
    );
    assert!(
        log.contains("No space left on device") && log.contains("free space"),
        "{log}"
    );
    let waits = |a: &Agent| {
        sample(
            &a.metrics().unwrap(),
            "pfs_events_waits_total",
            &[("service", "svc"), ("event_name", CLASS)],
        )
        .unwrap()
    };
    assert_eq!(waits(&agent), 5.0, "still exported");
    // An operator sees both problems without reading the log: on
    // /healthz (still 200: a restart fixes neither) and in the metrics
    // the alerts use.
    let health = agent.get("/healthz").unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    assert!(
        health.body.starts_with("ok\n")
            && health
                .body
                .contains("degraded: cannot save the retired totals")
            && health.body.contains("degraded: the segment volume of")
            && health.body.contains("is full"),
        "{}",
        health.body
    );
    let gauge = |a: &Agent, name: &str| sample(&a.metrics().unwrap(), name, &[]).unwrap();
    assert_eq!(gauge(&agent, "pfs_agent_state_unsaved"), 1.0);
    let size = gauge(&agent, "pfs_agent_volume_size_bytes");
    assert!((3.5e6..=4.5e6).contains(&size), "{size}");
    assert!(gauge(&agent, "pfs_agent_volume_free_bytes") < 0.01 * size);

    std::fs::remove_file(&filler).unwrap();
    assert!(
        poll(Duration::from_secs(15), || !seg.exists()),
        "{}",
        agent.guard.describe()
    );
    assert_eq!(waits(&agent), 5.0, "retired, still counted");
    assert!(
        poll(Duration::from_secs(10), || agent
            .get("/healthz")
            .is_ok_and(|h| h.status == 200 && h.body == "ok\n")),
        "{}",
        agent.guard.describe()
    );
    assert_eq!(gauge(&agent, "pfs_agent_state_unsaved"), 0.0);
    assert!(gauge(&agent, "pfs_agent_volume_free_bytes") > 0.5 * size);
    drop(agent);
    let mut agent = Agent::serve_with_args(d, &["--dead-retention", "1s"]).unwrap();
    agent.wait_healthy(Duration::from_secs(20)).unwrap();
    assert_eq!(waits(&agent), 5.0, "counted after a restart");
}

#[test]
fn the_space_kept_for_the_state_lets_a_dead_segment_go_on_a_full_disk() {
    space_kept_lets_a_dead_segment_go(false);
}

/// The same when the segment directory does not exist when the agent
/// starts (a sidecar started before its application, which makes it): the
/// space is kept once the directory appears.
#[test]
fn the_space_is_kept_in_a_directory_made_after_the_agent_started() {
    space_kept_lets_a_dead_segment_go(true);
}

fn space_kept_lets_a_dead_segment_go(made_late: bool) {
    let fs = Tmpfs::mount(4 << 20);
    let d = &if made_late {
        fs.0.path().join("segments")
    } else {
        fs.0.path().to_path_buf()
    };
    let mut agent = Agent::serve_with_args(d, &["--dead-retention", "4s"]).unwrap();
    agent.wait_healthy(Duration::from_secs(20)).unwrap();
    if made_late {
        std::thread::sleep(Duration::from_millis(1500)); // a pass or two
        std::fs::create_dir(d).unwrap();
    }
    let reserve = d.join(pfs_agent::retired::RESERVE_FILE);
    assert!(
        poll(Duration::from_secs(10), || reserve.exists()),
        "{}",
        agent.guard.describe()
    );
    // A live process, which dies once the volume is full: even the save
    // that keeps its totals aside fails then; the one that retires it
    // has the space kept.
    use pfs_agent::testing::{mutex_class, record_waits, segment_at, tiny_config};
    let seg = d.join(pfs_shm_layout::files::segment_file_name("svc", 4242));
    let (lock, w) = segment_at(&seg, &tiny_config("svc"), 4242, true);
    let class = mutex_class(&w, "a");
    let slot = w.alloc_thread(1, 1, "t").unwrap();
    record_waits(&w, slot.index, class, 5);
    let waits = |a: &Agent| {
        sample(
            &a.metrics().unwrap(),
            "pfs_events_waits_total",
            &[("service", "svc"), ("event_name", CLASS)],
        )
        .ok()
    };
    assert!(
        poll(Duration::from_secs(10), || waits(&agent) == Some(5.0)),
        "{}",
        agent.guard.describe()
    );
    let filler = fs.0.path().join("filler");
    let mut f = File::create(&filler).unwrap();
    while f.write_all(&[0u8; 4096]).is_ok() {}
    drop(f);
    drop((lock, w)); // the process dies
    assert!(
        poll(Duration::from_secs(20), || !seg.exists()),
        "not retired on a full disk:\n{}",
        agent.guard.describe()
    );
    let log = agent.guard.stderr();
    // (Keeping its totals aside at its death could not be saved: only a
    // save that lets files go spends the space kept.)
    assert!(log.contains("was given back"), "{log}");
    assert_eq!(waits(&agent), Some(5.0), "retired, still counted");
    drop(agent);
    std::fs::remove_file(&filler).unwrap();
    let mut agent = Agent::serve_with_args(d, &["--dead-retention", "4s"]).unwrap();
    agent.wait_healthy(Duration::from_secs(20)).unwrap();
    assert_eq!(waits(&agent), Some(5.0), "counted after a restart");
    assert!(
        poll(Duration::from_secs(10), || reserve.exists()),
        "the space is kept again"
    );
}
