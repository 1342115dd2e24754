//! `pfs-agent setup ...`: changes setup directly in the segment files
//! (local admin: allowed by the files' permissions, no token).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use pfs_agent::filter::Filter;
use pfs_agent::segments::{Policy, owner_is_dead};
use pfs_agent::setup::{self, ActorChange, Change, ConsumerChange, InstrumentChange, TimerChange};
use pfs_agent::util::fs::open_regular;

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
    let (paths, skipped) = live_segments(&target.dir.shm_dir)?;
    let filter = Filter {
        service: target.service,
        pid: target.pid,
    };
    let out = setup::apply(&paths, &filter, &change);
    for e in &out.errors {
        eprintln!("warning: {e}");
    }
    super::print_out(&format!(
        "matched {} row(s) in {} segment(s)\n",
        out.matched, out.segments
    ))?;
    if out.full > 0 && out.matched == 0 {
        bail!(
            "{} in {} segment(s): nothing changed",
            pfs_shm_layout::setup::ActorsFull,
            out.full
        );
    }
    if let Some(w) = out.nothing_matched(&change) {
        // Live segments were there and nothing in them changed (the
        // --service/--pid filter left them all out, or the pattern named
        // nothing): most often a typo, which a script must see.
        bail!("{w}");
    }
    if out.segments == 0 && !out.errors.is_empty() {
        bail!("no segment could be changed");
    }
    if out.segments == 0 && out.filtered_out.is_empty() && skipped == 0 {
        let d = target.dir.shm_dir.display();
        eprintln!(
            "warning: no live segment in {d}: nothing changed; is PFS_SHM_DIR of the instrumented processes {d}?"
        );
    }
    Ok(())
}

/// The `.pfs` files of `dir` whose process lives. Each is opened without
/// following a link or blocking (a FIFO named `*.pfs` cannot hang the
/// command); anything but a regular file, and any file the agent's default
/// policy refuses, is skipped with a warning (and counted).
fn live_segments(dir: &Path) -> anyhow::Result<(Vec<PathBuf>, usize)> {
    let mut paths = Vec::new();
    let mut skipped = 0;
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .flatten()
    {
        let p = entry.path();
        if !pfs_shm_layout::files::is_segment_file(&p) {
            continue;
        }
        match open_regular(&p) {
            Ok(Some((f, _))) if !owner_is_dead(&f) => {}
            Ok(_) => continue, // dead, or gone
            Err(e) => {
                eprintln!("warning: skipping {}: {e}", p.display());
                skipped += 1;
                continue;
            }
        }
        // What `serve` refuses to read (world-writable, too large, not a
        // valid segment...) is not written either.
        match Policy::default().check(&p) {
            Ok(()) => paths.push(p),
            Err(r) => {
                eprintln!("warning: skipping {}: {}", p.display(), r.message);
                skipped += 1;
            }
        }
    }
    Ok((paths, skipped))
}
