//! Layer 2. Stages from C: the phases of a statement. Entering a stage
//! ends the calling thread's previous one; the open stage ends with its
//! statement or with `pfs_stage_end`.

use std::ffi::c_char;

use crate::classes::{self, pfs_stage_class_t};
use crate::shield::shield;
use crate::site::{pfs_site_t, site_in};
use crate::slot;
use crate::text::str_in;

/// Registers (or finds) the stage instrument `name` (`stage/<area>/<name>`).
/// Returns a handle valid for the life of the process, or NULL if `name`
/// is NULL, not UTF-8 or not a stage name. May be called before
/// `pfs_init`.
///
/// Threading: any thread, before `pfs_init` too, and in a process that
/// forks meanwhile: takes no lock (a lock-free list), but allocates (call
/// it at startup, not per event). The instrument enters the segment at
/// its first event after `pfs_init`, once, under the library's lock.
/// Ownership: `name` is copied.
///
/// # Safety
///
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_stage_class_register(name: *const c_char) -> *const pfs_stage_class_t {
    shield(std::ptr::null(), || {
        // SAFETY: `name` is null or a valid C string (contract).
        let name = unsafe { str_in(name) };
        name.and_then(classes::stage)
            .map_or(std::ptr::null(), |h| h as *const _)
    })
}

/// Enters stage `cls` on the calling thread: ends the thread's open stage,
/// if any, and starts this one, nested in the thread's open statement. A
/// disabled (or NULL) class still ends the previous stage, as in PFS. No
/// lock, no allocation. Records no `SOURCE`: prefer `PFS_STAGE_ENTER`,
/// which records the caller's `file:line` (`pfs_stage_enter_at`).
///
/// Threading: acts on the calling thread only.
///
/// # Safety
///
/// `cls` is NULL or a handle from `pfs_stage_class_register`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_stage_enter(cls: *const pfs_stage_class_t) {
    // SAFETY: the caller's contract, and no site.
    unsafe { enter(cls, std::ptr::null()) }
}

/// `pfs_stage_enter`, with `SOURCE` the call site `site` (none if NULL).
/// Called by `PFS_STAGE_ENTER(cls)`, which declares the site: use the
/// macro.
///
/// # Safety
///
/// As `pfs_stage_enter`; `site` as in `pfs_wait_begin_at`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_stage_enter_at(
    cls: *const pfs_stage_class_t,
    site: *const pfs_site_t,
) {
    // SAFETY: the caller's contract.
    unsafe { enter(cls, site) }
}

/// `pfs_stage_enter_at`, inlined into both entry points.
///
/// # Safety
///
/// As `pfs_stage_enter_at`.
#[inline(always)]
unsafe fn enter(cls: *const pfs_stage_class_t, site: *const pfs_site_t) {
    shield((), || {
        // After a failed ABI check the program runs uninstrumented.
        if !slot::usable() {
            return;
        }
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        match unsafe { cls.as_ref() } {
            // SAFETY: `site` is null or a static site (contract).
            Some(c) => c.0.get().enter_at(unsafe { site_in(site) }),
            None => pfs_client::end_stage(),
        }
    })
}

/// Reports the open stage's progress (`WORK_COMPLETED`, `WORK_ESTIMATED`
/// in `events_stages_current`). Calling thread only; no-op without an
/// open stage.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_stage_progress(completed: u64, estimated: u64) {
    shield((), || {
        if slot::usable() {
            pfs_client::stage_progress(completed, estimated)
        }
    })
}

/// Ends the calling thread's open stage, if any.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_stage_end() {
    shield((), || {
        if slot::usable() {
            pfs_client::end_stage()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_uninitialised_are_no_ops() {
        // SAFETY: null pointers and static C literals.
        unsafe {
            assert!(pfs_stage_class_register(c"wait/x/y".as_ptr()).is_null());
            let s = pfs_stage_class_register(c"stage/c/parsing".as_ptr());
            assert!(!s.is_null());
            pfs_stage_enter(s);
            pfs_stage_progress(1, 2);
            pfs_stage_enter(std::ptr::null());
            pfs_stage_end();
        }
    }
}
