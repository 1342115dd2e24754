//! Exporters. [`model`] turns a snapshot into metric families once;
//! [`prometheus`] and [`otlp`] render them.

pub mod model;
pub mod otlp;
pub mod prometheus;
