//! `events_{waits,stages,statements}_histogram_by_event_name`: each
//! process's latency histogram by instrument (timed events, exited
//! threads included), one row per bucket of every instrument that timed
//! an event: MySQL's `events_statements_histogram_by_digest`, by event
//! name. They are the buckets of the global summaries, so `TRUNCATE` of
//! either restarts both.

use pfs_shm_layout::EventKind;

use super::cell::Sink;
use super::columns::{head, histogram_columns, histogram_rows, with_head};
use super::view::{KindTable, View};
use crate::aggregate::segment_global;

/// The by-instrument histogram table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(
        kind,
        "histogram_by_event_name",
        emit,
        |baselines, snap, kind| baselines.truncate_summaries(snap, kind, true),
    )
}

fn emit(view: &View<'_>, sink: &mut dyn Sink, kind: EventKind) {
    let mut cols = with_head(&["event_name"]);
    cols.extend(histogram_columns());
    sink.columns(&cols);
    for (path, s) in &view.segments {
        for (n, (class_kind, sum)) in segment_global(s) {
            if !kind.matches(class_kind) {
                continue;
            }
            let sum = view.baselines_for(path, s).global_view(path, &n, &sum);
            if sum.buckets.iter().all(|&b| b == 0) {
                continue;
            }
            for cells in histogram_rows(&sum) {
                let mut row = head(s);
                row.push(n.as_str().into());
                row.extend(cells);
                sink.row(&row);
            }
        }
    }
}
