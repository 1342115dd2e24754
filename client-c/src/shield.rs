//! Layer 0. The boundary's panic shield: every `extern "C"` entry point
//! runs its body through [`shield`], so a panic inside the client (a bug)
//! becomes the call's no-op value instead of an abort of the C program.
//! Costs nothing when nothing panics (unwinding tables only).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`; if it panics, returns `otherwise`. A panic here is a client
/// bug; at the boundary what matters is that it neither unwinds into C
/// (undefined behaviour) nor aborts the host program. Unwind safety is
/// asserted: the worst a half-done call leaves is one event or one
/// counter wrong, which the reader's sequence checks already tolerate.
#[inline(always)]
pub(crate) fn shield<R>(otherwise: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(otherwise)
}

#[cfg(test)]
mod tests {
    use super::shield;

    #[test]
    fn a_panic_becomes_the_fallback() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = shield(-1, || -> i32 { panic!("boom") });
        std::panic::set_hook(prev);
        assert_eq!(r, -1);
        assert_eq!(shield(-1, || 7), 7);
    }
}
