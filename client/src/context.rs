//! Layer 0. The per-thread context the hot path works on: the thread's
//! record in the segment (with the memory row it accounted to last) and
//! its event state (the logical `THREAD_ID`, the `EVENT_ID` counter, the
//! open stage and statement that new events nest in, the setup_actors
//! verdict, and a task's poll time). Plain data, used
//! only by the thread it belongs to; how a thread gets one (and gives it
//! back) is the job of the `thread` module.
//!
//! The event state can be swapped out as a whole ([`ThreadCtx::swap`]):
//! that is how a task carries its own state from poll to poll and from
//! worker to worker, while its events are written into the record of
//! whichever thread polls it.

use std::cell::{Cell, RefCell};
use std::sync::atomic::AtomicU64;

use pfs_shm_layout::layout::{NONE_U32, STATEMENT_TEXT_BYTES};
use pfs_shm_layout::writer::{EventData, MemoryRowRef};
use pfs_shm_layout::{EventKind, RecordRef, ThreadSlot};

/// The event state of a logical thread: an OS thread's own, or a task's
/// while it is not being polled. The same fields as [`ThreadCtx`]'s cells.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventState {
    /// `THREAD_ID` of the events (0: a task that has not recorded yet).
    pub(crate) thread_id: u64,
    /// Last `EVENT_ID` used.
    pub(crate) event_id: u64,
    /// `INSTRUMENTED`.
    pub(crate) instrumented: bool,
    /// `HISTORY`.
    pub(crate) history: bool,
    /// The open stage.
    pub(crate) stage: Option<EventData>,
    /// `EVENT_ID` of the open stage (0 = none).
    pub(crate) stage_id: u64,
    /// `EVENT_ID` of the innermost open statement (0 = none).
    pub(crate) statement_id: u64,
    /// Raw ticks of the CYCLE timer when the current poll started (0: not
    /// being measured).
    pub(crate) poll_start: u64,
    /// Poll time accumulated by the polls that ended, in ticks of the
    /// CYCLE timer (converted to ps once, when a statement ends).
    pub(crate) busy_ticks: u64,
    /// Set while a task's unfinished future is being dropped: statements
    /// that end meanwhile are cancelled.
    pub(crate) cancelling: bool,
}

impl EventState {
    /// The state of a logical thread that has recorded nothing yet.
    pub(crate) const fn new(thread_id: u64) -> Self {
        Self {
            thread_id,
            event_id: 0,
            instrumented: true,
            history: true,
            stage: None,
            stage_id: 0,
            statement_id: 0,
            poll_start: 0,
            busy_ticks: 0,
            cancelling: false,
        }
    }
}

/// Statement texts a thread keeps aside at most (statements nested this
/// deep, or left open by ends from other threads): the oldest goes first.
pub(crate) const MAX_OUTER_TEXTS: usize = 8;

/// The `SQL_TEXT` of one of a thread's statements, kept aside while a
/// statement nested in it holds the thread's `events_statements_current`
/// row (see `statement`).
pub(crate) struct OuterText {
    /// The statement's `EVENT_ID`.
    pub(crate) event_id: u64,
    /// Bytes of `text` in use.
    pub(crate) len: usize,
    /// The text (UTF-8, cut at a character boundary when it was set).
    pub(crate) text: [u8; STATEMENT_TEXT_BYTES],
}

/// What the hot path needs of the current thread.
pub(crate) struct ThreadCtx {
    pub(crate) rec: RecordRef<'static>,
    /// The segment's `memory_truncate_gen` (the setup word the memory hot
    /// path reads on every operation), reached without the runtime.
    pub(crate) memory_truncate_gen: &'static AtomicU64,
    /// The memory row the thread accounted to last, with its class index
    /// (`NONE_U32` before the first: the row is then a placeholder, never
    /// written): a row once returned by `RecordRef::memory_row` stays
    /// ready while the thread holds its record, so repeated operations on
    /// one class skip the row lookup.
    pub(crate) memory_memo: Cell<(u32, MemoryRowRef<'static>)>,
    /// The record's slot in the thread container (given back at exit).
    pub(crate) slot: ThreadSlot,
    /// The record's `THREAD_ID` (the OS thread's own).
    pub(crate) own_thread_id: u64,
    /// `THREAD_ID` of the events recorded now: the thread's own, or the
    /// task's being polled.
    pub(crate) thread_id: Cell<u64>,
    /// Last `EVENT_ID` used (per logical thread, shared by all event kinds).
    pub(crate) event_id: Cell<u64>,
    /// `INSTRUMENTED` (setup_actors verdict; yes until an actor is declared).
    pub(crate) instrumented: Cell<bool>,
    /// `HISTORY`.
    pub(crate) history: Cell<bool>,
    /// The open stage, if any (a new stage ends it). A `RefCell`, not a
    /// `Cell`: the stage is ended in place (see `event::end_open_stage`);
    /// every borrow is short and never spans a call out of the crate.
    pub(crate) stage: RefCell<Option<EventData>>,
    /// `EVENT_ID` of the open stage (0 = none): what a wait nests in,
    /// without copying `stage`.
    pub(crate) stage_id: Cell<u64>,
    /// Event id of the innermost open statement (0 = none).
    pub(crate) statement_id: Cell<u64>,
    /// See [`EventState::poll_start`].
    pub(crate) poll_start: Cell<u64>,
    /// See [`EventState::busy_ticks`].
    pub(crate) busy_ticks: Cell<u64>,
    /// See [`EventState::cancelling`].
    pub(crate) cancelling: Cell<bool>,
    /// Texts of this OS thread's open statements that a nested statement
    /// replaced in the current row, innermost last (empty unless
    /// statements nest; its buffer is kept once grown).
    pub(crate) outer_texts: RefCell<Vec<OuterText>>,
    /// A statement of this OS thread that ended while a statement nested in
    /// it was still open (ends out of order): its `EVENT_ID` and its
    /// parent's, so that the nested one's end restores the parent, not the
    /// ended statement. `(0, 0)` if none.
    pub(crate) ended_early: Cell<(u64, u64)>,
    /// Task contexts swapped in on this OS thread now (nested: the
    /// innermost is the one entered at level `task_level - 1`); never
    /// swapped with a task's state.
    pub(crate) task_level: Cell<u32>,
    /// Async waits of a task that started queueing, or ended, during the
    /// current poll: shown in, or taken out of, the task's slot when the
    /// poll returns (see `task`). Never swapped.
    pub(crate) queued: RefCell<Queued>,
    /// Whether `queued` holds anything (read at every poll's return).
    pub(crate) queued_any: Cell<bool>,
    /// Per task level (see `task_level`), the open statement of the
    /// context the task entered at that level came in over, as the current
    /// row showed it: the row shows it again when that task leaves (see
    /// `task`). Deeper levels than [`UNDER_LEVELS`] are not kept.
    pub(crate) under: RefCell<[Under; UNDER_LEVELS]>,
    /// Bit *l* set: `under[l]` holds a statement.
    pub(crate) under_kept: Cell<u32>,
}

/// Task levels whose outer statement a thread keeps (see
/// [`ThreadCtx::under`]).
pub(crate) const UNDER_LEVELS: usize = 4;

/// An outer context's open statement row and its text (see
/// [`ThreadCtx::under`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Under {
    /// The row (`None`: the outer context had no statement shown).
    pub(crate) statement: Option<EventData>,
    /// Its `SQL_TEXT`.
    pub(crate) text: [u8; STATEMENT_TEXT_BYTES],
    /// Bytes of `text` in use.
    pub(crate) text_len: usize,
}

impl Under {
    /// Nothing kept.
    pub(crate) const NONE: Under = Under {
        statement: None,
        text: [0; STATEMENT_TEXT_BYTES],
        text_len: 0,
    };
}

/// Ends of async waits kept per poll (see [`Queued`]).
pub(crate) const QUEUED_ENDS: usize = 4;

/// Async waits of one task kept while they queue at once ([`Pending`]),
/// and starts kept per poll ([`Queued`]): a `join!` of two acquisitions.
pub(crate) const QUEUED_WAITS: usize = 2;

/// See [`ThreadCtx::queued`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queued {
    /// The rows of the latest async waits that started queueing, oldest
    /// first (`None`: free), until the poll returns.
    pub(crate) started: [Option<EventData>; QUEUED_WAITS],
    /// `(THREAD_ID, EVENT_ID)` of the async waits that ended, the first
    /// [`QUEUED_ENDS`] of them.
    pub(crate) ended: [(u64, u64); QUEUED_ENDS],
    /// Entries of `ended` in use.
    pub(crate) ends: usize,
    /// More waits ended than `ended` holds.
    pub(crate) overflowed: bool,
}

impl Queued {
    /// Nothing started or ended.
    pub(crate) const NONE: Queued = Queued {
        started: [None; QUEUED_WAITS],
        ended: [(0, 0); QUEUED_ENDS],
        ends: 0,
        overflowed: false,
    };

    /// Notes that the async wait of row `row` started queueing (the
    /// oldest start noted goes if there is no room).
    pub(crate) fn note_start(&mut self, row: EventData) {
        push_newest(&mut self.started, row);
    }

    /// Notes the end of the async wait `ids`.
    pub(crate) fn note_end(&mut self, ids: (u64, u64)) {
        match self.ended.get_mut(self.ends) {
            Some(e) => {
                *e = ids;
                self.ends += 1;
            }
            None => self.overflowed = true,
        }
    }

    /// Whether anything started or ended.
    #[inline(always)]
    pub(crate) fn any(&self) -> bool {
        self.started.iter().any(Option::is_some) || self.ends > 0 || self.overflowed
    }

    /// Takes out what concerns logical thread `thread` into its waits
    /// still queued, `pending`: those that ended leave it (all of them if
    /// more ended than were kept: which is not known), those that started
    /// (and did not end in the same poll) join it.
    pub(crate) fn take_into(&mut self, thread: u64, pending: &mut Pending) {
        let mut kept = 0;
        let mut ended = [0; QUEUED_ENDS];
        let mut mine = 0;
        for i in 0..self.ends {
            let (t, e) = self.ended[i];
            if t == thread {
                ended[mine] = e;
                mine += 1;
            } else {
                self.ended[kept] = (t, e);
                kept += 1;
            }
        }
        self.ends = kept;
        let ended = &ended[..mine];
        if self.overflowed {
            *pending = Pending::NONE;
        } else {
            pending.retain(|w| !ended.contains(&w.event_id));
        }
        for s in &mut self.started {
            if let Some(w) = s.take_if(|w| w.thread_id == thread)
                && !ended.contains(&w.event_id)
            {
                push_newest(&mut pending.rows, w);
            }
        }
        // (The others' starts, oldest first again.)
        self.started.sort_by_key(Option::is_none);
    }
}

/// The async waits of one task still queued, oldest first: the newest is
/// the one its slot shows; when it ends, the one before it is shown
/// again. At most [`QUEUED_WAITS`]: an older one is no longer shown.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    rows: [Option<EventData>; QUEUED_WAITS],
}

impl Pending {
    /// None queued.
    pub(crate) const NONE: Pending = Pending {
        rows: [None; QUEUED_WAITS],
    };

    /// The wait that started last, if any is queued.
    pub(crate) fn newest(&self) -> Option<&EventData> {
        self.rows.iter().rev().find_map(Option::as_ref)
    }

    fn retain(&mut self, keep: impl Fn(&EventData) -> bool) {
        for r in &mut self.rows {
            r.take_if(|w| !keep(w));
        }
        self.rows.sort_by_key(Option::is_none);
    }
}

/// Puts `row` after the rows of `rows` (oldest first, then the free
/// entries), dropping the oldest if there is no room.
fn push_newest(rows: &mut [Option<EventData>; QUEUED_WAITS], row: EventData) {
    if rows[QUEUED_WAITS - 1].is_some() {
        rows.rotate_left(1);
        rows[QUEUED_WAITS - 1] = None;
    }
    if let Some(free) = rows.iter_mut().find(|r| r.is_none()) {
        *free = Some(row);
    }
}

impl ThreadCtx {
    /// The context of a newly registered thread: no event yet, nothing
    /// open, instrumented with history until an actor says otherwise.
    pub(crate) fn new(
        rec: RecordRef<'static>,
        slot: ThreadSlot,
        thread_id: u64,
        memory_truncate_gen: &'static AtomicU64,
    ) -> Self {
        let s = EventState::new(thread_id);
        // Segments have at least one class (checked at creation), so row
        // 0 exists; it stands in until the first memory operation.
        let placeholder = MemoryRowRef {
            row: &rec.memory_rows()[0],
            seq: &rec.row_seqs[0],
        };
        Self {
            rec,
            memory_truncate_gen,
            memory_memo: Cell::new((NONE_U32, placeholder)),
            slot,
            own_thread_id: thread_id,
            thread_id: Cell::new(s.thread_id),
            event_id: Cell::new(s.event_id),
            instrumented: Cell::new(s.instrumented),
            history: Cell::new(s.history),
            stage: RefCell::new(s.stage),
            stage_id: Cell::new(s.stage_id),
            statement_id: Cell::new(s.statement_id),
            poll_start: Cell::new(s.poll_start),
            busy_ticks: Cell::new(s.busy_ticks),
            cancelling: Cell::new(s.cancelling),
            outer_texts: RefCell::new(Vec::new()),
            ended_early: Cell::new((0, 0)),
            task_level: Cell::new(0),
            queued: RefCell::new(Queued::NONE),
            queued_any: Cell::new(false),
            under: RefCell::new([Under::NONE; UNDER_LEVELS]),
            under_kept: Cell::new(0),
        }
    }

    /// Exchanges the current event state with `s`: the one place that
    /// lists the swapped fields.
    #[inline(always)]
    pub(crate) fn swap(&self, s: &mut EventState) {
        s.thread_id = self.thread_id.replace(s.thread_id);
        s.event_id = self.event_id.replace(s.event_id);
        s.instrumented = self.instrumented.replace(s.instrumented);
        s.history = self.history.replace(s.history);
        // The open stage is the one large field (a whole event): copied
        // only if one side has a stage open (`stage` is `None` whenever
        // `stage_id` is 0).
        if (s.stage_id != 0 || self.stage_id.get() != 0)
            && let Ok(mut open) = self.stage.try_borrow_mut()
        {
            s.stage = std::mem::replace(&mut *open, s.stage);
        }
        s.stage_id = self.stage_id.replace(s.stage_id);
        s.statement_id = self.statement_id.replace(s.statement_id);
        s.poll_start = self.poll_start.replace(s.poll_start);
        s.busy_ticks = self.busy_ticks.replace(s.busy_ticks);
        s.cancelling = self.cancelling.replace(s.cancelling);
    }

    /// Whether the open stage, if any, nests in event `id` (read in place:
    /// no copy of the stage).
    #[inline]
    pub(crate) fn open_stage_nests_in(&self, id: u64) -> bool {
        self.stage
            .try_borrow()
            .is_ok_and(|open| open.as_ref().is_some_and(|s| s.nesting_event_id == id))
    }

    /// True while a task's state is swapped in.
    #[inline(always)]
    pub(crate) fn in_task(&self) -> bool {
        self.thread_id.get() != self.own_thread_id
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
    pub(crate) fn nesting_for(&self, kind: EventKind) -> (u64, u32) {
        // Each arm's type is a constant (the wire word of `EventKind::wire`):
        // the choice compiles to a select between constants.
        if kind == EventKind::Wait {
            let stage = self.stage_id.get();
            if stage != 0 {
                return (stage, EventKind::wire(Some(EventKind::Stage)));
            }
        }
        match self.statement_id.get() {
            0 => (0, EventKind::wire(None)),
            id => (id, EventKind::wire(Some(EventKind::Statement))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(thread_id: u64, event_id: u64) -> EventData {
        EventData {
            thread_id,
            event_id,
            ..Default::default()
        }
    }

    /// The waits of `thread` still queued after taking `q` into
    /// `pending`, by `EVENT_ID`, oldest first.
    fn take(q: &mut Queued, thread: u64, pending: &mut Pending) -> Vec<u64> {
        q.take_into(thread, pending);
        pending.rows.iter().flatten().map(|w| w.event_id).collect()
    }

    #[test]
    fn a_wait_that_started_and_ended_in_one_poll_is_not_shown() {
        let mut q = Queued::NONE;
        let mut p = Pending::NONE;
        q.note_start(wait(7, 5));
        q.note_end((7, 5));
        assert_eq!(take(&mut q, 7, &mut p), Vec::<u64>::new());
        assert!(!q.any());
    }

    #[test]
    fn the_shown_wait_ending_is_seen_whatever_ended_after_it() {
        let mut q = Queued::NONE;
        let mut p = Pending::NONE;
        q.note_start(wait(7, 3));
        assert_eq!(take(&mut q, 7, &mut p), [3]);
        q.note_end((7, 3)); // the one the slot shows
        q.note_start(wait(7, 6));
        q.note_end((7, 6)); // started and ended in the same poll
        assert_eq!(take(&mut q, 7, &mut p), Vec::<u64>::new());
        assert!(p.newest().is_none());
    }

    #[test]
    fn waits_queued_at_once_are_shown_newest_first_until_each_ends() {
        // join!(a.lock(), b.lock()): both queue in one poll.
        let mut q = Queued::NONE;
        let mut p = Pending::NONE;
        q.note_start(wait(7, 3));
        q.note_start(wait(7, 4));
        assert_eq!(take(&mut q, 7, &mut p), [3, 4]);
        assert_eq!(p.newest().map(|w| w.event_id), Some(4));
        // The newest acquires: the other one is shown again.
        q.note_end((7, 4));
        assert_eq!(take(&mut q, 7, &mut p), [3]);
        assert_eq!(p.newest().map(|w| w.event_id), Some(3));
        // A third one queues: the newest two are kept.
        q.note_start(wait(7, 9));
        q.note_start(wait(7, 10));
        assert_eq!(take(&mut q, 7, &mut p), [9, 10]);
        q.note_end((7, 10));
        q.note_end((7, 9));
        assert_eq!(take(&mut q, 7, &mut p), Vec::<u64>::new());
    }

    #[test]
    fn another_logical_threads_entries_stay_for_it() {
        let mut q = Queued::NONE;
        let (mut p7, mut p8) = (Pending::NONE, Pending::NONE);
        q.note_start(wait(8, 1));
        assert_eq!(take(&mut q, 8, &mut p8), [1]);
        q.note_start(wait(8, 2));
        q.note_end((8, 1));
        q.note_start(wait(7, 4));
        q.note_end((7, 4));
        assert_eq!(take(&mut q, 7, &mut p7), Vec::<u64>::new());
        assert!(q.any(), "thread 8's are kept");
        assert_eq!(take(&mut q, 8, &mut p8), [2]);
        assert!(!q.any());
    }

    #[test]
    fn more_ends_than_kept_take_every_queued_wait_out() {
        let mut q = Queued::NONE;
        let mut p = Pending::NONE;
        q.note_start(wait(7, 3));
        assert_eq!(take(&mut q, 7, &mut p), [3]);
        for e in 10..10 + QUEUED_ENDS as u64 + 1 {
            q.note_end((7, e));
        }
        assert_eq!(take(&mut q, 7, &mut p), Vec::<u64>::new());
    }
}
