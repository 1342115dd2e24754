//! Per-thread state: the thread's record, registered lazily on its first
//! event and folded into the process totals when the thread exits.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pfs_shm_layout::layout::LostKind;
use pfs_shm_layout::{RecordRef, ThreadSlot};

use crate::runtime::{self, Runtime};

/// What the hot path needs of the current thread.
pub(crate) struct ThreadCtx {
    pub(crate) rec: RecordRef<'static>,
    slot: ThreadSlot,
    /// `THREAD_ID`.
    pub(crate) thread_id: u64,
    /// Last `EVENT_ID` used (per thread, shared by all event kinds).
    pub(crate) event_id: Cell<u64>,
    /// `INSTRUMENTED` (setup_actors verdict; yes until an actor is declared).
    pub(crate) instrumented: Cell<bool>,
    /// `HISTORY`.
    pub(crate) history: Cell<bool>,
    /// The open stage, if any (a new stage ends it).
    pub(crate) stage: Cell<Option<pfs_shm_layout::writer::EventData>>,
    /// `EVENT_ID` of the open stage (0 = none): what a wait nests in,
    /// without copying `stage`.
    pub(crate) stage_id: Cell<u64>,
    /// Event id of the innermost open statement (0 = none).
    pub(crate) statement_id: Cell<u64>,
}

impl ThreadCtx {
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
        use pfs_shm_layout::layout::EventType;
        if kind == pfs_shm_layout::writer::KIND_WAIT {
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

/// Owns the context; dropping it (at thread exit) folds and frees the record.
struct Owner(Option<Box<ThreadCtx>>);

impl Drop for Owner {
    fn drop(&mut self) {
        // Folding takes the writer's lock and frees the context: not
        // accounted by `crate::alloc` (neither block was).
        IN_PFS.with(|f| f.set(true));
        // A stage still open at thread exit ends here, so it is counted.
        if let Some(ctx) = self.0.as_deref() {
            let p: *const ThreadCtx = ctx;
            // SAFETY: the box behind `p` is freed at the end of this
            // function at the earliest; `end_open_stage` keeps no reference
            // past its return.
            crate::stage::end_open_stage(unsafe { &*p });
        }
        CTX.with(|c| c.set(DEAD));
        if let (Some(ctx), Some(rt)) = (self.0.take(), runtime::get()) {
            rt.writer.fold_and_free(ctx.slot);
        }
        let lost = LOST_EVENTS.with(|c| c.get());
        if lost > 0
            && let Some(rt) = runtime::get()
        {
            rt.writer.segment().lost().counters[LostKind::Events as usize].fetch_add(lost, Relaxed);
        }
        IN_PFS.with(|f| f.set(false));
    }
}

/// Sentinel: this thread has no record (lost, exited, or exiting).
const DEAD: *const ThreadCtx = std::ptr::dangling::<ThreadCtx>();

thread_local! {
    static CTX: Cell<*const ThreadCtx> = const { Cell::new(std::ptr::null()) };
    static OWNER: RefCell<Owner> = const { RefCell::new(Owner(None)) };
    static LOST_EVENTS: Cell<u64> = const { Cell::new(0) };
    /// Set while the client runs its own slow paths (registration, class
    /// and string interning, fold): the `GlobalAlloc` wrapper does not
    /// account allocations then, so it never recurses into them or waits
    /// for a lock this thread holds. Const, no destructor: usable at any
    /// point of thread teardown.
    static IN_PFS: Cell<bool> = const { Cell::new(false) };
}

/// True while this thread is inside the client's own slow paths.
#[inline(always)]
pub(crate) fn in_pfs() -> bool {
    IN_PFS.with(|f| f.get())
}

/// Runs `f` as a client slow path (see `IN_PFS`).
#[inline]
pub(crate) fn reentrant<R>(f: impl FnOnce() -> R) -> R {
    let prev = IN_PFS.with(|c| c.replace(true));
    let r = f();
    IN_PFS.with(|c| c.set(prev));
    r
}

/// Memory accounting's view of the thread: the context, registering the
/// thread first if it has none yet (unless inside a client slow path);
/// `None` for a thread without a record (lost, exiting, exited), without
/// counting lost events (the caller accounts to the global row instead).
#[inline(always)]
pub(crate) fn with_ctx_memory<R>(
    rt: &'static Runtime,
    f: impl FnOnce(&'static ThreadCtx) -> R,
) -> Option<R> {
    let p = CTX.with(|c| c.get());
    if p.is_null() {
        if in_pfs() {
            return None;
        }
        return reentrant(|| register(rt)).map(f);
    }
    if p == DEAD {
        return None;
    }
    // SAFETY: as in `with_ctx`.
    Some(f(unsafe { &*p }))
}

static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

/// Runs `f` with the current thread's context if it is already
/// registered (never registers it).
#[inline(always)]
pub(crate) fn with_registered<R>(f: impl FnOnce(&'static ThreadCtx) -> R) -> Option<R> {
    let p = CTX.with(|c| c.get());
    if p.is_null() || p == DEAD {
        return None;
    }
    // SAFETY: as in `with_ctx`.
    Some(f(unsafe { &*p }))
}

/// Runs `f` with the current thread's context, registering the thread on
/// its first event. `None` if the thread has no record.
#[inline(always)]
pub(crate) fn with_ctx<R>(
    rt: &'static Runtime,
    f: impl FnOnce(&'static ThreadCtx) -> R,
) -> Option<R> {
    let p = CTX.with(|c| c.get());
    if p.is_null() {
        return register(rt).map(f);
    }
    if p == DEAD {
        LOST_EVENTS.with(|c| c.set(c.get() + 1));
        return None;
    }
    // SAFETY: a non-null, non-DEAD pointer was set by `register` to the
    // boxed context owned by this thread's `OWNER`, which lives until the
    // thread-local destructor runs, and that destructor sets CTX to DEAD
    // before freeing it. The context is only used on this thread.
    Some(f(unsafe { &*p }))
}

#[cold]
#[inline(never)]
fn register(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    reentrant(|| register_inner(rt))
}

fn register_inner(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    let thread_id = NEXT_THREAD_ID.fetch_add(1, Relaxed);
    let os_tid = rustix::thread::gettid().as_raw_nonzero().get() as u64;
    let cur = std::thread::current();
    let name = cur
        .name()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("thread-{thread_id}"));
    let Some(slot) = rt.writer.alloc_thread(thread_id, os_tid, &name) else {
        CTX.with(|c| c.set(DEAD));
        return None;
    };
    let ctx = Box::new(ThreadCtx {
        rec: rt.writer.segment().record(slot.index),
        slot,
        thread_id,
        event_id: Cell::new(0),
        instrumented: Cell::new(true),
        history: Cell::new(true),
        stage: Cell::new(None),
        stage_id: Cell::new(0),
        statement_id: Cell::new(0),
    });
    let p: *const ThreadCtx = &*ctx;
    let installed = OWNER.try_with(|o| o.borrow_mut().0 = Some(ctx)).is_ok();
    if !installed {
        // The thread is already being torn down: give the record back.
        rt.writer.fold_and_free(slot);
        CTX.with(|c| c.set(DEAD));
        return None;
    }
    CTX.with(|c| c.set(p));
    // SAFETY: `p` points into the box now owned by OWNER (see `with_ctx`).
    Some(unsafe { &*p })
}

/// See [`crate::set_thread_actor`].
pub(crate) fn set_actor(user: &str, host: &str, role: &str) -> (bool, bool) {
    use pfs_shm_layout::layout::{NONE_U32, THREAD_HISTORY, THREAD_INSTRUMENTED};
    let Some(rt) = runtime::get() else {
        return (false, false);
    };
    let actors = pfs_shm_layout::setup::read_actors(rt.writer.segment());
    let (instrumented, history) = pfs_shm_layout::setup::match_actor(&actors, user, host, role);
    with_ctx(rt, |ctx| {
        ctx.instrumented.set(instrumented);
        ctx.history.set(history);
        let id = |s: &str| rt.writer.intern(s).unwrap_or(NONE_U32);
        let flags = if instrumented { THREAD_INSTRUMENTED } else { 0 }
            | if history { THREAD_HISTORY } else { 0 };
        ctx.rec.set_actor(id(user), id(host), id(role), flags);
    });
    (instrumented, history)
}
