//! Layer 1. Where the library's warnings go. A C program has no `tracing`
//! subscriber, so each warning the client gives (once, on a slow path: the
//! segment's file truncated under the process, a name that is not an
//! instrument's, events before `pfs_init`, thread records exhausted, ...)
//! is written to standard error as one line, `pfs: <message>`, or handed
//! to the handler the program names with `pfs_set_warning_handler` (its
//! logger), or dropped if it names none.
//!
//! Standard error is the route from the moment the library is loaded (a
//! constructor in `.init_array` names it), so that a program that forgot
//! `pfs_init` is told so at its first statement; `pfs_init*` names it
//! again, for a static link that left the constructor out.

use std::ffi::{CString, c_char, c_void};
use std::io::Write;
use std::sync::Mutex;

use crate::shield::shield;

/// A program's warning handler: called with the warning's text (UTF-8,
/// NUL-terminated, valid only during the call) and the `user` pointer
/// given with it, on whichever thread warns, the library's own included.
/// It may log, and must return normally.
pub type pfs_warning_handler_t =
    Option<unsafe extern "C" fn(message: *const c_char, user: *mut c_void)>;

/// Where warnings go.
#[derive(Clone, Copy)]
enum Route {
    /// One line on standard error (the default).
    Stderr,
    /// The program's handler, with its `user` pointer (as an address: the
    /// library never dereferences it).
    Program(unsafe extern "C" fn(*const c_char, *mut c_void), usize),
    /// Nowhere.
    Dropped,
}

static ROUTE: Mutex<Route> = Mutex::new(Route::Stderr);

/// The client's fallback ([`pfs_client::warning::set_fallback`]): `message`
/// where [`ROUTE`] says.
fn deliver(message: &str) {
    if pfs_client::is_forked_child() {
        // The child of a fork records nothing; a lock (the route's,
        // standard error's) held by another thread of the parent at the
        // fork would never be released there.
        return;
    }
    // Copied out: the lock is not held during the handler's call.
    let route = *ROUTE.lock().unwrap_or_else(|e| e.into_inner());
    let text = message.strip_prefix("pfs: ").unwrap_or(message);
    match route {
        Route::Stderr => {
            let _ = writeln!(std::io::stderr().lock(), "pfs: {text}");
        }
        Route::Program(f, user) => {
            let c = CString::new(format!("pfs: {text}").replace('\0', "?")).unwrap_or_default();
            // SAFETY: the program's contract for a handler it names (see
            // `pfs_set_warning_handler`): callable with a NUL-terminated
            // string valid for the call (`c` lives until after it) and
            // the `user` pointer it gave, from any thread. The lock is
            // not held during the call.
            unsafe { f(c.as_ptr(), user as *mut c_void) };
        }
        Route::Dropped => {}
    }
}

/// Sends the client's warnings to [`ROUTE`].
pub(crate) fn install() {
    pfs_client::warning::set_fallback(Some(deliver));
}

/// Runs when the library is loaded (a shared library, or a static one
/// whose object holding it the program links): warnings reach standard
/// error before `pfs_init`.
extern "C" fn install_at_load() {
    install();
}

/// The constructor's entry in `.init_array`, which the dynamic loader (or
/// the C runtime, for a static program) calls before `main`.
#[used]
// SAFETY: `.init_array` holds pointers to functions of no argument that
// the loader calls once, before `main`; this one is such a function (an
// `extern "C" fn()` that does not unwind: `install` takes a lock and
// stores a function pointer), and the static is a plain pointer to it.
#[unsafe(link_section = ".init_array")]
static INSTALL_AT_LOAD: extern "C" fn() = install_at_load;

/// Names where the library's warnings go: `handler`, called with each
/// warning's text (one line, starting `pfs: `) and `user`; or, for a NULL
/// `handler`, nowhere. Without a call they go to standard error, one line
/// each. A warning is given once, on a slow path (the segment's file
/// truncated under the process, a class name that is not an
/// instrument's, events before `pfs_init`, thread records exhausted);
/// the figures it points at (`pfs_lost_total`) are counted either way.
///
/// ```c
/// static void to_syslog(const char *message, void *user) {
///     (void)user;
///     syslog(LOG_WARNING, "%s", message);
/// }
/// pfs_set_warning_handler(to_syslog, NULL); /* before pfs_init */
/// ```
///
/// Threading: any thread, any time, the handler included (no lock is held
/// while it runs); takes a lock. A warning delivered on another thread at
/// that moment may still go to the previous route. In the child of a
/// `fork()` it does nothing (nothing is said there).
///
/// # Safety
///
/// A non-NULL `handler` must be safe to call, from any thread and until
/// another call replaces it, with a NUL-terminated string valid for the
/// call and `user`; it must return normally (not unwind, not `longjmp`
/// out).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pfs_set_warning_handler(
    handler: pfs_warning_handler_t,
    user: *mut c_void,
) {
    shield((), || {
        if pfs_client::is_forked_child() {
            // Nothing is delivered there, and no lock may be waited for.
            return;
        }
        let route = match handler {
            Some(f) => Route::Program(f, user as usize),
            None => Route::Dropped,
        };
        *ROUTE.lock().unwrap_or_else(|e| e.into_inner()) = route;
        install();
    })
}
