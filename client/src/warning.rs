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
//! under the same dispatcher, and waits for it: outside every callback,
//! in the program's log, before the call returns.
//!
//! Inside a callback of a scoped default subscriber (`with_default`),
//! `tracing` hides the dispatcher (its guard against re-entrance), and the
//! warning goes to standard error instead, as it does if the thread cannot
//! be started. A program with no subscriber at all gets no warning (the
//! figures the warnings point at, such as `pfs_lost_total`, are counted
//! regardless).

use tracing::Dispatch;
use tracing::subscriber::NoSubscriber;

/// Emits `message` as a `WARN` event of target `pfs_client` through the
/// calling thread's dispatcher, safely from inside a subscriber's
/// callback (see the module's documentation). For rare warnings: each
/// call starts a thread.
///
/// ```
/// pfs_client::warning::warn("PFS_EXAMPLE is ignored");
/// ```
pub fn warn(message: &str) {
    let dispatch =
        tracing::dispatcher::get_default(|d| (!d.is::<NoSubscriber>()).then(|| d.clone()));
    let Some(dispatch) = dispatch else {
        if tracing::dispatcher::has_been_set() {
            // A scoped default hidden by its guard: inside its callback.
            eprintln!("WARN pfs_client: {message}");
        }
        return;
    };
    let text = message.to_string();
    let emitted = std::thread::Builder::new()
        .name("pfs-warning".into())
        .spawn(move || emit(&dispatch, &text))
        .map(|t| t.join().is_ok());
    if !matches!(emitted, Ok(true)) {
        eprintln!("WARN pfs_client: {message}");
    }
}

fn emit(dispatch: &Dispatch, message: &str) {
    tracing::dispatcher::with_default(dispatch, || {
        tracing::warn!(target: "pfs_client", "{message}");
    });
}
