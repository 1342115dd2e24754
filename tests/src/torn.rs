//! Checkable waits: waits whose every field derives from their `EVENT_ID`,
//! so that a reader can tell a torn copy from a consistent one. The one
//! definition shared by the writers that record them (`pfs-test-writer
//! torn`, `pfs-soak`) and the readers that check them (`torn_reads.rs`,
//! `pfs-soak`).
//!
//! Wait number `n` of a thread (its `EVENT_ID`, the thread recording
//! nothing else) has class `n % 3` of the writer's three classes, object
//! instance `n * 7919`, bytes `n ^ 0x5555` and spins `n + 3`, and ends
//! before the next begins (`END_EVENT_ID` `n + 1`).

use std::collections::HashMap;

use anyhow::{Result, anyhow};
use pfs_client::{LazyWaitClass, Operation};
use pfs_shm_layout::EventKind;
use pfs_shm_layout::layout::TimerId;
use pfs_shm_layout::reader::{Event, Summary};
use serde_json::{Value, json};

/// The operation of each of the three classes.
pub const OPS: [Operation; 3] = [Operation::Lock, Operation::ReadLock, Operation::Write];

/// What a thread recorded, per class (index `n % 3`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Waits.
    pub count: [u64; 3],
    /// Their `TIMER_WAIT`s, ps.
    pub sum_ps: [u64; 3],
    /// Their bytes.
    pub bytes: [u64; 3],
}

impl Tally {
    /// Adds another thread's.
    pub fn add(&mut self, o: &Tally) {
        for i in 0..3 {
            self.count[i] += o.count[i];
            self.sum_ps[i] += o.sum_ps[i];
            self.bytes[i] += o.bytes[i];
        }
    }

    /// As JSON: `{"count": [..3], "sum_ps": [..3], "bytes": [..3]}`.
    pub fn json(&self) -> Value {
        json!({"count": self.count, "sum_ps": self.sum_ps, "bytes": self.bytes})
    }

    /// From [`Tally::json`]'s form.
    pub fn from_json(v: &Value) -> Result<Self> {
        let arr = |k: &str| -> Result<[u64; 3]> {
            let a = v[k]
                .as_array()
                .filter(|a| a.len() == 3)
                .ok_or_else(|| anyhow!("tally without {k}: {v}"))?;
            let mut out = [0; 3];
            for (o, x) in out.iter_mut().zip(a) {
                *o = x.as_u64().ok_or_else(|| anyhow!("{k} is not a u64: {v}"))?;
            }
            Ok(out)
        };
        Ok(Self {
            count: arr("count")?,
            sum_ps: arr("sum_ps")?,
            bytes: arr("bytes")?,
        })
    }
}

/// Records the calling thread's wait number `id` (see the module docs)
/// with one of `classes`, and adds it to `tally`. Returns false if it was
/// not recorded.
pub fn checkable_wait(classes: &[&LazyWaitClass; 3], id: u64, tally: &mut Tally) -> bool {
    let i = (id % 3) as usize;
    let mut g = classes[i]
        .get()
        .start(OPS[i], id.wrapping_mul(7919) as usize);
    if !g.is_recording() {
        return false;
    }
    // A little work now and then, so that a reader sees waits in progress.
    if id.is_multiple_of(16) {
        for _ in 0..50 {
            std::hint::spin_loop();
        }
    }
    g.set_bytes(id ^ 0x5555);
    g.set_spins(id + 3);
    let ps = g.end();
    tally.count[i] += 1;
    tally.sum_ps[i] += ps.unwrap_or(0);
    tally.bytes[i] += id ^ 0x5555;
    true
}

/// What is wrong with an accepted copy of a checkable wait (empty: it is
/// consistent). `class_of` maps a class index to its position (0..3)
/// among the writer's classes.
pub fn event_flaws(e: &Event, class_of: &HashMap<u32, usize>) -> Vec<String> {
    let n = e.event_id;
    let mut bad = Vec::new();
    if e.object_instance != n.wrapping_mul(7919) {
        bad.push(format!(
            "object_instance {} != {}",
            e.object_instance,
            n.wrapping_mul(7919)
        ));
    }
    if class_of.get(&e.class) != Some(&((n % 3) as usize)) {
        bad.push(format!("class {} (want test class {})", e.class, n % 3));
    }
    if e.end_event_id.is_some() {
        // END_EVENT_ID: the thread's next event id when the wait ended; a
        // leaf wait ends before any other event starts.
        if e.end_event_id != Some(n + 1) {
            bad.push(format!("end_event_id {:?} != {}", e.end_event_id, n + 1));
        }
        if e.bytes != Some(n ^ 0x5555) {
            bad.push(format!("bytes {:?} != {}", e.bytes, n ^ 0x5555));
        }
        if e.spins != Some(n + 3) {
            bad.push(format!("spins {:?} != {}", e.spins, n + 3));
        }
        match (e.timer_start, e.timer_end, e.timer_wait) {
            (Some(s), Some(t), Some(w)) => {
                // timer_wait comes from raw ticks, start and end are
                // converted separately: allow a rounding step.
                if t < s || (t - s).abs_diff(u128::from(w)) > 2 {
                    bad.push(format!("timer_end {t} - timer_start {s} != timer_wait {w}"));
                }
            }
            _ => bad.push("an ended timed wait without its timers".into()),
        }
    } else {
        // In progress: bytes and spins are set only when it ends.
        if e.bytes.is_some_and(|b| b != n ^ 0x5555) {
            bad.push(format!("in-progress bytes {:?} != {}", e.bytes, n ^ 0x5555));
        }
        if e.spins.is_some_and(|s| s != n + 3) {
            bad.push(format!("in-progress spins {:?} != {}", e.spins, n + 3));
        }
    }
    bad
}

/// What is wrong with an accepted summary row of checkable waits (every
/// one timed): bucket, count and MIN/MAX/SUM consistency.
pub fn row_flaws(s: &Summary) -> Vec<String> {
    let mut bad = Vec::new();
    let buckets: u64 = s.buckets.iter().sum();
    if s.timed_count != buckets {
        bad.push(format!(
            "timed_count {} != sum(buckets) {buckets}",
            s.timed_count
        ));
    }
    if s.count != s.timed_count {
        bad.push(format!(
            "count {} != timed_count {} (every wait is timed)",
            s.count, s.timed_count
        ));
    }
    if s.timed_count > 0 {
        let (lo, hi) = (
            u128::from(s.min_ps) * u128::from(s.timed_count),
            u128::from(s.max_ps) * u128::from(s.timed_count),
        );
        if s.min_ps > s.max_ps || s.sum_ps < lo || s.sum_ps > hi {
            bad.push(format!(
                "min {} max {} sum {} inconsistent with count {}",
                s.min_ps, s.max_ps, s.sum_ps, s.timed_count
            ));
        }
    }
    bad
}

/// A consistent, ended copy of checkable wait `n` whose class index is its
/// class's position (`n % 3`): for tests of a checker.
pub fn consistent_copy(n: u64) -> Event {
    Event {
        event_id: n,
        end_event_id: Some(n + 1),
        class: (n % 3) as u32,
        operation: None,
        timer_start: Some(1000),
        timer_end: Some(1500),
        timer_wait: Some(500),
        object_instance: n * 7919,
        bytes: Some(n ^ 0x5555),
        spins: Some(n + 3),
        source: None,
        object_name: None,
        nesting_event_id: None,
        nesting_event_type: None,
        event_type: Some(EventKind::Wait),
        timer: TimerId::Cycle,
        progress: None,
        thread_id: 0,
    }
}

/// Copies of [`consistent_copy`]`(n)`, each torn in one field (as a read
/// racing the writer could see it): a checker must reject every one.
pub fn torn_copies(n: u64) -> Vec<Event> {
    let good = consistent_copy(n);
    vec![
        Event {
            object_instance: (n + 1) * 7919,
            ..good
        },
        Event {
            bytes: Some((n + 1) ^ 0x5555),
            ..good
        },
        Event {
            spins: Some(n + 4),
            ..good
        },
        Event {
            spins: None,
            ..good
        },
        Event {
            end_event_id: Some(n - 1),
            ..good
        },
        Event {
            class: ((n + 2) % 3) as u32,
            ..good
        },
        Event {
            timer_wait: Some(7),
            ..good
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_torn_copy_has_a_flaw_and_the_consistent_one_none() {
        let class_of: HashMap<u32, usize> = [(0, 0), (1, 1), (2, 2)].into();
        assert_eq!(
            event_flaws(&consistent_copy(10), &class_of),
            Vec::<String>::new()
        );
        for (i, e) in torn_copies(10).iter().enumerate() {
            assert!(
                !event_flaws(e, &class_of).is_empty(),
                "torn copy {i} passed: {e:?}"
            );
        }
    }
}
