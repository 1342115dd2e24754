//! `/metrics` in the expositions Prometheus scrapes, through a
//! `prometheus-client` [`Collector`] that encodes the [`super::model`]
//! families of the current snapshot on every scrape: OpenMetrics text
//! (classic histogram buckets; the default) and, for a scraper whose
//! `Accept` header prefers it, the Prometheus protobuf exposition, whose
//! latency histograms carry both the classic buckets and the native ones
//! (schema 0, see [`super::exponential`]), or the classic text format
//! ([`super::classic`]). See the README for what each metric means.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, MetricEncoder, NativeHistogram, NativeHistogramBuckets, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::exponential::Exponential;
use super::model::{self, AgentStats, Kind, Value};
use crate::snapshot::Snapshotter;

/// The OpenMetrics content type served on `/metrics` by default.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The Prometheus protobuf exposition's content type (length-delimited
/// `io.prometheus.client.MetricFamily` messages).
pub const PROTOBUF_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// The classic Prometheus text format's content type.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How `/metrics` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics text: classic histogram buckets (every text scraper;
    /// the default).
    Text,
    /// Prometheus protobuf: classic and native histogram buckets (what
    /// Prometheus asks for first with `--enable-feature=native-histograms`).
    Protobuf,
    /// The classic Prometheus text format (`text/plain; version=0.0.4`),
    /// for tools that read only it.
    Classic,
}

impl Exposition {
    /// Every exposition, in a fixed order (an index for per-exposition
    /// caches).
    pub const ALL: [Exposition; 3] = [Exposition::Text, Exposition::Protobuf, Exposition::Classic];

    /// The exposition a scrape asks for: of those its `Accept` header
    /// lists with a non-zero quality (`q`, 1 if absent), the one with the
    /// highest; on a tie protobuf (the `io.prometheus.client.MetricFamily`
    /// media type), then OpenMetrics (`application/openmetrics-text`), then
    /// the classic text (`text/plain`). Anything else, `*/*` or no header:
    /// OpenMetrics.
    ///
    /// ```
    /// use pfs_agent::export::prometheus::Exposition;
    ///
    /// // Prometheus 2.42 with native histograms enabled:
    /// let native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    /// assert_eq!(Exposition::from_accept(Some(native)), Exposition::Protobuf);
    /// // Prometheus by default:
    /// let om = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    /// assert_eq!(Exposition::from_accept(Some(om)), Exposition::Text);
    /// assert_eq!(Exposition::from_accept(Some("text/plain;version=0.0.4")), Exposition::Classic);
    /// assert_eq!(Exposition::from_accept(Some("*/*")), Exposition::Text);
    /// assert_eq!(Exposition::from_accept(None), Exposition::Text);
    /// ```
    pub fn from_accept(accept: Option<&str>) -> Self {
        // The best quality seen for each exposition, in tie-break order.
        let order = [Exposition::Protobuf, Exposition::Text, Exposition::Classic];
        let mut best = [0.0f64; 3];
        for range in accept.unwrap_or_default().split(',') {
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            let (mut proto, mut q) = (false, 1.0);
            for p in params {
                match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                    Some(("proto", v)) => proto = v == "io.prometheus.client.MetricFamily",
                    Some(("q", v)) => q = v.parse::<f64>().unwrap_or(0.0),
                    _ => {}
                }
            }
            let is = |m: &str| media.eq_ignore_ascii_case(m);
            let slot = if is("application/vnd.google.protobuf") && proto {
                0
            } else if is("application/openmetrics-text") {
                1
            } else if is("text/plain") {
                2
            } else {
                continue;
            };
            best[slot] = best[slot].max(q);
        }
        let top = best.iter().copied().fold(0.0, f64::max);
        if top <= 0.0 {
            return Exposition::Text;
        }
        order[best.iter().position(|&q| q == top).unwrap_or(1)]
    }

    /// The `Content-Type` of a body in this exposition.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::Text => CONTENT_TYPE,
            Exposition::Protobuf => PROTOBUF_CONTENT_TYPE,
            Exposition::Classic => CLASSIC_CONTENT_TYPE,
        }
    }

    /// This exposition's index in [`Exposition::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

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

/// Size of the previous text rendering: the next one starts with that much
/// room, so the text is written once, without growing (and copying) the
/// buffer.
static LAST_LEN: AtomicUsize = AtomicUsize::new(64 * 1024);

/// Renders the registry as OpenMetrics text.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let room = LAST_LEN.load(Ordering::Relaxed);
    let mut out = String::with_capacity(room + room / 8);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    LAST_LEN.store(out.len(), Ordering::Relaxed);
    Ok(out)
}

/// Renders the registry in `exposition`.
pub fn render_as(registry: &Registry, exposition: Exposition) -> Result<Vec<u8>, RenderError> {
    match exposition {
        Exposition::Text => Ok(render(registry)?.into_bytes()),
        Exposition::Classic => {
            Ok(super::classic::from_openmetrics(&render(registry)?).into_bytes())
        }
        Exposition::Protobuf => {
            prometheus_client::encoding::prometheus_protobuf::encode_to_vec(registry)
                .map_err(|e| RenderError::Protobuf(format!("{e:?}")))
        }
    }
}

/// Why `/metrics` could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The text encoder failed.
    #[error("encoding /metrics as text failed")]
    Text(#[from] std::fmt::Error),
    /// The protobuf encoder failed.
    #[error("encoding /metrics as protobuf failed: {0}")]
    Protobuf(String),
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
                } else if labels.is_empty() {
                    // Without `encode_family`: an empty label set would be
                    // written `{}`.
                    encode_point(&mut m, &p.value, f.kind)?;
                } else {
                    encode_point(&mut m.encode_family(&labels)?, &p.value, f.kind)?;
                }
            }
        }
        Ok(())
    }
}

/// One point's value, under the labels `e` was made with.
fn encode_point(e: &mut MetricEncoder<'_>, value: &Value, kind: Kind) -> std::fmt::Result {
    match (value, kind) {
        (Value::Int(v), Kind::Counter) => e.encode_counter::<NoLabelSet, u64, u64>(v, None),
        (Value::Float(v), Kind::Counter) => e.encode_counter::<NoLabelSet, f64, f64>(v, None),
        (Value::Int(v), _) => e.encode_gauge(&(*v as f64)),
        (Value::Float(v), _) => e.encode_gauge(v),
        (
            Value::Histogram {
                sum,
                count,
                buckets,
            },
            _,
        ) => {
            // The text encoder writes the classic buckets only; the
            // protobuf one both.
            let x = Exponential::from_classic(buckets);
            let (spans, deltas) = x.prometheus_spans();
            let native = NativeHistogram {
                schema: 0,
                zero_threshold: x.zero_threshold,
                zero_count: x.zero_count,
                negative: NativeHistogramBuckets {
                    spans: &[],
                    deltas: &[],
                },
                positive: NativeHistogramBuckets {
                    spans: &spans,
                    deltas: &deltas,
                },
                created: None,
            };
            e.encode_histogram_with_native::<NoLabelSet>(*sum, *count, buckets, None, native)
        }
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

    /// A metric without labels is written bare, `name value`, not
    /// `name{} value`.
    #[test]
    fn unlabelled_metrics_have_no_braces() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = pfs_shm_layout::SegmentConfig {
            service_name: "svc".into(),
            ..Default::default()
        };
        let _seg = segment_at(&dir.path().join("svc.7.pfs"), &cfg, 7, true);
        let snap = Snapshotter::new(
            crate::segments::SegmentSet::new(dir.path(), Duration::MAX),
            Duration::ZERO,
        );
        let text = render(&registry(Arc::new(snap), Arc::default())).unwrap();
        assert!(!text.contains("{}"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("pfs_agent_snapshots_total ")),
            "{text}"
        );
    }
}
