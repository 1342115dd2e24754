//! Layer 7. Tasks: an event context that a future carries from poll to
//! poll and from worker thread to worker thread, so that an async task's
//! statements, stages and waits nest in each other, and nothing another
//! task records on the same worker lands in them.
//!
//! # The model
//!
//! A [`TaskContext`] is a *logical thread*: it has its own `THREAD_ID`
//! (taken from the threads' sequence on its first event, so it never
//! equals a thread's), its own `EVENT_ID` sequence from 1, and its own open
//! statement and stage. While it is entered (each poll of a [`Task`]), the
//! polling thread's event state is swapped out and the task's swapped in;
//! when the poll returns, they are swapped back. Events recorded meanwhile
//! are written into the polling thread's record (its current rows, history
//! rings and summaries), each row carrying the task's `THREAD_ID`. So:
//!
//! * `THREAD_ID` of every event of the task is the task's; `EVENT_ID`s
//!   are unique under it; `NESTING_EVENT_ID` always names an event of the
//!   same `THREAD_ID` (the task's open stage, else its open statement).
//!   A reader rebuilds a statement's tree by (`THREAD_ID`, `EVENT_ID`),
//!   whichever records its events were written to.
//! * The `events_*_summary_by_thread_*` tables count a task's events under
//!   the worker thread that polled them (the task has no record); the
//!   global, account, user and host summaries are unaffected.
//! * While the task is polled, the polling worker's `events_*_current`
//!   rows show its open statement (with its text) and stage running. When
//!   a poll returns, the worker's rows that show them running are emptied,
//!   so the rows show what the thread is running or last ran (an event
//!   that ended), and the task's **slot** (segment layout 7.1, see
//!   `pfs_shm_layout::tasks`) shows them instead while the task waits,
//!   with the async wait it queues on ([`crate::WaitClass::start_async`],
//!   the `tokio` drop-ins): only what changed since its last poll is
//!   written there. The next poll shows them again in the worker's rows,
//!   on whichever worker (one store if it is the same worker and nothing
//!   was written there since, else the rows are written whole from a copy
//!   the task keeps); a reader shows each event once, from the worker's
//!   row. The statement's row is written again, whole, with its text,
//!   where it ends. A statement ended outside its task is not shown again.
//!   The slot is taken the first time a poll returns with something open
//!   (none free: the task is shown only while it runs, counted lost once)
//!   and given back, empty, when the context drops.
//!
//! A statement opened in a task is a `TaskStatement`: `Send`, held across
//! `.await`, ended on any thread. Its `CPU_TIME` is the time its task was
//! being polled while it was open (while the consumer
//! `events_statements_cpu` is on, as by default; 0 if it was off at the
//! statement's start); `TIMER_WAIT` stays wall time.
//!
//! A stage the task left open ends when its future completes or is
//! dropped, as a thread's open stage ends when the thread exits.
//!
//! # Cancellation
//!
//! A [`Task`] whose future is dropped before it completed drops it inside
//! the task's context with the *cancelling* mark set: every statement
//! ended by that drop is recorded as cancelled (flag `CANCELLED` in its
//! row, counted in the summaries' cancelled figure, not as an error).
//!
//! A future dropped *inside* a task (the losing branch of a `select!`, a
//! `timeout` that expired) is not the task's future: Rust gives its drop no
//! sign that it was early, so a statement it held ends as completed. Wrap
//! such a future in [`Cancellable`] ([`TaskExt::pfs_cancellable`]): when it
//! is dropped before it completed, it is dropped with the same mark, and
//! the statements that end in that drop are cancelled. [`cancelling`] says
//! whether the mark is set (the tracing layer reads it for the spans that
//! close then).
//!
//! A context swapped in by an adapter ([`TaskContext::swap_in`]: a
//! tracing span entered by its future's drop) inside such a drop takes
//! the mark until it is swapped out: a handler's span inside a cancelled
//! handler's is cancelled too.
//!
//! A statement ended by a panic's unwinding is not cancelled: it counts
//! one error (unless errors were added to it already).
//!
//! # Cost
//!
//! Entering and leaving swap ten thread-local cells each way, and the
//! memory scope, and leaving compares what the task has open with what its
//! slot shows (writing only what changed); a poll
//! reads the CYCLE timer (`RDTSC`) twice while a statement is open and
//! `events_statements_cpu` is on (for `CPU_TIME`), never otherwise, and takes the open statement and stage
//! out of the worker's current rows when it returns and shows them again
//! at the next poll (a sequence-locked store each way on the same worker).
//! No lock, no allocation, no shared write per poll (a thread takes task
//! ids 64 at a time); one load of a shared word written only when a
//! statement ends outside its task (two lock-free stores then, a rare
//! path). Per task that awaits with something open: one compare-and-swap
//! to take its slot and one to give it back (a slot never used before is
//! handed out under a lock, after an `fallocate` of its page). A
//! [`TaskContext`] keeps a copy of its open statement's row and text
//! (about 370 bytes) and the rows of its two latest queued async waits
//! (about 240): 864 bytes in all.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::task::{Context, Poll};

use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::{ConsumerKind, LostKind, STATEMENT_TEXT_BYTES, TimerId};
use pfs_shm_layout::setup::{self, effective};
use pfs_shm_layout::tasks::TaskSlotRef;
use pfs_shm_layout::writer::EventData;

use crate::class::ClassRef;
use crate::context::{EventState, Pending, Queued, ThreadCtx};
use crate::runtime;
use crate::{event, memory, thread, timer};

/// The event state of one async task (a logical thread), kept between
/// polls. `Send`: it moves with the task between worker threads.
///
/// [`Task`] manages one for a future; use a context directly only to build
/// an adapter of your own (a `tracing` layer keeps one per span):
///
/// ```
/// use pfs_client::task::TaskContext;
///
/// let mut task = TaskContext::new();
/// {
///     let _entered = task.enter();
///     // Events recorded here belong to the task.
/// }
/// assert_eq!(task.thread_id(), 0); // not initialised: nothing recorded
/// ```
#[derive(Debug)]
pub struct TaskContext {
    /// The task's state while it is not entered; while it is, the state
    /// the polling thread had before (swapped back on leaving).
    state: EventState,
    /// Nesting depth of [`TaskContext::swap_in`] on the entered thread.
    depth: u32,
    /// `own_thread_id` of the thread it is entered on (0 = none).
    entered_on: u64,
    /// The entered thread's `task_level` below this context (the task
    /// contexts entered there before it and still entered): it is the
    /// innermost while the thread's level is this + 1.
    level: u32,
    /// The task's `THREAD_ID` once taken (0 before its first entry).
    id: u64,
    /// Swapped in (by [`TaskContext::swap_in`]) while the context it was
    /// entered over was being cancelled, and so marked cancelling for this
    /// entry only (a statement span entered by its future's drop, inside a
    /// cancelled task's drop).
    inherited_cancel: bool,
    /// The task's [`memory_scope`](crate::memory_scope) while it is not
    /// entered; while it is, the polling thread's.
    scope: Option<ClassRef>,
    /// What the current rows of the thread that polled the task last
    /// showed of it, written again on the thread that polls it next.
    shown: Shown,
    /// The task slot that shows what the task has open while it awaits.
    parked: Parked,
}

/// What a task context entered over another context with an open
/// statement (the thread's own, or an outer task's) does with the rows:
/// the task's events take the thread's current rows while it runs; when
/// it leaves, the rows show the outer context's open statement (with its
/// text) and stage again, as a nested statement gives the row back to its
/// parent. The outer statement's row is kept by the thread, per task level
/// ([`ThreadCtx::under`]).
mod under {
    use super::*;

    /// Keeps what `ctx`'s statement row shows of `outer`'s open statement
    /// (the state just swapped out of `ctx` by the task entered at task
    /// level `level`), if it has one.
    #[inline(always)]
    pub(super) fn keep(ctx: &ThreadCtx, outer: &EventState, level: u32) {
        if outer.statement_id != 0 || ctx.under_kept.get() & (1 << level.min(31)) != 0 {
            keep_statement(ctx, outer, level);
        }
    }

    #[cold]
    #[inline(never)]
    fn keep_statement(ctx: &ThreadCtx, outer: &EventState, level: u32) {
        let Ok(mut under) = ctx.under.try_borrow_mut() else {
            return;
        };
        let Some(u) = under.get_mut(level as usize) else {
            return; // nested deeper than kept
        };
        let (thread, id) = (outer.thread_id, outer.statement_id);
        u.statement = (id != 0)
            .then(|| ctx.rec.unended_event(EventKind::Statement, thread, id))
            .flatten();
        if u.statement.is_some() {
            u.text_len = ctx
                .rec
                .copy_statement_text(thread, id, &mut u.text)
                .map_or(0, |(len, _)| len);
        }
        let bit = 1 << level;
        let kept = ctx.under_kept.get() & !bit;
        ctx.under_kept.set(if u.statement.is_some() {
            kept | bit
        } else {
            kept
        });
    }

    /// Shows again, in `ctx`'s rows, the open statement and stage of the
    /// context that the task leaving at level `level` was entered over
    /// (its state is `ctx`'s again), where the rows show something else.
    #[inline(always)]
    pub(super) fn give_back(ctx: &ThreadCtx, level: u32) {
        if ctx.under_kept.get() & (1 << level.min(31)) != 0 || ctx.stage_id.get() != 0 {
            give_back_rows(ctx, level);
        }
    }

    #[cold]
    #[inline(never)]
    fn give_back_rows(ctx: &ThreadCtx, level: u32) {
        let Some(rt) = runtime::get() else { return };
        let consumers = rt.setup.consumers.load(Relaxed);
        if let Ok(mut under) = ctx.under.try_borrow_mut()
            && let Some(u) = under.get_mut(level as usize)
            && let Some(e) = u.statement.take()
        {
            ctx.under_kept.set(ctx.under_kept.get() & !(1 << level));
            if ctx.statement_id.get() == e.event_id
                && effective(consumers, EventKind::Statement, ConsumerKind::Current)
                && !ctx.rec.shows(EventKind::Statement, e.thread_id, e.event_id)
            {
                let text = std::str::from_utf8(&u.text[..u.text_len]).unwrap_or("");
                ctx.rec.resume_statement(&e, text);
            }
        }
        if let Ok(open) = ctx.stage.try_borrow()
            && let Some(stage) = *open
            && effective(consumers, EventKind::Stage, ConsumerKind::Current)
            && !ctx
                .rec
                .shows(EventKind::Stage, stage.thread_id, stage.event_id)
        {
            ctx.rec.begin_event(EventKind::Stage, &stage);
        }
    }
}

/// The task slot of a [`TaskContext`] (see `pfs_shm_layout::tasks`):
/// taken the first time a poll returns with something open, written at
/// each poll's return with what changed, and given back, emptied, when the
/// context drops.
#[derive(Debug)]
struct Parked {
    /// The slot held, with its index.
    slot: Option<(u32, TaskSlotRef<'static>)>,
    /// No slot was free when the task needed one (counted lost once per
    /// task; it tries again at its next polls, while it has no slot).
    refused: bool,
    /// `EVENT_ID` of the statement the slot shows (0: none).
    statement: u64,
    /// `EVENT_ID` of the stage the slot shows (0: none).
    stage: u64,
    /// `EVENT_ID` of the queued wait the slot shows (0: none).
    wait: u64,
    /// The task's async waits still queued: the slot shows the newest.
    pending: Pending,
}

impl Parked {
    const NONE: Parked = Parked {
        slot: None,
        refused: false,
        statement: 0,
        stage: 0,
        wait: 0,
        pending: Pending::NONE,
    };

    /// The slot, taken now if the task has none; `None` if none is free.
    fn slot(&mut self, rt: &'static runtime::Runtime) -> Option<TaskSlotRef<'static>> {
        if self.slot.is_none() {
            let seg = rt.writer.segment();
            self.slot = rt
                .task_slots
                .take(seg)
                .and_then(|i| rt.task_slots.slot(seg, i).map(|s| (i, s)));
            if self.slot.is_none() && !std::mem::replace(&mut self.refused, true) {
                seg.count_lost(LostKind::TaskSlots);
            }
        }
        self.slot.map(|(_, s)| s)
    }

    /// Shows `state`'s open statement (`statement`, with `text`; `None`:
    /// none to show) and stage in the slot `slot`, writing only what
    /// changed since the last poll (`text_changed`: the statement's text
    /// did), and the newest of its async waits still queued (`pending`).
    fn show(
        &mut self,
        slot: TaskSlotRef<'static>,
        state: &EventState,
        statement: Option<(&EventData, &str, bool)>,
        stage: Option<&EventData>,
    ) {
        let ours = |e: &EventData| EventData {
            thread_id: state.thread_id,
            ..*e
        };
        match statement {
            Some((e, text, text_changed)) if self.statement != e.event_id || text_changed => {
                slot.show(EventKind::Statement, &ours(e), Some(text));
                self.statement = e.event_id;
            }
            Some(_) => {}
            None if self.statement != 0 => {
                slot.clear(EventKind::Statement);
                self.statement = 0;
            }
            None => {}
        }
        match stage {
            Some(e) if self.stage != e.event_id => {
                slot.show(EventKind::Stage, &ours(e), None);
                self.stage = e.event_id;
            }
            Some(_) => {}
            None if self.stage != 0 => {
                slot.clear(EventKind::Stage);
                self.stage = 0;
            }
            None => {}
        }
        match self.pending.newest() {
            Some(w) if self.wait != w.event_id => {
                slot.show(EventKind::Wait, &ours(w), None);
                self.wait = w.event_id;
            }
            Some(_) => {}
            None if self.wait != 0 => {
                slot.clear(EventKind::Wait);
                self.wait = 0;
            }
            None => {}
        }
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some((index, slot)) = self.slot.take()
            && let Some(rt) = runtime::get()
        {
            slot.clear_all();
            rt.task_slots.give(index);
        }
    }
}

/// A task's running statement and stage as the `events_*_current` rows of
/// the thread that polled it last showed them: a poll that returns takes
/// them out of that thread's rows (the thread goes on with other work),
/// and the next poll writes them into the rows of the thread that makes
/// it. Polled again on the same thread, with nothing written there since,
/// a row is shown again with one store; on another thread, it is written
/// whole from what was kept.
#[derive(Debug)]
struct Shown {
    /// The open statement's row, kept while that statement is open (its
    /// fields do not change while it runs; its text may).
    statement: Option<EventData>,
    /// Its `SQL_TEXT` when it was last taken out.
    text: [u8; STATEMENT_TEXT_BYTES],
    text_len: usize,
    /// Whether the last poll's thread showed the statement, and the stage,
    /// and took them out.
    hid_statement: bool,
    hid_stage: bool,
    /// `own_thread_id` of that thread.
    on: u64,
    /// Whether `text` changed when it was last taken out.
    text_changed: bool,
    /// The [`EndedOutside`] sequence when `statement` was last checked.
    seen_outside: u64,
}

impl Shown {
    const NONE: Shown = Shown {
        statement: None,
        text: [0; STATEMENT_TEXT_BYTES],
        text_len: 0,
        hid_statement: false,
        hid_stage: false,
        on: 0,
        text_changed: false,
        seen_outside: 0,
    };

    /// Keeps what `ctx`'s current rows show of the task's open statement
    /// and stage (of `state`, just swapped out of `ctx`), to be taken out of
    /// them ([`Shown::hide_in`]) and shown again at the next poll. A statement is kept from the first time a row showed
    /// it (none if its current consumer was off then): an inner context
    /// that took the row meanwhile (a statement span in a statement span)
    /// does not stop it being shown again.
    #[inline(always)]
    fn take_from(&mut self, ctx: &ThreadCtx, state: &EventState) {
        if state.statement_id == 0 && state.stage_id == 0 {
            return; // nothing open (`put_into` finds nothing hidden)
        }
        self.on = ctx.own_thread_id;
        let (thread, id) = (state.thread_id, state.statement_id);
        if self.statement.is_some_and(|e| e.event_id == id)
            && EndedOutside::since(&mut self.seen_outside, thread, id)
        {
            // Ended outside the task during this poll: not open any more,
            // shown neither here nor in the task's slot. (The row, if it
            // still shows it, is emptied: read again, it would be taken for
            // the statement still running.)
            ctx.rec.hide_unended(EventKind::Statement, thread, id);
            self.statement = None;
        }
        if id != 0 && self.statement.is_none_or(|e| e.event_id != id) {
            self.statement = ctx.rec.unended_event(EventKind::Statement, thread, id);
            self.text_len = 0;
            self.text_changed = true;
            self.seen_outside = EndedOutside::seq().load(Acquire);
        }
        self.hid_statement = id != 0 && self.statement.is_some_and(|e| e.event_id == id);
        if self.hid_statement
            && let Some((len, changed)) = ctx.rec.copy_statement_text(thread, id, &mut self.text)
        {
            self.text_changed |= changed || len != self.text_len;
            self.text_len = len;
        }
        self.hid_stage = state.stage_id != 0;
    }

    /// Empties `ctx`'s current rows that show the statement and stage
    /// [`Shown::take_from`] kept, once the task's slot shows them (so that
    /// a reader finds them in one or the other).
    #[inline(always)]
    fn hide_in(&self, ctx: &ThreadCtx, state: &EventState) {
        let thread = state.thread_id;
        if self.hid_statement {
            ctx.rec
                .hide_unended(EventKind::Statement, thread, state.statement_id);
        }
        if self.hid_stage {
            ctx.rec
                .hide_unended(EventKind::Stage, thread, state.stage_id);
        }
    }

    /// Writes what [`Shown::take_from`] took into `ctx`'s current rows,
    /// for the task now swapped into `ctx`, if it is still open and the
    /// rows' consumers (`consumers`, the `setup_consumers` word) are on.
    /// A statement ended outside the task (see [`EndedOutside`]) is not
    /// shown again.
    #[inline(always)]
    fn put_into(&mut self, ctx: &ThreadCtx, consumers: u32) {
        if !self.hid_statement && !self.hid_stage {
            return;
        }
        let here = ctx.own_thread_id == self.on;
        let thread = ctx.thread_id.get();
        if std::mem::take(&mut self.hid_statement)
            && let Some(e) = self.statement
            && ctx.statement_id.get() == e.event_id
        {
            if EndedOutside::since(&mut self.seen_outside, thread, e.event_id) {
                self.statement = None; // ended outside the task
            } else if effective(consumers, EventKind::Statement, ConsumerKind::Current)
                && !(here
                    && ctx
                        .rec
                        .unhide(EventKind::Statement, thread, e.event_id, e.timer_start))
            {
                if ctx
                    .rec
                    .shows_ended(EventKind::Statement, thread, e.event_id)
                {
                    self.statement = None; // ended here, outside the task
                } else {
                    let text = std::str::from_utf8(&self.text[..self.text_len]).unwrap_or("");
                    ctx.rec.resume_statement(&e, text);
                }
            }
        }
        if std::mem::take(&mut self.hid_stage)
            && let Some(stage) = ctx.stage.try_borrow().ok().and_then(|open| *open)
            && effective(consumers, EventKind::Stage, ConsumerKind::Current)
            && !(here
                && ctx
                    .rec
                    .unhide(EventKind::Stage, thread, stage.event_id, stage.timer_start))
        {
            ctx.rec.begin_event(EventKind::Stage, &stage);
        }
    }
}

impl Default for TaskContext {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskContext {
    /// A context that has recorded nothing yet; it takes its `THREAD_ID`
    /// on first entry.
    pub const fn new() -> Self {
        Self {
            state: EventState::new(0),
            depth: 0,
            entered_on: 0,
            level: 0,
            id: 0,
            inherited_cancel: false,
            scope: None,
            shown: Shown::NONE,
            parked: Parked::NONE,
        }
    }

    /// The task's `THREAD_ID` (0 before it was first entered, or if the
    /// client is not initialised).
    pub fn thread_id(&self) -> u64 {
        if self.depth > 0 {
            // Swapped in: `state` holds the thread's.
            self.id
        } else {
            self.state.thread_id
        }
    }

    /// Whether this context is current on a thread now (between a
    /// [`TaskContext::swap_in`] that swapped and its
    /// [`TaskContext::swap_out`], or inside [`TaskContext::enter`]).
    #[inline]
    pub fn is_entered(&self) -> bool {
        self.depth > 0
    }

    /// Whether this context is current on the calling thread now.
    pub fn is_entered_here(&self) -> bool {
        self.depth > 0
            && thread::with_registered(|c| c).is_some_and(|c| c.own_thread_id == self.entered_on)
    }

    /// Whether this context is entered on the calling thread and is the
    /// innermost one entered there (no context entered after it is still
    /// entered): the one whose [`TaskContext::swap_out`] can leave.
    ///
    /// ```
    /// use pfs_client::task::TaskContext;
    ///
    /// let (mut a, mut b) = (TaskContext::new(), TaskContext::new());
    /// // Not initialised here: nothing is ever entered.
    /// a.swap_in();
    /// b.swap_in();
    /// assert!(!a.is_innermost_here() && !b.is_innermost_here());
    /// ```
    pub fn is_innermost_here(&self) -> bool {
        self.depth > 0
            && thread::with_registered(|c| c).is_some_and(|c| {
                c.own_thread_id == self.entered_on && c.task_level.get() == self.level + 1
            })
    }

    /// Makes this context the current thread's until the guard drops (a
    /// poll: see [`TaskContext::swap_in`] for the one difference).
    #[inline]
    pub fn enter(&mut self) -> Entered<'_> {
        self.swap_in_as(true, false);
        Entered {
            task: self,
            _not_send: PhantomData,
        }
    }

    /// Makes this context current on this thread, until the matching
    /// [`TaskContext::swap_out`] on the same thread (calls nest: only the
    /// outermost pair swaps). For adapters whose enter and exit are two
    /// callbacks, such as a `tracing` layer's `on_enter` and `on_exit`;
    /// prefer [`TaskContext::enter`]. Entering a context already entered
    /// on another thread does nothing. Returns whether this call swapped.
    ///
    /// Swapped in while the context it is entered over is being cancelled
    /// (a [`Task`] or [`Cancellable`] future dropped early: a span entered
    /// by its future's drop), it is marked cancelling too, until the
    /// matching swap out: what it ends then is given up on as well.
    /// [`TaskContext::enter`], a poll, does not take the mark (a task
    /// polled to completion inside a drop completes).
    #[inline]
    pub fn swap_in(&mut self) -> bool {
        self.swap_in_as(true, true)
    }

    /// [`TaskContext::swap_in`], without counting the time until the
    /// matching [`TaskContext::swap_out`] as the task's poll time (its
    /// statements' `CPU_TIME`), and without reading the timer for it: for
    /// an adapter that enters a task's context only to end its statement or
    /// stage, outside any poll of the task (a `tracing` layer closing a
    /// span).
    ///
    /// ```
    /// use pfs_client::task::TaskContext;
    ///
    /// let mut task = TaskContext::new();
    /// task.swap_in_unmeasured();
    /// // End what the task has open here.
    /// task.swap_out();
    /// ```
    #[inline]
    pub fn swap_in_unmeasured(&mut self) -> bool {
        self.swap_in_as(false, false)
    }

    /// [`TaskContext::swap_in`]; `measure`: whether a statement open in the
    /// task starts measuring poll time; `inherit`: whether it takes the
    /// cancelling mark of the context it is entered over.
    #[inline(always)]
    fn swap_in_as(&mut self, measure: bool, inherit: bool) -> bool {
        let Some(rt) = runtime::get() else {
            return false;
        };
        let Some(ctx) = thread::current(rt) else {
            return false;
        };
        if self.depth > 0 {
            if self.entered_on == ctx.own_thread_id {
                self.depth += 1;
            }
            return false;
        }
        let consumers = rt.setup.consumers.load(Relaxed);
        let outer_cancelling = ctx.cancelling.get();
        // The task's state is read only by the swap, and tested after it
        // in the thread's cells: read before as single words, it made the
        // swap store the thread's cells word by word, and the swap out,
        // which loads them in pairs, waited for those stores.
        ctx.swap(&mut self.state);
        // Entered by an adapter (a span's enter) inside a cancelling drop:
        // what ends here is given up on too.
        self.inherited_cancel = inherit && outer_cancelling && !ctx.cancelling.get();
        if self.inherited_cancel {
            ctx.cancelling.set(true);
        }
        if ctx.thread_id.get() == 0 {
            // The task's first swap in: its THREAD_ID now.
            ctx.thread_id.set(thread::next_task_id());
        }
        self.id = ctx.thread_id.get();
        self.level = ctx.task_level.get();
        ctx.task_level.set(self.level + 1);
        if measure && ctx.statement_id.get() != 0 && setup::statements_cpu(consumers) {
            // A statement is open: measure this poll for its CPU_TIME.
            ctx.poll_start.set(timer::now(&rt.clock, POLL_TIMER));
        }
        memory::swap_scope(&mut self.scope);
        under::keep(ctx, &self.state, self.level);
        self.shown.put_into(ctx, consumers);
        self.depth = 1;
        self.entered_on = ctx.own_thread_id;
        true
    }

    /// Undoes [`TaskContext::swap_in`]; see there. A call on a thread other
    /// than the one it was entered on does nothing, and so does the last
    /// one of a context that is not the innermost entered on its thread
    /// (another context entered after it is still entered: leave that one
    /// first; [`TaskContext::is_innermost_here`]), which would give the
    /// thread the other's state. Returns `false` for those two refusals,
    /// `true` otherwise (also for a context not entered anywhere).
    #[inline]
    pub fn swap_out(&mut self) -> bool {
        if self.depth == 0 {
            return true;
        }
        let Some(ctx) = thread::with_registered(|c| c) else {
            return true;
        };
        if ctx.own_thread_id != self.entered_on {
            return false;
        }
        if self.depth == 1 && ctx.task_level.get() != self.level + 1 {
            return false; // not the innermost: swapping would mix the states
        }
        self.depth -= 1;
        if self.depth > 0 {
            return true;
        }
        ctx.task_level.set(self.level);
        if self.inherited_cancel {
            ctx.cancelling.set(false);
            self.inherited_cancel = false;
        }
        ctx.swap(&mut self.state);
        memory::swap_scope(&mut self.scope);
        self.entered_on = 0;
        // The task stops running here: its open statement and stage leave
        // this thread's current rows, to be written again on the thread
        // that polls it next, and show in its slot meanwhile.
        self.shown.take_from(ctx, &self.state);
        let Some(rt) = runtime::get() else {
            self.shown.hide_in(ctx, &self.state);
            under::give_back(ctx, self.level);
            return true;
        };
        if self.state.poll_start != 0 {
            let s = &mut self.state;
            let now = timer::now(&rt.clock, POLL_TIMER);
            s.busy_ticks = s
                .busy_ticks
                .saturating_add(now.saturating_sub(s.poll_start));
            s.poll_start = 0;
        }
        self.park(rt, ctx);
        self.shown.hide_in(ctx, &self.state);
        under::give_back(ctx, self.level);
        if ctx.task_level.get() == 0 && ctx.queued_any.get() {
            // Back to the thread's own state: what no task took is stale.
            if let Ok(mut q) = ctx.queued.try_borrow_mut() {
                *q = Queued::NONE;
            }
            ctx.queued_any.set(false);
        }
        true
    }

    /// Shows in the task's slot what it has open as a poll returns: its
    /// statement as the worker's row showed it, its stage, and the async
    /// wait it queued on, each while its kind's current consumer is on.
    /// Nothing is written, and nothing but this test done, if the slot
    /// shows that already.
    #[inline(always)]
    fn park(&mut self, rt: &'static runtime::Runtime, ctx: &ThreadCtx) {
        if !rt.task_slots.is_enabled() {
            return; // no slots (`PFS_TASK_SLOTS=0`): shown while it runs only
        }
        let s = &self.state;
        let shown = &self.shown;
        let consumers = rt.setup.consumers.load(Relaxed);
        let statement = match shown.statement {
            Some(e)
                if shown.hid_statement
                    && s.statement_id == e.event_id
                    && effective(consumers, EventKind::Statement, ConsumerKind::Current) =>
            {
                e.event_id
            }
            _ => 0,
        };
        let stage = if effective(consumers, EventKind::Stage, ConsumerKind::Current) {
            s.stage_id
        } else {
            0
        };
        if statement == self.parked.statement
            && stage == self.parked.stage
            && !shown.text_changed
            && !ctx.queued_any.get()
        {
            return;
        }
        self.park_changed(rt, ctx, statement != 0, stage != 0);
    }

    /// [`TaskContext::park`] when something changed.
    #[cold]
    #[inline(never)]
    fn park_changed(
        &mut self,
        rt: &'static runtime::Runtime,
        ctx: &ThreadCtx,
        statement: bool,
        stage: bool,
    ) {
        let s = &self.state;
        // The async waits of this task that started or ended in the poll
        // (an inner context's are its own).
        if let Ok(mut q) = ctx.queued.try_borrow_mut() {
            q.take_into(s.thread_id, &mut self.parked.pending);
            ctx.queued_any.set(q.any());
        }
        let open = statement || stage || self.parked.pending.newest().is_some();
        let shows = self.parked.statement != 0 || self.parked.stage != 0 || self.parked.wait != 0;
        if !open && !shows {
            return;
        }
        let Some(slot) = self.parked.slot(rt) else {
            return; // none free: shown only while it runs
        };
        let shown = &mut self.shown;
        let text = std::str::from_utf8(&shown.text[..shown.text_len]).unwrap_or("");
        let changed = std::mem::take(&mut shown.text_changed);
        let statement = shown
            .statement
            .as_ref()
            .filter(|_| statement)
            .map(|e| (e, text, changed));
        let stage = s
            .stage
            .as_ref()
            .filter(|e| stage && s.stage_id == e.event_id);
        self.parked.show(slot, s, statement, stage);
    }

    /// Runs `f` inside the context with the *cancelling* mark set:
    /// statements that end in `f` (typically, dropped with the task's
    /// future) are recorded as cancelled.
    pub fn cancel_with<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let _entered = self.enter();
        let ctx = thread::with_registered(|c| c).filter(|c| c.in_task());
        let _mark = ctx.map(Cancelling::set);
        f()
    }
}

/// The timer of poll times: CYCLE (one inlined `RDTSC` whatever the
/// statements' timer is: a poll is too short to pay for a `clock_gettime`
/// at each end).
pub(crate) const POLL_TIMER: u32 = TimerId::Cycle as u32;

/// Statements ended outside their task (a [`crate::TaskStatement`] moved
/// to another thread or task and ended there): the task still takes such
/// a statement as its open one (as documented there), and must not show
/// it running again at its next poll. The last [`EndedOutside::RING`] of
/// them, with a sequence number, so that a poll reads one word unless one
/// ended since its task's last poll.
struct EndedOutside;

impl EndedOutside {
    const RING: usize = 64;

    /// How many were noted.
    fn seq() -> &'static AtomicU64 {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        &SEQ
    }

    fn keys() -> &'static [AtomicU64; Self::RING] {
        static KEYS: [AtomicU64; EndedOutside::RING] =
            [const { AtomicU64::new(0) }; EndedOutside::RING];
        &KEYS
    }

    /// The key of event `event_id` of logical thread `thread_id` (never 0).
    fn key(thread_id: u64, event_id: u64) -> u64 {
        (thread_id.rotate_left(32) ^ event_id) | 1
    }

    /// Notes that statement `event_id` of task `thread_id` ended outside
    /// it. Lock-free: a slot is reserved, the key stored, and only then
    /// the sequence advanced (Release), so a reader that sees the sequence
    /// change sees the key; a later writer's advance makes readers scan
    /// again.
    fn note(thread_id: u64, event_id: u64) {
        static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);
        let slot = NEXT_SLOT.fetch_add(1, Relaxed) as usize % Self::RING;
        Self::keys()[slot].store(Self::key(thread_id, event_id), Relaxed);
        Self::seq().fetch_add(1, Release);
    }

    /// Whether statement `event_id` of task `thread_id` ended outside it,
    /// among those noted since `*seen` (updated).
    #[inline]
    fn since(seen: &mut u64, thread_id: u64, event_id: u64) -> bool {
        let now = Self::seq().load(Acquire);
        if now == *seen {
            return false;
        }
        *seen = now;
        let key = Self::key(thread_id, event_id);
        Self::keys().iter().any(|k| k.load(Relaxed) == key)
    }
}

/// Notes that a task's statement ended outside its task (see
/// [`EndedOutside`]).
pub(crate) fn ended_outside(thread_id: u64, event_id: u64) {
    EndedOutside::note(thread_id, event_id);
}

/// A [`TaskContext`] entered on the current thread; leaves it on drop.
/// Not `Send`.
#[derive(Debug)]
pub struct Entered<'a> {
    task: &'a mut TaskContext,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Entered<'_> {
    #[inline]
    fn drop(&mut self) {
        self.task.swap_out();
    }
}

pin_project_lite::pin_project! {
    /// A future with its own event context: each poll enters it (see the
    /// module docs), so statements it opens can be held across `.await`
    /// and everything it records nests in them. Made by
    /// [`TaskExt::pfs_task`] or [`Task::new`]. A `Task` dropped before its
    /// future completed cancels it: see the module docs.
    ///
    /// ```
    /// use pfs_client::task::TaskExt;
    /// use pfs_client::LazyStatementClass;
    ///
    /// static GET: LazyStatementClass = LazyStatementClass::new("statement/http/get");
    ///
    /// async fn handle() -> u32 {
    ///     let mut stmt = GET.start_task(); // Send: may cross .await
    ///     std::future::ready(()).await;
    ///     stmt.set_rows_sent(1);
    ///     stmt.end();
    ///     200
    /// }
    ///
    /// let fut = handle().pfs_task(); // e.g. tokio::spawn(handle().pfs_task())
    /// # let _ = fut;
    /// ```
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct Task<F> {
        ctx: TaskContext,
        // The future, until it completes (then dropped inside the
        // context) or is cancelled (dropped in `drop`, inside the context
        // with the cancelling mark).
        #[pin]
        fut: Option<F>,
    }

    impl<F> PinnedDrop for Task<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.fut.is_some() {
                let mut fut = this.fut;
                this.ctx.cancel_with(|| {
                    fut.set(None);
                    end_task_stage();
                });
            }
        }
    }
}

impl<F: Future> Task<F> {
    /// Gives `fut` its own event context.
    pub fn new(fut: F) -> Self {
        Self {
            ctx: TaskContext::new(),
            fut: Some(fut),
        }
    }

    /// The task's `THREAD_ID` (0 before its first poll).
    pub fn thread_id(&self) -> u64 {
        self.ctx.thread_id()
    }
}

impl<F: Future> Future for Task<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let _entered = this.ctx.enter();
        let Some(fut) = this.fut.as_mut().as_pin_mut() else {
            panic!("`Task` polled after completion");
        };
        let out = fut.poll(cx);
        if out.is_ready() {
            // Completed: dropped here, inside the context, not cancelled.
            this.fut.set(None);
            end_task_stage();
        }
        out
    }
}

pin_project_lite::pin_project! {
    /// A future that, dropped before it completed, is dropped with the
    /// *cancelling* mark set in the context current on the dropping
    /// thread (the entered task's, else the thread's): the statements
    /// that end in that drop are recorded as cancelled, as when a [`Task`]
    /// is dropped. For a future a `select!` or a timeout may drop inside a
    /// task. Made by [`TaskExt::pfs_cancellable`]. Polling it costs a
    /// branch more than its future.
    ///
    /// ```
    /// use std::time::Duration;
    /// use pfs_client::task::TaskExt;
    /// use pfs_client::LazyStatementClass;
    ///
    /// static LOOKUP: LazyStatementClass = LazyStatementClass::new("statement/app/lookup");
    ///
    /// async fn lookup() {
    ///     let _stmt = LOOKUP.start_task();
    ///     std::future::pending::<()>().await; // never answers
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let handler = async {
    ///     // The timeout wins and drops the lookup: its statement ends
    ///     // cancelled (without the adapter: completed).
    ///     let r = tokio::time::timeout(Duration::from_millis(1), lookup().pfs_cancellable()).await;
    ///     assert!(r.is_err());
    /// };
    /// tokio::spawn(handler.pfs_task()).await.unwrap();
    /// # }
    /// ```
    #[derive(Debug)]
    #[must_use = "futures do nothing unless polled"]
    pub struct Cancellable<F> {
        // The future, until it completes (then dropped as usual) or is
        // dropped early (in `drop`, with the cancelling mark).
        #[pin]
        fut: Option<F>,
    }

    impl<F> PinnedDrop for Cancellable<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut fut = this.project().fut;
            if fut.is_some() {
                cancelling_while(|| fut.set(None));
            }
        }
    }
}

impl<F: Future> Future for Cancellable<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        let Some(fut) = this.fut.as_mut().as_pin_mut() else {
            panic!("`Cancellable` polled after completion");
        };
        let out = fut.poll(cx);
        if out.is_ready() {
            this.fut.set(None); // completed: not cancelled
        }
        out
    }
}

/// Runs `f` with the *cancelling* mark set in the context current on this
/// thread (an entered task's, else the thread's own).
fn cancelling_while<R>(f: impl FnOnce() -> R) -> R {
    let _mark = thread::with_registered(|c| c).map(Cancelling::set);
    f()
}

/// The *cancelling* mark set in a context, put back as it was when
/// dropped: also if what runs meanwhile panics (a drop that panics must
/// not leave the thread cancelling every statement it ends afterwards).
struct Cancelling {
    ctx: &'static ThreadCtx,
    was: bool,
}

impl Cancelling {
    fn set(ctx: &'static ThreadCtx) -> Self {
        Self {
            ctx,
            was: ctx.cancelling.replace(true),
        }
    }
}

impl Drop for Cancelling {
    fn drop(&mut self) {
        self.ctx.cancelling.set(self.was);
    }
}

/// Whether a statement ending now on this thread is recorded as
/// cancelled: a [`Task`] or a [`Cancellable`] future is being dropped
/// before it completed, in the context current here. For adapters that
/// end statements of their own (the tracing layer ends a span's
/// statement as cancelled when the span closes in such a drop).
///
/// ```
/// assert!(!pfs_client::task::cancelling());
/// ```
pub fn cancelling() -> bool {
    thread::with_registered(|c| c.cancelling.get()).unwrap_or(false)
}

/// Ends the stage the entered task left open as its future completed or
/// was dropped (its statement, if any, ended it already), as a thread's
/// open stage ends when the thread exits.
fn end_task_stage() {
    if let Some(ctx) = thread::with_registered(|c| c).filter(|c| c.in_task()) {
        event::end_open_stage(ctx);
    }
}

/// Adds [`TaskExt::pfs_task`] to every future.
pub trait TaskExt: Future + Sized {
    /// Gives this future its own event context: see [`Task`].
    fn pfs_task(self) -> Task<Self> {
        Task::new(self)
    }

    /// Makes this future's early drop a cancellation of the statements it
    /// ends then: see [`Cancellable`].
    fn pfs_cancellable(self) -> Cancellable<Self> {
        Cancellable { fut: Some(self) }
    }
}

impl<F: Future> TaskExt for F {}
