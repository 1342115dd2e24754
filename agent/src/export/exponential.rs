//! The latency histogram as an exponential histogram of base 2: a
//! Prometheus native histogram of schema 0 and an OTLP exponential
//! histogram of scale 0, converted bucket for bucket, never re-estimated.
//! Bottom of the exporters: the Prometheus and the OTLP exporters use it;
//! it imports neither.
//!
//! The segment's buckets end at powers of two of a second (layout 4.0,
//! [`pfs_shm_layout::layout::BucketScale`]): bucket `i` in `1..=30` holds
//! `(2^(i-1+z), 2^(i+z)]` s, where bucket 0 (`[0, 2^z]` s, the zero bucket,
//! with threshold `2^z`) ends at `2^z`: `z` is -27 for waits, -20 for
//! stages and statements (layout 8.0). That is native bucket `i + z`
//! (native bucket `k` holds `(2^(k-1), 2^k]`) and OTLP bucket `i + z - 1`
//! (OTLP bucket `j` holds `(2^j, 2^(j+1)]`). The overflow bucket (above
//! `2^(30+z)` s: 8 s for waits, 1024 s for stages and statements) has no
//! upper bound; it is counted in the next bucket up (`(8 s, 16 s]` for a
//! wait): its count is exact, its position as uncertain as in the classic
//! `+Inf` bucket (a quantile that falls there reads between 8 and 16 s
//! where the classic histogram reads 8 s, one bucket apart).

use pfs_shm_layout::layout::BUCKET_LOG2_SECONDS_0;

/// A base-2 exponential histogram (positive values only).
#[derive(Debug, Clone, PartialEq)]
pub struct Exponential {
    /// Upper bound of the zero bucket, seconds (`2^-27` for a wait,
    /// `2^-20` for a stage or a statement).
    pub zero_threshold: f64,
    /// Observations in the zero bucket.
    pub zero_count: u64,
    /// Prometheus index (schema 0) of `counts[0]`; the OTLP index (scale
    /// 0) is one less.
    pub first_index: i32,
    /// Counts of consecutive buckets from `first_index`, zero buckets
    /// inside the range included, none at either end.
    pub counts: Vec<u64>,
}

impl Exponential {
    /// From the classic buckets `(upper bound in seconds, count)` of a
    /// segment histogram, lowest first, the last one `+Inf`: the bounds are
    /// those of [`pfs_shm_layout::layout::BucketScale::upper_seconds`]
    /// (the first one, a power of two, is the zero bucket's threshold).
    ///
    /// ```
    /// use pfs_agent::export::exponential::Exponential;
    ///
    /// // 3 events ≤ 2^-27 s, 2 in (2^-27, 2^-26], 1 in (0.5, 1] s, 1 above 8 s.
    /// let mut buckets: Vec<(f64, u64)> = (0..31).map(|i| (2f64.powi(i - 27), 0)).collect();
    /// buckets.push((f64::INFINITY, 1));
    /// buckets[0].1 = 3;
    /// buckets[1].1 = 2;
    /// buckets[27].1 = 1;
    /// let e = Exponential::from_classic(&buckets);
    /// assert_eq!((e.zero_threshold, e.zero_count), (2f64.powi(-27), 3));
    /// assert_eq!(e.first_index, -26);
    /// assert_eq!(e.counts.len(), 31); // -26 ..= 4
    /// assert_eq!((e.counts[0], e.counts[26], e.counts[30]), (2, 1, 1));
    /// ```
    pub fn from_classic(buckets: &[(f64, u64)]) -> Self {
        // log2 of the zero bucket's bound (an exact power of two).
        let z = buckets
            .first()
            .filter(|b| b.0.is_finite() && b.0 > 0.0)
            .map_or(BUCKET_LOG2_SECONDS_0, |b| b.0.log2().round() as i32);
        let zero_threshold = 2f64.powi(z);
        let zero_count = buckets.first().map_or(0, |b| b.1);
        // Bucket i (1-based past the zero bucket) is native index z + i,
        // the overflow one included (one past the last finite bound).
        let rest = buckets.get(1..).unwrap_or_default();
        let first = rest.iter().position(|b| b.1 > 0);
        let last = rest.iter().rposition(|b| b.1 > 0);
        let (first_index, counts) = match (first, last) {
            (Some(f), Some(l)) => (z + 1 + f as i32, rest[f..=l].iter().map(|b| b.1).collect()),
            _ => (z + 1, Vec::new()),
        };
        Self {
            zero_threshold,
            zero_count,
            first_index,
            counts,
        }
    }

    /// Prometheus's sparse form of the positive buckets: one span
    /// `(offset, length)` and the deltas between consecutive counts (the
    /// first delta is the first count).
    pub fn prometheus_spans(&self) -> (Vec<(i32, u32)>, Vec<i64>) {
        if self.counts.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let mut prev = 0i64;
        let deltas = self
            .counts
            .iter()
            .map(|&c| {
                let c = i64::try_from(c).unwrap_or(i64::MAX);
                let d = c.wrapping_sub(prev);
                prev = c;
                d
            })
            .collect();
        (vec![(self.first_index, self.counts.len() as u32)], deltas)
    }

    /// The OTLP offset (scale 0) of `counts[0]`.
    pub fn otlp_offset(&self) -> i32 {
        self.first_index - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_shm_layout::layout::{BucketScale, HISTOGRAM_BUCKETS};

    fn classic(scale: BucketScale, counts: &[u64; HISTOGRAM_BUCKETS]) -> Vec<(f64, u64)> {
        (0..HISTOGRAM_BUCKETS)
            .map(|i| (scale.upper_seconds(i).unwrap_or(f64::INFINITY), counts[i]))
            .collect()
    }

    #[test]
    fn every_duration_lands_in_the_native_bucket_that_holds_it() {
        // Durations in ps around every bound, in either scale: the
        // segment's bucket, turned into a native index, is the bucket
        // (2^(k-1), 2^k] holding it.
        for scale in [BucketScale::Short, BucketScale::Long] {
            let top = scale.upper_ps(HISTOGRAM_BUCKETS - 2).unwrap();
            let mut ps: Vec<u64> = vec![0, 1, 7450, 7451, top, top + 1];
            for i in 0..HISTOGRAM_BUCKETS - 1 {
                let b = scale.upper_ps(i).unwrap();
                ps.extend([b.saturating_sub(1), b, b + 1]);
            }
            let overflow = scale.log2_seconds_0() + HISTOGRAM_BUCKETS as i32 - 1;
            for d in ps {
                let mut counts = [0u64; HISTOGRAM_BUCKETS];
                counts[scale.index(d)] = 1;
                let e = Exponential::from_classic(&classic(scale, &counts));
                assert_eq!(e.zero_threshold, 2f64.powi(scale.log2_seconds_0()));
                let s = d as f64 / 1e12;
                if e.zero_count == 1 {
                    assert!(s <= e.zero_threshold, "{d} ps in the zero bucket");
                    continue;
                }
                assert_eq!(e.counts, vec![1]);
                let k = e.first_index;
                let (lo, hi) = (2f64.powi(k - 1), 2f64.powi(k));
                if k == overflow {
                    assert!(s > lo, "{d} ps overflows above {lo} s");
                } else {
                    // A bound is an integer ps rounded down from 10^12·2^k.
                    assert!(s > lo && s <= hi, "{d} ps = {s} s in ({lo}, {hi}]");
                }
            }
        }
    }

    #[test]
    fn spans_and_deltas_and_empty() {
        let mut counts = [0u64; HISTOGRAM_BUCKETS];
        counts[3] = 5;
        counts[5] = 2;
        let e = Exponential::from_classic(&classic(BucketScale::Short, &counts));
        assert_eq!(e.first_index, -24);
        assert_eq!(e.otlp_offset(), -25);
        assert_eq!(e.counts, vec![5, 0, 2]);
        assert_eq!(e.prometheus_spans(), (vec![(-24, 3)], vec![5, -5, 2]));
        let none = Exponential::from_classic(&classic(BucketScale::Long, &[0; HISTOGRAM_BUCKETS]));
        assert_eq!((none.zero_count, none.counts.len()), (0, 0));
        assert_eq!(none.prometheus_spans(), (vec![], vec![]));
        // A statement's 3 s: native bucket 2, (2 s, 4 s].
        let mut counts = [0u64; HISTOGRAM_BUCKETS];
        counts[BucketScale::Long.index(3_000_000_000_000)] = 1;
        let e = Exponential::from_classic(&classic(BucketScale::Long, &counts));
        assert_eq!((e.first_index, e.counts.clone()), (2, vec![1]));
        assert_eq!(e.zero_threshold, 2f64.powi(-20));
    }
}
