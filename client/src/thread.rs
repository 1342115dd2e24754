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
    /// Last `EVENT_ID` used (per thread, shared by all event kinds).
    pub(crate) event_id: Cell<u64>,
}

/// Owns the context; dropping it (at thread exit) folds and frees the record.
struct Owner(Option<Box<ThreadCtx>>);

impl Drop for Owner {
    fn drop(&mut self) {
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
    }
}

/// Sentinel: this thread has no record (lost, exited, or exiting).
const DEAD: *const ThreadCtx = std::ptr::dangling::<ThreadCtx>();

thread_local! {
    static CTX: Cell<*const ThreadCtx> = const { Cell::new(std::ptr::null()) };
    static OWNER: RefCell<Owner> = const { RefCell::new(Owner(None)) };
    static LOST_EVENTS: Cell<u64> = const { Cell::new(0) };
}

static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

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
        event_id: Cell::new(0),
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
