//! Command-line interface.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// pfs-agent: exports pfs-exporter segments as Prometheus metrics and
/// Performance-Schema tables.
#[derive(Debug, Parser)]
#[command(name = "pfs-agent", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve /metrics, /healthz and /api/v1/tables for every segment in a directory.
    Serve(ServeArgs),
    /// Print one PFS table read directly from the segments.
    Query(QueryArgs),
    /// Run the agent with a real instrumented workload process (one-command demo).
    Demo(DemoArgs),
    /// The demo's workload process (started by `demo`).
    #[command(hide = true)]
    Workload(WorkloadArgs),
}

/// Where segments are.
#[derive(Debug, Args, Clone)]
pub struct DirArgs {
    /// Directory of segment files (the instrumented processes' PFS_SHM_DIR).
    #[arg(long, env = "PFS_SHM_DIR", default_value = "/dev/shm/pfs")]
    pub shm_dir: PathBuf,
}

/// `serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    /// Segment directory.
    pub dir: DirArgs,
    /// Address to listen on. The default listens on every interface, as a
    /// sidecar must for Prometheus to reach it; use 127.0.0.1:9464 to keep
    /// it local.
    #[arg(long, env = "PFS_LISTEN", default_value = "0.0.0.0:9464")]
    pub listen: SocketAddr,
    /// How long a dead process's final counters keep being exported before
    /// they fold into the service totals and its file is removed (e.g. 300s, 5m).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub dead_retention: Duration,
    /// File holding the bearer token that control requests must present.
    #[arg(long)]
    pub control_token_file: Option<PathBuf>,
}

/// Output format of `query`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// Aligned text table.
    Text,
    /// The API's JSON object.
    Json,
}

/// `query` options.
#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Table name (e.g. events_waits_summary_global_by_event_name).
    pub table: String,
    #[command(flatten)]
    /// Segment directory.
    pub dir: DirArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Only this service.
    #[arg(long)]
    pub service: Option<String>,
    /// Only this pid.
    #[arg(long)]
    pub pid: Option<u32>,
}

/// `demo` options.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub listen: SocketAddr,
    /// Segment directory (default: a fresh private directory, removed at exit).
    #[arg(long)]
    pub shm_dir: Option<PathBuf>,
    /// File holding the control bearer token.
    #[arg(long)]
    pub control_token_file: Option<PathBuf>,
    /// Worker threads of the workload.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
}

/// Hidden `workload` options.
#[derive(Debug, Args)]
pub struct WorkloadArgs {
    /// Segment directory.
    #[arg(long)]
    pub shm_dir: PathBuf,
    /// Service name.
    #[arg(long, default_value = "kvstore-demo")]
    pub service: String,
    /// Directory of the write-ahead log.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
}

/// Parses `300`, `300s`, `5m`, `1h`, `250ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; use e.g. 300s, 5m, 1h"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("unknown unit {unit:?} in {s:?}; use ms, s, m or h")),
    })
}

/// Reads a control token file: non-empty, first line, trimmed.
pub fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the control token file {}", path.display()))?;
    let token = raw.lines().next().unwrap_or("").trim().to_string();
    anyhow::ensure!(
        !token.is_empty(),
        "control token file {} is empty; put the token on its first line",
        path.display()
    );
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("m").is_err());
    }
}
