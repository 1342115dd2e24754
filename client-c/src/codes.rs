//! Layer 0. The error codes the API returns (`PFS_OK`, `PFS_ERR_*`) and
//! their messages (`pfs_strerror`).

use std::ffi::{CStr, c_char};

/// Success.
pub const PFS_OK: i32 = 0;
/// A required pointer was NULL, a string was not UTF-8 (or was empty
/// where a name is needed), a rule string did not parse or named no
/// consumer, or a `pfs_config_t` field is out of range or has unknown
/// `flags` bits.
pub const PFS_ERR_INVALID_ARGUMENT: i32 = -1;
/// This process already initialised instrumentation.
pub const PFS_ERR_ALREADY_INITIALIZED: i32 = -2;
/// A `PFS_*` environment variable has a value that cannot be used
/// (`pfs_init` only).
pub const PFS_ERR_BAD_ENV: i32 = -3;
/// The segment directory is world-writable.
pub const PFS_ERR_WORLD_WRITABLE: i32 = -4;
/// A running process holds the segment file.
pub const PFS_ERR_IN_USE: i32 = -5;
/// A filesystem call failed (directory, file, lock).
pub const PFS_ERR_IO: i32 = -6;
/// The segment could not be laid out or reserved (too large for the
/// memory or the volume).
pub const PFS_ERR_SEGMENT: i32 = -7;
/// An internal error (a bug in the library, caught at its boundary): the
/// call did nothing. Any function returning a code may return it.
pub const PFS_ERR_INTERNAL: i32 = -8;
/// This process was forked (without `exec`) from one that initialised
/// instrumentation: a forked child records nothing; initialise in each
/// worker after forking instead of in the parent.
pub const PFS_ERR_FORKED: i32 = -9;
/// The program was compiled with a `pfs.h` of another ABI than this
/// `libpfs` (`pfs_check_abi`); initialisation is then refused.
pub const PFS_ERR_ABI_MISMATCH: i32 = -10;
/// Instrumentation is not initialised (no successful `pfs_init*`).
pub const PFS_ERR_NOT_INITIALIZED: i32 = -11;
/// The calling thread has no record: the thread container is full
/// (`max_threads`), so its events are counted as lost.
pub const PFS_ERR_NO_THREAD_RECORD: i32 = -12;
/// The task (`pfs_task_t`) is entered on another thread, or not entered
/// on the calling thread where the call needs it.
pub const PFS_ERR_TASK_NOT_HERE: i32 = -13;
/// The task is entered on the calling thread under another task entered
/// after it and still entered: exit that one first (tasks entered on one
/// thread are exited in reverse order).
pub const PFS_ERR_TASK_NOT_INNERMOST: i32 = -14;

/// The message of `code`.
fn message(code: i32) -> &'static CStr {
    match code {
        PFS_OK => c"success",
        PFS_ERR_INVALID_ARGUMENT => c"invalid argument",
        PFS_ERR_ALREADY_INITIALIZED => c"already initialised",
        PFS_ERR_BAD_ENV => c"invalid PFS_* environment variable",
        PFS_ERR_WORLD_WRITABLE => c"segment directory is world-writable",
        PFS_ERR_IN_USE => c"segment file held by a running process",
        PFS_ERR_IO => c"filesystem error",
        PFS_ERR_SEGMENT => c"segment cannot be created",
        PFS_ERR_INTERNAL => c"internal error",
        PFS_ERR_FORKED => c"forked child of an initialised process",
        PFS_ERR_ABI_MISMATCH => c"pfs.h does not match libpfs",
        PFS_ERR_NOT_INITIALIZED => c"not initialised",
        PFS_ERR_NO_THREAD_RECORD => c"thread has no record (thread container full)",
        PFS_ERR_TASK_NOT_HERE => c"task not entered on this thread",
        PFS_ERR_TASK_NOT_INNERMOST => c"task entered under another task: exit that one first",
        _ => c"unknown pfs error code",
    }
}

/// A short static description of `code` (`PFS_OK` or a `PFS_ERR_*`;
/// "unknown pfs error code" for any other value). Never NULL; the string
/// lives as long as the process and must not be freed. The details of a
/// failed initialisation are in `pfs_init_error`.
///
/// Threading: any thread, any time (before `pfs_init` too); no lock, no
/// allocation.
#[unsafe(no_mangle)]
pub extern "C" fn pfs_strerror(code: i32) -> *const c_char {
    // A match on constants: nothing here can panic, so no shield.
    message(code).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_own_message() {
        let codes = [
            PFS_OK,
            PFS_ERR_INVALID_ARGUMENT,
            PFS_ERR_ALREADY_INITIALIZED,
            PFS_ERR_BAD_ENV,
            PFS_ERR_WORLD_WRITABLE,
            PFS_ERR_IN_USE,
            PFS_ERR_IO,
            PFS_ERR_SEGMENT,
            PFS_ERR_INTERNAL,
            PFS_ERR_FORKED,
            PFS_ERR_ABI_MISMATCH,
            PFS_ERR_NOT_INITIALIZED,
            PFS_ERR_NO_THREAD_RECORD,
            PFS_ERR_TASK_NOT_HERE,
            PFS_ERR_TASK_NOT_INNERMOST,
        ];
        let unknown = message(1);
        let mut seen = std::collections::BTreeSet::new();
        for (i, &c) in codes.iter().enumerate() {
            assert_eq!(c, -(i as i32), "codes are 0, -1, -2, ... in order");
            assert_ne!(message(c), unknown, "code {c}");
            assert!(seen.insert(message(c)), "code {c}'s message is its own");
        }
        // SAFETY: pfs_strerror returns a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(pfs_strerror(-999)) };
        assert_eq!(s, c"unknown pfs error code");
    }
}
