//! What a process was doing when it died, as an on-call engineer finds it
//! after a crash or an OOM kill: the real `pfs-agent serve` watches a real
//! async service (`pfs-test-writer awaiting`) whose requests each hold a
//! statement, a stage and a wait; the service is killed (`SIGKILL`).
//! The tables show live processes only, so the agent says it in its log:
//! one warning naming the process and every event in progress (the
//! statements first), with how long before the death was seen each had
//! started. A process that ends its events before it exits gets no such
//! warning. `/metrics` counts its statements abandoned, through the
//! process's retirement and the agent's restarts.

use std::time::{Duration, Instant};

use pfs_tests::{Agent, Writer, writer_exe};

const TASKS: usize = 3;

/// The async service with `TASKS` requests waiting, once they all are.
fn service(dir: &std::path::Path, name: &str) -> Writer {
    let mut w = Writer::spawn(
        writer_exe!(),
        &[
            "awaiting",
            "--shm-dir",
            dir.to_str().unwrap(),
            "--service",
            name,
            "--tasks",
            &TASKS.to_string(),
        ],
    )
    .unwrap();
    let ready = w.read_json(Duration::from_secs(60)).unwrap();
    assert_eq!(ready["tasks"].as_array().map(Vec::len), Some(TASKS));
    w
}

/// The agent's log lines that say a process ended with work in
/// progress.
fn in_progress_lines(agent: &Agent) -> Vec<String> {
    agent
        .guard
        .stderr()
        .lines()
        .filter(|l| l.contains("ended with work in progress"))
        .map(str::to_string)
        .collect()
}

/// The sum of `/metrics` samples `name` of `service`'s request class.
fn requests(agent: &Agent, name: &str, service: &str) -> f64 {
    let samples = agent.metrics().unwrap();
    let labels = [
        ("service", service),
        ("event_name", "statement/test/request"),
    ];
    samples
        .iter()
        .filter(|s| s.name == name && s.has_labels(&labels))
        .map(|s| s.value)
        .sum()
}

/// Waits until `/metrics` has `n` as `name` for `service`'s requests.
fn wait_for(agent: &Agent, name: &str, service: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = requests(agent, name, service);
        if now == n {
            return;
        }
        assert!(Instant::now() < deadline, "{name}: {now}, not {n}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until `/metrics` counts `n` statements running for `service`.
fn wait_running(agent: &Agent, service: &str, n: f64) {
    wait_for(agent, "pfs_events_statements_running", service, n);
}

/// `pfs_processes{state="dead"}` of `service`.
fn dead(agent: &Agent, service: &str) -> f64 {
    let samples = agent.metrics().unwrap();
    samples
        .iter()
        .filter(|s| s.name == "pfs_processes")
        .filter(|s| s.has_labels(&[("service", service), ("state", "dead")]))
        .map(|s| s.value)
        .sum()
}

#[test]
fn a_killed_process_s_requests_in_progress_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    // Dead processes retired 5 s after their death is seen.
    let serve = || Agent::serve_with_args(dir.path(), &["--dead-retention", "5s"]).unwrap();
    let agent = serve();

    // Ends its requests, then exits: nothing to say.
    let mut clean = service(dir.path(), "clean");
    wait_running(&agent, "clean", TASKS as f64);
    clean.send_line("release").unwrap();
    let released = clean.read_json(Duration::from_secs(30)).unwrap();
    assert_eq!(released["released"], true, "{released}");
    clean.finish(Duration::from_secs(20)).unwrap();

    let killed = service(dir.path(), "killed");
    wait_running(&agent, "killed", TASKS as f64);
    let started = Instant::now();
    let pid = killed.guard.pid();
    killed.guard.signal(libc_sigkill());
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        if let Some(l) = in_progress_lines(&agent).pop() {
            break l;
        }
        assert!(
            Instant::now() < deadline,
            "no log of the killed process's requests:\n{}",
            agent.guard.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let seen = started.elapsed();
    assert!(line.contains(&format!("pid={pid}")), "{line}");
    assert!(line.contains("killed"), "{line}");
    // Each request's statement, stage and wait, from the tasks' slots.
    let events = 3 * TASKS;
    let counts = format!("{TASKS} statements, {TASKS} stages, {TASKS} waits in progress: ");
    assert!(line.contains(&counts), "{line}");
    assert!(line.contains("before the end was seen"), "{line}");
    for class in [
        "statement/test/request",
        "stage/test/backend",
        "wait/synch/mutex/test/pool",
    ] {
        assert_eq!(line.matches(class).count(), TASKS, "{class}: {line}");
    }
    assert_eq!(line.matches("an awaiting task").count(), events, "{line}");
    // Statements first; each started before its death was seen, and not
    // long before this test began waiting for the requests.
    let first = line.find("statement/test/request").unwrap();
    assert!(first < line.find("stage/test/backend").unwrap(), "{line}");
    for age in line.split(", started ").skip(1) {
        let secs: f64 = age
            .split(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{age:?} in {line}"));
        assert!(secs > 0.0 && secs < 60.0 + seen.as_secs_f64(), "{age}");
    }
    assert_eq!(
        in_progress_lines(&agent).len(),
        1,
        "once, for the killed process only:\n{}",
        agent.guard.stderr()
    );

    // Counted: the killed process's requests abandoned, in no other
    // counter; the clean one's completed, none abandoned.
    let abandoned = "pfs_events_statements_abandoned_total";
    let total = "pfs_events_statements_total";
    wait_for(&agent, abandoned, "killed", TASKS as f64);
    assert_eq!(requests(&agent, total, "killed"), 0.0);
    assert_eq!(requests(&agent, abandoned, "clean"), 0.0);
    assert_eq!(requests(&agent, total, "clean"), TASKS as f64);
    // An agent restarted while the process is dead, not retired yet
    // (found dead before it started): the same, not counted twice.
    drop(agent);
    let agent = serve();
    assert_eq!(dead(&agent, "killed"), 1.0, "not retired yet");
    wait_for(&agent, abandoned, "killed", TASKS as f64);
    // Retired (its file removed): kept in the totals, and in the state
    // file an agent restarted after reads.
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead(&agent, "killed") != 0.0 {
        assert!(Instant::now() < deadline, "never retired");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(requests(&agent, abandoned, "killed"), TASKS as f64);
    drop(agent);
    let agent = serve();
    wait_for(&agent, abandoned, "killed", TASKS as f64);
    assert_eq!(requests(&agent, total, "killed"), 0.0);
    drop(agent);

    // Killed while no agent ran: the agent that finds it says so, and
    // times its events up to the process's last recorded event (not to
    // when it happened to look: a request of a moment is not minutes
    // long because the agent started late).
    let unseen = service(dir.path(), "unseen");
    unseen.guard.signal(libc_sigkill());
    std::thread::sleep(Duration::from_secs(3));
    let agent = serve();
    wait_for(&agent, abandoned, "unseen", TASKS as f64);
    let lines = in_progress_lines(&agent);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(
        line.contains("unseen") && line.contains("when is not known"),
        "{line}"
    );
    for age in line.split(", started ").skip(1) {
        let secs: f64 = age.split(' ').next().unwrap().parse().unwrap();
        assert!(
            secs < 2.5,
            "{age} (it was killed 3 s before the agent started)"
        );
        assert!(
            age.contains("before the process's last recorded event"),
            "{age}"
        );
    }
    // `query` is a one-shot reader: it does not say it again at each run.
    for _ in 0..2 {
        let out = std::process::Command::new(pfs_tests::agent_bin())
            .args(["query", "threads", "--shm-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("in progress"), "{err}");
    }
}

/// `SIGKILL`'s number (9 on every Linux architecture).
fn libc_sigkill() -> i32 {
    9
}
