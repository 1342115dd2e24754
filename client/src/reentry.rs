//! Layer 0. The re-entrancy guard: one const thread-local flag, set while
//! the client runs its own slow paths (thread registration, class and
//! string interning, the fold at thread exit).
//!
//! The global allocator wrapper reads it on every allocation and does not
//! account allocations made while it is set, so recording an allocation
//! never recurses into the client and never waits for a lock its own
//! thread holds. Every other module may set it; this module depends on
//! none.

use std::cell::Cell;

thread_local! {
    /// Const, no destructor: readable and writable at any point of thread
    /// teardown, including from other thread-local destructors.
    static IN_PFS: Cell<bool> = const { Cell::new(false) };
}

/// True while this thread is inside one of the client's slow paths.
#[inline(always)]
pub(crate) fn in_pfs() -> bool {
    IN_PFS.with(|f| f.get())
}

/// Runs `f` as a client slow path: allocations it makes are the
/// instrumentation's own and are not accounted. Nests (the flag is
/// restored, not cleared, on return).
#[inline]
pub(crate) fn reentrant<R>(f: impl FnOnce() -> R) -> R {
    let prev = IN_PFS.with(|c| c.replace(true));
    let r = f();
    IN_PFS.with(|c| c.set(prev));
    r
}
