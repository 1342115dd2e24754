//! Kept copies of the threads' summary rows between two snapshots, and
//! their sums by class: what lets a summaries snapshot read only the rows
//! whose sequence moved since the last one (the reader's
//! `IncrementalReader`, a layer above).
//!
//! A kept row is its class, the sequence value it was read at (even; odd
//! only for a row of a dead writer read as it is, which never changes again), and
//! its value, compact: most of a row's 46 words are zero (a wait class
//! has no statement figures, and a row's events fill a few histogram
//! buckets, those from MIN's to MAX's), so a row is stored as five head
//! words (count, timed count, the sum's low half, MIN, MAX), the sum's
//! high half and bytes only if not zero, the span of buckets its events
//! can fill and, for a statement class, its statement figures (for a
//! file or socket class, its figures by I/O mode), all LEB128
//! varints: about 30 bytes for a wait row, instead of the 432 of a
//! [`Summary`]. (A 64-bit presence mask of the nonzero words was the
//! format until the eleventh session: about as small, but finding the nonzero words cost 35 ns a
//! row, two thirds of the encoding. A length-nibble encoding, one 8-byte
//! store per word, was tried: 15 % more kept bytes and a slower first
//! scrape.)
//!
//! A record's rows live in one byte buffer; a changed row is rewritten
//! where it was if it is no longer (most are: a few more events rarely
//! lengthen a varint), else appended, its old bytes becoming garbage,
//! reclaimed when the buffer is full (it grows by a quarter at a time:
//! `HEADROOM`). The walk's threads put changed rows in place themselves,
//! each in the kept records of its own range ([`RowCache::split`]).
//!
//! The sums by class are kept up to date with each change (old value out,
//! new value in: [`Summary::replace_part`]), so that a snapshot costs what
//! changed, not what is kept. MIN and MAX cannot be taken out of a sum:
//! when a row leaving the sum held the class's extreme, that extreme is
//! recomputed from the kept rows of the class.
//!
//! Layer 3 (see the crate docs): builds on [`crate::values`] and
//! [`crate::layout`] (the histogram's bucket count); it
//! never touches a segment.

use std::ops::Range;

use crate::layout::{BucketScale, HISTOGRAM_BUCKETS};
use crate::values::{IoFigures, StatementFigures, Summary};

/// The head of a row: count, timed count, the low half of the sum, MIN
/// plus one (wrapping, so that "none", `u64::MAX`, is 0) and MAX; then
/// two words most rows have zero, each stored only if not (flags
/// [`HAS_SUM_HI`], [`HAS_BYTES`]): the high half of the sum and bytes.
const HEAD: usize = 5;

/// The statement figures kept (all but the digest, which a summary row
/// does not have).
const TAIL: usize = 7;

/// The head words of `s`.
#[inline(always)]
fn head(s: &Summary) -> [u64; HEAD] {
    [
        s.count,
        s.timed_count,
        s.sum_ps as u64,
        s.min_ps.wrapping_add(1),
        s.max_ps,
    ]
}

/// The statement words of `s`.
#[inline(always)]
fn tail(s: &Summary) -> [u64; TAIL] {
    let st = &s.statement;
    [
        st.errors,
        st.warnings,
        st.rows_affected,
        st.rows_sent,
        st.rows_examined,
        st.cpu_time_ps,
        st.cancelled,
    ]
}

/// A compact row being written: the bytes go to a buffer on the stack,
/// the count of them stays in a register. (Pushed to a `Vec` one by one,
/// each byte's store made the compiler reload the vector's length, as a
/// byte store may alias it.)
struct Compact {
    bytes: [u8; MAX_ENCODED],
    len: usize,
}

impl Compact {
    #[inline(always)]
    fn new() -> Self {
        Self {
            bytes: [0; MAX_ENCODED],
            len: 0,
        }
    }

    #[inline(always)]
    fn byte(&mut self, b: u8) {
        self.bytes[self.len] = b;
        self.len += 1;
    }

    /// Appends `v` as a LEB128 varint. (A branch-free store of the whole
    /// word, the 7-bit groups spread into its bytes, was tried: slower
    /// here, 79 against 49 ns a row.)
    #[inline(always)]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The longest compact row: two bytes and every word, 10 bytes each.
const MAX_ENCODED: usize = 2 + 10 * (HEAD + 2 + HISTOGRAM_BUCKETS + TAIL + IoFigures::WORDS);

/// A compact row's first byte: the first bucket kept (below 32), and
/// these flags.
const FIRST_BUCKET: u8 = 0x1f;
/// The high half of the sum follows the head.
const HAS_SUM_HI: u8 = 0x20;
/// Bytes follow (after the high half of the sum, if any).
const HAS_BYTES: u8 = 0x40;
/// The statement words end the row.
const HAS_TAIL: u8 = 0x80;
const _: () = assert!(HISTOGRAM_BUCKETS <= FIRST_BUCKET as usize + 1);
/// A compact row's second byte: how many buckets are kept (up to 32),
/// and these flags.
const KEPT_BUCKETS: u8 = 0x3f;
/// The buckets are in [`BucketScale::Long`] (else `Short`).
const LONG_SCALE: u8 = 0x40;
/// The I/O words end the row (after the statement words, if any).
const HAS_IO: u8 = 0x80;
const _: () = assert!(HISTOGRAM_BUCKETS <= KEPT_BUCKETS as usize);

/// The varint at the start of `b`, and the rest. Only ever given bytes
/// [`Compact::varint`] wrote.
#[inline(always)]
fn take_varint(b: &[u8]) -> (u64, &[u8]) {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return (v, &b[i + 1..]);
        }
    }
    (v, &[])
}

/// Appends the compact form of `s` to `out`: the first bucket kept with
/// the flags, how many buckets are kept, then as varints the head, the
/// high half of the sum and bytes if not zero, those buckets and, if any
/// is not zero, the statement words, and the I/O words likewise. The
/// buckets kept are
/// [`Summary::nonzero_buckets`] (`kept`): for a loaded row, those between
/// MIN's and MAX's.
fn encode(s: &Summary, kept: Range<usize>, out: &mut Vec<u8>) {
    let tail = tail(s);
    let has_tail = tail.iter().fold(0, |a, &x| a | x) != 0;
    let has_io = s.io != IoFigures::ZERO;
    let sum_hi = (s.sum_ps >> 64) as u64;
    let flag = |on: bool, f: u8| if on { f } else { 0 };
    let mut c = Compact::new();
    c.byte(
        (kept.start as u8 & FIRST_BUCKET)
            | flag(sum_hi != 0, HAS_SUM_HI)
            | flag(s.bytes != 0, HAS_BYTES)
            | flag(has_tail, HAS_TAIL),
    );
    c.byte(
        kept.len() as u8 | flag(s.scale == BucketScale::Long, LONG_SCALE) | flag(has_io, HAS_IO),
    );
    for w in head(s) {
        c.varint(w);
    }
    if sum_hi != 0 {
        c.varint(sum_hi);
    }
    if s.bytes != 0 {
        c.varint(s.bytes);
    }
    for &w in &s.buckets[kept] {
        c.varint(w);
    }
    if has_tail {
        for w in tail {
            c.varint(w);
        }
    }
    if has_io {
        for w in s.io.words() {
            c.varint(w);
        }
    }
    out.extend_from_slice(c.as_slice());
}

/// The summary whose compact form starts `b`.
fn decode(b: &[u8]) -> Summary {
    let (&[first, n], mut rest) = b.split_at(2.min(b.len())) else {
        return Summary::default();
    };
    let mut next = || {
        let (v, r) = take_varint(rest);
        rest = r;
        v
    };
    let h: [u64; HEAD] = std::array::from_fn(|_| next());
    let sum_hi = if first & HAS_SUM_HI != 0 { next() } else { 0 };
    let bytes = if first & HAS_BYTES != 0 { next() } else { 0 };
    let mut buckets = [0; HISTOGRAM_BUCKETS];
    let lo = usize::from(first & FIRST_BUCKET);
    let hi = (lo + usize::from(n & KEPT_BUCKETS)).min(HISTOGRAM_BUCKETS);
    for d in &mut buckets[lo..hi] {
        *d = next();
    }
    let t: [u64; TAIL] = if first & HAS_TAIL != 0 {
        std::array::from_fn(|_| next())
    } else {
        [0; TAIL]
    };
    let io = if n & HAS_IO != 0 {
        IoFigures::from_words(std::array::from_fn(|_| next()))
    } else {
        IoFigures::ZERO
    };
    Summary {
        count: h[0],
        timed_count: h[1],
        sum_ps: u128::from(h[2]) | (u128::from(sum_hi) << 64),
        min_ps: h[3].wrapping_sub(1),
        max_ps: h[4],
        bytes,
        buckets,
        scale: if n & LONG_SCALE != 0 {
            BucketScale::Long
        } else {
            BucketScale::Short
        },
        statement: StatementFigures {
            errors: t[0],
            warnings: t[1],
            rows_affected: t[2],
            rows_sent: t[3],
            rows_examined: t[4],
            digest: 0,
            cpu_time_ps: t[5],
            cancelled: t[6],
        },
        io,
    }
}

/// A kept record's buffer grows by 1 / `HEADROOM` of its bytes, the
/// room its changed rows are appended into until it is compacted (each
/// compaction copies every row). At 1 000 × 200 with 1 % of the rows
/// changed per scrape, an eighth had each record compacted about every 12
/// scrapes, the copies half of the commit's time; a quarter halves their
/// number: `take_incremental` 2.56 → 2.46 ms (four alternate rounds),
/// kept bytes after many scrapes 9.01 → 9.64 MB.
const HEADROOM: usize = 4;

/// Where a kept row's bytes are, and the sequence it was read at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowRef {
    class: u16,
    len: u16,
    off: u32,
    seq: u64,
}
const _: () = assert!(size_of::<RowRef>() == 16);
// Every class index fits `class`, every compact row `len`.
const _: () = assert!(crate::layout::MAX_CLASSES_LIMIT <= 1 << 16 && MAX_ENCODED < 1 << 16);

/// Compact rows: references into one byte buffer.
#[derive(Debug, Default)]
pub struct Rows {
    /// Sorted by class once kept; in reading order while walked.
    refs: Vec<RowRef>,
    data: Vec<u8>,
}

impl Rows {
    /// Appends row `class`, read at sequence `seq`.
    pub fn push(&mut self, class: u32, seq: u64, s: &Summary) {
        self.push_within(class, seq, s, s.nonzero_buckets());
    }

    /// [`Rows::push`] given `s`'s [`Summary::nonzero_buckets`], `span`.
    fn push_within(&mut self, class: u32, seq: u64, s: &Summary, span: Range<usize>) {
        let off = self.data.len();
        encode(s, span, &mut self.data);
        self.refs.push(RowRef {
            class: class as u16,
            len: (self.data.len() - off) as u16,
            off: off as u32,
            seq,
        });
    }

    /// Empties the buffers, keeping their memory.
    pub fn clear(&mut self) {
        self.refs.clear();
        self.data.clear();
    }

    /// A copy of the rows in buffers of their exact size, sorted by class
    /// (as a kept record's are): what a walk's thread hands over for a
    /// record to keep, so that the commit, serial, need not sort it.
    pub fn to_kept(&self) -> Rows {
        let mut refs = self.refs.to_vec();
        refs.sort_unstable_by_key(|r| r.class);
        Rows {
            refs,
            data: self.data.to_vec(),
        }
    }

    fn bytes(&self, r: &RowRef) -> &[u8] {
        &self.data[r.off as usize..r.off as usize + usize::from(r.len)]
    }

    fn value(&self, r: &RowRef) -> Summary {
        decode(self.bytes(r))
    }

    /// Every row: class and value.
    pub fn values(&self) -> impl Iterator<Item = (u32, Summary)> + '_ {
        self.refs
            .iter()
            .map(|r| (u32::from(r.class), self.value(r)))
    }
}

/// One record lifetime's kept rows, and what the reader keeps beside
/// them (`extra`: its copy of the thread).
#[derive(Debug)]
pub struct KeptRecord<T> {
    version: u64,
    /// The reader's own data for this record.
    pub extra: T,
    /// Sorted by class.
    rows: Rows,
    garbage: usize,
}

impl<T> KeptRecord<T> {
    /// The references of the first kept rows (up to four cache lines'
    /// worth), which a walk reads first: for it to fetch them ahead.
    pub(crate) fn refs_head(&self) -> &[RowRef] {
        let refs = &self.rows.refs;
        &refs[..refs.len().min(256 / size_of::<RowRef>())]
    }

    /// A cursor over the kept rows' sequences, for a walk in class order.
    pub fn cursor(&self) -> SeqCursor<'_> {
        SeqCursor {
            rows: &self.rows.refs,
            at: 0,
        }
    }

    fn find(&self, class: u32) -> Result<usize, usize> {
        self.rows
            .refs
            .binary_search_by_key(&class, |r| u32::from(r.class))
    }

    /// [`KeptRecord::find`], trying `hint` first.
    fn find_hinted(&self, class: u32, hint: Option<usize>) -> Result<usize, usize> {
        match hint {
            Some(i)
                if self
                    .rows
                    .refs
                    .get(i)
                    .is_some_and(|r| u32::from(r.class) == class) =>
            {
                Ok(i)
            }
            _ => self.find(class),
        }
    }

    /// Pushes onto `out` the class of every kept row whose sequence now
    /// (`seq_of(class)`) differs from the kept one; returns how many rows
    /// did not change. One pass over the kept rows, in class order.
    pub fn changed(&self, seq_of: impl Fn(usize) -> u64, out: &mut Vec<usize>) -> usize {
        let mut same = 0;
        for r in &self.rows.refs {
            let c = usize::from(r.class);
            if seq_of(c) == r.seq {
                same += 1;
            } else {
                out.push(c);
            }
        }
        same
    }

    /// The compact bytes of the kept row at position `at` among the kept
    /// rows (from [`SeqCursor::found`]): for a reader to fetch them ahead
    /// of [`KeptRecord::get_hinted`].
    pub fn bytes_at(&self, at: u32) -> Option<&[u8]> {
        self.rows.refs.get(at as usize).map(|r| self.rows.bytes(r))
    }

    /// The kept value of row `class`.
    pub fn get(&self, class: u32) -> Option<Summary> {
        self.get_hinted(class, None)
    }

    /// [`KeptRecord::get`], looking at position `hint` first (from
    /// [`SeqCursor::found`]).
    pub fn get_hinted(&self, class: u32, hint: Option<u32>) -> Option<Summary> {
        self.find_hinted(class, hint.map(|h| h as usize))
            .ok()
            .map(|i| self.rows.value(&self.rows.refs[i]))
    }

    /// Stores the compact row `bytes` as row `class`, read at `seq`. The
    /// row's old bytes become garbage, reclaimed when the buffer is full;
    /// the buffer grows by 1 / [`HEADROOM`] at a time, so it stays within
    /// about 1.25 × the live rows plus one round of changes.
    /// `hint`: where row `class` probably is. Returns true if the row was
    /// not kept before (inserted).
    fn put(&mut self, class: u32, seq: u64, bytes: &[u8], hint: Option<usize>) -> bool {
        let found = self.find_hinted(class, hint);
        if let Ok(i) = found {
            let r = &mut self.rows.refs[i];
            if bytes.len() <= usize::from(r.len) {
                // Fits where the old value was (the usual case: a row that
                // grew by a few events keeps its words' lengths).
                let at = r.off as usize;
                self.rows.data[at..at + bytes.len()].copy_from_slice(bytes);
                self.garbage += usize::from(r.len) - bytes.len();
                r.len = bytes.len() as u16;
                r.seq = seq;
                return false;
            }
        }
        let data = &mut self.rows.data;
        if data.len() + bytes.len() > data.capacity() {
            if self.garbage > 0 {
                self.compact(bytes.len());
            } else {
                let data = &mut self.rows.data;
                data.reserve_exact(bytes.len().max(data.len() / HEADROOM));
            }
        }
        let new = RowRef {
            class: class as u16,
            len: bytes.len() as u16,
            off: self.rows.data.len() as u32,
            seq,
        };
        self.rows.data.extend_from_slice(bytes);
        // (A compaction moves bytes, not references: `found` holds.)
        match found {
            Ok(i) => {
                self.garbage += usize::from(self.rows.refs[i].len);
                self.rows.refs[i] = new;
                false
            }
            Err(i) => {
                self.rows.refs.insert(i, new);
                true
            }
        }
    }

    /// Drops the garbage: the live rows' bytes, in class order, in a
    /// buffer with room for `extra` more bytes and 1 / [`HEADROOM`] more.
    fn compact(&mut self, extra: usize) {
        let live = self.rows.data.len() - self.garbage + extra;
        let mut data = Vec::with_capacity(live + live / HEADROOM);
        for r in &mut self.rows.refs {
            let off = data.len();
            data.extend_from_slice(
                &self.rows.data[r.off as usize..r.off as usize + usize::from(r.len)],
            );
            r.off = off as u32;
        }
        self.rows.data = data;
        self.garbage = 0;
    }

    fn heap_bytes(&self) -> usize {
        self.rows.refs.capacity() * size_of::<RowRef>() + self.rows.data.capacity()
    }
}

/// Walks a kept record's rows in class order: [`SeqCursor::seq`] asked
/// for increasing classes costs O(1) each.
#[derive(Debug)]
pub struct SeqCursor<'a> {
    rows: &'a [RowRef],
    at: usize,
}

impl SeqCursor<'_> {
    /// The sequence row `class` was kept at, if kept. Classes must be
    /// asked in increasing order.
    #[inline]
    pub fn seq(&mut self, class: u32) -> Option<u64> {
        while let Some(r) = self.rows.get(self.at) {
            let c = u32::from(r.class);
            if c >= class {
                return (c == class).then_some(r.seq);
            }
            self.at += 1;
        }
        None
    }

    /// Where, among the kept rows, the row the last [`SeqCursor::seq`]
    /// call found is (meaningful only after a `Some`).
    pub fn found(&self) -> u32 {
        self.at as u32
    }
}

/// What one walk changes in the sums by class: for each class, the
/// additive fields of (new − old) over the rows it read (wrapping), the
/// smallest MIN and largest MAX among the new values, and the change in
/// rows. Classes whose MIN or MAX may have moved the wrong way (a row
/// that did not grow, a walk undone) are listed for a recomputation.
#[derive(Debug, Default)]
pub struct Delta {
    sums: Vec<Summary>,
    rows: Vec<i64>,
    touched: Vec<bool>,
    extremes: Vec<u32>,
}

impl Delta {
    fn slot(&mut self, class: u32) -> usize {
        let i = class as usize;
        if i >= self.sums.len() {
            self.sums.resize(i + 1, Summary::default());
            self.rows.resize(i + 1, 0);
            self.touched.resize(i + 1, false);
        }
        self.touched[i] = true;
        i
    }

    /// Row `class` read as `new` (as the reader loads a row: see
    /// [`Summary::add_loaded_part`]), kept before as `old` (`None`: a new
    /// row).
    pub fn row(&mut self, class: u32, old: Option<&Summary>, new: &Summary) {
        let Some(old) = old else {
            self.add_row(class, new, new.nonzero_buckets());
            return;
        };
        let i = self.slot(class);
        let d = &mut self.sums[i];
        d.replace_part(old, new);
        d.min_ps = d.min_ps.min(new.min_ps);
        d.max_ps = d.max_ps.max(new.max_ps);
        // A row only grows within a lifetime; one that did not (a hostile
        // segment) may have held the class's extreme.
        if new.min_ps > old.min_ps || new.max_ps < old.max_ps {
            self.extremes.push(class);
        }
    }

    /// Row `class` of a record the cache did not keep, read at sequence
    /// `seq` as `new`, whose buckets outside `span` are zero (the ones
    /// the reader did not load: no need to look at them again):
    /// [`Delta::row`] with nothing before, and [`Rows::push`] onto `rows`.
    pub(crate) fn fresh_row(
        &mut self,
        class: u32,
        seq: u64,
        new: &Summary,
        span: Range<usize>,
        rows: &mut Rows,
    ) {
        debug_assert!(
            new.buckets[..span.start]
                .iter()
                .chain(&new.buckets[span.end..])
                .all(|&b| b == 0),
            "every bucket outside the span is zero"
        );
        self.add_row(class, new, span.clone());
        rows.push_within(class, seq, new, span);
    }

    /// A new row `class`, `new`, whose nonzero buckets are `span`.
    fn add_row(&mut self, class: u32, new: &Summary, span: Range<usize>) {
        let i = self.slot(class);
        let d = &mut self.sums[i];
        d.add_part_within(new, span);
        d.min_ps = d.min_ps.min(new.min_ps);
        d.max_ps = d.max_ps.max(new.max_ps);
        self.rows[i] += 1;
    }

    /// Adds `o`, what another part of the same walk changed.
    pub fn merge(&mut self, o: Delta) {
        for (c, d) in o.sums.iter().enumerate() {
            if !o.touched[c] {
                continue;
            }
            let i = self.slot(c as u32);
            let s = &mut self.sums[i];
            s.add_part(d);
            s.min_ps = s.min_ps.min(d.min_ps);
            s.max_ps = s.max_ps.max(d.max_ps);
            self.rows[i] += o.rows[c];
        }
        self.extremes.extend(o.extremes);
    }

    /// Takes back [`Delta::row`] (a walked record that turned out folded).
    fn undo(&mut self, class: u32, old: Option<&Summary>, new: &Summary) {
        let i = self.slot(class);
        self.sums[i].replace_part(new, old.unwrap_or(&ZERO));
        if old.is_none() {
            self.rows[i] -= 1;
        }
        // The MIN and MAX merged in cannot be taken out.
        self.extremes.push(class);
    }
}

/// The additive zero (and "no MIN, no MAX").
const ZERO: Summary = Summary::ZERO;

/// A live record as one walk found it: its lifetime and, for a record the
/// cache did not keep, what to keep of it. (A kept record's changes are
/// already in place: [`CachePart::apply`].)
#[derive(Debug)]
pub struct Walked<T> {
    /// Record index.
    pub record: u32,
    /// Lock-word version.
    pub version: u64,
    /// A record the cache did not keep: the reader's own data for it, and
    /// every row read, each with the sequence the copy was taken at (even,
    /// or the odd one a dead writer left), best sorted by class
    /// ([`Rows::to_kept`]). `None`: a kept record.
    pub fresh: Option<(T, Rows)>,
}

impl<T> Walked<T> {
    /// Takes back what a fresh record's rows added to `fresh` (a walked
    /// record that turned out folded: it is not kept). A kept record's
    /// changes stay: the record leaves the cache at the commit, its rows
    /// (the changed ones as read) taken out of the sums then.
    pub fn forget(&self, fresh: &mut Delta) {
        if let Some((_, rows)) = &self.fresh {
            for (class, new) in rows.values() {
                fresh.undo(class, None, &new);
            }
        }
    }
}

/// The changed rows of one kept record, as a walk reads them, before they
/// are put in place ([`CachePart::apply`]): a buffer the walk reuses from
/// record to record.
#[derive(Debug, Default)]
pub struct Changes {
    rows: Rows,
    /// For each row of `rows`: where its class was among the kept rows
    /// when the walk read it ([`SeqCursor::found`]), or [`NOT_KEPT`]. Only
    /// a hint, checked before use: it spares a binary search.
    kept_at: Vec<u32>,
}

impl Changes {
    /// Empties the buffer for the next record.
    pub fn clear(&mut self) {
        self.rows.clear();
        self.kept_at.clear();
    }

    /// Appends row `class`, read at sequence `seq`, found at `kept_at`
    /// among the record's kept rows (or [`NOT_KEPT`]).
    pub fn push(&mut self, class: u32, seq: u64, s: &Summary, kept_at: u32) {
        self.rows.push(class, seq, s);
        self.kept_at.push(kept_at);
    }

    /// The rows held: class and value.
    pub fn values(&self) -> impl Iterator<Item = (u32, Summary)> + '_ {
        self.rows.values()
    }
}

/// [`Changes`]' place of a row that was not kept.
pub const NOT_KEPT: u32 = u32::MAX;

/// The sum of one class's kept rows.
#[derive(Debug, Clone, Copy, Default)]
struct Total {
    sum: Summary,
    rows: u64,
}

/// Kept rows of every live record of one segment, and their sums by
/// class.
///
/// A walk in parts borrows the kept records in disjoint ranges
/// ([`RowCache::split`]); each part puts the rows it found changed in its
/// own records as it goes ([`CachePart::apply`]), while the lines are in
/// its CPU's cache, and accounts for them in a [`Delta`]. The sums take
/// that delta afterwards: [`RowCache::commit`] for a walk that holds, with
/// the records that ended or are new; [`RowCache::settle`] for one that
/// must be retried (its puts stay: each is a row's value at some instant
/// of its lifetime, and the retry's commit drops the records that did not
/// survive it).
#[derive(Debug)]
pub struct RowCache<T> {
    /// Sorted by record index: a walk visits records in that order, so its
    /// lookups read the entries one after the other (a hash map's were
    /// scattered, and each lookup hashed); its size is the records kept,
    /// whatever their indexes (a segment's one live page may be its last).
    records: Vec<(u32, KeptRecord<T>)>,
    totals: Vec<Total>,
}

impl<T> Default for RowCache<T> {
    fn default() -> Self {
        Self {
            records: Vec::new(),
            totals: Vec::new(),
        }
    }
}

/// The kept records of one part of a walk: those whose index is in the
/// part's range ([`RowCache::split`]), visited in increasing order.
#[derive(Debug)]
pub struct CachePart<'a, T> {
    records: &'a mut [(u32, KeptRecord<T>)],
    /// The first record not below the last one sought.
    at: usize,
}

impl<T> CachePart<'_, T> {
    /// Records in the part.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No record in the part.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Moves to record `record` (records must be sought in increasing
    /// order; a lookup of another costs a binary search).
    #[inline]
    pub fn seek(&mut self, record: u32) {
        while self.records.get(self.at).is_some_and(|(r, _)| *r < record) {
            self.at += 1;
        }
    }

    fn position(&self, record: u32) -> Option<usize> {
        match self.records.get(self.at) {
            Some((r, _)) if *r == record => Some(self.at),
            _ => self.records.binary_search_by_key(&record, |(r, _)| *r).ok(),
        }
    }

    /// The rows kept (for any lifetime) of record `record`, which follows
    /// the one sought last: for a walk to fetch them ahead.
    #[inline]
    pub fn ahead(&self, record: u32) -> Option<&KeptRecord<T>> {
        self.records[self.at.min(self.records.len())..]
            .iter()
            .take(2)
            .find(|(r, _)| *r == record)
            .map(|(_, k)| k)
    }

    /// The rows kept for lifetime `version` of record `record`.
    #[inline]
    pub fn kept(&self, record: u32, version: u64) -> Option<&KeptRecord<T>> {
        let i = self.position(record)?;
        Some(&self.records[i].1).filter(|k| k.version == version)
    }

    /// Takes back what `rows` (class and value), read from lifetime
    /// `version` of record `record`, contributed to `delta` (the lifetime
    /// ended while it was being read).
    pub fn undo_rows(
        &self,
        record: u32,
        version: u64,
        rows: impl Iterator<Item = (u32, Summary)>,
        delta: &mut Delta,
    ) {
        let kept = self.kept(record, version);
        for (class, new) in rows {
            let old = kept.and_then(|k| k.get(class));
            delta.undo(class, old.as_ref(), &new);
        }
    }

    /// Puts in place the rows a walk found changed in lifetime `version`
    /// of kept record `record` (in class order, as read), and the reader's
    /// new data for it if any. Returns false, changing nothing, if the
    /// record is not kept with that lifetime.
    pub fn apply(&mut self, record: u32, version: u64, rows: &Changes, extra: Option<T>) -> bool {
        let Some(i) = self.position(record) else {
            return false;
        };
        let k = &mut self.records[i].1;
        if k.version != version {
            return false;
        }
        if let Some(extra) = extra {
            k.extra = extra;
        }
        // Each insertion moves the kept rows after it one place up.
        let mut inserted = 0;
        for (r, &h) in rows.rows.refs.iter().zip(&rows.kept_at) {
            let hint = (h != NOT_KEPT).then_some(h as usize + inserted);
            if k.put(u32::from(r.class), r.seq, rows.rows.bytes(r), hint) {
                inserted += 1;
            }
        }
        true
    }
}

impl<T> RowCache<T> {
    /// The kept records in parts, one per range of record indexes: part
    /// `k` holds those from `starts[k]` up to (not including)
    /// `starts[k + 1]`, the last all from its start on; records below
    /// `starts[0]` are in none. `starts` must increase.
    pub fn split(&mut self, starts: &[u32]) -> Vec<CachePart<'_, T>> {
        let mut rest = &mut self.records[..];
        let below = rest.partition_point(|(r, _)| starts.first().is_some_and(|s| r < s));
        rest = &mut rest[below..];
        let mut parts = Vec::with_capacity(starts.len());
        for (k, _) in starts.iter().enumerate() {
            let n = match starts.get(k + 1) {
                Some(end) => rest.partition_point(|(r, _)| r < end),
                None => rest.len(),
            };
            let (part, tail) = rest.split_at_mut(n);
            parts.push(CachePart {
                records: part,
                at: 0,
            });
            rest = tail;
        }
        parts
    }

    /// The rows kept for lifetime `version` of record `record`.
    #[inline]
    pub fn kept(&self, record: u32, version: u64) -> Option<&KeptRecord<T>> {
        let i = self
            .records
            .binary_search_by_key(&record, |(r, _)| *r)
            .ok()?;
        Some(&self.records[i].1).filter(|k| k.version == version)
    }

    /// Records kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No record kept.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The kept records.
    fn values(&self) -> impl Iterator<Item = &KeptRecord<T>> {
        self.records.iter().map(|(_, k)| k)
    }

    /// Heap bytes held by the kept rows alone.
    pub fn row_bytes(&self) -> usize {
        self.values().map(KeptRecord::heap_bytes).sum()
    }

    /// Heap bytes held by the kept records (rows, and `extra` but for
    /// what it allocates itself) and the sums.
    pub fn heap_bytes(&self) -> usize {
        self.values().map(KeptRecord::heap_bytes).sum::<usize>()
            + self.records.capacity() * size_of::<(u32, KeptRecord<T>)>()
            + self.totals.capacity() * size_of::<Total>()
    }

    /// The sum of the kept rows of each class that has any, by class.
    pub fn totals(&self) -> Vec<(u32, Summary)> {
        // Sized first: a filtered collect would grow by reallocation,
        // copying the (large) sums each time.
        let n = self.totals.iter().filter(|t| t.rows > 0).count();
        let mut out = Vec::with_capacity(n);
        out.extend(
            self.totals
                .iter()
                .enumerate()
                .filter(|(_, t)| t.rows > 0)
                .map(|(c, t)| (c as u32, t.sum)),
        );
        out
    }

    fn total(&mut self, class: usize) -> &mut Total {
        if class >= self.totals.len() {
            self.totals.resize(class + 1, Total::default());
        }
        &mut self.totals[class]
    }

    /// Makes the cache hold exactly the records of `live` (one walk's
    /// live records, after the fold log dropped the folded ones; their
    /// changed rows already put in place by the walk's parts) and the sums
    /// take `delta` (what the walk's rows changed in them): records not in
    /// `live`, or with another lifetime, are dropped with their rows; the
    /// fresh ones are kept.
    pub fn commit(&mut self, live: Vec<Walked<T>>, delta: Delta) {
        debug_assert!(
            live.is_sorted_by_key(|w| w.record),
            "a walk lists records in order"
        );
        // The delta first: the sums then hold every kept row as it is now
        // (a folded record's changed rows too, put in place by the walk),
        // which is what the records that go take out.
        let mut extremes = self.add(delta);
        // The kept records not in `live`, or of another lifetime, go: one
        // pass over both sorted lists.
        let mut next = live.iter().peekable();
        let gone: Vec<_> = self
            .records
            .extract_if(.., |(r, k)| {
                while next.next_if(|w| w.record < *r).is_some() {}
                !next
                    .peek()
                    .is_some_and(|w| w.record == *r && w.version == k.version && w.fresh.is_none())
            })
            .collect();
        for (_, k) in gone {
            for (class, old) in k.rows.values() {
                let t = self.total(class as usize);
                t.rows = t.rows.saturating_sub(1);
                if t.rows == 0 {
                    t.sum = Summary::default();
                    continue;
                }
                t.sum.replace_part(&old, &ZERO);
                if old.min_ps == t.sum.min_ps || old.max_ps == t.sum.max_ps {
                    extremes.push(class);
                }
            }
        }
        // The fresh records, merged in order (every other record of `live`
        // is kept already).
        let n = live.iter().filter(|w| w.fresh.is_some()).count();
        let fresh = live.into_iter().filter_map(|w| {
            let (extra, mut rows) = w.fresh?;
            if !rows.refs.is_sorted_by_key(|r| r.class) {
                rows.refs.sort_unstable_by_key(|r| r.class);
            }
            Some((
                w.record,
                KeptRecord {
                    version: w.version,
                    extra,
                    rows,
                    garbage: 0,
                },
            ))
        });
        if n > 0 {
            let old = std::mem::take(&mut self.records);
            self.records = Vec::with_capacity(old.len() + n);
            let mut old = old.into_iter().peekable();
            for f in fresh {
                while let Some(e) = old.next_if(|(r, _)| *r < f.0) {
                    self.records.push(e);
                }
                self.records.push(f);
            }
            self.records.extend(old);
        }
        self.recompute(extremes);
    }

    /// Adds `delta` to the sums: what the rows the parts of a walk that
    /// must be retried put in place changed in them (the commit of a walk
    /// that holds does it itself).
    pub fn settle(&mut self, delta: Delta) {
        let extremes = self.add(delta);
        self.recompute(extremes);
    }

    /// Adds `delta`'s sums to the totals; returns the classes whose MIN or
    /// MAX must be recomputed.
    fn add(&mut self, delta: Delta) -> Vec<u32> {
        for (c, d) in delta.sums.iter().enumerate() {
            if !delta.touched[c] {
                continue;
            }
            let rows = delta.rows[c];
            let t = self.total(c);
            t.rows = t.rows.saturating_add_signed(rows);
            if t.rows == 0 {
                t.sum = Summary::default();
                continue;
            }
            t.sum.replace_part(&ZERO, d);
            t.sum.min_ps = t.sum.min_ps.min(d.min_ps);
            t.sum.max_ps = t.sum.max_ps.max(d.max_ps);
        }
        delta.extremes
    }

    /// Recomputes the MIN and MAX of `classes` from the kept rows.
    fn recompute(&mut self, mut classes: Vec<u32>) {
        classes.sort_unstable();
        classes.dedup();
        for class in classes {
            let (mut lo, mut hi) = (u64::MAX, 0);
            for k in self.values() {
                if let Some(s) = k.get(class) {
                    lo = lo.min(s.min_ps);
                    hi = hi.max(s.max_ps);
                }
            }
            let t = self.total(class as usize);
            t.sum.min_ps = lo;
            t.sum.max_ps = hi;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait row of `n` events of `ps` picoseconds each.
    fn row(n: u64, ps: u64) -> Summary {
        let mut s = Summary {
            count: n,
            timed_count: n,
            sum_ps: u128::from(n * ps),
            min_ps: ps,
            max_ps: ps,
            ..Summary::default()
        };
        s.buckets[crate::layout::bucket_index(ps)] = n;
        s
    }

    /// The sum of `rows` by class, as a full read would give it.
    fn summed(rows: &[(u32, Summary)]) -> Vec<(u32, Summary)> {
        let mut by: std::collections::BTreeMap<u32, Summary> = Default::default();
        for (c, s) in rows {
            by.entry(*c)
                .and_modify(|t| {
                    t.merge(s);
                })
                .or_insert(*s);
        }
        by.into_iter().collect()
    }

    /// A cache keeping records 1 (classes 0 and 1) and 7 (class 0), and
    /// their rows.
    fn two_records() -> (RowCache<()>, Vec<(u32, Summary)>) {
        let mut cache = RowCache::default();
        let mut fresh = Delta::default();
        let mut live = Vec::new();
        let mut all = Vec::new();
        for (record, rows) in [
            (1, vec![(0, row(2, 5_000)), (1, row(1, 9_000))]),
            (7, vec![(0, row(3, 7_000))]),
        ] {
            let mut kept = Rows::default();
            for (c, s) in rows {
                fresh.row(c, None, &s);
                kept.push(c, 2, &s);
                all.push((c, s));
            }
            live.push(Walked {
                record,
                version: 10,
                fresh: Some(((), kept)),
            });
        }
        cache.commit(live, fresh);
        assert_eq!(cache.totals(), summed(&all));
        (cache, all)
    }

    /// Record 1's class 0 grown to `new` and its class 2 new, put in place
    /// by one part of a walk; returns what they change in the sums.
    fn walk_changes_record_1(cache: &mut RowCache<()>, new: &Summary, added: &Summary) -> Delta {
        let mut parts = cache.split(&[0, 4]);
        let part = &mut parts[0];
        part.seek(1);
        let kept = part.kept(1, 10).expect("kept");
        let mut delta = Delta::default();
        let mut changes = Changes::default();
        let old = kept.get(0);
        delta.row(0, old.as_ref(), new);
        changes.push(0, 4, new, 0);
        delta.row(2, None, added);
        changes.push(2, 2, added, NOT_KEPT);
        assert!(part.apply(1, 10, &changes, None));
        assert!(
            !parts[1].apply(1, 10, &changes, None),
            "record 1 is not in the second part"
        );
        delta
    }

    #[test]
    fn a_folded_records_changes_put_in_place_leave_with_it() {
        let (mut cache, all) = two_records();
        let delta = walk_changes_record_1(&mut cache, &row(4, 1_000), &row(1, 50_000));
        // The fold log then shows record 1 folded: only record 7 lives.
        let live = vec![Walked {
            record: 7,
            version: 10,
            fresh: None,
        }];
        cache.commit(live, delta);
        assert_eq!(cache.len(), 1);
        let left: Vec<_> = all[2..].to_vec();
        assert_eq!(
            cache.totals(),
            summed(&left),
            "record 7's rows alone, MIN and MAX too"
        );
    }

    #[test]
    fn a_retried_walks_puts_are_settled_into_the_sums() {
        let (mut cache, mut all) = two_records();
        let (new, added) = (row(4, 1_000), row(1, 50_000));
        let delta = walk_changes_record_1(&mut cache, &new, &added);
        // The walk must be retried: its puts stay, the sums take them.
        cache.settle(delta);
        all[0] = (0, new);
        all.push((2, added));
        assert_eq!(cache.totals(), summed(&all));
        // The retry finds both records live, nothing changed.
        let live = [1, 7].map(|record| Walked::<()> {
            record,
            version: 10,
            fresh: None,
        });
        cache.commit(live.into(), Delta::default());
        assert_eq!(cache.totals(), summed(&all));
        assert_eq!(cache.kept(1, 10).and_then(|k| k.get(2)), Some(added));
    }

    #[test]
    fn compact_rows_round_trip() {
        let mut s = Summary {
            count: 3,
            timed_count: 2,
            sum_ps: (7u128 << 64) | 12_345,
            min_ps: 5,
            max_ps: u64::MAX - 1,
            bytes: 1 << 40,
            ..Summary::default()
        };
        s.buckets[0] = 1;
        s.buckets[HISTOGRAM_BUCKETS - 1] = u64::MAX;
        s.statement.cancelled = 9;
        let mut rows = Rows::default();
        rows.push(4, 10, &s);
        rows.push(2, 12, &Summary::default());
        let got: Vec<_> = rows.values().collect();
        assert_eq!(got, [(4, s), (2, Summary::default())]);
        // A wait row of two events: a few bytes, not 368.
        let mut w = Summary {
            count: 2,
            timed_count: 2,
            sum_ps: 9_000,
            min_ps: 4_000,
            max_ps: 5_000,
            ..Summary::default()
        };
        w.buckets[crate::layout::bucket_index(4_000)] += 1;
        w.buckets[crate::layout::bucket_index(5_000)] += 1;
        let mut one = Rows::default();
        one.push(0, 0, &w);
        assert!(one.data.len() <= 16, "{} bytes", one.data.len());
        assert_eq!(one.values().next(), Some((0, w)));
        // Buckets outside MIN..MAX (not a loaded row's): kept all the same.
        w.buckets[HISTOGRAM_BUCKETS - 2] = 7;
        let mut odd = Rows::default();
        odd.push(0, 0, &w);
        assert_eq!(odd.values().next(), Some((0, w)));
    }

    #[test]
    fn varints_are_leb128_at_every_length_boundary() {
        let reference = |mut v: u64| {
            let mut out = Vec::new();
            while v >= 0x80 {
                out.push(v as u8 | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
            out
        };
        let mut values = vec![0, 1, u64::MAX];
        for k in 1..=9 {
            let b = 1u64 << (7 * k);
            values.extend([b - 1, b, b + 1]);
        }
        for v in values {
            let mut c = Compact::new();
            c.byte(0xAA);
            c.varint(v);
            assert_eq!(&c.as_slice()[1..], reference(v), "{v:#x}");
            assert_eq!(take_varint(&c.as_slice()[1..]), (v, &[][..]), "{v:#x}");
        }
    }

    #[test]
    fn compact_rows_round_trip_every_magnitude() {
        // Words of every byte length, zero or not, in every position; each
        // row decoded both inside the buffer and as its last bytes.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = x >> (x % 65).min(63);
            if x.is_multiple_of(3) { 0 } else { v }
        };
        let mut rows = Rows::default();
        let mut want = Vec::new();
        for class in 0..2000u32 {
            let mut s = Summary {
                count: next(),
                timed_count: next(),
                sum_ps: u128::from(next()) | (u128::from(next()) << 64),
                min_ps: next(),
                max_ps: next(),
                bytes: next(),
                ..Summary::default()
            };
            s.buckets = std::array::from_fn(|_| next());
            let st = &mut s.statement;
            (st.errors, st.warnings, st.rows_affected) = (next(), next(), next());
            (st.rows_sent, st.rows_examined) = (next(), next());
            (st.cpu_time_ps, st.cancelled) = (next(), next());
            if class % 2 == 0 {
                // A file class's figures by mode, on half the rows.
                s.io = IoFigures::from_words(std::array::from_fn(|_| next()));
            }
            let mut alone = Rows::default();
            alone.push(class, 0, &s);
            assert_eq!(alone.values().next(), Some((class, s)));
            rows.push(class, 0, &s);
            want.push((class, s));
        }
        assert_eq!(rows.values().collect::<Vec<_>>(), want);
    }
}
