//! `setup_consumers`: which event tables each live process fills.

use pfs_shm_layout::setup::consumers;

use super::cell::Sink;
use super::columns::{head, with_head, yes_no};
use super::view::{PfsTable, View};

/// The `setup_consumers` table.
#[derive(Debug)]
pub struct SetupConsumers;

impl PfsTable for SetupConsumers {
    fn name(&self) -> &str {
        "setup_consumers"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&["name", "enabled"]));
        for (_, s) in view.live_segments() {
            for (n, bit) in consumers() {
                let mut r = head(s);
                r.extend([n.into(), yes_no(s.consumers & bit != 0)]);
                sink.row(&r);
            }
        }
    }
}
