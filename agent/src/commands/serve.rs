//! `pfs-agent serve`: the sidecar.

use std::time::Duration;

use pfs_agent::segments::SegmentSet;
use pfs_agent::server::{self, Tokens};

use super::{agent, bind, control_options, dir_exists, runtime, shutdown_signal};
use crate::cli::{ServeArgs, read_token};

/// Serves `/metrics`, `/healthz`, the tables and control until a signal.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let (token, defaults) = control_options(a.control_token_file.as_deref(), &a.defaults)?;
    let read_token = a.read_token_file.as_deref().map(read_token).transpose()?;
    // A directory that does not exist yet is waited for (a sidecar may start
    // first); a path that exists and is not a directory is an error.
    if !dir_exists(&a.dir.shm_dir)? {
        tracing::warn!(dir = %a.dir.shm_dir.display(), "segment directory does not exist yet; waiting for instrumented processes to create it");
    }
    let mut set = SegmentSet::new(&a.dir.shm_dir, a.dead_retention)
        .with_policy(a.policy.policy())
        .persist();
    set.defaults = defaults;
    let reads_open = read_token.is_none();
    let tokens = Tokens {
        control: token,
        read: read_token,
    };
    let limits = a.limits.limits();
    runtime()?.block_on(async move {
        let listener = bind(a.listen).await?;
        tracing::info!(listen = %a.listen, dir = %a.dir.shm_dir.display(), max_connections = limits.max_connections, "pfs-agent serving /metrics, /healthz, /api/v1/tables");
        if reads_open && !a.listen.ip().is_loopback() {
            tracing::info!("reads are open to anyone who can reach {}; use --read-token-file or a loopback --listen to restrict them", a.listen);
        }
        let (state, otlp) = agent(set, tokens, Some(a.dir.shm_dir.clone()), &a.otlp)?;
        server::serve_with(listener, state, limits, shutdown_signal()).await;
        if let Some(o) = otlp {
            o.shutdown(Duration::from_secs(5)).await;
        }
        tracing::info!("pfs-agent stopped");
        Ok(())
    })
}
