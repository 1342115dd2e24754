//! `pfs-agent`: the command line over the `pfs_agent` library. The
//! binary's own modules are the top layers of the agent: [`cli`] (layer
//! 8, the flags) and [`commands`] (layer 9, one file per command); see the
//! layer table in the library's documentation.

use clap::Parser;

mod cli;
mod commands;

use cli::{Cli, Command};

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
        Command::Serve(a) => commands::serve::run(a),
        Command::Query(a) => commands::query::run(a),
        Command::Setup(c) => commands::setup::run(c),
        #[cfg(feature = "demo")]
        Command::Demo(a) => commands::demo::run(a),
        #[cfg(feature = "demo")]
        Command::Workload(a) => commands::demo::workload(a),
    }
}
