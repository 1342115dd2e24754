//! The latency histogram as an exponential histogram of base 2: a
//! Prometheus native histogram of schema 0 and an OTLP exponential
//! histogram of scale 0, converted bucket for bucket, never re-estimated.
//! Bottom of the exporters: the Prometheus and the OTLP exporters use it;
//! it imports neither.
//!
//! The segment's buckets end at powers of two of a second (layout 4.0,
//! [`pfs_shm_layout::layout::bucket_index`]): bucket `i` in `1..=30` holds
//! `(2^(i-28), 2^(i-27)]` s, which is native bucket `i - 27` (native bucket
//! `k` holds `(2^(k-1), 2^k]`) and OTLP bucket `i - 28` (OTLP bucket `j`
//! holds `(2^j, 2^(j+1)]`). Bucket 0 (`[0, 2^-27]` s) is the zero bucket,
//! with threshold `2^-27`. The overflow bucket (above `2^3` s) has no upper
//! bound; it is counted in the next bucket up, `(8 s, 16 s]`: its count is
//! exact, its position as uncertain as in the classic `+Inf` bucket (a
//! quantile that falls there reads between 8 and 16 s where the classic
//! histogram reads 8 s, one bucket apart).

use pfs_shm_layout::layout::BUCKET_LOG2_SECONDS_0;

/// A base-2 exponential histogram (positive values only).
#[derive(Debug, Clone, PartialEq)]
pub struct Exponential {
    /// Upper bound of the zero bucket, seconds (`2^-27`).
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
    /// those of [`pfs_shm_layout::layout::bucket_upper_seconds`].
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
        let zero_threshold = 2f64.powi(BUCKET_LOG2_SECONDS_0);
        let zero_count = buckets.first().map_or(0, |b| b.1);
        // Bucket i (1-based past the zero bucket) is native index
        // BUCKET_LOG2_SECONDS_0 + i, the overflow one included (one past
        // the last finite bound).
        let rest = buckets.get(1..).unwrap_or_default();
        let first = rest.iter().position(|b| b.1 > 0);
        let last = rest.iter().rposition(|b| b.1 > 0);
        let (first_index, counts) = match (first, last) {
            (Some(f), Some(l)) => (
                BUCKET_LOG2_SECONDS_0 + 1 + f as i32,
                rest[f..=l].iter().map(|b| b.1).collect(),
            ),
            _ => (BUCKET_LOG2_SECONDS_0 + 1, Vec::new()),
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
    use pfs_shm_layout::layout::{HISTOGRAM_BUCKETS, bucket_index, bucket_upper_seconds};

    fn classic(counts: &[u64; HISTOGRAM_BUCKETS]) -> Vec<(f64, u64)> {
        (0..HISTOGRAM_BUCKETS)
            .map(|i| (bucket_upper_seconds(i).unwrap_or(f64::INFINITY), counts[i]))
            .collect()
    }

    #[test]
    fn every_duration_lands_in_the_native_bucket_that_holds_it() {
        // Durations in ps around every bound: the segment's bucket, turned
        // into a native index, is the bucket (2^(k-1), 2^k] holding it.
        let mut ps: Vec<u64> = vec![0, 1, 7450, 7451, 8_000_000_000_000, 8_000_000_000_001];
        for i in 0..31 {
            let b = pfs_shm_layout::layout::BUCKET_UPPER_PS[i];
            ps.extend([b.saturating_sub(1), b, b + 1]);
        }
        for d in ps {
            let mut counts = [0u64; HISTOGRAM_BUCKETS];
            counts[bucket_index(d)] = 1;
            let e = Exponential::from_classic(&classic(&counts));
            let s = d as f64 / 1e12;
            if e.zero_count == 1 {
                assert!(s <= e.zero_threshold, "{d} ps in the zero bucket");
                continue;
            }
            assert_eq!(e.counts, vec![1]);
            let k = e.first_index;
            let (lo, hi) = (2f64.powi(k - 1), 2f64.powi(k));
            if k == 4 {
                assert!(s > lo, "{d} ps overflows above 8 s");
            } else {
                // A bound is an integer ps rounded down from 10^12·2^k.
                assert!(s > lo && s <= hi, "{d} ps = {s} s in ({lo}, {hi}]");
            }
        }
    }

    #[test]
    fn spans_and_deltas_and_empty() {
        let mut counts = [0u64; HISTOGRAM_BUCKETS];
        counts[3] = 5;
        counts[5] = 2;
        let e = Exponential::from_classic(&classic(&counts));
        assert_eq!(e.first_index, -24);
        assert_eq!(e.otlp_offset(), -25);
        assert_eq!(e.counts, vec![5, 0, 2]);
        assert_eq!(e.prometheus_spans(), (vec![(-24, 3)], vec![5, -5, 2]));
        let none = Exponential::from_classic(&classic(&[0; HISTOGRAM_BUCKETS]));
        assert_eq!((none.zero_count, none.counts.len()), (0, 0));
        assert_eq!(none.prometheus_spans(), (vec![], vec![]));
    }
}
