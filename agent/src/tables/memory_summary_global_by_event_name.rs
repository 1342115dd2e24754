//! `memory_summary_global_by_event_name`: each process's memory by
//! instrument: every memory instrument (zero until used), exited threads'
//! memory included, plus the instrumentation's own
//! (`memory/performance_schema/*`). LOW is clamped at 0 (the one memory
//! table where the manual forbids a negative LOW). `TRUNCATE` rebases the
//! counts as the manual says (here and in every memory table) and resets
//! LOW and HIGH to CURRENT.

use super::cell::Sink;
use super::columns::{MEMORY_COLUMNS, head, memory_values, with_head};
use super::view::{NotTruncatable, PfsTable, Unreached, View};
use crate::aggregate::segment_global_memory;
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;

/// The `memory_summary_global_by_event_name` table.
#[derive(Debug)]
pub struct MemoryGlobal;

impl PfsTable for MemoryGlobal {
    fn name(&self) -> &str {
        "memory_summary_global_by_event_name"
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&MEMORY_COLUMNS));
        for (path, s) in &view.segments {
            for (n, m) in segment_global_memory(s) {
                let mut row = head(s);
                row.extend(memory_values(
                    &n,
                    &view.baselines_for(path, s).memory_global_view(path, &n, &m),
                ));
                sink.row(&row);
            }
        }
    }

    fn truncate(
        &self,
        baselines: &mut Baselines,
        snap: &Snapshot,
    ) -> Result<Unreached, NotTruncatable> {
        baselines.truncate_memory(snap, true);
        Ok(Unreached::new())
    }
}
