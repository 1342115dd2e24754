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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{segment_at, statement, statement_class};
    use pfs_shm_layout::values::StatementFigures;
    use std::time::Duration;

    /// The sample of `metric` (full name) for `{service="svc",
    /// event_name="statement/t/q"}`.
    fn sample(text: &str, metric: &str) -> f64 {
        let prefix = format!("{metric}{{service=\"svc\",event_name=\"statement/t/q\"}} ");
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}in\n{text}"));
        line.split(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn statement_cpu_time_and_cancellations_are_counters() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = pfs_shm_layout::SegmentConfig {
            service_name: "svc".into(),
            ..Default::default()
        };
        let (_f, w) = segment_at(&dir.path().join("svc.3.pfs"), &cfg, 3, true);
        let q = statement_class(&w, "q");
        let slot = w.alloc_thread(1, 1, "worker").unwrap().index;
        let figures = |cpu_time_ps, cancelled| {
            Some(StatementFigures {
                cpu_time_ps,
                cancelled,
                ..StatementFigures::default()
            })
        };
        // A thread's statement (no CPU time), then two of task 5, one
        // cancelled.
        statement(&w, slot, q, (1, 1), 9_000_000, figures(0, 0));
        statement(&w, slot, q, (5, 1), 4_000_000, figures(1_500_000, 0));
        statement(&w, slot, q, (5, 2), 6_000_000, figures(2_500_000, 1));
        let snap = Snapshotter::new(
            crate::segments::SegmentSet::new(dir.path(), Duration::MAX),
            Duration::ZERO,
        );
        let text = render(&registry(Arc::new(snap), Arc::default())).unwrap();
        for (family, kind) in [
            ("pfs_events_statements_cpu_seconds", "counter"),
            ("pfs_events_statements_cancelled", "counter"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "{family}"
            );
        }
        assert!(text.contains("# UNIT pfs_events_statements_cpu_seconds seconds\n"));
        let help = text
            .lines()
            .find(|l| l.starts_with("# HELP pfs_events_statements_cpu_seconds "))
            .unwrap();
        assert!(help.contains("polled") && help.contains("0 for statements of threads"));
        let cpu = sample(&text, "pfs_events_statements_cpu_seconds_total");
        assert!((cpu - 4e-6).abs() < 1e-15, "{cpu}");
        assert_eq!(sample(&text, "pfs_events_statements_cancelled_total"), 1.0);
        // Not errors; wall time is the sum of TIMER_WAIT.
        assert_eq!(sample(&text, "pfs_events_statements_errors_total"), 0.0);
        let wall = sample(&text, "pfs_events_statements_seconds_total");
        assert!((wall - 19e-6).abs() < 1e-15, "{wall}");
    }
}
