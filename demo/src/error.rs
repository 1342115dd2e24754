//! Layer 0: the demo's one error type, [`DemoError`]: every way starting
//! or running the demo can fail, each with what the user can do about it.
//! The other modules return it; the `pfs-agent` binary wraps it in
//! `anyhow` at its edge.

use std::io;
use std::path::PathBuf;

/// Why the demo could not start or stopped with an error.
///
/// ```
/// use pfs_demo::error::DemoError;
/// let e = DemoError::ThreadPanicked { name: "worker-0".into() };
/// assert_eq!(e.to_string(), "demo thread worker-0 panicked; its message is above");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A `PFS_*` environment variable has a value `pfs-client` refuses.
    #[error("invalid PFS_* environment variable; fix or unset it")]
    Environment(#[source] pfs_client::InitError),
    /// `pfs-client` could not create or map the segment.
    #[error("cannot initialise pfs-client for service {service:?} in {}", shm_dir.display())]
    Init {
        /// The service name asked for.
        service: String,
        /// The segment directory asked for.
        shm_dir: PathBuf,
        /// What `pfs-client` said.
        #[source]
        source: pfs_client::InitError,
    },
    /// The write-ahead log's directory or file could not be created.
    #[error("cannot create the WAL in {}; choose a writable --data-dir", dir.display())]
    Wal {
        /// The data directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// An operating-system resource the demo needs (a thread, a runtime,
    /// a socket, a signal handler) could not be had.
    #[error("cannot {what}")]
    Resource {
        /// What was being done ("spawn thread worker-0", "bind the HTTP
        /// service", ...).
        what: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// One of the demo's threads panicked.
    #[error("demo thread {name} panicked; its message is above")]
    ThreadPanicked {
        /// The thread's name.
        name: String,
    },
}

impl DemoError {
    /// A [`DemoError::Resource`] for `what` (a phrase after "cannot").
    pub fn resource(what: impl Into<String>) -> impl FnOnce(io::Error) -> DemoError {
        let what = what.into();
        move |source| DemoError::Resource { what, source }
    }
}
