//! # pfs-agent
//!
//! The sidecar of pfs-exporter: maps every segment in a directory, reads
//! them lock-free, and exports Prometheus `/metrics`, OTLP, and
//! Performance-Schema tables (HTTP JSON and the `query` command), with
//! live control of what is instrumented.
//!
//! ## Layers
//!
//! Each module has one job and imports only modules of a lower layer
//! (`tests/tests/layers.rs` fails otherwise). A newcomer reads from the
//! bottom: segments are found (3), read (4), turned into tables (6) and
//! metrics (6), and served (7) by the commands (8, 9: the binary's
//! modules, in `src/main.rs`).
//!
//! | layer | module | job |
//! |---|---|---|
//! | 0 | [`util`] | files opened without following links, atomic writes, capped reads, sizes and durations as text, giving heap memory back |
//! | 0 | [`testing`] | (tests only: unit tests, and feature `testing` for integration tests) fixtures: real segments written as the client writes them |
//! | 1 | [`filter`] | which processes a table or a change applies to |
//! | 1 | [`aggregate`] | totals per segment, per service, and of retired segments |
//! | 1 | [`carry`] | carry-forward: a skipped row replaced by its previous read |
//! | 1 | [`persist`] | the JSON forms of summaries in the agent's own files |
//! | 1 | [`timers`] | `performance_timers` measurements |
//! | 2 | [`setup`] | changing setup inside segments (API, `setup` command, defaults) |
//! | 2 | [`retired`] | retired totals kept in a state file across agent restarts |
//! | 3 | [`segments`] | the segment directory: acceptance policy, liveness, retirement |
//! | 4 | [`snapshot`] | version-checked snapshots, cached and shared |
//! | 5 | [`truncate`] | `TRUNCATE TABLE` as baselines the tables subtract |
//! | 6 | [`tables`] | the PFS tables, one file each, in one registry |
//! | 6 | [`export`] | metric families, OpenMetrics `/metrics`, OTLP push |
//! | 7 | [`server`] | the HTTP server: routes, auth, `/metrics` cache, streaming, control |
//! | 8 | `cli` | (binary) the command line |
//! | 9 | `commands` | (binary) `serve`, `query`, `setup`, `demo` |
//!
//! The three kinds of timed event that tables, metrics and truncation
//! baselines are split by (waits, stages, statements) are the segment
//! format's [`pfs_shm_layout::EventKind`], not a type of this crate.
//!
//! ## Features
//!
//! `demo` (default): the `demo` command and its workload (the `pfs-demo`
//! crate, which links `pfs-client`). A production build leaves it out:
//! `cargo build --release -p pfs-agent --no-default-features`.
//!
//! ## Example: one table of every segment in a directory
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use pfs_agent::{segments::SegmentSet, snapshot::Snapshotter, tables};
//!
//! // Every segment in a directory, read once, as one PFS table.
//! let snap = Snapshotter::new(SegmentSet::new("/dev/shm/pfs", Duration::MAX), Duration::ZERO);
//! let table = tables::lookup("events_waits_summary_global_by_event_name").unwrap();
//! let t = tables::build(table, &snap.take(), &Default::default(), &Default::default());
//! print!("{}", t.to_text());
//! ```
//!
//! ## Unsafe
//!
//! `unsafe` is denied in the whole crate except [`util::heap`], which
//! calls glibc's `malloc_trim`. Shared memory is read only through
//! `pfs-shm-layout`'s safe API.

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod aggregate;
pub mod carry;
pub mod export;
pub mod filter;
pub mod persist;
pub mod retired;
pub mod segments;
pub mod server;
pub mod setup;
pub mod snapshot;
pub mod tables;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod timers;
pub mod truncate;
pub mod util;
