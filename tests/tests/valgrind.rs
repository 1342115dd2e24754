//! An instrumented program runs under valgrind: developers run their
//! services under memcheck and helgrind, and `pfs-client` must not make
//! that impossible. (rustix's own vDSO parser reads the auxiliary vector's
//! vDSO address, which valgrind does not map: every `init` crashed with
//! SIGSEGV there until rustix was built on its libc backend.) The events
//! the program recorded under valgrind are then read back by the agent.

use std::process::{Command, Stdio};

use pfs_tests::{agent_bin, writer_exe};
use serde_json::Value;

#[test]
fn an_instrumented_program_runs_under_valgrind_and_its_events_are_exact() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("valgrind is required (scripts/test installs it: apt-get install valgrind)");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // `exact`: 2 threads × 25 waits per class, both exit before the end
    // (their totals fold into the process's); stdin is null, so it exits
    // once it has printed what it recorded.
    let out = Command::new("valgrind")
        .args(["-q", "--error-exitcode=97", "--"])
        .arg(writer_exe!())
        .args(["exact", "--shm-dir", d, "--service", "vg"])
        .args(["--threads", "2", "--per-class", "25", "--exit-midway", "2"])
        .stdin(Stdio::null())
        .output()
        .expect("run valgrind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the instrumented program failed under valgrind ({}):\n{stderr}",
        out.status
    );
    let ready: Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .expect("the writer prints what it recorded"),
    )
    .unwrap();
    let pid = ready["pid"].as_u64().unwrap();

    // The process is gone; its segment is still there for the agent.
    let q = Command::new(agent_bin())
        .args(["query", "events_waits_summary_global_by_event_name"])
        .args([
            "--format",
            "json",
            "--pid",
            &pid.to_string(),
            "--shm-dir",
            d,
        ])
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let v: Value = serde_json::from_slice(&q.stdout).unwrap();
    let classes = ready["classes"].as_object().unwrap();
    assert_eq!(classes.len(), 3, "{ready}");
    for (name, want) in classes {
        let row = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["event_name"] == name.as_str())
            .unwrap_or_else(|| panic!("no row for {name}: {v}"));
        assert_eq!(row["count_star"], want["count"], "{name}");
        assert_eq!(want["count"], 50, "{name}");
    }
}
