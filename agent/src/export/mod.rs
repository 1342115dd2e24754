//! Exporters: each renders the shared [`crate::snapshot::Snapshot`].

pub mod prometheus;
