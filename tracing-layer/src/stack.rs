//! Layer 0. The statement contexts entered on this thread, innermost
//! last: a thread-local stack that tells which statement's context is
//! current here (what a stage span entered now nests in), and lets a span
//! exited out of order be swapped out without corrupting the contexts
//! swapped in after it. An entry is the enter of a span: a statement
//! span's enter takes its own context; a stage span entered where its
//! statement is not current (work spawned from inside a stage carries the
//! stage span) takes its statement's. Entries are keyed by layer and span
//! id: two layers (two subscribers) number their spans independently.

use std::cell::RefCell;

/// One enter of a span on this thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    layer: u64,
    span: u64,
    /// The statement span whose context this enter takes: `span` itself
    /// for a statement span, its statement for a stage span.
    context: u64,
    /// Whether this enter swapped the context in (the first enter of it
    /// on this thread, if it was not entered on another thread at the
    /// time). Later enters of the same context are counted here only.
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
    /// The enter that swapped this context in was the innermost: swap it
    /// out.
    Innermost(u64),
    /// The enter that swapped this context (the first) in is below the
    /// enters of these other contexts of the same layer (innermost last),
    /// which were swapped in after it: swap those out (innermost first),
    /// then this one, then those back in (outermost first).
    Below(u64, Vec<u64>),
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

/// Whether the context of statement span `context` is entered on this
/// thread (by the span itself or by one of its stage spans).
#[inline]
pub(crate) fn holds(layer: u64, context: u64) -> bool {
    STACK.with(|s| {
        s.borrow()
            .iter()
            .any(|e| e.layer == layer && e.context == context)
    })
}

/// Records an enter of `span`, taking the context of statement span
/// `context`. If that context is not entered on this thread yet,
/// `swap_in` runs (it swaps the context in and says whether it did);
/// else the enter is only counted. Returns what `swap_in` returned, false
/// if it did not run.
#[inline]
pub(crate) fn enter(layer: u64, span: u64, context: u64, swap_in: impl FnOnce() -> bool) -> bool {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        let again = s.iter().any(|e| e.layer == layer && e.context == context);
        let swapped = !again && swap_in();
        s.push(Entry {
            layer,
            span,
            context,
            swapped,
        });
        swapped
    })
}

/// The statement span of `layer` whose context is current on this
/// thread: the innermost enter that swapped a context in, if it is this
/// layer's.
#[inline]
pub(crate) fn current(layer: u64) -> Option<u64> {
    STACK.with(|s| {
        s.borrow()
            .iter()
            .rev()
            .find(|e| e.swapped)
            .filter(|e| e.layer == layer)
            .map(|e| e.context)
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
            Exit::Innermost(e.context)
        } else {
            Exit::Below(
                e.context,
                s[i..]
                    .iter()
                    .filter(|e| e.swapped && e.layer == layer)
                    .map(|e| e.context)
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
        assert!(enter(1, 10, 10, || true));
        assert!(enter(1, 11, 11, || true));
        assert!(!enter(1, 10, 10, || unreachable!())); // entered again: counted only
        assert_eq!(current(1), Some(11));
        assert_eq!(current(2), None);
        assert_eq!(exit(1, 10), Exit::Nothing);
        assert!(contains(1, 10));
        assert!(enter(2, 10, 10, || true)); // another layer's span 10
        assert_eq!(current(1), None);
        assert_eq!(current(2), Some(10));
        assert_eq!(exit(1, 10), Exit::Below(10, vec![11]));
        assert_eq!(exit(2, 10), Exit::Innermost(10));
        assert_eq!(exit(1, 11), Exit::Innermost(11));
        assert_eq!(exit(1, 11), Exit::Nothing);
        assert!(!enter(1, 5, 5, || false)); // entered on another thread
        assert_eq!(exit(1, 5), Exit::Nothing);
        assert!(enter(1, 5, 5, || true));
        assert!(!enter(1, 5, 5, || unreachable!()));
        assert_eq!(remove_all(1, 5), Exit::Innermost(5));
        assert!(!contains(1, 5));
    }

    #[test]
    fn a_stage_span_takes_its_statements_context() {
        // Stage span 21 of statement 20, entered where 20 is not.
        assert!(enter(1, 21, 20, || true));
        assert_eq!(current(1), Some(20));
        assert!(holds(1, 20) && contains(1, 21) && !contains(1, 20));
        // The statement span entered inside: its context is in already.
        assert!(!enter(1, 20, 20, || unreachable!()));
        assert_eq!(exit(1, 20), Exit::Nothing);
        assert!(enter(1, 30, 30, || true));
        assert_eq!(exit(1, 21), Exit::Below(20, vec![30]));
        assert_eq!(exit(1, 30), Exit::Innermost(30));
        assert!(!holds(1, 20));
    }
}
