//! Layer 5. The thread registry: gives the current thread its context
//! (registering it lazily, on its first event, into a record of the
//! segment's thread container, under its name) and takes it back when the
//! thread exits, ending its open stage and folding its record into the
//! process totals. A thread without a record counts each of its events as
//! lost, in the segment.
//!
//! Holds unsafe code, three blocks: [`lookup`] turns the thread-local
//! pointer to the thread's context into a reference, `Owner::drop`
//! frees the context at thread exit, and the fork handler is registered
//! (its contract: async-signal-safe).

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use pfs_shm_layout::NoRecord;
use pfs_shm_layout::layout::{LostKind, NONE_U32, THREAD_HISTORY, THREAD_INSTRUMENTED};
use pfs_shm_layout::setup::{match_actor, read_actors};

use crate::context::ThreadCtx;
use crate::event::end_open_stage;
use crate::reentry::{in_pfs, reentrant};
use crate::runtime::{self, Runtime};
use crate::warning;

/// Owns the context (leaked from its box at registration, so that no
/// `Box` asserts unique access while the hot path reads it through
/// [`CTX`]); dropping it, at thread exit, ends the open stage, folds the
/// record and frees the context.
struct Owner(Option<NonNull<ThreadCtx>>);

impl Drop for Owner {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // Folding takes the writer's lock and frees the context: neither
        // block was accounted, so neither free is.
        reentrant(|| {
            // A stage still open at thread exit ends here, so it is
            // counted (CTX still points to the context).
            with_registered(end_open_stage);
            CTX.with(|c| c.set(DEAD));
            if let Some(p) = self.0.take() {
                // SAFETY: `p` comes from `Box::leak` in `register_inner`
                // and is stored here only, so it is a live allocation of
                // the global allocator with `ThreadCtx`'s layout, and
                // `take` makes this the only `Box::from_raw` of it. CTX
                // was set to DEAD just above, so no new reference to the
                // context can be made; the references made before do not
                // outlive this destructor (see `lookup`).
                let ctx = unsafe { Box::from_raw(p.as_ptr()) };
                if let Some(rt) = runtime::get() {
                    rt.writer.fold_and_free(ctx.slot);
                }
            }
        });
    }
}

/// Sentinel: this thread has no record (lost, exited, or exiting).
const DEAD: *const ThreadCtx = std::ptr::dangling::<ThreadCtx>();

thread_local! {
    /// The current thread's context: null before registration, [`DEAD`]
    /// when it has none, else the context that [`OWNER`] holds. Const, no
    /// destructor: readable during thread teardown.
    static CTX: Cell<*const ThreadCtx> = const { Cell::new(std::ptr::null()) };
    static OWNER: RefCell<Owner> = const { RefCell::new(Owner(None)) };
}

/// The three states of the current thread.
enum Lookup {
    /// Not registered yet.
    New,
    /// No record: lost, exiting or exited.
    Dead,
    /// Registered.
    Live(&'static ThreadCtx),
}

/// The current thread's state.
#[allow(unsafe_code)]
#[inline(always)]
fn lookup() -> Lookup {
    let p = CTX.with(|c| c.get());
    // One compare on the hot path: null and DEAD (the dangling address,
    // the type's alignment) are the two smallest values CTX can hold.
    if p.addr() <= DEAD.addr() {
        std::hint::cold_path();
        if p.is_null() {
            Lookup::New
        } else {
            Lookup::Dead
        }
    } else {
        // SAFETY: CTX is private to this module and set to a context in
        // one place only: `register_inner` stores the pointer that it
        // leaked from a box and handed to this thread's OWNER, and
        // `Owner::drop` stores DEAD before it frees the context. So a
        // pointer other than null and DEAD points to a live, initialised
        // `ThreadCtx`, and no `Box` or `&mut` to it exists meanwhile: the
        // context is only ever shared (its mutable state is in `Cell`s).
        // The reference stays on this thread: `ThreadCtx` is not `Sync`,
        // so `&ThreadCtx` is not `Send`, nor are the guards that hold it.
        //
        // The `'static` lifetime is the one thing the compiler does not
        // check: the reference must not be used after OWNER's destructor
        // freed the context. The client keeps none past a call; events in
        // flight live in the application's guards (`Active`), and every
        // guard's end asks [`can_end`] before it touches its context: a
        // guard dropped after OWNER's destructor (kept in a thread-local
        // whose destructor runs later, or in the tasks of a thread-local
        // executor) finds CTX DEAD and ends nothing.
        Lookup::Live(unsafe { &*p })
    }
}

/// The current thread's context, registering the thread on its first
/// event; `None` (counted as a lost event) if it has no record.
#[inline(always)]
pub(crate) fn current(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    match lookup() {
        Lookup::Live(ctx) => Some(ctx),
        Lookup::New => register_or_lose(rt),
        Lookup::Dead => {
            lose_event(rt);
            None
        }
    }
}

/// Counts one event of a thread without a record as lost
/// (`pfs_lost_total{kind="events_no_thread_record"}`), in the segment at
/// once: such a thread may never run the exit hook that a registered
/// thread runs. A shared-line RMW, on the path of threads that record
/// nothing anyway.
#[cold]
#[inline(never)]
fn lose_event(rt: &'static Runtime) {
    rt.writer.segment().count_lost(LostKind::Events);
}

/// [`register`] for an event: if the thread gets no record, the event
/// that tried is the thread's first lost one.
#[cold]
#[inline(never)]
fn register_or_lose(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    let ctx = register(rt);
    if ctx.is_none() {
        lose_event(rt);
    }
    ctx
}

/// The current thread's context, registering the thread if it is new,
/// for a call that is not an event (nothing is counted as lost).
pub(crate) fn own(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    match lookup() {
        Lookup::Live(ctx) => Some(ctx),
        Lookup::New => register(rt),
        Lookup::Dead => None,
    }
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
    match lookup() {
        Lookup::Live(ctx) => Some(f(ctx)),
        Lookup::New if !in_pfs() => reentrant(|| register(rt)).map(f),
        Lookup::New | Lookup::Dead => None,
    }
}

/// The current thread's context if it is registered and has its record
/// (never registers it): the memory hot path's one thread-local read.
#[inline(always)]
pub(crate) fn live() -> Option<&'static ThreadCtx> {
    match lookup() {
        Lookup::Live(ctx) => Some(ctx),
        Lookup::New | Lookup::Dead => None,
    }
}

/// Whether an event in flight on the current thread can still end: false
/// once the thread's context was freed at thread exit (or after a fork),
/// which happens to a guard kept in a thread-local whose destructor runs
/// after the registry's. Such an event is counted as lost
/// (`pfs_lost_total{kind="events_no_thread_record"}`) and must not touch
/// the context it holds. One thread-local load.
#[inline(always)]
pub(crate) fn can_end(rt: &'static Runtime) -> bool {
    if gone() {
        lose_event(rt);
        return false;
    }
    true
}

/// Whether the current thread has no record any more (or never got one):
/// lost, exited (its record folded by its thread-exit hook), or a forked
/// child's. Never registers it.
#[inline(always)]
pub(crate) fn gone() -> bool {
    matches!(lookup(), Lookup::Dead)
}

/// Runs `f` with the current thread's context if it is already
/// registered (never registers it).
#[inline(always)]
pub(crate) fn with_registered<R>(f: impl FnOnce(&'static ThreadCtx) -> R) -> Option<R> {
    match lookup() {
        Lookup::Live(ctx) => Some(f(ctx)),
        Lookup::New | Lookup::Dead => None,
    }
}

/// Runs in the child of a `fork` of an initialised process, on its only
/// thread (the forking one): the runtime and this thread's context are the
/// parent's, whose segment has one writer per record and one process
/// behind its lock, so the child records nothing. Only stores (no lock,
/// no allocation): the fork may have happened while another thread held
/// the allocator's or the writer's lock.
extern "C" fn forked_child() {
    runtime::mark_forked();
    // The context stays allocated: freeing it could take a lock held at
    // the fork. Its owner's destructor frees it at thread exit and, with no
    // runtime, folds nothing.
    let _ = CTX.try_with(|c| c.set(DEAD));
}

/// Gives the current thread's record back now (if it has one), and keeps
/// it without one for the rest of its life: for the library's own
/// threads, which are not the application's. Its events, if any, would be
/// counted as lost; its allocations go to the process's row.
pub(crate) fn renounce() {
    // Dropping the owner folds and frees the record and marks the thread
    // DEAD, as at thread exit.
    let owner = OWNER.try_with(|o| std::mem::replace(&mut *o.borrow_mut(), Owner(None)));
    drop(owner);
    let _ = CTX.try_with(|c| c.set(DEAD));
}

/// Makes a forked child of this process record nothing ([`forked_child`]).
/// Called once, when the runtime is created.
#[allow(unsafe_code)]
pub(crate) fn stop_in_forked_children() {
    // SAFETY: `forked_child` only stores an atomic and a const
    // thread-local, and makes one `mmap` (async-signal-safe): see it.
    if !unsafe { pfs_shm_layout::fork::on_fork_child(forked_child) } {
        tracing::warn!(
            "cannot register a fork handler: a process forked from this one without exec would write into this one's segment"
        );
    }
}

/// The `THREAD_ID` sequence, shared by threads and tasks.
static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

/// Task ids a thread takes from [`NEXT_THREAD_ID`] at a time, so that a
/// new task costs no shared write most of the time.
const TASK_ID_BLOCK: u64 = 64;

thread_local! {
    /// The next task id this thread hands out, and the end of its block.
    static TASK_IDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A new logical `THREAD_ID` for a task: from the sequence of the
/// threads' ids (so never equal to a thread's), in blocks per thread.
pub(crate) fn next_task_id() -> u64 {
    let from_block = TASK_IDS.try_with(|c| {
        let (next, end) = c.get();
        if next < end {
            c.set((next + 1, end));
            next
        } else {
            let base = NEXT_THREAD_ID.fetch_add(TASK_ID_BLOCK, Relaxed);
            c.set((base + 1, base + TASK_ID_BLOCK));
            base
        }
    });
    from_block.unwrap_or_else(|_| NEXT_THREAD_ID.fetch_add(1, Relaxed))
}

#[cold]
#[inline(never)]
fn register(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    let _no_cancel = runtime::NoCancel::new();
    reentrant(|| register_inner(rt))
}

fn register_inner(rt: &'static Runtime) -> Option<&'static ThreadCtx> {
    if rt.writer.segment().faulted() {
        // (A new thread records into zeros like the others: said once.)
        runtime::warn_faulted();
    }
    let thread_id = NEXT_THREAD_ID.fetch_add(1, Relaxed);
    let os_tid = rustix::thread::gettid().as_raw_nonzero().get() as u64;
    let name = thread_name().unwrap_or_else(|| format!("thread-{thread_id}"));
    let slot = match rt.writer.alloc_thread(thread_id, os_tid, &name) {
        Ok(slot) => slot,
        Err(e) => {
            warn_no_record(&e);
            CTX.with(|c| c.set(DEAD));
            return None;
        }
    };
    let ctx = Box::new(ThreadCtx::new(
        rt.writer.segment().record(slot.index),
        slot,
        thread_id,
        &rt.setup.memory_truncate_gen,
    ));
    // Not run if the thread is already being torn down: `ctx` is then
    // dropped with the closure.
    let installed = OWNER.try_with(|o| {
        let p = NonNull::from(Box::leak(ctx));
        o.borrow_mut().0 = Some(p);
        p
    });
    let Ok(p) = installed else {
        // Give the record back.
        rt.writer.fold_and_free(slot);
        CTX.with(|c| c.set(DEAD));
        return None;
    };
    CTX.with(|c| c.set(p.as_ptr()));
    with_registered(|ctx| ctx)
}

/// Logs, once per process and reason, why a thread got no record: its
/// events, and those of the threads that follow it while the cause lasts,
/// are lost (counted, which is what an operator sees; the log says it
/// where the application's own logs go).
#[cold]
fn warn_no_record(e: &NoRecord) {
    if matches!(e, NoRecord::Volume(pfs_shm_layout::SegmentError::Faulted)) {
        runtime::warn_faulted();
        return;
    }
    static WARNED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    let (i, advice) = match e {
        NoRecord::Full { .. } => (
            0,
            "counted in pfs_lost_total{kind=\"thread_instances\"}; raise PFS_MAX_THREADS",
        ),
        NoRecord::Volume(_) => (
            1,
            "counted in pfs_lost_total{kind=\"thread_instances\"} and {kind=\"container_pages\"}",
        ),
    };
    if !WARNED[i].swap(true, Relaxed) {
        warning::warn(
            &format!(
                "{e}: this thread records nothing, nor does any new thread while this lasts ({advice})"
            ),
            |m| tracing::warn!("{m}"),
        );
    }
}

/// The calling thread's name: its Rust name, else (a thread that C or
/// another runtime created, or an unnamed Rust thread) its OS name, as
/// `pthread_setname_np` or `prctl(PR_SET_NAME)` set it (or as it inherited
/// it from its creator). One `prctl` call, at registration only.
fn thread_name() -> Option<String> {
    if let Some(n) = std::thread::current().name() {
        return Some(n.to_owned());
    }
    let os = rustix::thread::name().ok()?;
    let os = os.to_string_lossy();
    (!os.is_empty()).then(|| os.into_owned())
}

/// See [`crate::set_thread_name`].
pub(crate) fn set_name(name: &str) -> bool {
    let Some(ctx) = runtime::get().and_then(own) else {
        return false;
    };
    ctx.rec.set_name(name);
    true
}

/// See [`crate::set_thread_actor`].
pub(crate) fn set_actor(user: &str, host: &str, role: &str) -> (bool, bool) {
    let Some(rt) = runtime::get() else {
        return (false, false);
    };
    let actors = read_actors(rt.writer.segment());
    let (instrumented, history) = match_actor(&actors, user, host, role);
    if let Some(ctx) = current(rt) {
        ctx.instrumented.set(instrumented);
        ctx.history.set(history);
        if ctx.in_task() {
            // The task's verdict travels with the task; the record's
            // actor columns are the polling thread's own.
            return (instrumented, history);
        }
        let id = |s: &str| rt.writer.intern(s).unwrap_or(NONE_U32);
        let flags = if instrumented { THREAD_INSTRUMENTED } else { 0 }
            | if history { THREAD_HISTORY } else { 0 };
        ctx.rec.set_actor(id(user), id(host), id(role), flags);
    }
    (instrumented, history)
}
