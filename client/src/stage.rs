//! Stages (`stage/<area>/<name>`): the phases of a statement. Entering a
//! stage ends the thread's previous stage, so stages never overlap; the
//! open stage ends when the statement ends (or with [`end_stage`]).

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::layout::{EV_HAS_BYTES, EV_HAS_PROGRESS, EV_HAS_SPINS};
use pfs_shm_layout::writer::KIND_STAGE;

use crate::class::{ClassRef, LazyRef};
use crate::event::{self, Active};
use crate::thread::{ThreadCtx, with_registered};

fn is_stage(k: ClassKind) -> bool {
    k == ClassKind::Stage
}

/// A registered stage instrument.
#[derive(Clone, Copy, Debug)]
pub struct StageClass(ClassRef);

impl StageClass {
    /// Registers (or finds) `stage/<area>/<name>`.
    pub fn register(name: &str) -> Self {
        Self(ClassRef::register(name, is_stage, "stage"))
    }

    /// PFS `ENABLED`.
    pub fn is_enabled(&self) -> bool {
        self.0.enabled()
    }

    /// Enters this stage on the current thread: ends the open stage, if
    /// any, and starts this one (nested in the open statement). A disabled
    /// stage still ends the previous one, as in PFS.
    #[inline]
    #[track_caller]
    pub fn enter(&self) {
        let loc = std::panic::Location::caller();
        with_registered(end_open_stage);
        if let Some(a) = event::begin::<KIND_STAGE>(
            self.0,
            self.0.flags(),
            0,
            0,
            pfs_shm_layout::layout::NONE_U32,
            Some(loc),
        ) {
            a.ctx.stage_id.set(a.data.event_id);
            a.ctx.stage.set(Some(a.data));
        }
    }
}

/// A lazily registered stage class, for `static` instruments:
///
/// ```
/// use pfs_client::LazyStageClass;
/// static PARSING: LazyStageClass = LazyStageClass::new("stage/kv/parsing");
/// PARSING.enter(); // a no-op until pfs_client::init
/// pfs_client::end_stage();
/// ```
#[derive(Debug)]
pub struct LazyStageClass(LazyRef);

impl LazyStageClass {
    /// Declares the stage; it registers on first use after `init`.
    pub const fn new(name: &'static str) -> Self {
        Self(LazyRef::new(name))
    }

    /// The registered class.
    #[inline(always)]
    pub fn get(&self) -> StageClass {
        StageClass(self.0.get(is_stage, "stage"))
    }

    /// Shorthand for `get().enter()`.
    #[inline]
    #[track_caller]
    pub fn enter(&self) {
        self.get().enter();
    }
}

/// Ends the current thread's open stage, if any.
pub fn end_stage() {
    with_registered(end_open_stage);
}

/// Reports progress of the open stage (`WORK_COMPLETED`,
/// `WORK_ESTIMATED`), shown in `events_stages_current`.
pub fn stage_progress(completed: u64, estimated: u64) {
    with_registered(|ctx| {
        if let Some(mut d) = ctx.stage.get() {
            d.bytes = completed;
            d.spins = estimated;
            d.flags |= EV_HAS_PROGRESS | EV_HAS_BYTES | EV_HAS_SPINS;
            ctx.stage.set(Some(d));
            ctx.rec.begin_event(KIND_STAGE, &d);
        }
    });
}

pub(crate) fn end_open_stage(ctx: &'static ThreadCtx) {
    if ctx.stage_id.get() == 0 {
        return;
    }
    ctx.stage_id.set(0);
    if let (Some(data), Some(rt)) = (ctx.stage.take(), crate::runtime::get()) {
        let mut a = Active { rt, ctx, data };
        event::end::<KIND_STAGE>(&mut a, None);
    }
}
