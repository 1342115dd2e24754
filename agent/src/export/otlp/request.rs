//! Turns model families into OTLP `ExportMetricsServiceRequest`s: one
//! resource per service (unless `OTEL_SERVICE_NAME` forces one), start
//! times of cumulative series, and the previous values for delta.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    exponential_histogram_data_point, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::config::{Config, HistogramAggregation, Temporality, kv, str_value};
use crate::export::exponential::Exponential;
use crate::export::model::{Family, Kind, Value};

/// `service.name` of the agent's own metrics (those without a `service`
/// label) when exporting one resource per service.
pub const AGENT_SERVICE_NAME: &str = "pfs-agent";

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A point's attributes, value and series key.
type SeriesPoint = (Vec<KeyValue>, Value, String);

/// What the previous export said about one series.
#[derive(Debug, Clone)]
struct SeriesState {
    start_ns: u64,
    last_ns: u64,
    value: Value,
}

/// Turns model families into OTLP requests, keeping per-series start times
/// (cumulative) or the previous values (delta). State is committed only
/// after a successful export, so a delta after failures covers the gap.
#[derive(Debug)]
pub struct RequestBuilder {
    cfg: Config,
    start_ns: u64,
    series: HashMap<String, SeriesState>,
}

/// A request and the series state to commit if it is delivered.
#[derive(Debug)]
pub struct Built {
    /// The request.
    pub request: ExportMetricsServiceRequest,
    /// Data points in it.
    pub points: usize,
    next: HashMap<String, SeriesState>,
}

fn monotonic_le(prev: &Value, cur: &Value) -> bool {
    match (prev, cur) {
        (Value::Int(a), Value::Int(b)) => a <= b,
        (Value::Float(a), Value::Float(b)) => a <= b,
        (Value::Histogram { count: a, .. }, Value::Histogram { count: b, .. }) => a <= b,
        _ => false,
    }
}

fn minus(cur: &Value, prev: &Value) -> Value {
    match (cur, prev) {
        (Value::Int(a), Value::Int(b)) => Value::Int(a - b),
        (Value::Float(a), Value::Float(b)) => Value::Float(a - b),
        (
            Value::Histogram {
                sum,
                count,
                buckets,
            },
            Value::Histogram {
                sum: ps,
                count: pc,
                buckets: pb,
            },
        ) if buckets.len() == pb.len() => Value::Histogram {
            sum: sum - ps,
            count: count - pc,
            buckets: buckets
                .iter()
                .zip(pb)
                .map(|((le, c), (_, p))| (*le, c.saturating_sub(*p)))
                .collect(),
        },
        _ => cur.clone(),
    }
}

impl RequestBuilder {
    /// A builder for `cfg`; cumulative series start now.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            start_ns: unix_nanos(SystemTime::now()),
            series: HashMap::new(),
        }
    }

    /// Records a delivered request's series state.
    pub fn commit(&mut self, built: Built) {
        self.series = built.next;
    }

    fn resource(&self, service: Option<&str>) -> Resource {
        let mut attrs = vec![kv(
            "service.name",
            self.cfg
                .forced_service()
                .unwrap_or_else(|| str_value(service.unwrap_or(AGENT_SERVICE_NAME))),
        )];
        attrs.extend(
            self.cfg
                .resource
                .iter()
                .filter(|(k, _)| k != "service.name")
                .map(|(k, v)| kv(k, v.clone())),
        );
        Resource {
            attributes: attrs,
            ..Default::default()
        }
    }

    /// The request for `families` at time `now`.
    pub fn build(&self, families: &[Family], now: SystemTime) -> Built {
        let now_ns = unix_nanos(now);
        let split = self.cfg.forced_service().is_none();
        let delta = self.cfg.temporality == Temporality::Delta;
        let temporality = if delta {
            AggregationTemporality::Delta
        } else {
            AggregationTemporality::Cumulative
        } as i32;
        // resource key (service or None for the agent's own) → metrics
        let mut by_res: BTreeMap<Option<String>, Vec<Metric>> = BTreeMap::new();
        let mut next = HashMap::new();
        let mut points = 0;
        for f in families {
            let mut per_res: BTreeMap<Option<String>, Vec<SeriesPoint>> = BTreeMap::new();
            for p in &f.points {
                let service = p
                    .labels
                    .iter()
                    .find(|(k, _)| *k == "service")
                    .map(|(_, v)| v.clone());
                let attrs: Vec<KeyValue> = p
                    .labels
                    .iter()
                    .filter(|(k, _)| !(split && *k == "service"))
                    .map(|(k, v)| kv(k, str_value(v)))
                    .collect();
                let key = format!("{}\u{0}{:?}", f.otel_name, p.labels);
                let res = if split { service } else { None };
                per_res
                    .entry(res)
                    .or_default()
                    .push((attrs, p.value.clone(), key));
            }
            for (res, pts) in per_res {
                let data = self.data(f, pts, now_ns, delta, temporality, &mut next);
                points += data.1;
                by_res.entry(res).or_default().push(Metric {
                    name: f.otel_name.to_string(),
                    description: f.help.to_string(),
                    unit: f.otel_unit.to_string(),
                    data: Some(data.0),
                    ..Default::default()
                });
            }
        }
        let scope = InstrumentationScope {
            name: "pfs-agent".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        };
        let resource_metrics = by_res
            .into_iter()
            .map(|(res, metrics)| ResourceMetrics {
                resource: Some(self.resource(res.as_deref())),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope.clone()),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        Built {
            request: ExportMetricsServiceRequest { resource_metrics },
            points,
            next,
        }
    }

    /// The OTLP data of one family's points for one resource, and the
    /// number of points.
    fn data(
        &self,
        f: &Family,
        pts: Vec<SeriesPoint>,
        now_ns: u64,
        delta: bool,
        temporality: i32,
        next: &mut HashMap<String, SeriesState>,
    ) -> (metric::Data, usize) {
        let n = pts.len();
        let mut numbers = Vec::new();
        let mut hists = Vec::new();
        let mut exp_hists = Vec::new();
        let exponential = self.cfg.histogram_aggregation == HistogramAggregation::Base2Exponential;
        for (attrs, value, key) in pts {
            let (start_ns, out) = match f.kind {
                Kind::Counter | Kind::Histogram => {
                    let prev = self
                        .series
                        .get(&key)
                        .filter(|s| monotonic_le(&s.value, &value));
                    let (start, out, series_start) = match (prev, delta) {
                        (Some(p), false) => (p.start_ns, value.clone(), p.start_ns),
                        (Some(p), true) => (p.last_ns, minus(&value, &p.value), p.start_ns),
                        // New series, or a reset (value went down).
                        (None, _) => {
                            let s = if self.series.contains_key(&key) {
                                now_ns.saturating_sub(1)
                            } else {
                                self.start_ns
                            };
                            (s, value.clone(), s)
                        }
                    };
                    next.insert(
                        key,
                        SeriesState {
                            start_ns: series_start,
                            last_ns: now_ns,
                            value,
                        },
                    );
                    (start, out)
                }
                Kind::Gauge | Kind::Info => (0, value),
            };
            match out {
                Value::Int(v) => numbers.push(NumberDataPoint {
                    attributes: attrs,
                    start_time_unix_nano: start_ns,
                    time_unix_nano: now_ns,
                    value: Some(number_data_point::Value::AsInt(v as i64)),
                    ..Default::default()
                }),
                Value::Float(v) => numbers.push(NumberDataPoint {
                    attributes: attrs,
                    start_time_unix_nano: start_ns,
                    time_unix_nano: now_ns,
                    value: Some(number_data_point::Value::AsDouble(v)),
                    ..Default::default()
                }),
                Value::Histogram {
                    sum,
                    count,
                    buckets,
                } if exponential => {
                    let x = Exponential::from_classic(&buckets);
                    exp_hists.push(ExponentialHistogramDataPoint {
                        attributes: attrs,
                        start_time_unix_nano: start_ns,
                        time_unix_nano: now_ns,
                        count,
                        sum: Some(sum),
                        scale: 0,
                        zero_count: x.zero_count,
                        zero_threshold: x.zero_threshold,
                        positive: Some(exponential_histogram_data_point::Buckets {
                            offset: x.otlp_offset(),
                            bucket_counts: x.counts,
                        }),
                        ..Default::default()
                    });
                }
                Value::Histogram {
                    sum,
                    count,
                    buckets,
                } => {
                    let mut bounds: Vec<f64> = buckets.iter().map(|b| b.0).collect();
                    let mut counts: Vec<u64> = buckets.iter().map(|b| b.1).collect();
                    if bounds.last().is_some_and(|b| b.is_infinite()) {
                        bounds.pop();
                    } else {
                        counts.push(0);
                    }
                    hists.push(HistogramDataPoint {
                        attributes: attrs,
                        start_time_unix_nano: start_ns,
                        time_unix_nano: now_ns,
                        count,
                        sum: Some(sum),
                        bucket_counts: counts,
                        explicit_bounds: bounds,
                        ..Default::default()
                    });
                }
            }
        }
        let data = match f.kind {
            Kind::Counter => metric::Data::Sum(Sum {
                data_points: numbers,
                aggregation_temporality: temporality,
                is_monotonic: true,
            }),
            Kind::Gauge | Kind::Info => metric::Data::Gauge(Gauge {
                data_points: numbers,
            }),
            Kind::Histogram if exponential => {
                metric::Data::ExponentialHistogram(ExponentialHistogram {
                    data_points: exp_hists,
                    aggregation_temporality: temporality,
                })
            }
            Kind::Histogram => metric::Data::Histogram(Histogram {
                data_points: hists,
                aggregation_temporality: temporality,
            }),
        };
        (data, n)
    }
}
