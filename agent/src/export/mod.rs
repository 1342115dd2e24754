//! Layer 6: the exporters. [`model`] turns a snapshot into metric
//! families once; [`prometheus`] (`/metrics`) and [`otlp`] (push) render
//! them; [`exponential`] gives both the native / exponential form of a
//! latency histogram; [`classic`] the older Prometheus text format.

pub mod classic;
pub mod exponential;
pub mod model;
pub mod otlp;
pub mod prometheus;
