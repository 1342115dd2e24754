//! `setup_actors`: which threads are instrumented, by user, host and role,
//! per live process. `TRUNCATE` removes every row of every live process, as MySQL's
//! `TRUNCATE TABLE setup_actors` does (threads already running keep their
//! verdict; new sessions find no row: not instrumented).

use pfs_shm_layout::setup;

use super::cell::Sink;
use super::columns::{head, with_head, yes_no};
use super::view::{NotTruncatable, PfsTable, Unreached, View};
use crate::setup::open_rw;
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;

/// The `setup_actors` table.
#[derive(Debug)]
pub struct SetupActors;

impl PfsTable for SetupActors {
    fn name(&self) -> &str {
        "setup_actors"
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&["host", "user", "role", "enabled", "history"]));
        for (_, s) in view.live_segments() {
            for a in &s.actors {
                let mut r = head(s);
                r.extend([
                    a.host.as_str().into(),
                    a.user.as_str().into(),
                    a.role.as_str().into(),
                    yes_no(a.enabled),
                    yes_no(a.history),
                ]);
                sink.row(&r);
            }
        }
    }

    fn truncate(&self, _: &mut Baselines, snap: &Snapshot) -> Result<Unreached, NotTruncatable> {
        let mut unreached = Unreached::new();
        for v in snap.segments.iter().filter(|v| v.live) {
            match open_rw(&v.path) {
                Ok(seg) => {
                    for a in setup::read_actors(&seg) {
                        let _ = setup::set_actor(&seg, &a.host, &a.user, &a.role, None);
                    }
                }
                Err(e) => {
                    tracing::warn!("TRUNCATE setup_actors: {e}");
                    unreached.push(e.to_string());
                }
            }
        }
        Ok(unreached)
    }
}
