//! The demo's instrumented workload: a key-value store with a write-ahead
//! log, run as a separate process by `pfs-agent demo`.

pub mod workload;
