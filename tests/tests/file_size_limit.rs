//! A file size limit (`ulimit -f`, `RLIMIT_FSIZE`) below what a process
//! would write: growing a file past it raises `SIGXFSZ`, which kills the
//! process. Neither the application nor the agent may die of it.
//!
//! * `pfs_client::init` with a limit below the segment's size fails with
//!   an error that names the limit, and the process runs on.
//! * `pfs-agent serve` under a limit below the space it keeps for its
//!   state file serves, retires a dead segment (its state file fits), and
//!   stays up.
//!
//! One test function: the limit is process-wide (the test lowers it for
//! itself and the agent it starts, then restores it).

use std::time::Duration;

use pfs_tests::{Agent, poll, sample};
use rustix::process::{Resource, getrlimit, setrlimit};

const LIMIT: u64 = 64 << 10;

#[test]
fn a_file_size_limit_is_an_error_not_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let agent_dir = dir.path().join("agent");
    let app_dir = dir.path().join("app");
    std::fs::create_dir(&agent_dir).unwrap();
    std::fs::create_dir(&app_dir).unwrap();
    // Written before the limit: a dead segment for the agent to retire.
    let dead = pfs_agent::testing::dead_segment(&agent_dir, "gone", 4242, 3);

    // Built (if need be) before the limit: a compiler under it would die.
    let _ = pfs_tests::agent_bin();
    let old = getrlimit(Resource::Fsize);
    let mut low = old;
    low.current = Some(LIMIT);
    setrlimit(Resource::Fsize, low).unwrap();

    // The application: an error, not SIGXFSZ.
    let r = pfs_client::init_with(pfs_client::Config::new("fsize").shm_dir(&app_dir));
    let err = r
        .expect_err("a segment larger than the limit is refused")
        .to_string();
    assert!(
        err.contains("file size limit") && err.contains(&LIMIT.to_string()),
        "{err}"
    );
    assert!(pfs_client::segment_path().is_none());

    // The agent, started under the same limit (inherited).
    let agent = Agent::serve_with_args(&agent_dir, &["--dead-retention", "1s"]);
    setrlimit(Resource::Fsize, old).unwrap();
    let mut agent = agent.expect("the agent serves under a small file size limit");
    poll(Duration::from_secs(20), || {
        let m = agent.metrics()?;
        Ok((sample(&m, "pfs_agent_retired_segments_total", &[])? == 1.0).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "the dead segment was not retired: {e:#}\n{}",
            agent.guard.describe()
        )
    });
    assert!(!dead.exists(), "retired and removed");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        agent.guard.try_wait().is_none(),
        "the agent is still running\n{}",
        agent.guard.describe()
    );
    assert!(
        agent_dir.join(".pfs-agent-state.json").exists(),
        "the retired totals were saved"
    );
}
