//! Layer 0. The host's clocks as every timer reads them: the monotonic
//! clock (the time line of every segment's NANOSECOND, MICROSECOND and
//! MILLISECOND timers, and of CYCLE where no invariant TSC exists) and its
//! coarse variant (TICK), in nanoseconds. Writers, the agent and readers
//! share these readings (the TSC is in the `tsc` module).

use rustix::time::{ClockId, clock_gettime};

/// Picoseconds per nanosecond: timestamps in nanoseconds become the
/// tables' picoseconds.
pub const PS_PER_NS: u64 = 1000;

fn ns(id: ClockId) -> u64 {
    let t = clock_gettime(id);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `CLOCK_MONOTONIC`, in nanoseconds.
///
/// ```
/// let (a, b) = (pfs_shm_layout::clock::monotonic_ns(), pfs_shm_layout::clock::monotonic_ns());
/// assert!(b >= a);
/// ```
#[inline]
pub fn monotonic_ns() -> u64 {
    ns(ClockId::Monotonic)
}

/// `CLOCK_MONOTONIC_COARSE` (the TICK timer), in nanoseconds.
#[inline]
pub fn coarse_ns() -> u64 {
    ns(ClockId::MonotonicCoarse)
}
