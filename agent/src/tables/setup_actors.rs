//! `setup_actors`: which threads are instrumented, by user, host and role.

use super::cell::Sink;
use super::columns::{head, with_head, yes_no};
use super::view::{PfsTable, View};

/// The `setup_actors` table.
#[derive(Debug)]
pub struct SetupActors;

impl PfsTable for SetupActors {
    fn name(&self) -> &str {
        "setup_actors"
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        sink.columns(&with_head(&["host", "user", "role", "enabled", "history"]));
        for (_, s) in &view.segments {
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
}
