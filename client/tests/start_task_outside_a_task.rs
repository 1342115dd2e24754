//! `start_task()` in a tokio runtime outside a pfs task context (a future
//! spawned without `.pfs_task()`) is a statement of the worker thread, in
//! which other tasks' statements on that worker nest: said once, as a
//! warning naming the fix; never for a statement started inside a task.

use std::sync::{Arc, Mutex};

use pfs_client::LazyStatementClass;
use pfs_client::task::TaskExt;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

static REQ: LazyStatementClass = LazyStatementClass::new("statement/test/req");

/// Keeps the messages of the events it sees.
#[derive(Clone, Default)]
struct Messages(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Messages {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct V<'a>(&'a mut String);
        impl Visit for V<'_> {
            fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = String::new();
        event.record(&mut V(&mut m));
        self.0.lock().unwrap().push(m);
    }
}

#[test]
fn a_task_statement_outside_a_task_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(pfs_client::Config::new("outside-task-test").shm_dir(dir.path()))
        .unwrap();
    let messages = Messages::default();
    tracing_subscriber::registry().with(messages.clone()).init();
    let warned = || {
        messages
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.contains("outside a pfs task") && m.contains(".pfs_task()"))
            .count()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let run = |wrapped: bool| {
        rt.block_on(async {
            let work = async {
                let s = REQ.start_task();
                tokio::task::yield_now().await;
                drop(s);
            };
            let handle = if wrapped {
                tokio::spawn(work.pfs_task())
            } else {
                tokio::spawn(work)
            };
            handle.await.unwrap();
        })
    };
    run(true);
    assert_eq!(warned(), 0, "inside a task: nothing said");
    run(false);
    run(false);
    // (Given on a thread of its own: `pfs_client::warning`.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while warned() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(warned(), 1, "said once: {:?}", messages.0.lock().unwrap());
}
