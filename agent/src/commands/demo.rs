//! `pfs-agent demo`: the agent plus a real instrumented workload process
//! (the `pfs-demo` crate, run as `pfs-agent workload` in a child process),
//! serving on 127.0.0.1:9464; and the hidden `workload` command itself.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use pfs_agent::segments::SegmentSet;
use pfs_agent::server::{self, Tokens};

use super::{agent, bind, control_options, runtime, shutdown_signal};
use crate::cli::{DefaultsArgs, DemoArgs, WorkloadArgs};

struct DemoDirs {
    shm: PathBuf,
    data: PathBuf,
    remove_shm: bool,
}

impl Drop for DemoDirs {
    fn drop(&mut self) {
        if self.remove_shm {
            let _ = std::fs::remove_dir_all(&self.shm);
        } else {
            remove_segments(&self.shm);
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn remove_segments(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if pfs_shm_layout::files::is_segment_file(&e.path()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Runs the agent and the workload until Ctrl-C, then removes the
/// segments and the workload's data.
pub fn run(a: DemoArgs) -> anyhow::Result<()> {
    let (token, defaults) = control_options(a.control_token_file.as_deref(), &a.defaults)?;
    let pid = std::process::id();
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dirs = DemoDirs {
        remove_shm: a.shm_dir.is_none(),
        shm: a
            .shm_dir
            .clone()
            .unwrap_or_else(|| base.join(format!("pfs-demo-{pid}"))),
        data: std::env::temp_dir().join(format!("pfs-demo-{pid}-data")),
    };
    super::dir_exists(&dirs.shm)?;
    for d in [&dirs.shm, &dirs.data] {
        // 0700, as the client makes a segment directory (docs/SECURITY.md).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .with_context(|| format!("cannot create {}", d.display()))?;
    }
    let rt = runtime()?;
    rt.block_on(async {
        let (listener, listen) = bind(a.listen).await?;
        let exe = std::env::current_exe()
            .context("cannot find the pfs-agent executable to start the workload")?;
        let start_workload = || spawn_workload(&exe, &dirs, a.workers, &a.defaults);
        let mut child = Some(start_workload()?);
        // Its pid, kept: a reaped child no longer tells it.
        let mut child_pid = child.as_ref().and_then(|c| c.id()).unwrap_or(0);
        let mut started = Instant::now();
        let mut quick_deaths = 0;
        // When a dead workload is to be replaced.
        let mut restart_at: Option<tokio::time::Instant> = None;
        // Persisted as `serve` does: TRUNCATE baselines and retired totals
        // go to the directory, where `query` reads them too.
        let mut set =
            SegmentSet::new(&dirs.shm, pfs_agent::segments::DEFAULT_DEAD_RETENTION).persist();
        set.defaults = defaults;
        let tokens = Tokens {
            control: token,
            read: None,
        };
        let agent = agent(
            set,
            tokens,
            a.hosts.check(),
            Some(dirs.shm.clone()),
            &a.otlp,
        )?;
        let url = format!("http://{}", connectable(listen));
        super::say(&format!(
            "pfs-agent demo: workload pid {} writing segments in {}",
            child.as_ref().and_then(|c| c.id()).unwrap_or(0),
            dirs.shm.display()
        ));
        super::say(&format!("  browse:   {url}/ (landing page and table browser)"));
        super::say(&format!("  metrics:  {url}/metrics"));
        super::say(&format!("  tables:   {url}/api/v1/tables/events_waits_summary_global_by_event_name"));
        super::say(&format!(
            "  query:    pfs-agent query events_waits_summary_global_by_event_name --shm-dir {}",
            dirs.shm.display()
        ));
        super::say("Ctrl-C stops the demo.");
        let server = server::serve(listener, agent.state, shutdown_signal());
        tokio::pin!(server);
        let outcome = loop {
            tokio::select! {
                _ = &mut server => break Ok(()),
                status = wait_for(&mut child) => {
                    child = None;
                    match workload_ended(status) {
                        Ended::Stopped => break Ok(()),
                        Ended::Failed(e) => break Err(e),
                        Ended::Died(status) => {
                            quick_deaths = if started.elapsed() < QUICK_DEATH {
                                quick_deaths + 1
                            } else {
                                0
                            };
                            if quick_deaths >= QUICK_DEATHS {
                                break Err(anyhow::anyhow!(
                                    "the demo workload died {QUICK_DEATHS} times in a row within {QUICK_DEATH:?} of its start (last: {status}); its errors are above"
                                ));
                            }
                            if has_segment(&dirs.shm, child_pid) {
                                super::say(&format!(
                                    "pfs-agent demo: the workload died ({status}); the agent shows its segment as a dead process's (pfs_agent_segments{{state=\"dead\"}}) for {:?}, then folds its counters into the service's totals. Starting a new workload.",
                                    pfs_agent::segments::DEFAULT_DEAD_RETENTION
                                ));
                            } else {
                                super::say(&format!(
                                    "pfs-agent demo: the workload died ({status}) before it wrote a segment (its errors are above). Starting a new workload."
                                ));
                            }
                            // Later, while the server goes on serving.
                            restart_at = Some(tokio::time::Instant::now() + RESTART_AFTER);
                        }
                    }
                }
                _ = sleep_until(restart_at) => {
                    restart_at = None;
                    match start_workload() {
                        Ok(c) => {
                            child_pid = c.id().unwrap_or(0);
                            super::say(&format!("pfs-agent demo: workload pid {child_pid}"));
                            child = Some(c);
                            started = Instant::now();
                        }
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        if let Some(c) = &mut child {
            stop_child(c).await;
        }
        if let Some(o) = agent.otlp {
            o.shutdown(Duration::from_secs(5)).await;
        }
        // Stop background discovery before the directory disappears under it.
        drop(agent.discovery);
        outcome
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(dirs);
    super::say("pfs-agent demo stopped; segments removed");
    Ok(())
}

/// Where a browser on this host reaches a server listening on `listen`:
/// the loopback address for an unspecified one (`0.0.0.0`, `[::]`), which
/// browsers do not connect to.
fn connectable(listen: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match listen.ip() {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    std::net::SocketAddr::new(ip, listen.port())
}

/// The end of `child`, if there is one; never, if not.
async fn wait_for(
    child: &mut Option<tokio::process::Child>,
) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// `at`, if set; never, if not.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A workload that dies this soon after its start counts as a quick death.
const QUICK_DEATH: Duration = Duration::from_secs(10);
/// After this many quick deaths in a row the demo stops: restarting does
/// not help.
const QUICK_DEATHS: u32 = 3;
/// The pause before a dead workload is replaced.
const RESTART_AFTER: Duration = Duration::from_secs(1);

/// Starts the workload process, in its own process group: Ctrl-C in a
/// terminal signals the agent alone, which then stops the workload with
/// one SIGTERM (the workload takes a second signal as "exit at once").
///
/// The demo's `--instrument` and `--consumer` rules go to the workload as
/// `PFS_INSTRUMENT` and `PFS_CONSUMERS`, after any it inherits (consumer
/// rules apply in order, so the demo's win; among instrument rules the
/// longest matching pattern wins, wherever it comes from), so that they
/// hold from its first event: applied by the agent alone, they would only
/// take effect once it found the new segment.
fn spawn_workload(
    exe: &Path,
    dirs: &DemoDirs,
    workers: usize,
    rules: &DefaultsArgs,
) -> anyhow::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(exe);
    for (var, given) in [
        ("PFS_INSTRUMENT", &rules.instruments),
        ("PFS_CONSUMERS", &rules.consumers),
        ("PFS_ACTORS", &rules.actors),
    ] {
        if given.is_empty() {
            continue;
        }
        let inherited = std::env::var(var).ok().filter(|v| !v.trim().is_empty());
        let value = inherited.into_iter().chain(given.iter().cloned());
        cmd.env(var, value.collect::<Vec<_>>().join(";"));
    }
    cmd.arg("workload")
        .arg("--shm-dir")
        .arg(&dirs.shm)
        .arg("--data-dir")
        .arg(&dirs.data)
        .arg("--workers")
        .arg(workers.to_string())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the demo workload process")
}

/// What the workload's end means for the demo.
#[derive(Debug)]
enum Ended {
    /// It exited cleanly, or a signal that asks a process to stop ended it
    /// (the workload has its own process group, but a `kill` may still
    /// target it directly): the demo stops.
    Stopped,
    /// It exited with an error, which it printed: the demo stops with it
    /// (a new workload would meet the same error).
    Failed(anyhow::Error),
    /// Another signal killed it (`kill -9`, a crash, the OOM killer): the
    /// demo starts a new one, as a process supervisor would, so the agent
    /// shows a process's death and its counters' fold into the service.
    Died(std::process::ExitStatus),
}

fn workload_ended(status: std::io::Result<std::process::ExitStatus>) -> Ended {
    use std::os::unix::process::ExitStatusExt;
    let status = match status.context("cannot wait for the demo workload") {
        Ok(s) => s,
        Err(e) => return Ended::Failed(e),
    };
    let stop = [
        rustix::process::Signal::INT,
        rustix::process::Signal::TERM,
        rustix::process::Signal::HUP,
    ];
    // The workload itself stops cleanly (exit 0) on SIGINT and SIGTERM.
    match status.signal() {
        Some(n) if stop.iter().any(|s| s.as_raw() == n) => {}
        Some(_) => return Ended::Died(status),
        None if status.success() => {}
        None => {
            return Ended::Failed(anyhow::anyhow!(
                "the demo workload exited unexpectedly ({status}); its errors are above"
            ));
        }
    }
    super::say(&format!(
        "pfs-agent demo: the workload was stopped ({status}); stopping"
    ));
    Ended::Stopped
}

async fn stop_child(child: &mut tokio::process::Child) {
    if let Some(id) = child.id()
        && let Some(pid) = rustix::process::Pid::from_raw(id as i32)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The workload process: belongs to its `demo` parent (if the parent dies,
/// even by SIGKILL, the kernel sends it SIGTERM, which stops it cleanly).
/// It reads the `PFS_*` environment as any pfs-client application does;
/// the service is `--service` if given on the command line, else
/// `PFS_SERVICE_NAME` if set, else the flag's default. Run as a
/// container's PID 1 (deploy/kubernetes), it has no parent to follow.
pub fn workload(a: WorkloadArgs) -> anyhow::Result<()> {
    let parent = rustix::process::getppid();
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
    if rustix::process::getppid() != parent {
        anyhow::bail!("the demo process exited before its workload started");
    }
    // Whether --service was on the command line rather than its default,
    // as clap records it.
    let service_flag_given = || {
        use clap::CommandFactory;
        crate::cli::Cli::command()
            .try_get_matches_from(std::env::args_os())
            .ok()
            .and_then(|m| {
                m.subcommand_matches("workload").map(|w| {
                    w.value_source("service") == Some(clap::parser::ValueSource::CommandLine)
                })
            })
            .unwrap_or(true)
    };
    let service = match std::env::var("PFS_SERVICE_NAME") {
        Ok(env) if !env.trim().is_empty() && !service_flag_given() => env,
        _ => a.service,
    };
    pfs_demo::workload::run(pfs_demo::workload::WorkloadOptions {
        shm_dir: a.shm_dir,
        service,
        data_dir: a.data_dir,
        workers: a.workers,
    })?;
    Ok(())
}

/// Whether `dir` holds a non-empty segment file of process `pid` (its
/// plain name or a numbered one: `<service>.<pid>[.<n>].pfs`).
fn has_segment(dir: &std::path::Path, pid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let pid = pid.to_string();
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        // (A service's part of the name has no dot: files::segment_file_name.)
        pfs_shm_layout::files::is_segment_file(std::path::Path::new(&*name))
            && name.split('.').nth(1) == Some(pid.as_str())
            && e.metadata().is_ok_and(|m| m.len() > 0)
    })
}

#[cfg(test)]
mod tests {
    use super::connectable;

    #[test]
    fn an_unspecified_listen_address_is_shown_as_loopback() {
        let shown = |a: &str| connectable(a.parse().unwrap()).to_string();
        assert_eq!(shown("0.0.0.0:9464"), "127.0.0.1:9464");
        assert_eq!(shown("[::]:9464"), "[::1]:9464");
        assert_eq!(shown("127.0.0.1:1"), "127.0.0.1:1");
        assert_eq!(shown("10.1.2.3:80"), "10.1.2.3:80");
    }
}
