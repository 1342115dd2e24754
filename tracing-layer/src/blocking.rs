//! Layer 0. [`enter_blocking`]: entering a request's span from a blocking
//! thread (`spawn_blocking`), waiting briefly for the thread that polls the
//! request to leave it first.
//!
//! A statement span's context is current on one thread at a time. The
//! usual hand-off, `let req = Span::current();` in the handler and
//! `req.enter()` in the `spawn_blocking` closure, races with the worker
//! thread that is still inside the request's poll when the blocking thread
//! starts (it leaves the span only as the poll returns, a few microseconds
//! later): the closure's enter then finds the context taken and its waits
//! are recorded on the blocking thread's own state, outside the
//! statement. [`enter_blocking`] marks its enter as one that may wait: the
//! layer then waits, up to [`ENTER_WAIT`], for the other thread to exit the
//! span. A plain `enter` never waits: a worker thread must not stall, and
//! only the caller knows its thread is a blocking one.

use std::cell::Cell;
use std::time::{Duration, Instant};

use tracing::Span;
use tracing::span::Entered;

/// The longest an [`enter_blocking`] waits for the span to be exited on
/// another thread before going on without its context. The poll that
/// spawned the blocking closure returns within microseconds when its
/// thread runs, but on a loaded host that thread can wait a few
/// scheduler time slices for a CPU (2 ms was seen to miss on 2 busy
/// cores); a span held for long elsewhere, e.g. by another blocking
/// closure of the same request, is not waited for beyond this.
pub const ENTER_WAIT: Duration = Duration::from_millis(10);

thread_local! {
    /// Set during an [`enter_blocking`]'s enter.
    static MAY_WAIT: Cell<bool> = const { Cell::new(false) };
}

/// Enters `span` from a blocking thread (a `spawn_blocking` closure, a
/// thread of your own pool): if the span is a `pfs-tracing` statement span
/// still entered on the thread that polls the request, waits (at most
/// [`ENTER_WAIT`]) for that thread to leave it, so that what the closure
/// records nests in the request's statement. Otherwise it is
/// `span.enter()`.
///
/// ```
/// # async fn handler() {
/// let req = tracing::Span::current(); // the request's span, before any stage span
/// let rows = tokio::task::spawn_blocking(move || {
///     let _g = pfs_tracing::enter_blocking(&req);
///     // blocking work: its waits nest in the request's statement
///     42
/// })
/// .await
/// .unwrap();
/// # let _ = rows;
/// # }
/// ```
///
/// Do not call it on a runtime's worker thread: it may block it for up to
/// [`ENTER_WAIT`].
pub fn enter_blocking(span: &Span) -> Entered<'_> {
    let _may_wait = MayWait::set();
    span.enter()
}

/// Sets [`MAY_WAIT`] for its life, and puts the previous value back when
/// dropped, also if a layer's `on_enter` panics: a blocking-pool thread
/// becomes a runtime worker under `block_in_place`, and must not be left
/// waiting at every enter.
struct MayWait(bool);

impl MayWait {
    fn set() -> Self {
        Self(MAY_WAIT.with(|w| w.replace(true)))
    }
}

impl Drop for MayWait {
    fn drop(&mut self) {
        MAY_WAIT.with(|w| w.set(self.0));
    }
}

/// Whether the enter being handled on this thread may wait.
pub(crate) fn may_wait() -> bool {
    MAY_WAIT.with(Cell::get)
}

/// How long [`wait_until_free`] yields its CPU between checks, before it
/// sleeps between them instead.
const YIELD_FOR: Duration = Duration::from_millis(1);

/// [`wait_until_free`]'s sleep between checks past [`YIELD_FOR`].
const SLEEP_STEP: Duration = Duration::from_micros(50);

/// Calls `taken` until it returns false or [`ENTER_WAIT`] passed: spins a
/// little (the other thread is usually about to leave), yields for
/// [`YIELD_FOR`], then sleeps [`SLEEP_STEP`] between checks. Returns
/// whether it is free.
pub(crate) fn wait_until_free(mut taken: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let mut turns = 0u32;
    while taken() {
        let waited = start.elapsed();
        if waited >= ENTER_WAIT {
            return false;
        }
        if turns < 64 {
            std::hint::spin_loop();
            turns += 1;
        } else if waited < YIELD_FOR {
            std::thread::yield_now();
        } else {
            // The other thread is not just about to leave (it waits for a
            // CPU, or holds the span for long): no core is burnt on it.
            std::thread::sleep(SLEEP_STEP);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_until_free_or_gives_up() {
        let mut n = 0;
        assert!(wait_until_free(|| {
            n += 1;
            n < 100
        }));
        let start = Instant::now();
        assert!(!wait_until_free(|| true));
        assert!(start.elapsed() >= ENTER_WAIT);
        assert!(!may_wait());
    }

    #[test]
    fn the_mark_is_put_back_even_on_a_panic() {
        let outer = MayWait::set();
        let caught = std::panic::catch_unwind(|| {
            let _inner = MayWait::set();
            assert!(may_wait());
            panic!("a layer's on_enter");
        });
        assert!(caught.is_err());
        assert!(may_wait(), "the outer mark is back");
        drop(outer);
        assert!(!may_wait());
    }
}
