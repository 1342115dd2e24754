//! `events_{waits,stages,statements}_histogram_global`: each process's
//! latency histogram of every event of the kind (timed events, exited
//! threads included), one row per bucket, as MySQL's
//! `events_statements_histogram_global`. It is the sum of the buckets of
//! the global summaries, so `TRUNCATE` of either restarts both.

use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::BucketScale;
use pfs_shm_layout::reader::Summary;

use super::cell::Sink;
use super::columns::{head, histogram_columns, histogram_rows, with_head};
use super::view::{KindTable, View};
use crate::aggregate::segment_global;

/// The global histogram table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(kind, "histogram_global", emit, |baselines, snap, kind| {
        baselines.truncate_summaries(snap, kind, true)
    })
}

fn emit(view: &View<'_>, sink: &mut dyn Sink, kind: EventKind) {
    let mut cols = with_head(&[]);
    cols.extend(histogram_columns());
    sink.columns(&cols);
    for (path, s) in &view.segments {
        let mut all = Summary::zero(BucketScale::of(kind));
        for (n, (class_kind, sum)) in segment_global(s) {
            if kind.matches(class_kind) {
                all.merge(&view.baselines_for(path, s).global_view(path, &n, &sum));
            }
        }
        for cells in histogram_rows(&all) {
            let mut row = head(s);
            row.extend(cells);
            sink.row(&row);
        }
    }
}
