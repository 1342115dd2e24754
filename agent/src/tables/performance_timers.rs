//! `performance_timers`: each live process's timers, one row per process and
//! timer, prefixed by `service` and `pid` like every table (so `?service=`
//! and `?pid=` select processes here too). `timer_frequency` of `CYCLE` is
//! the frequency the process calibrated its cycle counter with when it
//! created its segment (what its `CYCLE` ticks are converted with; a
//! process without an invariant TSC falls back to a nanosecond clock, 1
//! GHz); the other timers' frequencies are fixed by their unit.
//! `timer_resolution` and `timer_overhead` are measured by the agent on
//! every read (see [`crate::timers`]), once for all rows: the agent runs
//! beside the processes (a sidecar shares their node), so it reads the same
//! clocks.

use pfs_shm_layout::layout::TimerId;

use super::cell::Sink;
use super::columns::{head, opt, with_head};
use super::view::{PfsTable, View};
use crate::timers;

/// The `performance_timers` table.
#[derive(Debug)]
pub struct PerformanceTimers;

impl PfsTable for PerformanceTimers {
    fn name(&self) -> &str {
        "performance_timers"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&[
            "timer_name",
            "timer_frequency",
            "timer_resolution",
            "timer_overhead",
        ]));
        if view.live_segments().next().is_none() {
            return; // no live process: nothing to measure for
        }
        let measured = timers::measure();
        for (_, s) in view.live_segments() {
            for t in &measured {
                let frequency = match t.timer {
                    TimerId::Cycle if s.timer.frequency_hz > 0 => Some(s.timer.frequency_hz),
                    _ => t.frequency,
                };
                let mut row = head(s);
                row.extend([
                    t.timer.name().into(),
                    opt(frequency),
                    opt(t.resolution),
                    opt(t.overhead),
                ]);
                sink.row(&row);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Filter;
    use crate::tables::build;
    use crate::testing::segment_at;
    use crate::truncate::Baselines;
    use pfs_shm_layout::SegmentConfig;

    #[test]
    fn rows_are_per_process_and_filtered() {
        let dir = tempfile::tempdir().unwrap();
        let mut keep = Vec::new();
        for (service, pid) in [("a", 11), ("b", 22)] {
            let cfg = SegmentConfig {
                service_name: service.into(),
                ..SegmentConfig::default()
            };
            keep.push(segment_at(
                &dir.path().join(format!("{service}.{pid}.pfs")),
                &cfg,
                pid,
                true,
            ));
        }
        let snap = crate::snapshot::Snapshotter::new(
            crate::segments::SegmentSet::new(dir.path(), std::time::Duration::MAX),
            std::time::Duration::ZERO,
        )
        .take();
        let base = Baselines::default();
        let all = build(&PerformanceTimers, &snap, &Filter::default(), &base);
        assert_eq!(&all.columns[..2], ["service", "pid"]);
        assert_eq!(all.rows.len(), 2 * TimerId::ALL.len());
        let only_b = Filter {
            service: Some("b".into()),
            pid: None,
        };
        let b = build(&PerformanceTimers, &snap, &only_b, &base);
        assert_eq!(b.rows.len(), TimerId::ALL.len());
        let none = Filter {
            service: None,
            pid: Some(33),
        };
        assert!(
            build(&PerformanceTimers, &snap, &none, &base)
                .rows
                .is_empty()
        );
    }
}
