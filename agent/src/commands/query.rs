//! `pfs-agent query TABLE`: one table read directly from the segments.

use std::time::Duration;

use anyhow::bail;
use pfs_agent::filter::Filter;
use pfs_agent::segments::SegmentSet;
use pfs_agent::snapshot::Snapshotter;
use pfs_agent::tables;
use pfs_agent::truncate::Baselines;

use super::require_dir;
use crate::cli::{Format, QueryArgs};

/// Prints the table as text or JSON.
pub fn run(a: QueryArgs) -> anyhow::Result<()> {
    require_dir(&a.dir.shm_dir)?;
    let Some(table) = tables::lookup(&a.table) else {
        bail!(
            "no table {:?}; tables: {}",
            a.table,
            tables::names().join(", ")
        );
    };
    let snap = Snapshotter::new(
        SegmentSet::new(&a.dir.shm_dir, Duration::MAX).with_policy(a.policy.policy()),
        Duration::ZERO,
    )
    .take();
    let filter = Filter {
        service: a.service,
        pid: a.pid,
    };
    let table = tables::build(table, &snap, &filter, &Baselines::default());
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&table.to_json())?),
        Format::Text => print!("{}", table.to_text()),
    }
    Ok(())
}
