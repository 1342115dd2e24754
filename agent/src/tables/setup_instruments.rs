//! `setup_instruments`: every instrument of every live process, with its
//! ENABLED and TIMED flags (TIMED is NULL for memory instruments, which
//! are never timed, as in MySQL), by name within each process.

use pfs_shm_layout::ClassKind;

use super::cell::{Cell, Sink};
use super::columns::{head, with_head, yes_no};
use super::view::{PfsTable, View};

/// The `setup_instruments` table.
#[derive(Debug)]
pub struct SetupInstruments;

impl PfsTable for SetupInstruments {
    fn name(&self) -> &str {
        "setup_instruments"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&[
            "name",
            "enabled",
            "timed",
            "properties",
            "volatility",
            "documentation",
        ]));
        for (_, s) in view.live_segments() {
            // By name: registration order depends on which thread got
            // there first.
            let mut classes: Vec<_> = s.classes.iter().collect();
            classes.sort_by(|a, b| a.name.cmp(&b.name));
            for c in classes {
                let mut r = head(s);
                r.extend([
                    c.name.as_str().into(),
                    yes_no(c.enabled()),
                    if c.kind == ClassKind::Memory {
                        Cell::Null
                    } else {
                        yes_no(c.timed())
                    },
                    "".into(),
                    0u64.into(),
                    Cell::Null,
                ]);
                sink.row(&r);
            }
        }
    }
}
