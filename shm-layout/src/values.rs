//! The plain values a reader copies out of a segment, and their
//! arithmetic: [`Summary`] (one class's summary row), [`MemoryStats`] (one
//! memory class's row), [`StatementFigures`] (a statement's own
//! counts) and [`IoFigures`] (a file or socket class's waits by mode). Merging (the aggregation rule of PFS summaries), differences
//! (`TRUNCATE` as a baseline) and lower bounds are defined here once, for
//! the reader, the agent and the client.
//!
//! Layer 2 (see the crate docs): depends only on [`crate::layout`] (the
//! histogram's buckets) and [`crate::kinds`] (the I/O modes).

use std::ops::Range;

use crate::kinds::IoMode;
use crate::layout::{BucketScale, HISTOGRAM_BUCKETS};

/// A statement's own figures, kept by the writer until the statement ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatementFigures {
    /// `ERRORS`.
    pub errors: u64,
    /// `WARNINGS`.
    pub warnings: u64,
    /// `ROWS_AFFECTED`.
    pub rows_affected: u64,
    /// `ROWS_SENT`.
    pub rows_sent: u64,
    /// `ROWS_EXAMINED`.
    pub rows_examined: u64,
    /// `DIGEST` (0 = none).
    pub digest: u64,
    /// `CPU_TIME` in ps: the time the statement's task was being polled
    /// (0 for a statement of a thread); in a summary, `SUM_CPU_TIME`.
    pub cpu_time_ps: u64,
    /// 1 if the statement was cancelled (its future dropped before it
    /// completed); in a summary, how many were.
    pub cancelled: u64,
}

/// A file or socket instrument's waits split by [`IoMode`] (PFS
/// `file_summary_by_event_name`, `socket_summary_by_event_name`): the
/// values of a row's [`crate::layout::IoTail`]. Each array is indexed by
/// [`IoMode::index`]; all zero for every other class, and for processes
/// of clients older than layout 8.1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoFigures {
    /// `COUNT_READ`, `COUNT_WRITE`, `COUNT_MISC`.
    pub count: [u64; 3],
    /// `SUM_TIMER_READ`, `SUM_TIMER_WRITE`, `SUM_TIMER_MISC`, in ns.
    pub sum_ns: [u64; 3],
    /// `SUM_NUMBER_OF_BYTES_READ`, `SUM_NUMBER_OF_BYTES_WRITE`.
    pub bytes: [u64; 2],
}

impl IoFigures {
    /// All zero (usable in `const` items).
    pub const ZERO: Self = Self {
        count: [0; 3],
        sum_ns: [0; 3],
        bytes: [0; 2],
    };

    /// How many words [`IoFigures::words`] has.
    pub const WORDS: usize = 8;

    /// The eight words in the order of a row's [`crate::layout::IoTail`]:
    /// counts, sums, bytes.
    ///
    /// ```
    /// use pfs_shm_layout::values::IoFigures;
    /// let f = IoFigures { count: [1, 2, 3], sum_ns: [4, 5, 6], bytes: [7, 8] };
    /// assert_eq!(IoFigures::from_words(f.words()), f);
    /// ```
    pub fn words(&self) -> [u64; Self::WORDS] {
        let (c, t, b) = (self.count, self.sum_ns, self.bytes);
        [c[0], c[1], c[2], t[0], t[1], t[2], b[0], b[1]]
    }

    /// From the words [`IoFigures::words`] gives.
    pub fn from_words(w: [u64; Self::WORDS]) -> Self {
        Self {
            count: [w[0], w[1], w[2]],
            sum_ns: [w[3], w[4], w[5]],
            bytes: [w[6], w[7]],
        }
    }

    /// `COUNT_*` of `mode`.
    pub fn count(&self, mode: IoMode) -> u64 {
        self.count[mode.index()]
    }

    /// The waits of every mode (`COUNT_STAR` of MySQL's I/O tables),
    /// saturating: a hostile segment's words cannot wrap it.
    pub fn count_all(&self) -> u64 {
        self.count.iter().fold(0, |a, &n| a.saturating_add(n))
    }

    /// `SUM_TIMER_*` of `mode` in ps (the tables' unit).
    pub fn sum_ps(&self, mode: IoMode) -> u128 {
        u128::from(self.sum_ns[mode.index()]) * 1000
    }

    /// `SUM_NUMBER_OF_BYTES_*` of `mode` (`None` for [`IoMode::Misc`],
    /// which moves no bytes).
    pub fn bytes(&self, mode: IoMode) -> Option<u64> {
        self.bytes.get(mode.index()).copied()
    }

    /// `AVG_TIMER_*` of `mode` in ps: the sum over the count, as PFS
    /// computes it (a wait of a class not timed then counts as 0); 0 when
    /// none.
    pub fn avg_ps(&self, mode: IoMode) -> u64 {
        match self.count(mode) {
            0 => 0,
            n => u64::try_from(self.sum_ps(mode) / u128::from(n)).unwrap_or(u64::MAX),
        }
    }

    /// Sets every word to `op(self's, o's)`.
    #[inline(always)]
    fn zip(&mut self, o: &IoFigures, op: impl Fn(u64, u64) -> u64) {
        let (x, y) = (self.words(), o.words());
        *self = Self::from_words(std::array::from_fn(|i| op(x[i], y[i])));
    }
}

/// Summary statistics of one class (one thread, or aggregated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// `COUNT_STAR`.
    pub count: u64,
    /// Events with timers (those in sum/min/max/buckets).
    pub timed_count: u64,
    /// `SUM_TIMER_WAIT`, ps.
    pub sum_ps: u128,
    /// `MIN_TIMER_WAIT`, ps; `u64::MAX` when no timed event.
    pub min_ps: u64,
    /// `MAX_TIMER_WAIT`, ps.
    pub max_ps: u64,
    /// Sum of `NUMBER_OF_BYTES`.
    pub bytes: u64,
    /// Per-bucket (non-cumulative) counts, in `scale`.
    pub buckets: [u64; HISTOGRAM_BUCKETS],
    /// What the buckets span: [`BucketScale::of`] the class's kind, as a
    /// reader loads a row; [`BucketScale::Short`] in the zero, which takes
    /// the scale of the first summary added to it. Summaries of two scales
    /// add up in the coarser ([`BucketScale::rescale`]).
    pub scale: BucketScale,
    /// Statements: `SUM_ERRORS`, `SUM_WARNINGS`, `SUM_ROWS_AFFECTED`,
    /// `SUM_ROWS_SENT`, `SUM_ROWS_EXAMINED`.
    pub statement: StatementFigures,
    /// File and socket waits: the figures by [`IoMode`].
    pub io: IoFigures,
}

impl StatementFigures {
    /// All zero (the `Default`, usable in `const` items).
    pub const ZERO: Self = Self {
        errors: 0,
        warnings: 0,
        rows_affected: 0,
        rows_sent: 0,
        rows_examined: 0,
        digest: 0,
        cpu_time_ps: 0,
        cancelled: 0,
    };
}

impl Summary {
    /// No event: the additive zero, with no MIN (`u64::MAX`) and no MAX
    /// (the `Default`, usable in `const` items).
    pub const ZERO: Self = Self {
        count: 0,
        timed_count: 0,
        sum_ps: 0,
        min_ps: u64::MAX,
        max_ps: 0,
        bytes: 0,
        buckets: [0; HISTOGRAM_BUCKETS],
        scale: BucketScale::Short,
        statement: StatementFigures::ZERO,
        io: IoFigures::ZERO,
    };
}

impl Summary {
    /// No event, in `scale` (the zero of a kind's sums, whose histogram
    /// bounds show even while empty).
    pub const fn zero(scale: BucketScale) -> Self {
        Self {
            scale,
            ..Self::ZERO
        }
    }

    /// `self` with its histogram in `scale` ([`BucketScale::rescale`]:
    /// from an older layout's, or an older agent's file, to the kind's).
    ///
    /// ```
    /// use pfs_shm_layout::layout::{BucketScale, HISTOGRAM_BUCKETS};
    /// use pfs_shm_layout::values::Summary;
    /// let mut old = Summary::default(); // a 7.x statement row: the wait scale
    /// old.buckets[HISTOGRAM_BUCKETS - 1] = 1; // above 8 s
    /// let new = old.rescaled(BucketScale::Long);
    /// assert_eq!(new.buckets[BucketScale::Long.index(16_000_000_000_000)], 1);
    /// ```
    #[must_use]
    pub fn rescaled(mut self, scale: BucketScale) -> Self {
        if self.scale != scale {
            self.buckets = scale.rescale(self.scale, &self.buckets);
            self.scale = scale;
        }
        self
    }
}

impl Default for Summary {
    fn default() -> Self {
        Self::ZERO
    }
}

impl Summary {
    /// Adds `o` into `self` (the aggregation rule of PFS summaries).
    #[inline]
    pub fn merge(&mut self, o: &Summary) {
        // Saturating: a segment's figures are untrusted, and a hostile
        // one must not make the sum overflow (a panic in debug builds).
        self.zip_additive(o, u64::saturating_add, u128::saturating_add);
        self.min_ps = self.min_ps.min(o.min_ps);
        self.max_ps = self.max_ps.max(o.max_ps);
    }

    /// Sets every additive field of `self` (counts, sums, histogram
    /// buckets, statement and I/O figures) to `op(self's, o's)` (`op128` for the
    /// 128-bit sum); MIN and MAX are left alone. The one place that lists
    /// the additive fields.
    #[inline(always)]
    fn zip_additive(
        &mut self,
        o: &Summary,
        op: impl Fn(u64, u64) -> u64,
        op128: impl Fn(u128, u128) -> u128,
    ) {
        self.zip_additive_in(o, 0..HISTOGRAM_BUCKETS, true, op, op128);
    }

    /// [`Summary::zip_additive`] over the histogram buckets `buckets` only,
    /// and the statement and I/O figures only if `tail`.
    #[inline(always)]
    fn zip_additive_in(
        &mut self,
        o: &Summary,
        buckets: Range<usize>,
        tail: bool,
        op: impl Fn(u64, u64) -> u64,
        op128: impl Fn(u128, u128) -> u128,
    ) {
        if self.scale != o.scale {
            return self.zip_rescaled(o, tail, op, op128);
        }
        self.count = op(self.count, o.count);
        self.timed_count = op(self.timed_count, o.timed_count);
        self.sum_ps = op128(self.sum_ps, o.sum_ps);
        self.bytes = op(self.bytes, o.bytes);
        for (x, y) in self.buckets[buckets.clone()]
            .iter_mut()
            .zip(&o.buckets[buckets])
        {
            *x = op(*x, *y);
        }
        if !tail {
            return;
        }
        self.io.zip(&o.io, &op);
        let (x, y) = (&mut self.statement, &o.statement);
        x.errors = op(x.errors, y.errors);
        x.warnings = op(x.warnings, y.warnings);
        x.rows_affected = op(x.rows_affected, y.rows_affected);
        x.rows_sent = op(x.rows_sent, y.rows_sent);
        x.rows_examined = op(x.rows_examined, y.rows_examined);
        x.cpu_time_ps = op(x.cpu_time_ps, y.cpu_time_ps);
        x.cancelled = op(x.cancelled, y.cancelled);
    }

    /// [`Summary::zip_additive_in`] of summaries of two scales: a side
    /// with no bucket counted takes the other's scale (`o` with none: as it
    /// is, the zero of the wait scale, [`Summary::ZERO`], taken from or
    /// added to a stage's sum, leaves it in its scale; `self` with none:
    /// the zero a sum starts from takes its first part's); else both are
    /// moved to the coarser one.
    #[cold]
    #[inline(never)]
    fn zip_rescaled(
        &mut self,
        o: &Summary,
        tail: bool,
        op: impl Fn(u64, u64) -> u64,
        op128: impl Fn(u128, u128) -> u128,
    ) {
        let empty = |s: &Summary| s.buckets.iter().all(|&b| b == 0);
        let to = if empty(o) {
            self.scale
        } else if empty(self) {
            o.scale
        } else {
            self.scale.max(o.scale)
        };
        self.buckets = to.rescale(self.scale, &self.buckets);
        self.scale = to;
        let o = Summary {
            buckets: to.rescale(o.scale, &o.buckets),
            scale: to,
            ..*o
        };
        self.zip_additive_in(&o, 0..HISTOGRAM_BUCKETS, tail, op, op128);
    }

    /// The histogram buckets a row's timed events can lie in: from MIN's
    /// bucket to MAX's (none without a timed event). A reader loads only
    /// these; the others are zero in a loaded row. A
    /// row whose MIN is above its MAX is not a writer's: every bucket.
    ///
    /// ```
    /// use pfs_shm_layout::layout::bucket_index;
    /// use pfs_shm_layout::values::Summary;
    /// let s = Summary { timed_count: 2, min_ps: 1_000, max_ps: 9_000_000, ..Summary::default() };
    /// assert_eq!(s.filled_buckets(), bucket_index(1_000)..bucket_index(9_000_000) + 1); // a wait's
    /// assert!(Summary::default().filled_buckets().is_empty());
    /// ```
    #[inline]
    pub fn filled_buckets(&self) -> Range<usize> {
        if self.timed_count == 0 {
            return 0..0;
        }
        let (lo, hi) = (self.scale.index(self.min_ps), self.scale.index(self.max_ps));
        if lo <= hi {
            lo..hi + 1
        } else {
            0..HISTOGRAM_BUCKETS
        }
    }

    /// A span of buckets outside which every bucket is zero:
    /// [`Summary::filled_buckets`] when the others are zero (a row as a
    /// reader loads it: one quick check), else from the first nonzero
    /// bucket to the last.
    ///
    /// ```
    /// use pfs_shm_layout::values::Summary;
    /// let mut s = Summary { timed_count: 1, min_ps: 10, max_ps: 10, ..Summary::default() };
    /// s.buckets[0] = 1;
    /// assert_eq!(s.nonzero_buckets(), 0..1);
    /// s.buckets[20] = 3; // outside MIN..MAX: not a writer's row
    /// assert_eq!(s.nonzero_buckets(), 0..21);
    /// ```
    #[inline]
    pub fn nonzero_buckets(&self) -> Range<usize> {
        let filled = self.filled_buckets();
        let outside = self.buckets[..filled.start]
            .iter()
            .chain(&self.buckets[filled.end..])
            .fold(0, |a, &x| a | x);
        if outside == 0 {
            return filled;
        }
        let first = self.buckets.iter().position(|&b| b != 0).unwrap_or(0);
        let last = self.buckets.iter().rposition(|&b| b != 0).unwrap_or(0);
        first..last + 1
    }

    /// [`Summary::add_part`], fastest for a row as a reader loads it: only
    /// the buckets in [`Summary::nonzero_buckets`] are added, and the
    /// statement and I/O figures only if one is not zero. Exact for any value.
    ///
    /// ```
    /// use pfs_shm_layout::values::Summary;
    /// let mut odd = Summary { count: 1, timed_count: 1, min_ps: 10, max_ps: 10, ..Summary::default() };
    /// odd.buckets[20] = 3; // outside MIN..MAX: not a writer's row
    /// let (mut a, mut b) = (Summary::default(), Summary::default());
    /// a.add_loaded_part(&odd);
    /// b.add_part(&odd);
    /// assert_eq!(a.buckets, b.buckets);
    /// ```
    #[inline]
    pub fn add_loaded_part(&mut self, part: &Summary) {
        self.add_part_within(part, part.nonzero_buckets());
    }

    /// [`Summary::add_loaded_part`] given `part`'s
    /// [`Summary::nonzero_buckets`], `span` (for a caller that needs them
    /// too: computing them is a third of the cost). Buckets outside `span`
    /// are not added: only exact for that span.
    #[inline]
    pub fn add_part_within(&mut self, part: &Summary, span: Range<usize>) {
        // (Most rows have neither statement nor I/O figures: their line
        // of the sum is not touched.)
        let tail = part.statement != StatementFigures::ZERO || part.io != IoFigures::ZERO;
        self.zip_additive_in(part, span, tail, u64::wrapping_add, u128::wrapping_add);
    }

    /// `self - o` for the additive fields (saturating at zero); MIN and MAX
    /// are `self`'s.
    ///
    /// ```
    /// use pfs_shm_layout::values::Summary;
    /// let a = Summary { count: 5, sum_ps: 50, ..Summary::default() };
    /// let b = Summary { count: 7, sum_ps: 20, ..Summary::default() };
    /// let d = a.saturating_sub(&b);
    /// assert_eq!((d.count, d.sum_ps), (0, 30));
    /// ```
    pub fn saturating_sub(&self, o: &Summary) -> Summary {
        let mut r = *self;
        r.zip_additive(o, u64::saturating_sub, u128::saturating_sub);
        r
    }

    /// Replaces `old`'s contribution to `self`, a sum of rows, by `new`'s:
    /// the additive fields become `self - old + new`, wrapping (exact
    /// whenever the true sum fits its field); MIN and MAX are left alone.
    ///
    /// ```
    /// use pfs_shm_layout::values::Summary;
    /// let mut sum = Summary { count: 10, sum_ps: 100, ..Summary::default() };
    /// let old = Summary { count: 4, sum_ps: 40, ..Summary::default() };
    /// let new = Summary { count: 6, sum_ps: 70, ..Summary::default() };
    /// sum.replace_part(&old, &new);
    /// assert_eq!((sum.count, sum.sum_ps), (12, 130));
    /// ```
    pub fn replace_part(&mut self, old: &Summary, new: &Summary) {
        self.zip_additive(old, u64::wrapping_sub, u128::wrapping_sub);
        self.add_part(new);
    }

    /// Adds `part`'s additive fields into `self`, a sum of rows, wrapping
    /// (a new row in the sum; [`Summary::replace_part`] with nothing
    /// before). MIN and MAX are left alone.
    #[inline]
    pub fn add_part(&mut self, part: &Summary) {
        self.zip_additive(part, u64::wrapping_add, u128::wrapping_add);
    }

    /// Field by field the larger of two totals of one class, and the
    /// smaller minimum: a lower bound of a total known to be at least both.
    pub fn at_least(&self, o: &Summary) -> Summary {
        let mut r = *self;
        r.zip_additive(o, u64::max, u128::max);
        r.min_ps = self.min_ps.min(o.min_ps);
        r.max_ps = self.max_ps.max(o.max_ps);
        r
    }

    /// What happened since `base` was taken (PFS `TRUNCATE` of a summary):
    /// counts, sums and buckets are `self - base`; MIN and MAX since then
    /// are known to histogram-bucket precision: the lifetime value when it
    /// lies in the lowest (highest) bucket that grew, else that bucket's
    /// bound.
    pub fn since(&self, base: &Summary) -> Summary {
        let mut out = Summary {
            min_ps: Summary::default().min_ps,
            max_ps: Summary::default().max_ps,
            ..self.saturating_sub(base)
        };
        // (The buckets' scale: the coarser of the two's.)
        let scale = out.scale;
        let lower = |i: usize| {
            if i == 0 {
                0
            } else {
                scale.upper_ps(i - 1).unwrap_or(0) + 1
            }
        };
        if let Some(lo) = out.buckets.iter().position(|&n| n > 0) {
            let (lo_bound, hi_bound) = (lower(lo), scale.upper_ps(lo).unwrap_or(u64::MAX));
            out.min_ps = if (lo_bound..=hi_bound).contains(&self.min_ps) {
                self.min_ps
            } else {
                lo_bound
            };
        }
        if let Some(hi) = out.buckets.iter().rposition(|&n| n > 0) {
            let hi_bound = scale.upper_ps(hi).unwrap_or(u64::MAX);
            out.max_ps = if (lower(hi)..=hi_bound).contains(&self.max_ps) {
                self.max_ps
            } else {
                hi_bound.min(self.max_ps)
            };
        }
        out.tighten_extremes();
        out
    }

    /// Narrows MIN and MAX, bounds of the true extremes, by what COUNT and
    /// SUM of the timed events say: MIN ≤ AVG ≤ MAX, the largest is at most
    /// the sum less the others at their smallest, the smallest at least the
    /// sum less the others at their largest. Each step keeps a bound a
    /// bound, and one timed event gets MIN = MAX = SUM exactly.
    ///
    /// ```
    /// use pfs_shm_layout::values::Summary;
    /// // One event of 7.9 ms, its MAX known only as "at most 14 ms".
    /// let mut s = Summary { timed_count: 1, sum_ps: 7_903_027_000, min_ps: 7_812_500_001, max_ps: 14_022_669_000, ..Summary::default() };
    /// s.tighten_extremes();
    /// assert_eq!((s.min_ps, s.max_ps), (7_903_027_000, 7_903_027_000));
    /// ```
    pub fn tighten_extremes(&mut self) {
        let n = u128::from(self.timed_count);
        if n == 0 || self.min_ps > self.max_ps {
            return;
        }
        let (sum, others) = (self.sum_ps, n - 1);
        let cap = sum.saturating_sub(others * u128::from(self.min_ps));
        self.max_ps = self.max_ps.min(u64::try_from(cap).unwrap_or(u64::MAX));
        let floor = sum.saturating_sub(others * u128::from(self.max_ps));
        self.min_ps = self.min_ps.max(u64::try_from(floor).unwrap_or(u64::MAX));
        let avg_down = u64::try_from(sum / n).unwrap_or(u64::MAX);
        let avg_up = u64::try_from(sum.div_ceil(n)).unwrap_or(u64::MAX);
        self.min_ps = self.min_ps.min(avg_down);
        self.max_ps = self.max_ps.max(avg_up);
    }

    /// `MIN_TIMER_WAIT` or `None` (PFS shows 0) when nothing was timed.
    pub fn min(&self) -> Option<u64> {
        (self.timed_count > 0).then_some(self.min_ps)
    }

    /// `AVG_TIMER_WAIT` in ps, over timed events.
    pub fn avg_ps(&self) -> u64 {
        if self.timed_count == 0 {
            0
        } else {
            (self.sum_ps / u128::from(self.timed_count)) as u64
        }
    }

    /// The `parts / of` quantile of the timed events' durations, in ps, as
    /// MySQL's `QUANTILE_95` (`95, 100`), `QUANTILE_99` and `QUANTILE_999`
    /// (`999, 1000`) compute it: a high estimate, the upper bound of the
    /// histogram bucket that holds the event of rank ⌈n · parts / of⌉
    /// (n timed events), here at most `MAX_TIMER_WAIT` and at least
    /// `MIN_TIMER_WAIT`. The buckets are powers of two, so the estimate is
    /// below twice the true quantile (above the first bucket, which holds
    /// everything up to 7.45 ns for a wait, 954 ns for a stage or a
    /// statement). 0 when nothing was timed.
    ///
    /// ```
    /// use pfs_shm_layout::layout::bucket_index;
    /// use pfs_shm_layout::values::Summary;
    /// // 99 events of 1 µs and one of 1 ms.
    /// let mut s = Summary { timed_count: 100, min_ps: 1_000_000, max_ps: 1_000_000_000, ..Summary::default() };
    /// s.buckets[bucket_index(1_000_000)] = 99;
    /// s.buckets[bucket_index(1_000_000_000)] = 1;
    /// assert_eq!(s.quantile_ps(95, 100), 1_907_348); // 2^-19 s: 1 µs's bucket
    /// assert_eq!(s.quantile_ps(999, 1000), 1_000_000_000); // the bucket's bound, capped by MAX
    /// ```
    pub fn quantile_ps(&self, parts: u64, of: u64) -> u64 {
        self.quantiles_ps([(parts, of)])[0]
    }

    /// [`Summary::quantile_ps`] of each `(parts, of)` of `quantiles`, in
    /// one pass over the buckets.
    ///
    /// ```
    /// use pfs_shm_layout::values::Summary;
    /// let s = Summary::default();
    /// assert_eq!(s.quantiles_ps([(95, 100), (99, 100), (999, 1000)]), [0, 0, 0]);
    /// ```
    pub fn quantiles_ps<const N: usize>(&self, quantiles: [(u64, u64); N]) -> [u64; N] {
        let n: u128 = self.buckets.iter().map(|&b| u128::from(b)).sum();
        if n == 0 {
            return [0; N];
        }
        let ranks = quantiles.map(|(parts, of)| {
            (of > 0).then(|| {
                (n * u128::from(parts.min(of)))
                    .div_ceil(u128::from(of))
                    .max(1)
            })
        });
        let (min, max) = (self.min().unwrap_or(0), self.max_ps);
        let within = |bucket: usize| {
            let upper = self.scale.upper_ps(bucket).unwrap_or(u64::MAX);
            upper.min(max).max(min.min(max))
        };
        let mut out = [None; N];
        let mut below = 0u128;
        for (bucket, &b) in self.buckets.iter().enumerate() {
            if b == 0 {
                continue;
            }
            below += u128::from(b);
            for (o, rank) in out.iter_mut().zip(&ranks) {
                if o.is_none() && rank.is_some_and(|r| below >= r) {
                    *o = Some(within(bucket));
                }
            }
        }
        let last = within(HISTOGRAM_BUCKETS - 1);
        std::array::from_fn(|i| match ranks[i] {
            None => 0,
            Some(_) => out[i].unwrap_or(last),
        })
    }
}

/// Memory statistics of one memory class (one thread, or aggregated):
/// the columns of the `memory_summary_*` tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// `COUNT_ALLOC`.
    pub count_alloc: u64,
    /// `COUNT_FREE`.
    pub count_free: u64,
    /// `SUM_NUMBER_OF_BYTES_ALLOC`.
    pub bytes_alloc: u64,
    /// `SUM_NUMBER_OF_BYTES_FREE`.
    pub bytes_free: u64,
    /// `LOW_COUNT_USED`.
    pub low_count: i64,
    /// `CURRENT_COUNT_USED`.
    pub current_count: i64,
    /// `HIGH_COUNT_USED`.
    pub high_count: i64,
    /// `LOW_NUMBER_OF_BYTES_USED`.
    pub low_bytes: i64,
    /// `CURRENT_NUMBER_OF_BYTES_USED`.
    pub current_bytes: i64,
    /// `HIGH_NUMBER_OF_BYTES_USED`.
    pub high_bytes: i64,
}

impl MemoryStats {
    /// Adds a child's statistics (PFS aggregation): counts, sums and
    /// CURRENT add; LOW and HIGH add too, the worst case of the children
    /// (the manual: 1–2 MB and 10–12 MB aggregate to 11–14 MB).
    pub fn merge(&mut self, o: &MemoryStats) {
        // Saturating, as in `Summary::merge`.
        self.count_alloc = self.count_alloc.saturating_add(o.count_alloc);
        self.count_free = self.count_free.saturating_add(o.count_free);
        self.bytes_alloc = self.bytes_alloc.saturating_add(o.bytes_alloc);
        self.bytes_free = self.bytes_free.saturating_add(o.bytes_free);
        self.low_count = self.low_count.saturating_add(o.low_count);
        self.current_count = self.current_count.saturating_add(o.current_count);
        self.high_count = self.high_count.saturating_add(o.high_count);
        self.low_bytes = self.low_bytes.saturating_add(o.low_bytes);
        self.current_bytes = self.current_bytes.saturating_add(o.current_bytes);
        self.high_bytes = self.high_bytes.saturating_add(o.high_bytes);
    }

    /// The row rebased as PFS `TRUNCATE` of a memory table does it, `base`
    /// being the row at the truncation: COUNT_ALLOC and COUNT_FREE are both
    /// reduced by the same value, the smaller of the two at the
    /// truncation, and likewise SUM_NUMBER_OF_BYTES_ALLOC and _FREE (the
    /// manual: "reset to a new baseline, by reducing each counter by the
    /// same value"). So CURRENT stays ALLOC − FREE and no counter goes
    /// negative. LOW, CURRENT and HIGH are `self`'s.
    ///
    /// ```
    /// use pfs_shm_layout::reader::MemoryStats;
    ///
    /// // 4 blocks (4500 B) allocated, none freed, then TRUNCATE:
    /// let at = MemoryStats { count_alloc: 4, bytes_alloc: 4500, current_count: 4, current_bytes: 4500, ..MemoryStats::default() };
    /// let shown = at.rebased(&at);
    /// assert_eq!((shown.count_alloc, shown.count_free, shown.bytes_alloc, shown.bytes_free), (4, 0, 4500, 0));
    /// ```
    pub fn rebased(&self, base: &MemoryStats) -> MemoryStats {
        let count = base.count_alloc.min(base.count_free);
        let bytes = base.bytes_alloc.min(base.bytes_free);
        MemoryStats {
            count_alloc: self.count_alloc.saturating_sub(count),
            count_free: self.count_free.saturating_sub(count),
            bytes_alloc: self.bytes_alloc.saturating_sub(bytes),
            bytes_free: self.bytes_free.saturating_sub(bytes),
            ..*self
        }
    }

    /// The row as `memory_summary_global_by_event_name` shows an
    /// aggregate: LOW clamped at 0. The manual lets lower estimates go
    /// negative (memory freed by another thread than the one that
    /// allocated it) in every memory table *but* the global one; MySQL
    /// clamps the global LOW when it normalises global statistics.
    pub fn clamp_global_low(mut self) -> Self {
        self.low_count = self.low_count.max(0);
        self.low_bytes = self.low_bytes.max(0);
        self
    }

    /// The row with its watermarks widened to cover `marks` (LOW no higher
    /// than its LOW, HIGH no lower than its HIGH): watermarks kept from
    /// before a reset that must not lower them.
    pub fn widened(mut self, marks: &MemoryStats) -> Self {
        self.low_count = self.low_count.min(marks.low_count);
        self.high_count = self.high_count.max(marks.high_count);
        self.low_bytes = self.low_bytes.min(marks.low_bytes);
        self.high_bytes = self.high_bytes.max(marks.high_bytes);
        self
    }

    /// The statistics with LOW = HIGH = CURRENT (as just after TRUNCATE).
    pub fn reset_watermarks(mut self) -> Self {
        self.low_count = self.current_count;
        self.high_count = self.current_count;
        self.low_bytes = self.current_bytes;
        self.high_bytes = self.current_bytes;
        self
    }

    /// True if nothing was ever accounted.
    pub fn is_empty(&self) -> bool {
        self.count_alloc == 0 && self.count_free == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{bucket_index, bucket_upper_ps};

    #[test]
    fn summaries_of_two_scales_add_up_in_the_coarser() {
        // A 7.x process's statement row (the wait scale): 1 µs and 20 s.
        let mut old = Summary {
            count: 2,
            timed_count: 2,
            min_ps: 1_000_000,
            max_ps: 20_000_000_000_000,
            ..Summary::default()
        };
        old.buckets[bucket_index(1_000_000)] = 1;
        old.buckets[HISTOGRAM_BUCKETS - 1] = 1;
        // An 8.x process's: 3 s.
        let long = BucketScale::Long;
        let mut new = Summary {
            count: 1,
            timed_count: 1,
            min_ps: 3_000_000_000_000,
            max_ps: 3_000_000_000_000,
            scale: long,
            ..Summary::default()
        };
        new.buckets[long.index(3_000_000_000_000)] = 1;
        // The zero takes the first summary's scale, whichever it is.
        let mut z = Summary::default();
        z.merge(&new);
        assert_eq!(z, new);
        let mut sum = Summary::default();
        sum.merge(&old);
        assert_eq!(sum.scale, BucketScale::Short);
        sum.merge(&new);
        assert_eq!(sum.scale, long);
        assert_eq!(sum.buckets.iter().sum::<u64>(), 3);
        assert_eq!(sum.buckets[long.index(1_000_000)], 1);
        assert_eq!(sum.buckets[long.index(3_000_000_000_000)], 1);
        assert_eq!(sum.buckets[long.index(16_000_000_000_000)], 1); // above 8 s
        assert_eq!(sum.quantile_ps(1, 1), 16_000_000_000_000);
        // Either order gives the same.
        let mut other = new;
        other.merge(&old);
        assert_eq!(other.buckets, sum.buckets);
        // The wait scale's zero, taken from or added to a sum of the long
        // scale, leaves it in its scale (a thread's row replaced by
        // nothing as the thread exits).
        let mut s = new;
        s.replace_part(&new, &Summary::ZERO);
        assert_eq!(s.scale, long);
        let untimed = Summary {
            count: 4,
            ..Summary::zero(long)
        };
        let mut z = Summary::default();
        z.merge(&untimed);
        let mut l = Summary::zero(long);
        l.merge(&Summary::default());
        assert_eq!((z.count, l.scale), (4, long));
    }

    /// `n` events: `low` of them in the bucket of 1 µs, the rest in the
    /// bucket of 1 ms.
    fn two_buckets(low: u64, n: u64) -> Summary {
        let mut s = Summary {
            timed_count: n,
            min_ps: 1_000_000,
            max_ps: 1_000_000_000,
            ..Summary::default()
        };
        s.buckets[bucket_index(1_000_000)] = low;
        s.buckets[bucket_index(1_000_000_000)] = n - low;
        s
    }

    #[test]
    fn a_quantile_is_the_bucket_of_its_rank() {
        let (us, ms) = (
            bucket_upper_ps(bucket_index(1_000_000)).unwrap(),
            1_000_000_000,
        );
        // Rank 95 of 100 is the last in the low bucket, rank 99 is not.
        let s = two_buckets(95, 100);
        assert_eq!((s.quantile_ps(95, 100), s.quantile_ps(99, 100)), (us, ms));
        // Rank ⌈999 · 0.95⌉ = 950 of 999.
        let s = two_buckets(949, 999);
        assert_eq!(s.quantile_ps(95, 100), ms);
        let s = two_buckets(950, 999);
        assert_eq!(s.quantile_ps(95, 100), us);
        // Rank 999 of 1000.
        let s = two_buckets(999, 1000);
        assert_eq!((s.quantile_ps(99, 100), s.quantile_ps(999, 1000)), (us, us));
        // One event: every quantile is its bucket, within MIN and MAX.
        let s = two_buckets(1, 1);
        assert_eq!(s.quantile_ps(999, 1000), us);
        // Nothing timed.
        assert_eq!(Summary::default().quantile_ps(95, 100), 0);
    }

    #[test]
    fn a_quantile_lies_within_min_and_max() {
        // Every event in the last bucket (above 8 s), MAX 9 s.
        let mut s = Summary {
            timed_count: 3,
            min_ps: 8_500_000_000_000,
            max_ps: 9_000_000_000_000,
            ..Summary::default()
        };
        s.buckets[HISTOGRAM_BUCKETS - 1] = 3;
        assert_eq!(s.quantile_ps(95, 100), 9_000_000_000_000);
        // A bucket bound above MAX: MAX.
        let mut s = Summary {
            timed_count: 2,
            min_ps: 1_500_000,
            max_ps: 1_800_000,
            ..Summary::default()
        };
        s.buckets[bucket_index(1_000_000)] = 2;
        assert_eq!(s.quantile_ps(95, 100), 1_800_000);
        s.max_ps = 3_000_000;
        assert_eq!(s.quantile_ps(95, 100), 1_907_348);
        // A bucket bound below MIN (MIN and MAX narrowed from the sum
        // after TRUNCATE, the buckets not): MIN.
        s.min_ps = 1_950_000;
        assert_eq!(s.quantile_ps(95, 100), 1_950_000);
    }
}
