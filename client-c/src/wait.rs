//! Layer 2. Timed waits from C: wait classes, the caller-owned
//! `pfs_wait_t`, begin and end, and the `PFS_OP_*` operation codes.

use std::ffi::c_char;

use pfs_client::{ObjectName, Operation, WaitGuard};

use crate::classes::{self, pfs_wait_class_t};
use crate::shield::shield;
use crate::site::{pfs_site_t, site_in};
use crate::slot::{self, Owner, Slot};
use crate::text::str_in;

/// `OPERATION` `lock` (mutex).
pub const PFS_OP_LOCK: u32 = 1;
/// `try_lock`.
pub const PFS_OP_TRY_LOCK: u32 = 2;
/// `read_lock` (rwlock).
pub const PFS_OP_READ_LOCK: u32 = 3;
/// `write_lock`.
pub const PFS_OP_WRITE_LOCK: u32 = 4;
/// `try_read_lock`.
pub const PFS_OP_TRY_READ_LOCK: u32 = 5;
/// `try_write_lock`.
pub const PFS_OP_TRY_WRITE_LOCK: u32 = 6;
/// `wait` (condition variable).
pub const PFS_OP_WAIT: u32 = 7;
/// `timed_wait`.
pub const PFS_OP_TIMED_WAIT: u32 = 8;
/// `create` (file).
pub const PFS_OP_CREATE: u32 = 9;
/// `open`.
pub const PFS_OP_OPEN: u32 = 10;
/// `close`.
pub const PFS_OP_CLOSE: u32 = 11;
/// `read`.
pub const PFS_OP_READ: u32 = 12;
/// `write`.
pub const PFS_OP_WRITE: u32 = 13;
/// `seek`.
pub const PFS_OP_SEEK: u32 = 14;
/// `sync`.
pub const PFS_OP_SYNC: u32 = 15;
/// `stat`.
pub const PFS_OP_STAT: u32 = 16;
/// `delete`.
pub const PFS_OP_DELETE: u32 = 17;
/// `rename`.
pub const PFS_OP_RENAME: u32 = 18;
/// `chsize`.
pub const PFS_OP_CHSIZE: u32 = 19;
/// `connect` (socket).
pub const PFS_OP_CONNECT: u32 = 20;
/// `accept`.
pub const PFS_OP_ACCEPT: u32 = 21;
/// `send`.
pub const PFS_OP_SEND: u32 = 22;
/// `recv`.
pub const PFS_OP_RECV: u32 = 23;
/// `idle`.
pub const PFS_OP_IDLE: u32 = 24;
/// `other`: any other operation (unknown codes are recorded as this).
pub const PFS_OP_OTHER: u32 = 25;

/// No `OBJECT_NAME`: what `pfs_object_name` returns when it interned
/// nothing, and a `pfs_wait_begin_named` name that records none.
pub const PFS_NO_OBJECT_NAME: u32 = u32::MAX;

/// Size of `pfs_wait_t` in 64-bit words.
pub const PFS_WAIT_WORDS: usize = 24;

/// One wait in progress, owned by the caller: declare it on the stack (no
/// initialisation needed), `pfs_wait_begin` it, `pfs_wait_end` it. Its
/// content is private.
///
/// Threading: begin and end on the same thread, and end it before that
/// thread exits (not from a thread-exit destructor); an end on another
/// thread is a no-op. Ownership: the caller owns the memory; the library
/// neither keeps nor frees it. End each begun wait exactly once (a second
/// end of the same struct is a no-op; do not end a copy as well).
#[repr(C)]
pub struct pfs_wait_t {
    _opaque: [u64; PFS_WAIT_WORDS],
}

const _: () = assert!(
    Slot::<WaitGuard>::fits(size_of::<pfs_wait_t>(), align_of::<pfs_wait_t>()),
    "pfs_wait_t is too small for a WaitGuard: raise PFS_WAIT_WORDS (an ABI change)"
);

/// The operation of code `op`; unknown codes are `other`.
#[inline(always)]
fn operation(op: u32) -> Operation {
    Operation::from_u32(op).unwrap_or(Operation::Other)
}

/// Registers (or finds) the wait instrument `name`, a PFS wait name
/// (`wait/synch/mutex/<area>/<name>`, `wait/synch/rwlock/...`,
/// `wait/synch/cond/...`, `wait/io/file/...`, `wait/io/socket/...`).
/// Returns a handle valid for the life of the process (the same one for
/// the same name), or NULL if `name` is NULL, not UTF-8 or not a wait
/// name. May be called before `pfs_init`: the class registers in the
/// segment on its first use after it.
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
pub unsafe extern "C" fn pfs_wait_class_register(name: *const c_char) -> *const pfs_wait_class_t {
    shield(std::ptr::null(), || {
        // SAFETY: `name` is null or a valid C string (contract).
        let name = unsafe { str_in(name) };
        name.and_then(classes::wait)
            .map_or(std::ptr::null(), |h| h as *const _)
    })
}

/// Whether the instrument is `ENABLED` now (as the agent set it): one
/// relaxed load. False for NULL and before `pfs_init`.
///
/// # Safety
///
/// `cls` is NULL or a handle from `pfs_wait_class_register`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_class_enabled(cls: *const pfs_wait_class_t) -> bool {
    shield(false, || {
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        unsafe { cls.as_ref() }.is_some_and(|c| c.0.get().is_enabled())
    })
}

/// Interns `name` as a wait's `OBJECT_NAME` (a file's path, a peer's
/// address, a table) and returns its handle, for `pfs_wait_begin_named`
/// and `PFS_WAIT_BEGIN_NAMED`: the same handle for the same text, valid
/// for the life of the process. A text over 56 bytes keeps its end (a
/// path's file name), after `~`, a hash of the whole text and `…`
/// (`~1a2b3c4d…/shard-07/000001.log`): two long names stay two. Returns `PFS_NO_OBJECT_NAME` if
/// `name` is NULL or not UTF-8, before `pfs_init` (or after it failed), or
/// when a new name would leave less than a quarter of the segment's string
/// table free (that quarter stays for `SOURCE` call sites; counted once per
/// text in `pfs_lost_total{kind="strings"}`); a wait begun with it has no
/// name.
///
/// Threading: any thread; takes the process's writer lock (call it once
/// per object, when it is opened, not per wait). Ownership: `name` is
/// copied.
///
/// # Safety
///
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_object_name(name: *const c_char) -> u32 {
    shield(PFS_NO_OBJECT_NAME, || {
        // SAFETY: `name` is null or a valid C string (contract).
        let name = unsafe { str_in(name) };
        name.map_or(PFS_NO_OBJECT_NAME, |n| ObjectName::new(n).to_raw())
    })
}

/// Starts a wait of class `cls` on the calling thread: `op` is a
/// `PFS_OP_*` code, `object` the waited-on object's address or any stable
/// id (`OBJECT_INSTANCE_BEGIN`). A disabled class, a NULL `cls` or no
/// `pfs_init` makes it (and its end) a no-op costing a load and a branch.
/// No lock, no allocation. Records no `SOURCE`: prefer `PFS_WAIT_BEGIN`,
/// which records the caller's `file:line` (`pfs_wait_begin_at`).
///
/// Threading and ownership: see `pfs_wait_t`.
///
/// # Safety
///
/// `w` is NULL or points to a writable `pfs_wait_t` that no other thread
/// uses; `cls` is NULL or a handle from `pfs_wait_class_register`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_begin(
    w: *mut pfs_wait_t,
    cls: *const pfs_wait_class_t,
    op: u32,
    object: u64,
) {
    // SAFETY: the caller's contract, and no site.
    unsafe { begin(w, cls, op, object, std::ptr::null()) }
}

/// `pfs_wait_begin`, with `SOURCE` the call site `site` (none if NULL).
/// Called by `PFS_WAIT_BEGIN(w, cls, op, object)`, which declares the
/// site: use the macro.
///
/// # Safety
///
/// As `pfs_wait_begin`; `site` is NULL or points to a `pfs_site_t` with
/// static storage duration, never changed, whose `file` is NULL or a
/// string with static storage duration (as `PFS_WAIT_BEGIN` declares it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_begin_at(
    w: *mut pfs_wait_t,
    cls: *const pfs_wait_class_t,
    op: u32,
    object: u64,
    site: *const pfs_site_t,
) {
    // SAFETY: the caller's contract.
    unsafe { begin(w, cls, op, object, site) }
}

/// `pfs_wait_begin`, with `OBJECT_NAME` the text `pfs_object_name`
/// returned `object_name` for (none for `PFS_NO_OBJECT_NAME`). Records no
/// `SOURCE`: prefer `PFS_WAIT_BEGIN_NAMED`, which records the caller's
/// `file:line` (`pfs_wait_begin_named_at`).
///
/// # Safety
///
/// As `pfs_wait_begin`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_begin_named(
    w: *mut pfs_wait_t,
    cls: *const pfs_wait_class_t,
    op: u32,
    object: u64,
    object_name: u32,
) {
    let name = ObjectName::from_raw(object_name);
    // SAFETY: the caller's contract, and no site.
    unsafe { begin_named(w, cls, op, object, name, std::ptr::null()) }
}

/// `pfs_wait_begin_named`, with `SOURCE` the call site `site` (none if
/// NULL). Called by `PFS_WAIT_BEGIN_NAMED(w, cls, op, object, name)`,
/// which declares the site: use the macro.
///
/// # Safety
///
/// As `pfs_wait_begin_at`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_begin_named_at(
    w: *mut pfs_wait_t,
    cls: *const pfs_wait_class_t,
    op: u32,
    object: u64,
    object_name: u32,
    site: *const pfs_site_t,
) {
    let name = ObjectName::from_raw(object_name);
    // SAFETY: the caller's contract.
    unsafe { begin_named(w, cls, op, object, name, site) }
}

/// `pfs_wait_begin_at`, inlined into both entry points.
///
/// # Safety
///
/// As `pfs_wait_begin_at`.
#[inline(always)]
unsafe fn begin(
    w: *mut pfs_wait_t,
    cls: *const pfs_wait_class_t,
    op: u32,
    object: u64,
    site: *const pfs_site_t,
) {
    shield((), || {
        if w.is_null() || !slot::usable() {
            return;
        }
        let slot = w.cast::<Slot<WaitGuard>>();
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        let class = unsafe { cls.as_ref() }.map(|c| c.0.get());
        match class {
            // SAFETY: `w` is non-null, writable and ours (contract), and a
            // pfs_wait_t is large and aligned enough for the slot (checked
            // at compile time above); `site` is null or a static site
            // (contract).
            Some(c) if c.is_enabled() => unsafe {
                let site = site_in(site);
                c.start_in_at(slot::place(slot), operation(op), object as usize, site);
                slot::arm(slot, Owner::me());
            },
            // SAFETY: as above.
            _ => unsafe { slot::clear(slot) },
        }
    })
}

/// `pfs_wait_begin_named_at`, inlined into both named entry points. Not
/// folded into [`begin`] with an optional name: the unnamed entry points'
/// closure then no longer inlined into them, and their wait cost 1.5 ns
/// more (measured side by side).
///
/// # Safety
///
/// As `pfs_wait_begin_at`.
#[inline(always)]
unsafe fn begin_named(
    w: *mut pfs_wait_t,
    cls: *const pfs_wait_class_t,
    op: u32,
    object: u64,
    name: ObjectName,
    site: *const pfs_site_t,
) {
    shield((), || {
        if w.is_null() || !slot::usable() {
            return;
        }
        let slot = w.cast::<Slot<WaitGuard>>();
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        let class = unsafe { cls.as_ref() }.map(|c| c.0.get());
        match class {
            // SAFETY: as in `begin`.
            Some(c) if c.is_enabled() => unsafe {
                let (place, op, object) = (slot::place(slot), operation(op), object as usize);
                c.start_in_named_at(place, op, object, name, site_in(site));
                slot::arm(slot, Owner::me());
            },
            // SAFETY: as in `begin`.
            _ => unsafe { slot::clear(slot) },
        }
    })
}

/// Ends the wait begun on `w` now and records it (`TIMER_WAIT`, current,
/// history, summaries). No lock, no allocation.
///
/// A no-op, recording nothing and touching no other thread's state, if `w`
/// holds no wait that the calling thread began and has not ended: not
/// recording (disabled class, no `pfs_init`), already ended, begun on
/// another thread (that thread may still end it), or never begun
/// (uninitialised memory, whatever an exited thread left on a reused
/// stack). The one case it cannot tell: a byte copy of a wait that this
/// same thread began and has not ended (never end a copy).
///
/// # Safety
///
/// `w` is NULL or points to a readable and writable `pfs_wait_t` that no
/// other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_end(w: *mut pfs_wait_t) {
    shield((), || {
        if !w.is_null() {
            // SAFETY: `w` is valid and ours during the call (contract); a
            // slot armed for this thread holds the WaitGuard its begin put
            // there, and any other content is refused (see `slot::with`).
            unsafe { slot::take(w.cast::<Slot<WaitGuard>>(), Owner::me(), |_| {}) }
        }
    })
}

/// As `pfs_wait_end`, with `NUMBER_OF_BYTES` = `bytes` (file and socket
/// I/O).
///
/// # Safety
///
/// As `pfs_wait_end`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_wait_end_bytes(w: *mut pfs_wait_t, bytes: u64) {
    shield((), || {
        if !w.is_null() {
            // SAFETY: as in pfs_wait_end.
            unsafe {
                slot::take(w.cast::<Slot<WaitGuard>>(), Owner::me(), |g| {
                    g.set_bytes(bytes)
                })
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    #[test]
    fn operation_codes_are_the_layout_s() {
        let codes = [
            (PFS_OP_LOCK, "lock"),
            (PFS_OP_TRY_LOCK, "try_lock"),
            (PFS_OP_READ_LOCK, "read_lock"),
            (PFS_OP_WRITE_LOCK, "write_lock"),
            (PFS_OP_TRY_READ_LOCK, "try_read_lock"),
            (PFS_OP_TRY_WRITE_LOCK, "try_write_lock"),
            (PFS_OP_WAIT, "wait"),
            (PFS_OP_TIMED_WAIT, "timed_wait"),
            (PFS_OP_CREATE, "create"),
            (PFS_OP_OPEN, "open"),
            (PFS_OP_CLOSE, "close"),
            (PFS_OP_READ, "read"),
            (PFS_OP_WRITE, "write"),
            (PFS_OP_SEEK, "seek"),
            (PFS_OP_SYNC, "sync"),
            (PFS_OP_STAT, "stat"),
            (PFS_OP_DELETE, "delete"),
            (PFS_OP_RENAME, "rename"),
            (PFS_OP_CHSIZE, "chsize"),
            (PFS_OP_CONNECT, "connect"),
            (PFS_OP_ACCEPT, "accept"),
            (PFS_OP_SEND, "send"),
            (PFS_OP_RECV, "recv"),
            (PFS_OP_IDLE, "idle"),
            (PFS_OP_OTHER, "other"),
        ];
        for (code, name) in codes {
            assert_eq!(operation(code).name(), name, "PFS_OP code {code}");
        }
        assert_eq!(operation(0), Operation::Other);
        assert_eq!(operation(999), Operation::Other);
    }

    #[test]
    fn null_and_uninitialised_are_no_ops() {
        // SAFETY: every pointer is null or local; the class is a handle.
        unsafe {
            assert!(pfs_wait_class_register(std::ptr::null()).is_null());
            assert!(pfs_wait_class_register(c"stage/x/y".as_ptr()).is_null());
            let cls = pfs_wait_class_register(c"wait/synch/mutex/c/m".as_ptr());
            assert!(!cls.is_null());
            assert!(!pfs_wait_class_enabled(cls) && !pfs_wait_class_enabled(std::ptr::null()));
            pfs_wait_begin(std::ptr::null_mut(), cls, PFS_OP_LOCK, 0);
            pfs_wait_end(std::ptr::null_mut());
            let mut w = MaybeUninit::<pfs_wait_t>::uninit();
            pfs_wait_begin(w.as_mut_ptr(), cls, PFS_OP_LOCK, 1);
            pfs_wait_end_bytes(w.as_mut_ptr(), 3);
            pfs_wait_end(w.as_mut_ptr());
            pfs_wait_begin(w.as_mut_ptr(), std::ptr::null(), PFS_OP_LOCK, 1);
            pfs_wait_end(w.as_mut_ptr());
        }
    }
}
