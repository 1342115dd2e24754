//! Layer 9 (binary): the commands, one file each, and what the
//! long-running ones share (the async runtime, listening, background
//! discovery, stopping on a signal). This is the binary's edge: errors
//! become `anyhow` here, with the context a user needs.

#[cfg(feature = "demo")]
pub mod demo;
pub mod query;
pub mod serve;
pub mod setup;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use pfs_agent::export::model::AgentStats;
use pfs_agent::export::otlp::{self, OtlpArgs, OtlpExporter};
use pfs_agent::segments::SegmentSet;
use pfs_agent::server::{AppOptions, AppState, Tokens};
use pfs_agent::setup::Defaults;
use pfs_agent::snapshot::{DEFAULT_MAX_AGE, Snapshotter};
use tokio::net::TcpListener;

use crate::cli::{DefaultsArgs, read_token};

/// The runtime of `serve` and `demo`: two workers (the agent is I/O
/// bound), and a few blocking threads for snapshots and table streams.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot listen on {addr}; is another process using it? choose another with --listen"
        )
    })
}

/// What a running agent is made of: the snapshot source over `set`, the
/// HTTP server's state, and the OTLP exporter if one is configured (which
/// needs the runtime). Discovery runs in the background from now on.
fn agent(
    set: SegmentSet,
    tokens: Tokens,
    baselines_dir: Option<std::path::PathBuf>,
    otlp_args: &OtlpArgs,
) -> anyhow::Result<(Arc<AppState>, Option<OtlpExporter>)> {
    let snap = Arc::new(Snapshotter::new(set, DEFAULT_MAX_AGE));
    let stats = Arc::new(AgentStats::default());
    let state = AppState::with_options(
        snap.clone(),
        AppOptions {
            tokens,
            baselines_dir,
            stats: Some(stats.clone()),
        },
    );
    let otlp = otlp::start(otlp_args, snap.clone(), stats)?;
    spawn_discovery(snap);
    Ok((state, otlp))
}

/// Background discovery so dead processes are noticed without scrapes.
fn spawn_discovery(snap: Arc<Snapshotter>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let s = snap.clone();
            let _ = tokio::task::spawn_blocking(move || s.refresh()).await;
        }
    });
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

/// The control token (if a file is given) and the setup defaults, checked
/// before anything starts.
fn control_options(
    token_file: Option<&Path>,
    defaults: &DefaultsArgs,
) -> anyhow::Result<(Option<String>, Defaults)> {
    let token = token_file.map(read_token).transpose()?;
    let defaults = Defaults::parse(&defaults.instruments, &defaults.consumers)
        .context("invalid --instrument/--consumer")?;
    Ok((token, defaults))
}

/// Fails with a hint if the segment directory does not exist or is not a
/// directory.
fn require_dir(dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        dir_exists(dir)?,
        "segment directory {} does not exist; pass --shm-dir (or PFS_SHM_DIR)",
        dir.display()
    );
    Ok(())
}

/// Whether the segment directory exists; an error (with a hint) if the
/// path exists but is not a directory, or cannot be examined. A link to a
/// directory is a directory.
fn dir_exists(dir: &Path) -> anyhow::Result<bool> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(true),
        Ok(_) => anyhow::bail!(
            "segment directory {} is not a directory; pass the directory the instrumented processes write their segments to with --shm-dir (or PFS_SHM_DIR)",
            dir.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot examine segment directory {}; check the path and its permissions, or pass another with --shm-dir (or PFS_SHM_DIR)",
                dir.display()
            )
        }),
    }
}
