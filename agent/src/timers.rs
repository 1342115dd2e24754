//! Layer 1: `performance_timers`, each timer's frequency, resolution and overhead,
//! measured whenever the table is read, on the machine the agent (and its
//! sidecar neighbours) run on.
//!
//! * frequency: ticks per second; CYCLE is measured against the monotonic
//!   clock over 20 ms, the others are nanosecond clocks by construction;
//! * resolution: the smallest non-zero step between two consecutive reads
//!   (in ticks), over many reads; MICROSECOND and MILLISECOND, which are
//!   NANOSECOND divided, take NANOSECOND's measured step in their own
//!   unit (at least 1), rather than waiting for a millisecond to pass:
//!   a read descheduled across a tick would report 2;
//! * overhead: the cost of one read, in CYCLE ticks: the least, over
//!   repeated batches of 16 reads, of a batch's cost over 16 (one read
//!   alone between two cycle reads is not ordered against them). NANOSECOND, MICROSECOND and MILLISECOND are read the way the
//!   client reads them: the cycle counter scaled to nanoseconds.
//!
//! A timer the platform lacks shows NULLs.

use std::time::{Duration, Instant};

use pfs_shm_layout::clock::coarse_ns;
use pfs_shm_layout::layout::TimerId;

/// One `performance_timers` row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimerRow {
    /// The timer.
    pub timer: TimerId,
    /// `TIMER_FREQUENCY`.
    pub frequency: Option<u64>,
    /// `TIMER_RESOLUTION`.
    pub resolution: Option<u64>,
    /// `TIMER_OVERHEAD` (cycles).
    pub overhead: Option<u64>,
}

fn clock() -> &'static quanta::Clock {
    static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// The cycle counter as the client reads it (`quanta`: the TSC, or the
/// monotonic clock where no invariant TSC exists).
fn cycles() -> Option<u64> {
    Some(clock().raw())
}

/// Nanoseconds as the client reads them: the cycle counter scaled by its
/// calibration (one multiply; `CLOCK_MONOTONIC` itself where no invariant
/// TSC exists).
fn nanos() -> u64 {
    let c = clock();
    c.delta_as_nanos(0, c.raw())
}

fn read(t: TimerId) -> Option<u64> {
    Some(match t {
        TimerId::Cycle => cycles()?,
        TimerId::Nanosecond => nanos(),
        TimerId::Microsecond => nanos() / 1000,
        TimerId::Millisecond => nanos() / 1_000_000,
        TimerId::Tick => coarse_ns(),
    })
}

/// CYCLE ticks per second, measured against `CLOCK_MONOTONIC` over `span`.
pub fn cycle_frequency(span: Duration) -> Option<u64> {
    let (c0, t0) = (cycles()?, Instant::now());
    while t0.elapsed() < span {
        std::hint::spin_loop();
    }
    let (c1, el) = (cycles()?, t0.elapsed());
    Some(((c1 - c0) as f64 / el.as_secs_f64()) as u64)
}

/// The last measurement, refreshed at most once a minute (for metrics;
/// the `performance_timers` table measures afresh on every read).
pub fn cached() -> Vec<TimerRow> {
    static CACHE: std::sync::Mutex<Option<(Instant, Vec<TimerRow>)>> = std::sync::Mutex::new(None);
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    match &*c {
        Some((at, rows)) if at.elapsed() < Duration::from_secs(60) => rows.clone(),
        _ => {
            let rows = measure();
            *c = Some((Instant::now(), rows.clone()));
            rows
        }
    }
}

/// Reads timed together for an overhead: the cost of one is the batch's
/// over its size.
const OVERHEAD_BATCH: usize = 16;

/// Measures every timer.
pub fn measure() -> Vec<TimerRow> {
    let cycle_hz = cycle_frequency(Duration::from_millis(20));
    let mut nano_resolution = None;
    TimerId::ALL
        .into_iter()
        .map(|t| {
            if read(t).is_none() {
                return TimerRow {
                    timer: t,
                    frequency: None,
                    resolution: None,
                    overhead: None,
                };
            }
            let frequency = match t {
                TimerId::Cycle => cycle_hz,
                TimerId::Nanosecond | TimerId::Tick => Some(1_000_000_000),
                TimerId::Microsecond => Some(1_000_000),
                TimerId::Millisecond => Some(1_000),
            };
            // NANOSECOND's step in this timer's unit, for the timers that
            // divide it (`TimerId::ALL` lists NANOSECOND before them): a
            // step of r ns shows as steps of r / unit or one more, so the
            // smallest is r / unit (at least 1).
            let derived = match t {
                TimerId::Microsecond => Some(1_000),
                TimerId::Millisecond => Some(1_000_000),
                _ => None,
            }
            .and_then(|per_tick: u64| nano_resolution.map(|r: u64| (r / per_tick).max(1)));
            let mut resolution = derived.unwrap_or(u64::MAX);
            let mut overhead = u64::MAX;
            let deadline = Instant::now() + Duration::from_millis(1);
            let mut prev = read(t).unwrap_or(0);
            let mut n = 0u32;
            while (n < 1000 || resolution == u64::MAX)
                && Instant::now() < deadline + Duration::from_millis(20)
            {
                // A batch of reads between two cycle reads: one read alone
                // is not ordered against them (the CPU runs the second
                // cycle read before a cheap read's loads are done: TICK
                // measured 1 cycle), a batch's cost is.
                let mut batch = [0u64; OVERHEAD_BATCH];
                let c0 = cycles().unwrap_or(0);
                for v in &mut batch {
                    *v = std::hint::black_box(read(t).unwrap_or(0));
                }
                let c1 = cycles().unwrap_or(0);
                overhead = overhead.min(c1.saturating_sub(c0).div_ceil(OVERHEAD_BATCH as u64));
                for v in batch {
                    if v > prev && derived.is_none() {
                        resolution = resolution.min(v - prev);
                    }
                    prev = v;
                }
                n += OVERHEAD_BATCH as u32;
                if n >= 1000 && Instant::now() >= deadline && resolution != u64::MAX {
                    break;
                }
            }
            let resolution = (resolution != u64::MAX).then_some(resolution);
            if t == TimerId::Nanosecond {
                nano_resolution = resolution;
            }
            TimerRow {
                timer: t,
                frequency,
                resolution,
                overhead: (overhead != u64::MAX).then_some(overhead),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CYCLE frequency agrees with a measurement against the monotonic
    /// clock over a longer window (within 5%).
    #[test]
    fn performance_timers_are_plausible() {
        let rows = measure();
        assert_eq!(rows.len(), 5);
        let cycle = rows[0];
        if let (Some(f), Some(reference)) =
            (cycle.frequency, cycle_frequency(Duration::from_millis(200)))
        {
            let ratio = f as f64 / reference as f64;
            assert!(
                (0.95..=1.05).contains(&ratio),
                "CYCLE {f} Hz vs {reference} Hz"
            );
            assert!(
                cycle.overhead.is_some_and(|o| o > 0 && o < 10_000),
                "{cycle:?}"
            );
        }
        let nano = rows[1];
        assert_eq!(nano.frequency, Some(1_000_000_000));
        assert!(nano.resolution.is_some_and(|r| r < 1_000_000), "{nano:?}");
        for (row, unit) in [(rows[2], 1_000), (rows[3], 1_000_000)] {
            let want = nano.resolution.map(|r| (r / unit).max(1));
            assert_eq!(row.resolution, want, "{row:?} from {nano:?}");
        }
        assert_eq!(rows[3].resolution, Some(1), "{:?}", rows[3]);
    }
}
