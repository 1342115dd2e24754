//! `pfs-agent setup ...`: changes setup directly in the segment files
//! (local admin: allowed by the files' permissions, no token).

use std::path::PathBuf;

use anyhow::{Context, bail};
use pfs_agent::filter::Filter;
use pfs_agent::segments::owner_is_dead;
use pfs_agent::setup::{self, ActorChange, Change, ConsumerChange, InstrumentChange, TimerChange};

use super::require_dir;
use crate::cli::{SetupCommand, TargetArgs};

/// Applies the change to every live segment that matches the target.
pub fn run(cmd: SetupCommand) -> anyhow::Result<()> {
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
    setup::validate(&change)?;
    require_dir(&target.dir.shm_dir)?;
    let paths: Vec<PathBuf> = std::fs::read_dir(&target.dir.shm_dir)
        .with_context(|| format!("cannot list {}", target.dir.shm_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pfs"))
        .filter(|p| std::fs::File::open(p).is_ok_and(|f| !owner_is_dead(&f)))
        .collect();
    let filter = Filter {
        service: target.service,
        pid: target.pid,
    };
    let out = setup::apply(&paths, &filter, &change);
    for e in &out.errors {
        eprintln!("warning: {e}");
    }
    println!(
        "matched {} row(s) in {} segment(s)",
        out.matched, out.segments
    );
    if let Some(w) = out.nothing_matched(&change) {
        eprintln!("warning: {w}");
    }
    if out.segments == 0 && !out.errors.is_empty() {
        bail!("no segment could be changed");
    }
    Ok(())
}
