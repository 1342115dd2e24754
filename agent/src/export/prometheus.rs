//! `/metrics` in OpenMetrics text, through a `prometheus-client`
//! [`Collector`] that encodes the current snapshot on every scrape.
//!
//! Metric families (label `service` is the segment's service name,
//! `event_name` the PFS instrument name, as in mysqld_exporter):
//!
//! | family | type | meaning |
//! |--------|------|---------|
//! | `pfs_events_waits_total` | counter | waits completed (`COUNT_STAR`) |
//! | `pfs_events_waits_seconds_total` | counter | time spent waiting (`SUM_TIMER_WAIT`) |
//! | `pfs_events_waits_duration_seconds` | histogram | wait latency (timed waits) |
//! | `pfs_threads` | gauge | live instrumented threads |
//! | `pfs_lost_total` | counter | what did not fit, by `kind` |
//! | `pfs_agent_*` | various | the agent's own health |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pfs_shm_layout::layout::{HISTOGRAM_BUCKETS, LostKind, bucket_upper_ps};
use pfs_shm_layout::reader::Summary;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::aggregate::by_service;
use crate::snapshot::Snapshotter;

/// The OpenMetrics content type served on `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encodes the agent's view of every segment on each scrape.
#[derive(Debug)]
pub struct PfsCollector {
    snap: Arc<Snapshotter>,
    /// Render time of the previous scrape, seconds as `f64` bits.
    pub last_render_seconds: Arc<AtomicU64>,
}

impl PfsCollector {
    /// A collector over `snap`.
    pub fn new(snap: Arc<Snapshotter>) -> Self {
        Self {
            snap,
            last_render_seconds: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// A registry with the PFS collector, ready to encode.
pub fn registry(snap: Arc<Snapshotter>) -> (Registry, Arc<AtomicU64>) {
    let c = PfsCollector::new(snap);
    let render = c.last_render_seconds.clone();
    let mut r = Registry::default();
    r.register_collector(Box::new(c));
    (r, render)
}

/// Renders the registry as OpenMetrics text.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::with_capacity(64 * 1024);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

const fn ps_to_s(ps: u128) -> f64 {
    ps as f64 / 1e12
}

fn counter(m: &mut MetricEncoder<'_>, labels: &[(&str, &str)], v: u64) -> std::fmt::Result {
    m.encode_family(&labels)?
        .encode_counter::<NoLabelSet, u64, u64>(&v, None)
}

fn counter_f(m: &mut MetricEncoder<'_>, labels: &[(&str, &str)], v: f64) -> std::fmt::Result {
    m.encode_family(&labels)?
        .encode_counter::<NoLabelSet, f64, f64>(&v, None)
}

fn gauge(m: &mut MetricEncoder<'_>, labels: &[(&str, &str)], v: f64) -> std::fmt::Result {
    m.encode_family(&labels)?.encode_gauge(&v)
}

fn histogram(m: &mut MetricEncoder<'_>, labels: &[(&str, &str)], s: &Summary) -> std::fmt::Result {
    let mut buckets = [(0.0, 0u64); HISTOGRAM_BUCKETS];
    for (i, b) in buckets.iter_mut().enumerate() {
        let le = bucket_upper_ps(i)
            .map(|ps| ps as f64 / 1e12)
            .unwrap_or(f64::INFINITY);
        *b = (le, s.buckets[i]);
    }
    m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
        ps_to_s(s.sum_ps),
        s.timed_count,
        &buckets,
        None,
    )
}

impl Collector for PfsCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let snap = self.snap.get();
        let services = by_service(snap.segments.iter().map(|v| &v.data), &snap.retired);

        let mut m = enc.encode_descriptor(
            "pfs_events_waits",
            "Waits completed (COUNT_STAR), by instrument.",
            None,
            MetricType::Counter,
        )?;
        for (svc, t) in &services {
            for (name, (kind, s)) in &t.classes {
                if kind.is_wait() {
                    counter(&mut m, &[("service", svc), ("event_name", name)], s.count)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "pfs_events_waits",
            "Time spent in timed waits (SUM_TIMER_WAIT), by instrument.",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        for (svc, t) in &services {
            for (name, (kind, s)) in &t.classes {
                if kind.is_wait() {
                    counter_f(
                        &mut m,
                        &[("service", svc), ("event_name", name)],
                        ps_to_s(s.sum_ps),
                    )?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "pfs_events_waits_duration",
            "Latency of timed waits, by instrument.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (svc, t) in &services {
            for (name, (kind, s)) in &t.classes {
                if kind.is_wait() {
                    histogram(&mut m, &[("service", svc), ("event_name", name)], s)?;
                }
            }
        }
        let mut m = enc.encode_descriptor(
            "pfs_threads",
            "Live instrumented threads.",
            None,
            MetricType::Gauge,
        )?;
        for (svc, t) in &services {
            gauge(&mut m, &[("service", svc)], t.threads as f64)?;
        }
        let mut m = enc.encode_descriptor(
            "pfs_lost",
            "Instances that did not fit a bounded structure, by kind (PFS *_lost variables).",
            None,
            MetricType::Counter,
        )?;
        for (svc, t) in &services {
            for k in LostKind::ALL {
                counter(
                    &mut m,
                    &[("service", svc), ("kind", k.name())],
                    t.lost[k as usize],
                )?;
            }
        }

        // The agent's own figures.
        let live = snap.segments.iter().filter(|s| s.live).count();
        let dead = snap.segments.len() - live;
        let mut m = enc.encode_descriptor(
            "pfs_agent_segments",
            "Segment files by state.",
            None,
            MetricType::Gauge,
        )?;
        for (state, n) in [
            ("live", live),
            ("dead", dead),
            ("invalid", snap.invalid.len()),
        ] {
            gauge(&mut m, &[("state", state)], n as f64)?;
        }
        let mut m = enc.encode_descriptor(
            "pfs_agent_segment_errors",
            "Segment files refused, by reason.",
            None,
            MetricType::Counter,
        )?;
        let mut errors: Vec<_> = snap.errors.iter().collect();
        errors.sort();
        for (reason, n) in errors {
            counter(&mut m, &[("reason", reason)], *n)?;
        }
        let tot = self.snap.totals();
        for (name, help, v) in [
            (
                "pfs_agent_snapshots",
                "Snapshots of all segments taken.",
                tot.snapshots,
            ),
            (
                "pfs_agent_read_retries",
                "Sequence-locked reads retried because a writer was active.",
                tot.retries,
            ),
            (
                "pfs_agent_skipped_rows",
                "Summary rows skipped after their retry budget.",
                tot.skipped_rows,
            ),
            (
                "pfs_agent_carried_rows",
                "Skipped rows replaced by their previous value.",
                tot.carried_rows,
            ),
            (
                "pfs_agent_skipped_events",
                "Event rows skipped after their retry budget.",
                tot.skipped_events,
            ),
            (
                "pfs_agent_failed_reads",
                "Segment snapshots that failed.",
                tot.failed_reads,
            ),
            (
                "pfs_agent_retired_segments",
                "Dead segments folded into service totals and removed.",
                snap.retired_segments,
            ),
        ] {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            m.encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
        }
        let mut m = enc.encode_descriptor(
            "pfs_agent_snapshot_duration",
            "Time the last snapshot of all segments took.",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        m.encode_gauge(&snap.duration.as_secs_f64())?;
        let mut m = enc.encode_descriptor(
            "pfs_agent_scrape_duration",
            "Time the previous /metrics scrape took to snapshot and render.",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        m.encode_gauge(&f64::from_bits(
            self.last_render_seconds.load(Ordering::Relaxed),
        ))?;
        let mut m =
            enc.encode_descriptor("pfs_agent_build", "Agent version.", None, MetricType::Info)?;
        m.encode_info(&[("version", env!("CARGO_PKG_VERSION"))])?;
        Ok(())
    }
}
