//! Layer 9 (binary): the commands, one file each, and what the
//! long-running ones share (the async runtime, listening, background
//! discovery, stopping on a signal). This is the binary's edge: errors
//! become `anyhow` here, with the context a user needs.

#[cfg(feature = "demo")]
pub mod demo;
pub mod query;
pub mod serve;
pub mod setup;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use pfs_agent::export::model::AgentStats;
use pfs_agent::export::otlp::{self, OtlpArgs, OtlpExporter};
use pfs_agent::segments::{ListFailure, SegmentSet};
use pfs_agent::server::{AppOptions, AppState, HostCheck, Tokens};
use pfs_agent::setup::Defaults;
use pfs_agent::snapshot::{DEFAULT_MAX_AGE, Snapshotter};
use tokio::net::TcpListener;

use crate::cli::{DefaultsArgs, read_token};

/// Writes `text` to standard output. A reader that went away (`query ...
/// | head`) ends the output quietly, as for any Unix filter: not an error,
/// and no panic (`print!` panics on a closed pipe).
pub fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to standard output"),
    }
}

/// A status line of a long-running command (`demo`) on standard output;
/// a closed or full output never stops the command.
pub fn say(line: &str) {
    let _ = print_out(&format!("{line}\n"));
}

/// How often the background discovery pass runs.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

/// `/healthz` answers 503 once the last discovery pass ended this long
/// ago (ten intervals: a pass takes milliseconds, a full snapshot that
/// holds it up about a second at 1 000 processes × 200 threads).
const DISCOVERY_STALE_AFTER: Duration = Duration::from_secs(10);

/// The runtime of `serve` and `demo`: two workers (the agent is I/O
/// bound), and a few blocking threads for `/metrics` renders, OTLP
/// snapshots and control. No client holds those for long: table streams
/// and discovery have threads of their own.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The IPv4 address to listen on instead of `addr` when binding `addr`
/// failed with `e`: for `[::]` (every IPv6 and, dual-stack, IPv4 interface)
/// on a host without IPv6 (`EAFNOSUPPORT`, `EADDRNOTAVAIL`), `0.0.0.0` on
/// the same port. None otherwise.
fn ipv4_fallback(addr: SocketAddr, e: &std::io::Error) -> Option<SocketAddr> {
    let no_ipv6 = matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
    );
    (no_ipv6 && addr.ip() == IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED))
        .then(|| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port()))
}

/// Listens on `addr`. `[::]` listens dual-stack (IPv4 connections too,
/// whatever the host's `net.ipv6.bindv6only`), and on a host without IPv6
/// falls back to `0.0.0.0` (logged).
fn listen_on(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => {
            let s = tokio::net::TcpSocket::new_v6()?;
            if addr.ip().is_unspecified() {
                rustix::net::sockopt::set_ipv6_v6only(&s, false)?;
            }
            s
        }
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Listens on `addr` (see [`listen_on`]); returns the listener and the
/// address it listens on.
async fn bind(addr: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let hint = |a: SocketAddr, e: &std::io::Error| {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => "another process is using it",
            std::io::ErrorKind::AddrNotAvailable => {
                "this host has no such address: use 0.0.0.0, [::] or one of its own"
            }
            std::io::ErrorKind::PermissionDenied => {
                "a port below 1024 needs privileges (CAP_NET_BIND_SERVICE)"
            }
            _ => "",
        };
        if why.is_empty() {
            format!("cannot listen on {a}; choose another with --listen")
        } else {
            format!("cannot listen on {a} ({why}); choose another with --listen")
        }
    };
    let bound = |l: TcpListener, a: SocketAddr| {
        // The port the system chose, for `:0`.
        let a = l.local_addr().unwrap_or(a);
        (l, a)
    };
    match listen_on(addr) {
        Ok(l) => Ok(bound(l, addr)),
        Err(e) => match ipv4_fallback(addr, &e) {
            Some(v4) => {
                tracing::info!(listen = %addr, error = %e, fallback = %v4, "no IPv6 on this host; listening on IPv4 only");
                let l = listen_on(v4).map_err(|e| {
                    let h = hint(v4, &e);
                    anyhow::Error::new(e).context(h)
                })?;
                Ok(bound(l, v4))
            }
            None => {
                let h = hint(addr, &e);
                Err(anyhow::Error::new(e).context(h))
            }
        },
    }
}

/// A running agent: the HTTP server's state, the OTLP exporter if one is
/// configured, and the background discovery (stopped when this is
/// dropped).
struct Agent {
    state: Arc<AppState>,
    otlp: Option<OtlpExporter>,
    discovery: Discovery,
}

/// What a running agent is made of: the snapshot source over `set`, the
/// HTTP server's state, and the OTLP exporter if one is configured (which
/// needs the runtime). Discovery runs in the background from now on.
fn agent(
    set: SegmentSet,
    tokens: Tokens,
    host_check: HostCheck,
    baselines_dir: Option<std::path::PathBuf>,
    otlp_args: &OtlpArgs,
) -> anyhow::Result<Agent> {
    let baselines_own_files_only = set.own_files_only();
    let snap = Arc::new(Snapshotter::new(set, DEFAULT_MAX_AGE));
    let stats = Arc::new(AgentStats::default());
    let state = AppState::with_options(
        snap.clone(),
        AppOptions {
            tokens,
            host_check,
            baselines_dir,
            baselines_own_files_only,
            stats: Some(stats.clone()),
            discovery_stale_after: Some(DISCOVERY_STALE_AFTER),
        },
    );
    let otlp = otlp::start(otlp_args, snap.clone(), stats)?;
    let discovery = Discovery::start(snap)?;
    Ok(Agent {
        state,
        otlp,
        discovery,
    })
}

/// Background discovery, so that dead processes are noticed without
/// scrapes: a pass every [`DISCOVERY_INTERVAL`] on a thread of its own, so
/// that nothing else the agent does (a slow client, a busy runtime) can
/// delay it. Stops when dropped.
struct Discovery {
    stop: Option<mpsc::Sender<()>>,
    stopped: mpsc::Receiver<()>,
}

impl Discovery {
    fn start(snap: Arc<Snapshotter>) -> anyhow::Result<Self> {
        let (stop, stop_rx) = mpsc::channel::<()>();
        let (stopped_tx, stopped) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("pfs-discovery".into())
            .spawn(move || {
                let _stopped = stopped_tx;
                let mut next = Instant::now();
                loop {
                    let pass =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| snap.refresh()));
                    if pass.is_err() {
                        tracing::error!("a discovery pass panicked; trying again at the next one");
                    }
                    // Passes late by more than an interval are skipped.
                    let now = Instant::now();
                    next = (next + DISCOVERY_INTERVAL).max(now);
                    match stop_rx.recv_timeout(next - now) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })
            .context("cannot start the segment discovery thread")?;
        Ok(Self {
            stop: Some(stop),
            stopped,
        })
    }
}

impl Drop for Discovery {
    /// Stops the discovery, waiting for a pass in progress to end (at most
    /// 2 s: a pass stuck on a hung filesystem must not hold up the exit).
    fn drop(&mut self) {
        drop(self.stop.take());
        let _ = self.stopped.recv_timeout(Duration::from_secs(2));
    }
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
/// before anything starts. A control token file that does not exist
/// leaves control disabled (logged): in Kubernetes it is an optional
/// Secret's key, absent until someone creates the Secret. Control then
/// answers 403, which is safe; any other problem with the file (empty,
/// unreadable) stops the agent.
fn control_options(
    token_file: Option<&Path>,
    defaults: &DefaultsArgs,
) -> anyhow::Result<(Option<String>, Defaults)> {
    let token = match token_file {
        Some(path) if !path_exists(path)? => {
            tracing::info!(
                file = %pfs_agent::util::shown::path(path),
                "the control token file does not exist: control (POST /api/v1/setup, TRUNCATE) is disabled; create it (in Kubernetes: the pfs-agent-control-token Secret, see deploy/README.md) and restart the agent to enable it"
            );
            None
        }
        path => path.map(read_token).transpose()?,
    };
    let defaults = Defaults::parse(&defaults.instruments, &defaults.consumers, &defaults.actors)
        .context("invalid --instrument/--consumer/--actor")?;
    Ok((token, defaults))
}

/// Whether `path` exists (a link to a missing file does not); an error if
/// that cannot be told (e.g. a directory on the way is not searchable).
fn path_exists(path: &Path) -> anyhow::Result<bool> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot examine the token file {}; check the path and its directory's permissions",
                path.display()
            )
        }),
    }
}

/// Fails with a hint if the segment directory does not exist, is not a
/// directory, or cannot be listed (a directory of another user's: an
/// empty answer would look like no process at all).
fn require_dir(dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        dir_exists(dir)?,
        "segment directory {} does not exist; pass --shm-dir (or PFS_SHM_DIR)",
        dir.display()
    );
    if let Err(e) = std::fs::read_dir(dir) {
        let advice = ListFailure::of(&e, false).map_or("check --shm-dir", ListFailure::advice);
        anyhow::bail!(
            "cannot list segment directory {}: {e}; {advice} (or run this command as root)",
            dir.display()
        );
    }
    Ok(())
}

/// Whether the segment directory exists; an error (with a hint) if the
/// path exists but is not a directory, or cannot be examined. A link to a
/// directory is a directory.
fn dir_exists(dir: &Path) -> anyhow::Result<bool> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {
            warn_if_open(dir, &m);
            Ok(true)
        }
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

/// Warns when the segment directory `dir` (its metadata `m`) lets other
/// users in where the agent trusts what it finds: writable by every user
/// (anyone can then plant segments, and the agent's own state and
/// TRUNCATE files, whatever `--require-owner` says of segments), or a
/// symbolic link (the agent writes its files where it points).
fn warn_if_open(dir: &Path, m: &std::fs::Metadata) {
    use std::os::unix::fs::PermissionsExt;
    let dir_shown = pfs_agent::util::shown::path(dir);
    if m.permissions().mode() & 0o002 != 0 {
        tracing::warn!(dir = %dir_shown, "the segment directory is writable by every user: anyone can plant segments and the agent's own state and TRUNCATE files in it (forging exported totals); give it to the application's user or group (mode 0700 or 0770)");
    }
    if std::fs::symlink_metadata(dir).is_ok_and(|l| l.file_type().is_symlink()) {
        tracing::warn!(dir = %dir_shown, "the segment directory is a symbolic link: the agent reads and writes where it points; check who can change it, or pass the real directory with --shm-dir");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os_error(code: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(code)
    }

    #[test]
    fn only_the_ipv6_any_address_falls_back_and_only_without_ipv6() {
        let any6: SocketAddr = "[::]:9464".parse().unwrap();
        let any4: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        for code in [libc::EAFNOSUPPORT, libc::EADDRNOTAVAIL] {
            assert_eq!(ipv4_fallback(any6, &os_error(code)), Some(any4));
        }
        assert_eq!(ipv4_fallback(any6, &os_error(libc::EADDRINUSE)), None);
        assert_eq!(ipv4_fallback(any6, &os_error(libc::EACCES)), None);
        let one6: SocketAddr = "[::1]:9464".parse().unwrap();
        assert_eq!(ipv4_fallback(one6, &os_error(libc::EADDRNOTAVAIL)), None);
        assert_eq!(ipv4_fallback(any4, &os_error(libc::EAFNOSUPPORT)), None);
    }

    /// `[::]` accepts IPv4 connections (dual-stack, whatever the host's
    /// `net.ipv6.bindv6only`), and IPv6 ones where the host has IPv6.
    #[test]
    fn the_ipv6_any_address_listens_dual_stack() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (listener, addr) = bind("[::]:0".parse().unwrap()).await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let accepted = async {
                loop {
                    let _ = listener.accept().await;
                }
            };
            let connect = async {
                let v4 = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
                let v6 = tokio::net::TcpStream::connect(("::1", port)).await;
                (v4, v6)
            };
            let (v4, v6) = tokio::select! {
                r = connect => r,
                _ = accepted => unreachable!(),
            };
            v4.expect("IPv4 loopback reaches [::]");
            if addr.is_ipv6() && std::net::TcpListener::bind("[::1]:0").is_ok() {
                v6.expect("IPv6 loopback reaches [::]");
            }
        });
    }
}
