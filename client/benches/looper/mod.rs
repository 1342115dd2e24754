//! The future the `async` bench group polls, shared by the bench
//! (`benches/async_tasks.rs`) and its instruction-count probe
//! (`examples/hot_path_probe.rs`), so that both measure the same poll.

use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use pfs_client::{LazyStatementClass, TaskStatement};

/// A task body that never completes: each poll polls a fresh ready future
/// and returns `Pending` (the waker is ignored). With a class, its first
/// poll opens a statement of it, kept open from then on.
pub struct Looper {
    open: Option<&'static LazyStatementClass>,
    stmt: Option<TaskStatement>,
}

impl Looper {
    /// A body that opens a statement of `open` at its first poll, if given.
    pub fn new(open: Option<&'static LazyStatementClass>) -> Self {
        Self { open, stmt: None }
    }
}

impl Future for Looper {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let (Some(class), None) = (self.open, &self.stmt) {
            let stmt = class.start_task();
            assert!(stmt.is_recording());
            self.stmt = Some(stmt);
        }
        let ready = pin!(std::future::ready(black_box(0u32)));
        black_box(ready.poll(cx).is_ready());
        Poll::Pending
    }
}

/// A `tracing` layer that does nothing.
pub struct NoopLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NoopLayer {}
