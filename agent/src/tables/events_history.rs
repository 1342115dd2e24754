//! `events_{waits,stages,statements}_history`: each thread's last events
//! of one kind (its history ring), each under its own `THREAD_ID`: a ring
//! also holds the events of tasks the thread polled, ordered by
//! (`THREAD_ID`, `EVENT_ID`). `TRUNCATE` hides the events that exist at
//! that time, in this table only, per logical thread.

use pfs_shm_layout::EventKind;

use super::columns::emit_thread_events;
use super::view::KindTable;
use crate::truncate::EventsTable;

/// The `events_*_history` table of `kind`.
pub fn table(kind: EventKind) -> KindTable {
    KindTable::new(
        kind,
        "history",
        |view, sink, kind| emit_thread_events(view, sink, kind, EventsTable::History),
        |b, snap, kind| b.truncate_events(snap, kind, EventsTable::History),
    )
    .live_only()
}
