//! Layer 2. How a segment's raw timer ticks become the tables'
//! picoseconds ([`TimerCalibration`], stored in the header at creation):
//! the CYCLE timer's source and scale, and the base of the NANOSECOND
//! timers, on one time line.
//!
//! Builds on [`crate::layout`] (timer ids and sources), [`crate::clock`]
//! and [`crate::tsc`] (a reader's "now").

use crate::layout::TimerSource;

/// How raw timer ticks convert to picoseconds; stored in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerCalibration {
    /// What the CYCLE timer reads. A segment that stores an unknown source
    /// opens as [`TimerSource::Monotonic`]: only a TSC is read as one.
    pub kind: TimerSource,
    /// Tick value that maps to `TIMER_START` 0.
    pub base_ticks: u64,
    /// Picoseconds per tick, 32.32 fixed point.
    pub ps_per_tick_q32: u64,
    /// Ticks per second.
    pub frequency_hz: u64,
    /// `CLOCK_MONOTONIC` ns at creation (base of the nanosecond timers).
    pub base_ns: u64,
}

impl TimerCalibration {
    /// A nanosecond clock starting at 0 (one tick is one nanosecond, 1 GHz,
    /// kind NANOSECOND): for tests and tools that write segments with
    /// made-up tick values.
    ///
    /// ```
    /// use pfs_shm_layout::TimerCalibration;
    /// assert_eq!(TimerCalibration::NANOSECONDS.ticks_to_ps(3), 3_000);
    /// ```
    pub const NANOSECONDS: Self = Self {
        kind: TimerSource::Monotonic,
        base_ticks: 0,
        ps_per_tick_q32: 1000 << 32,
        frequency_hz: 1_000_000_000,
        base_ns: 0,
    };

    /// Converts a tick count difference to picoseconds (128-bit multiply,
    /// saturating at `u64::MAX`: 213 days for a single duration).
    #[inline(always)]
    pub fn ticks_to_ps(&self, ticks: u64) -> u64 {
        let ps = (u128::from(ticks) * u128::from(self.ps_per_tick_q32)) >> 32;
        if ps > u128::from(u64::MAX) {
            u64::MAX
        } else {
            ps as u64
        }
    }

    /// Converts an absolute CYCLE tick value to picoseconds since
    /// `base_ticks`, without wrapping (128-bit result).
    pub fn since_base_ps(&self, ticks: u64) -> u128 {
        (u128::from(ticks.saturating_sub(self.base_ticks)) * u128::from(self.ps_per_tick_q32)) >> 32
    }

    /// The segment's time line now, in picoseconds since its base, as a
    /// reader on the same host reads it: the TSC through the calibration
    /// when the segment's CYCLE timer is the TSC, else `CLOCK_MONOTONIC`
    /// (every timer's timestamps lie on this line). PFS's `TIMER_END` of
    /// an event still running.
    pub fn now_ps(&self) -> u128 {
        #[cfg(target_arch = "x86_64")]
        if self.kind == TimerSource::Tsc {
            return self.since_base_ps(crate::tsc::read_tsc());
        }
        let ns = crate::clock::monotonic_ns();
        u128::from(ns.saturating_sub(self.base_ns)) * u128::from(crate::clock::PS_PER_NS)
    }

    /// Converts a timestamp taken with `timer` to picoseconds since the
    /// segment's creation: CYCLE ticks through the calibration, the other
    /// timers' nanoseconds by multiplying by 1000.
    pub fn timestamp_ps(&self, timer: crate::layout::TimerId, ticks: u64) -> u128 {
        match timer {
            crate::layout::TimerId::Cycle => self.since_base_ps(ticks),
            _ => {
                u128::from(ticks.saturating_sub(self.base_ns)) * u128::from(crate::clock::PS_PER_NS)
            }
        }
    }
}
