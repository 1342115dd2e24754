//! The CYCLE timer: the TSC through `quanta` (or the monotonic clock where
//! no invariant TSC exists), converted to picoseconds by one 128-bit
//! integer multiply and a shift. Never a division on the hot path.

use std::sync::OnceLock;

use pfs_shm_layout::TimerCalibration;

static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

/// The process-wide clock (calibrated once, on first use).
#[inline(always)]
pub(crate) fn clock() -> &'static quanta::Clock {
    CLOCK.get_or_init(quanta::Clock::new)
}

/// Reads the raw timer.
#[inline(always)]
pub(crate) fn now_ticks() -> u64 {
    clock().raw()
}

/// Derives the segment's calibration from quanta's: the nanoseconds quanta
/// reports for 2^40 ticks give picoseconds per tick in 32.32 fixed point.
pub(crate) fn calibration() -> TimerCalibration {
    let c = clock();
    let base = c.raw();
    const SPAN: u64 = 1 << 40;
    let ns = c.delta_as_nanos(0, SPAN);
    // ps per tick (q32) = ns * 1000 * 2^32 / 2^40 = ns * 1000 / 2^8
    let q32 = ((u128::from(ns) * 1000) >> 8) as u64;
    let frequency_hz = if ns == 0 {
        0
    } else {
        (u128::from(SPAN) * 1_000_000_000 / u128::from(ns)) as u64
    };
    // quanta scales raw values 1:1 when it falls back to the monotonic clock.
    let kind = if ns == SPAN { 2 } else { 1 };
    TimerCalibration {
        kind,
        base_ticks: base,
        ps_per_tick_q32: q32.max(1),
        frequency_hz,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_matches_wall_clock() {
        let cal = calibration();
        let t0 = now_ticks();
        let w0 = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t1 = now_ticks();
        let wall = w0.elapsed().as_nanos() as f64 * 1000.0;
        let ps = cal.ticks_to_ps(t1 - t0) as f64;
        assert!(
            (ps / wall - 1.0).abs() < 0.05,
            "timer ps {ps} vs wall ps {wall}"
        );
    }
}
