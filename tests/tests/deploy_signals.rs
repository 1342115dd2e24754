//! deploy/: how the pod's two processes stop, with the real `pfs-agent`
//! binary.
//!
//! * The demo workload (`pfs-agent workload`, the app container's PID 1 in
//!   deploy/kubernetes) stops cleanly and promptly on SIGTERM and SIGINT,
//!   and honours the `PFS_*` environment the manifest sets
//!   (`PFS_GROUP_ACCESS`, `PFS_SERVICE_NAME`, `PFS_SHM_DIR`, which it
//!   refuses empty, naming it).
//! * As the init of a new PID namespace (`unshare --pid --fork
//!   --mount-proc`, as a container runtime starts it; needs root, skipped
//!   otherwise), where the kernel drops a signal the process has no handler
//!   for, it still stops on SIGTERM sent from outside the namespace, as the
//!   kubelet's runtime sends it. A control run (`sleep` as PID 1) shows
//!   the premise: that one ignores the signal.
//! * `pfs-agent serve --shutdown-delay` keeps serving `/metrics` (fresh
//!   snapshots: an app that stopped just before shows up as a dead segment
//!   with its counters) and `/healthz` for the delay after SIGTERM, then
//!   exits 0; a second signal stops it at once.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pfs_tests::{
    ChildGuard, agent_bin, can_unshare, free_port, http_get, parse_metrics, poll, wait_healthz,
};

/// How long a stop may take: the workload drains connections (a burst and
/// a 20-60 ms pause each) and syncs its WAL, well within this.
const PROMPT: Duration = Duration::from_secs(10);

/// A `0777` directory standing for the pod's emptyDir, with the segment
/// subdirectory and data directory paths under it.
struct PodDirs {
    _root: tempfile::TempDir,
    shm: PathBuf,
    data: PathBuf,
}

fn pod_dirs() -> PodDirs {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    PodDirs {
        shm: root.path().join("segments"),
        data,
        _root: root,
    }
}

/// `pfs-agent workload` with the given extra args and only `env` in its
/// environment, run by `wrapper` (e.g. `unshare ...`) if not empty.
fn workload_cmd(wrapper: &[&str], d: &PodDirs, extra: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(agent_bin());
            c
        }
        None => Command::new(agent_bin()),
    };
    cmd.arg("workload")
        .arg("--shm-dir")
        .arg(&d.shm)
        .arg("--data-dir")
        .arg(&d.data)
        .arg("--workers")
        .arg("2")
        .args(extra)
        .env_clear()
        .envs(env.iter().copied());
    cmd
}

/// The segment file the workload created, once it exists.
fn segment(dir: &Path, service: &str, app: &mut ChildGuard) -> PathBuf {
    poll(Duration::from_secs(20), || {
        if let Some(s) = app.try_wait() {
            anyhow::bail!("the workload exited with {s}");
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(None);
        };
        Ok(entries.flatten().map(|e| e.path()).find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{service}.")) && n.ends_with(".pfs"))
        }))
    })
    .unwrap_or_else(|e| {
        panic!(
            "no {service} segment in {}: {e:#}\n{}",
            dir.display(),
            app.describe()
        )
    })
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Waits for `child` to exit within `within`; its status.
fn exits(child: &mut ChildGuard, within: Duration, what: &str) -> std::process::ExitStatus {
    child.wait_timeout(within).unwrap_or_else(|| {
        panic!(
            "{what}: still running after {within:?}\n{}",
            child.describe()
        )
    })
}

#[test]
fn workload_honours_pfs_env_and_stops_on_sigterm_and_sigint() {
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let d = pod_dirs();
        // No --service: PFS_SERVICE_NAME names it, as the manifest's env says.
        let cmd = workload_cmd(
            &[],
            &d,
            &[],
            &[("PFS_GROUP_ACCESS", "1"), ("PFS_SERVICE_NAME", "from-env")],
        );
        let mut app = ChildGuard::spawn("workload", cmd, false).unwrap();
        let seg = segment(&d.shm, "from-env", &mut app);
        assert_eq!(mode(&d.shm), 0o770, "PFS_GROUP_ACCESS=1: directory mode");
        assert_eq!(mode(&seg), 0o660, "PFS_GROUP_ACCESS=1: segment mode");
        std::thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        app.signal(signal);
        let status = exits(&mut app, PROMPT, name);
        assert!(
            status.success(),
            "{name}: the workload should stop cleanly (exit 0), got {status}\n{}",
            app.describe()
        );
        eprintln!(
            "deploy_signals: workload stopped {:?} after {name}",
            sent.elapsed()
        );
    }
}

#[test]
fn workload_flag_wins_over_pfs_service_name() {
    let d = pod_dirs();
    let cmd = workload_cmd(
        &[],
        &d,
        &["--service", "from-flag"],
        &[("PFS_SERVICE_NAME", "from-env")],
    );
    let mut app = ChildGuard::spawn("workload", cmd, false).unwrap();
    let seg = segment(&d.shm, "from-flag", &mut app);
    // Without PFS_GROUP_ACCESS the client keeps its files private.
    assert_eq!(mode(&seg), 0o600);
    app.signal(libc::SIGTERM);
    assert!(
        exits(&mut app, PROMPT, "SIGTERM").success(),
        "{}",
        app.describe()
    );
}

/// The app must never stop because its instrumentation cannot start: with
/// a `PFS_*` variable pfs-client refuses, the workload logs why (naming the
/// variable) and runs on, uninstrumented, until it is stopped. Its own
/// flags are checked before anything starts, and a data directory it
/// cannot use stops it before it makes a segment.
#[test]
fn workload_runs_uninstrumented_when_pfs_client_cannot_start() {
    let d = pod_dirs();
    let cmd = workload_cmd(&[], &d, &[], &[("PFS_MAX_THREADS", "abc")]);
    let mut app = ChildGuard::spawn("workload", cmd, false).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(app.try_wait().is_none(), "stopped:\n{}", app.describe());
    let log = app.stderr();
    assert!(
        log.contains("PFS_MAX_THREADS") && log.contains("runs uninstrumented"),
        "{log}"
    );
    assert!(
        std::fs::read_dir(&d.shm).map_or(true, |mut e| e.next().is_none()),
        "no segment"
    );
    app.signal(libc::SIGTERM);
    assert!(
        exits(&mut app, PROMPT, "SIGTERM").success(),
        "{}",
        app.describe()
    );

    for (extra, says) in [
        (&["--workers", "0"][..], "from 1 to 256"),
        (&["--workers", "100000"][..], "from 1 to 256"),
        (&["--service", ""][..], "--service"),
    ] {
        let out = Command::new(agent_bin())
            .args(["workload", "--shm-dir"])
            .arg(&d.shm)
            .arg("--data-dir")
            .arg(&d.data)
            .args(extra)
            .env_clear()
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    let file = d.data.join("a-file");
    std::fs::write(&file, b"").unwrap();
    let out = Command::new(agent_bin())
        .args(["workload", "--shm-dir"])
        .arg(&d.shm)
        .arg("--data-dir")
        .arg(&file)
        .env_clear()
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("choose a writable --data-dir"), "{err}");
    assert!(
        std::fs::read_dir(&d.shm).map_or(true, |mut e| e.next().is_none()),
        "no segment left behind"
    );
}

/// The host pid of `unshare`'s forked child (the namespace's init), and
/// its pid inside the namespace.
fn namespace_init(unshare: &mut ChildGuard) -> (i32, String) {
    let parent = unshare.pid();
    poll(Duration::from_secs(10), || {
        if let Some(s) = unshare.try_wait() {
            anyhow::bail!("unshare exited with {s}");
        }
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))?;
        let Some(pid) = children.split_whitespace().next() else {
            return Ok(None);
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .map(|s| s.split_whitespace().last().unwrap_or("").to_string())
            .unwrap_or_default();
        Ok(Some((pid.parse()?, nspid)))
    })
    .unwrap_or_else(|e| panic!("cannot find unshare's child: {e:#}\n{}", unshare.describe()))
}

fn kill(pid: i32, signal: i32) {
    let pid = rustix::process::Pid::from_raw(pid).unwrap();
    let _ = rustix::process::kill_process(
        pid,
        rustix::process::Signal::from_named_raw(signal).unwrap(),
    );
}

#[test]
fn workload_as_pid_1_of_a_pid_namespace_stops_on_sigterm() {
    if !can_unshare("deploy_signals") {
        return;
    }
    let unshare = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"];

    // The premise: a PID namespace's init without a handler ignores SIGTERM.
    let mut cmd = Command::new(unshare[0]);
    cmd.args(&unshare[1..]).args(["sleep", "30"]);
    let mut control = ChildGuard::spawn("unshare-sleep", cmd, false).unwrap();
    let (pid, nspid) = namespace_init(&mut control);
    assert_eq!(nspid, "1", "sleep is not the namespace's init");
    kill(pid, libc::SIGTERM);
    assert!(
        control.wait_timeout(Duration::from_secs(1)).is_none(),
        "sleep as PID 1 died of SIGTERM: this kernel does not protect a namespace's init, \
         so this test proves nothing here"
    );
    drop(control); // SIGKILL to unshare; --kill-child takes sleep along

    let d = pod_dirs();
    let cmd = workload_cmd(
        &unshare,
        &d,
        &["--service", "kvstore-demo"],
        &[
            ("PFS_GROUP_ACCESS", "1"),
            ("PFS_SERVICE_NAME", "kvstore-demo"),
        ],
    );
    let mut app = ChildGuard::spawn("unshare-workload", cmd, false).unwrap();
    let (pid, nspid) = namespace_init(&mut app);
    assert_eq!(nspid, "1", "the workload is not the namespace's init");
    segment(&d.shm, "kvstore-demo", &mut app);
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    kill(pid, libc::SIGTERM);
    let status = exits(&mut app, PROMPT, "the workload as PID 1, after SIGTERM");
    // unshare exits with its child's status.
    assert!(status.success(), "exit {status}\n{}", app.describe());
    eprintln!(
        "deploy_signals: workload as PID 1 stopped {:?} after SIGTERM",
        sent.elapsed()
    );
}

/// `pfs-agent serve` on a free port over `shm`, with `args`; healthy.
fn serve(shm: &Path, args: &[&str], env: &[(&str, &str)]) -> (ChildGuard, String) {
    let port = free_port();
    let mut cmd = Command::new(agent_bin());
    cmd.arg("serve")
        .arg("--shm-dir")
        .arg(shm)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .envs(env.iter().copied());
    let mut agent = ChildGuard::spawn("pfs-agent", cmd, false).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_healthz(&base, &mut agent, Duration::from_secs(20)).unwrap();
    (agent, base)
}

fn segments(base: &str, state: &str) -> anyhow::Result<f64> {
    let samples = parse_metrics(&http_get(&format!("{base}/metrics"))?.body)?;
    pfs_tests::sample(&samples, "pfs_agent_segments", &[("state", state)])
}

#[test]
fn serve_keeps_serving_for_the_shutdown_delay_then_exits() {
    let delay = Duration::from_secs(4);
    let d = pod_dirs();
    let (mut agent, base) = serve(&d.shm, &["--shutdown-delay", "4s"], &[]);
    let mut app = ChildGuard::spawn(
        "workload",
        workload_cmd(&[], &d, &[], &[("PFS_GROUP_ACCESS", "1")]),
        false,
    )
    .unwrap();
    poll(Duration::from_secs(30), || {
        Ok((segments(&base, "live")? == 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("the agent never saw the app: {e:#}\n{}", agent.describe()));

    // Native-sidecar order: the app stops, then the agent gets SIGTERM.
    app.signal(libc::SIGTERM);
    assert!(
        exits(&mut app, PROMPT, "app").success(),
        "{}",
        app.describe()
    );
    let sent = Instant::now();
    agent.signal(libc::SIGTERM);
    // During the delay: fresh snapshots show the app's final counters
    // (its segment, now dead), and /healthz stays ok.
    poll(delay - Duration::from_millis(500), || {
        Ok((segments(&base, "dead")? == 1.0).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "/metrics during --shutdown-delay did not show the app's dead segment: {e:#}\n{}",
            agent.describe()
        )
    });
    let health = http_get(&format!("{base}/healthz")).unwrap();
    assert_eq!((health.status, health.body.trim()), (200, "ok"));
    assert!(
        sent.elapsed() < delay,
        "the checks took longer than the delay"
    );
    assert!(
        agent.try_wait().is_none(),
        "the agent exited during its --shutdown-delay\n{}",
        agent.describe()
    );
    let status = exits(
        &mut agent,
        delay + PROMPT,
        "the agent after its --shutdown-delay",
    );
    let took = sent.elapsed();
    assert!(status.success(), "exit {status}\n{}", agent.describe());
    assert!(
        took >= delay - Duration::from_millis(100),
        "the agent stopped after {took:?}, before its {delay:?} delay"
    );
    assert!(
        http_get(&format!("{base}/healthz")).is_err(),
        "something still answers on {base} after the agent exited"
    );
    eprintln!("deploy_signals: agent stopped {took:?} after SIGTERM (delay {delay:?})");
}

#[test]
fn serve_stops_at_once_on_a_second_signal() {
    let d = pod_dirs();
    std::fs::create_dir(&d.shm).unwrap();
    // From the environment, as PFS_SHUTDOWN_DELAY.
    let (mut agent, base) = serve(&d.shm, &[], &[("PFS_SHUTDOWN_DELAY", "60s")]);
    agent.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    let r = http_get(&format!("{base}/metrics")).unwrap();
    assert_eq!(r.status, 200, "/metrics during the delay: {}", r.body);
    assert!(
        agent.try_wait().is_none(),
        "exited at the first signal\n{}",
        agent.describe()
    );
    let sent = Instant::now();
    agent.signal(libc::SIGINT);
    let status = exits(&mut agent, PROMPT, "the agent after a second signal");
    assert!(status.success(), "exit {status}\n{}", agent.describe());
    assert!(
        sent.elapsed() < Duration::from_secs(8),
        "the second signal took {:?}",
        sent.elapsed()
    );

    // Without a delay, the first signal stops it.
    let (mut agent, _) = serve(&d.shm, &[], &[]);
    agent.signal(libc::SIGTERM);
    assert!(exits(&mut agent, PROMPT, "the agent without a delay").success());
}

/// A workload whose log pipe was closed (its reader gone: `... | head -1`)
/// still stops on SIGTERM: a log line that cannot be written is dropped,
/// not a panic in the thread that logged (the signal handler's).
#[test]
fn workload_stops_on_sigterm_with_its_log_pipe_closed() {
    let d = pod_dirs();
    let mut cmd = workload_cmd(&[], &d, &[], &[]);
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop((child.stdout.take(), child.stderr.take()));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "exited early");
    kill(child.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + PROMPT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running {PROMPT:?} after SIGTERM with its log pipe closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // It stopped cleanly, or died of the closed pipe on its last line:
    // either way, it stopped.
    eprintln!("deploy_signals: with its log pipe closed, the workload ended with {status}");
}

/// `PFS_SHM_DIR` set but empty, and no `--shm-dir`: the workload has no
/// default directory, so it stops at once (exit 2, as for any bad
/// argument) saying that the variable is empty and what to set, rather
/// than clap's "a value is required for '--shm-dir'" (a flag nobody
/// typed).
#[test]
fn workload_refuses_an_empty_pfs_shm_dir_naming_it() {
    let d = pod_dirs();
    let out = Command::new(agent_bin())
        .args(["workload", "--workers", "1", "--data-dir"])
        .arg(&d.data)
        .env_clear()
        .env("PFS_SHM_DIR", "")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("PFS_SHM_DIR is set but empty")
            && err.contains("set it to the segment directory")
            && err.contains("--shm-dir DIR"),
        "{err}"
    );
    assert!(!err.contains("a value is required"), "{err}");
    assert!(!d.shm.exists(), "nothing created");
}

/// The workload reads `PFS_SHM_DIR` as any pfs-client application does
/// when `--shm-dir` is not given.
#[test]
fn workload_reads_pfs_shm_dir_without_the_flag() {
    let d = pod_dirs();
    let mut cmd = Command::new(agent_bin());
    cmd.args(["workload", "--workers", "1", "--data-dir"])
        .arg(&d.data)
        .env_clear()
        .env("PFS_SHM_DIR", &d.shm);
    let mut app = ChildGuard::spawn("workload", cmd, false).unwrap();
    segment(&d.shm, "kvstore-demo", &mut app);
    app.signal(libc::SIGTERM);
    assert!(
        exits(&mut app, PROMPT, "SIGTERM").success(),
        "{}",
        app.describe()
    );
}
