//! When each service's counts began: the earliest process start among its
//! segments (the `start_time_unix_ns` of each segment header) and its
//! retired totals (which keep the earliest start of the processes they
//! count, across restarts), remembered for the agent's lifetime so that
//! retiring a dead process never moves a series' start later; or
//! *unknown* when retired totals do not know their start (a state file of
//! an agent that did not keep it). The request builder uses it for
//! cumulative start times and for the first delta of each series.

use std::collections::HashMap;

use crate::snapshot::Snapshot;

/// What one snapshot says about a service's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceStarts {
    /// The service.
    pub service: String,
    /// The earliest process start among its segments (live, dead or
    /// retired), ns since the epoch.
    pub earliest_ns: Option<u64>,
    /// Its totals include retired processes whose starts are not known.
    pub unknown_history: bool,
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
                unknown_history: false,
            });
        let t = v.data.start_time_unix_ns;
        s.earliest_ns = Some(s.earliest_ns.map_or(t, |e| e.min(t)));
    }
    for name in snap.retired.by_service.keys() {
        let s = by.entry(name.as_str()).or_insert_with(|| ServiceStarts {
            service: name.clone(),
            earliest_ns: None,
            unknown_history: false,
        });
        match snap.retired.earliest_start_ns.get(name) {
            Some(&t) => s.earliest_ns = Some(s.earliest_ns.map_or(t, |e| e.min(t))),
            None => s.unknown_history = true,
        }
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
    /// The totals include retired processes whose start times are not
    /// kept.
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
    /// first seen with retired totals of unknown start has an unknown
    /// origin while it is observed. A service the snapshot no longer has
    /// (no segment and no retired totals: forgotten, see
    /// `--forget-retired-after`) is dropped: if it comes back, its counts
    /// start from zero, and so does its origin, from its new processes.
    pub fn update(&mut self, services: &[ServiceStarts]) {
        let mut before = std::mem::take(&mut self.by_service);
        for s in services {
            let next = match (before.remove(&s.service).as_ref(), s.earliest_ns) {
                (Some(Origin::Unknown), _) => Origin::Unknown,
                (Some(Origin::Known(t)), e) => Origin::Known(e.map_or(*t, |e| e.min(*t))),
                (None, _) if s.unknown_history => Origin::Unknown,
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

    fn s(service: &str, earliest_ns: Option<u64>, unknown_history: bool) -> ServiceStarts {
        ServiceStarts {
            service: service.to_string(),
            earliest_ns,
            unknown_history,
        }
    }

    #[test]
    fn origins_move_earlier_only_and_unknown_history_stays_unknown() {
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
        // A service first seen retired, with its processes' start known.
        o.update(&[s("brief", Some(2_000), false)]);
        assert_eq!(o.of("brief"), Origin::Known(2_000));
    }

    #[test]
    fn a_forgotten_service_that_comes_back_starts_anew() {
        let mut o = Origins::default();
        o.update(&[s("a", Some(100), false), s("b", Some(5), true)]);
        // Forgotten (no segment, no retired totals): not in the snapshot.
        o.update(&[s("b", Some(5), true)]);
        assert_eq!(o.of("a"), Origin::Unknown, "forgotten");
        o.update(&[s("a", Some(900), false), s("b", Some(5), true)]);
        assert_eq!(o.of("a"), Origin::Known(900), "from its new process");
        assert_eq!(o.of("b"), Origin::Unknown, "still observed: unchanged");
    }
}
