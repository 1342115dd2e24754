//! Layer 6. Stages (`stage/<area>/<name>`): the phases of a statement.
//! Entering a stage ends the thread's previous stage, so stages never
//! overlap; the open stage ends when the statement ends (or with
//! [`end_stage`]).

use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::{EV_HAS_BYTES, EV_HAS_PROGRESS, EV_HAS_SPINS, NONE_U32};

use crate::class::{ClassRef, Family, LazyRef};
use crate::event::{self, end_open_stage};
use crate::source::Site;
use crate::thread::{self, with_registered};

/// A registered stage instrument.
#[derive(Clone, Copy, Debug)]
pub struct StageClass(ClassRef);

impl StageClass {
    /// Registers (or finds) `stage/<area>/<name>`.
    pub fn register(name: &str) -> Self {
        Self(ClassRef::register(name, Family::Stage))
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
        self.enter_at(Some(std::panic::Location::caller()));
    }

    /// [`StageClass::enter`], with `SOURCE` `site` instead of the caller's
    /// line (none if `None`): for an adapter that enters stages on behalf
    /// of code elsewhere (a tracing layer: the span's callsite; the C ABI:
    /// the C caller's `__FILE__` and `__LINE__`).
    #[inline(always)]
    pub fn enter_at(&self, site: Option<&'static dyn Site>) {
        with_registered(end_open_stage);
        if let Some(a) = event::begin::<{ EventKind::Stage.index() }>(
            thread::current,
            self.0,
            self.0.flags(),
            0,
            0,
            NONE_U32,
            site,
        ) && let Ok(mut open) = a.ctx.stage.try_borrow_mut()
        {
            a.ctx.stage_id.set(a.data.event_id);
            *open = Some(a.data);
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

    /// The instrument name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The registered class.
    #[inline(always)]
    pub fn get(&self) -> StageClass {
        StageClass(self.0.get(Family::Stage))
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
///
/// ```
/// use pfs_client::{LazyStageClass, end_stage, stage_progress};
/// static COPYING: LazyStageClass = LazyStageClass::new("stage/kv/copying");
///
/// COPYING.enter();
/// for chunk in 1..=4 {
///     // ... copy one chunk ...
///     stage_progress(chunk, 4);
/// }
/// end_stage();
/// ```
pub fn stage_progress(completed: u64, estimated: u64) {
    with_registered(|ctx| {
        if let Ok(mut open) = ctx.stage.try_borrow_mut()
            && let Some(d) = open.as_mut()
        {
            d.bytes = completed;
            d.spins = estimated;
            d.flags |= EV_HAS_PROGRESS | EV_HAS_BYTES | EV_HAS_SPINS;
            ctx.rec.begin_event(EventKind::Stage, d);
        }
    });
}
