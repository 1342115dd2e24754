//! # pfs-demo
//!
//! The instrumented program behind `pfs-agent demo`: an in-memory
//! key-value store with a write-ahead log on disk, whose threads record
//! their waits, stages, statements and memory through `pfs-client`, and
//! beside it an async HTTP service whose tasks record theirs through the
//! `pfs-tracing` layer and `pfs_client::tokio`. It
//! lives apart from the agent so that the sidecar's library never links
//! the client: `pfs-agent` includes it only through its default `demo`
//! feature (`cargo build -p pfs-agent --no-default-features` builds an
//! agent without it).
//!
//! | layer | module | job |
//! |---|---|---|
//! | 0 | [`error`] | [`error::DemoError`], every way the demo can fail |
//! | 1 | [`http`] | the async "orders" HTTP service (axum, tokio, the tracing layer) and its load generator |
//! | 2 | [`workload`] | the key-value store, its threads and the instruments they record; starts the HTTP service beside them |
//!
//! ```no_run
//! // Runs until the process is killed (SIGTERM / SIGINT).
//! pfs_demo::workload::run(pfs_demo::workload::WorkloadOptions {
//!     shm_dir: "/dev/shm/pfs".into(),
//!     service: "kvstore-demo".into(),
//!     data_dir: std::env::temp_dir().join("kvstore"),
//!     workers: 4,
//! })
//! .unwrap();
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod error;
pub mod http;
pub mod workload;
