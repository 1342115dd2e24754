//! Exporters. [`model`] turns a snapshot into metric families once;
//! [`prometheus`] (and OTLP) render them.

pub mod model;
pub mod prometheus;
