//! `events_{waits,stages,statements}_summary_global_by_event_name`: each
//! process's figures by instrument, exited threads included (every
//! registered instrument has a row). `TRUNCATE` restarts them, and the
//! by-thread table of the same kind, from zero.

use pfs_shm_layout::EventKind;

use super::cell::Sink;
use super::columns::{head, summary_columns, summary_values, with_head};
use super::view::{KindTable, View};
use crate::aggregate::segment_global;

/// The global summary table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(
        kind,
        "summary_global_by_event_name",
        emit,
        |baselines, snap, kind| baselines.truncate_summaries(snap, kind, true),
    )
}

fn emit(view: &View<'_>, sink: &mut dyn Sink, kind: EventKind) {
    let mut cols = with_head(&["event_name"]);
    cols.extend(summary_columns(kind, true));
    sink.columns(&cols);
    for (path, s) in &view.segments {
        for (n, (class_kind, sum)) in segment_global(s) {
            if kind.matches(class_kind) {
                let sum = view.baselines_for(path, s).global_view(path, &n, &sum);
                let mut row = head(s);
                row.push(n.into());
                row.extend(summary_values(&sum, kind, true));
                sink.row(&row);
            }
        }
    }
}
