//! `performance_timers`: each timer's frequency, resolution and overhead,
//! measured on this machine on every read (see [`crate::timers`]).

use super::cell::Sink;
use super::columns::opt;
use super::view::{PfsTable, View};
use crate::timers;

/// The `performance_timers` table.
#[derive(Debug)]
pub struct PerformanceTimers;

impl PfsTable for PerformanceTimers {
    fn name(&self) -> &str {
        "performance_timers"
    }

    fn emit(&self, _view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&[
            "timer_name",
            "timer_frequency",
            "timer_resolution",
            "timer_overhead",
        ]);
        for t in timers::measure() {
            sink.row(&[
                t.timer.name().into(),
                opt(t.frequency),
                opt(t.resolution),
                opt(t.overhead),
            ]);
        }
    }
}
