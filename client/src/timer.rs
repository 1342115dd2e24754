//! Layer 0. Timers. CYCLE is the TSC through `quanta` (or the monotonic
//! clock where no invariant TSC exists), converted to picoseconds by one
//! 128-bit multiply and a shift. NANOSECOND, MICROSECOND and MILLISECOND
//! store nanoseconds on the `CLOCK_MONOTONIC` scale of the segment's
//! creation: on an invariant TSC they are the same `RDTSC` scaled by the
//! segment's calibration (`timer_base_ns` + ticks since `timer_base_ticks`
//! in ns: a multiply and a shift, where a vDSO `clock_gettime` took about
//! 25 ns here),
//! elsewhere `CLOCK_MONOTONIC` read through the vDSO; MICROSECOND and
//! MILLISECOND truncate by multiplication-based constant division. TICK
//! reads `CLOCK_MONOTONIC_COARSE`. Never a runtime division on the hot
//! path.
//!
//! The TSC-derived nanoseconds follow the TSC, not the kernel's NTP-slewed
//! clock: durations agree with `CLOCK_MONOTONIC` to the calibration's
//! accuracy (measured 1.8 ppm over 2 s on the development machine), and
//! every timer's `TIMER_START` lies on one time line (the CYCLE one).

use std::sync::OnceLock;

use pfs_shm_layout::TimerCalibration;
use pfs_shm_layout::clock::{PS_PER_NS, coarse_ns, monotonic_ns};
use pfs_shm_layout::layout::{TimerId, TimerSource};

static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

/// The process-wide clock (calibrated once, on first use).
#[inline(always)]
pub(crate) fn quanta_clock() -> &'static quanta::Clock {
    CLOCK.get_or_init(quanta::Clock::new)
}

/// The segment's timer calibration with what the hot path derives from
/// it, computed once: what the timers read through.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    cal: TimerCalibration,
    /// Nanoseconds per TSC tick, 24.40 fixed point (see [`ns_at`]).
    ns_per_tick_q40: u64,
}

impl Clock {
    /// The clock of a segment calibrated with `cal`.
    pub(crate) fn new(cal: TimerCalibration) -> Self {
        // A tick is under 1 µs, so the shift cannot overflow; the division
        // is done here, once, not at each reading.
        let ns_per_tick_q40 = (cal.ps_per_tick_q32.min(1 << 55) << 8) / 1000;
        Self {
            cal,
            ns_per_tick_q40,
        }
    }
}

/// Reads timer `timer` (a [`TimerId`] as `u32`, as the setup word holds
/// it; an unknown value reads CYCLE). CYCLE on an invariant TSC is one
/// inlined `RDTSC`, NANOSECOND the same and a multiply; the other timers
/// are out of line.
#[inline(always)]
pub(crate) fn now(clock: &Clock, timer: u32) -> u64 {
    // Inlined, the unused CYCLE reading costs nothing.
    now_and_cycles(clock, timer).0
}

/// [`now`], and the CYCLE reading it was derived from when it came from
/// the same `RDTSC` (CYCLE itself, or NANOSECOND on a TSC): a caller that
/// also needs the CYCLE time (a task statement's poll time at its end)
/// reads the counter once.
#[inline(always)]
pub(crate) fn now_and_cycles(clock: &Clock, timer: u32) -> (u64, Option<u64>) {
    if timer == TimerId::Cycle as u32 {
        let c = cycle(clock);
        (c, Some(c))
    } else if timer == TimerId::Nanosecond as u32 && clock.cal.kind == TimerSource::Tsc {
        let c = cycle(clock);
        (ns_at(clock, c), Some(c))
    } else {
        (now_other(clock, timer), None)
    }
}

/// Nanoseconds on the segment's `CLOCK_MONOTONIC` scale from the TSC.
#[inline(always)]
fn tsc_ns(clock: &Clock) -> u64 {
    ns_at(clock, cycle(clock))
}

/// TSC reading `tsc` in nanoseconds on the segment's `CLOCK_MONOTONIC`
/// scale: `base_ns` + the ticks since `base_ticks`, in 24.40 fixed point
/// nanoseconds per tick (precise to 1e-11; no overflow for 584 years).
#[inline(always)]
fn ns_at(clock: &Clock, tsc: u64) -> u64 {
    let ticks = tsc.saturating_sub(clock.cal.base_ticks);
    clock.cal.base_ns + ((u128::from(ticks) * u128::from(clock.ns_per_tick_q40)) >> 40) as u64
}

#[inline(always)]
fn cycle(clock: &Clock) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if clock.cal.kind == TimerSource::Tsc {
        return pfs_shm_layout::writer::read_tsc();
    }
    let _ = clock;
    quanta_clock().raw()
}

#[inline(never)]
fn now_other(clock: &Clock, timer: u32) -> u64 {
    let mono_ns = || {
        if clock.cal.kind == TimerSource::Tsc {
            tsc_ns(clock)
        } else {
            monotonic_ns()
        }
    };
    match TimerId::from_u32(timer) {
        Some(TimerId::Nanosecond) => mono_ns(),
        Some(TimerId::Microsecond) => mono_ns() / 1000 * 1000,
        Some(TimerId::Millisecond) => mono_ns() / 1_000_000 * 1_000_000,
        Some(TimerId::Tick) => coarse_ns(),
        Some(TimerId::Cycle) | None => quanta_clock().raw(),
    }
}

/// The picoseconds from `start` to `end`, raw timestamps of `timer`: an
/// event's `TIMER_WAIT`. It is TIMER_END − TIMER_START as readers convert
/// each timestamp (a CYCLE one since the calibration's base, rounded down),
/// so that a row's times add up exactly, as in PFS, and an event nested in
/// another never outlasts it (converting the tick difference instead can
/// give 1 ps less).
#[inline(always)]
pub(crate) fn wait_ps(clock: &Clock, timer: u32, start: u64, end: u64) -> u64 {
    if timer == TimerId::Cycle as u32 || timer > TimerId::Tick as u32 {
        // With s, e the ticks since the base and k the ps per tick (32.32
        // fixed point): ⌊e·k⌋ − ⌊s·k⌋ = ⌊(e − s)·k + frac(s·k)⌋, and the
        // fraction's 32 bits are those of a 32-bit product: one wide
        // multiply, as for the tick difference alone.
        let c = &clock.cal;
        let s = start.saturating_sub(c.base_ticks);
        let e = end.saturating_sub(c.base_ticks);
        let k = c.ps_per_tick_q32;
        let frac = (s as u32).wrapping_mul(k as u32);
        let ps = (u128::from(e.saturating_sub(s)) * u128::from(k) + u128::from(frac)) >> 32;
        u64::try_from(ps).unwrap_or(u64::MAX)
    } else {
        end.saturating_sub(start).saturating_mul(1000)
    }
}

/// Converts a duration measured with `timer` to picoseconds.
#[inline(always)]
pub(crate) fn to_ps(clock: &Clock, timer: u32, ticks: u64) -> u64 {
    if timer == TimerId::Cycle as u32 || timer > TimerId::Tick as u32 {
        clock.cal.ticks_to_ps(ticks)
    } else {
        ticks.saturating_mul(1000)
    }
}

/// Derives the segment's calibration from quanta's: the nanoseconds quanta
/// reports for 2^40 ticks give picoseconds per tick in 32.32 fixed point.
pub(crate) fn calibration() -> TimerCalibration {
    let c = quanta_clock();
    let base = c.raw();
    let base_ns = monotonic_ns();
    const SPAN: u64 = 1 << 40;
    let ns = c.delta_as_nanos(0, SPAN);
    // ps per tick (q32) = ns * 1000 * 2^32 / 2^40 = ns * 1000 / 2^8
    let q32 = ((u128::from(ns) * u128::from(PS_PER_NS)) >> 8) as u64;
    let frequency_hz = if ns == 0 {
        0
    } else {
        (u128::from(SPAN) * 1_000_000_000 / u128::from(ns)) as u64
    };
    // quanta scales raw values 1:1 when it falls back to the monotonic clock.
    let kind = if ns == SPAN {
        TimerSource::Monotonic
    } else {
        TimerSource::Tsc
    };
    TimerCalibration {
        kind,
        base_ticks: base,
        ps_per_tick_q32: q32.max(1),
        frequency_hz,
        base_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_matches_wall_clock() {
        let cal = Clock::new(calibration());
        let now = |t: TimerId| now(&cal, t as u32);
        let t0 = now(TimerId::Cycle);
        let n0 = now(TimerId::Nanosecond);
        let w0 = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t1 = now(TimerId::Cycle);
        let n1 = now(TimerId::Nanosecond);
        let wall = w0.elapsed().as_nanos() as f64 * 1000.0;
        let ps = cal.cal.ticks_to_ps(t1 - t0) as f64;
        assert!(
            (ps / wall - 1.0).abs() < 0.05,
            "timer ps {ps} vs wall ps {wall}"
        );
        let nps = to_ps(&cal, TimerId::Nanosecond as u32, n1 - n0) as f64;
        assert!(
            (nps / wall - 1.0).abs() < 0.05,
            "ns timer {nps} vs wall {wall}"
        );
        assert_eq!(now(TimerId::Millisecond) % 1_000_000, 0);
        assert_eq!(now(TimerId::Microsecond) % 1000, 0);
    }

    #[test]
    fn tsc_nanoseconds_follow_the_monotonic_clock() {
        let cal = Clock::new(calibration());
        let mono = || monotonic_ns();
        let nano = || now(&cal, TimerId::Nanosecond as u32);
        // Same scale and origin as CLOCK_MONOTONIC at creation...
        let (m0, n0) = (mono(), nano());
        assert!(m0.abs_diff(n0) < 1_000_000, "mono {m0} vs ns {n0}");
        // ...never going back, and agreeing on durations.
        let mut last = n0;
        for _ in 0..10_000 {
            let n = nano();
            assert!(n >= last, "{n} < {last}");
            last = n;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (m1, n1) = (mono(), nano());
        let (dm, dn) = ((m1 - m0) as f64, (n1 - n0) as f64);
        assert!(
            (dn / dm - 1.0).abs() < 1e-3,
            "ns timer {dn} vs monotonic {dm}"
        );
        let micro = now(&cal, TimerId::Microsecond as u32);
        assert!(micro.is_multiple_of(1000) && micro.abs_diff(n1) < 1_000_000);
        // One reading, two scales: the nanoseconds derived from the CYCLE
        // reading returned beside them.
        let (n, c) = now_and_cycles(&cal, TimerId::Nanosecond as u32);
        assert_eq!(c.map(|c| ns_at(&cal, c)), Some(n));
        let (c1, c2) = now_and_cycles(&cal, TimerId::Cycle as u32);
        assert_eq!(Some(c1), c2);
    }

    #[test]
    fn inline_cycle_reads_quanta_scale() {
        // The inlined RDTSC and quanta's raw clock must be one counter:
        // the calibration converts both.
        let cal = Clock::new(calibration());
        for _ in 0..1000 {
            let a = now(&cal, TimerId::Cycle as u32);
            let q = quanta_clock().raw();
            let b = now(&cal, TimerId::Cycle as u32);
            assert!(a <= q && q <= b, "cycle {a} / quanta {q} / cycle {b}");
        }
        // Unknown timer values read CYCLE and convert like it.
        assert_eq!(to_ps(&cal, 7, 1 << 20), cal.cal.ticks_to_ps(1 << 20));
    }

    #[test]
    fn wait_is_end_minus_start_as_readers_convert_them() {
        // A calibration whose ps per tick is not an integer: converting
        // the tick difference rounds once, the two timestamps twice.
        let cal = Clock::new(TimerCalibration {
            ps_per_tick_q32: (1 << 32) / 3 * 1000 + 12_345,
            base_ticks: 1_000,
            ..calibration()
        });
        let c = &cal.cal;
        let mut differs = 0;
        for start in (1_000..1_300).step_by(7) {
            for len in [0, 1, 2, 3, 10, 1_000_003] {
                let end = start + len;
                let shown =
                    c.timestamp_ps(TimerId::Cycle, end) - c.timestamp_ps(TimerId::Cycle, start);
                let w = wait_ps(&cal, TimerId::Cycle as u32, start, end);
                assert_eq!(u128::from(w), shown, "start {start}, end {end}");
                differs +=
                    usize::from(u128::from(to_ps(&cal, TimerId::Cycle as u32, len)) != shown);
            }
        }
        assert!(differs > 0, "the case the test is for occurs");
        // Large and unordered timestamps, and ones before the base.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (start, end) = (
                x >> (x % 20),
                (x >> (x % 20)).wrapping_add(x % 5_000_000) ^ (x & 1),
            );
            let shown = c
                .timestamp_ps(TimerId::Cycle, end)
                .saturating_sub(c.timestamp_ps(TimerId::Cycle, start));
            let w = wait_ps(&cal, TimerId::Cycle as u32, start, end);
            assert_eq!(
                u128::from(w),
                shown.min(u128::from(u64::MAX)),
                "start {start}, end {end}"
            );
        }
        let ns = TimerId::Nanosecond as u32;
        assert_eq!(wait_ps(&cal, ns, 5, 12), 7_000);
        assert_eq!(wait_ps(&cal, ns, 12, 5), 0);
    }
}
