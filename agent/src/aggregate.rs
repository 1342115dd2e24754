//! Aggregation: per segment, per service, and the retired totals of dead
//! processes. The rule is PFS's: a global row is the sum of the live
//! threads' rows and of the rows folded in by threads that exited.

use std::collections::{BTreeMap, HashMap};

use pfs_shm_layout::ClassKind;
use pfs_shm_layout::layout::LOST_COUNTERS;
use pfs_shm_layout::reader::{SegmentSnapshot, Summary};

/// Totals by instrument name.
pub type ByEventName = BTreeMap<String, (ClassKind, Summary)>;

/// Global-by-event-name rows of one segment: exited threads plus live ones.
pub fn segment_global(s: &SegmentSnapshot) -> ByEventName {
    let names: HashMap<u32, (&str, ClassKind)> = s
        .classes
        .iter()
        .map(|c| (c.index, (c.name.as_str(), c.kind)))
        .collect();
    let mut out = ByEventName::new();
    // Every registered class gets a row, as in PFS (zero until used).
    for c in &s.classes {
        out.insert(c.name.clone(), (c.kind, Summary::default()));
    }
    let rows = s
        .exited
        .iter()
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()));
    for (class, sum) in rows {
        if let Some((name, kind)) = names.get(class) {
            out.entry((*name).to_string())
                .or_insert((*kind, Summary::default()))
                .1
                .merge(sum);
        }
    }
    out
}

/// What one service adds up to.
#[derive(Debug, Clone, Default)]
pub struct ServiceTotals {
    /// By instrument name.
    pub classes: ByEventName,
    /// Lost counters.
    pub lost: [u64; LOST_COUNTERS],
    /// Live instrumented threads.
    pub threads: u64,
}

impl ServiceTotals {
    fn add_classes(&mut self, classes: &ByEventName) {
        for (name, (kind, sum)) in classes {
            self.classes
                .entry(name.clone())
                .or_insert((*kind, Summary::default()))
                .1
                .merge(sum);
        }
    }

    fn add_lost(&mut self, lost: &[u64; LOST_COUNTERS]) {
        for (a, b) in self.lost.iter_mut().zip(lost) {
            *a += b;
        }
    }
}

/// Final totals of segments whose processes died and whose files were
/// removed, by service. Added to every export so that a service's counters
/// never go backwards when one of its processes goes away.
#[derive(Debug, Clone, Default)]
pub struct Retired {
    /// By service name.
    pub by_service: BTreeMap<String, ServiceTotals>,
}

impl Retired {
    /// Adds a dead segment's final snapshot.
    pub fn absorb(&mut self, s: &SegmentSnapshot) {
        let t = self.by_service.entry(s.service.clone()).or_default();
        t.add_classes(&segment_global(s));
        t.add_lost(&s.lost);
    }
}

/// Per-service totals over live and dead segments plus the retired ones.
pub fn by_service<'a>(
    segments: impl Iterator<Item = &'a SegmentSnapshot>,
    retired: &Retired,
) -> BTreeMap<String, ServiceTotals> {
    let mut out: BTreeMap<String, ServiceTotals> = retired
        .by_service
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                ServiceTotals {
                    threads: 0,
                    ..v.clone()
                },
            )
        })
        .collect();
    for s in segments {
        let t = out.entry(s.service.clone()).or_default();
        t.add_classes(&segment_global(s));
        t.add_lost(&s.lost);
        t.threads += s.threads.len() as u64;
    }
    out
}
