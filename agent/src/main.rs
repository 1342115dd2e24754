//! `pfs-agent` binary entry point.

use clap::Parser;
use pfs_agent::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PFS_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => pfs_agent::run::serve(a),
        Command::Query(a) => pfs_agent::run::query(a),
        Command::Demo(a) => pfs_agent::run::demo(a),
        Command::Setup(c) => pfs_agent::run::setup(c),
        Command::Workload(a) => {
            pfs_agent::demo::workload::run(pfs_agent::demo::workload::WorkloadOptions {
                shm_dir: a.shm_dir,
                service: a.service,
                data_dir: a.data_dir,
                workers: a.workers,
            })
        }
    }
}
