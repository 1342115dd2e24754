//! Layer 2. Async tasks from C: `pfs_task_t`, a logical thread of its own
//! for a computation that is suspended and resumed, possibly on another
//! thread each time (a C++20 coroutine, a Python asyncio task, a state
//! machine driven by an event loop). Entered around each resume, it makes
//! what the calling thread records meanwhile (stages, waits) the task's,
//! nested in the task's own statement, under the task's `THREAD_ID`, as
//! `pfs_client::task` does for a Rust future (see docs/ASYNC.md).
//!
//! The task and its statement live in memory the library allocates
//! (`pfs_task_new`): a task's statement outlives the resume that began it,
//! so it cannot be in a caller's stack frame, and it is larger than
//! `pfs_statement_t`.

use std::ffi::c_char;

use pfs_client::TaskStatement;
use pfs_client::task::TaskContext;

use crate::classes::pfs_statement_class_t;
use crate::codes::{
    PFS_ERR_INTERNAL, PFS_ERR_INVALID_ARGUMENT, PFS_ERR_TASK_NOT_HERE, PFS_ERR_TASK_NOT_INNERMOST,
    PFS_OK,
};
use crate::shield::shield;
use crate::site::{pfs_site_t, site_in};
use crate::slot;
use crate::text::prefix_in;

/// An async task's event context, made by `pfs_task_new` and freed by
/// `pfs_task_free`. Opaque.
///
/// Enter it (`pfs_task_enter`) each time the task resumes and exit it
/// (`pfs_task_exit`, on the same thread) before it suspends: meanwhile the
/// thread's stages and waits are the task's, nested in the statement the
/// task has open (`pfs_task_statement_begin`), and its `THREAD_ID` is the
/// task's own. `CPU_TIME` of the task's statement is the time it was
/// entered.
///
/// Threading: one thread at a time, the one resuming the task; it may
/// move to another thread between an exit and the next enter. A wait
/// (`pfs_wait_t`) or a thread's statement (`pfs_statement_t`) begun while
/// it is entered ends before its exit (they belong to the OS thread); the
/// task's open stage is the task's and stays open across resumes. Enters
/// of different tasks on one thread are exited in reverse order.
pub struct pfs_task_t {
    _opaque: [u8; 0],
}

/// What a `pfs_task_t` points to.
struct CTask {
    ctx: TaskContext,
    stmt: Option<TaskStatement>,
}

/// The most nested enters `pfs_task_free` undoes.
const MAX_DEPTH: usize = 64;

/// The task `t` points to.
///
/// # Safety
///
/// `t` is NULL or a task from `pfs_task_new`, not freed, that no other
/// thread uses during the call.
unsafe fn task_in<'a>(t: *mut pfs_task_t) -> Option<&'a mut CTask> {
    // SAFETY: by the contract, a non-null `t` is the `Box<CTask>` that
    // `pfs_task_new` leaked, alive and used only by this thread now.
    unsafe { t.cast::<CTask>().as_mut() }
}

/// A new task, with no statement open; NULL after a failed
/// `pfs_check_abi` (then the calls that return a code return
/// `PFS_ERR_INVALID_ARGUMENT` for it, the others do nothing). May be
/// called before `pfs_init` (its events are then not recorded).
/// Allocates.
///
/// Ownership: the caller owns it and frees it with `pfs_task_free`.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_task_new() -> *mut pfs_task_t {
    shield(std::ptr::null_mut(), || {
        if !slot::usable() {
            return std::ptr::null_mut();
        }
        let task = Box::new(CTask {
            ctx: TaskContext::new(),
            stmt: None,
        });
        Box::into_raw(task).cast()
    })
}

/// Frees `task`, ending what it has open inside it, as a Rust task's
/// future dropped before it completed: its statement, recorded as
/// cancelled (`COUNT_CANCELLED`), and its open stage. If the calling
/// thread has it entered (the innermost task entered there), it is exited
/// first. A task entered here under another task still entered, or
/// entered on another thread, is not freed (nothing is done: its memory
/// is kept; exit the other task first). NULL: a no-op.
///
/// # Safety
///
/// `task` is NULL or from `pfs_task_new`, not freed, and not entered on
/// another thread; not used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_free(task: *mut pfs_task_t) {
    shield((), || {
        // SAFETY: the caller's contract. Worked on in place, and the box
        // taken back only at the end: a panic before leaks it rather than
        // drop a context the thread may still have swapped in.
        let Some(t) = (unsafe { task_in(task) }) else {
            return;
        };
        if t.ctx.is_entered() && !t.ctx.is_entered_here() {
            // Entered on another thread, against the contract: that thread
            // keeps its own state in this context, which must then outlive
            // the call; and nothing of it is ended from here.
            return;
        }
        if t.ctx.is_entered_here() && !t.ctx.is_innermost_here() {
            // Entered here under another task still entered, against the
            // contract: the thread's state is kept in that one, so nothing
            // can be ended or left from here; kept, as above.
            return;
        }
        let stmt = t.stmt.take();
        t.ctx.cancel_with(|| {
            drop(stmt);
            pfs_client::end_stage();
        });
        for _ in 0..MAX_DEPTH {
            if !t.ctx.is_entered_here() {
                break;
            }
            t.ctx.swap_out();
        }
        if t.ctx.is_entered() {
            // Still entered (deeper than any real nesting): kept, as above.
            return;
        }
        // SAFETY: `task` is the leaked box of `pfs_task_new`, not freed,
        // and the caller gives it up (contract); nothing refers to it now.
        drop(unsafe { Box::from_raw(task.cast::<CTask>()) });
    })
}

/// Makes `task` the calling thread's until the matching `pfs_task_exit`:
/// call it when the task resumes. Enters nest on one thread (only the
/// outermost pair switches). Returns `PFS_OK`;
/// `PFS_ERR_TASK_NOT_HERE` if the task is entered on another thread at the
/// time (not entered here: the calling thread records on its own; an exit
/// missing there, or a resume racing with the suspend);
/// `PFS_ERR_INVALID_ARGUMENT` for NULL. After a failed `pfs_check_abi`, a
/// no-op.
///
/// # Safety
///
/// `task` is NULL or from `pfs_task_new`, not freed, not used by another
/// thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_enter(task: *mut pfs_task_t) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        match unsafe { task_in(task) } {
            None => PFS_ERR_INVALID_ARGUMENT,
            Some(_) if !slot::usable() => PFS_OK,
            Some(t) if t.ctx.is_entered() && !t.ctx.is_entered_here() => PFS_ERR_TASK_NOT_HERE,
            Some(t) => {
                t.ctx.swap_in();
                PFS_OK
            }
        }
    })
}

/// Undoes `pfs_task_enter`, on the thread that entered it: call it before
/// the task suspends (before another thread may resume it). Returns
/// `PFS_OK` (also for a task not entered anywhere);
/// `PFS_ERR_TASK_NOT_HERE` on a thread other than the one that entered
/// it (nothing done); `PFS_ERR_TASK_NOT_INNERMOST` for the last exit of a
/// task entered under another task still entered here (nothing done:
/// exit that one first); `PFS_ERR_INVALID_ARGUMENT` for NULL.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_exit(task: *mut pfs_task_t) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        match unsafe { task_in(task) } {
            None => PFS_ERR_INVALID_ARGUMENT,
            Some(t) if t.ctx.is_entered() && !t.ctx.is_entered_here() => PFS_ERR_TASK_NOT_HERE,
            Some(t) => {
                if t.ctx.swap_out() {
                    PFS_OK
                } else {
                    PFS_ERR_TASK_NOT_INNERMOST
                }
            }
        }
    })
}

/// Starts the task's statement, of class `cls`, while the task is entered
/// on the calling thread: its `THREAD_ID` is the task's, and what the task
/// records until its end (on any resume, on any thread) nests in it.
/// `TIMER_WAIT` is wall time; `CPU_TIME` the time the task was entered.
/// One statement per task at a time. Records no `SOURCE`: prefer
/// `PFS_TASK_STATEMENT_BEGIN` (which discards the code: call
/// `pfs_task_statement_begin_at` to see it). A disabled or NULL class, or
/// no `pfs_init`: nothing is recorded, and the calls on it are no-ops.
/// Returns `PFS_OK`; `PFS_ERR_TASK_NOT_HERE` if the task is not entered on
/// the calling thread (nothing started: it would be the thread's);
/// `PFS_ERR_INVALID_ARGUMENT` if `task` is NULL or already has a
/// statement open.
///
/// # Safety
///
/// `task` as in `pfs_task_enter`; `cls` is NULL or a handle from
/// `pfs_statement_class_register`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_begin(
    task: *mut pfs_task_t,
    cls: *const pfs_statement_class_t,
) -> i32 {
    // SAFETY: the caller's contract, and no site.
    unsafe { begin(task, cls, std::ptr::null()) }
}

/// `pfs_task_statement_begin`, with `SOURCE` the call site `site` (none
/// if NULL). Called by `PFS_TASK_STATEMENT_BEGIN(task, cls)`, which
/// declares the site: use the macro.
///
/// # Safety
///
/// As `pfs_task_statement_begin`; `site` as in `pfs_wait_begin_at`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_begin_at(
    task: *mut pfs_task_t,
    cls: *const pfs_statement_class_t,
    site: *const pfs_site_t,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { begin(task, cls, site) }
}

/// `pfs_task_statement_begin_at`, inlined into both entry points.
///
/// # Safety
///
/// As `pfs_task_statement_begin_at`.
#[inline(always)]
unsafe fn begin(
    task: *mut pfs_task_t,
    cls: *const pfs_statement_class_t,
    site: *const pfs_site_t,
) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        let Some(t) = (unsafe { task_in(task) }) else {
            return PFS_ERR_INVALID_ARGUMENT;
        };
        if t.stmt.as_ref().is_some_and(TaskStatement::is_recording) {
            return PFS_ERR_INVALID_ARGUMENT;
        }
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        let class = unsafe { cls.as_ref() }.map(|c| c.0.get());
        let Some(class) = class.filter(|c| c.is_enabled() && slot::usable()) else {
            t.stmt = None;
            return PFS_OK;
        };
        if !t.ctx.is_entered_here() {
            return PFS_ERR_TASK_NOT_HERE;
        }
        // SAFETY: `site` is null or a static site (contract).
        t.stmt = Some(class.start_task_at(unsafe { site_in(site) }));
        PFS_OK
    })
}

/// Ends the task's statement now, inside the task (its open stage ends
/// with it): entered here, or not entered anywhere (then entered for the
/// end only, which is not counted in `CPU_TIME`: e.g. from a completion
/// callback after the task's last resume). Returns `PFS_OK` (also if no
/// statement is open); `PFS_ERR_TASK_NOT_HERE` if the task is entered on
/// another thread (nothing done); `PFS_ERR_INVALID_ARGUMENT` for NULL.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_end(task: *mut pfs_task_t) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: the caller's contract.
        match unsafe { task_in(task) } {
            None => PFS_ERR_INVALID_ARGUMENT,
            Some(t) if t.ctx.is_entered_here() => {
                drop(t.stmt.take());
                PFS_OK
            }
            Some(t) if t.ctx.is_entered() => PFS_ERR_TASK_NOT_HERE,
            Some(t) => {
                let stmt = t.stmt.take();
                t.ctx.swap_in_unmeasured();
                drop(stmt);
                t.ctx.swap_out();
                PFS_OK
            }
        }
    })
}

/// Runs `f` on the task's open statement, if any.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[inline(always)]
unsafe fn with(task: *mut pfs_task_t, f: impl FnOnce(&mut TaskStatement)) {
    shield((), || {
        // SAFETY: the caller's contract.
        if let Some(s) = unsafe { task_in(task) }.and_then(|t| t.stmt.as_mut()) {
            f(s);
        }
    })
}

/// `SQL_TEXT` of the task's statement (as `pfs_statement_set_text`).
///
/// # Safety
///
/// `task` as in `pfs_task_enter`; `text` is NULL or a NUL-terminated
/// string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_set_text(task: *mut pfs_task_t, text: *const c_char) {
    // SAFETY: `text` is null or a valid C string (contract), read now.
    let Some(text) = (unsafe { prefix_in(text) }) else {
        return; // NULL: a no-op (not the text or digest of "")
    };
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.set_text(text)) }
}

/// `DIGEST` of the task's statement (as `pfs_statement_set_digest_text`).
///
/// # Safety
///
/// As `pfs_task_statement_set_text`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_set_digest_text(
    task: *mut pfs_task_t,
    digest_text: *const c_char,
) {
    // SAFETY: `digest_text` is null or a valid C string (contract).
    let Some(text) = (unsafe { prefix_in(digest_text) }) else {
        return; // NULL: a no-op (not the text or digest of "")
    };
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.set_digest_text(text)) }
}

/// `ROWS_SENT` of the task's statement.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_set_rows_sent(task: *mut pfs_task_t, n: u64) {
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.set_rows_sent(n)) }
}

/// `ROWS_AFFECTED` of the task's statement.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_set_rows_affected(task: *mut pfs_task_t, n: u64) {
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.set_rows_affected(n)) }
}

/// `ROWS_EXAMINED` of the task's statement.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_set_rows_examined(task: *mut pfs_task_t, n: u64) {
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.set_rows_examined(n)) }
}

/// Adds `n` to `ERRORS` of the task's statement (saturating).
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_add_errors(task: *mut pfs_task_t, n: u64) {
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.add_errors(n)) }
}

/// Adds `n` to `WARNINGS` of the task's statement (saturating).
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_add_warnings(task: *mut pfs_task_t, n: u64) {
    // SAFETY: the caller's contract.
    unsafe { with(task, |s| s.add_warnings(n)) }
}

/// The task's `THREAD_ID` (the key of its events in the tables), 0 before
/// it was first entered after `pfs_init`, or for NULL. Read it on the
/// thread that has it entered, or while it is not entered.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_thread_id(task: *mut pfs_task_t) -> u64 {
    shield(0, || {
        // SAFETY: the caller's contract.
        unsafe { task_in(task) }.map_or(0, |t| t.ctx.thread_id())
    })
}

/// Records the task's statement as cancelled when it ends
/// (`COUNT_CANCELLED`, not an error), for a task stopped before it
/// completed (an asyncio `CancelledError`, a coroutine destroyed early)
/// whose statement is then ended normally.
///
/// # Safety
///
/// As `pfs_task_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_task_statement_mark_cancelled(task: *mut pfs_task_t) {
    // SAFETY: the caller's contract.
    unsafe { with(task, TaskStatement::mark_cancelled) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_tasks_are_refused_or_ignored() {
        // SAFETY: NULL is allowed everywhere.
        unsafe {
            assert_eq!(
                pfs_task_enter(std::ptr::null_mut()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                pfs_task_exit(std::ptr::null_mut()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                pfs_task_statement_begin(std::ptr::null_mut(), std::ptr::null()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                pfs_task_statement_end(std::ptr::null_mut()),
                PFS_ERR_INVALID_ARGUMENT
            );
            pfs_task_statement_add_errors(std::ptr::null_mut(), 1);
            pfs_task_free(std::ptr::null_mut());
        }
    }

    #[test]
    fn a_task_without_init_is_entered_and_freed() {
        let t = pfs_task_new();
        assert!(!t.is_null());
        // SAFETY: `t` is a live task, used by this thread only.
        unsafe {
            assert_eq!(pfs_task_enter(t), PFS_OK);
            assert_eq!(pfs_task_statement_begin(t, std::ptr::null()), PFS_OK);
            pfs_task_statement_set_rows_sent(t, 3);
            assert_eq!(pfs_task_statement_end(t), PFS_OK);
            // Freed while entered: exited first.
            pfs_task_free(t);
        }
    }
}
