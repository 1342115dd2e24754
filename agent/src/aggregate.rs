//! Layer 1: aggregation per segment, per service, and the retired totals of dead
//! processes. The rule is PFS's: a global row is the sum of the live
//! threads' rows and of the rows folded in by threads that exited.

use std::collections::{BTreeMap, HashMap};

use pfs_shm_layout::layout::{BucketScale, ConsumerKind, LOST_COUNTERS};
use pfs_shm_layout::reader::{Event, MemoryStats, SegmentSnapshot, Summary};
use pfs_shm_layout::setup::effective;
use pfs_shm_layout::{ClassKind, EventKind};

/// Totals by instrument name.
pub type ByEventName = BTreeMap<String, (ClassKind, Summary)>;

/// No event of a class of kind `kind`, its histogram in the kind's scale
/// (so that a class with no timed event yet shows the bounds it will
/// have).
fn zero_of(kind: ClassKind) -> Summary {
    Summary::zero(BucketScale::of_class(kind))
}

/// Global-by-event-name rows of one segment: exited threads plus live ones.
pub fn segment_global(s: &SegmentSnapshot) -> ByEventName {
    let names: HashMap<u32, (&str, ClassKind)> = s
        .classes
        .iter()
        .map(|c| (c.index, (c.name.as_str(), c.kind)))
        .collect();
    let mut out = ByEventName::new();
    // Every registered class gets a row, as in PFS (zero until used).
    for c in &s.classes {
        out.insert(c.name.clone(), (c.kind, zero_of(c.kind)));
    }
    let rows = s
        .exited
        .iter()
        .chain(&s.live_rows)
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()));
    for (class, sum) in rows {
        if let Some((name, kind)) = names.get(class) {
            out.entry((*name).to_string())
                .or_insert((*kind, zero_of(*kind)))
                .1
                .merge(sum);
        }
    }
    out
}

/// Memory totals by instrument name.
pub type MemoryByEventName = BTreeMap<String, MemoryStats>;

/// `memory_summary_global_by_event_name` rows of one segment: every memory
/// class (zero until used), the memory folded in by exited threads plus
/// the live threads' rows (LOW and HIGH add: the sum of the children's;
/// then LOW is clamped at 0, as the manual has it for the global table
/// only), and the instrumentation's own memory as
/// `memory/performance_schema/*`.
pub fn segment_global_memory(s: &SegmentSnapshot) -> MemoryByEventName {
    let names: HashMap<u32, &str> = s
        .classes
        .iter()
        .filter(|c| c.kind == ClassKind::Memory)
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    let mut out = MemoryByEventName::new();
    for n in names.values() {
        out.insert((*n).to_string(), MemoryStats::default());
    }
    for (class, m) in s.memory_rows() {
        if let Some(name) = names.get(class) {
            out.entry((*name).to_string()).or_default().merge(m);
        }
    }
    for m in out.values_mut() {
        *m = m.clamp_global_low();
    }
    for (name, m) in own_memory(s) {
        out.insert(name.to_string(), m);
    }
    out
}

/// A block that is allocated and never freed (the instrumentation's own).
fn allocated(count: u64, bytes: u64) -> MemoryStats {
    MemoryStats {
        count_alloc: count,
        bytes_alloc: bytes,
        current_count: count as i64,
        high_count: count as i64,
        current_bytes: bytes as i64,
        high_bytes: bytes as i64,
        ..MemoryStats::default()
    }
}

/// Thread container pages as a memory row: a page is allocated when added
/// or revived and freed when reclaimed; the high watermark is the pages
/// ever added (a page is added only while no page is reclaimed, so all
/// were in use then).
fn container_memory(s: &SegmentSnapshot) -> MemoryStats {
    // The counters come from shared memory: saturate, never overflow.
    let page = s.geometry.page_size as u64;
    let added = u64::from(s.pages);
    let alloc = added.saturating_add(s.pages_revived);
    let free = s.pages_reclaimed.min(alloc);
    let current = i64::try_from(alloc - free).unwrap_or(i64::MAX);
    let bytes = |n: u64| n.saturating_mul(page);
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    MemoryStats {
        count_alloc: alloc,
        count_free: free,
        bytes_alloc: bytes(alloc),
        bytes_free: bytes(free),
        current_count: current,
        high_count: signed(added),
        current_bytes: signed(bytes(alloc - free)),
        high_bytes: signed(bytes(added)),
        ..MemoryStats::default()
    }
}

/// The prefix of the instrumentation's own memory rows ([`own_memory`]).
pub const OWN_MEMORY_PREFIX: &str = "memory/performance_schema/";

/// The instrumentation's own memory, from the segment geometry: the fixed
/// sections (reserved at creation), the thread container pages in use
/// (added or revived, minus reclaimed), and the `history_long` rings
/// reserved on first use. Always "enabled".
pub fn own_memory(s: &SegmentSnapshot) -> Vec<(&'static str, MemoryStats)> {
    let g = &s.geometry;
    let mut v = vec![
        (
            "memory/performance_schema/segment_fixed_sections",
            allocated(1, g.pages_off as u64),
        ),
        (
            "memory/performance_schema/thread_container_pages",
            container_memory(s),
        ),
    ];
    for (kind, name) in EventKind::ALL.into_iter().zip([
        "memory/performance_schema/events_waits_history_long",
        "memory/performance_schema/events_stages_history_long",
        "memory/performance_schema/events_statements_history_long",
    ]) {
        let used = s.long_tickets[kind.index()] > 0;
        v.push((
            name,
            allocated(
                u64::from(used),
                if used { g.long_size(kind) as u64 } else { 0 },
            ),
        ));
    }
    v
}

/// What one service adds up to.
#[derive(Debug, Clone, Default)]
pub struct ServiceTotals {
    /// By instrument name.
    pub classes: ByEventName,
    /// Lost counters.
    pub lost: [u64; LOST_COUNTERS],
    /// Live instrumented threads.
    pub threads: u64,
    /// Memory instruments by name.
    pub memory: MemoryByEventName,
    /// Statements in progress when their process ended (killed, crashed,
    /// or exited without ending them), by statement instrument: never
    /// counted in `classes` ([`abandoned_statements`]).
    pub abandoned: BTreeMap<String, u64>,
}

impl ServiceTotals {
    fn add_classes(&mut self, classes: &ByEventName) {
        for (name, (kind, sum)) in classes {
            self.classes
                .entry(name.clone())
                .or_insert((*kind, zero_of(*kind)))
                .1
                .merge(sum);
        }
    }

    /// Adds a segment's memory rows: all of them for a live process; for a
    /// dead one its counts, sums and peaks (HIGH) only: the memory it had
    /// in use is gone with it, so its CURRENT and LOW no longer add up,
    /// but its peak is what a batch job that ended between two scrapes is
    /// looked up for, kept until the segment is retired, as the global
    /// table keeps it.
    fn add_memory(&mut self, s: &SegmentSnapshot, state: Process) {
        for (name, m) in segment_global_memory(s) {
            let m = match state {
                Process::Live => m,
                Process::Dead => counts_and_peaks(&m),
                Process::Retired => counts_only(&m),
            };
            self.memory.entry(name).or_default().merge(&m);
        }
    }

    fn add_lost(&mut self, lost: &[u64; LOST_COUNTERS]) {
        for (a, b) in self.lost.iter_mut().zip(lost) {
            *a += b;
        }
    }

    fn add_abandoned(&mut self, abandoned: &BTreeMap<String, u64>) {
        for (name, n) in abandoned {
            *self.abandoned.entry(name.clone()).or_default() += n;
        }
    }
}

/// Where a segment's process is, for what its memory rows still add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Process {
    /// Running: everything.
    Live,
    /// Ended, its segment still read: counts, sums and peaks.
    Dead,
    /// Ended and folded into the retired totals: counts and sums.
    Retired,
}

/// A memory row's counts and sums, its in-use figures (CURRENT, HIGH,
/// LOW) zero: what a retired process still contributes.
fn counts_only(m: &MemoryStats) -> MemoryStats {
    MemoryStats {
        count_alloc: m.count_alloc,
        count_free: m.count_free,
        bytes_alloc: m.bytes_alloc,
        bytes_free: m.bytes_free,
        ..MemoryStats::default()
    }
}

/// A memory row's counts, sums and HIGH watermarks, CURRENT and LOW zero:
/// what a process that is gone still contributes until it is retired.
fn counts_and_peaks(m: &MemoryStats) -> MemoryStats {
    MemoryStats {
        count_alloc: m.count_alloc,
        count_free: m.count_free,
        bytes_alloc: m.bytes_alloc,
        bytes_free: m.bytes_free,
        high_count: m.high_count,
        high_bytes: m.high_bytes,
        ..MemoryStats::default()
    }
}

/// Final totals of segments whose processes died and whose files were
/// removed, by service. Added to every export so that a service's counters
/// never go backwards when one of its processes goes away.
#[derive(Debug, Clone, Default)]
pub struct Retired {
    /// By service name.
    pub by_service: BTreeMap<String, ServiceTotals>,
    /// The earliest start (ns since the epoch) of the processes in a
    /// service's retired totals, when all of them are known. A service of
    /// `by_service` missing here has totals of unknown origin (from a
    /// state file written before starts were kept).
    pub earliest_start_ns: BTreeMap<String, u64>,
    /// When a segment of the service was last folded in (ns since the
    /// epoch): its totals are forgotten once no process of it has been
    /// seen for the agent's `--forget-retired-after` since
    /// ([`Retired::forget`]).
    pub last_retired_ns: BTreeMap<String, u64>,
}

/// Now, in ns since the epoch (0 before it).
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Retired {
    /// The services whose last segment was folded in more than `after`
    /// before `now_ns` (ns since the epoch).
    pub fn idle_since(&self, now_ns: u64, after: std::time::Duration) -> Vec<String> {
        let after = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self.by_service
            .keys()
            .filter(|svc| {
                self.last_retired_ns
                    .get(*svc)
                    .is_some_and(|&t| now_ns.saturating_sub(t) > after)
            })
            .cloned()
            .collect()
    }

    /// Drops the totals of `service`: its series leave the exports (a
    /// process of it that comes back starts its counters from zero, a
    /// reset that rates and increases handle).
    pub fn forget(&mut self, service: &str) {
        self.by_service.remove(service);
        self.earliest_start_ns.remove(service);
        self.last_retired_ns.remove(service);
    }

    /// Adds a segment's final snapshot; `ended`: its process is gone, so
    /// that its statements in progress were abandoned (a live process's
    /// segment is absorbed only when it cannot be read any more).
    pub fn absorb(&mut self, s: &SegmentSnapshot, ended: bool) {
        self.last_retired_ns
            .insert(s.service.clone(), unix_now_ns());
        let known = self.earliest_start_ns.get(&s.service).copied();
        match (self.by_service.contains_key(&s.service), known) {
            (false, _) => {
                self.earliest_start_ns
                    .insert(s.service.clone(), s.start_time_unix_ns);
            }
            (true, Some(t)) => {
                self.earliest_start_ns
                    .insert(s.service.clone(), t.min(s.start_time_unix_ns));
            }
            // Totals of unknown origin stay of unknown origin.
            (true, None) => {}
        }
        let t = self.by_service.entry(s.service.clone()).or_default();
        t.add_classes(&segment_global(s));
        t.add_memory(s, Process::Retired);
        t.add_lost(&s.lost);
        if ended {
            t.add_abandoned(&abandoned_statements(s));
        }
    }

    /// Adds other retired totals (those of dead segments kept aside in the
    /// state file).
    pub fn merge(&mut self, o: &Retired) {
        for (svc, theirs) in &o.by_service {
            let start = o.earliest_start_ns.get(svc).copied();
            match (
                self.by_service.contains_key(svc),
                self.earliest_start_ns.get(svc).copied(),
                start,
            ) {
                (false, _, Some(t)) => {
                    self.earliest_start_ns.insert(svc.clone(), t);
                }
                (true, Some(mine), Some(t)) => {
                    self.earliest_start_ns.insert(svc.clone(), mine.min(t));
                }
                // Of unknown origin, either side: unknown.
                (true, Some(_), None) => {
                    self.earliest_start_ns.remove(svc);
                }
                (false, _, None) | (true, None, _) => {}
            }
            if let Some(&at) = o.last_retired_ns.get(svc) {
                let mine = self.last_retired_ns.entry(svc.clone()).or_insert(at);
                *mine = (*mine).max(at);
            }
            let t = self.by_service.entry(svc.clone()).or_default();
            t.add_classes(&theirs.classes);
            for (name, m) in &theirs.memory {
                t.memory.entry(name.clone()).or_default().merge(m);
            }
            t.add_lost(&theirs.lost);
            t.add_abandoned(&theirs.abandoned);
        }
    }
}

/// The rows `events_*_current` shows, one per logical thread, as MySQL's
/// does. `rows` are the candidates in table order: each event with what
/// the caller carries along and whether it comes from a thread's row
/// (`true`) or a task slot (`false`). A task's event may be in the rows of
/// several workers that polled it, and in its slot: of a `THREAD_ID`'s
/// rows the latest is kept (highest `EVENT_ID`; a worker's row rather than
/// the slot's for the same event, since it may show it ended).
pub fn latest_per_thread<T>(rows: Vec<(&Event, T, bool)>) -> Vec<(&Event, T, bool)> {
    let mut latest: HashMap<u64, (u64, bool)> = HashMap::new();
    for (e, _, from_thread) in &rows {
        let this = (e.event_id, *from_thread);
        latest
            .entry(e.thread_id)
            .and_modify(|l| *l = (*l).max(this))
            .or_insert(this);
    }
    rows.into_iter()
        .filter(|(e, _, from_thread)| {
            let keep = latest.get(&e.thread_id) == Some(&(e.event_id, *from_thread));
            if keep {
                latest.remove(&e.thread_id);
            }
            keep
        })
        .collect()
}

/// Events of one class running now in a segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Running {
    /// How many.
    pub count: u64,
    /// The earliest `TIMER_START` among the timed ones (ps on the
    /// segment's time line); `None` if none is timed.
    pub oldest_start_ps: Option<u128>,
}

/// The events of `kind` in progress in `s`: the rows of
/// `events_*_current` ([`latest_per_thread`] of the threads' current rows
/// and the task slots) not ended yet, with the name of the thread whose
/// row shows it (`None`: an awaiting task's slot).
pub fn unended(s: &SegmentSnapshot, kind: EventKind) -> Vec<(&Event, Option<&str>)> {
    let rows = (s.threads.iter())
        .filter_map(|t| t.current(kind).map(|e| (e, Some(&*t.name), true)))
        .chain(
            s.tasks
                .iter()
                .filter_map(|t| t.current(kind).map(|e| (e, None, false))),
        )
        .collect();
    latest_per_thread(rows)
        .into_iter()
        .filter(|(e, _, _)| e.end_event_id.is_none())
        .map(|(e, name, _)| (e, name))
        .collect()
}

/// The events of `kind` running now in `s`, by class index ([`unended`]).
/// Meaningful for a live process only (a dead one's events never end:
/// [`ended_in_progress`] says what they were). None while the kind's
/// `events_*_current` consumer is off: its rows are not kept up to date
/// then (a client older than this agent left there for good an event
/// that was running when the consumer went off).
pub fn running(s: &SegmentSnapshot, kind: EventKind) -> BTreeMap<u32, Running> {
    let mut out: BTreeMap<u32, Running> = BTreeMap::new();
    if !effective(s.consumers, kind, ConsumerKind::Current) {
        return out;
    }
    for (e, _) in unended(s, kind) {
        let r = out.entry(e.class).or_default();
        r.count += 1;
        if let Some(start) = e.timer_start {
            r.oldest_start_ps = Some(r.oldest_start_ps.map_or(start, |o| o.min(start)));
        }
    }
    out
}

/// How many events a dead process's events in progress listed by
/// [`ended_in_progress`] name; the others are counted.
const IN_PROGRESS_LISTED: usize = 10;

/// What the process of a dead segment was doing when it ended
/// ([`ended_in_progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedInProgress {
    /// Whether a statement or a stage was in progress (work cut short),
    /// not only waits (a worker blocked in a socket or lock wait at an
    /// `exit` may be a normal ending).
    pub work: bool,
    /// How many, and the first [`IN_PROGRESS_LISTED`] of them.
    pub text: String,
}

/// When a dead process's end was seen, for [`ended_in_progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndSeen {
    /// As it happened (the agent watched the process alive): the
    /// segment's time line then, in ps.
    At(u128),
    /// Not: the process was dead when the agent first found it (it ended
    /// while no agent ran), so when it ended is not known; its events'
    /// ages are taken from its last recorded event instead.
    Unknown,
}

/// The latest time anything of `s` was recorded, in ps on its time line:
/// the last start or end among its threads' and tasks' current events (a
/// dead process's last sign of life). `None` if none was timed.
fn last_recorded_ps(s: &SegmentSnapshot) -> Option<u128> {
    let threads = s
        .threads
        .iter()
        .flat_map(|t| EventKind::ALL.map(|k| t.current(k)));
    let tasks = s
        .tasks
        .iter()
        .flat_map(|t| EventKind::ALL.map(|k| t.current(k)));
    threads
        .chain(tasks)
        .flatten()
        .filter_map(|e| e.timer_end.or(e.timer_start))
        .max()
}

/// What the process of `s`, found dead, was doing when it ended: how many
/// statements, stages and waits were in progress (the unended rows of
/// `events_*_current`), then the first of them, statements first, the
/// longest-running first, each with its instrument, `THREAD_ID`, thread
/// name and how long before the end was `seen` it started (or, the end
/// unseen, before the process's last recorded event: at least that
/// long). Idle waits (workers waiting for work, `idle` instruments) are
/// left out. `None` if nothing else was in progress: `exit` leaves other
/// threads' events as they were, so a process that ended normally with
/// idle workers says nothing.
pub fn ended_in_progress(s: &SegmentSnapshot, seen: EndSeen) -> Option<EndedInProgress> {
    let classes: HashMap<u32, (&str, ClassKind)> = s
        .classes
        .iter()
        .map(|c| (c.index, (c.name.as_str(), c.kind)))
        .collect();
    let mut all: Vec<(EventKind, &Event, Option<&str>)> = Vec::new();
    for kind in [EventKind::Statement, EventKind::Stage, EventKind::Wait] {
        let mut rows = unended(s, kind);
        rows.retain(|(e, _)| !matches!(classes.get(&e.class), Some((_, ClassKind::Idle))));
        rows.sort_by_key(|(e, _)| e.timer_start.unwrap_or(u128::MAX));
        all.extend(rows.into_iter().map(|(e, t)| (kind, e, t)));
    }
    if all.is_empty() {
        return None;
    }
    let work = all.iter().any(|(k, _, _)| *k != EventKind::Wait);
    let (now_ps, before) = match seen {
        EndSeen::At(now) => (Some(now), "before the end was seen"),
        EndSeen::Unknown => (
            last_recorded_ps(s),
            "before the process's last recorded event",
        ),
    };
    let mut text: Vec<String> = all
        .iter()
        .take(IN_PROGRESS_LISTED)
        .map(|(_, e, thread)| {
            let class = classes
                .get(&e.class)
                .map_or("(unregistered instrument)", |c| c.0);
            let on = thread.map_or_else(
                || "an awaiting task".to_string(),
                |n| format!("thread {n:?}"),
            );
            let age = e
                .timer_start
                .zip(now_ps)
                .map(|(t, now)| {
                    format!(
                        ", started {:.3} s {before}",
                        now.saturating_sub(t) as f64 / 1e12
                    )
                })
                .unwrap_or_default();
            format!("{class} (THREAD_ID {}, {on}{age})", e.thread_id)
        })
        .collect();
    if all.len() > IN_PROGRESS_LISTED {
        text.push(format!("and {} more", all.len() - IN_PROGRESS_LISTED));
    }
    let counts: Vec<String> = [
        (EventKind::Statement, "statement"),
        (EventKind::Stage, "stage"),
        (EventKind::Wait, "wait"),
    ]
    .into_iter()
    .filter_map(|(kind, word)| {
        let n = all.iter().filter(|(k, _, _)| *k == kind).count();
        (n > 0).then(|| format!("{n} {word}{}", if n == 1 { "" } else { "s" }))
    })
    .collect();
    let when = match seen {
        EndSeen::At(_) => "",
        EndSeen::Unknown => {
            " (it ended while no agent watched it: when is not known, so each event's time is given up to the process's last recorded event, a lower bound)"
        }
    };
    Some(EndedInProgress {
        work,
        text: format!(
            "{} in progress{when}: {}",
            counts.join(", "),
            text.join("; ")
        ),
    })
}

/// The statements of a dead process's segment `s` that were in progress
/// when it ended ([`unended`]: one per thread or awaiting task, as
/// `events_statements_current` shows them, so a statement a nested one
/// hid is not counted), by instrument name. They never reach the
/// summaries, which count a statement when it ends.
pub fn abandoned_statements(s: &SegmentSnapshot) -> BTreeMap<String, u64> {
    let names: HashMap<u32, &str> = s
        .classes
        .iter()
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    let mut out = BTreeMap::new();
    for (e, _) in unended(s, EventKind::Statement) {
        if let Some(name) = names.get(&e.class) {
            *out.entry((*name).to_string()).or_default() += 1;
        }
    }
    out
}

/// Per-service totals over live and dead segments (each with whether its
/// process lives) plus the retired ones: counters add up over all of them;
/// what is in use now (threads, memory in use and its LOW watermark) over
/// the live processes only, and the HIGH watermarks over the live and
/// dead ones (not the retired).
pub fn by_service<'a>(
    segments: impl Iterator<Item = (&'a SegmentSnapshot, bool)>,
    retired: &Retired,
) -> BTreeMap<String, ServiceTotals> {
    let mut out: BTreeMap<String, ServiceTotals> = retired
        .by_service
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                ServiceTotals {
                    threads: 0,
                    memory: v
                        .memory
                        .iter()
                        .map(|(n, m)| (n.clone(), counts_only(m)))
                        .collect(),
                    ..v.clone()
                },
            )
        })
        .collect();
    for (s, live) in segments {
        let t = out.entry(s.service.clone()).or_default();
        t.add_classes(&segment_global(s));
        t.add_memory(s, if live { Process::Live } else { Process::Dead });
        t.add_lost(&s.lost);
        if live {
            t.threads += s.threads.len() as u64;
        } else {
            t.add_abandoned(&abandoned_statements(s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::segment_at;
    use pfs_shm_layout::reader::{ReadOptions, snapshot};
    use pfs_shm_layout::{ClassKind, SegmentConfig};

    /// A dead process's events in progress, as its death is logged: idle
    /// waits left out (nothing to say if only they were); waits alone are
    /// not work cut short; a statement is, and comes first.
    #[test]
    fn a_dead_process_s_events_in_progress_leave_idle_waits_out() {
        use crate::testing::{statement, statement_class};
        use pfs_shm_layout::layout::{FLAG_ENABLED, FLAG_TIMED};
        let dir = tempfile::tempdir().unwrap();
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..Default::default()
        };
        let (_f, w) = segment_at(&dir.path().join("svc.1.pfs"), &cfg, 1, true);
        let on = FLAG_ENABLED | FLAG_TIMED;
        let idle = w
            .register_class("idle/app/queue", ClassKind::Idle, on)
            .unwrap();
        let mutex = w
            .register_class("wait/synch/mutex/app/m", ClassKind::Mutex, on)
            .unwrap();
        let q = statement_class(&w, "q");
        let (a, b) = (
            w.alloc_thread(1, 1, "worker").unwrap(),
            w.alloc_thread(2, 2, "handler").unwrap(),
        );
        let wait = |slot: u32, thread_id: u64, class: u32, event_id: u64| {
            crate::testing::begin(&w, slot, EventKind::Wait, class, (thread_id, event_id));
        };
        let said = || {
            let s = snapshot(w.segment(), &ReadOptions::summaries()).unwrap();
            ended_in_progress(&s, EndSeen::At(s.timer.now_ps()))
        };
        wait(a.index, 1, idle, 1);
        assert_eq!(said(), None, "an idle worker only: a normal end");
        wait(b.index, 2, mutex, 1);
        let w1 = said().unwrap();
        assert!(!w1.work, "{w1:?}");
        assert!(
            w1.text.starts_with(
                "1 wait in progress: wait/synch/mutex/app/m (THREAD_ID 2, thread \"handler\""
            ),
            "{w1:?}"
        );
        statement(&w, a.index, q, (1, 2), 0, None);
        let w2 = said().unwrap();
        assert!(w2.work, "{w2:?}");
        // Found dead with its end unseen: the ages run to its last
        // recorded event, and the log says so.
        let s = snapshot(w.segment(), &ReadOptions::summaries()).unwrap();
        let last = last_recorded_ps(&s).unwrap();
        let u = ended_in_progress(&s, EndSeen::Unknown).unwrap();
        assert!(u.text.contains("when is not known"), "{u:?}");
        assert!(
            u.text.contains("before the process's last recorded event"),
            "{u:?}"
        );
        let later = ended_in_progress(&s, EndSeen::At(last + 60_000_000_000_000)).unwrap();
        assert!(
            later.text.contains("s before the end was seen"),
            "{later:?}"
        );
        assert_ne!(u.text, later.text);
        assert!(
            w2.text
                .starts_with("1 statement, 1 wait in progress: statement/t/q (THREAD_ID 1"),
            "{w2:?}"
        );
    }

    /// A dead process's statements in progress are counted abandoned by
    /// instrument, from its death until its retirement and after (in the
    /// retired totals, which a merge adds); a live process's are running,
    /// not abandoned; one that ended is in the summaries, not abandoned.
    #[test]
    fn a_dead_process_s_statements_in_progress_are_abandoned() {
        use crate::testing::{statement, statement_class};
        use pfs_shm_layout::values::StatementFigures;
        let dir = tempfile::tempdir().unwrap();
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..Default::default()
        };
        let (_f, w) = segment_at(&dir.path().join("svc.1.pfs"), &cfg, 1, true);
        let (q, r) = (statement_class(&w, "q"), statement_class(&w, "r"));
        let threads: Vec<u32> = (1..=3)
            .map(|i| w.alloc_thread(i, i, "worker").unwrap().index)
            .collect();
        statement(&w, threads[0], q, (1, 1), 0, None);
        statement(&w, threads[1], q, (2, 1), 0, None);
        statement(&w, threads[2], r, (3, 1), 0, None);
        statement(
            &w,
            threads[2],
            r,
            (3, 1),
            5_000,
            Some(StatementFigures::default()),
        );
        let s = snapshot(w.segment(), &ReadOptions::summaries()).unwrap();
        let want = BTreeMap::from([("statement/t/q".to_string(), 2)]);
        assert_eq!(abandoned_statements(&s), want);
        let totals = |live: bool, retired: &Retired| {
            by_service(std::iter::once((&s, live)), retired)["svc"]
                .abandoned
                .clone()
        };
        assert!(totals(true, &Retired::default()).is_empty(), "running");
        assert_eq!(totals(false, &Retired::default()), want, "dead");
        let mut retired = Retired::default();
        retired.absorb(&s, true);
        let alone = by_service(std::iter::empty(), &retired);
        assert_eq!(alone["svc"].abandoned, want, "retired");
        // A live segment absorbed (its file can no longer be read): its
        // statements were not abandoned.
        let mut unreadable = Retired::default();
        unreadable.absorb(&s, false);
        assert!(unreadable.by_service["svc"].abandoned.is_empty());
        let mut both = Retired::default();
        both.merge(&retired);
        both.merge(&retired);
        assert_eq!(both.by_service["svc"].abandoned["statement/t/q"], 4);
    }

    #[test]
    fn running_events_are_the_current_rows_not_ended() {
        use crate::testing::{statement, statement_class};
        use pfs_shm_layout::values::StatementFigures;
        let dir = tempfile::tempdir().unwrap();
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..Default::default()
        };
        let (_f, w) = segment_at(&dir.path().join("svc.1.pfs"), &cfg, 1, true);
        let class = statement_class(&w, "q");
        let (a, b) = (
            w.alloc_thread(1, 1, "a").unwrap(),
            w.alloc_thread(2, 2, "b").unwrap(),
        );
        // The TIMER_START of thread `tid`'s current statement.
        let start_of = |s: &SegmentSnapshot, tid: u64| {
            let t = s.threads.iter().find(|t| t.thread_id == tid).unwrap();
            t.current(EventKind::Statement).and_then(|e| e.timer_start)
        };
        let now = |opts: &ReadOptions| {
            running(&snapshot(w.segment(), opts).unwrap(), EventKind::Statement)
        };
        assert!(now(&ReadOptions::summaries()).is_empty(), "nothing yet");
        // Two running, the older begun at event 3's timer.
        statement(&w, a.index, class, (1, 3), 0, None);
        statement(&w, b.index, class, (2, 7), 0, None);
        for opts in [ReadOptions::default(), ReadOptions::summaries()] {
            let r = now(&opts);
            assert_eq!(r.len(), 1);
            assert_eq!(r[&class].count, 2);
            let oldest = start_of(&snapshot(w.segment(), &opts).unwrap(), 1);
            assert!(oldest.is_some());
            assert_eq!(r[&class].oldest_start_ps, oldest, "the older one's start");
        }
        // Read without current rows: nothing is known to run.
        let bare = ReadOptions {
            current: false,
            ..ReadOptions::summaries()
        };
        assert!(now(&bare).is_empty());
        // The statements' current consumer off: the rows are not kept up
        // to date then (an older client left in them events that ran when
        // it went off): nothing is known to run.
        let setup = || {
            pfs_shm_layout::setup::set_consumers(w.segment(), "events_statements_current", false)
        };
        assert_eq!(setup(), 1);
        assert!(now(&ReadOptions::summaries()).is_empty());
        pfs_shm_layout::setup::set_consumers(w.segment(), "events_statements_current", true);
        assert_eq!(now(&ReadOptions::summaries())[&class].count, 2);
        // One ends: its row stays current, not running.
        statement(
            &w,
            a.index,
            class,
            (1, 3),
            5_000,
            Some(StatementFigures::default()),
        );
        assert_eq!(now(&ReadOptions::summaries())[&class].count, 1);
        // An incremental reader sees the current rows change though no
        // summary row of thread b changed.
        let mut inc = pfs_shm_layout::reader::IncrementalReader::default();
        let first = inc
            .snapshot(w.segment(), &ReadOptions::summaries())
            .unwrap();
        assert_eq!(running(&first, EventKind::Statement)[&class].count, 1);
        statement(
            &w,
            b.index,
            class,
            (2, 7),
            5_000,
            Some(StatementFigures::default()),
        );
        statement(&w, a.index, class, (1, 9), 0, None);
        let second = inc
            .snapshot(w.segment(), &ReadOptions::summaries())
            .unwrap();
        let r = running(&second, EventKind::Statement);
        assert_eq!(r[&class].count, 1);
        assert_eq!(
            r[&class].oldest_start_ps,
            start_of(&second, 1),
            "thread a's new statement"
        );
        assert!(start_of(&second, 1) > start_of(&first, 1));
    }

    #[test]
    fn gone_processes_add_counts_and_peaks_but_nothing_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SegmentConfig {
            service_name: "svc".into(),
            ..Default::default()
        };
        let (_f, w) = segment_at(&dir.path().join("svc.1.pfs"), &cfg, 1, true);
        let class = w
            .register_class(
                "memory/t/buf",
                ClassKind::Memory,
                pfs_shm_layout::layout::FLAG_ENABLED,
            )
            .unwrap();
        let slot = w.alloc_thread(1, 1, "t").unwrap();
        w.segment()
            .record(slot.index)
            .memory_alloc(class as usize, 4096, 0);
        let s = snapshot(w.segment(), &ReadOptions::default()).unwrap();
        let used = |live: bool, retired: &Retired| {
            let t = &by_service(std::iter::once((&s, live)), retired)["svc"];
            let m = &t.memory["memory/t/buf"];
            (
                t.threads,
                m.count_alloc,
                m.bytes_alloc,
                m.current_bytes,
                m.high_bytes,
            )
        };
        assert_eq!(used(true, &Retired::default()), (1, 1, 4096, 4096, 4096));
        assert_eq!(
            used(false, &Retired::default()),
            (0, 1, 4096, 0, 4096),
            "a dead process: its peak stays until it is retired"
        );
        let mut retired = Retired::default();
        retired.absorb(&s, true);
        let t = &by_service(std::iter::empty(), &retired)["svc"];
        let m = &t.memory["memory/t/buf"];
        assert_eq!(
            (t.threads, m.count_alloc, m.current_bytes, m.high_bytes),
            (0, 1, 0, 0),
            "retired"
        );
        // The retired totals know when their processes started: the
        // earliest of them.
        assert_eq!(retired.earliest_start_ns["svc"], s.start_time_unix_ns);
        let mut later = s.clone();
        later.start_time_unix_ns += 1_000;
        retired.absorb(&later, true);
        assert_eq!(retired.earliest_start_ns["svc"], s.start_time_unix_ns);
        let mut other = Retired::default();
        other.absorb(&later, true);
        other.absorb(&s, true);
        assert_eq!(other.earliest_start_ns["svc"], s.start_time_unix_ns);
        // Totals of unknown origin (an older state file) stay unknown.
        retired.earliest_start_ns.clear();
        retired.absorb(&later, true);
        assert!(retired.earliest_start_ns.is_empty());
    }
}
