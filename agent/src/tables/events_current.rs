//! `events_{waits,stages,statements}_current`: each thread's current
//! event of one kind, under the event's own `THREAD_ID` (a task's, when the
//! thread last ran one of a task's events). `TRUNCATE` hides the events
//! that exist at that time, in this table only.

use pfs_shm_layout::EventKind;

use super::columns::emit_thread_events;
use super::view::KindTable;
use crate::truncate::EventsTable;

/// The `events_*_current` table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(
        kind,
        "current",
        |view, sink, kind| emit_thread_events(view, sink, kind, EventsTable::Current),
        |b, snap, kind| b.truncate_events(snap, kind, EventsTable::Current),
    )
    .live_only()
}
