//! When each service's counts began: the earliest process start among its
//! segments (the `start_time_unix_ns` of each segment header), remembered
//! for the agent's lifetime so that retiring a dead process never moves a
//! series' start later; or *unknown* when the service's retired totals
//! (which the agent keeps, across restarts, without start times) predate
//! this agent. [`super::request`] uses it for cumulative start times and
//! for the first delta of each series.

use std::collections::HashMap;

use crate::snapshot::Snapshot;

/// What one snapshot says about a service's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceStarts {
    /// The service.
    pub service: String,
    /// The earliest process start among its segments (live or dead, not
    /// yet retired), ns since the epoch.
    pub earliest_ns: Option<u64>,
    /// Its totals include retired segments (dead processes folded in).
    pub retired: bool,
}

/// Every service of `snap`, with its earliest process start.
pub fn observe(snap: &Snapshot) -> Vec<ServiceStarts> {
    let mut by: HashMap<&str, ServiceStarts> = HashMap::new();
    for v in &snap.segments {
        let s = by
            .entry(v.data.service.as_str())
            .or_insert_with(|| ServiceStarts {
                service: v.data.service.clone(),
                earliest_ns: None,
                retired: false,
            });
        let t = v.data.start_time_unix_ns;
        s.earliest_ns = Some(s.earliest_ns.map_or(t, |e| e.min(t)));
    }
    for name in snap.retired.by_service.keys() {
        by.entry(name.as_str())
            .or_insert_with(|| ServiceStarts {
                service: name.clone(),
                earliest_ns: None,
                retired: true,
            })
            .retired = true;
    }
    let mut out: Vec<ServiceStarts> = by.into_values().collect();
    out.sort_by(|a, b| a.service.cmp(&b.service));
    out
}

/// When a service's counts began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// No later than this time (ns since the epoch): the earliest start of
    /// the processes whose counts are in the totals.
    Known(u64),
    /// The totals include retired processes this agent never saw, whose
    /// start times are not kept.
    Unknown,
}

/// The origin of every service seen since the agent started.
#[derive(Debug, Default)]
pub struct Origins {
    by_service: HashMap<String, Origin>,
}

impl Origins {
    /// Takes in one snapshot's [`observe`]: a service's origin only ever
    /// moves earlier (a retired process's start stays in it); a service
    /// first seen with retired totals has an unknown origin for the rest
    /// of the agent's life (those processes died before it looked).
    pub fn update(&mut self, services: &[ServiceStarts]) {
        for s in services {
            let next = match (self.by_service.get(&s.service), s.earliest_ns) {
                (Some(Origin::Unknown), _) => Origin::Unknown,
                (Some(Origin::Known(t)), e) => Origin::Known(e.map_or(*t, |e| e.min(*t))),
                (None, _) if s.retired => Origin::Unknown,
                (None, Some(e)) => Origin::Known(e),
                (None, None) => Origin::Unknown,
            };
            self.by_service.insert(s.service.clone(), next);
        }
    }

    /// The origin of `service` (unknown if never observed).
    pub fn of(&self, service: &str) -> Origin {
        self.by_service
            .get(service)
            .copied()
            .unwrap_or(Origin::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(service: &str, earliest_ns: Option<u64>, retired: bool) -> ServiceStarts {
        ServiceStarts {
            service: service.to_string(),
            earliest_ns,
            retired,
        }
    }

    #[test]
    fn origins_move_earlier_only_and_retired_history_is_unknown() {
        let mut o = Origins::default();
        o.update(&[s("a", Some(100), false), s("old", Some(50), true)]);
        assert_eq!(o.of("a"), Origin::Known(100));
        assert_eq!(o.of("old"), Origin::Unknown);
        assert_eq!(o.of("never"), Origin::Unknown);
        // The first process of `a` retired, a later one lives: the start
        // stays the earliest seen.
        o.update(&[s("a", Some(300), true), s("old", Some(10), true)]);
        assert_eq!(o.of("a"), Origin::Known(100));
        assert_eq!(o.of("old"), Origin::Unknown);
        o.update(&[s("a", Some(40), true)]);
        assert_eq!(o.of("a"), Origin::Known(40));
    }
}
