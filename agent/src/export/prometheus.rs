//! `/metrics` in OpenMetrics text, through a `prometheus-client`
//! [`Collector`] that encodes the [`super::model`] families of the current
//! snapshot on every scrape. See the README for what each metric means.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::model::{self, AgentStats, Kind, Value};
use crate::snapshot::Snapshotter;

/// The OpenMetrics content type served on `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encodes the agent's view of every segment on each scrape.
#[derive(Debug)]
pub struct PfsCollector {
    snap: Arc<Snapshotter>,
    stats: Arc<AgentStats>,
}

/// A registry with the PFS collector over `snap`, reporting `stats`.
pub fn registry(snap: Arc<Snapshotter>, stats: Arc<AgentStats>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(PfsCollector { snap, stats }));
    r
}

/// Size of the previous rendering: the next one starts with that much room,
/// so the text is written once, without growing (and copying) the buffer.
static LAST_LEN: AtomicUsize = AtomicUsize::new(64 * 1024);

/// Renders the registry as OpenMetrics text.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let room = LAST_LEN.load(Ordering::Relaxed);
    let mut out = String::with_capacity(room + room / 8);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    LAST_LEN.store(out.len(), Ordering::Relaxed);
    Ok(out)
}

fn unit(u: &str) -> Unit {
    match u {
        "seconds" => Unit::Seconds,
        "bytes" => Unit::Bytes,
        other => Unit::Other(other.to_string()),
    }
}

impl Collector for PfsCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let snap = self.snap.summaries();
        for f in model::families(&snap, &self.snap.totals(), &self.stats) {
            let u = f.unit.map(unit);
            let t = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
                Kind::Info => MetricType::Info,
            };
            let mut m = enc.encode_descriptor(f.name, f.help, u.as_ref(), t)?;
            for p in &f.points {
                let labels: Vec<(&str, &str)> =
                    p.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                if f.kind == Kind::Info {
                    m.encode_info(&labels)?;
                    continue;
                }
                let mut e = m.encode_family(&labels)?;
                match (&p.value, f.kind) {
                    (Value::Int(v), Kind::Counter) => {
                        e.encode_counter::<NoLabelSet, u64, u64>(v, None)?
                    }
                    (Value::Float(v), Kind::Counter) => {
                        e.encode_counter::<NoLabelSet, f64, f64>(v, None)?
                    }
                    (Value::Int(v), _) => e.encode_gauge(&(*v as f64))?,
                    (Value::Float(v), _) => e.encode_gauge(v)?,
                    (
                        Value::Histogram {
                            sum,
                            count,
                            buckets,
                        },
                        _,
                    ) => e.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}
