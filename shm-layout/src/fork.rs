//! Layer 0. A hook that runs in the child of `fork(2)`.
//!
//! A segment has one writer process: each thread record one writing
//! thread, the global section its process's lock. After a `fork` without
//! `exec` (a pre-fork server's workers, a daemon's double fork), the child
//! holds a copy of the parent's mappings and of the forking thread's state:
//! without a hook, everything the child records lands in the parent's
//! segment, as the parent's thread, concurrently with that thread's own
//! writes, breaking the one-writer rule every reader relies on.
//! [`on_fork_child`] lets a writer disable itself in the child instead.
//!
//! One of the modules allowed to use `unsafe` (see the crate docs):
//! registering the hook is a call into the C library.

/// Registers `f` to run in the child process after every `fork(2)` of
/// this process (`pthread_atfork`'s child handler), on the child's only
/// thread, the one that forked, before `fork` returns there.
///
/// Registering the same function twice runs it twice. Returns `false` if
/// the C library refused (out of memory).
///
/// # Safety
///
/// `f` runs in a child of a possibly multi-threaded process, where POSIX
/// allows only async-signal-safe operations until `exec`: other threads
/// may have held any lock (the allocator's included) at the fork. `f`
/// must only store atomics or const-initialised thread-locals, or make
/// async-signal-safe system calls: no allocation, no lock, no buffered
/// I/O, no logging.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
///
/// static FORKED: AtomicBool = AtomicBool::new(false);
/// extern "C" fn child() {
///     FORKED.store(true, Relaxed);
/// }
/// // SAFETY: `child` only stores an atomic.
/// assert!(unsafe { pfs_shm_layout::fork::on_fork_child(child) });
/// assert!(!FORKED.load(Relaxed)); // not in a child
/// ```
pub unsafe fn on_fork_child(f: extern "C" fn()) -> bool {
    // SAFETY: `pthread_atfork` only records the three function pointers;
    // the child handler is a valid `extern "C" fn()` with 'static
    // lifetime (a function item), and null prepare and parent handlers
    // are allowed. What the handler may do in the child is this
    // function's own contract (`# Safety`), met by its caller.
    unsafe { libc::pthread_atfork(None, None, Some(f)) == 0 }
}
