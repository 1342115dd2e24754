//! `events_{waits,stages,statements}_history_long`: the last events of one
//! kind over all threads of a process (the global ring, off by default).
//! `TRUNCATE` hides the events it holds at that time.

use pfs_shm_layout::EventKind;

use super::cell::Sink;
use super::columns::{class_map, event_columns, event_row};
use super::view::{KindTable, View};
use crate::truncate::Baselines;

/// The `events_*_history_long` table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(kind, "history_long", emit, Baselines::truncate_long)
}

fn emit(view: &View<'_>, sink: &mut dyn Sink, kind: EventKind) {
    sink.columns(&event_columns(kind));
    for (path, s) in &view.segments {
        let classes = class_map(&s.classes);
        let keep = |event_id, thread_id| {
            view.baselines_for(path, s)
                .keep_long(path, kind, event_id, thread_id)
        };
        match kind {
            EventKind::Statement => {
                for e in s
                    .long_statements
                    .iter()
                    .filter(|e| keep(e.ev.event_id, e.ev.thread_id))
                {
                    sink.row(&event_row(s, &classes, &e.ev, Some(e), kind, None));
                }
            }
            EventKind::Wait | EventKind::Stage => {
                for e in s.long[kind.index()]
                    .iter()
                    .filter(|e| keep(e.event_id, e.thread_id))
                {
                    sink.row(&event_row(s, &classes, e, None, kind, None));
                }
            }
        }
    }
}
