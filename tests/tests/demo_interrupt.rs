//! Ctrl-C on `pfs-agent demo` in a terminal (SIGINT to its whole process
//! group) stops the workload cleanly: it finishes the requests in flight
//! instead of taking the agent's stop as a second signal and exiting at
//! once, and the demo removes its segments. A workload killed by another
//! signal (`kill -9`) is replaced, and the agent shows the dead one.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pfs_tests::{agent_bin, free_port, get_json, http_get, parse_metrics, sample};

/// A demo's process group (the demo leads it: its id is the demo's pid),
/// killed on drop: a failing test leaves no demo or workload running
/// (they would load every later test and benchmark on the machine).
struct Group(rustix::process::Pid);

impl Group {
    fn of(demo: &std::process::Child) -> Self {
        Self(rustix::process::Pid::from_raw(demo.id() as i32).expect("a pid"))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Gone already when the test stopped it: ESRCH, ignored.
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

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
    let _group = Group::of(&demo);
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

/// The pids the demo printed for its workloads so far.
fn workload_pids(stdout: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(stdout)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split("workload pid ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// `kill -9` of the demo's workload (a crash, the OOM killer) does not end
/// the demo: a new workload starts, and the agent shows the killed one's
/// segment as a dead process's while the new one is live.
#[test]
fn a_killed_workload_is_replaced_and_shown_dead() {
    let logs = tempfile::tempdir().unwrap();
    let stdout = logs.path().join("demo.stdout");
    let stderr = logs.path().join("demo.stderr");
    let port = free_port();
    let mut demo = Command::new(agent_bin())
        .args(["demo", "--workers", "2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = Group::of(&demo);
    let group = rustix::process::Pid::from_raw(demo.id() as i32).unwrap();
    let describe = || {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            std::fs::read_to_string(&stdout).unwrap_or_default(),
            std::fs::read_to_string(&stderr).unwrap_or_default()
        )
    };
    let metrics = || {
        http_get(&format!("http://127.0.0.1:{port}/metrics"))
            .ok()
            .filter(|r| r.status == 200)
            .and_then(|r| parse_metrics(&r.body).ok())
    };
    let segments = |state: &str| {
        metrics().and_then(|m| sample(&m, "pfs_agent_segments", &[("state", state)]).ok())
    };
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !f() {
            assert!(Instant::now() < deadline, "{what}\n{}", describe());
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for("the demo did not start", &|| segments("live") == Some(1.0));
    let first = workload_pids(&stdout)[0];
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    wait_for("no new workload after kill -9", &|| {
        workload_pids(&stdout).len() == 2
    });
    let second = workload_pids(&stdout)[1];
    assert_ne!(first, second);
    wait_for(
        "the killed workload is not shown dead beside a live one",
        &|| segments("dead") == Some(1.0) && segments("live") == Some(1.0),
    );
    assert!(demo.try_wait().unwrap().is_none(), "{}", describe());
    let said = std::fs::read_to_string(&stdout).unwrap();
    assert!(
        said.contains("the workload died") && said.contains("shows its segment as a dead"),
        "it had a segment: told it is shown dead\n{}",
        describe()
    );
    rustix::process::kill_process_group(group, rustix::process::Signal::INT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = demo.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no stop\n{}", describe());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}\n{}", describe());
}

/// `pfs-agent demo` on `port`, its segments in `dir`/shm and its stderr in
/// `dir`/demo.stderr, with `extra` flags, in a process group of its own
/// (as a terminal's job).
fn demo_in(dir: &std::path::Path, port: u16, extra: &[&std::ffi::OsStr]) -> std::process::Child {
    Command::new(agent_bin())
        .args(["demo", "--workers", "2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--shm-dir")
        .arg(dir.join("shm"))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("demo.stderr")).unwrap())
        .process_group(0)
        .spawn()
        .unwrap()
}

/// The sum of `count_star` over a summary table's rows (JSON of the API or
/// of `query --format json`).
fn total_count(table: &serde_json::Value) -> u64 {
    pfs_tests::rows(table)
        .unwrap()
        .iter()
        .map(|r| pfs_tests::u64_col(r, "count_star").unwrap())
        .sum()
}

/// A TRUNCATE through the demo's API is what `pfs-agent query` shows on
/// the demo's directory too (the demo keeps its baselines there, as
/// `serve` does, and the demo prints that `query` command); and `query`
/// whose reader went away (`| head`) ends quietly, without a panic.
#[test]
fn query_on_the_demo_shows_its_truncate_and_survives_a_closed_pipe() {
    const TABLE: &str = "events_waits_summary_global_by_event_name";
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let token = dir.path().join("token");
    std::fs::write(&token, "tok\n").unwrap();
    let port = free_port();
    let mut demo = demo_in(
        dir.path(),
        port,
        &["--control-token-file".as_ref(), token.as_ref()],
    );
    // Stops the demo and its workload (Ctrl-C), also when an assertion
    // fails.
    struct Stop(u32);
    impl Drop for Stop {
        fn drop(&mut self) {
            if let Some(group) = rustix::process::Pid::from_raw(self.0 as i32) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::INT);
            }
        }
    }
    let stop = Stop(demo.id());
    let api = format!("http://127.0.0.1:{port}/api/v1/tables/{TABLE}");
    let query = || {
        let out = Command::new(agent_bin())
            .args(["query", TABLE, "--format", "json", "--shm-dir"])
            .arg(&shm)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // Some seconds of work counted.
    let before = pfs_tests::poll(Duration::from_secs(60), || {
        Ok(get_json(&api)
            .ok()
            .map(|t| total_count(&t))
            .filter(|n| *n > 5_000))
    })
    .unwrap();
    // The directory the demo made for its segments is private, as the
    // client makes one.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&shm).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "--shm-dir made {mode:o}");
    let r = ureq::post(&format!("{api}/truncate"))
        .header("Authorization", "Bearer tok")
        .send_empty()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let after_api = total_count(&get_json(&api).unwrap());
    let after_query = total_count(&query());
    assert!(
        after_api < before / 2 && after_query >= after_api && after_query < before / 2,
        "query shows the table since the TRUNCATE, as the API does: before {before}, API after {after_api}, query after {after_query}"
    );

    // A reader that is already gone: every write fails with EPIPE.
    for format in ["json", "text"] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(agent_bin())
            .args([
                "query",
                "events_waits_history_long",
                "--format",
                format,
                "--shm-dir",
            ])
            .arg(&shm)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "{format}: {:?}\n{stderr}",
            out.status
        );
    }
    drop(stop);
    let deadline = Instant::now() + Duration::from_secs(20);
    while demo.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the demo did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The demo's `--instrument` rules hold from the workload's first event:
/// they reach it at its start (not only once the agent finds its
/// segment), so an instrument turned OFF never counts and a COUNTED one
/// never times.
#[test]
fn the_demos_instrument_rules_hold_from_the_workloads_start() {
    const TABLE: &str = "events_waits_summary_global_by_event_name";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let rules = [
        "--instrument",
        "wait/io/file/%=OFF",
        "--instrument",
        "wait/synch/mutex/%=COUNTED",
    ];
    let mut demo = demo_in(dir.path(), port, &rules.map(std::ffi::OsStr::new));
    let _group = Group::of(&demo);
    let group = rustix::process::Pid::from_raw(demo.id() as i32).unwrap();
    let api = format!("http://127.0.0.1:{port}/api/v1/tables/{TABLE}");
    let table = pfs_tests::poll(Duration::from_secs(60), || {
        Ok(get_json(&api).ok().filter(|t| total_count(t) > 5_000))
    });
    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::INT);
    let table = table.unwrap();
    let rows = pfs_tests::rows(&table).unwrap();
    let of = |prefix: &'static str| {
        rows.iter().filter(move |r| {
            pfs_tests::str_col(r, "event_name")
                .unwrap()
                .starts_with(prefix)
        })
    };
    let mutex_count: u64 = of("wait/synch/mutex/")
        .map(|r| pfs_tests::u64_col(r, "count_star").unwrap())
        .sum();
    assert!(mutex_count > 0, "the workload's mutexes count: {table}");
    for r in of("wait/synch/mutex/") {
        assert_eq!(
            pfs_tests::u64_col(r, "sum_timer_wait").unwrap(),
            0,
            "COUNTED: {r}"
        );
    }
    for r in of("wait/io/file/") {
        assert_eq!(pfs_tests::u64_col(r, "count_star").unwrap(), 0, "OFF: {r}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while demo.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the demo did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}
