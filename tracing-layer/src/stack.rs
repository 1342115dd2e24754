//! Layer 0. The statement spans entered on this thread, innermost last: a
//! thread-local stack that tells which statement's context is current
//! here (what a stage span entered now nests in), and lets a span exited
//! out of order be swapped out without corrupting the contexts swapped in
//! after it. Entries are keyed by layer and span id: two layers (two
//! subscribers) number their spans independently.

use std::cell::RefCell;

/// One enter of a statement span on this thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    layer: u64,
    span: u64,
    /// Whether this enter swapped the span's context in (the first enter
    /// of the span on this thread, if the context was not entered on
    /// another thread at the time). Later enters of the same span are
    /// counted here only.
    swapped: bool,
}

thread_local! {
    static STACK: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}

/// What [`exit`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The span has no enter on this thread, or the enter being undone
    /// did not swap: nothing to swap out.
    Nothing,
    /// The enter that swapped the span in was the innermost: swap it out.
    Innermost,
    /// The enter that swapped it in is below the enters of these other
    /// spans of the same layer (innermost last), which swapped their
    /// contexts in after it: swap those out (innermost first), then this
    /// one, then those back in (outermost first).
    Below(Vec<u64>),
}

/// Whether the span has an enter on this thread.
#[inline]
pub(crate) fn contains(layer: u64, span: u64) -> bool {
    STACK.with(|s| {
        s.borrow()
            .iter()
            .any(|e| e.layer == layer && e.span == span)
    })
}

/// Records an enter of the span. If it is the span's first enter on this
/// thread, `swap_in` runs (it swaps the span's context in and says
/// whether it did); else the enter is only counted. Returns what
/// `swap_in` returned, false if it did not run.
#[inline]
pub(crate) fn enter(layer: u64, span: u64, swap_in: impl FnOnce() -> bool) -> bool {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        let again = s.iter().any(|e| e.layer == layer && e.span == span);
        let swapped = !again && swap_in();
        s.push(Entry {
            layer,
            span,
            swapped,
        });
        swapped
    })
}

/// The span of `layer` whose context is current on this thread: the
/// innermost enter that swapped a context in, if it is this layer's.
#[inline]
pub(crate) fn current(layer: u64) -> Option<u64> {
    STACK.with(|s| {
        s.borrow()
            .iter()
            .rev()
            .find(|e| e.swapped)
            .filter(|e| e.layer == layer)
            .map(|e| e.span)
    })
}

/// Undoes the innermost enter of the span on this thread.
#[inline]
pub(crate) fn exit(layer: u64, span: u64) -> Exit {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        let Some(i) = s.iter().rposition(|e| e.layer == layer && e.span == span) else {
            return Exit::Nothing;
        };
        let e = s.remove(i);
        if !e.swapped {
            Exit::Nothing
        } else if i == s.len() {
            Exit::Innermost
        } else {
            Exit::Below(
                s[i..]
                    .iter()
                    .filter(|e| e.swapped && e.layer == layer)
                    .map(|e| e.span)
                    .collect(),
            )
        }
    })
}

/// Removes every enter of the span on this thread (a span closed while
/// entered, which only the id-based subscriber API allows), reporting as
/// [`exit`] does for the one that swapped.
pub(crate) fn remove_all(layer: u64, span: u64) -> Exit {
    let mut found = Exit::Nothing;
    while contains(layer, span) {
        match exit(layer, span) {
            Exit::Nothing => {}
            e => found = e,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_duplicates_and_out_of_order_exits() {
        assert!(enter(1, 10, || true));
        assert!(enter(1, 11, || true));
        assert!(!enter(1, 10, || unreachable!())); // entered again: counted only
        assert_eq!(current(1), Some(11));
        assert_eq!(current(2), None);
        assert_eq!(exit(1, 10), Exit::Nothing);
        assert!(contains(1, 10));
        assert!(enter(2, 10, || true)); // another layer's span 10
        assert_eq!(current(1), None);
        assert_eq!(current(2), Some(10));
        assert_eq!(exit(1, 10), Exit::Below(vec![11]));
        assert_eq!(exit(2, 10), Exit::Innermost);
        assert_eq!(exit(1, 11), Exit::Innermost);
        assert_eq!(exit(1, 11), Exit::Nothing);
        assert!(!enter(1, 5, || false)); // entered on another thread
        assert_eq!(exit(1, 5), Exit::Nothing);
        assert!(enter(1, 5, || true));
        assert!(!enter(1, 5, || unreachable!()));
        assert_eq!(remove_all(1, 5), Exit::Innermost);
        assert!(!contains(1, 5));
    }
}
