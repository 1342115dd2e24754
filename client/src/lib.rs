//! # pfs-client: instrument a process
//!
//! Link this crate into an application, call [`init`] once, and its
//! threads record timed waits (mutex, rwlock, condvar, file I/O) into a
//! shared-memory segment that `pfs-agent` exports as Prometheus metrics and
//! Performance-Schema tables.
//!
//! * **Hot path**: a disabled instrument costs one relaxed load and a
//!   branch. An enabled wait writes only the calling thread's own record:
//!   no lock, no syscall, no allocation, no shared cache line.
//! * **Never harms the application**: if the segment cannot be created,
//!   [`init`] returns an error and every instrument stays a no-op; a thread
//!   that finds no free record, or a volume that is full, is counted as
//!   lost instead.
//!
//! ```no_run
//! use pfs_client::{LazyWaitClass, Operation, sync::Mutex};
//!
//! static QUEUE_LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/app/queue");
//! static FLUSH: LazyWaitClass = LazyWaitClass::new("wait/io/file/app/flush");
//!
//! fn main() {
//!     // PFS_SHM_DIR (default /dev/shm/pfs) and PFS_SERVICE_NAME configure it.
//!     if let Err(e) = pfs_client::init() {
//!         eprintln!("instrumentation disabled: {e}");
//!     }
//!     let queue = Mutex::new(&QUEUE_LOCK, Vec::<u32>::new());
//!     queue.lock().unwrap().push(1); // a wait/synch/mutex/app/queue wait
//!
//!     let mut w = FLUSH.get().start(Operation::Write, 0); // any custom wait
//!     w.set_bytes(4096);
//!     drop(w);
//! }
//! ```

#![deny(missing_docs)]

pub mod alloc;
mod class;
mod config;
mod error;
mod event;
pub mod fs;
mod memory;
mod runtime;
mod source;
mod stage;
mod statement;
pub mod sync;
mod thread;
mod timer;
mod wait;

pub use config::{
    Config, DEFAULT_RECLAIM_AFTER, DEFAULT_SHM_DIR, parse_consumer_rules, parse_duration,
    parse_instrument_rules,
};
pub use error::InitError;
pub use memory::{LazyMemoryClass, MemoryClass, MemoryScope, MemoryToken, memory_scope};
pub use pfs_shm_layout::Operation;
pub use stage::{LazyStageClass, StageClass, end_stage, stage_progress};
pub use statement::{LazyStatementClass, StatementClass, StatementGuard};
pub use wait::{LazyWaitClass, WaitClass, WaitGuard};

/// Declares who the current thread works for: `setup_actors` decides, by
/// its most specific matching row, whether the thread is instrumented
/// (`INSTRUMENTED`) and whether its events go to the history tables
/// (`HISTORY`). Threads that never declare an actor are instrumented, like
/// PFS background threads. Returns the `(instrumented, history)` verdict.
pub fn set_thread_actor(user: &str, host: &str, role: &str) -> (bool, bool) {
    thread::set_actor(user, host, role)
}

use std::path::Path;

/// Initialises instrumentation from the environment (`PFS_SHM_DIR`,
/// `PFS_SERVICE_NAME`, see [`Config::from_env`]). Creates this process's
/// segment file and holds an `flock` on it for the life of the process.
pub fn init() -> Result<(), InitError> {
    init_with(Config::from_env()?)
}

/// Initialises instrumentation with an explicit configuration.
pub fn init_with(config: Config) -> Result<(), InitError> {
    runtime::init(config).map(|_| ())
}

/// The segment file this process writes, once initialised.
pub fn segment_path() -> Option<&'static Path> {
    runtime::get().map(|rt| rt.path.as_path())
}

/// The segment file name a process with this service name and pid uses.
pub fn segment_file_name(service: &str, pid: u32) -> String {
    runtime::segment_file_name(service, pid)
}

/// The README's instrumentation example, compiled as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
