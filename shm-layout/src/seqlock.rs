//! Sequence locks over shared memory: one writer, any number of readers, and
//! a reader never blocks the writer.
//!
//! Layer 0 (see the crate docs): depends on no other module of the crate.
//!
//! # Protocol
//!
//! Every field a sequence lock guards is an atomic, accessed with `Relaxed`
//! ordering. The sequence word is a 64-bit counter: even means "stable", odd
//! means "a write is in progress". 64 bits never wrap in practice.
//!
//! Writer (exactly one at a time, guaranteed by the caller):
//!
//! ```text
//! s = seq.load(Relaxed)          // we are the only writer
//! seq.store(s + 1, Relaxed)      // odd: write in progress
//! fence(Release)                 // orders the odd store before the field stores
//! field.store(.., Relaxed) ...
//! seq.store(s + 2, Release)      // even again: publishes the fields
//! ```
//!
//! Reader:
//!
//! ```text
//! s1 = seq.load(Acquire)
//! v  = field.load(Relaxed) ...
//! fence(Acquire)                 // orders the field loads before the re-check
//! s2 = seq.load(Relaxed)
//! accept iff s1 == s2 && s1 is even
//! ```
//!
//! This is the formulation Boehm shows correct under the C++/Rust memory
//! model ("Can seqlocks get along with programming language memory
//! models?", 2012): because every guarded access is atomic there is no data
//! race, and the fences make a torn read always visible as `s1 != s2`.
//!
//! On x86-64 both fences compile to nothing but a compiler barrier, and every
//! store is a plain `mov`: the writer never executes a `lock`-prefixed
//! instruction.
//!
//! # Example
//!
//! ```
//! use pfs_shm_layout::seqlock::SeqLock;
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//!
//! let lock = SeqLock::new();
//! let (a, b) = (AtomicU64::new(0), AtomicU64::new(0));
//! {
//!     let _w = lock.write(); // single writer
//!     a.store(7, Relaxed);
//!     b.store(7, Relaxed);
//! } // guard drop publishes
//! let read = lock.read(16, || (a.load(Relaxed), b.load(Relaxed)));
//! assert_eq!(read.value, Some((7, 7)));
//! ```

use std::sync::atomic::{AtomicU64, Ordering, fence};

/// A sequence lock word. `#[repr(transparent)]` over an [`AtomicU64`], so it
/// can live inside a shared-memory record.
#[repr(transparent)]
#[derive(Debug, Default)]
pub struct SeqLock {
    seq: AtomicU64,
}

/// The outcome of a bounded read: the value if a consistent copy was taken,
/// and how many attempts were rejected because a write overlapped them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRead<T> {
    /// `Some` if a consistent copy was taken within the retry budget.
    pub value: Option<T>,
    /// Attempts rejected (torn) before success or giving up.
    pub retries: u32,
}

impl SeqLock {
    /// A fresh, even (stable) sequence lock.
    pub const fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
        }
    }

    /// Starts a write. The caller must be the only writer of the data this
    /// lock guards; the returned guard publishes the write when dropped.
    ///
    /// The start is a load and a store of the word; the guard keeps the
    /// odd value it stored, and the end is a store of the next one (the
    /// sole writer knows the word): one load and two plain stores, where
    /// reading the word back at the end made two dependent
    /// read-modify-writes, a chain that back-to-back writes of one row
    /// wait on.
    #[inline(always)]
    pub fn write(&self) -> SeqWriteGuard<'_> {
        let odd = self.seq.load(Ordering::Relaxed).wrapping_add(1);
        self.seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        SeqWriteGuard { lock: self, odd }
    }

    /// Reads with at most `attempts` tries. `f` must only perform `Relaxed`
    /// loads of the guarded atomics; its result is discarded unless the
    /// sequence word shows no write overlapped it.
    #[inline]
    pub fn read<T>(&self, attempts: u32, f: impl FnMut() -> T) -> SeqRead<T> {
        let r = self.read_versioned(attempts, f);
        SeqRead {
            value: r.value.map(|(_, v)| v),
            retries: r.retries,
        }
    }

    /// Like [`SeqLock::read`], also returning the (even) sequence value the
    /// accepted copy was taken at.
    #[inline]
    pub fn read_versioned<T>(&self, attempts: u32, mut f: impl FnMut() -> T) -> SeqRead<(u64, T)> {
        let mut retries = 0;
        for _ in 0..attempts.max(1) {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let value = f();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return SeqRead {
                        value: Some((s1, value)),
                        retries,
                    };
                }
            }
            retries += 1;
            std::hint::spin_loop();
        }
        SeqRead {
            value: None,
            retries,
        }
    }

    /// Multi-writer claim for `history_long` slots: succeeds only if the
    /// sequence is even and smaller than `publish` (the slot holds an older
    /// write), moving it to odd with a compare-exchange. The guard stores
    /// `publish` (even) with `Release` when dropped.
    #[inline]
    pub fn try_claim(&self, publish: u64) -> Option<SeqClaimGuard<'_>> {
        debug_assert!(publish & 1 == 0);
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 != 0 || s >= publish {
            return None;
        }
        self.seq
            .compare_exchange(s, s | 1, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        fence(Ordering::Release);
        Some(SeqClaimGuard {
            lock: self,
            publish,
        })
    }

    /// The raw sequence value (even when stable). Used by tests and by
    /// readers that want to detect any write since an earlier observation.
    pub fn sequence(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
}

/// RAII write guard: the sequence is odd while it lives and becomes even,
/// with `Release` ordering, when it is dropped.
#[must_use = "dropping the guard immediately publishes an empty write"]
#[derive(Debug)]
pub struct SeqWriteGuard<'a> {
    lock: &'a SeqLock,
    /// The odd value stored by [`SeqLock::write`].
    odd: u64,
}

impl Drop for SeqWriteGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock
            .seq
            .store(self.odd.wrapping_add(1), Ordering::Release);
    }
}

/// Guard of [`SeqLock::try_claim`]: publishes its value when dropped.
#[must_use = "dropping the guard immediately publishes an empty write"]
#[derive(Debug)]
pub struct SeqClaimGuard<'a> {
    lock: &'a SeqLock,
    publish: u64,
}

impl Drop for SeqClaimGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock.seq.store(self.publish, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn write_makes_sequence_even_and_advanced() {
        let l = SeqLock::new();
        assert_eq!(l.sequence(), 0);
        {
            let _g = l.write();
            assert_eq!(l.sequence() & 1, 1, "odd while a write is open");
            let r = l.read(3, || ());
            assert_eq!(r.value, None, "no read succeeds during a write");
            assert_eq!(r.retries, 3);
        }
        assert_eq!(l.sequence(), 2);
    }

    #[test]
    fn concurrent_readers_never_accept_torn_values() {
        struct Shared {
            lock: SeqLock,
            words: [AtomicU64; 8],
        }
        let s = Arc::new(Shared {
            lock: SeqLock::new(),
            words: Default::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    n += 1;
                    let _g = s.lock.write();
                    for w in &s.words {
                        w.store(n, Relaxed);
                    }
                }
            })
        };
        let (mut accepted, mut rejected) = (0u64, 0u64);
        for _ in 0..200_000 {
            let r = s.lock.read(64, || {
                let mut v = [0u64; 8];
                for (d, w) in v.iter_mut().zip(&s.words) {
                    *d = w.load(Relaxed);
                }
                v
            });
            rejected += u64::from(r.retries);
            if let Some(v) = r.value {
                accepted += 1;
                assert!(v.iter().all(|&x| x == v[0]), "torn read accepted: {v:?}");
            }
        }
        stop.store(true, Relaxed);
        writer.join().unwrap();
        assert!(accepted > 0, "reader never succeeded ({rejected} rejected)");
    }
}
