//! `TRUNCATE TABLE` with PFS's meaning, for the tables the agent serves.
//!
//! The agent never writes a thread's rows (each has exactly one writer, the
//! thread), and Prometheus counters must never go backwards, so truncation
//! is a baseline kept by the agent and subtracted from the tables' view:
//!
//! * summary tables show counts, sums and the histogram since the
//!   truncation; MIN and MAX since then are known to histogram-bucket
//!   precision (the lifetime value when it lies in that bucket range);
//!   truncating a global table also truncates the by-thread table of the
//!   same kind;
//! * `current`, `history` and `history_long` tables hide the events that
//!   existed at truncation time.
//!
//! * memory tables (`memory_summary_*`) show COUNT_* and SUM_* since the
//!   truncation, and LOW = HIGH = CURRENT at truncation time (then moving
//!   again): the agent bumps the segment's `memory_truncate_gen`, and each
//!   writer resets its row's watermarks on its next memory operation (a
//!   reader shows a row not touched since with LOW = HIGH = CURRENT).
//!   Nothing is freed. The watermark reset is segment-wide and the
//!   count baselines are kept per thread, so truncating any memory table
//!   also truncates the by-thread/account/user/host memory tables (the
//!   latter are sums of thread rows); truncating the global table also
//!   resets the global counts.
//!
//! `/metrics` and OTLP are unaffected. Baselines live in the agent: a
//! restarted agent shows lifetime values again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use pfs_shm_layout::layout::{HISTOGRAM_BUCKETS, bucket_upper_ps};
use pfs_shm_layout::reader::{MemoryStats, Summary};

use crate::aggregate::segment_global;
use crate::snapshot::Snapshot;

/// What TRUNCATE removed from view.
#[derive(Debug, Default, Clone)]
pub struct Baselines {
    thread: HashMap<(PathBuf, u32, u64, u32), Summary>,
    global: HashMap<(PathBuf, String), Summary>,
    events: HashMap<(PathBuf, u32, u64, usize), u64>,
    long: HashMap<(PathBuf, usize, u64), u64>,
    mem_thread: HashMap<(PathBuf, u32, u64, u32), MemoryStats>,
    mem_global: HashMap<(PathBuf, String), MemoryStats>,
    /// Segments whose watermarks could not be reset in the segment (dead
    /// or read-only): the view resets them (they no longer change).
    mem_reset: std::collections::HashSet<PathBuf>,
}

/// `cur - base` for memory counts and sums; CURRENT, LOW, HIGH unchanged.
pub fn since_memory(cur: &MemoryStats, base: &MemoryStats) -> MemoryStats {
    MemoryStats {
        count_alloc: cur.count_alloc.saturating_sub(base.count_alloc),
        count_free: cur.count_free.saturating_sub(base.count_free),
        bytes_alloc: cur.bytes_alloc.saturating_sub(base.bytes_alloc),
        bytes_free: cur.bytes_free.saturating_sub(base.bytes_free),
        ..*cur
    }
}

const KINDS: [&str; 3] = ["waits", "stages", "statements"];

fn class_kind_matches(k: usize, c: pfs_shm_layout::ClassKind) -> bool {
    match k {
        0 => c.is_wait(),
        1 => c == pfs_shm_layout::ClassKind::Stage,
        _ => c == pfs_shm_layout::ClassKind::Statement,
    }
}

/// `cur - base`, with MIN/MAX bounded by the histogram buckets that grew.
pub fn since(cur: &Summary, base: &Summary) -> Summary {
    let mut out = Summary {
        count: cur.count.saturating_sub(base.count),
        timed_count: cur.timed_count.saturating_sub(base.timed_count),
        sum_ps: cur.sum_ps.saturating_sub(base.sum_ps),
        bytes: cur.bytes.saturating_sub(base.bytes),
        ..Summary::default()
    };
    for i in 0..HISTOGRAM_BUCKETS {
        out.buckets[i] = cur.buckets[i].saturating_sub(base.buckets[i]);
    }
    let f = (&cur.statement, &base.statement);
    out.statement.errors = f.0.errors.saturating_sub(f.1.errors);
    out.statement.warnings = f.0.warnings.saturating_sub(f.1.warnings);
    out.statement.rows_affected = f.0.rows_affected.saturating_sub(f.1.rows_affected);
    out.statement.rows_sent = f.0.rows_sent.saturating_sub(f.1.rows_sent);
    out.statement.rows_examined = f.0.rows_examined.saturating_sub(f.1.rows_examined);
    let lower = |i: usize| {
        if i == 0 {
            0
        } else {
            bucket_upper_ps(i - 1).unwrap_or(0) + 1
        }
    };
    if let Some(lo) = out.buckets.iter().position(|&n| n > 0) {
        // The lifetime minimum is exact if it lies in the lowest new bucket.
        let lo_bound = lower(lo);
        let hi_bound = bucket_upper_ps(lo).unwrap_or(u64::MAX);
        out.min_ps = if (lo_bound..=hi_bound).contains(&cur.min_ps) {
            cur.min_ps
        } else {
            lo_bound
        };
    }
    if let Some(hi) = out.buckets.iter().rposition(|&n| n > 0) {
        let hi_bound = bucket_upper_ps(hi).unwrap_or(u64::MAX);
        out.max_ps = if (lower(hi)..=hi_bound).contains(&cur.max_ps) {
            cur.max_ps
        } else {
            hi_bound.min(cur.max_ps)
        };
    }
    out
}

impl Baselines {
    /// Truncates `table` as of `snap`. Errors name the tables that can be
    /// truncated.
    pub fn truncate(&mut self, table: &str, snap: &Snapshot) -> Result<(), String> {
        let bad = || {
            format!(
                "{table} cannot be truncated; events_* tables (current, history, history_long, summaries) can"
            )
        };
        if let Some(which) = table.strip_prefix("memory_summary_") {
            return self.truncate_memory(which, snap).map_err(|()| bad());
        }
        let rest = table.strip_prefix("events_").ok_or_else(bad)?;
        let k = KINDS
            .iter()
            .position(|w| rest.starts_with(w))
            .ok_or_else(bad)?;
        let suffix = rest[KINDS[k].len()..].strip_prefix('_').ok_or_else(bad)?;
        for v in &snap.segments {
            let path = &v.path;
            let s = &v.data;
            match suffix {
                "summary_global_by_event_name" | "summary_by_thread_by_event_name" => {
                    let kinds: HashMap<u32, pfs_shm_layout::ClassKind> =
                        s.classes.iter().map(|c| (c.index, c.kind)).collect();
                    for t in &s.threads {
                        for (c, sum) in &t.rows {
                            if kinds
                                .get(c)
                                .is_some_and(|kind| class_kind_matches(k, *kind))
                            {
                                self.thread
                                    .insert((path.clone(), t.record, t.version, *c), *sum);
                            }
                        }
                    }
                    if suffix == "summary_global_by_event_name" {
                        for (name, (kind, sum)) in segment_global(s) {
                            if class_kind_matches(k, kind) {
                                self.global.insert((path.clone(), name), sum);
                            }
                        }
                    }
                }
                "current" | "history" => {
                    for t in &s.threads {
                        self.events
                            .insert((path.clone(), t.record, t.version, k), t_max_event(t));
                    }
                }
                "history_long" => {
                    let mut max: HashMap<u64, u64> = HashMap::new();
                    let ids: Vec<(u64, u64)> = match k {
                        2 => s
                            .long_statements
                            .iter()
                            .map(|e| (e.ev.thread_id, e.ev.event_id))
                            .collect(),
                        _ => s.long[k]
                            .iter()
                            .map(|e| (e.thread_id, e.event_id))
                            .collect(),
                    };
                    for (tid, id) in ids {
                        let m = max.entry(tid).or_default();
                        *m = (*m).max(id);
                    }
                    for (tid, id) in max {
                        self.long.insert((path.clone(), k, tid), id);
                    }
                }
                _ => return Err(bad()),
            }
        }
        Ok(())
    }

    fn truncate_memory(&mut self, which: &str, snap: &Snapshot) -> Result<(), ()> {
        let global = match which {
            "global_by_event_name" => true,
            "by_thread_by_event_name"
            | "by_account_by_event_name"
            | "by_user_by_event_name"
            | "by_host_by_event_name" => false,
            _ => return Err(()),
        };
        for v in &snap.segments {
            let path = &v.path;
            let s = &v.data;
            for t in &s.threads {
                for (c, m) in &t.memory {
                    self.mem_thread
                        .insert((path.clone(), t.record, t.version, *c), *m);
                }
            }
            if global {
                for (name, m) in crate::aggregate::segment_global_memory(s) {
                    self.mem_global.insert((path.clone(), name), m);
                }
            }
            let bumped = v.live
                && crate::setup::open_rw(path).is_ok_and(|seg| {
                    seg.setup()
                        .memory_truncate_gen
                        .fetch_add(1, std::sync::atomic::Ordering::Release);
                    true
                });
            if !bumped {
                self.mem_reset.insert(path.clone());
            }
        }
        Ok(())
    }

    /// A thread's memory row as the memory tables show it.
    pub fn memory_thread_view(
        &self,
        path: &Path,
        record: u32,
        version: u64,
        class: u32,
        m: &MemoryStats,
    ) -> MemoryStats {
        let m = self.memory_reset(path, m);
        match self
            .mem_thread
            .get(&(path.to_path_buf(), record, version, class))
        {
            Some(base) => since_memory(&m, base),
            None => m,
        }
    }

    /// A global memory row as the global memory table shows it.
    pub fn memory_global_view(&self, path: &Path, name: &str, m: &MemoryStats) -> MemoryStats {
        let m = self.memory_reset(path, m);
        match self.mem_global.get(&(path.to_path_buf(), name.to_string())) {
            Some(base) => since_memory(&m, base),
            None => m,
        }
    }

    fn memory_reset(&self, path: &Path, m: &MemoryStats) -> MemoryStats {
        if self.mem_reset.contains(path) {
            m.reset_watermarks()
        } else {
            *m
        }
    }

    /// A thread's row as the by-thread table shows it.
    pub fn thread_view(
        &self,
        path: &Path,
        record: u32,
        version: u64,
        class: u32,
        sum: &Summary,
    ) -> Summary {
        match self
            .thread
            .get(&(path.to_path_buf(), record, version, class))
        {
            Some(base) => since(sum, base),
            None => *sum,
        }
    }

    /// A global row as the global table shows it.
    pub fn global_view(&self, path: &Path, name: &str, sum: &Summary) -> Summary {
        match self.global.get(&(path.to_path_buf(), name.to_string())) {
            Some(base) => since(sum, base),
            None => *sum,
        }
    }

    /// Events with ids at or below this were truncated from view.
    pub fn event_floor(&self, path: &Path, record: u32, version: u64, kind: usize) -> u64 {
        self.events
            .get(&(path.to_path_buf(), record, version, kind))
            .copied()
            .unwrap_or(0)
    }

    /// Whether a `history_long` row is still visible.
    pub fn keep_long(&self, path: &Path, kind: usize, event_id: u64, thread_id: u64) -> bool {
        self.long
            .get(&(path.to_path_buf(), kind, thread_id))
            .is_none_or(|&floor| event_id > floor)
    }
}

fn t_max_event(t: &pfs_shm_layout::reader::ThreadSnapshot) -> u64 {
    let ids = t
        .waits_history
        .iter()
        .chain(&t.stages_history)
        .chain(t.waits_current.iter())
        .chain(t.stages_current.iter())
        .map(|e| e.event_id)
        .chain(
            t.statements_history
                .iter()
                .chain(t.statements_current.iter())
                .map(|e| e.ev.event_id),
        );
    ids.max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_and_bounds_min_max() {
        let mut base = Summary {
            count: 10,
            timed_count: 10,
            sum_ps: 10_000,
            min_ps: 1000,
            max_ps: 1000,
            ..Summary::default()
        };
        base.buckets[0] = 10;
        let mut cur = base;
        cur.count = 12;
        cur.timed_count = 12;
        cur.sum_ps = 10_000 + 2 * 50_000;
        cur.buckets[3] += 2; // (2^15, 2^16] ps
        cur.max_ps = 50_000;
        let v = since(&cur, &base);
        assert_eq!((v.count, v.sum_ps), (2, 100_000));
        assert_eq!(v.max_ps, 50_000, "lifetime max lies in the new top bucket");
        assert_eq!(
            v.min_ps,
            (1 << 15) + 1,
            "lifetime min predates truncation: bucket bound"
        );
        assert_eq!(v.avg_ps(), 50_000);
    }
}
