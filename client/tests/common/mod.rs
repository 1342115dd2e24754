//! Shared by the integration tests: the client's own segment read back
//! as the agent reads it. Each test file uses some of it.

#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};

use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, snapshot};

/// A full snapshot (events, every thread's rows) of the segment at `path`.
pub fn read(path: &Path) -> SegmentSnapshot {
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

/// A `tracing` layer that keeps the message of every warning logged.
pub struct Warnings(pub Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    *self.0 = format!("{v:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut m = String::new();
            event.record(&mut Message(&mut m));
            self.0.lock().unwrap().push(m);
        }
    }
}
