//! Layer 2. Memory accounting from C: memory classes and the
//! caller-owned `pfs_memory_t` token that remembers whether an
//! allocation was counted, so that its free is counted exactly then (the
//! MySQL manual's rule).

use std::ffi::c_char;

use pfs_client::MemoryToken;

use crate::classes::{self, pfs_memory_class_t};
use crate::shield::shield;
use crate::slot::{self, Owner, Slot};
use crate::text::str_in;

/// Size of `pfs_memory_t` in 64-bit words.
pub const PFS_MEMORY_WORDS: usize = 4;

/// One accounted allocation, owned by the caller (kept next to the
/// memory it describes, e.g. in a block header). Its content is private.
///
/// Threading: `pfs_memory_alloc` accounts to the calling thread;
/// `pfs_memory_free` may run on any thread, once (a second free of the
/// same struct is a no-op; do not free a copy as well). Ownership: the
/// caller owns the memory.
#[repr(C)]
pub struct pfs_memory_t {
    _opaque: [u64; PFS_MEMORY_WORDS],
}

const _: () = assert!(
    Slot::<MemoryToken>::fits(size_of::<pfs_memory_t>(), align_of::<pfs_memory_t>()),
    "pfs_memory_t is too small for a MemoryToken: raise PFS_MEMORY_WORDS (an ABI change)"
);

/// Registers (or finds) the memory instrument `name`
/// (`memory/<area>/<name>`). Returns a handle valid for the life of the
/// process, or NULL if `name` is NULL, not UTF-8 or not a memory name.
/// May be called before `pfs_init`.
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
pub unsafe extern "C" fn pfs_memory_class_register(
    name: *const c_char,
) -> *const pfs_memory_class_t {
    shield(std::ptr::null(), || {
        // SAFETY: `name` is null or a valid C string (contract).
        let name = unsafe { str_in(name) };
        name.and_then(classes::memory)
            .map_or(std::ptr::null(), |h| h as *const _)
    })
}

/// Accounts an allocation of `size` bytes by the calling thread to `cls`
/// (`COUNT_ALLOC`, `CURRENT_NUMBER_OF_BYTES_USED`, ...), if both the
/// thread and the instrument are enabled, and stores in `token` whether it
/// was counted. Returns true if it was. No lock, no allocation.
///
/// # Safety
///
/// `token` is NULL or points to a writable `pfs_memory_t` that no other
/// thread uses during the call; `cls` is NULL or a handle from
/// `pfs_memory_class_register`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_memory_alloc(
    token: *mut pfs_memory_t,
    cls: *const pfs_memory_class_t,
    size: u64,
) -> bool {
    shield(false, || {
        // (Not after a failed ABI check: nothing counted, nothing touched.)
        if token.is_null() || !slot::usable() {
            return false;
        }
        let slot = token.cast::<Slot<MemoryToken>>();
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        let Some(c) = (unsafe { cls.as_ref() }) else {
            // SAFETY: `token` is non-null, writable and ours (contract).
            unsafe { slot::clear(slot) };
            return false;
        };
        let t = c.0.alloc(size);
        let counted = t.counted();
        // SAFETY: as above; a pfs_memory_t holds a slot (checked at
        // compile time above).
        unsafe { slot::put(slot, Owner::ANY, t) };
        counted
    })
}

/// Accounts the free of the allocation recorded in `token`, against its
/// class and by the calling thread, exactly if the allocation was counted;
/// then empties the token. No lock, no allocation.
///
/// # Safety
///
/// `token` is NULL or points to a `pfs_memory_t` filled by
/// `pfs_memory_alloc`, that no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_memory_free(token: *mut pfs_memory_t) {
    shield((), || {
        if !token.is_null() {
            // SAFETY: `token` was filled by pfs_memory_alloc (contract).
            unsafe { slot::take(token.cast::<Slot<MemoryToken>>(), Owner::ANY, |_| {}) }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    #[test]
    fn null_and_uninitialised_are_no_ops() {
        // SAFETY: null pointers, a local token and static C literals.
        unsafe {
            assert!(pfs_memory_class_register(c"wait/x".as_ptr()).is_null());
            let cls = pfs_memory_class_register(c"memory/c/buf".as_ptr());
            let mut t = MaybeUninit::<pfs_memory_t>::uninit();
            assert!(!pfs_memory_alloc(t.as_mut_ptr(), cls, 64));
            pfs_memory_free(t.as_mut_ptr());
            pfs_memory_free(t.as_mut_ptr());
            assert!(!pfs_memory_alloc(std::ptr::null_mut(), cls, 64));
            assert!(!pfs_memory_alloc(t.as_mut_ptr(), std::ptr::null(), 64));
            pfs_memory_free(t.as_mut_ptr());
        }
    }
}
