//! A process that restarts in a loop as pid 1 of its own PID namespace,
//! as every container's process is, has nine segment file names. While no
//! agent runs, each restart keeps its dead predecessors' segments for the
//! agent; from the tenth, it must replace one, the oldest, whose figures
//! are then lost: counted in `pfs_lost_total{kind="uncollected_segments"}`,
//! exactly. With an agent running (its heartbeat on `.pfs-agent.lock`),
//! a replaced segment is folded in by the agent and nothing is lost or
//! counted; nor once the agent has stopped, for the segments whose final
//! figures it saved (listed in that file). Real processes in real PID namespaces (`unshare`: needs root,
//! skipped otherwise, saying so).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use pfs_tests::{Agent, Writer, can_unshare, poll, sample, writer_exe};

const SERVICE: &str = "crashloop";
const CLASS: &str = "wait/synch/mutex/test/a";

/// One life of the program as pid 1 of a new PID namespace: starts,
/// records waits for a moment, exits cleanly. Returns the waits it
/// recorded.
fn one_life(dir: &Path) -> Result<u64> {
    let writer = writer_exe!().to_str().unwrap().to_string();
    let d = dir.to_str().unwrap();
    let mut w = Writer::spawn(
        Path::new("unshare"),
        &[
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            &writer,
            "loop",
            "--shm-dir",
            d,
            "--service",
            SERVICE,
            "--threads",
            "1",
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(20))?;
    let segment = ready["segment"].as_str().unwrap_or_default().to_string();
    anyhow::ensure!(
        Path::new(&segment)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{SERVICE}.1."))),
        "not pid 1 of its namespace: {ready}"
    );
    std::thread::sleep(Duration::from_millis(50));
    w.finish(Duration::from_secs(20))?;
    let done = w.read_json(Duration::from_secs(5))?;
    done["events"].as_u64().context("events in the last line")
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".pfs"))
        })
        .count()
}

/// `(waits, uncollected)` as the agent exports them for the service.
fn exported(agent: &Agent) -> Result<(f64, f64)> {
    let m = agent.metrics()?;
    Ok((
        sample(
            &m,
            "pfs_events_waits_total",
            &[("service", SERVICE), ("event_name", CLASS)],
        )?,
        sample(
            &m,
            "pfs_lost_total",
            &[("service", SERVICE), ("kind", "uncollected_segments")],
        )?,
    ))
}

#[test]
fn restarts_without_an_agent_count_what_they_lose_and_with_one_lose_nothing() -> Result<()> {
    if !can_unshare("uncollected_segments") {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    // Eleven lives with no agent: nine files; the tenth and eleventh
    // replaced the first two lives' segments.
    let lives: Vec<u64> = (0..11)
        .map(|_| one_life(dir.path()))
        .collect::<Result<_>>()?;
    assert_eq!(segment_files(dir.path()), 9);
    let kept: u64 = lives[2..].iter().sum();

    let agent = Agent::serve_with_args(dir.path(), &["--dead-retention", "1h"])?;
    let (waits, lost) = poll(Duration::from_secs(20), || {
        let got = exported(&agent)?;
        Ok((got.0 == kept as f64).then_some(got))
    })
    .with_context(|| format!("waits never reached {kept}: {:?}", exported(&agent)))?;
    assert_eq!((waits, lost), (kept as f64, 2.0), "lives: {lives:?}");

    // Three more lives beside the agent: each replaces a segment it has
    // read (folded in by its inode); nothing lost, nothing counted.
    std::thread::sleep(Duration::from_millis(1500)); // a heartbeat past every file
    let more: Vec<u64> = (0..3)
        .map(|_| one_life(dir.path()))
        .collect::<Result<_>>()?;
    let all = kept + more.iter().sum::<u64>();
    let (waits, lost) = poll(Duration::from_secs(20), || {
        let got = exported(&agent)?;
        Ok((got.0 == all as f64).then_some(got))
    })
    .with_context(|| format!("waits never reached {all}: {:?}", exported(&agent)))?;
    assert_eq!((waits, lost), (all as f64, 2.0), "more lives: {more:?}");

    // The agent stops, long enough for its heartbeat to go stale: two more
    // lives replace segments whose final figures it had saved (listed in
    // its lock file): nothing lost, nothing counted, once an agent runs
    // again.
    std::thread::sleep(Duration::from_millis(1500)); // the last deaths saved
    drop(agent);
    std::thread::sleep(pfs_shm_layout::files::AGENT_HEARTBEAT_FRESH + Duration::from_secs(1));
    let later: Vec<u64> = (0..2)
        .map(|_| one_life(dir.path()))
        .collect::<Result<_>>()?;
    let all = all + later.iter().sum::<u64>();
    let agent = Agent::serve_with_args(dir.path(), &["--dead-retention", "1h"])?;
    let (waits, lost) = poll(Duration::from_secs(20), || {
        let got = exported(&agent)?;
        Ok((got.0 == all as f64).then_some(got))
    })
    .with_context(|| format!("waits never reached {all}: {:?}", exported(&agent)))?;
    assert_eq!(
        (waits, lost),
        (all as f64, 2.0),
        "lives while no agent ran: {later:?}"
    );
    Ok(())
}
