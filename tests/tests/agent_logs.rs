//! The agent's logs as a file, a pipe, `kubectl logs` or a log shipper
//! reads them: the real `pfs-agent` binary, its stderr a pipe.
//!
//! * Text (the default) has no ANSI escape when stderr is not a
//!   terminal; on a terminal (a pty made by `script`) it is coloured,
//!   unless `NO_COLOR` is set.
//! * `PFS_LOG_FORMAT=json`: every line is a JSON object with a `level`, a
//!   `message` and the event's fields, for `query` and for `serve`.
//! * An unknown `PFS_LOG_FORMAT` is logged as an error and text is used
//!   (a typo must not stop a sidecar); `JSON` is `json`.
//!
//! Something to log: a file that is not a segment in the directory
//! (`refusing segment file`, a warning, with `reason = bad_magic`).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use pfs_tests::{agent_bin, free_port, http_get};
use serde_json::Value;

const ESC: &str = "\x1b[";

/// A directory holding one file the agent refuses.
fn dir_with_a_bad_file() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("garbage.1.pfs"), vec![0x5a; 4096]).unwrap();
    dir
}

/// The agent's command with `args`, an environment free of the variables
/// under test, then `env`.
fn agent(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.args(args);
    for k in ["NO_COLOR", "PFS_LOG", "PFS_LOG_FORMAT", "CLICOLOR_FORCE"] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    cmd
}

/// `pfs-agent query threads` over `dir`, stderr a pipe.
fn query(dir: &Path, env: &[(&str, &str)]) -> Output {
    agent(
        &["query", "threads", "--shm-dir", dir.to_str().unwrap()],
        env,
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .output()
    .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The lines of a JSON log, each an object with a string `level` and
/// `message`.
fn json_lines(log: &str) -> Vec<Value> {
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            assert!(v["level"].is_string(), "no level: {l}");
            assert!(v["message"].is_string(), "no message: {l}");
            v
        })
        .collect();
    assert!(!lines.is_empty(), "no log lines");
    lines
}

#[test]
fn text_logs_on_a_pipe_have_no_colour() {
    let dir = dir_with_a_bad_file();
    let o = query(dir.path(), &[]);
    let log = stderr(&o);
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("WARN") && log.contains("refusing segment file"),
        "the refusal is logged: {log:?}"
    );
    assert!(!log.contains(ESC), "ANSI escapes on a pipe: {log:?}");
    // `text` is the default, named.
    let named = stderr(&query(dir.path(), &[("PFS_LOG_FORMAT", "text")]));
    assert!(named.contains("refusing segment file") && !named.contains(ESC));
}

/// `cmd` run by `script` on a pseudo-terminal; what the terminal showed.
fn on_a_terminal(env: &[(&str, &str)], dir: &Path) -> String {
    let line = format!(
        "'{}' query threads --shm-dir '{}'",
        agent_bin().display(),
        dir.display()
    );
    let mut cmd = Command::new("script");
    cmd.args(["-qefc", &line, "/dev/null"]);
    for k in ["NO_COLOR", "PFS_LOG", "PFS_LOG_FORMAT", "CLICOLOR_FORCE"] {
        cmd.env_remove(k);
    }
    let o = cmd
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("`script` (util-linux) is needed to make a terminal: {e}"));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}");
    assert!(out.contains("refusing segment file"), "{out:?}");
    out
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let dir = dir_with_a_bad_file();
    let tty = on_a_terminal(&[], dir.path());
    assert!(
        tty.contains(ESC),
        "a terminal gets colours (else this test proves nothing): {tty:?}"
    );
    let no_color = on_a_terminal(&[("NO_COLOR", "1")], dir.path());
    assert!(!no_color.contains(ESC), "NO_COLOR=1: {no_color:?}");
    // An empty NO_COLOR does not count (https://no-color.org).
    assert!(on_a_terminal(&[("NO_COLOR", "")], dir.path()).contains(ESC));
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = dir_with_a_bad_file();
    let o = query(dir.path(), &[("PFS_LOG_FORMAT", "json")]);
    let log = stderr(&o);
    assert!(o.status.success(), "{log}");
    assert!(!log.contains(ESC), "{log:?}");
    let lines = json_lines(&log);
    let refused = lines
        .iter()
        .find(|v| {
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("refusing segment file")
        })
        .unwrap_or_else(|| panic!("no refusal in {log}"));
    assert_eq!(refused["level"], "WARN");
    assert_eq!(
        refused["reason"], "bad_magic",
        "fields at the top level: {refused}"
    );
    assert!(refused["timestamp"].is_string(), "{refused}");
    assert!(refused["target"].is_string(), "{refused}");
}

#[test]
fn json_logs_of_a_running_agent() {
    let dir = dir_with_a_bad_file();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = agent(
        &[
            "serve",
            "--shm-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            &listen,
        ],
        &[("PFS_LOG_FORMAT", "json")],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http_get(&format!("http://{listen}/healthz")).is_ok_and(|r| r.status == 200) {
        assert!(Instant::now() < deadline, "the agent did not start");
        assert!(child.try_wait().unwrap().is_none(), "the agent exited");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let discovery meet the bad file, then stop the agent as Kubernetes
    // does; its stderr ends when it exits.
    std::thread::sleep(Duration::from_millis(1500));
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {log}");
    assert!(!log.contains(ESC), "{log:?}");
    let lines = json_lines(&log);
    let messages: Vec<&str> = lines
        .iter()
        .map(|v| v["message"].as_str().unwrap())
        .collect();
    for want in [
        "pfs-agent serving",
        "refusing segment file",
        "pfs-agent stopped",
    ] {
        assert!(
            messages.iter().any(|m| m.starts_with(want)),
            "no {want:?} in {messages:?}"
        );
    }
    let serving = lines
        .iter()
        .find(|v| {
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("pfs-agent serving")
        })
        .unwrap();
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["listen"], listen.as_str(), "{serving}");
}

#[test]
fn an_unknown_log_format_is_reported_and_text_used() {
    let dir = dir_with_a_bad_file();
    let good = query(dir.path(), &[]);
    let o = query(dir.path(), &[("PFS_LOG_FORMAT", "yaml")]);
    let log = stderr(&o);
    // A typo does not stop the agent: it runs as with text logs.
    assert_eq!(o.status.code(), good.status.code(), "{log}");
    assert!(
        log.contains("ERROR")
            && log.contains("PFS_LOG_FORMAT")
            && log.contains("\"yaml\"")
            && log.contains("text or json")
            && log.contains("logging as text"),
        "{log}"
    );
    assert!(log.contains("refusing segment file"), "{log}");
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_err()),
        "text: {log}"
    );
    // Any case.
    let o = query(dir.path(), &[("PFS_LOG_FORMAT", "JSON")]);
    let lines = json_lines(&stderr(&o));
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"),
        "json: {lines:?}"
    );
}
