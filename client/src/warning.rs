//! Layer 0. Warnings the client and its adapters give (each once, on slow
//! paths), through the program's `tracing` subscriber, from wherever they
//! arise: a subscriber's own callback included.
//!
//! A `tracing` layer (`pfs-tracing`'s) calls into the client from inside
//! its callbacks: a span's first entry may register its class or its
//! thread. An event emitted there enters the subscriber again in the
//! middle of a callback, which `tracing-subscriber`'s per-layer filters do
//! not survive: the span being created is then handed to a layer whose
//! filter left it out, and `fmt` panics ("Span not found, this is a
//! bug"). So [`warn`] emits the event on a short-lived thread of its own,
//! under the same dispatcher, outside every callback, and waits a moment
//! for it ([`WAIT_FOR_EMIT`]), so that it is in the program's log when the
//! call returns.
//!
//! Inside a callback of a scoped default subscriber (`with_default`),
//! `tracing` hides the dispatcher (its guard against re-entrance), and the
//! warning goes to standard error instead, as it does if the thread cannot
//! be started. A program with no subscriber at all gets no warning (the
//! figures the warnings point at, such as `pfs_lost_total`, are counted
//! regardless), unless it named a [`set_fallback`]: the C library (where
//! no program has a `tracing` subscriber) writes them to standard error,
//! or hands them to the program's handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{RwLock, mpsc};
use std::time::Duration;

use tracing::subscriber::NoSubscriber;

/// How long [`warn`] waits for its thread to have emitted the warning,
/// so that it is in the log when the call returns. It never waits longer:
/// the caller may hold what the subscriber's output needs (a lock on
/// standard output, the `OnceLock` of a class being registered that the
/// warning's own allocations account to), and the thread then emits the
/// warning once the caller has let go of it.
pub const WAIT_FOR_EMIT: Duration = Duration::from_millis(100);

/// Emits `message` through the calling thread's dispatcher, safely from
/// inside a subscriber's callback (see the module's documentation):
/// `emit` makes the event, with the caller's target and level
/// (`|m| tracing::warn!("{m}")`). For rare warnings: each call starts a
/// thread.
///
/// ```
/// pfs_client::warning::warn("PFS_EXAMPLE is ignored", |m| tracing::warn!("{m}"));
/// ```
pub fn warn(message: &str, emit: fn(&str)) {
    let dispatch =
        tracing::dispatcher::get_default(|d| (!d.is::<NoSubscriber>()).then(|| d.clone()));
    let Some(dispatch) = dispatch else {
        if tracing::dispatcher::has_been_set() {
            // A scoped default hidden by its guard: inside its callback
            // (or a scoped default on another thread only).
            eprintln!("WARN pfs: {message}");
        } else if let Some(f) = fallback() {
            f(message);
        }
        return;
    };
    let text = message.to_string();
    let (done, emitted) = mpsc::channel();
    let started = std::thread::Builder::new()
        .name("pfs-warning".into())
        .spawn(move || {
            tracing::dispatcher::with_default(&dispatch, || emit(&text));
            let _ = done.send(());
        });
    match started {
        // Emitted, or still on its way (see `WAIT_FOR_EMIT`).
        Ok(_) => {
            let _ = emitted.recv_timeout(WAIT_FOR_EMIT);
        }
        Err(_) => eprintln!("WARN pfs: {message}"),
    }
}

/// Where [`warn`] sends a warning when the program has no `tracing`
/// subscriber ([`set_fallback`]).
static FALLBACK: RwLock<Option<fn(&str)>> = RwLock::new(None);

/// The fallback, copied out: the lock is not held while it runs (it may
/// name another, or warn again). Never waits: a warning given while
/// another thread names the fallback (a moment, once or twice per
/// process), or in a forked child whose parent was naming it at the fork,
/// is dropped rather than hang.
fn fallback() -> Option<fn(&str)> {
    match FALLBACK.try_read() {
        Ok(f) => *f,
        Err(std::sync::TryLockError::Poisoned(f)) => *f.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Makes `f` receive the warnings of a program that has no `tracing`
/// subscriber (the message, called on the thread that warns, possibly one
/// of the client's own), or, with `None`, drops them again (the default).
/// A program with a subscriber gets them there, whatever this says. For
/// adapters whose programs cannot have one: the C library sends them to
/// standard error, or to the handler the C program gives.
///
/// ```
/// fn to_stderr(message: &str) {
///     eprintln!("pfs: {message}");
/// }
/// pfs_client::warning::set_fallback(Some(to_stderr));
/// pfs_client::warning::warn("PFS_EXAMPLE is ignored", |m| tracing::warn!("{m}"));
/// pfs_client::warning::set_fallback(None);
/// ```
pub fn set_fallback(f: Option<fn(&str)>) {
    *FALLBACK.write().unwrap_or_else(|e| e.into_inner()) = f;
}

/// Says once per process that `what` named `name` (`"statement"`,
/// `"statement/app/checkout"`) came while the client is not initialised:
/// [`crate::init`] was never called, not yet, or failed. A program that
/// forgot `init` would otherwise record nothing, silently. Said for
/// statements and stages (a program's own calls), and by `pfs-tracing`
/// for statement spans; not for waits or memory, which a program may well
/// use before it calls `init` (a lock in a static, the allocator). Costs
/// one relaxed swap once said: nothing is formatted or allocated.
///
/// ```
/// // (The client is not initialised here; without a subscriber, nothing is said.)
/// pfs_client::warning::not_initialised("statement", "statement/app/checkout");
/// ```
pub fn not_initialised(what: &str, name: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    warn(
        &format!(
            "pfs-client is not initialised: {what} {name:?} is not recorded, nor is any event, until pfs_client::init() (or init_with; pfs_init from C) succeeds; if the program calls it, its error says why it failed"
        ),
        |m| tracing::warn!("{m}"),
    );
}
