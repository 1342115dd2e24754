//! `pfs-agent serve`: the sidecar. Serves until SIGTERM or SIGINT; with
//! `--shutdown-delay` it keeps serving that long after the signal (a
//! second signal stops it at once), so that a sidecar stopped right after
//! its application still answers the next scrape with the application's
//! final counters. `/healthz` keeps answering `ok` during the delay: a
//! terminating pod is already out of its Services' ready endpoints, and
//! Prometheus scrapes the pod's IP directly, so failing the probes would
//! only add restarts and events (deploy/README.md).

use std::time::Duration;

use pfs_agent::segments::SegmentSet;
use pfs_agent::server::{self, Tokens};
use pfs_agent::util::text::HumanDuration;

use super::{agent, bind, control_options, dir_exists, runtime, shutdown_signal};
use crate::cli::{ServeArgs, read_token};

/// Serves `/metrics`, `/healthz`, the tables and control until a signal
/// (and `--shutdown-delay` after it).
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let (token, defaults) = control_options(a.control_token_file.as_deref(), &a.defaults)?;
    let read_token = a.read_token_file.as_deref().map(read_token).transpose()?;
    // A directory that does not exist yet is waited for (a sidecar may start
    // first); a path that exists and is not a directory is an error.
    if !dir_exists(&a.dir.shm_dir)? {
        tracing::info!(dir = %pfs_agent::util::shown::path(&a.dir.shm_dir), "segment directory does not exist yet; waiting for instrumented processes to create it");
    }
    let reads_open = read_token.is_none();
    let tokens = Tokens {
        control: token,
        read: read_token,
    };
    let limits = a.limits.limits();
    let delay = a.shutdown_delay;
    runtime()?.block_on(async move {
        let (listener, listen) = bind(a.listen).await?;
        // Listening first: an agent that cannot (the port taken by
        // another) leaves nothing in the segment directory, where the
        // state files of the one serving it live.
        let mut set = SegmentSet::new(&a.dir.shm_dir, a.dead_retention)
            .with_forget_retired_after(a.forget_retired_after.0)
            .with_policy(a.policy.policy())
            .persist();
        set.defaults = defaults;
        let host_check = a.hosts.check();
        let described = host_check.describe();
        // Every setting checked (OTLP's too) before saying it serves.
        let agent = agent(set, tokens, host_check, Some(a.dir.shm_dir.clone()), &a.otlp)?;
        tracing::info!(listen = %listen, dir = %pfs_agent::util::shown::path(&a.dir.shm_dir), max_connections = limits.max_connections, shutdown_delay = %HumanDuration(delay), "pfs-agent serving /metrics, /healthz, /api/v1/tables");
        if reads_open && !listen.ip().is_loopback() {
            tracing::info!("reads are open to anyone who can reach {listen}; use --read-token-file or a loopback --listen to restrict them");
        }
        tracing::info!(accepted = %described, scope = ?a.hosts.host_check, "requests must name the agent in Host as one of these (scope: which connections are checked)");
        server::serve_with(listener, agent.state, limits, stop_requested(delay)).await;
        if let Some(o) = agent.otlp {
            o.shutdown(Duration::from_secs(5)).await;
        }
        drop(agent.discovery);
        tracing::info!("pfs-agent stopped");
        Ok(())
    })
}

/// Completes when the server should stop: at the first SIGTERM or SIGINT
/// if `delay` is zero, else `delay` after it or at the next signal,
/// whichever comes first.
async fn stop_requested(delay: Duration) {
    use tokio::signal::unix::{SignalKind, signal};
    shutdown_signal().await;
    if delay.is_zero() {
        tracing::info!("stop signal received; stopping");
        return;
    }
    tracing::info!(
        shutdown_delay = %HumanDuration(delay),
        "stop signal received; still serving /metrics for --shutdown-delay so the next scrape sees the final counters; send SIGTERM or SIGINT again to stop now"
    );
    // Listened for only now, so the first signal does not count twice.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for a second signal; stopping after the delay");
        tokio::time::sleep(delay).await;
        return;
    };
    tokio::select! {
        _ = tokio::time::sleep(delay) => tracing::info!("--shutdown-delay is over; stopping"),
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "second stop signal; stopping now"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "second stop signal; stopping now"),
    }
}
