//! Layer 0. The per-thread context the hot path works on: the thread's
//! record in the segment and its event state (the `EVENT_ID` counter, the
//! open stage and statement that new events nest in, the setup_actors
//! verdict). Plain data, used only by the thread it belongs to; how a
//! thread gets one (and gives it back) is the job of the `thread` module.

use std::cell::Cell;

use pfs_shm_layout::layout::EventType;
use pfs_shm_layout::writer::{EventData, KIND_WAIT};
use pfs_shm_layout::{RecordRef, ThreadSlot};

/// What the hot path needs of the current thread.
pub(crate) struct ThreadCtx {
    pub(crate) rec: RecordRef<'static>,
    /// The record's slot in the thread container (given back at exit).
    pub(crate) slot: ThreadSlot,
    /// `THREAD_ID`.
    pub(crate) thread_id: u64,
    /// Last `EVENT_ID` used (per thread, shared by all event kinds).
    pub(crate) event_id: Cell<u64>,
    /// `INSTRUMENTED` (setup_actors verdict; yes until an actor is declared).
    pub(crate) instrumented: Cell<bool>,
    /// `HISTORY`.
    pub(crate) history: Cell<bool>,
    /// The open stage, if any (a new stage ends it).
    pub(crate) stage: Cell<Option<EventData>>,
    /// `EVENT_ID` of the open stage (0 = none): what a wait nests in,
    /// without copying `stage`.
    pub(crate) stage_id: Cell<u64>,
    /// Event id of the innermost open statement (0 = none).
    pub(crate) statement_id: Cell<u64>,
}

impl ThreadCtx {
    /// The context of a newly registered thread: no event yet, nothing
    /// open, instrumented with history until an actor says otherwise.
    pub(crate) fn new(rec: RecordRef<'static>, slot: ThreadSlot, thread_id: u64) -> Self {
        Self {
            rec,
            slot,
            thread_id,
            event_id: Cell::new(0),
            instrumented: Cell::new(true),
            history: Cell::new(true),
            stage: Cell::new(None),
            stage_id: Cell::new(0),
            statement_id: Cell::new(0),
        }
    }

    /// Takes the next `EVENT_ID`.
    #[inline(always)]
    pub(crate) fn next_event_id(&self) -> u64 {
        let id = self.event_id.get() + 1;
        self.event_id.set(id);
        id
    }

    /// `NESTING_EVENT_ID` and `NESTING_EVENT_TYPE` for a new event of
    /// `kind`: waits nest in the open stage, else the open statement;
    /// stages and statements nest in the open statement.
    #[inline(always)]
    pub(crate) fn nesting_for(&self, kind: usize) -> (u64, u32) {
        if kind == KIND_WAIT {
            let stage = self.stage_id.get();
            if stage != 0 {
                return (stage, EventType::Stage as u32);
            }
        }
        match self.statement_id.get() {
            0 => (0, EventType::None as u32),
            id => (id, EventType::Statement as u32),
        }
    }
}
