//! The metric families the agent exports, computed once per snapshot and
//! rendered by every exporter (`/metrics`, OTLP). Each family carries its
//! Prometheus name and its OpenTelemetry name and unit; under the
//! OpenTelemetry → Prometheus translation rules (dots to underscores, unit
//! suffix added unless present, `_total` for monotonic sums) the OTel name
//! becomes exactly the Prometheus name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pfs_shm_layout::container::PageState;
use pfs_shm_layout::layout::{HISTOGRAM_BUCKETS, LostKind, TimerId};
use pfs_shm_layout::reader::{IoFigures, Summary};
use pfs_shm_layout::{ClassKind, EventKind, IoMode};

use crate::aggregate::{ServiceTotals, by_service, running};
use crate::segments::{ListFailure, Refusal};
use crate::snapshot::{Snapshot, Totals};
use crate::timers;

/// The agent's own figures that are not in a snapshot, shared by the
/// parts that make them (the `/metrics` cache, the OTLP exporter) and
/// every exporter that reports them.
#[derive(Debug, Default)]
pub struct AgentStats {
    /// Seconds the previous `/metrics` scrape took, as `f64` bits.
    scrape_seconds: AtomicU64,
    /// OTLP export is configured.
    otlp_enabled: AtomicBool,
    /// OTLP exports, by [`ExportResult`] (index = position in `ALL`).
    otlp_exports: [AtomicU64; ExportResult::ALL.len()],
    /// Data points the collector said it rejected (partial success).
    otlp_rejected_points: AtomicU64,
}

/// The outcome of one OTLP export: the `result` label of
/// `pfs_agent_otlp_exports_total`. Every value is exported from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportResult {
    /// Delivered.
    Success,
    /// Delivered, but the collector rejected some data points (OTLP
    /// partial success; its message is logged).
    Partial,
    /// Not delivered: TLS failed (collector certificate not trusted,
    /// client certificate refused...).
    TlsFailure,
    /// Not delivered, for any other reason (connection refused, timeout,
    /// an error status).
    Failure,
}

impl ExportResult {
    /// Every result, in label order.
    pub const ALL: [Self; 4] = [
        Self::Failure,
        Self::Partial,
        Self::Success,
        Self::TlsFailure,
    ];

    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Partial => "partial",
            Self::TlsFailure => "tls_failure",
            Self::Failure => "failure",
        }
    }

    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|r| *r == self)
            .expect("ALL lists every result")
    }
}

impl AgentStats {
    /// Records how long a `/metrics` scrape took.
    pub fn set_scrape_seconds(&self, s: f64) {
        self.scrape_seconds.store(s.to_bits(), Ordering::Relaxed);
    }

    /// Seconds the previous `/metrics` scrape took.
    pub fn scrape_seconds(&self) -> f64 {
        f64::from_bits(self.scrape_seconds.load(Ordering::Relaxed))
    }

    /// Marks OTLP export as configured (its counter is exported from now).
    pub fn enable_otlp(&self) {
        self.otlp_enabled.store(true, Ordering::Relaxed);
    }

    /// Counts one OTLP export.
    pub fn count_otlp_export(&self, result: ExportResult) {
        self.otlp_exports[result.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts data points a collector rejected.
    pub fn count_otlp_rejected(&self, points: u64) {
        self.otlp_rejected_points
            .fetch_add(points, Ordering::Relaxed);
    }

    /// Data points collectors rejected, if OTLP is configured.
    pub fn otlp_rejected_points(&self) -> Option<u64> {
        self.otlp_enabled
            .load(Ordering::Relaxed)
            .then(|| self.otlp_rejected_points.load(Ordering::Relaxed))
    }

    /// OTLP exports by result (every [`ExportResult`]), if OTLP is
    /// configured.
    pub fn otlp_exports(&self) -> Option<[(ExportResult, u64); ExportResult::ALL.len()]> {
        self.otlp_enabled.load(Ordering::Relaxed).then(|| {
            ExportResult::ALL.map(|r| (r, self.otlp_exports[r.index()].load(Ordering::Relaxed)))
        })
    }
}

/// The instrument type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic sum (`_total`).
    Counter,
    /// Point-in-time value.
    Gauge,
    /// Latency histogram.
    Histogram,
    /// Constant 1 with labels (`_info`).
    Info,
}

/// One labelled value.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// Label pairs.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: Value,
}

/// A point's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Integer counter or gauge.
    Int(u64),
    /// Floating-point counter or gauge.
    Float(f64),
    /// Histogram: sum, count, and per-bucket (non-cumulative) counts by
    /// inclusive upper bound (the last is +Inf).
    Histogram {
        /// Sum of observations.
        sum: f64,
        /// Number of observations.
        count: u64,
        /// `(upper_bound, count)` per bucket.
        buckets: Vec<(f64, u64)>,
    },
}

/// A metric family.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Prometheus base name: without the unit suffix and without `_total`.
    pub name: &'static str,
    /// Prometheus unit suffix (`seconds`, `bytes`, `hertz`), if any.
    pub unit: Option<&'static str>,
    /// OpenTelemetry instrument name.
    pub otel_name: &'static str,
    /// OpenTelemetry (UCUM) unit.
    pub otel_unit: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Type.
    pub kind: Kind,
    /// The values.
    pub points: Vec<Point>,
}

impl Family {
    fn new(
        name: &'static str,
        unit: Option<&'static str>,
        otel: (&'static str, &'static str),
        kind: Kind,
        help: &'static str,
    ) -> Self {
        Self {
            name,
            unit,
            otel_name: otel.0,
            otel_unit: otel.1,
            help,
            kind,
            points: Vec::new(),
        }
    }

    fn push(&mut self, labels: Vec<(&'static str, String)>, value: Value) {
        self.points.push(Point { labels, value });
    }

    /// The full Prometheus name of the samples (`..._seconds_total`).
    pub fn prometheus_name(&self) -> String {
        let mut n = self.name.to_string();
        if let Some(u) = self.unit {
            n.push('_');
            n.push_str(u);
        }
        match self.kind {
            Kind::Counter => n.push_str("_total"),
            Kind::Info => n.push_str("_info"),
            _ => {}
        }
        n
    }
}

/// Histogram value of a summary row: timed events only, seconds.
pub fn histogram(s: &Summary) -> Value {
    // The encoder sums the buckets: clamp so a hostile segment's counts
    // cannot overflow that sum.
    let mut total = 0u64;
    let buckets = (0..HISTOGRAM_BUCKETS)
        .map(|i| {
            let le = s.scale.upper_seconds(i).unwrap_or(f64::INFINITY);
            let n = s.buckets[i].min(u64::MAX - total);
            total += n;
            (le, n)
        })
        .collect();
    Value::Histogram {
        sum: s.sum_ps as f64 / 1e12,
        count: s.timed_count,
        buckets,
    }
}

/// The event families of one kind of event (waits; stages and statements
/// follow the same pattern): the summaries' counters and histogram, and
/// the events in progress.
struct EventFamilies {
    count: Family,
    seconds: Family,
    duration: Family,
    running: Family,
    longest: Family,
}

impl EventFamilies {
    /// `pfs_events_{waits,stages,statements}_total`, `..._seconds_total`,
    /// `..._duration_seconds`, `..._running` and
    /// `..._running_longest_seconds` of `kind`.
    fn of(kind: EventKind) -> Self {
        let (running, longest, now, oldest) = match kind {
            EventKind::Wait => (
                ("pfs_events_waits_running", "pfs.events.waits.running"),
                (
                    "pfs_events_waits_running_longest",
                    "pfs.events.waits.running.longest",
                ),
                "Waits in progress now (rows of events_waits_current not ended, threads' and awaiting tasks'), by instrument; 0 when none. A wait is in the counters and histograms only once it ends.",
                "How long the longest wait in progress has run so far (its TIMER_WAIT in events_waits_current), by instrument; 0 when none is in progress (or none is timed).",
            ),
            EventKind::Stage => (
                ("pfs_events_stages_running", "pfs.events.stages.running"),
                (
                    "pfs_events_stages_running_longest",
                    "pfs.events.stages.running.longest",
                ),
                "Stages in progress now (rows of events_stages_current not ended), by instrument; 0 when none.",
                "How long the longest stage in progress has run so far, by instrument; 0 when none is in progress (or none is timed).",
            ),
            EventKind::Statement => (
                (
                    "pfs_events_statements_running",
                    "pfs.events.statements.running",
                ),
                (
                    "pfs_events_statements_running_longest",
                    "pfs.events.statements.running.longest",
                ),
                "Statements in progress now (rows of events_statements_current not ended: requests being served, awaiting tasks included), by instrument; 0 when none. A statement is in the counters and histograms only once it ends.",
                "How long the longest statement in progress has run so far (its TIMER_WAIT in events_statements_current): a stuck request, by instrument; 0 when none is in progress (or none is timed).",
            ),
        };
        let (count, seconds, duration, counted, timed, latency) = match kind {
            EventKind::Wait => (
                ("pfs_events_waits", "pfs.events.waits"),
                "pfs.events.waits.seconds",
                ("pfs_events_waits_duration", "pfs.events.waits.duration"),
                "Waits completed (COUNT_STAR), by instrument.",
                "Time spent in timed waits (SUM_TIMER_WAIT), by instrument.",
                "Latency of timed waits, by instrument.",
            ),
            EventKind::Stage => (
                ("pfs_events_stages", "pfs.events.stages"),
                "pfs.events.stages.seconds",
                ("pfs_events_stages_duration", "pfs.events.stages.duration"),
                "Stages completed (COUNT_STAR), by instrument.",
                "Time spent in timed stages (SUM_TIMER_WAIT), by instrument.",
                "Latency of timed stages, by instrument.",
            ),
            EventKind::Statement => (
                ("pfs_events_statements", "pfs.events.statements"),
                "pfs.events.statements.seconds",
                (
                    "pfs_events_statements_duration",
                    "pfs.events.statements.duration",
                ),
                "Statements ended (COUNT_STAR), by instrument: completed or cancelled (pfs_events_statements_cancelled_total counts those).",
                "Time spent in timed statements (SUM_TIMER_WAIT), cancelled ones included, by instrument.",
                "Latency of timed statements, cancelled ones included, by instrument.",
            ),
        };
        Self {
            count: Family::new(count.0, None, (count.1, "{event}"), Kind::Counter, counted),
            seconds: Family::new(
                count.0,
                Some("seconds"),
                (seconds, "s"),
                Kind::Counter,
                timed,
            ),
            duration: Family::new(
                duration.0,
                Some("seconds"),
                (duration.1, "s"),
                Kind::Histogram,
                latency,
            ),
            running: Family::new(running.0, None, (running.1, "{event}"), Kind::Gauge, now),
            longest: Family::new(
                longest.0,
                Some("seconds"),
                (longest.1, "s"),
                Kind::Gauge,
                oldest,
            ),
        }
    }

    fn add(&mut self, service: &str, event_name: &str, s: &Summary, running: Option<&RunningNow>) {
        let labels = || {
            vec![
                ("service", service.to_string()),
                ("event_name", event_name.to_string()),
            ]
        };
        self.count.push(labels(), Value::Int(s.count));
        self.seconds
            .push(labels(), Value::Float(s.sum_ps as f64 / 1e12));
        self.duration.push(labels(), histogram(s));
        let now = running.copied().unwrap_or_default();
        self.running.push(labels(), Value::Int(now.count));
        self.longest
            .push(labels(), Value::Float(now.longest_seconds.unwrap_or(0.0)));
    }

    fn into_vec(self) -> [Family; 5] {
        [
            self.count,
            self.seconds,
            self.duration,
            self.running,
            self.longest,
        ]
    }
}

/// A service's events of one instrument in progress: how many, and how
/// long the longest has run (if any is timed).
#[derive(Debug, Clone, Copy, Default)]
struct RunningNow {
    count: u64,
    longest_seconds: Option<f64>,
}

/// The events in progress in the live processes, by service and
/// instrument name ([`running`]); a dead process's never end.
fn running_now(snap: &Snapshot) -> HashMap<(&str, &str), RunningNow> {
    let mut out: HashMap<(&str, &str), RunningNow> = HashMap::new();
    for v in snap.segments.iter().filter(|v| v.live) {
        let s = &*v.data;
        let names: HashMap<u32, &str> = s
            .classes
            .iter()
            .map(|c| (c.index, c.name.as_str()))
            .collect();
        for kind in EventKind::ALL {
            for (class, r) in running(s, kind) {
                let Some(name) = names.get(&class) else {
                    continue;
                };
                let n = out.entry((s.service.as_str(), name)).or_default();
                n.count += r.count;
                if let Some(start) = r.oldest_start_ps {
                    let age = v.timer_now_ps.saturating_sub(start) as f64 / 1e12;
                    n.longest_seconds = Some(n.longest_seconds.map_or(age, |a| a.max(age)));
                }
            }
        }
    }
    out
}

/// A file or socket instrument's waits by [`IoMode`] (PFS
/// `file_summary_by_event_name`, `socket_summary_by_event_name`; the
/// `mode` label of mysqld_exporter's file metrics): how many, how long,
/// how many bytes.
struct IoFamilies {
    count: Family,
    seconds: Family,
    bytes: Family,
}

impl IoFamilies {
    fn new() -> Self {
        Self {
            count: Family::new(
                "pfs_events_waits_io",
                None,
                ("pfs.events.waits.io", "{wait}"),
                Kind::Counter,
                "File and socket waits completed by mode: read (read, recv), write (write, send), misc (open, close, sync, seek, connect, ...): COUNT_READ, COUNT_WRITE, COUNT_MISC, by instrument.",
            ),
            seconds: Family::new(
                "pfs_events_waits_io",
                Some("seconds"),
                ("pfs.events.waits.io.seconds", "s"),
                Kind::Counter,
                "Time spent in timed file and socket waits by mode (SUM_TIMER_READ, SUM_TIMER_WRITE, SUM_TIMER_MISC), by instrument.",
            ),
            bytes: Family::new(
                "pfs_events_waits_io",
                Some("bytes"),
                ("pfs.events.waits.io.bytes", "By"),
                Kind::Counter,
                "Bytes read and written by file and socket waits (SUM_NUMBER_OF_BYTES_READ, SUM_NUMBER_OF_BYTES_WRITE), by instrument.",
            ),
        }
    }

    /// Every mode of instrument `name` of service `svc`, 0 included.
    fn add(&mut self, svc: &str, name: &str, io: &IoFigures) {
        let labels = |mode: IoMode| {
            vec![
                ("service", svc.to_string()),
                ("event_name", name.to_string()),
                ("mode", mode.name().to_string()),
            ]
        };
        for mode in IoMode::ALL {
            self.count.push(labels(mode), Value::Int(io.count(mode)));
            self.seconds.push(
                labels(mode),
                Value::Float(io.sum_ns[mode.index()] as f64 / 1e9),
            );
            if let Some(b) = io.bytes(mode) {
                self.bytes.push(labels(mode), Value::Int(b));
            }
        }
    }

    fn into_vec(self) -> [Family; 3] {
        [self.count, self.seconds, self.bytes]
    }
}

/// Statement figures (`SUM_ERRORS`, ...), one counter family each, in
/// the order of [`statement_figure_values`].
fn statement_figure_families() -> [Family; 7] {
    [
        Family::new(
            "pfs_events_statements_errors",
            None,
            ("pfs.events.statements.errors", "{error}"),
            Kind::Counter,
            "Errors raised by statements (SUM_ERRORS), by instrument.",
        ),
        Family::new(
            "pfs_events_statements_warnings",
            None,
            ("pfs.events.statements.warnings", "{warning}"),
            Kind::Counter,
            "Warnings raised by statements (SUM_WARNINGS), by instrument.",
        ),
        Family::new(
            "pfs_events_statements_rows_affected",
            None,
            ("pfs.events.statements.rows_affected", "{row}"),
            Kind::Counter,
            "Rows changed by statements (SUM_ROWS_AFFECTED), by instrument.",
        ),
        Family::new(
            "pfs_events_statements_rows_sent",
            None,
            ("pfs.events.statements.rows_sent", "{row}"),
            Kind::Counter,
            "Rows returned by statements (SUM_ROWS_SENT), by instrument.",
        ),
        Family::new(
            "pfs_events_statements_rows_examined",
            None,
            ("pfs.events.statements.rows_examined", "{row}"),
            Kind::Counter,
            "Rows read by statements to find their result (SUM_ROWS_EXAMINED), by instrument.",
        ),
        Family::new(
            "pfs_events_statements_cpu",
            Some("seconds"),
            ("pfs.events.statements.cpu", "s"),
            Kind::Counter,
            "CPU time of statements (SUM_CPU_TIME): the time their async task was being polled; 0 for statements of threads. Wall time is pfs_events_statements_seconds_total.",
        ),
        Family::new(
            "pfs_events_statements_cancelled",
            None,
            ("pfs.events.statements.cancelled", "{statement}"),
            Kind::Counter,
            "Statements cancelled (their future dropped before they completed; not errors), by instrument.",
        ),
    ]
}

/// A statement summary's figures, one value per family of
/// [`statement_figure_families`].
fn statement_figure_values(s: &Summary) -> [Value; 7] {
    let f = &s.statement;
    [
        Value::Int(f.errors),
        Value::Int(f.warnings),
        Value::Int(f.rows_affected),
        Value::Int(f.rows_sent),
        Value::Int(f.rows_examined),
        Value::Float(f.cpu_time_ps as f64 / 1e12),
        Value::Int(f.cancelled),
    ]
}

/// Memory instrument families (`memory_summary_global_by_event_name`), by
/// service and instrument: four counters, then six gauges (signed: a
/// service-wide LOW can be negative when memory moves between threads).
fn memory_families(services: &BTreeMap<String, ServiceTotals>) -> Vec<Family> {
    let c = |name, unit, otel, help| Family::new(name, unit, otel, Kind::Counter, help);
    let g = |name, unit, otel, help| Family::new(name, unit, otel, Kind::Gauge, help);
    let mut fams = [
        c(
            "pfs_memory_allocations",
            None,
            ("pfs.memory.allocations", "{allocation}"),
            "Allocations accounted (COUNT_ALLOC), by memory instrument.",
        ),
        c(
            "pfs_memory_frees",
            None,
            ("pfs.memory.frees", "{free}"),
            "Frees accounted (COUNT_FREE), by memory instrument.",
        ),
        c(
            "pfs_memory_allocated",
            Some("bytes"),
            ("pfs.memory.allocated", "By"),
            "Bytes allocated (SUM_NUMBER_OF_BYTES_ALLOC), by memory instrument.",
        ),
        c(
            "pfs_memory_freed",
            Some("bytes"),
            ("pfs.memory.freed", "By"),
            "Bytes freed (SUM_NUMBER_OF_BYTES_FREE), by memory instrument.",
        ),
        g(
            "pfs_memory_used",
            Some("bytes"),
            ("pfs.memory.used", "By"),
            "Bytes in use (CURRENT_NUMBER_OF_BYTES_USED), by memory instrument.",
        ),
        g(
            "pfs_memory_used_high",
            Some("bytes"),
            ("pfs.memory.used.high", "By"),
            "High watermark of bytes in use (HIGH_NUMBER_OF_BYTES_USED; sum over threads, an ended process's kept until it is retired).",
        ),
        g(
            "pfs_memory_used_low",
            Some("bytes"),
            ("pfs.memory.used.low", "By"),
            "Low watermark of bytes in use (LOW_NUMBER_OF_BYTES_USED; sum over threads, clamped at 0 as in the global table).",
        ),
        g(
            "pfs_memory_used_blocks",
            None,
            ("pfs.memory.used.blocks", "{block}"),
            "Blocks in use (CURRENT_COUNT_USED), by memory instrument.",
        ),
        g(
            "pfs_memory_used_high_blocks",
            None,
            ("pfs.memory.used.high_blocks", "{block}"),
            "High watermark of blocks in use (HIGH_COUNT_USED; sum over threads, an ended process's kept until it is retired).",
        ),
        g(
            "pfs_memory_used_low_blocks",
            None,
            ("pfs.memory.used.low_blocks", "{block}"),
            "Low watermark of blocks in use (LOW_COUNT_USED; sum over threads, clamped at 0 as in the global table).",
        ),
    ];
    for (svc, t) in services {
        for (name, m) in &t.memory {
            let labels = || vec![("service", svc.clone()), ("event_name", name.clone())];
            let ints = [m.count_alloc, m.count_free, m.bytes_alloc, m.bytes_free];
            for (f, v) in fams.iter_mut().zip(ints) {
                f.push(labels(), Value::Int(v));
            }
            let signed = [
                m.current_bytes,
                m.high_bytes,
                m.low_bytes,
                m.current_count,
                m.high_count,
                m.low_count,
            ];
            for (f, v) in fams[4..].iter_mut().zip(signed) {
                f.push(labels(), Value::Float(v as f64));
            }
        }
    }
    fams.into()
}

/// Every family for `snap`. `totals` are the agent's cumulative reading
/// figures; `stats` its other own figures.
pub fn families(snap: &Snapshot, totals: &Totals, stats: &AgentStats) -> Vec<Family> {
    let services = by_service(
        snap.segments.iter().map(|v| (&*v.data, v.live)),
        &snap.retired,
    );
    let mut events = EventKind::ALL.map(|k| (k, EventFamilies::of(k)));
    let mut wait_bytes = Family::new(
        "pfs_events_waits",
        Some("bytes"),
        ("pfs.events.waits.bytes", "By"),
        Kind::Counter,
        "Bytes moved by I/O waits (the sum of NUMBER_OF_BYTES, SUM_NUMBER_OF_BYTES), by instrument: every file and socket instrument, and any other wait once it carried a byte count.",
    );
    let mut io = IoFamilies::new();
    let mut figures = statement_figure_families();
    let mut abandoned = Family::new(
        "pfs_events_statements_abandoned",
        None,
        ("pfs.events.statements.abandoned", "{statement}"),
        Kind::Counter,
        "Statements in progress when their process ended (killed, crashed, or exited without ending them), by instrument: never in pfs_events_statements_total. One per thread or awaiting task, as events_statements_current showed them.",
    );
    let mut threads = Family::new(
        "pfs_threads",
        None,
        ("pfs.threads", "{thread}"),
        Kind::Gauge,
        "Live instrumented threads.",
    );
    let mut lost = Family::new(
        "pfs_lost",
        None,
        ("pfs.lost", "{instance}"),
        Kind::Counter,
        "Instances that did not fit a bounded structure, by kind (PFS *_lost variables).",
    );
    let running = running_now(snap);
    for (svc, t) in &services {
        for (name, (class_kind, s)) in &t.classes {
            let Some(kind) = EventKind::of_class(*class_kind) else {
                continue;
            };
            if let Some((_, fams)) = events.iter_mut().find(|(k, _)| *k == kind) {
                fams.add(svc, name, s, running.get(&(svc.as_str(), name.as_str())));
            }
            if moves_bytes(*class_kind, s) {
                wait_bytes.push(
                    vec![("service", svc.clone()), ("event_name", name.clone())],
                    Value::Int(s.bytes),
                );
            }
            if class_kind.is_io() {
                io.add(svc, name, &s.io);
            }
            if kind == EventKind::Statement {
                let labels = || vec![("service", svc.clone()), ("event_name", name.clone())];
                for (fam, v) in figures.iter_mut().zip(statement_figure_values(s)) {
                    fam.push(labels(), v);
                }
                let cut = t.abandoned.get(name).copied().unwrap_or(0);
                abandoned.push(labels(), Value::Int(cut));
            }
        }
        threads.push(vec![("service", svc.clone())], Value::Int(t.threads));
        for k in LostKind::ALL {
            lost.push(
                vec![("service", svc.clone()), ("kind", k.name().to_string())],
                Value::Int(t.lost[k as usize]),
            );
        }
    }
    let mut out = Vec::new();
    let mut wait_bytes = Some(wait_bytes);
    let mut io = Some(io);
    for (kind, fams) in events {
        out.extend(fams.into_vec());
        if kind == EventKind::Wait {
            out.extend(wait_bytes.take());
            out.extend(io.take().into_iter().flat_map(IoFamilies::into_vec));
        }
    }
    out.extend(figures);
    out.push(abandoned);
    out.extend(memory_families(&services));
    out.extend(timer_families(snap));
    out.push(threads);
    out.push(lost);
    out.push(container_pages(snap));
    out.push(processes(snap, services.keys()));
    out.extend(agent_families(snap, totals, stats));
    out
}

/// Whether a class has a `pfs_events_waits_bytes_total` series: every
/// file and socket instrument (from its first scrape, so that its first
/// bytes are an increase), and any other wait that has carried a byte
/// count (a C caller's own I/O class named `wait/io/table/...`, say).
fn moves_bytes(kind: ClassKind, s: &Summary) -> bool {
    kind.is_io() || (kind.is_wait() && s.bytes != 0)
}

/// Processes of each service by state: `live`, or `dead` (exited or
/// killed, its segment retained until retired): which service lost a
/// process, where `pfs_agent_segments` only counts them. Both states of
/// every service seen (`services`, retired ones included), 0 included, so
/// that a first death is an `increase`.
fn processes<'a>(snap: &Snapshot, services: impl Iterator<Item = &'a String>) -> Family {
    let mut f = Family::new(
        "pfs_processes",
        None,
        ("pfs.processes", "{process}"),
        Kind::Gauge,
        "Processes of each service whose segment the agent reads, by state: live, or dead (exited or killed; retained until retired).",
    );
    let mut by: BTreeMap<&str, [u64; 2]> = services.map(|s| (s.as_str(), [0, 0])).collect();
    for v in &snap.segments {
        by.entry(v.data.service.as_str()).or_default()[usize::from(!v.live)] += 1;
    }
    for (svc, [live, dead]) in by {
        for (state, n) in [("live", live), ("dead", dead)] {
            f.push(
                vec![("service", svc.to_string()), ("state", state.to_string())],
                Value::Int(n),
            );
        }
    }
    f
}

/// Thread-container pages by state, per service: `active` pages hold
/// memory, `reclaimed` ones were returned to the OS after a quiet time.
fn container_pages(snap: &Snapshot) -> Family {
    let mut f = Family::new(
        "pfs_container_pages",
        None,
        ("pfs.container.pages", "{page}"),
        Kind::Gauge,
        "Pages of the live processes' record containers, by state (active pages hold memory; reclaimed ones returned it to the OS).",
    );
    let mut by: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    // A dead process's pages are its segment's, not memory it holds.
    for v in snap.segments.iter().filter(|v| v.live) {
        let s = &v.data;
        for state in [PageState::Active, PageState::Reclaimed] {
            let n = s.page_states.iter().filter(|p| **p == state).count();
            *by.entry((s.service.clone(), state.name())).or_default() += n as u64;
        }
    }
    for ((svc, state), n) in by {
        f.push(
            vec![
                ("service", svc),
                ("container", "threads".to_string()),
                ("state", state.to_string()),
            ],
            Value::Int(n),
        );
    }
    f
}

/// `performance_timers` as metrics: the frequency each service's segment
/// recorded for its CYCLE timer, and the agent's measurement of every
/// timer's overhead (cached: the measurement spins for ~25 ms).
fn timer_families(snap: &Snapshot) -> [Family; 2] {
    let mut freq = Family::new(
        "pfs_timer_frequency",
        Some("hertz"),
        ("pfs.timer.frequency", "Hz"),
        Kind::Gauge,
        "Frequency of each service's CYCLE timer, as its segment calibrated it (performance_timers.TIMER_FREQUENCY of CYCLE; label timer=\"CYCLE\").",
    );
    let mut overhead = Family::new(
        "pfs_timer_overhead_cycles",
        None,
        ("pfs.timer.overhead_cycles", "{cycle}"),
        Kind::Gauge,
        "Cost of one timer read in CPU cycles (performance_timers.TIMER_OVERHEAD), by timer.",
    );
    let mut seen = BTreeSet::new();
    // Live processes, as `performance_timers` lists them.
    for v in snap.segments.iter().filter(|v| v.live) {
        if seen.insert(v.data.service.clone()) {
            freq.push(
                vec![
                    ("service", v.data.service.clone()),
                    ("timer", TimerId::Cycle.name().to_string()),
                ],
                Value::Int(v.data.timer.frequency_hz),
            );
        }
    }
    for t in timers::cached() {
        if let Some(o) = t.overhead {
            overhead.push(vec![("timer", t.timer.name().to_string())], Value::Int(o));
        }
    }
    [freq, overhead]
}

fn agent_families(snap: &Snapshot, tot: &Totals, stats: &AgentStats) -> Vec<Family> {
    let mut out = Vec::new();
    let live = snap.segments.iter().filter(|s| s.live).count() as u64;
    let dead = snap.segments.len() as u64 - live;
    let mut segs = Family::new(
        "pfs_agent_segments",
        None,
        ("pfs.agent.segments", "{segment}"),
        Kind::Gauge,
        "Segment files by state.",
    );
    for (state, n) in [
        ("live", live),
        ("dead", dead),
        ("invalid", snap.invalid.len() as u64),
    ] {
        segs.push(vec![("state", state.to_string())], Value::Int(n));
    }
    out.push(segs);
    let mut errors = Family::new(
        "pfs_agent_segment_errors",
        None,
        ("pfs.agent.segment_errors", "{error}"),
        Kind::Counter,
        "Segment files refused, by reason.",
    );
    // Every reason a directory can count exists from the start, at 0 (a
    // series that appeared only with its first error would read as "No
    // data", and `increase()` would miss that first error).
    let mut reasons: BTreeMap<&str, u64> = Refusal::ALL.iter().map(|r| (r.label(), 0)).collect();
    for (r, n) in &snap.errors {
        *reasons.entry(r.label()).or_default() += n;
    }
    for (reason, n) in reasons {
        errors.push(vec![("reason", reason.to_string())], Value::Int(n));
    }
    out.push(errors);
    let mut listing = Family::new(
        "pfs_agent_discovery_errors",
        None,
        ("pfs.agent.discovery_errors", "{error}"),
        Kind::Counter,
        "Discovery passes that could not list the segment directory, by reason (a directory not created yet is not counted).",
    );
    // Every reason from the start, at 0, as above.
    for r in ListFailure::ALL {
        let n = snap.list_errors.get(&r).copied().unwrap_or(0);
        listing.push(vec![("reason", r.label().to_string())], Value::Int(n));
    }
    out.push(listing);
    for (name, otel, help, v) in [
        (
            "pfs_agent_snapshots",
            "pfs.agent.snapshots",
            "Snapshots of all segments taken.",
            tot.snapshots,
        ),
        (
            "pfs_agent_read_retries",
            "pfs.agent.read_retries",
            "Sequence-locked reads retried because a writer was active.",
            tot.retries,
        ),
        (
            "pfs_agent_skipped_rows",
            "pfs.agent.skipped_rows",
            "Summary rows skipped after their retry budget.",
            tot.skipped_rows,
        ),
        (
            "pfs_agent_carried_rows",
            "pfs.agent.carried_rows",
            "Skipped rows replaced by their previous value.",
            tot.carried_rows,
        ),
        (
            "pfs_agent_rows_read",
            "pfs.agent.rows_read",
            "Summary and memory rows copied from the segments (a row whose sequence did not move since the last snapshot is not copied again).",
            tot.rows_read,
        ),
        (
            "pfs_agent_rows_reused",
            "pfs.agent.rows_reused",
            "Rows a summaries snapshot kept from the previous one because their sequence had not moved.",
            tot.rows_reused,
        ),
        (
            "pfs_agent_skipped_events",
            "pfs.agent.skipped_events",
            "Event rows skipped after their retry budget.",
            tot.skipped_events,
        ),
        (
            "pfs_agent_failed_reads",
            "pfs.agent.failed_reads",
            "Segment snapshots that failed.",
            tot.failed_reads,
        ),
        (
            "pfs_agent_retired_segments",
            "pfs.agent.retired_segments",
            "Dead segments folded into service totals and removed.",
            snap.retired_segments,
        ),
    ] {
        let mut f = Family::new(name, None, (otel, "1"), Kind::Counter, help);
        f.push(Vec::new(), Value::Int(v));
        out.push(f);
    }
    let mut f = Family::new(
        "pfs_agent_snapshot_duration",
        Some("seconds"),
        ("pfs.agent.snapshot_duration", "s"),
        Kind::Gauge,
        "Time the last snapshot of all segments took.",
    );
    f.push(Vec::new(), Value::Float(snap.duration.as_secs_f64()));
    out.push(f);
    if let Some(v) = snap.volume {
        for (name, otel, help, bytes) in [
            (
                "pfs_agent_volume_size",
                "pfs.agent.volume.size",
                "Size of the filesystem that holds the segment directory.",
                v.size_bytes,
            ),
            (
                "pfs_agent_volume_free",
                "pfs.agent.volume.free",
                "Space left on it for the applications' segments: near 0, processes that start cannot create their segment (they run uninstrumented, unseen by the agent) and live ones lose container pages.",
                v.free_bytes,
            ),
        ] {
            let mut f = Family::new(name, Some("bytes"), (otel, "By"), Kind::Gauge, help);
            f.push(Vec::new(), Value::Int(bytes));
            out.push(f);
        }
    }
    let mut f = Family::new(
        "pfs_agent_state_unsaved",
        None,
        ("pfs.agent.state_unsaved", "{state}"),
        Kind::Gauge,
        "1 while the retired totals cannot be saved in the segment directory (full volume, permissions: the agent's log says): dead processes' segment files are kept until they can.",
    );
    f.push(Vec::new(), Value::Int(u64::from(snap.state_unsaved)));
    out.push(f);
    let mut f = Family::new(
        "pfs_agent_scrape_duration",
        Some("seconds"),
        ("pfs.agent.scrape_duration", "s"),
        Kind::Gauge,
        "Time the previous /metrics scrape took to snapshot and render.",
    );
    f.push(Vec::new(), Value::Float(stats.scrape_seconds()));
    out.push(f);
    let mut f = Family::new(
        "pfs_agent_build",
        None,
        ("pfs.agent.build.info", ""),
        Kind::Info,
        "Agent version.",
    );
    f.push(
        vec![("version", env!("CARGO_PKG_VERSION").to_string())],
        Value::Int(1),
    );
    out.push(f);
    if let Some(exports) = stats.otlp_exports() {
        let mut f = Family::new(
            "pfs_agent_otlp_exports",
            None,
            ("pfs.agent.otlp.exports", "{export}"),
            Kind::Counter,
            "OTLP metric exports, by result.",
        );
        for (result, n) in exports {
            f.push(vec![("result", result.label().to_string())], Value::Int(n));
        }
        out.push(f);
    }
    if let Some(n) = stats.otlp_rejected_points() {
        let mut f = Family::new(
            "pfs_agent_otlp_rejected_points",
            None,
            ("pfs.agent.otlp.rejected_points", "{point}"),
            Kind::Counter,
            "Data points OTLP collectors rejected in exports they otherwise accepted (partial success).",
        );
        f.push(vec![], Value::Int(n));
        out.push(f);
    }
    out
}
