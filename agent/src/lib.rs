//! # pfs-agent
//!
//! The sidecar of pfs-exporter: maps every segment in a directory, reads
//! them lock-free, and exports Prometheus `/metrics` and Performance-Schema
//! tables (HTTP JSON and the `query` command).
//!
//! | module | responsibility |
//! |--------|----------------|
//! | [`discover`] | finding segment files, liveness via `flock`, retiring the dead |
//! | [`snapshot`] | version-checked snapshots, cached and shared |
//! | [`aggregate`] | global, per-service and retired totals |
//! | [`tables`] | PFS tables from a snapshot |
//! | [`retired`] | retired totals kept in a state file across agent restarts |
//! | [`truncate`] | `TRUNCATE TABLE` as per-view baselines |
//! | [`timers`] | `performance_timers` measurements |
//! | [`setup`] | live setup changes (instruments, consumers, timers, actors) |
//! | [`export::prometheus`] | OpenMetrics `/metrics` |
//! | [`api`] | the HTTP server |
//! | [`cli`] | command-line interface |
//! | [`run`] | the `serve`, `query` and `demo` commands |
//! | [`demo`] | the demo's instrumented workload |

#![deny(missing_docs)]

pub mod aggregate;
pub mod api;
pub mod cli;
pub mod demo;
pub mod discover;
pub mod export;
pub mod retired;
pub mod run;
pub mod setup;
pub mod snapshot;
pub mod tables;
pub mod timers;
pub mod truncate;
