//! Reading the CPU's time-stamp counter: the CYCLE timer of the writer's
//! hot path. One of the four modules allowed to use `unsafe` (see the
//! crate docs): the counter is read through an intrinsic.
//!
//! Layer 0 (see the crate docs): depends on no other module of the crate.

/// Reads the CPU's time-stamp counter with `RDTSC`, inlined into the
/// caller: the CYCLE timer of the writer's hot path (two of these bound the
/// cost of a timed event). Meaningful only where the TSC is invariant; the
/// client calls it only when its calibration chose the TSC.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_tsc() -> u64 {
    // SAFETY: `_rdtsc` is `unsafe` only because it is an intrinsic; it has
    // no precondition to uphold. RDTSC is part of the x86-64 baseline
    // instruction set (no CPU feature to detect), takes no operands,
    // writes only EDX:EAX and touches no memory, so it cannot break any
    // Rust invariant. (A process that asked the kernel to trap it with
    // `prctl(PR_SET_TSC)` gets SIGSEGV, a defined outcome, exactly as with
    // `quanta`, which the client uses otherwise.)
    unsafe { core::arch::x86_64::_rdtsc() }
}
