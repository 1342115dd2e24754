//! Layer 2. The calling thread from C: the actor it works for
//! (`setup_actors`), its name in the `threads` table, its `THREAD_ID`,
//! and its open statement's `EVENT_ID`.

use std::ffi::c_char;

use crate::codes::{
    PFS_ERR_FORKED, PFS_ERR_INTERNAL, PFS_ERR_INVALID_ARGUMENT, PFS_ERR_NO_THREAD_RECORD,
    PFS_ERR_NOT_INITIALIZED, PFS_OK,
};
use crate::shield::shield;
use crate::text::str_in;

/// `pfs_set_thread_actor` result bit: the thread is `INSTRUMENTED`.
pub const PFS_ACTOR_INSTRUMENTED: i32 = 1;
/// `pfs_set_thread_actor` result bit: its events go to the history tables.
pub const PFS_ACTOR_HISTORY: i32 = 2;

/// Declares who the calling thread works for: `setup_actors` decides, by
/// its most specific matching row, whether the thread is instrumented and
/// whether its events go to the history tables. Returns the verdict as
/// `PFS_ACTOR_*` bits (0 before `pfs_init`), or
/// `PFS_ERR_INVALID_ARGUMENT` if a string is NULL or not UTF-8, or
/// `PFS_ERR_INTERNAL` (a library bug: nothing was set).
///
/// Threading: acts on the calling thread only; takes the writer's lock to
/// intern the strings (call it when a session starts, not per event).
/// Ownership: the strings are copied.
///
/// # Safety
///
/// Each argument is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_set_thread_actor(
    user: *const c_char,
    host: *const c_char,
    role: *const c_char,
) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: each is null or a valid C string (contract), read now.
        let (u, h, r) = unsafe { (str_in(user), str_in(host), str_in(role)) };
        let (Some(u), Some(h), Some(r)) = (u, h, r) else {
            return PFS_ERR_INVALID_ARGUMENT;
        };
        let (instrumented, history) = pfs_client::set_thread_actor(u, h, r);
        i32::from(instrumented) * PFS_ACTOR_INSTRUMENTED + i32::from(history) * PFS_ACTOR_HISTORY
    })
}

/// Names the calling thread's row in the `threads` table (`NAME`),
/// registering the thread if it has no record yet. Without it a thread's
/// row is named, when the thread registers (its first event), by its OS
/// name as `pthread_setname_np` set it (threads created in C inherit
/// their creator's, the executable's by default). `name` is cut to 32
/// bytes on a character boundary.
///
/// Returns `PFS_OK`, `PFS_ERR_INVALID_ARGUMENT` (`name` NULL, empty or
/// not UTF-8), `PFS_ERR_NOT_INITIALIZED` (before `pfs_init`, or after it
/// failed: nothing to name), `PFS_ERR_FORKED` (in a child made by `fork`
/// of an initialised process: the segment is the parent's),
/// `PFS_ERR_NO_THREAD_RECORD` (the thread container is full) or
/// `PFS_ERR_INTERNAL`.
///
/// Threading: acts on the calling thread only; takes the writer's lock
/// the first time a thread is registered. Ownership: `name` is copied.
///
/// # Safety
///
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_set_thread_name(name: *const c_char) -> i32 {
    shield(PFS_ERR_INTERNAL, || {
        // SAFETY: `name` is null or a valid C string (contract), read now.
        let Some(name) = (unsafe { str_in(name) }).filter(|n| !n.is_empty()) else {
            return PFS_ERR_INVALID_ARGUMENT;
        };
        if pfs_client::is_forked_child() {
            return PFS_ERR_FORKED; // the parent's segment: not this process's
        }
        if pfs_client::segment_path().is_none() {
            return PFS_ERR_NOT_INITIALIZED;
        }
        if pfs_client::set_thread_name(name) {
            PFS_OK
        } else {
            PFS_ERR_NO_THREAD_RECORD
        }
    })
}

/// The `THREAD_ID` under which the calling thread's events appear in the
/// tables (registering the thread if it has no record yet, so that it is
/// in the `threads` table from now on); 0 before `pfs_init`, or if the
/// thread could not get a record (the thread container is full). For log
/// lines an operator can match with the tables.
///
/// Threading: the calling thread only. Takes the writer's lock the first
/// time a thread is registered; no allocation afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_thread_id() -> u64 {
    shield(0, || pfs_client::thread_id().unwrap_or(0))
}

/// The `EVENT_ID` of the innermost statement open on the calling thread:
/// with `pfs_thread_id`, the key of its row in `events_statements_current`
/// and, once it ends, in the history tables. 0 if no statement is open (or
/// before `pfs_init`). No lock, no allocation.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_statement_event_id() -> u64 {
    shield(0, || pfs_client::statement_event_id().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_strings_are_an_error() {
        // SAFETY: null pointers and static C literals.
        unsafe {
            assert_eq!(
                pfs_set_thread_actor(c"u".as_ptr(), std::ptr::null(), c"r".as_ptr()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                pfs_set_thread_actor(c"u".as_ptr(), c"h\xff".as_ptr(), c"r".as_ptr()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                pfs_set_thread_actor(c"u".as_ptr(), c"h".as_ptr(), c"%".as_ptr()),
                0
            );
            assert_eq!(
                pfs_set_thread_name(std::ptr::null()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(pfs_set_thread_name(c"".as_ptr()), PFS_ERR_INVALID_ARGUMENT);
            assert_eq!(
                pfs_set_thread_name(c"w\xff".as_ptr()),
                PFS_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                pfs_set_thread_name(c"worker".as_ptr()),
                PFS_ERR_NOT_INITIALIZED
            );
        }
    }
}
