//! Turns model families into OTLP `ExportMetricsServiceRequest`s: one
//! resource per service (unless `OTEL_SERVICE_NAME` forces one), start
//! times of cumulative series, and the previous values for delta.
//!
//! # Start times and the first delta
//!
//! A series' counts began at its service's [`Origin`] (the earliest start
//! of the processes in its totals, see [`super::starts`]); the agent's own
//! counters began when the agent started, except
//! `pfs.agent.retired_segments`, which the state file carries across
//! restarts (unknown origin).
//!
//! * **Cumulative**: `start_time` is the origin, or 0 (unknown, per OTLP)
//!   when it is unknown, so it is never later than the first counted event
//!   and stays the same across agent restarts. A total that goes down (a
//!   reset) starts again just before the export that sees it.
//! * **Delta**: the first observation of a series is a *baseline* unless
//!   its counts are known not to have been sent before: the series' origin
//!   is at or after the agent's start (its processes were watched from
//!   their start: the first delta is the whole value, from the origin), or
//!   its service was already being exported (a new series: the whole value,
//!   from the previous export). A baseline sends nothing for that series;
//!   the next export sends the change since it. So an agent restart never
//!   re-sends history.
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
use super::starts::{Origin, Origins, ServiceStarts};
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

/// One point to send, with what its start time depends on.
struct SeriesPoint {
    attrs: Vec<KeyValue>,
    value: Value,
    /// Identifies the series across exports.
    key: String,
    /// Its `service` label.
    service: ServiceKey,
    origin: Origin,
}

/// The series state a request builds.
#[derive(Default)]
struct BuildState {
    next: HashMap<String, SeriesState>,
    baselines: HashMap<String, SeriesState>,
    services: HashMap<ServiceKey, u64>,
    baseline_services: HashMap<ServiceKey, u64>,
}

/// The agent's own counter whose total outlives the agent (kept in the
/// state file): its origin is unknown.
const PERSISTED_AGENT_COUNTER: &str = "pfs.agent.retired_segments";

/// What the previous export said about one series.
#[derive(Debug, Clone)]
struct SeriesState {
    start_ns: u64,
    last_ns: u64,
    value: Value,
}

/// What the request builder knows of a series' service: the `service`
/// label (`None`: the agent's own series).
type ServiceKey = Option<String>;

/// Turns model families into OTLP requests, keeping per-series start times
/// (cumulative) or the previous values (delta). State is committed only
/// after a successful export, so a delta after failures covers the gap.
#[derive(Debug)]
pub struct RequestBuilder {
    cfg: Config,
    /// When the agent started (ns since the epoch).
    start_ns: u64,
    series: HashMap<String, SeriesState>,
    /// Services in the last delivered export (or a kept baseline), with
    /// its time.
    watched: HashMap<ServiceKey, u64>,
    origins: Origins,
}

/// A request and the series state to commit if it is delivered.
#[derive(Debug)]
pub struct Built {
    /// The request.
    pub request: ExportMetricsServiceRequest,
    /// Data points in it.
    pub points: usize,
    next: HashMap<String, SeriesState>,
    /// Series observed for the first time and not sent (delta baselines).
    baselines: HashMap<String, SeriesState>,
    services: HashMap<ServiceKey, u64>,
    baseline_services: HashMap<ServiceKey, u64>,
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
    /// A builder for `cfg`, in an agent that started at `agent_start`.
    pub fn new(cfg: Config, agent_start: SystemTime) -> Self {
        Self {
            cfg,
            start_ns: unix_nanos(agent_start),
            series: HashMap::new(),
            watched: HashMap::new(),
            origins: Origins::default(),
        }
    }

    /// Takes in what a snapshot says about each service's processes (call
    /// before [`RequestBuilder::build`] with the same snapshot).
    pub fn observe(&mut self, services: &[ServiceStarts]) {
        self.origins.update(services);
    }

    /// Records a delivered request's series state.
    pub fn commit(&mut self, built: Built) {
        self.series = built.next;
        self.watched = built.services;
    }

    /// Keeps what an undelivered request observed for the first time
    /// (delta baselines: nothing of them was sent), so the next export
    /// sends the change since then rather than taking a new baseline.
    pub fn keep_baselines(&mut self, built: Built) {
        for (key, state) in built.baselines {
            self.series.entry(key).or_insert(state);
        }
        for (svc, t) in built.baseline_services {
            self.watched.entry(svc).or_insert(t);
        }
    }

    /// When the counts of a series of `service` in family `otel_name`
    /// began.
    fn origin(&self, service: Option<&str>, otel_name: &str) -> Origin {
        match service {
            Some(s) => self.origins.of(s),
            None if otel_name == PERSISTED_AGENT_COUNTER => Origin::Unknown,
            None => Origin::Known(self.start_ns),
        }
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
        let mut st = BuildState::default();
        let mut points = 0;
        for f in families {
            let mut per_res: BTreeMap<Option<String>, Vec<SeriesPoint>> = BTreeMap::new();
            for p in &f.points {
                let service = p
                    .labels
                    .iter()
                    .find(|(k, _)| *k == "service")
                    .map(|(_, v)| v.clone());
                let origin = self.origin(service.as_deref(), f.otel_name);
                let attrs: Vec<KeyValue> = p
                    .labels
                    .iter()
                    .filter(|(k, _)| !(split && *k == "service"))
                    .map(|(k, v)| kv(k, str_value(v)))
                    .collect();
                let key = format!("{}\u{0}{:?}", f.otel_name, p.labels);
                let res = if split { service.clone() } else { None };
                per_res.entry(res).or_default().push(SeriesPoint {
                    attrs,
                    value: p.value.clone(),
                    key,
                    service,
                    origin,
                });
            }
            for (res, pts) in per_res {
                let data = self.data(f, pts, now_ns, delta, temporality, &mut st);
                if data.1 == 0 {
                    continue;
                }
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
            next: st.next,
            baselines: st.baselines,
            services: st.services,
            baseline_services: st.baseline_services,
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
        st: &mut BuildState,
    ) -> (metric::Data, usize) {
        let mut n = 0;
        let mut numbers = Vec::new();
        let mut hists = Vec::new();
        let mut exp_hists = Vec::new();
        let exponential = self.cfg.histogram_aggregation == HistogramAggregation::Base2Exponential;
        for pt in pts {
            let SeriesPoint {
                attrs,
                value,
                key,
                service,
                origin,
            } = pt;
            st.services.insert(service.clone(), now_ns);
            let (start_ns, out) = match f.kind {
                Kind::Counter | Kind::Histogram => {
                    let known = self.series.get(&key);
                    let prev = known.filter(|s| monotonic_le(&s.value, &value));
                    let origin_ns = match origin {
                        Origin::Known(t) => t,
                        Origin::Unknown => 0,
                    };
                    let (start, out, series_start) = match (prev, delta) {
                        (Some(p), false) => (p.start_ns, Some(value.clone()), p.start_ns),
                        (Some(p), true) => (p.last_ns, Some(minus(&value, &p.value)), p.start_ns),
                        // A reset (the value went down): counts since just
                        // before this export.
                        (None, _) if known.is_some() => {
                            let s = now_ns.saturating_sub(1);
                            (s, Some(value.clone()), s)
                        }
                        (None, false) => (origin_ns, Some(value.clone()), origin_ns),
                        // Delta, first observation: the whole value if none
                        // of it can have been sent before, else a baseline.
                        (None, true) => match (origin, self.watched.get(&service)) {
                            (Origin::Known(t), _) if t >= self.start_ns => {
                                (t, Some(value.clone()), t)
                            }
                            (_, Some(&since)) => (since, Some(value.clone()), since),
                            _ => (now_ns, None, origin_ns),
                        },
                    };
                    let state = SeriesState {
                        start_ns: series_start,
                        last_ns: now_ns,
                        value,
                    };
                    let Some(out) = out else {
                        st.baselines.insert(key.clone(), state.clone());
                        st.baseline_services.insert(service, now_ns);
                        st.next.insert(key, state);
                        continue;
                    };
                    st.next.insert(key, state);
                    (start, out)
                }
                Kind::Gauge | Kind::Info => (0, value),
            };
            n += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::model::Point;
    use crate::export::otlp::config::OtlpArgs;
    use std::time::Duration;

    fn cfg(temporality: Temporality) -> Config {
        let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://c:4318".into());
        Config {
            temporality,
            ..Config::resolve(&OtlpArgs::default(), &env)
                .unwrap()
                .unwrap()
        }
    }

    fn at(ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(ns)
    }

    /// `pfs.events.waits` of services `old`, `new` and `gone`, and the
    /// agent's own `pfs.agent.snapshots`, with `v` added to each value.
    fn families(v: u64) -> Vec<Family> {
        let counter = |name, otel, points| Family {
            name,
            unit: None,
            otel_name: otel,
            otel_unit: "1",
            help: "",
            kind: Kind::Counter,
            points,
        };
        let svc = |s: &str, n| Point {
            labels: vec![("service", s.to_string()), ("event_name", "e".into())],
            value: Value::Int(n + v),
        };
        vec![
            counter(
                "pfs_events_waits",
                "pfs.events.waits",
                vec![svc("old", 1_000_000), svc("new", 7), svc("gone", 500)],
            ),
            counter(
                "pfs_agent_snapshots",
                "pfs.agent.snapshots",
                vec![Point {
                    labels: vec![],
                    value: Value::Int(3 + v),
                }],
            ),
        ]
    }

    fn observe(b: &mut RequestBuilder) {
        b.observe(&[
            ServiceStarts {
                service: "old".into(),
                earliest_ns: Some(100),
                unknown_history: false,
            },
            ServiceStarts {
                service: "new".into(),
                earliest_ns: Some(2_000),
                unknown_history: false,
            },
            ServiceStarts {
                service: "gone".into(),
                earliest_ns: Some(2_500),
                unknown_history: true,
            },
        ]);
    }

    /// (service, value, start) of every `pfs.events.waits` and
    /// `pfs.agent.snapshots` point.
    fn sums(b: &Built) -> Vec<(String, i64, u64)> {
        let mut out = Vec::new();
        for rm in &b.request.resource_metrics {
            for m in &rm.scope_metrics[0].metrics {
                let Some(metric::Data::Sum(s)) = &m.data else {
                    continue;
                };
                for p in &s.data_points {
                    let svc = p
                        .attributes
                        .iter()
                        .find(|a| a.key == "service")
                        .and_then(|a| a.value.clone())
                        .map(|v| match v.value {
                            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s,
                            _ => String::new(),
                        })
                        .unwrap_or_else(|| m.name.clone());
                    let Some(number_data_point::Value::AsInt(v)) = p.value else {
                        panic!("not an int")
                    };
                    out.push((svc, v, p.start_time_unix_nano));
                }
            }
        }
        out.sort();
        out
    }

    fn forced(t: Temporality) -> Config {
        Config {
            service_name: Some("one".into()),
            ..cfg(t)
        }
    }

    #[test]
    fn first_delta_never_resends_history() {
        let mut b = RequestBuilder::new(forced(Temporality::Delta), at(1_000));
        observe(&mut b);
        let first = b.build(&families(0), at(3_000));
        // `old` started before the agent: a baseline, nothing sent. `gone`
        // has retired totals of unknown start: a baseline too. `new`
        // was watched from its start: its whole count, from its start.
        assert_eq!(
            sums(&first),
            [
                ("new".into(), 7, 2_000),
                ("pfs.agent.snapshots".into(), 3, 1_000)
            ]
        );
        b.commit(first);
        let second = b.build(&families(5), at(4_000));
        assert_eq!(
            sums(&second),
            [
                ("gone".into(), 5, 3_000),
                ("new".into(), 5, 3_000),
                ("old".into(), 5, 3_000),
                ("pfs.agent.snapshots".into(), 5, 3_000)
            ]
        );
    }

    #[test]
    fn baselines_survive_a_failed_export() {
        let mut b = RequestBuilder::new(forced(Temporality::Delta), at(1_000));
        observe(&mut b);
        let first = b.build(&families(0), at(3_000));
        b.keep_baselines(first);
        let second = b.build(&families(5), at(4_000));
        let got = sums(&second);
        assert!(got.contains(&("old".into(), 5, 3_000)), "{got:?}");
        // Not delivered before: the whole count again.
        assert!(got.contains(&("new".into(), 12, 2_000)), "{got:?}");
    }

    #[test]
    fn cumulative_starts_at_the_first_counted_event() {
        let mut b = RequestBuilder::new(forced(Temporality::Cumulative), at(1_000));
        observe(&mut b);
        let first = b.build(&families(0), at(3_000));
        assert_eq!(
            sums(&first),
            [
                ("gone".into(), 500, 0),
                ("new".into(), 7, 2_000),
                ("old".into(), 1_000_000, 100),
                ("pfs.agent.snapshots".into(), 3, 1_000)
            ]
        );
        b.commit(first);
        let second = b.build(&families(1), at(4_000));
        assert!(sums(&second).contains(&("old".into(), 1_000_001, 100)));
    }
}
