//! The event core shared by waits, stages and statements: thread checks,
//! setup words, event ids and nesting, timers, and where an ended event
//! goes (current, history, history_long, summaries) by consumer.

use pfs_shm_layout::layout::{
    ConsumerKind, EV_ENDED, EV_HAS_BYTES, EV_HAS_PROGRESS, EV_TIMED, EV_TIMER_MASK, EV_TIMER_SHIFT,
    FLAG_ENABLED, FLAG_TIMED, NONE_U32, TimerId, timer_of,
};
use pfs_shm_layout::setup::effective;
use pfs_shm_layout::writer::{EventData, KIND_STATEMENT, StatementFigures};

use crate::class::ClassRef;
use crate::runtime::{self, Runtime};
use crate::thread::{ThreadCtx, with_ctx};
use crate::timer;

/// An event in flight.
pub(crate) struct Active {
    pub(crate) rt: &'static Runtime,
    pub(crate) ctx: &'static ThreadCtx,
    pub(crate) data: EventData,
    pub(crate) kind: usize,
}

/// Starts an event of `kind` for `class` on the current thread, or `None`
/// if the class, the thread or the consumers say no.
#[inline(always)]
pub(crate) fn begin(
    class: ClassRef,
    kind: usize,
    operation: u32,
    object: u64,
    object_name: u32,
    source: Option<&'static std::panic::Location<'static>>,
) -> Option<Active> {
    let flags = class.flags();
    if flags & FLAG_ENABLED == 0 {
        return None;
    }
    let rt = runtime::get()?;
    let consumers = rt
        .setup
        .consumers
        .load(std::sync::atomic::Ordering::Relaxed);
    if consumers & pfs_shm_layout::layout::CONSUMER_GLOBAL == 0 {
        return None;
    }
    with_ctx(rt, |ctx| {
        if !ctx.instrumented.get() {
            return None;
        }
        let timed = flags & FLAG_TIMED != 0;
        let timer = timer_of(
            rt.setup.timers.load(std::sync::atomic::Ordering::Relaxed),
            kind,
        );
        let timer_id = TimerId::from_u32(timer).unwrap_or(TimerId::Cycle);
        let event_id = ctx.next_event_id();
        let (nesting_event_id, nesting_event_type) = ctx.nesting_for(kind);
        let data = EventData {
            event_id,
            class: class.index,
            operation,
            timer_start: if timed { timer::now(timer_id) } else { 0 },
            object_instance: object,
            source: source.map_or(NONE_U32, |l| crate::source::source_id(rt, l)),
            object_name,
            nesting_event_id,
            nesting_event_type,
            flags: (if timed { EV_TIMED } else { 0 }) | (timer << EV_TIMER_SHIFT),
            event_type: kind as u32 + 1,
            thread_id: ctx.thread_id,
            ..EventData::default()
        };
        if effective(consumers, kind, ConsumerKind::Current) {
            ctx.rec.begin_event(kind, &data);
        }
        Some(Active {
            rt,
            ctx,
            data,
            kind,
        })
    })
    .flatten()
}

/// Ends an event; returns its `TIMER_WAIT` in ps if timed.
#[inline(always)]
pub(crate) fn end(a: &mut Active, stmt: Option<&StatementFigures>) -> Option<u64> {
    let d = &mut a.data;
    d.end_event_id = a.ctx.event_id.get() + 1;
    d.flags |= EV_ENDED;
    let timed = d.flags & EV_TIMED != 0;
    if timed {
        let t = TimerId::from_u32((d.flags & EV_TIMER_MASK) >> EV_TIMER_SHIFT)
            .unwrap_or(TimerId::Cycle);
        d.timer_end = timer::now(t);
        d.timer_wait = timer::to_ps(
            &a.rt.calibration,
            t,
            d.timer_end.saturating_sub(d.timer_start),
        );
    }
    let consumers =
        a.rt.setup
            .consumers
            .load(std::sync::atomic::Ordering::Relaxed);
    let kind = a.kind;
    let rec = &a.ctx.rec;
    let thread_history = a.ctx.history.get();
    let history = thread_history && effective(consumers, kind, ConsumerKind::History);
    rec.end_event(
        kind,
        d,
        stmt,
        effective(consumers, kind, ConsumerKind::Current),
        history,
    );
    if thread_history && effective(consumers, kind, ConsumerKind::HistoryLong) {
        let stmt = stmt
            .filter(|_| kind == KIND_STATEMENT)
            .map(|f| (f, &rec.header.statements_current));
        a.rt.writer.append_long(kind, d, stmt);
    }
    if effective(consumers, kind, ConsumerKind::Summaries) {
        let bytes = if d.flags & EV_HAS_BYTES != 0 && d.flags & EV_HAS_PROGRESS == 0 {
            d.bytes
        } else {
            0
        };
        rec.summarize(d.class as usize, timed, d.timer_wait, bytes, stmt);
    }
    timed.then_some(d.timer_wait)
}
