//! Ctrl-C on `pfs-agent demo` in a terminal (SIGINT to its whole process
//! group) stops the workload cleanly: it finishes the requests in flight
//! instead of taking the agent's stop as a second signal and exiting at
//! once, and the demo removes its segments.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pfs_tests::{agent_bin, free_port, get_json};

#[test]
fn ctrl_c_stops_the_demo_and_its_workload_cleanly() {
    let logs = tempfile::tempdir().unwrap();
    let stderr = logs.path().join("demo.stderr");
    let port = free_port();
    let mut demo = Command::new(agent_bin())
        .args(["demo", "--workers", "2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .env("PFS_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .process_group(0) // a terminal's job: its own process group
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/api/v1/tables/threads");
    let start = Instant::now();
    while get_json(&url).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the demo did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    // The demo leads its group: the group's id is its pid.
    let group = rustix::process::Pid::from_raw(demo.id() as i32).unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::INT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = demo.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop within 20 s of Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(status.success(), "{status}\n{log}");
    assert!(
        !log.contains("second signal"),
        "the workload took the agent's stop as a second signal:\n{log}"
    );
    assert!(
        log.contains("kvstore demo workload stopped"),
        "the workload did not finish cleanly:\n{log}"
    );
}
