//! Layer 6: the exporters. [`model`] turns a snapshot into metric
//! families once; [`prometheus`] (`/metrics`) and [`otlp`] (push) render
//! them.

pub mod model;
pub mod otlp;
pub mod prometheus;
