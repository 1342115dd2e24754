//! The `serve`, `query` and `demo` commands.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;

use crate::api::{self, AppState};
use crate::cli::{DemoArgs, Format, QueryArgs, ServeArgs, SetupCommand, TargetArgs, read_token};
use crate::discover::SegmentSet;
use crate::setup::{ActorChange, Change, ConsumerChange, Defaults, InstrumentChange, TimerChange};
use crate::snapshot::Snapshotter;
use crate::tables::{self, Filter};
use crate::truncate::Baselines;

/// Snapshots younger than this are shared between requests.
pub const SNAPSHOT_MAX_AGE: Duration = Duration::from_millis(250);

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
    defaults: &crate::cli::DefaultsArgs,
) -> anyhow::Result<(Option<String>, Defaults)> {
    let token = token_file.map(read_token).transpose()?;
    let defaults = Defaults::parse(defaults)
        .map_err(|e| anyhow::anyhow!("invalid --instrument/--consumer: {e}"))?;
    Ok((token, defaults))
}

/// `pfs-agent serve`.
pub fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let (token, defaults) = control_options(a.control_token_file.as_deref(), &a.defaults)?;
    let read_token = a.read_token_file.as_deref().map(read_token).transpose()?;
    if !a.dir.shm_dir.is_dir() {
        tracing::warn!(dir = %a.dir.shm_dir.display(), "segment directory does not exist yet; waiting for instrumented processes to create it");
    }
    let mut set = SegmentSet::new(&a.dir.shm_dir, a.dead_retention)
        .with_policy(a.policy.policy())
        .persist();
    set.defaults = defaults;
    let snap = Arc::new(Snapshotter::new(set, SNAPSHOT_MAX_AGE));
    let reads_open = read_token.is_none();
    let state = AppState::with_options(
        snap.clone(),
        api::AppOptions {
            control_token: token,
            read_token,
            baselines_dir: Some(a.dir.shm_dir.clone()),
        },
    );
    let limits = a.limits.limits();
    runtime()?.block_on(async move {
        let listener = bind(a.listen).await?;
        tracing::info!(listen = %a.listen, dir = %a.dir.shm_dir.display(), max_connections = limits.max_connections, "pfs-agent serving /metrics, /healthz, /api/v1/tables");
        if reads_open && !a.listen.ip().is_loopback() {
            tracing::info!("reads are open to anyone who can reach {}; use --read-token-file or a loopback --listen to restrict them", a.listen);
        }
        let scrape = state.clone();
        let otlp = crate::export::otlp::start(&a.otlp, snap.clone(), move || scrape.last_scrape_seconds())?;
        spawn_discovery(snap);
        api::serve_with(listener, state, limits, shutdown_signal()).await;
        if let Some(o) = otlp {
            o.shutdown(Duration::from_secs(5)).await;
        }
        tracing::info!("pfs-agent stopped");
        Ok(())
    })
}

/// `pfs-agent query TABLE`.
pub fn query(a: QueryArgs) -> anyhow::Result<()> {
    if !a.dir.shm_dir.is_dir() {
        bail!(
            "segment directory {} does not exist; pass --shm-dir (or PFS_SHM_DIR)",
            a.dir.shm_dir.display()
        );
    }
    let snap = Snapshotter::new(
        SegmentSet::new(&a.dir.shm_dir, Duration::MAX).with_policy(a.policy.policy()),
        Duration::ZERO,
    )
    .take();
    let filter = Filter {
        service: a.service,
        pid: a.pid,
    };
    let Some(table) = tables::build(&a.table, &snap, &filter, &Baselines::default()) else {
        bail!(
            "no table {:?}; tables: {}",
            a.table,
            tables::names().join(", ")
        );
    };
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&table.to_json())?),
        Format::Text => print!("{}", table.to_text()),
    }
    Ok(())
}

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
            if e.path().extension().is_some_and(|x| x == "pfs") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// `pfs-agent demo`: the agent plus a real instrumented workload process.
pub fn demo(a: DemoArgs) -> anyhow::Result<()> {
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
    for d in [&dirs.shm, &dirs.data] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let rt = runtime()?;
    rt.block_on(async {
        let listener = bind(a.listen).await?;
        let exe = std::env::current_exe().context("cannot find the pfs-agent executable to start the workload")?;
        let mut child = tokio::process::Command::new(exe)
            .arg("workload")
            .arg("--shm-dir")
            .arg(&dirs.shm)
            .arg("--data-dir")
            .arg(&dirs.data)
            .arg("--workers")
            .arg(a.workers.to_string())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the demo workload process")?;
        let mut set = SegmentSet::new(&dirs.shm, Duration::from_secs(300));
        set.defaults = defaults;
        let snap = Arc::new(Snapshotter::new(set, SNAPSHOT_MAX_AGE));
        let state = AppState::new(snap.clone(), token);
        let scrape = state.clone();
        let otlp = crate::export::otlp::start(&a.otlp, snap.clone(), move || scrape.last_scrape_seconds())?;
        spawn_discovery(snap);
        let url = format!("http://{}", a.listen);
        println!("pfs-agent demo: workload pid {} writing segments in {}", child.id().unwrap_or(0), dirs.shm.display());
        println!("  metrics:  {url}/metrics");
        println!("  tables:   {url}/api/v1/tables/events_waits_summary_global_by_event_name");
        println!("  query:    pfs-agent query events_waits_summary_global_by_event_name --shm-dir {}", dirs.shm.display());
        println!("Ctrl-C stops the demo.");
        let server = api::serve(listener, state, shutdown_signal());
        let outcome = tokio::select! {
            _ = server => Ok(()),
            status = child.wait() => Err(anyhow::anyhow!("the demo workload exited unexpectedly: {status:?}")),
        };
        stop_child(&mut child).await;
        if let Some(o) = otlp {
            o.shutdown(Duration::from_secs(5)).await;
        }
        outcome
    })?;
    // Stop background discovery before the directory disappears under it.
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(dirs);
    println!("pfs-agent demo stopped; segments removed");
    Ok(())
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

/// `pfs-agent setup ...`: changes setup directly in the segment files.
pub fn setup(cmd: SetupCommand) -> anyhow::Result<()> {
    let (change, target): (Change, TargetArgs) = match cmd {
        SetupCommand::Instruments {
            pattern,
            enabled,
            timed,
            target,
        } => (
            Change::Instruments(InstrumentChange {
                name: pattern,
                enabled: enabled.map(|v| v.get()),
                timed: timed.map(|v| v.get()),
            }),
            target,
        ),
        SetupCommand::Consumers {
            pattern,
            enabled,
            target,
        } => (
            Change::Consumers(ConsumerChange {
                name: pattern,
                enabled: enabled.get(),
            }),
            target,
        ),
        SetupCommand::Timers {
            name,
            timer_name,
            target,
        } => (Change::Timers(TimerChange { name, timer_name }), target),
        SetupCommand::Actors {
            host,
            user,
            role,
            enabled,
            history,
            delete,
            target,
        } => (
            Change::Actors(ActorChange {
                host,
                user,
                role,
                enabled: enabled.map(|v| v.get()),
                history: history.map(|v| v.get()),
                delete,
            }),
            target,
        ),
    };
    crate::setup::validate(&change).map_err(|e| anyhow::anyhow!(e))?;
    if !target.dir.shm_dir.is_dir() {
        bail!(
            "segment directory {} does not exist; pass --shm-dir (or PFS_SHM_DIR)",
            target.dir.shm_dir.display()
        );
    }
    let paths: Vec<PathBuf> = std::fs::read_dir(&target.dir.shm_dir)
        .with_context(|| format!("cannot list {}", target.dir.shm_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pfs"))
        .filter(|p| std::fs::File::open(p).is_ok_and(|f| !crate::discover::owner_is_dead(&f)))
        .collect();
    let filter = Filter {
        service: target.service,
        pid: target.pid,
    };
    let out = crate::setup::apply(&paths, &filter, &change);
    for e in &out.errors {
        eprintln!("warning: {e}");
    }
    println!(
        "matched {} row(s) in {} segment(s)",
        out.matched, out.segments
    );
    if out.segments == 0 && !out.errors.is_empty() {
        bail!("no segment could be changed");
    }
    Ok(())
}
