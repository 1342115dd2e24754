//! Layer 2. Statements from C: statement classes, the caller-owned
//! `pfs_statement_t`, and the statement's own figures (text, digest,
//! rows, errors, warnings).

use std::ffi::c_char;

use pfs_client::StatementGuard;

use crate::classes::{self, pfs_statement_class_t};
use crate::shield::shield;
use crate::site::{pfs_site_t, site_in};
use crate::slot::{self, Owner, Slot};
use crate::text::{prefix_in, str_in};

/// Size of `pfs_statement_t` in 64-bit words.
pub const PFS_STATEMENT_WORDS: usize = 40;

/// One statement in progress, owned by the caller: declare it on the
/// stack, `pfs_statement_begin` it, `pfs_statement_end` it. Stages
/// entered and waits recorded by the thread meanwhile nest in it.
/// Statements nest too (a stored procedure's statements): end them in
/// reverse order of their begins.
///
/// Threading: begin, set and end on the same thread, and end it before
/// that thread exits; a set or an end on another thread is a no-op.
/// Ownership: the caller owns the memory. End each begun statement
/// exactly once (a second end is a no-op).
#[repr(C)]
pub struct pfs_statement_t {
    _opaque: [u64; PFS_STATEMENT_WORDS],
}

const _: () = assert!(
    Slot::<StatementGuard>::fits(size_of::<pfs_statement_t>(), align_of::<pfs_statement_t>()),
    "pfs_statement_t is too small for a StatementGuard: raise PFS_STATEMENT_WORDS (an ABI change)"
);

/// Runs `f` on the statement begun in `st`, if it is recording and was
/// begun by the calling thread.
///
/// # Safety
///
/// `st` is NULL or points to a readable and writable `pfs_statement_t`
/// that no other thread uses during the call.
#[inline(always)]
unsafe fn with(st: *mut pfs_statement_t, f: impl FnOnce(&mut StatementGuard)) {
    shield((), || {
        if !st.is_null() {
            // SAFETY: `st` is valid and ours during the call (contract); a
            // slot armed for this thread holds the StatementGuard its begin
            // put there, and any other content is refused (`slot::with`).
            unsafe { slot::with(st.cast::<Slot<StatementGuard>>(), Owner::me(), f) };
        }
    })
}

/// Registers (or finds) the statement instrument `name`
/// (`statement/<area>/<name>`). Returns a handle valid for the life of
/// the process, or NULL if `name` is NULL, not UTF-8 or not a statement
/// name. May be called before `pfs_init`.
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
pub unsafe extern "C" fn pfs_statement_class_register(
    name: *const c_char,
) -> *const pfs_statement_class_t {
    shield(std::ptr::null(), || {
        // SAFETY: `name` is null or a valid C string (contract).
        let name = unsafe { str_in(name) };
        name.and_then(classes::statement)
            .map_or(std::ptr::null(), |h| h as *const _)
    })
}

/// Starts a statement of class `cls` on the calling thread
/// (`events_statements_current`). A disabled or NULL class, or no
/// `pfs_init`, makes it and every call on it a no-op. No lock, no
/// allocation. Records no `SOURCE`: prefer `PFS_STATEMENT_BEGIN`, which
/// records the caller's `file:line` (`pfs_statement_begin_at`).
///
/// A statement left open stays the thread's open statement: every later
/// one nests in it. End it on every path (`finally`, RAII). If `st` still
/// holds one this thread began and never ended (an exception between
/// begin and end, and the same struct begun again), that one ends first,
/// counted with one error (`SUM_ERRORS`) and without a duration (when it
/// really ended is not known: `TIMER_WAIT` NULL, not in the timed figures),
/// and the new one does not nest in it (for the thread's 8 innermost open
/// statements; a struct is known by its address, and read only if this
/// thread began a statement there). The statements (and the stage) begun
/// inside it and still open, abandoned with it, are forgotten (not
/// recorded): the new one nests in none of them. Another struct does not
/// end it: a statement whose struct is never begun again stays open, the
/// thread's later statements nested in it. (Not inside an entered
/// `pfs_task_t`: there a statement left open stays open.)
///
/// # Safety
///
/// `st` is NULL or points to a writable `pfs_statement_t` that no other
/// thread uses; `cls` is NULL or a handle from
/// `pfs_statement_class_register`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_begin(
    st: *mut pfs_statement_t,
    cls: *const pfs_statement_class_t,
) {
    // SAFETY: the caller's contract, and no site.
    unsafe { begin(st, cls, std::ptr::null()) }
}

/// `pfs_statement_begin`, with `SOURCE` the call site `site` (none if
/// NULL). Called by `PFS_STATEMENT_BEGIN(st, cls)`, which declares the
/// site: use the macro.
///
/// # Safety
///
/// As `pfs_statement_begin`; `site` as in `pfs_wait_begin_at`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_begin_at(
    st: *mut pfs_statement_t,
    cls: *const pfs_statement_class_t,
    site: *const pfs_site_t,
) {
    // SAFETY: the caller's contract.
    unsafe { begin(st, cls, site) }
}

/// `pfs_statement_begin_at`, inlined into both entry points.
///
/// # Safety
///
/// As `pfs_statement_begin_at`.
#[inline(always)]
unsafe fn begin(
    st: *mut pfs_statement_t,
    cls: *const pfs_statement_class_t,
    site: *const pfs_site_t,
) {
    shield((), || {
        // (Not after a failed ABI check: nothing is started, nothing touched.)
        if st.is_null() || !slot::usable() {
            return;
        }
        let slot = st.cast::<Slot<StatementGuard>>();
        if let Some(ids) = open::remove_from(st) {
            // Still open (begun here, never ended): it ends first, as an
            // error, or every later statement of the thread would nest in
            // it. (Known by its address first: a struct being begun may be
            // uninitialised memory, and is read only if this thread began
            // a statement there and never ended it; then ended only if it
            // still holds that statement, armed for this thread, with its
            // ids: not memory the program reused meanwhile.)
            // SAFETY: `st` is non-null, writable and ours (contract), and
            // this thread's `put` below initialised it at its last begin
            // (its end would have removed it from `open`).
            let same = unsafe { slot::with(slot, Owner::me(), |g| g.id() == ids) };
            if same == Some(true) {
                // SAFETY: as above; armed for this thread (just checked).
                // The statements begun inside it and still open were
                // abandoned with it (their structs are not read: their
                // memory may be gone): forgotten, so that none of them
                // holds the thread's nesting either.
                unsafe {
                    slot::take(slot, Owner::me(), |g| {
                        g.add_errors(1);
                        g.forget_open_nested();
                        // When it really ended is not known: not timed.
                        g.forget_timer();
                    })
                };
            }
        }
        // SAFETY: `cls` is null or a handle, which lives forever (contract).
        let class = unsafe { cls.as_ref() }.map(|c| c.0.get());
        match class {
            // SAFETY: `st` is non-null, writable and ours (contract), and
            // large and aligned enough (checked at compile time above);
            // `site` is null or a static site (contract).
            Some(c) if c.is_enabled() => unsafe {
                let started = c.start_at(site_in(site));
                let ids = started.is_recording().then(|| started.id());
                slot::put(slot, Owner::me(), started);
                if let Some(ids) = ids.filter(|_| slot::usable()) {
                    open::push(st, ids);
                }
            },
            // SAFETY: as above.
            _ => unsafe { slot::clear(slot) },
        }
    })
}

/// `SQL_TEXT`: copies `text` (NUL-terminated) into the current row now,
/// truncated to 200 bytes on a character boundary; a text that is not
/// UTF-8 is kept up to its first invalid byte; NULL: a no-op (the text
/// set before stays). Ownership: copied.
///
/// # Safety
///
/// `st` as in `pfs_statement_end`; `text` is NULL or a NUL-terminated
/// string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_set_text(st: *mut pfs_statement_t, text: *const c_char) {
    // SAFETY: `text` is null or a valid C string (contract), read now.
    let Some(text) = (unsafe { prefix_in(text) }) else {
        return; // NULL: a no-op (not the text or digest of "")
    };
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.set_text(text)) }
}

/// `DIGEST`: the 64-bit FNV-1a of the normalised text the application
/// supplies (e.g. `GET ?`), so that statements group by shape. A text
/// that is not UTF-8 is kept up to its first invalid byte; NULL: a
/// no-op. Ownership: read during the call.
///
/// # Safety
///
/// As `pfs_statement_set_text`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_set_digest_text(
    st: *mut pfs_statement_t,
    digest_text: *const c_char,
) {
    // SAFETY: `digest_text` is null or a valid C string (contract).
    let Some(text) = (unsafe { prefix_in(digest_text) }) else {
        return; // NULL: a no-op (not the text or digest of "")
    };
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.set_digest_text(text)) }
}

/// `ROWS_SENT`.
///
/// # Safety
///
/// As `pfs_statement_end`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_set_rows_sent(st: *mut pfs_statement_t, n: u64) {
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.set_rows_sent(n)) }
}

/// `ROWS_AFFECTED`.
///
/// # Safety
///
/// As `pfs_statement_end`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_set_rows_affected(st: *mut pfs_statement_t, n: u64) {
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.set_rows_affected(n)) }
}

/// `ROWS_EXAMINED`.
///
/// # Safety
///
/// As `pfs_statement_end`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_set_rows_examined(st: *mut pfs_statement_t, n: u64) {
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.set_rows_examined(n)) }
}

/// `ERRORS` (adds `n`).
///
/// # Safety
///
/// As `pfs_statement_end`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_add_errors(st: *mut pfs_statement_t, n: u64) {
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.add_errors(n)) }
}

/// `WARNINGS` (adds `n`).
///
/// # Safety
///
/// As `pfs_statement_end`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_add_warnings(st: *mut pfs_statement_t, n: u64) {
    // SAFETY: `st` as documented (contract).
    unsafe { with(st, |g| g.add_warnings(n)) }
}

/// Ends the statement begun on `st`: ends its open stage, then records
/// the statement (current, history, summaries).
///
/// A no-op, as every `pfs_statement_set_*`/`_add_*` call, if `st` holds no
/// statement that the calling thread began and has not ended: not
/// recording, already ended, begun on another thread, or never begun (see
/// `pfs_wait_end`; never end a copy).
///
/// # Safety
///
/// `st` is NULL or points to a readable and writable `pfs_statement_t`
/// that no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_statement_end(st: *mut pfs_statement_t) {
    shield((), || {
        if !st.is_null() {
            open::remove(st);
            // SAFETY: as in `with`.
            unsafe { slot::take(st.cast::<Slot<StatementGuard>>(), Owner::me(), |_| {}) }
        }
    })
}

/// The structs of the statements the calling thread began and has not
/// ended, by address, with the statement's (`THREAD_ID`, `EVENT_ID`),
/// innermost last: a begin on one of them finds its statement still open
/// without reading memory that may be uninitialised. The innermost
/// [`open::TRACKED`] are kept (deeper nesting is not tracked: such a
/// struct begun again while open is overwritten, as before).
mod open {
    use std::cell::Cell;

    use super::pfs_statement_t;

    /// How many are kept.
    pub(super) const TRACKED: usize = 8;

    /// A struct's address and its statement's ids.
    type Entry = (usize, (u64, u64));

    thread_local! {
        static OPEN: Cell<([Entry; TRACKED], usize)> =
            const { Cell::new(([(0, (0, 0)); TRACKED], 0)) };
    }

    /// Notes `st` as open with the statement `ids` (the oldest is
    /// forgotten when full).
    pub(super) fn push(st: *mut pfs_statement_t, ids: (u64, u64)) {
        let _ = OPEN.try_with(|c| {
            let (mut a, mut n) = c.get();
            if n == TRACKED {
                a.copy_within(1.., 0);
                n -= 1;
            }
            a[n] = (st as usize, ids);
            c.set((a, n + 1));
        });
    }

    /// Forgets `st` (ended); the ids it was noted with, if it was open.
    pub(super) fn remove(st: *mut pfs_statement_t) -> Option<(u64, u64)> {
        forget(st, false)
    }

    /// Forgets `st` and the structs noted after it (statements begun
    /// inside its statement: begun again, `st` was abandoned with them);
    /// `st`'s ids, if it was open.
    pub(super) fn remove_from(st: *mut pfs_statement_t) -> Option<(u64, u64)> {
        forget(st, true)
    }

    fn forget(st: *mut pfs_statement_t, inner_too: bool) -> Option<(u64, u64)> {
        OPEN.try_with(|c| {
            let (mut a, n) = c.get();
            let i = a[..n].iter().rposition(|e| e.0 == st as usize)?;
            let ids = a[i].1;
            if inner_too {
                c.set((a, i));
            } else {
                a.copy_within(i + 1..n, i);
                c.set((a, n - 1));
            }
            Some(ids)
        })
        .ok()
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    #[test]
    fn null_and_uninitialised_are_no_ops() {
        // SAFETY: null pointers, a local statement and static C literals.
        unsafe {
            assert!(pfs_statement_class_register(c"stage/x".as_ptr()).is_null());
            let cls = pfs_statement_class_register(c"statement/c/get".as_ptr());
            assert!(!cls.is_null());
            let mut st = MaybeUninit::<pfs_statement_t>::uninit();
            let p = st.as_mut_ptr();
            pfs_statement_begin(p, cls);
            pfs_statement_set_text(p, c"GET \xff".as_ptr());
            pfs_statement_set_digest_text(p, std::ptr::null());
            pfs_statement_set_rows_sent(p, 1);
            pfs_statement_add_errors(std::ptr::null_mut(), 1);
            pfs_statement_end(p);
            pfs_statement_end(p);
            pfs_statement_begin(std::ptr::null_mut(), cls);
        }
    }
}
