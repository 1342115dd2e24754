//! `events_{waits,stages,statements}_summary_by_thread_by_event_name`:
//! each live thread's figures by instrument (rows the thread touched; the
//! events of a task count under the thread that polled it, as they were
//! written into its record).
//! `TRUNCATE` restarts them from zero (MIN and MAX to bucket precision).

use super::cell::Sink;
use super::columns::{class_map, head, summary_columns, summary_values, with_head};
use super::view::{KindTable, View};
use pfs_shm_layout::EventKind;
use pfs_shm_layout::reader::Summary;

/// The by-thread summary table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(
        kind,
        "summary_by_thread_by_event_name",
        emit,
        |baselines, snap, kind| baselines.truncate_summaries(snap, kind, false),
    )
    .live_only()
}

fn emit(view: &View<'_>, sink: &mut dyn Sink, kind: EventKind) {
    let mut cols = with_head(&["thread_id", "event_name"]);
    cols.extend(summary_columns(kind, false));
    sink.columns(&cols);
    // Sorted by reference (a `Summary` is ~350 bytes).
    let mut by_name: Vec<(&str, u32, &Summary)> = Vec::new();
    for (path, s) in &view.segments {
        let classes = class_map(&s.classes);
        for t in view.threads_of(path, s) {
            by_name.clear();
            by_name.extend(t.rows.iter().filter_map(|(c, sum)| {
                let ci = classes.get(c).filter(|ci| kind.matches(ci.kind))?;
                Some((ci.name.as_str(), *c, sum))
            }));
            by_name.sort_by_key(|(n, _, _)| *n);
            for &(n, c, sum) in &by_name {
                let sum = view
                    .baselines_for(path, s)
                    .thread_view(path, t.record, t.version, c, sum);
                let mut row = head(s);
                row.extend([t.thread_id.into(), n.into()]);
                row.extend(summary_values(&sum, kind, false));
                sink.row(&row);
            }
        }
    }
}
