//! # pfs-client: instrument a process
//!
//! Link this crate into an application, call [`init`] once, and its
//! threads record timed waits (mutex, rwlock, condvar, file I/O, or any
//! wait of your own), the stages and statements those waits nest in, and
//! memory allocations, into a shared-memory segment that `pfs-agent`
//! exports as Prometheus metrics and Performance-Schema tables.
//!
//! * **Hot path**: a disabled instrument costs one relaxed load and a
//!   branch. An enabled event writes only the calling thread's own record:
//!   no lock, no syscall, no allocation, no shared cache line.
//! * **Never harms the application**: if the segment cannot be created,
//!   [`init`] returns an error and every instrument stays a no-op; a thread
//!   that finds no free record, or a volume that is full, is counted as
//!   lost instead.
//! * **Not async-signal-safe**: never record an event (nor call any other
//!   function of this crate) in a signal handler. A thread's first event
//!   registers it, which allocates and takes the writer's lock: in a
//!   handler that interrupted `malloc` or the client, the thread
//!   deadlocks.
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
//!
//! # Modules, in layers
//!
//! Each module has one job and uses only modules of lower layers, never
//! one of its own layer or above (`crate::x`, `super::x` and doc links
//! alike), so the modules form no cycle. Layer 0 is the bottom; each
//! module's header comment states its layer.
//!
//! | layer | module | job |
//! | --- | --- | --- |
//! | 0 | `reentry` | the re-entrancy guard: a thread-local flag set during the client's own slow paths, whose allocations are then not accounted |
//! | 0 | `context` | the per-thread context the hot path works on: the thread's record and its event state |
//! | 0 | `timer` | the timers (CYCLE, NANOSECOND, ...) and their conversion to picoseconds |
//! | 0 | `error` | [`InitError`], why `init` failed, and [`ConfigError`], a setting a segment cannot hold |
//! | 0 | [`warning`] | warnings given once, through the program's subscriber, safely from inside its callbacks |
//! | 1 | `config` | [`Config`], from code or from `PFS_*` variables |
//! | 2 | `runtime` | the process-wide segment: created once by `init`, read by every event |
//! | 3 | `class` | instrument classes: registration, live setup flags, lazily registered statics |
//! | 3 | `source` | `SOURCE`: call sites interned once, found again without formatting |
//! | 4 | `event` | the event core: begin and end of waits, stages and statements, by consumer |
//! | 5 | `thread` | the thread registry: registers a thread on its first event, folds its record at exit |
//! | 6 | `memory` | memory instruments: tokens, scopes and the accounting of allocations and frees |
//! | 6 | `wait` | waits: [`WaitClass`], [`LazyWaitClass`] and the [`WaitGuard`] of one wait |
//! | 6 | `stage` | stages: [`StageClass`], [`LazyStageClass`], [`end_stage`] |
//! | 7 | [`task`] | async tasks: [`task::TaskContext`], the event state (and memory scope) a task carries between polls, and the [`task::Task`] adapter |
//! | 7 | [`alloc`] | the `GlobalAlloc` wrapper that accounts heap allocations |
//! | 7 | [`sync`] | instrumented `Mutex`, `RwLock` and `Condvar` |
//! | 7 | `io_wait` | I/O waits on one object (a file, a socket): its class, `OBJECT_NAME` and `OBJECT_INSTANCE`, one operation's wait and byte count, the shared `Read`/`Write` |
//! | 8 | [`fs`] | an instrumented `File` |
//! | 8 | [`net`] | an instrumented `TcpStream` and `TcpListener` |
//! | 8 | `statement` | statements: [`StatementClass`], [`LazyStatementClass`], [`StatementGuard`] and the `Send` [`TaskStatement`] |
//! | 8 | `tokio` | instrumented drop-ins for `tokio::sync` (feature `tokio`) |
//!
//! # Unsafe code
//!
//! The crate denies `unsafe_code`; three modules allow it on the items that
//! need it, each block with a `// SAFETY:` argument:
//!
//! * [`alloc`]: a global allocator is unsafe by nature. It calls the
//!   inner allocator and reads and writes the header it keeps in front of
//!   every block (through two `unsafe fn` header accessors).
//! * `thread`: the current thread's context is reached through a
//!   thread-local raw pointer, so that the hot path pays one thread-local
//!   load and no borrow flag or lazy-initialisation check; one block turns
//!   that pointer into a reference, one frees the context at thread exit,
//!   one registers the fork handler (whose contract is to be
//!   async-signal-safe).
//! * `runtime`: the `pfs-maintenance` thread is spawned with every
//!   asynchronous signal blocked (`pthread_sigmask`), and the slow paths
//!   hold off thread cancellation (`pthread_setcancelstate`).

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod alloc;
mod class;
mod config;
mod context;
mod error;
mod event;
pub mod fs;
mod io_wait;
mod memory;
pub mod net;
mod reentry;
mod runtime;
mod source;
mod stage;
mod statement;
pub mod sync;
pub mod task;
mod thread;
mod timer;
#[cfg(feature = "tokio")]
pub mod tokio;
mod wait;
pub mod warning;

pub use config::{
    ActorRule, Config, DEFAULT_RECLAIM_AFTER, DEFAULT_SHM_DIR, parse_actor_rules,
    parse_consumer_rules, parse_duration, parse_instrument_rules,
};
pub use error::{ConfigError, InitError};
pub use memory::{LazyMemoryClass, MemoryClass, MemoryScope, MemoryToken, memory_scope};
pub use pfs_shm_layout::Operation;
pub use source::{CallSite, Site};
pub use stage::{LazyStageClass, StageClass, end_stage, stage_progress};
pub use statement::{LazyStatementClass, StatementClass, StatementGuard, TaskStatement};
pub use wait::{AsyncWait, LazyWaitClass, ObjectName, WaitClass, WaitGuard};

/// Declares who the current thread works for: `setup_actors` decides, by
/// its most specific matching row, whether the thread is instrumented
/// (`INSTRUMENTED`) and whether its events go to the history tables
/// (`HISTORY`). Threads that never declare an actor are instrumented, like
/// PFS background threads. Returns the `(instrumented, history)` verdict,
/// `(false, false)` before [`init`].
///
/// ```
/// // A request handler serving user `alice` from `10.0.0.7`:
/// let (instrumented, history) = pfs_client::set_thread_actor("alice", "10.0.0.7", "%");
/// // Not initialised here, so nothing is instrumented.
/// assert_eq!((instrumented, history), (false, false));
/// ```
pub fn set_thread_actor(user: &str, host: &str, role: &str) -> (bool, bool) {
    thread::set_actor(user, host, role)
}

/// Names the current thread's row in the `threads` table (`NAME`),
/// registering the thread if it has no record yet. A thread's row is
/// otherwise named, when the thread registers, by its Rust name
/// (`std::thread::Builder::name`), else its OS name (`pthread_setname_np`,
/// `prctl(PR_SET_NAME)`), else `thread-<THREAD_ID>`. The name is cut to 32
/// bytes on a character boundary. Returns whether the row now has the
/// name: false before [`init`], or if the thread could not get a record
/// (the thread container is full).
///
/// ```
/// // Not initialised here: there is no row to name.
/// assert!(!pfs_client::set_thread_name("flusher-1"));
/// ```
pub fn set_thread_name(name: &str) -> bool {
    thread::set_name(name)
}

/// The `THREAD_ID` under which the current thread's events appear in the
/// tables: the thread's own, or while a [`task::Task`] is being polled, the
/// task's. Registers the thread if it has no record yet, so that its row
/// is in the `threads` table from now on. `None` before [`init`], or if
/// the thread could not get a record (the thread container is full).
///
/// ```
/// // For a log line that an operator can match with the tables:
/// match pfs_client::thread_id() {
///     Some(id) => println!("worker started, pfs THREAD_ID {id}"),
///     None => println!("worker started (not instrumented)"),
/// }
/// ```
pub fn thread_id() -> Option<u64> {
    let rt = runtime::get()?;
    // (A lookup, not an event: a thread without a record counts no loss.)
    thread::own(rt).map(|ctx| ctx.thread_id.get())
}

/// Whether the current thread has no record any more: its record was
/// folded at thread exit (this is code run by a thread-exit hook, such as
/// a C `pthread_key_create` destructor or a thread-local's destructor
/// that runs after the client's), or it never got one (the thread
/// container was full; a forked child). Such a thread records nothing; a
/// guard it began earlier must be forgotten (`std::mem::forget`), not
/// dropped, since its context is gone. False before [`init`] and for a
/// thread not registered yet. Never registers the thread.
///
/// ```
/// assert!(!pfs_client::thread_gone());
/// ```
#[inline]
pub fn thread_gone() -> bool {
    thread::gone()
}

/// The `EVENT_ID` of the innermost statement open on the current logical
/// thread (the thread, or the task being polled): with [`thread_id`], the
/// key of its row in `events_statements_current`. `None` if no statement
/// is open (or before [`init`]). Never registers the thread.
///
/// ```
/// static Q: pfs_client::LazyStatementClass = pfs_client::LazyStatementClass::new("statement/app/q");
/// let _stmt = Q.start();
/// // Not initialised here, so nothing is recorded.
/// assert_eq!(pfs_client::statement_event_id(), None);
/// ```
pub fn statement_event_id() -> Option<u64> {
    thread::with_registered(|ctx| ctx.statement_id.get()).filter(|&id| id != 0)
}

/// Counts one instrument that an adapter declined to create because its
/// own bound on classes was reached (as a `tracing` layer does for an
/// unknown route beyond its limit): `pfs_lost_total{kind="instrument_classes"}`,
/// `Performance_schema_*_classes_lost`. A no-op before [`init`].
///
/// ```
/// pfs_client::count_lost_class(); // not initialised: nothing counted
/// ```
pub fn count_lost_class() {
    if let Some(rt) = runtime::get() {
        rt.writer
            .segment()
            .count_lost(pfs_shm_layout::layout::LostKind::Classes);
    }
}

use std::path::Path;

/// Initialises instrumentation from the environment (`PFS_SHM_DIR`,
/// `PFS_SERVICE_NAME`, see [`Config::from_env`]). Creates this process's
/// segment file and holds an `flock` on it for the life of the process.
pub fn init() -> Result<(), InitError> {
    init_with(Config::from_env()?)
}

/// Initialises instrumentation with an explicit configuration. Fails if
/// this process already initialised it (see [`InitError`]).
///
/// ```no_run
/// use pfs_client::Config;
///
/// let cfg = Config::new("checkout")
///     .shm_dir("/var/run/pfs")
///     .instrument("wait/io/file/%", 0); // file waits off from the start
/// if let Err(e) = pfs_client::init_with(cfg) {
///     eprintln!("instrumentation disabled: {e}");
/// }
/// println!("writing {:?}", pfs_client::segment_path());
/// ```
pub fn init_with(config: Config) -> Result<(), InitError> {
    runtime::init(config, thread::renounce)?;
    thread::stop_in_forked_children();
    Ok(())
}

/// Counts, in `pfs_lost_total{kind="events_ended_by_another_thread"}`, an
/// end that a foreign-language binding refused because another thread
/// than the one that began the event asked for it (the C ABI's structs;
/// Rust's guards are not `Send`). The event stays unrecorded: counting it
/// is what tells an operator that ends arrive on the wrong threads (an
/// unpinned goroutine). A no-op before `init`.
pub fn count_foreign_end() {
    if let Some(rt) = runtime::get() {
        rt.writer
            .segment()
            .count_lost(pfs_shm_layout::layout::LostKind::ForeignEnds);
    }
}

/// Whether this process is the child of a `fork` (without `exec`) of an
/// initialised process: it records nothing (the segment is its
/// parent's), and [`init`] fails there with [`InitError::Forked`]. Takes
/// no lock: callable in a forked child.
///
/// ```
/// assert!(!pfs_client::is_forked_child());
/// ```
pub fn is_forked_child() -> bool {
    runtime::forked()
}

/// The segment file this process writes, once initialised (`None`
/// before, or if `init` failed).
pub fn segment_path() -> Option<&'static Path> {
    runtime::get().map(|rt| rt.path.as_path())
}

/// The segment file name a process with this service name and pid uses:
/// `<service>.<pid>.pfs`, characters other than ASCII letters, digits, `-`
/// and `_` replaced by `_`. If another file has that name (another
/// container's process with the same pid, or a dead predecessor's segment
/// that no agent has collected yet), the process takes the first free
/// `<service>.<pid>.<n>.pfs` instead; [`segment_path`] says which.
///
/// ```
/// assert_eq!(pfs_client::segment_file_name("checkout api", 42), "checkout_api.42.pfs");
/// ```
pub fn segment_file_name(service: &str, pid: u32) -> String {
    pfs_shm_layout::files::segment_file_name(service, pid)
}

/// The README's instrumentation examples, compiled as doctests so they
/// stay true (with feature `tokio`: one uses the tokio drop-ins).
#[cfg(all(doctest, feature = "tokio"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
