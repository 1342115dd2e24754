//! `memory_summary_by_{account,user,host}_by_event_name`: the memory of
//! the live threads that declared an actor, summed by account (user and
//! host), user or host and instrument. Threads without an actor, and
//! exited threads, count in the global table only; LOW and HIGH are the
//! sums of the threads' (the manual's aggregation rule). `TRUNCATE` is
//! that of the by-thread table.

use std::collections::BTreeMap;

use pfs_shm_layout::reader::MemoryStats;

use super::cell::{Cell, Sink};
use super::columns::{MEMORY_COLUMNS, class_map, head, memory_values, with_head};
use super::view::{NotTruncatable, PfsTable, Unreached, View};
use crate::snapshot::Snapshot;
use crate::truncate::Baselines;

/// What the threads' memory is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// User and host (`memory_summary_by_account_by_event_name`).
    Account,
    /// User (`memory_summary_by_user_by_event_name`).
    User,
    /// Host (`memory_summary_by_host_by_event_name`).
    Host,
}

impl Actor {
    /// Every grouping, in table order.
    pub const ALL: [Actor; 3] = [Actor::Account, Actor::User, Actor::Host];

    fn columns(self) -> &'static [&'static str] {
        match self {
            Actor::Account => &["user", "host"],
            Actor::User => &["user"],
            Actor::Host => &["host"],
        }
    }

    fn key<'a>(self, user: &'a str, host: &'a str) -> Vec<Cell<'a>> {
        match self {
            Actor::Account => vec![user.into(), host.into()],
            Actor::User => vec![user.into()],
            Actor::Host => vec![host.into()],
        }
    }
}

/// A memory table grouped by actor.
#[derive(Debug)]
pub struct MemoryByActor {
    actor: Actor,
    name: String,
}

impl MemoryByActor {
    /// The table grouped by `actor`.
    pub fn new(actor: Actor) -> Self {
        let word = match actor {
            Actor::Account => "account",
            Actor::User => "user",
            Actor::Host => "host",
        };
        Self {
            actor,
            name: format!("memory_summary_by_{word}_by_event_name"),
        }
    }
}

impl PfsTable for MemoryByActor {
    fn name(&self) -> &str {
        &self.name
    }

    fn live_only(&self) -> bool {
        true
    }

    fn emit(&self, view: &View<'_>, sink: &mut dyn Sink) {
        let mut cols = with_head(self.actor.columns());
        cols.extend(MEMORY_COLUMNS);
        sink.columns(&cols);
        for (path, s) in &view.segments {
            let classes = class_map(&s.classes);
            let mut agg: BTreeMap<(String, &str), (Vec<Cell>, MemoryStats)> = BTreeMap::new();
            for t in view.threads_of(path, s) {
                let Some((u, h, _)) = &t.actor else { continue };
                let key = self.actor.key(u, h);
                for (c, m) in &t.memory {
                    let Some(ci) = classes.get(c) else { continue };
                    let v = view
                        .baselines_for(path, s)
                        .memory_thread_view(path, t.record, t.version, *c, m);
                    agg.entry((
                        serde_json::to_string(&key).unwrap_or_default(),
                        ci.name.as_str(),
                    ))
                    .or_insert_with(|| (key.clone(), MemoryStats::default()))
                    .1
                    .merge(&v);
                }
            }
            for ((_, n), (key, m)) in agg {
                let mut row = head(s);
                row.extend(key);
                row.extend(memory_values(n, &m));
                sink.row(&row);
            }
        }
    }

    fn truncate(
        &self,
        baselines: &mut Baselines,
        snap: &Snapshot,
    ) -> Result<Unreached, NotTruncatable> {
        baselines.truncate_memory(snap, false);
        Ok(Unreached::new())
    }
}
