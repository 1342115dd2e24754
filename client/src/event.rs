//! Layer 4. The event core shared by waits, stages and statements: the
//! checks of class, consumers and thread, event ids and nesting, timers,
//! and where an ended event goes (current, history, history_long,
//! summaries) by consumer.
//!
//! It works on a thread context it is given: [`begin`] takes the function
//! that finds (or registers) the current thread's, so that this module
//! stays below the thread registry, whose exit path ends the open stage
//! through [`end_open_stage`].

use std::sync::atomic::Ordering::Relaxed;

use pfs_shm_layout::layout::{
    CONSUMER_GLOBAL, ConsumerKind, EV_ENDED, EV_HAS_BYTES, EV_HAS_PROGRESS, EV_TIMED,
    EV_TIMER_MASK, EV_TIMER_SHIFT, FLAG_ENABLED, FLAG_TIMED, NONE_U32, STATEMENT_TEXT_BYTES,
    timer_of,
};
use pfs_shm_layout::setup::{Plan, effective};
use pfs_shm_layout::writer::{EventData, RowExtra, StatementFigures};
use pfs_shm_layout::{EventKind, IoMode, RecordRef};

use crate::class::ClassRef;
use crate::context::{MAX_OUTER_TEXTS, OuterText, ThreadCtx};
use crate::runtime::{self, Runtime};
use crate::source::{self, Site};
use crate::timer;

/// The kind a const parameter `KIND` stands for. Stable Rust takes no
/// enum as a const generic parameter, so the functions below take the
/// kind's [`EventKind::index`] (call sites write
/// `begin::<{ EventKind::Wait.index() }>`) and turn it back into the
/// kind here, at compile time: an index of no kind does not compile.
struct Kind<const KIND: usize>;

impl<const KIND: usize> Kind<KIND> {
    /// The kind of index `KIND`.
    const OF: EventKind = match EventKind::from_index(KIND) {
        Some(kind) => kind,
        None => panic!("KIND is not an EventKind index"),
    };
}

/// An event in flight. Its kind is the `KIND` parameter of [`begin`] and
/// [`end`] (a constant at every call site).
pub(crate) struct Active {
    pub(crate) rt: &'static Runtime,
    pub(crate) ctx: &'static ThreadCtx,
    pub(crate) data: EventData,
}

/// Whether an event of a class with setup flags `flags` is recorded now:
/// the class is enabled, the global consumer is on, and the current
/// thread (from `current`, asked only then) has a record and is
/// instrumented. Gives the runtime, the context and the consumers word.
#[inline(always)]
fn admit(
    current: impl FnOnce(&'static Runtime) -> Option<&'static ThreadCtx>,
    flags: u32,
) -> Option<(&'static Runtime, &'static ThreadCtx, u32)> {
    writable(current, flags).filter(|(_, ctx, _)| ctx.instrumented.get())
}

/// [`admit`] without the thread's `INSTRUMENTED` test: whether an event
/// admitted earlier (at its start, maybe on another thread) can be written
/// now, into the current thread's record.
#[inline(always)]
fn writable(
    current: impl FnOnce(&'static Runtime) -> Option<&'static ThreadCtx>,
    flags: u32,
) -> Option<(&'static Runtime, &'static ThreadCtx, u32)> {
    if flags & FLAG_ENABLED == 0 {
        return None;
    }
    let rt = runtime::get()?;
    let consumers = rt.setup.consumers.load(Relaxed);
    if consumers & CONSUMER_GLOBAL == 0 {
        return None;
    }
    Some((rt, current(rt)?, consumers))
}

/// Starts an event of kind `KIND` (an [`EventKind::index`]) for `class`,
/// whose setup flags the caller loaded (`flags`), on the current thread,
/// or `None` if the class, the thread or the consumers say no. `current`
/// gives the current thread's context (registering the thread on its
/// first event), or `None` for a thread without a record; it is called
/// only once the class and the consumers said yes.
#[inline(always)]
pub(crate) fn begin<const KIND: usize>(
    current: impl FnOnce(&'static Runtime) -> Option<&'static ThreadCtx>,
    class: ClassRef,
    flags: u32,
    operation: u32,
    object: u64,
    object_name: u32,
    source: Option<&'static dyn Site>,
) -> Option<Active> {
    let kind = Kind::<KIND>::OF;
    let (rt, ctx, consumers) = admit(current, flags)?;
    if kind == EventKind::Statement && ctx.stage_id.get() != 0 {
        // A statement that starts ends the open stage, as its own first
        // stage would in MySQL: what follows is the new statement's, so
        // the waits it records nest in it, not in a stage of its parent.
        end_open_stage(ctx);
    }
    let timed = flags & FLAG_TIMED != 0;
    let timer = timer_of(rt.setup.timers.load(Relaxed), kind);
    let mut data = new_event::<KIND>(
        rt,
        ctx,
        class,
        timed,
        timer,
        operation,
        object,
        object_name,
        source,
        None,
    );
    // The start time is read last, once the row is written: the wait being
    // measured starts when this function returns.
    if effective(consumers, kind, ConsumerKind::Current) {
        if kind == EventKind::Statement && ctx.statement_id.get() != 0 && !ctx.in_task() {
            keep_outer_text(ctx);
        }
        let row = ctx.rec.begin_event_open(kind, &data);
        data.timer_start = start_time(rt, timed, timer);
        row.publish(data.timer_start);
    } else {
        data.timer_start = start_time(rt, timed, timer);
    }
    Some(Active { rt, ctx, data })
}

/// Keeps aside the text of the thread's open statement (the innermost,
/// `ctx.statement_id`) if the current row shows it: a statement nested in
/// it is about to take the row, and gives it back when it ends (see
/// `statement`). Cold: statements rarely nest.
#[cold]
#[inline(never)]
pub(crate) fn keep_outer_text(ctx: &ThreadCtx) {
    let id = ctx.statement_id.get();
    let mut text = [0; STATEMENT_TEXT_BYTES];
    if let Some((len, _)) = ctx
        .rec
        .copy_statement_text(ctx.thread_id.get(), id, &mut text)
    {
        let mut texts = ctx.outer_texts.borrow_mut();
        if texts.len() >= MAX_OUTER_TEXTS {
            // A statement that never ends on this thread (its end came
            // from another thread, or never) leaves its entry behind:
            // the oldest goes, so that the list, and the scans of it,
            // stay bounded (that statement's text is then not put back).
            texts.remove(0);
        }
        let room = MAX_OUTER_TEXTS - texts.len();
        texts.reserve_exact(room);
        texts.push(OuterText {
            event_id: id,
            len,
            text,
        });
    }
}

/// A new event's row, in registers: ids and nesting from `ctx`, no times.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn new_event<const KIND: usize>(
    rt: &'static Runtime,
    ctx: &ThreadCtx,
    class: ClassRef,
    timed: bool,
    timer: u32,
    operation: u32,
    object: u64,
    object_name: u32,
    source: Option<&'static dyn Site>,
    claimed: Option<Claim>,
) -> EventData {
    let kind = Kind::<KIND>::OF;
    let (thread_id, event_id, (nesting_event_id, nesting_event_type)) = match claimed {
        Some(c) => (c.thread_id, c.event_id, c.nesting),
        None => (
            ctx.thread_id.get(),
            ctx.next_event_id(),
            ctx.nesting_for(kind),
        ),
    };
    let source = source.map_or(NONE_U32, |l| source::source_id(rt, l));
    EventData {
        event_id,
        end_event_id: 0,
        class: class.index,
        operation,
        timer_start: 0,
        timer_end: 0,
        timer_wait: 0,
        object_instance: object,
        bytes: 0,
        spins: 0,
        source,
        object_name,
        nesting_event_id,
        nesting_event_type,
        flags: (if timed { EV_TIMED } else { 0 }) | (timer << EV_TIMER_SHIFT),
        event_type: EventKind::wire(Some(kind)),
        thread_id,
    }
}

/// The row of an event that started earlier (`claimed` its ids, `start`
/// its raw ticks and timer if timed), as a current row shows it running:
/// an async wait's, for the slot of the task that waits (see `task`), and
/// the start of one recorded whole ([`record_since`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn started_row<const KIND: usize>(
    rt: &'static Runtime,
    ctx: &ThreadCtx,
    class: ClassRef,
    start: Option<(u64, u32)>,
    operation: u32,
    object: u64,
    object_name: u32,
    source: Option<&'static dyn Site>,
    claimed: Claim,
) -> EventData {
    let (ticks, timer) = start.unwrap_or((0, 0));
    let mut d = new_event::<KIND>(
        rt,
        ctx,
        class,
        start.is_some(),
        timer,
        operation,
        object,
        object_name,
        source,
        Some(claimed),
    );
    d.timer_start = ticks;
    d
}

/// The ids an event took where it started, for an event recorded whole
/// later, by whichever thread ends it (an async wait): its `THREAD_ID`
/// (a task's, if one was entered), `EVENT_ID` and nesting, as every other
/// event takes them at its start. A wait whose future is dropped outside
/// its task (a `tower-http` response future dropped when the client hung
/// up drops the handler's future outside the request's span) is still the
/// task's event, nested in what the task had open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Claim {
    thread_id: u64,
    event_id: u64,
    nesting: (u64, u32),
}

impl Claim {
    /// No ids: the claim of an event that is not recorded.
    pub(crate) const NONE: Claim = Claim {
        thread_id: 0,
        event_id: 0,
        nesting: (0, 0),
    };

    /// `(THREAD_ID, EVENT_ID)` taken.
    pub(crate) fn ids(&self) -> (u64, u64) {
        (self.thread_id, self.event_id)
    }
}

/// Takes the ids of an event of kind `KIND` starting now on the current
/// thread (see [`Claim`]), if it would be recorded now (see [`admit`]).
#[inline]
pub(crate) fn claim<const KIND: usize>(
    current: impl FnOnce(&'static Runtime) -> Option<&'static ThreadCtx>,
    flags: u32,
) -> Option<Claim> {
    let (_, ctx, _) = admit(current, flags)?;
    Some(Claim {
        thread_id: ctx.thread_id.get(),
        event_id: ctx.next_event_id(),
        nesting: ctx.nesting_for(Kind::<KIND>::OF),
    })
}

/// Records a whole event of kind `KIND` that started earlier, at raw
/// ticks `start` of timer `timer` (`None`: untimed), and ends now: an
/// async wait, measured by a future across polls and recorded in one go
/// by whichever thread polls (or drops) it last. With the ids it
/// `claimed` at its start (where it was admitted, as every event is), it
/// is that logical thread's event, nested where it started, whatever
/// thread ends it: that thread only needs a record to write it into.
/// Returns its `TIMER_WAIT` in ps if timed.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn record_since<const KIND: usize>(
    current: impl FnOnce(&'static Runtime) -> Option<&'static ThreadCtx>,
    class: ClassRef,
    start: Option<(u64, u32)>,
    operation: u32,
    object: u64,
    object_name: u32,
    source: Option<&'static dyn Site>,
    claimed: Claim,
) -> Option<u64> {
    // Admitted at its start; still, nothing is written while the class or
    // the global consumer is off.
    let (rt, ctx, _) = writable(current, class.flags())?;
    let data = started_row::<KIND>(
        rt,
        ctx,
        class,
        start,
        operation,
        object,
        object_name,
        source,
        claimed,
    );
    let a = &mut Active { rt, ctx, data };
    match IoMode::of_operation(operation) {
        Some(mode) if Kind::<KIND>::OF == EventKind::Wait => end_io(a, mode),
        _ => end::<KIND>(a, None),
    }
}

#[inline(always)]
fn start_time(rt: &Runtime, timed: bool, timer: u32) -> u64 {
    if timed {
        timer::now(&rt.clock, timer)
    } else {
        0
    }
}

/// Ends an event of kind `KIND`; returns its `TIMER_WAIT` in ps if timed.
#[inline(always)]
pub(crate) fn end<const KIND: usize>(
    a: &mut Active,
    stmt: Option<&StatementFigures>,
) -> Option<u64> {
    end_at::<KIND>(a, stmt, None)
}

/// [`end`], with the end time already read from the event's timer
/// (`now`, raw ticks) by a caller that needed it first; `None` reads it.
#[inline(always)]
pub(crate) fn end_at<const KIND: usize>(
    a: &mut Active,
    stmt: Option<&StatementFigures>,
    now: Option<u64>,
) -> Option<u64> {
    end_in::<KIND>(a.rt, a.ctx, &mut a.data, RowExtra::from(stmt), now)
}

/// [`end`] of a wait of a file or socket, whose summary row also counts
/// it in its mode's figures (`file_summary_by_event_name`): a path of
/// its own, so that other waits' code is not touched by it.
#[inline(never)]
pub(crate) fn end_io(a: &mut Active, mode: IoMode) -> Option<u64> {
    end_in::<{ EventKind::Wait.index() }>(a.rt, a.ctx, &mut a.data, RowExtra::Io(mode), None)
}

/// [`end_at`] of the event `d`, wherever it is kept (in a guard, or the
/// thread's open stage, ended in place: a copy of the whole event, loaded
/// in wider pieces than its fields were stored, waits for those stores).
#[inline(always)]
fn end_in<const KIND: usize>(
    rt: &'static Runtime,
    ctx: &'static ThreadCtx,
    d: &mut EventData,
    extra: RowExtra<'_>,
    now: Option<u64>,
) -> Option<u64> {
    let stmt = match extra {
        RowExtra::Statement(f) => Some(f),
        _ => None,
    };
    let kind = Kind::<KIND>::OF;
    let timed = d.flags & EV_TIMED != 0;
    if timed {
        // First, so that the measured interval ends where the wait did.
        let timer = (d.flags & EV_TIMER_MASK) >> EV_TIMER_SHIFT;
        d.timer_end = now.unwrap_or_else(|| timer::now(&rt.clock, timer));
        d.timer_wait = timer::wait_ps(&rt.clock, timer, d.timer_start, d.timer_end);
    }
    // The wait, kept for the summary and the result: read back from the
    // event after the stores to the rows, the load waited for them (a timed
    // wait through the C ABI measured 46 ns with it, 31 without; class and
    // bytes kept too measured slower: registers spilled).
    let wait_ps = d.timer_wait;
    // A wait has no children (waits nest in stages and statements), so
    // its range is itself: events its thread recorded meanwhile (a task's
    // other waits under `join!`, a worker's other tasks while an async
    // wait was pending) are not in it. An event ended in another logical
    // thread than its own (a task's statement ended outside the task)
    // cannot count its children.
    d.end_event_id = if kind != EventKind::Wait && d.thread_id == ctx.thread_id.get() {
        ctx.event_id.get() + 1
    } else {
        d.event_id + 1
    };
    d.flags |= EV_ENDED;
    let mut plan = Plan::new(rt.setup.consumers.load(Relaxed), kind);
    if !ctx.history.get() {
        plan = plan.without_history();
    }
    let rec = &ctx.rec;
    let current = plan.has(ConsumerKind::Current);
    rec.end_event(kind, d, stmt, current, plan.has(ConsumerKind::History));
    if !current {
        end_where_shown(rec, kind, d, stmt);
    }
    if plan.has(ConsumerKind::HistoryLong) {
        append_long::<KIND>(rt, ctx, d, stmt);
    }
    if plan.has(ConsumerKind::Summaries) {
        let bytes = if d.flags & EV_HAS_BYTES != 0 && d.flags & EV_HAS_PROGRESS == 0 {
            d.bytes
        } else {
            0
        };
        rec.summarize(d.class as usize, kind, timed, wait_ps, bytes, extra);
    }
    timed.then_some(wait_ps)
}

/// Ends event `d` in the current row of `rec` if the row shows it: an
/// event shown running there at its start ends there even if the
/// consumer was switched off since (as in MySQL, its fate was decided
/// when it started); else the row would show it running for good, and
/// the agent count it as stuck. Out of line: only with the consumer off.
#[cold]
#[inline(never)]
fn end_where_shown(
    rec: &RecordRef<'_>,
    kind: EventKind,
    d: &EventData,
    stmt: Option<&StatementFigures>,
) {
    if rec.shows(kind, d.thread_id, d.event_id) {
        rec.end_event(kind, d, stmt, true, false);
    }
}

/// `history_long` (off by default): the one multi-writer structure, out of
/// line.
#[inline(never)]
fn append_long<const KIND: usize>(
    rt: &'static Runtime,
    ctx: &'static ThreadCtx,
    d: &EventData,
    stmt: Option<&StatementFigures>,
) {
    let kind = Kind::<KIND>::OF;
    // The first append after the consumer was switched on reserves the
    // ring (`fallocate`, a cancellation point): not a place to be
    // cancelled (see `runtime::NoCancel`).
    let _no_cancel = (!rt.writer.long_ready(kind)).then(runtime::NoCancel::new);
    let stmt = stmt
        .filter(|_| kind == EventKind::Statement)
        .map(|f| (f, &ctx.rec.header.statements_current));
    rt.writer.append_long(kind, d, stmt);
}

/// Ends the thread's open stage, if any: when a new stage starts, when the
/// statement it nests in ends, on [`crate::end_stage`], and at thread exit.
pub(crate) fn end_open_stage(ctx: &'static ThreadCtx) {
    if ctx.stage_id.get() == 0 {
        return;
    }
    // Ended where it is kept, not taken out: see `end_in`. (Not borrowed
    // only if this thread's own code is already in the stage, which no
    // path does: then it stays open, its id with it.)
    let Ok(mut open) = ctx.stage.try_borrow_mut() else {
        return;
    };
    ctx.stage_id.set(0);
    if let (Some(d), Some(rt)) = (open.as_mut(), runtime::get()) {
        end_in::<{ EventKind::Stage.index() }>(rt, ctx, d, RowExtra::None, None);
    }
    *open = None;
}
