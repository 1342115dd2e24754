//! The real `pfs-agent` binary against hostile or mistaken segment
//! directories: FIFOs where the agent's own files or segments go (nothing
//! may block), a state file that cannot be saved (no retired segment's file
//! may be removed before its totals are saved), `--shm-dir` naming a file,
//! an empty `PFS_SHM_DIR` (the default directory, as if unset),
//! directories with no usable segment (a hint saying why), one that
//! does not exist yet (waited for, without a warning at every pass), and
//! one the agent may not read (degraded, counted, and said plainly).
//!
//! Dead segments are written with `pfs-shm-layout` as the client writes
//! them (nobody holds their lock).

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{BIN, Serve, as_nobody};
const CLASS: &str = "wait/synch/mutex/t/a";

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// Runs `pfs-agent args`; `None` for the status if it had not exited
/// within `timeout` (it is killed then). Returns stdout and stderr.
fn run(args: &[&str], timeout: Duration) -> (Option<ExitStatus>, String, String) {
    run_with(Command::new(BIN), args, timeout)
}

/// [`run`] with `cmd` as the agent (e.g. [`as_nobody`]).
fn run_with(
    mut cmd: Command,
    args: &[&str],
    timeout: Duration,
) -> (Option<ExitStatus>, String, String) {
    let logs = tempfile::tempdir().unwrap();
    let (out, err) = (logs.path().join("out"), logs.path().join("err"));
    let mut child = cmd
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status = wait(&mut child, timeout);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (status, read(&out), read(&err))
}

fn wait(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `pfs_events_waits_total` of `service`'s [`CLASS`].
fn waits(agent: &Serve, service: &str) -> Option<f64> {
    let (svc, class) = (
        format!("service=\"{service}\""),
        format!("event_name=\"{CLASS}\""),
    );
    agent.metric("pfs_events_waits_total", &[&svc, &class]).ok()
}

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

/// A FIFO as the state file used to block `serve` in `open()` before it
/// listened. Now it is refused at once, named, and set aside without
/// replacing an earlier `.corrupt` file.
#[test]
fn a_fifo_as_the_state_file_does_not_block_serve() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    mkfifo(&d.join(".pfs-agent-state.json"));
    std::fs::write(d.join(".pfs-agent-state.json.corrupt"), b"earlier").unwrap();
    let mut agent = Serve::start(d, &[]);
    agent.wait_healthy(Duration::from_secs(20));
    let log = agent.stderr();
    assert!(
        log.contains("a FIFO, not a regular file; remove it"),
        "{log}"
    );
    assert_eq!(
        std::fs::read(d.join(".pfs-agent-state.json.corrupt")).unwrap(),
        b"earlier"
    );
}

/// A FIFO as the `TRUNCATE` baselines file used to leave every request
/// unanswered.
#[test]
fn a_fifo_as_the_baselines_file_does_not_block_requests() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join(".pfs-agent-truncate.json"));
    let mut agent = Serve::start(dir.path(), &[]);
    agent.wait_healthy(Duration::from_secs(20));
    let table = agent.get("/api/v1/tables/threads");
    assert_eq!(table.map(|(s, _)| s), Ok(200), "{}", agent.stderr());
}

/// A FIFO named like a segment used to block `setup` for ever.
#[test]
fn setup_skips_a_fifo_named_like_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("x.1.pfs"));
    let d = dir.path().to_str().unwrap();
    let args = [
        "setup",
        "instruments",
        "wait/%",
        "--enabled",
        "no",
        "--shm-dir",
        d,
    ];
    let (status, _, err) = run(&args, Duration::from_secs(15));
    let status = status.expect("setup blocked on a FIFO");
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("skipping") && err.contains("a FIFO"), "{err}");
}

/// While the state cannot be saved (a directory in the way of its
/// temporary file), a dead segment is not removed: the failure is logged
/// once, naming the path, and once the way is clear the segment is
/// retired, saved and removed; a restarted agent still counts it.
#[test]
fn a_dead_segment_is_kept_until_its_totals_are_saved() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let seg = pfs_agent::testing::dead_segment(d, "svc", 4242, 5);
    let tmp = d.join(".pfs-agent-state.json.tmp");
    std::fs::create_dir_all(tmp.join("x")).unwrap();
    let mut agent = Serve::start(d, &["--dead-retention", "1s"]);
    agent.wait_healthy(Duration::from_secs(20));
    // Several passes past the retention, each of which tries to retire it.
    assert!(poll(Duration::from_secs(15), || agent
        .stderr()
        .contains("cannot save the retired totals")));
    std::thread::sleep(Duration::from_secs(4));
    let log = agent.stderr();
    assert!(seg.exists(), "removed although not saved:\n{log}");
    assert!(!log.contains("retired and removed"), "{log}");
    assert_eq!(
        log.matches("cannot save the retired totals").count(),
        1,
        "logged once, not every pass:\n{log}"
    );
    let tmp_text = tmp.display().to_string();
    assert!(
        log.contains(&format!("{tmp_text} is a directory")) && log.contains("remove it"),
        "{log}"
    );
    assert_eq!(waits(&agent, "svc"), Some(5.0), "still exported");

    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        poll(Duration::from_secs(15), || !seg.exists()),
        "{}",
        agent.stderr()
    );
    assert!(agent.stderr().contains("saved again"), "{}", agent.stderr());
    assert_eq!(waits(&agent, "svc"), Some(5.0), "retired, still counted");
    drop(agent);

    let mut agent = Serve::start(d, &["--dead-retention", "1s"]);
    agent.wait_healthy(Duration::from_secs(20));
    assert_eq!(waits(&agent, "svc"), Some(5.0), "counted after a restart");
}

/// A sidecar starts before its application: the segment directory does
/// not exist yet. The agent says so once, waits without warning at every
/// discovery pass that it cannot list it, and exports what appears.
#[test]
fn a_segment_directory_that_does_not_exist_yet_is_waited_for_quietly() {
    let parent = tempfile::tempdir().unwrap();
    let d = parent.path().join("segments");
    let mut agent = Serve::start(&d, &[]);
    agent.wait_healthy(Duration::from_secs(20));
    // Several discovery passes (one a second).
    std::thread::sleep(Duration::from_millis(3500));
    let log = agent.stderr();
    assert_eq!(
        log.matches("does not exist yet").count(),
        1,
        "said once:\n{log}"
    );
    assert!(!log.contains("cannot list the segment directory"), "{log}");
    assert!(!log.contains("No such file or directory"), "{log}");
    std::fs::create_dir(&d).unwrap();
    pfs_agent::testing::dead_segment(&d, "late", 4343, 3);
    assert!(
        poll(Duration::from_secs(10), || waits(&agent, "late")
            == Some(3.0)),
        "{}",
        agent.stderr()
    );
    let log = agent.stderr();
    assert!(log.contains("the segment directory exists now"), "{log}");
    assert!(!log.contains("WARN pfs_agent::segments"), "{log}");
}

/// `--shm-dir` naming a regular file is a configuration error for every
/// command, `serve` included (which waits only for a path that does not
/// exist yet).
#[test]
fn a_shm_dir_that_is_a_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, b"").unwrap();
    let f = file.to_str().unwrap();
    for args in [
        vec!["query", "threads", "--shm-dir", f],
        vec![
            "setup",
            "instruments",
            "wait/%",
            "--enabled",
            "no",
            "--shm-dir",
            f,
        ],
        vec!["serve", "--shm-dir", f, "--listen", "127.0.0.1:0"],
    ] {
        let (status, _, err) = run(&args, Duration::from_secs(15));
        let status = status.unwrap_or_else(|| panic!("{args:?} did not exit"));
        assert!(!status.success(), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{f} is not a directory")),
            "{args:?}: {err}"
        );
    }
    assert!(!dir.path().join("afile.corrupt").exists());
}

/// `PFS_SHM_DIR` set but empty (`PFS_SHM_DIR= pfs-agent serve`, or an
/// empty value in a manifest) is unset: the default directory, not clap's
/// "a value is required for '--shm-dir'" (a flag nobody typed, exit 2).
/// `serve` takes its arguments, then stops at its missing read token
/// before it touches any directory; `query` (which only reads) reads the
/// default one, whatever this machine holds there; `--shm-dir` still
/// wins.
#[test]
fn an_empty_pfs_shm_dir_is_the_default_directory() {
    let run_empty = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.env("PFS_SHM_DIR", "");
        let (status, out, err) = run_with(cmd, args, Duration::from_secs(15));
        (
            status.unwrap_or_else(|| panic!("{args:?} did not exit")),
            out,
            err,
        )
    };
    let secrets = tempfile::tempdir().unwrap();
    let missing = secrets.path().join("read-token");
    let serve = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--read-token-file",
        missing.to_str().unwrap(),
    ];
    let (status, _, err) = run_empty(&serve);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("cannot read the token file"), "{err}");

    let default = pfs_shm_layout::files::DEFAULT_SHM_DIR;
    let (status, out, err) = run_empty(&["query", "threads"]);
    assert!(
        (status.success() && out.contains(" row")) || err.contains(default),
        "{status}: {out}{err}"
    );
    assert!(!err.contains("--shm-dir <"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (status, _, err) = run_empty(&["query", "threads", "--shm-dir", d]);
    assert!(status.success(), "{err}");
    assert!(err.contains(&format!("no segments in {d}")), "{err}");
}

/// An empty directory: `query` and `setup` succeed but say why nothing
/// was found.
#[test]
fn an_empty_directory_gets_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (status, out, err) = run(
        &["query", "threads", "--shm-dir", d],
        Duration::from_secs(15),
    );
    assert!(status.unwrap().success(), "{err}");
    assert!(out.contains("0 rows"), "{out}");
    assert!(
        err.contains(&format!("no segments in {d}")) && err.contains("PFS_SHM_DIR"),
        "{err}"
    );
    let setup = [
        "setup",
        "instruments",
        "wait/%",
        "--enabled",
        "no",
        "--shm-dir",
        d,
    ];
    let (status, _, err) = run(&setup, Duration::from_secs(15));
    assert!(status.unwrap().success(), "{err}");
    assert!(
        err.contains(&format!("no live segment in {d}")) && err.contains("PFS_SHM_DIR"),
        "{err}"
    );
}

/// Files that are all refused: `query` says so. (It still exits 0:
/// `tests/tests/agent_logs.rs` relies on that.)
#[test]
fn query_says_when_every_segment_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("junk.1.pfs"), vec![0x5a; 4096]).unwrap();
    let d = dir.path().to_str().unwrap();
    let (status, _, err) = run(
        &["query", "threads", "--shm-dir", d],
        Duration::from_secs(15),
    );
    assert!(status.unwrap().success(), "{err}");
    assert!(
        err.contains(&format!("every segment file in {d} was refused (1 file(s)")),
        "{err}"
    );
    assert!(!err.contains("no segments in"), "{err}");
}

/// A segment file that is not initialised (empty: a process creating it,
/// or an operator's `touch`): `query`, which reads once without waiting,
/// names it instead of saying the directory has no segments; beside a
/// refused one, both are counted.
#[test]
fn query_counts_segment_files_not_initialised() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.100.pfs"), b"").unwrap();
    let d = dir.path().to_str().unwrap();
    let args = ["query", "threads", "--shm-dir", d];
    let (status, _, err) = run(&args, Duration::from_secs(15));
    assert!(status.unwrap().success(), "{err}");
    assert!(
        err.contains(&format!(
            "no readable segment in {d}; 1 segment file(s) not initialised"
        )),
        "{err}"
    );
    assert!(!err.contains("no segments in"), "{err}");
    std::fs::write(dir.path().join("junk.1.pfs"), vec![0x5a; 4096]).unwrap();
    let (status, _, err) = run(&args, Duration::from_secs(15));
    assert!(status.unwrap().success(), "{err}");
    assert!(
        err.contains("1 segment file(s) refused")
            && err.contains("1 segment file(s) not initialised"),
        "{err}"
    );
}

/// A segment directory of another user's (mode 0700, as the client makes
/// it without `PFS_GROUP_ACCESS`) in a directory anyone may search: the
/// agent runs as `nobody`. Returns the parent (kept while it is used) and
/// the directory.
fn foreign_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = parent.path().join("pfs");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    (parent, d)
}

/// Waits (up to `timeout`) for `/healthz` to answer 200 with a
/// `degraded:` line naming the segment directory `dir`; the body.
fn degraded(agent: &Serve, dir: &Path, timeout: Duration) -> String {
    let mut last = None;
    assert!(
        poll(timeout, || {
            last = agent.get("/healthz").ok();
            last.as_ref()
                .is_some_and(|(st, body)| *st == 200 && body.starts_with("ok\ndegraded: "))
        }),
        "{last:?}\n{}",
        agent.stderr()
    );
    let (_, why) = last.unwrap();
    assert!(
        why.contains(&format!(
            "cannot list the segment directory {}",
            dir.display()
        )),
        "{why}"
    );
    why
}

/// An agent that may not list the segment directory finds no process,
/// ever: `/healthz` says so (still 200: a restart would not help, and a
/// failing startup probe would keep the application from starting; why
/// and what to do after `ok`), a counter moves, and its own files are not
/// called unusable (they may not even exist: the directory is the
/// problem). Once the directory can be read, the warning goes.
#[test]
fn a_segment_directory_the_agent_may_not_read_is_degraded_and_says_why() {
    use std::os::unix::fs::PermissionsExt;
    let Some(nobody) = as_nobody() else { return };
    let (_parent, d) = foreign_dir();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let agent = Serve::start_with(nobody, &d, Some(addr.to_string()), addr, &[]);
    let why = degraded(&agent, &d, Duration::from_secs(20));
    assert!(
        why.contains("Permission denied") && why.contains("PFS_GROUP_ACCESS=1"),
        "{why}"
    );
    let denied = agent
        .metric(
            "pfs_agent_discovery_errors_total",
            &["reason=\"permission_denied\""],
        )
        .unwrap();
    assert!(denied >= 1.0, "{denied}");
    let log = agent.stderr();
    assert!(!log.contains("unusable"), "{log}");
    assert!(
        log.contains("cannot read the state file")
            && log.contains("cannot read the TRUNCATE baselines file")
            && log.contains("the segment directory cannot be searched"),
        "{log}"
    );
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(
        poll(Duration::from_secs(10), || agent
            .get("/healthz")
            .is_ok_and(|(st, body)| st == 200 && body == "ok\n")),
        "{}",
        agent.stderr()
    );
}

/// A segment file the agent may not open (an application of another user
/// started without `PFS_GROUP_ACCESS=1`: `0600`) is refused as
/// `permission_denied`, naming the file's mode and owner and what to do;
/// `/healthz` says so for as long as it lasts (the process is not
/// exported), and once the file is readable it is exported.
/// A segment directory of `nobody`'s (an agent run as `nobody` writes its
/// state there), in a fresh parent others may enter; the parent is
/// removed when the first value drops.
fn nobodys_directory() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = parent.path().join("pfs");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
    (parent, d)
}

#[test]
fn a_segment_the_agent_may_not_read_is_degraded_and_says_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    let Some(nobody) = as_nobody() else { return };
    // The segment is root's.
    let (_parent, d) = nobodys_directory();
    let seg = pfs_agent::testing::dead_segment(&d, "svc", 4242, 5);
    std::fs::set_permissions(&seg, std::fs::Permissions::from_mode(0o600)).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let agent = Serve::start_with(nobody, &d, Some(addr.to_string()), addr, &[]);
    let mut last = None;
    assert!(
        poll(Duration::from_secs(20), || {
            last = agent.get("/healthz").ok();
            last.as_ref().is_some_and(|(st, body)| {
                *st == 200
                    && body.starts_with("ok\ndegraded: 1 segment file(s) the agent may not read")
            })
        }),
        "{last:?}\n{}",
        agent.stderr()
    );
    let (_, body) = last.unwrap();
    assert!(
        body.contains("svc.4242.pfs")
            && body.contains("mode 0600, owner uid 0")
            && body.contains("uid 65534")
            && body.contains("PFS_GROUP_ACCESS=1"),
        "{body}"
    );
    let denied = agent
        .metric(
            "pfs_agent_segment_errors_total",
            &["reason=\"permission_denied\""],
        )
        .unwrap();
    assert_eq!(denied, 1.0, "counted once, not every pass");
    assert_eq!(waits(&agent, "svc"), None, "not exported");
    std::fs::set_permissions(&seg, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        poll(Duration::from_secs(10), || waits(&agent, "svc")
            == Some(5.0)),
        "{}",
        agent.stderr()
    );
    assert!(
        agent
            .get("/healthz")
            .is_ok_and(|(st, body)| st == 200 && body == "ok\n"),
        "{:?}",
        agent.get("/healthz")
    );
}

/// `query` over a directory it may not list fails (exit 1) naming the
/// directory, the error and what to do, rather than printing an empty
/// table.
#[test]
fn query_fails_on_a_segment_directory_it_may_not_read() {
    let Some(nobody) = as_nobody() else { return };
    let (_parent, d) = foreign_dir();
    let p = d.to_str().unwrap();
    let (status, out, err) = run_with(
        nobody,
        &["query", "threads", "--shm-dir", p],
        Duration::from_secs(15),
    );
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{out}{err}");
    assert!(
        err.contains(&format!("cannot list segment directory {p}"))
            && err.contains("Permission denied")
            && err.contains("PFS_GROUP_ACCESS=1"),
        "{err}"
    );
    assert!(!out.contains("rows in set"), "{out}");
}

/// `query --service` naming no service found: the (valid) empty table,
/// and a warning naming the services there are.
#[test]
fn query_warns_when_no_segment_has_the_service() {
    let dir = tempfile::tempdir().unwrap();
    pfs_agent::testing::dead_segment(dir.path(), "orders", 4242, 1);
    let d = dir.path().to_str().unwrap();
    let (status, out, err) = run(
        &["query", "threads", "--shm-dir", d, "--service", "order"],
        Duration::from_secs(15),
    );
    assert!(status.unwrap().success(), "{err}");
    assert!(out.contains("0 rows"), "{out}");
    // (`threads` shows live processes only, and "orders" is dead.)
    assert!(
        err.contains("no live process matches --service \"order\"")
            && err.contains("no live process is being read"),
        "{err}"
    );
    // In JSON, the answer carries it too, as the API's does.
    let json_threads = |dir: &str| {
        let args = ["query", "threads", "--shm-dir", dir, "--service", "order"];
        let (status, out, err) = run(
            &[&args[..], &["--format", "json"]].concat(),
            Duration::from_secs(15),
        );
        assert!(status.unwrap().success(), "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let json = json_threads(d);
    assert_eq!(json["rows"], serde_json::json!([]), "{json}");
    assert!(
        json["warning"]
            .as_str()
            .is_some_and(|w| w.contains("no live process matches --service \"order\"")),
        "{json}"
    );
    // With no segment at all, the JSON answer says so too.
    let empty = tempfile::tempdir().unwrap();
    let json = json_threads(empty.path().to_str().unwrap());
    assert!(json["warning"].is_string(), "{json}");
    // (A dead process has no thread left: its summaries show it.)
    let (status, out, err) = run(
        &[
            "query",
            "events_waits_summary_global_by_event_name",
            "--shm-dir",
            d,
            "--service",
            "orders",
        ],
        Duration::from_secs(15),
    );
    assert!(status.unwrap().success(), "{err}");
    assert!(out.contains("1 row"), "{out}");
    assert!(!err.contains("no segment matches"), "{err}");
}

/// `PFS_LOG` naming no level is reported as an error, and the command
/// goes on logging at its default level, rather than silencing every log
/// (`EnvFilter` reads a bare word as a target) or stopping (a sidecar that
/// cannot start can keep its application from starting).
#[test]
fn a_pfs_log_that_is_not_a_level_is_reported_and_the_default_used() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for bad in ["warning", "verbose", "pfs_agent=loud"] {
        let out = Command::new(BIN)
            .args(["query", "threads", "--shm-dir", d])
            .env("PFS_LOG", bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{bad}: {err}");
        assert!(
            err.contains(&format!("PFS_LOG={bad} is not a"))
                && err.contains("trace, debug, info, warn, error or off")
                && err.contains("logging at"),
            "{err}"
        );
        assert!(
            err.contains("no segments in"),
            "the default level logs: {err}"
        );
    }
    let out = Command::new(BIN)
        .args(["query", "threads", "--shm-dir", d])
        .env("PFS_LOG", "WARN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no segments in"), "a level still logs: {err}");
}

/// The segment directory removed under the agent (deleted, or its volume
/// unmounted) while it still reads a segment found there: the segment keeps
/// being exported, but no new process can be found until it is back, so
/// `/healthz` says degraded and why, and `reason="removed"` counts. Made
/// again (as a new instrumented process does), it is fine again and a new
/// segment in it is found.
#[test]
fn a_segment_directory_removed_under_the_agent_is_degraded_and_says_why() {
    let parent = tempfile::tempdir().unwrap();
    let d = parent.path().join("segments");
    std::fs::create_dir(&d).unwrap();
    pfs_agent::testing::dead_segment(&d, "early", 4545, 7);
    let mut agent = Serve::start(&d, &[]);
    agent.wait_healthy(Duration::from_secs(20));
    assert!(
        poll(Duration::from_secs(10), || waits(&agent, "early")
            == Some(7.0)),
        "{}",
        agent.stderr()
    );
    std::fs::remove_dir_all(&d).unwrap();
    let why = degraded(&agent, &d, Duration::from_secs(10));
    assert!(
        why.contains("No such file or directory")
            && why.contains("no new instrumented process can be found until it is back")
            && why.contains("makes the directory again"),
        "{why}"
    );
    let removed = agent
        .metric("pfs_agent_discovery_errors_total", &["reason=\"removed\""])
        .unwrap();
    assert!(removed >= 1.0, "{removed}");
    assert_eq!(waits(&agent, "early"), Some(7.0), "still exported");
    let log = agent.stderr();
    assert!(
        log.contains("cannot list the segment directory")
            && log.contains("makes the directory again"),
        "{log}"
    );

    std::fs::create_dir(&d).unwrap();
    pfs_agent::testing::dead_segment(&d, "late", 4646, 2);
    assert!(
        poll(Duration::from_secs(10), || agent
            .get("/healthz")
            .is_ok_and(|(st, body)| st == 200 && body == "ok\n")
            && waits(&agent, "late") == Some(2.0)),
        "{}",
        agent.stderr()
    );
    assert_eq!(waits(&agent, "early"), Some(7.0), "still exported");
}

/// `threads`, and every table of per-thread rows, list the threads of
/// live processes only: a dead process's segment (killed: its records
/// still allocated), kept for its final counters, has no thread left.
#[test]
fn the_per_thread_tables_show_live_processes_only() {
    use pfs_agent::testing::{mutex_class, record_waits, segment_at, tiny_config};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    pfs_agent::testing::dead_segment(d, "gone", 4747, 3);
    let seg = d.join(pfs_shm_layout::files::segment_file_name("alive", 4848));
    let (_lock, w) = segment_at(&seg, &tiny_config("alive"), 4848, true);
    let class = mutex_class(&w, "a");
    let slot = w.alloc_thread(1, 1, "worker").unwrap();
    record_waits(&w, slot.index, class, 2);
    let mut agent = Serve::start(d, &[]);
    agent.wait_healthy(Duration::from_secs(20));
    assert!(
        poll(Duration::from_secs(10), || waits(&agent, "gone")
            == Some(3.0)
            && waits(&agent, "alive") == Some(2.0)),
        "{}",
        agent.stderr()
    );
    for table in [
        "threads",
        "events_waits_current",
        "events_waits_history",
        "events_waits_summary_by_thread_by_event_name",
    ] {
        let (status, body) = agent.get(&format!("/api/v1/tables/{table}")).unwrap();
        assert_eq!(status, 200, "{table}: {body}");
        // (The body may be chunked: look for the services' names.)
        assert!(body.contains("\"alive\""), "{table}: {body}");
        assert!(
            !body.contains("\"gone\""),
            "{table}: a dead process's threads: {body}"
        );
    }
    // Its final counters stay in the global summaries.
    let (_, body) = agent
        .get("/api/v1/tables/events_waits_summary_global_by_event_name")
        .unwrap();
    assert!(body.contains("\"gone\""), "{body}");
}

/// A dead process's retention runs from its death, not from the agent's
/// start: an agent restarted in the middle of it retires the segment when
/// the rest of it has passed (its final counters kept, and counted once).
#[test]
fn the_retention_of_a_dead_segment_survives_an_agent_restart() {
    const RETENTION: Duration = Duration::from_secs(16);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let seg = pfs_agent::testing::dead_segment(d, "svc", 4949, 4);
    let state = d.join(".pfs-agent-state.json");
    let args = ["--dead-retention", "16s"];
    let mut agent = Serve::start(d, &args);
    agent.wait_healthy(Duration::from_secs(20));
    // Its death is found and kept in the state, with its time.
    assert!(
        poll(Duration::from_secs(10), || std::fs::read_to_string(&state)
            .is_ok_and(|s| s.contains("died_unix_ns"))),
        "{}",
        agent.stderr()
    );
    let died = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    agent.stop(Duration::from_secs(10));
    drop(agent);
    let mut agent = Serve::start(d, &args);
    agent.wait_healthy(Duration::from_secs(20));
    assert!(
        seg.exists(),
        "retired {:?} after its death, before its retention",
        died.elapsed()
    );
    assert!(
        poll(Duration::from_secs(30), || !seg.exists()),
        "{}",
        agent.stderr()
    );
    let retired_after = died.elapsed();
    assert!(
        retired_after < RETENTION + Duration::from_secs(3),
        "retired {retired_after:?} after its death was found, retention {RETENTION:?}: the restart began it again\n{}",
        agent.stderr()
    );
    assert!(
        agent
            .stderr()
            .contains("found dead before this agent started"),
        "{}",
        agent.stderr()
    );
    assert_eq!(waits(&agent, "svc"), Some(4.0), "retired, counted once");
}

/// Flags that cannot work are refused before anything starts, saying why:
/// negative durations, zero timeouts, a zero size limit, pid 0, and an
/// address the host does not have.
#[test]
fn flags_that_cannot_work_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    for (args, says) in [
        (
            &["serve", "--dead-retention", "-5s"][..],
            "is not a duration",
        ),
        (&["serve", "--header-timeout", "0s"][..], "a timeout of 0"),
        (
            &["serve", "--connection-timeout", "0"][..],
            "a timeout of 0",
        ),
        (
            &["serve", "--max-segment-size", "0"][..],
            "would refuse every segment",
        ),
        (&["query", "threads", "--pid", "0"][..], "--pid"),
    ] {
        let mut all = args.to_vec();
        all.extend(["--shm-dir", d]);
        let (status, _, err) = run(&all, Duration::from_secs(10));
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // 192.0.2.0/24 is TEST-NET-1: no host has it.
    let (status, _, err) = run(
        &["serve", "--shm-dir", d, "--listen", "192.0.2.1:9464"],
        Duration::from_secs(10),
    );
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(
        err.contains("cannot listen on 192.0.2.1:9464 (this host has no such address"),
        "{err}"
    );
    // An agent that cannot listen leaves nothing in the directory (where
    // the state files of the agent serving it would be).
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A lock file left by an earlier agent of another user (root's, mode
/// 0666, as an agent run with umask 0 leaves it): an agent running as
/// `nobody` may write it but does not own it, so it cannot give it an
/// explicit time. Its heartbeat (the file's modification time, which a
/// restarting application reads) still moves: both times set to now need
/// write access only.
#[test]
fn the_heartbeat_moves_on_a_lock_file_of_another_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some(nobody) = as_nobody() else { return };
    let (_parent, d) = nobodys_directory();
    let lock = d.join(pfs_shm_layout::files::AGENT_LOCK_FILE);
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_836_800); // 2020
    let f = std::fs::File::create(&lock).unwrap();
    f.set_modified(old).unwrap();
    drop(f);
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let agent = Serve::start_with(nobody, &d, Some(addr.to_string()), addr, &[]);
    let beat = || std::fs::metadata(&lock).and_then(|m| m.modified()).unwrap();
    assert!(
        poll(Duration::from_secs(20), || beat()
            > old + Duration::from_secs(86_400)),
        "the heartbeat stayed at {:?}\n{}",
        beat(),
        agent.stderr()
    );
    assert_eq!(std::fs::metadata(&lock).unwrap().uid(), 0, "still root's");
    assert!(
        pfs_shm_layout::files::agent_watched(&d, old),
        "an application sees the agent watch"
    );
    assert!(!agent.stderr().contains("heartbeat"), "{}", agent.stderr());
}
