//! `setup_timers`: the timer each kind of event is timed with, per live process.

use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::{TimerId, timer_of};

use super::cell::Sink;
use super::columns::{head, with_head};
use super::view::{PfsTable, View};

/// The `setup_timers` table.
#[derive(Debug)]
pub struct SetupTimers;

impl PfsTable for SetupTimers {
    fn name(&self) -> &str {
        "setup_timers"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&["name", "timer_name"]));
        for (_, s) in view.live_segments() {
            for k in EventKind::ALL {
                let t = TimerId::from_u32(timer_of(s.timers, k)).unwrap_or(TimerId::Cycle);
                let mut r = head(s);
                r.extend([k.name().into(), t.name().into()]);
                sink.row(&r);
            }
        }
    }
}
