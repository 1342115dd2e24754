//! Layer 8. Statements (`statement/<area>/<name>`): the unit of work a
//! thread or a task serves (a request, a query, a job step), with its own
//! figures. A thread's is a [`StatementGuard`] (not `Send`); a task's is a
//! [`TaskStatement`] (`Send`, held across `.await`; see [`crate::task`]).

use std::marker::PhantomData;

use std::sync::atomic::Ordering::Relaxed;

use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::{
    ConsumerKind, EV_CANCELLED, EV_TIMED, EV_TIMER_MASK, EV_TIMER_SHIFT, NONE_U32,
    STATEMENT_TEXT_BYTES,
};
use pfs_shm_layout::setup::{self, effective};
use pfs_shm_layout::text::truncate_utf8;
use pfs_shm_layout::writer::{EventData, StatementFigures};

use crate::class::{ClassRef, Family, LazyRef};
use crate::context::ThreadCtx;
use crate::event::{self, Active, end_open_stage};
use crate::runtime::Runtime;
use crate::source::Site;
use crate::task::{self, POLL_TIMER};
use crate::{thread, timer};

/// A registered statement instrument.
#[derive(Clone, Copy, Debug)]
pub struct StatementClass(ClassRef);

impl StatementClass {
    /// Registers (or finds) `statement/<area>/<name>`.
    pub fn register(name: &str) -> Self {
        Self(ClassRef::register(name, Family::Statement))
    }

    /// PFS `ENABLED`.
    pub fn is_enabled(&self) -> bool {
        self.0.enabled()
    }

    /// Starts a statement on the current thread. Stages entered and waits
    /// recorded until the guard drops nest in it.
    #[inline]
    #[track_caller]
    pub fn start(&self) -> StatementGuard {
        self.start_at(Some(std::panic::Location::caller()))
    }

    /// [`StatementClass::start`], with `SOURCE` `site` instead of the
    /// caller's line (none if `None`): for an adapter that starts
    /// statements on behalf of code elsewhere (the C ABI: the C caller's
    /// `__FILE__` and `__LINE__`).
    #[inline(always)]
    pub fn start_at(&self, site: Option<&'static dyn Site>) -> StatementGuard {
        let active = self.begin(site);
        let parent = active.as_ref().map_or(0, |a| {
            let parent = a.ctx.statement_id.get();
            a.ctx.statement_id.set(a.data.event_id);
            parent
        });
        StatementGuard {
            active,
            parent,
            figures: StatementFigures::default(),
            _not_send: PhantomData,
        }
    }

    /// The statement event starting now on this thread (in the task
    /// swapped in, if any), with `SOURCE` `source`; none if not recorded.
    #[inline(always)]
    fn begin(&self, source: Option<&'static dyn Site>) -> Option<Active> {
        event::begin::<{ EventKind::Statement.index() }>(
            thread::current,
            self.0,
            self.0.flags(),
            0,
            0,
            NONE_U32,
            source,
        )
    }
}

impl StatementClass {
    /// Starts a statement owned by the current task (see [`crate::task`]):
    /// the returned handle is `Send`, so it can be held across `.await`
    /// and ended on any thread. Stages and waits the task records until it
    /// ends nest in it. Outside a task it is a statement of the current
    /// thread, like [`StatementClass::start`].
    #[inline]
    #[track_caller]
    pub fn start_task(&self) -> TaskStatement {
        self.start_task_at(Some(std::panic::Location::caller()))
    }

    /// [`StatementClass::start_task`], with `SOURCE` `site` instead of the
    /// caller's line (none if `None`): for an adapter that starts
    /// statements on behalf of code elsewhere (a tracing layer: the span's
    /// callsite, a [`CallSite`](crate::CallSite)).
    #[inline(always)]
    pub fn start_task_at(&self, site: Option<&'static dyn Site>) -> TaskStatement {
        let Some(a) = self.begin(site) else {
            return TaskStatement::NONE;
        };
        let ctx = a.ctx;
        #[cfg(feature = "tokio")]
        if !ctx.in_task() && !OUTSIDE_A_TASK_SAID.load(Relaxed) {
            started_outside_a_task();
        }
        let parent = ctx.statement_id.replace(a.data.event_id);
        let busy_at_start = poll_time_at(a.rt, ctx, &a.data);
        TaskStatement {
            rt: Some(a.rt),
            data: a.data,
            parent,
            busy_at_start,
            figures: StatementFigures::default(),
            text: [0; STATEMENT_TEXT_BYTES],
            text_len: 0,
        }
    }
}

/// Whether [`started_outside_a_task`] has spoken.
#[cfg(feature = "tokio")]
static OUTSIDE_A_TASK_SAID: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Says once per process that a task statement was started in a tokio
/// runtime but outside a pfs task context (a future spawned without
/// `.pfs_task()`): it is then a statement of the worker thread, and the
/// statements of other tasks polled on that worker meanwhile nest in it.
/// (Checked only until said: finding the runtime costs a reference count.)
#[cfg(feature = "tokio")]
#[cold]
#[inline(never)]
fn started_outside_a_task() {
    if ::tokio::runtime::Handle::try_current().is_ok() && !OUTSIDE_A_TASK_SAID.swap(true, Relaxed) {
        crate::warning::warn(
            "start_task() in a tokio runtime outside a pfs task: the statement is the thread's, and the statements of other tasks polled on that thread meanwhile nest in it; wrap the spawned future with .pfs_task() (pfs_client::task::TaskExt) or pfs_client::task::Task (in spawn_blocking or block_on, a statement of the thread may be what you want: then ignore this)",
            |m| tracing::warn!("{m}"),
        );
    }
}

/// The task's poll time (CYCLE ticks) now, at `d`'s start, if it is
/// measured: a timed statement of a task, with `events_statements_cpu`
/// on. Starts measuring the current poll if it was not (poll times use
/// the CYCLE timer, see `task::POLL_TIMER`).
#[inline]
fn poll_time_at(rt: &Runtime, ctx: &ThreadCtx, d: &EventData) -> Option<u64> {
    if !ctx.in_task()
        || d.flags & EV_TIMED == 0
        || !setup::statements_cpu(rt.setup.consumers.load(Relaxed))
    {
        return None;
    }
    let now = timer::now(&rt.clock, POLL_TIMER);
    if ctx.poll_start.get() == 0 {
        ctx.poll_start.set(now);
    }
    let into_poll = now.saturating_sub(ctx.poll_start.get());
    Some(ctx.busy_ticks.get().saturating_add(into_poll))
}

/// A lazily registered statement class, for `static` instruments:
///
/// ```
/// use pfs_client::{LazyStageClass, LazyStatementClass};
/// static GET: LazyStatementClass = LazyStatementClass::new("statement/kv/get");
/// static LOOKUP: LazyStageClass = LazyStageClass::new("stage/kv/lookup");
///
/// let mut stmt = GET.start();
/// stmt.set_text("GET user:42");
/// LOOKUP.enter();
/// stmt.set_rows_sent(1);
/// drop(stmt); // ends the stage, then the statement
/// ```
#[derive(Debug)]
pub struct LazyStatementClass(LazyRef);

impl LazyStatementClass {
    /// Declares the statement; it registers on first use after `init`.
    pub const fn new(name: &'static str) -> Self {
        Self(LazyRef::new(name))
    }

    /// The instrument name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The registered class.
    #[inline(always)]
    pub fn get(&self) -> StatementClass {
        StatementClass(self.0.get(Family::Statement))
    }

    /// Shorthand for `get().start()`.
    #[inline]
    #[track_caller]
    pub fn start(&self) -> StatementGuard {
        self.get().start()
    }

    /// Shorthand for `get().start_task()`.
    #[inline]
    #[track_caller]
    pub fn start_task(&self) -> TaskStatement {
        self.get().start_task()
    }
}

/// A statement in progress; dropping it ends the open stage and the
/// statement. Not `Send`. Dropped by a panic's unwinding, it counts one
/// error (`SUM_ERRORS`), unless errors were added to it already.
///
/// Keep it on the stack (or in what the stack owns). A guard kept in a
/// `thread_local!` whose destructor runs after the thread's record was
/// folded at thread exit records nothing: its statement is counted as lost
/// (`pfs_lost_total{kind="events_no_thread_record"}`).
#[must_use = "the statement ends when the guard is dropped"]
pub struct StatementGuard {
    active: Option<Active>,
    parent: u64,
    figures: StatementFigures,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for StatementGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementGuard")
            .field("active", &self.active.is_some())
            .field("figures", &self.figures)
            .finish()
    }
}

/// The setters of a statement's own figures, the same on a
/// [`StatementGuard`] and a [`TaskStatement`] (both keep `figures`).
macro_rules! figure_setters {
    () => {
        /// `DIGEST`: a hash of the normalised text the application supplies
        /// (e.g. `GET ?`), so that statements group by shape.
        pub fn set_digest_text(&mut self, digest_text: &str) {
            self.figures.digest = pfs_shm_layout::text::fnv1a64(digest_text.as_bytes());
        }

        /// `ERRORS` (adds; saturates at `u64::MAX`, never panics).
        pub fn add_errors(&mut self, n: u64) {
            self.figures.errors = self.figures.errors.saturating_add(n);
        }

        /// `WARNINGS` (adds; saturates at `u64::MAX`).
        pub fn add_warnings(&mut self, n: u64) {
            self.figures.warnings = self.figures.warnings.saturating_add(n);
        }

        /// `ROWS_AFFECTED`.
        pub fn set_rows_affected(&mut self, n: u64) {
            self.figures.rows_affected = n;
        }

        /// `ROWS_SENT`.
        pub fn set_rows_sent(&mut self, n: u64) {
            self.figures.rows_sent = n;
        }

        /// `ROWS_EXAMINED`.
        pub fn set_rows_examined(&mut self, n: u64) {
            self.figures.rows_examined = n;
        }
    };
}

impl StatementGuard {
    /// True if this statement is being recorded.
    pub fn is_recording(&self) -> bool {
        self.active.is_some()
    }

    /// The statement's `THREAD_ID` and `EVENT_ID`: the key of its row in
    /// `events_statements_current` and `_history` (zeros if not
    /// recording).
    ///
    /// ```
    /// static Q: pfs_client::LazyStatementClass = pfs_client::LazyStatementClass::new("statement/app/q");
    /// let stmt = Q.start();
    /// assert_eq!(stmt.id(), (0, 0)); // not initialised: not recording
    /// ```
    pub fn id(&self) -> (u64, u64) {
        self.active
            .as_ref()
            .map_or((0, 0), |a| (a.data.thread_id, a.data.event_id))
    }

    /// `SQL_TEXT`: the statement's text (truncated to 200 bytes), copied
    /// now into `events_statements_current`.
    pub fn set_text(&mut self, text: &str) {
        if let Some(a) = &self.active
            && !thread::gone()
            && (a.ctx.outer_texts.borrow().is_empty()
                || !set_outer_text(a.ctx, a.data.event_id, text))
        {
            a.ctx.rec.set_statement_text(text);
        }
    }

    figure_setters!();

    /// Makes this statement its thread's innermost open one again: the
    /// statements opened inside it and still open are forgotten (never
    /// recorded), so that when this one ends, the thread's next statement
    /// nests in this one's parent, not in them. For an adapter whose
    /// caller abandoned a statement together with the ones inside it (an
    /// exception unwinding through them, in C or Python), whose ends never
    /// come. A no-op if nothing is open inside it, or inside an async task.
    ///
    /// ```
    /// static Q: pfs_client::LazyStatementClass = pfs_client::LazyStatementClass::new("statement/app/q");
    /// let mut outer = Q.start();
    /// std::mem::forget(Q.start()); // abandoned inside it
    /// outer.forget_open_nested();
    /// outer.end(); // the next statement nests in nothing
    /// ```
    pub fn forget_open_nested(&mut self) {
        let Some(a) = &self.active else { return };
        let (ctx, id) = (a.ctx, a.data.event_id);
        if ctx.in_task() || ctx.statement_id.get() == id || thread::gone() {
            return;
        }
        ctx.statement_id.set(id);
        // A stage open inside one of them is forgotten with it (its row
        // emptied: it is not running any more).
        if let Ok(mut open) = ctx.stage.try_borrow_mut()
            && let Some(stage) = *open
            && stage.nesting_event_id > id
        {
            ctx.rec
                .hide_unended(EventKind::Stage, stage.thread_id, stage.event_id);
            ctx.stage_id.set(0);
            *open = None;
        }
        // Their kept-aside texts (event ids above this one's: opened
        // after it); this one's own stays, put back as it ends.
        if let Ok(mut texts) = ctx.outer_texts.try_borrow_mut() {
            texts.retain(|t| t.event_id <= id);
        }
        if ctx.ended_early.get().0 > id {
            ctx.ended_early.set((0, 0));
        }
    }

    /// Records this statement without a duration when it ends
    /// (`TIMER_WAIT` NULL: counted in `COUNT_STAR`, not in the timed
    /// figures nor the histogram): for an adapter that ends it long after
    /// it really ended, when only that it ended is known (a statement an
    /// exception abandoned, found open when its struct is begun again).
    ///
    /// ```
    /// static Q: pfs_client::LazyStatementClass = pfs_client::LazyStatementClass::new("statement/app/q");
    /// let mut stmt = Q.start();
    /// stmt.forget_timer();
    /// assert_eq!(stmt.end(), None); // untimed
    /// ```
    pub fn forget_timer(&mut self) {
        if let Some(a) = &mut self.active {
            a.data.flags &= !EV_TIMED;
        }
    }

    /// Ends the statement now; returns its `TIMER_WAIT` in ps if timed.
    pub fn end(mut self) -> Option<u64> {
        let r = self.finish();
        self.active = None;
        r
    }

    /// Ends the open stage if it nests in this statement, then the
    /// statement itself, in place (no copy of the event).
    #[inline(never)]
    fn finish(&mut self) -> Option<u64> {
        let a = self.active.as_mut()?;
        if !thread::can_end(a.rt) {
            return None;
        }
        if a.ctx.cancelling.get() && !std::thread::panicking() {
            // Dropped with a `Cancellable` future (one held across `.await`
            // on a current-thread runtime); a panic's drop is a failure.
            self.figures.cancelled = 1;
            a.data.flags |= EV_CANCELLED;
        }
        if a.ctx.stage_id.get() != 0 && a.ctx.open_stage_nests_in(a.data.event_id) {
            end_open_stage(a.ctx);
        }
        let (ctx, id) = (a.ctx, a.data.event_id);
        if ctx.statement_id.get() == id {
            // The parent, unless it ended first (out of order): then its
            // own parent.
            let mut parent = self.parent;
            if parent != 0 {
                let (early, its_parent) = ctx.ended_early.get();
                if early == parent && !ctx.in_task() {
                    ctx.ended_early.set((0, 0));
                    parent = its_parent;
                }
            }
            ctx.statement_id.set(parent);
        } else if !ctx.in_task() {
            // Ended before a statement nested in it: what is open is that
            // one, which restores past this one when it ends. This one
            // takes the current row back to end in it, so the open one's
            // text is kept aside until it ends too.
            ctx.ended_early.set((id, self.parent));
            event::keep_outer_text(ctx);
        }
        if !ctx.outer_texts.borrow().is_empty() {
            resume_outer_text(a);
        }
        event::end::<{ EventKind::Statement.index() }>(a, Some(&self.figures))
    }
}

/// Sets the kept-aside text of statement `id`, if it has one (a nested
/// statement holds the row); false if not.
#[cold]
#[inline(never)]
fn set_outer_text(ctx: &ThreadCtx, id: u64, text: &str) -> bool {
    let mut texts = ctx.outer_texts.borrow_mut();
    let Some(t) = texts.iter_mut().rev().find(|t| t.event_id == id) else {
        return false;
    };
    let bytes = truncate_utf8(text, STATEMENT_TEXT_BYTES).as_bytes();
    t.text[..bytes.len()].copy_from_slice(bytes);
    t.len = bytes.len();
    true
}

/// Puts back a statement's kept-aside text (and the statement) in the
/// current row as it ends, so that its row and its history row show its
/// own `SQL_TEXT`, not the nested statement's.
#[cold]
#[inline(never)]
fn resume_outer_text(a: &Active) {
    let mut texts = a.ctx.outer_texts.borrow_mut();
    let Some(i) = texts.iter().rposition(|t| t.event_id == a.data.event_id) else {
        return;
    };
    let t = texts.remove(i);
    drop(texts);
    let consumers = a.rt.setup.consumers.load(Relaxed);
    if effective(consumers, EventKind::Statement, ConsumerKind::Current) {
        let text = std::str::from_utf8(&t.text[..t.len]).unwrap_or_default();
        a.ctx.rec.resume_statement(&a.data, text);
    }
}

impl Drop for StatementGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if self.active.is_some() {
            failed_if_panicking(&mut self.figures);
            self.finish();
        }
    }
}

/// A statement ended by a panic's unwinding failed: it counts one error,
/// unless the application had counted some. (A panic is not a
/// cancellation: the future was not dropped by someone who gave up.)
#[cold]
fn failed_by_panic(figures: &mut StatementFigures) {
    if figures.errors == 0 {
        figures.errors = 1;
    }
}

/// [`failed_by_panic`] if this thread is unwinding: the check, inlined
/// (one thread-local load) into the drops.
#[inline(always)]
fn failed_if_panicking(figures: &mut StatementFigures) {
    if std::thread::panicking() {
        failed_by_panic(figures);
    }
}

/// A statement owned by an async task: `Send`, so it can be held across
/// `.await`, moved between worker threads and ended on any of them.
/// Dropping it (or [`TaskStatement::end`]) ends it; a statement dropped
/// with its task's unfinished future (or with a
/// [`crate::task::Cancellable`] future) is recorded as cancelled (see
/// [`crate::task`]); one dropped by a panic's unwinding counts an error
/// (as [`StatementGuard`]). Started by [`StatementClass::start_task`].
///
/// Its `TIMER_WAIT` is wall time from start to end; its `CPU_TIME` the
/// time its task was being polled meanwhile. Ended outside the task it was
/// started in, it is still recorded, with `CPU_TIME` 0 and `END_EVENT_ID`
/// its `EVENT_ID` + 1, and the task's open statement is left as it is.
#[must_use = "the statement ends when the handle is dropped"]
pub struct TaskStatement {
    /// The runtime, if recording.
    rt: Option<&'static Runtime>,
    data: EventData,
    parent: u64,
    /// The task's poll time at the start, in CYCLE ticks, if measured.
    busy_at_start: Option<u64>,
    figures: StatementFigures,
    /// `SQL_TEXT`, kept here: the thread that ends the statement writes it.
    text: [u8; STATEMENT_TEXT_BYTES],
    text_len: u8,
}

impl std::fmt::Debug for TaskStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStatement")
            .field("recording", &self.rt.is_some())
            .field("thread_id", &self.data.thread_id)
            .field("event_id", &self.data.event_id)
            .field("figures", &self.figures)
            .finish()
    }
}

impl TaskStatement {
    const NONE: TaskStatement = TaskStatement {
        rt: None,
        data: EventData {
            event_id: 0,
            end_event_id: 0,
            class: NONE_U32,
            operation: 0,
            timer_start: 0,
            timer_end: 0,
            timer_wait: 0,
            object_instance: 0,
            bytes: 0,
            spins: 0,
            source: NONE_U32,
            object_name: NONE_U32,
            nesting_event_id: 0,
            nesting_event_type: EventKind::wire(None),
            flags: 0,
            event_type: EventKind::wire(None),
            thread_id: 0,
        },
        parent: 0,
        busy_at_start: None,
        figures: StatementFigures::ZERO,
        text: [0; STATEMENT_TEXT_BYTES],
        text_len: 0,
    };

    /// True if this statement is being recorded.
    pub fn is_recording(&self) -> bool {
        self.rt.is_some()
    }

    /// The statement's `THREAD_ID` and `EVENT_ID` (zeros if not recording).
    pub fn id(&self) -> (u64, u64) {
        (self.data.thread_id, self.data.event_id)
    }

    /// `SQL_TEXT` (truncated to 200 bytes on a character boundary): kept
    /// for the statement's end, and shown now in the
    /// `events_statements_current` row of the thread polling the task,
    /// if that row shows the statement running.
    pub fn set_text(&mut self, text: &str) {
        let Some(rt) = self.rt else {
            return;
        };
        let t = truncate_utf8(text, STATEMENT_TEXT_BYTES).as_bytes();
        self.text[..t.len()].copy_from_slice(t);
        self.text_len = t.len() as u8;
        if let Some(ctx) = thread::current(rt) {
            // This thread is the row's only writer: it reads its own stores.
            let cur = ctx.rec.current(EventKind::Statement);
            if cur.event_id.load(Relaxed) == self.data.event_id
                && cur.thread_id.load(Relaxed) == self.data.thread_id
            {
                ctx.rec.set_statement_text(text);
            }
        }
    }

    figure_setters!();

    /// Records the statement as cancelled when it ends, as if its task's
    /// future had been dropped (for adapters that learn of a cancellation
    /// another way, such as a request span closed without a response).
    pub fn mark_cancelled(&mut self) {
        self.figures.cancelled = 1;
    }

    /// Ends the statement now, on this thread; returns its `TIMER_WAIT`
    /// in ps if timed.
    pub fn end(mut self) -> Option<u64> {
        self.finish()
    }

    #[inline(never)]
    fn finish(&mut self) -> Option<u64> {
        let rt = self.rt.take()?;
        let ctx = thread::current(rt)?;
        let mut data = self.data;
        let mut figures = self.figures;
        let ours = ctx.thread_id.get() == data.thread_id;
        if ours && ctx.stage_id.get() != 0 && ctx.open_stage_nests_in(data.event_id) {
            end_open_stage(ctx);
        }
        // The end time, read once (after its stage ended, so that the
        // statement's TIMER_WAIT covers the stage's): it bounds CPU_TIME
        // and ends the event.
        // On a TSC the same reading also ends the poll time.
        let timer = (data.flags & EV_TIMER_MASK) >> EV_TIMER_SHIFT;
        let (now, cycles) = if data.flags & EV_TIMED != 0 {
            let (now, cycles) = timer::now_and_cycles(&rt.clock, timer);
            (Some(now), cycles)
        } else {
            (None, None)
        };
        if ours {
            ctx.statement_id.set(self.parent);
            // (A task dropped by a panic's unwinding: failed, not cancelled.)
            if ctx.cancelling.get() && !std::thread::panicking() {
                figures.cancelled = 1;
            }
            figures.cpu_time_ps = self.cpu_time(rt, ctx, now, cycles);
        } else {
            // Its task, polled again, must not show it running.
            task::ended_outside(data.thread_id, data.event_id);
        }
        if figures.cancelled != 0 {
            data.flags |= EV_CANCELLED;
        }
        let consumers = rt.setup.consumers.load(Relaxed);
        if effective(consumers, EventKind::Statement, ConsumerKind::Current) {
            let cur = ctx.rec.current(EventKind::Statement);
            // This thread is the row's only writer: it reads its own stores.
            let in_row = cur.event_id.load(Relaxed) == data.event_id
                && cur.thread_id.load(Relaxed) == data.thread_id;
            let text = std::str::from_utf8(&self.text[..self.text_len as usize]);
            let text = text.unwrap_or_default();
            if !in_row {
                ctx.rec.resume_statement(&data, text);
            } else if !text.is_empty() {
                ctx.rec.set_statement_text(text);
            }
        }
        let mut a = Active { rt, ctx, data };
        event::end_at::<{ EventKind::Statement.index() }>(&mut a, Some(&figures), now)
    }

    /// `CPU_TIME`: the task's poll time since the start, up to now; never
    /// more than the wall time since the start, `now` being the end time
    /// read with the statement's own timer (so `CPU_TIME ≤ TIMER_WAIT`
    /// although the two are measured with different timers). `cycles`:
    /// the CYCLE reading `now` came from, if it did.
    fn cpu_time(
        &self,
        rt: &Runtime,
        ctx: &ThreadCtx,
        now: Option<u64>,
        cycles: Option<u64>,
    ) -> u64 {
        let (Some(at_start), Some(end)) = (self.busy_at_start, now) else {
            return 0;
        };
        let cal = &rt.clock;
        // The polls that ended, and the one going on if it is measured
        // (not when the task was entered only to end the statement).
        let poll_start = ctx.poll_start.get();
        let this_poll = if poll_start == 0 {
            0
        } else {
            let poll_now = cycles.unwrap_or_else(|| timer::now(cal, POLL_TIMER));
            poll_now.saturating_sub(poll_start)
        };
        let busy = ctx.busy_ticks.get().saturating_add(this_poll);
        let busy = timer::to_ps(cal, POLL_TIMER, busy.saturating_sub(at_start));
        let timer = (self.data.flags & EV_TIMER_MASK) >> EV_TIMER_SHIFT;
        let wall = timer::wait_ps(cal, timer, self.data.timer_start, end);
        busy.min(wall)
    }
}

impl Drop for TaskStatement {
    #[inline]
    fn drop(&mut self) {
        if self.rt.is_some() {
            failed_if_panicking(&mut self.figures);
            self.finish();
        }
    }
}
