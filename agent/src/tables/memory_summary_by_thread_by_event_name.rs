//! `memory_summary_by_thread_by_event_name`: each live thread's memory by
//! instrument (rows the thread touched; CURRENT can be negative when
//! memory changes hands). `TRUNCATE` rebases the counts of every thread
//! (and so of the account, user and host tables) and resets LOW and HIGH;
//! the global table keeps its counts and watermarks.

use pfs_shm_layout::reader::MemoryStats;

use super::cell::Sink;
use super::columns::{MEMORY_COLUMNS, class_map, head, memory_values, with_head};
use super::view::{NotTruncatable, PfsTable, Unreached, View};
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;

/// The `memory_summary_by_thread_by_event_name` table.
#[derive(Debug)]
pub struct MemoryByThread;

impl PfsTable for MemoryByThread {
    fn name(&self) -> &str {
        "memory_summary_by_thread_by_event_name"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        let mut cols = with_head(&["thread_id"]);
        cols.extend(MEMORY_COLUMNS);
        sink.columns(&cols);
        for (path, s) in &view.segments {
            let classes = class_map(&s.classes);
            for t in view.threads_of(path, s) {
                let mut by_name: Vec<(&str, MemoryStats)> = t
                    .memory
                    .iter()
                    .filter_map(|(c, m)| {
                        let ci = classes.get(c)?;
                        let m = view
                            .baselines_for(path, s)
                            .memory_thread_view(path, t.record, t.version, *c, m);
                        Some((ci.name.as_str(), m))
                    })
                    .collect();
                by_name.sort_by_key(|(n, _)| *n);
                for (n, m) in by_name {
                    let mut row = head(s);
                    row.push(t.thread_id.into());
                    row.extend(memory_values(n, &m));
                    sink.row(&row);
                }
            }
        }
    }

    fn truncate(
        &self,
        baselines: &mut Baselines,
        snap: &Snapshot,
    ) -> Result<Unreached, NotTruncatable> {
        baselines.truncate_memory(snap, false);
        Ok(Unreached::new())
    }
}
