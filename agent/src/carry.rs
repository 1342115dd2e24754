//! Layer 1: carry-forward. A summary row a reader had to skip (its
//! writer kept it busy past the retry budget) is replaced by the same
//! row of the previous read, so that no exported total ever dips.

use pfs_shm_layout::reader::{SegmentSnapshot, Summary};

/// A row skipped because its writer kept it busy is replaced by the same
/// thread's row from the previous snapshot, so totals never dip. Returns
/// the number of rows carried.
pub fn carry_forward(s: &mut SegmentSnapshot, prev: Option<&SegmentSnapshot>) -> u64 {
    let Some(prev) = prev else { return 0 };
    let mut carried = 0;
    for t in s.threads.iter_mut().filter(|t| !t.skipped_rows.is_empty()) {
        let Some(p) = prev
            .threads
            .iter()
            .find(|p| p.record == t.record && p.version == t.version)
        else {
            continue;
        };
        for class in std::mem::take(&mut t.skipped_rows) {
            if let Some(row) = p.memory.iter().find(|(c, _)| *c == class) {
                t.memory.push(*row);
                carried += 1;
                continue;
            }
            match p.rows.iter().find(|(c, _)| *c == class) {
                Some(row) => {
                    t.rows.push(*row);
                    carried += 1;
                }
                None => t.skipped_rows.push(class),
            }
        }
    }
    carried
}

/// Carry-forward for a summaries snapshot, whose summary rows are summed
/// by class: memory rows as in [`carry_forward`] (they stay per thread);
/// for a class with a skipped summary row, the segment's total (folded
/// rows plus live sum) is raised field by field to at least the previous
/// snapshot's. Both are lower bounds of the true total (which only grows),
/// so the result is too, and the exported total never dips. Returns the
/// number of rows carried.
pub fn carry_forward_summed(s: &mut SegmentSnapshot, prev: &SegmentSnapshot) -> u64 {
    let mut carried = carry_forward(s, Some(prev));
    // The skipped rows' classes: each class once, with its skipped rows.
    let mut skipped: Vec<u32> = s
        .threads
        .iter_mut()
        .flat_map(|t| std::mem::take(&mut t.skipped_rows))
        .collect();
    skipped.sort_unstable();
    let mut classes = skipped.clone();
    classes.dedup();
    // Memory rows stay per thread: only summary classes are summed.
    classes.retain(|c| {
        s.classes
            .iter()
            .any(|i| i.index == *c && i.kind != pfs_shm_layout::ClassKind::Memory)
    });
    for class in classes {
        let total = |rows: &[(u32, Summary)], exited: &[(u32, Summary)]| {
            let mut sum = Summary::default();
            for (_, r) in rows.iter().chain(exited).filter(|(c, _)| *c == class) {
                sum.merge(r);
            }
            sum
        };
        let now = total(&s.live_rows, &s.exited);
        let before = total(&prev.live_rows, &prev.exited);
        let folded = total(&[], &s.exited);
        let want = now.at_least(&before);
        // Express the raised total as the live part: total - folded
        // (`want` >= `now` >= `folded` field by field).
        let live = want.saturating_sub(&folded);
        match s.live_rows.iter_mut().find(|(c, _)| *c == class) {
            Some((_, r)) => *r = live,
            None => {
                s.live_rows.push((class, live));
                s.live_rows.sort_by_key(|(c, _)| *c);
            }
        }
        // Every skipped row of the class is carried by its total.
        carried += skipped.iter().filter(|c| **c == class).count() as u64;
    }
    carried
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{mutex_class, record_waits as record};
    use pfs_shm_layout::reader::{ReadOptions, snapshot};
    use pfs_shm_layout::{Segment, SegmentWriter};

    fn segment() -> (std::fs::File, SegmentWriter, [u32; 2]) {
        let dir = tempfile::tempdir().unwrap();
        let (f, w) =
            crate::testing::segment_at(&dir.path().join("t.1.pfs"), &Default::default(), 1, false);
        let c = ["a", "b"].map(|n| mutex_class(&w, n));
        (f, w, c)
    }

    fn total(s: &SegmentSnapshot, class: u32) -> Summary {
        let mut t = Summary::default();
        for (_, r) in s
            .exited
            .iter()
            .chain(&s.live_rows)
            .filter(|(c, _)| *c == class)
        {
            t.merge(r);
        }
        t
    }

    #[test]
    fn a_skipped_summed_row_never_lowers_the_total() {
        let (f, w, [a, b]) = segment();
        let t1 = w.alloc_thread(1, 1, "t1").unwrap();
        let t2 = w.alloc_thread(2, 2, "t2").unwrap();
        record(&w, t1.index, a, 5);
        record(&w, t2.index, a, 3);
        record(&w, t2.index, b, 2);
        let reader = Segment::open(f, false).unwrap();
        let prev = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        assert_eq!(total(&prev, a).count, 8);
        // More events, then a snapshot that missed thread 1's row of `a`
        // (its writer kept it busy): the live sum lacks those 7 events.
        record(&w, t1.index, a, 2);
        record(&w, t2.index, a, 1);
        let mut now = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        assert_eq!(total(&now, a).count, 11);
        let t1_row = 7;
        for (c, r) in &mut now.live_rows {
            if *c == a {
                r.count -= t1_row;
            }
        }
        let i = now
            .threads
            .iter()
            .position(|t| t.record == t1.index)
            .unwrap();
        now.threads[i].skipped_rows.push(a);
        // Thread 2's row of `a` was skipped too (its count still summed
        // here): one class raised, two rows carried.
        let j = now
            .threads
            .iter()
            .position(|t| t.record == t2.index)
            .unwrap();
        now.threads[j].skipped_rows.push(a);
        let b_before = total(&now, b);
        assert_eq!(carry_forward_summed(&mut now, &prev), 2);
        // At least the previous total (8), never the dip (4); `b` untouched.
        assert_eq!(total(&now, a).count, 8);
        assert!(now.threads.iter().all(|t| t.skipped_rows.is_empty()));
        assert_eq!(total(&now, b), b_before);
        // After thread 2 exits, its rows are folded: the raised total is
        // expressed over the folded part.
        w.fold_and_free(t2);
        let mut later = snapshot(&reader, &ReadOptions::summaries()).unwrap();
        for (c, r) in &mut later.live_rows {
            if *c == a {
                *r = Summary::default();
            }
        }
        let i = later
            .threads
            .iter()
            .position(|t| t.record == t1.index)
            .unwrap();
        later.threads[i].skipped_rows.push(a);
        carry_forward_summed(&mut later, &now);
        assert_eq!(total(&later, a).count, 8);
        assert_eq!(total(&later, a).min_ps, 1_000_000);
    }
}
