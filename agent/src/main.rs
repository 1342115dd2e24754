//! `pfs-agent` binary entry point.

use clap::Parser;
use pfs_agent::cli::{Cli, Command};

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // One-shot commands only warn; long-running ones also log progress.
    let default_level = match cli.command {
        Command::Query(_) | Command::Setup(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PFS_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Serve(a) => pfs_agent::run::serve(a),
        Command::Query(a) => pfs_agent::run::query(a),
        Command::Demo(a) => pfs_agent::run::demo(a),
        Command::Setup(c) => pfs_agent::run::setup(c),
        Command::Workload(a) => {
            // The workload belongs to its `demo` parent: if the parent dies
            // (even by SIGKILL), the kernel stops the workload too.
            let parent = rustix::process::getppid();
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
            if rustix::process::getppid() != parent {
                anyhow::bail!("the demo process exited before its workload started");
            }
            pfs_agent::demo::workload::run(pfs_agent::demo::workload::WorkloadOptions {
                shm_dir: a.shm_dir,
                service: a.service,
                data_dir: a.data_dir,
                workers: a.workers,
            })
        }
    }
}
