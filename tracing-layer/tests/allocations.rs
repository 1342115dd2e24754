//! What a recorded statement span allocates, counted on this thread by a
//! counting global allocator: one block, the span's extension entry
//! (tracing-subscriber boxes every extension value), however many class
//! names the service's spans render (here 40 routes, more than the
//! per-thread list of recent names holds); a span no rule matches, none.
//! One test function: `init` is once per process.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pfs_tracing::{PfsLayer, SpanMatch, StatementRule};
use tracing_subscriber::prelude::*;

/// The system allocator, counting this thread's allocations.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to `System` unchanged; the count is a
// const thread-local (no allocation, no destructor).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const ROUTES: usize = 40;

fn request(route: &str) {
    let span = tracing::info_span!("request", route);
    let _e = span.enter();
}

fn unmatched() {
    let span = tracing::info_span!("helper", n = 1);
    let _e = span.enter();
}

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(|c| c.get());
    f();
    ALLOCATIONS.with(|c| c.get()) - before
}

#[test]
fn a_statement_span_allocates_its_extension_only() {
    let (_dir, path) = common::init("tracing-allocations");
    let layer = PfsLayer::builder()
        .statement(StatementRule::new(SpanMatch::name("request"), "api").class("{route}"))
        .build();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let routes: Vec<String> = (0..ROUTES).map(|r| format!("r{r}")).collect();
    // Warm up: classes registered, pools and caches filled.
    for _ in 0..3 {
        for r in &routes {
            request(r);
        }
        unmatched();
    }
    let rounds = 10u64;
    let statements = allocations(|| {
        for _ in 0..rounds {
            for r in &routes {
                request(r);
            }
        }
    });
    let spans = rounds * ROUTES as u64;
    assert!(
        statements <= spans,
        "{statements} allocations for {spans} statement spans over {ROUTES} routes"
    );
    let others = allocations(|| {
        for _ in 0..100 {
            unmatched();
        }
    });
    assert_eq!(others, 0, "spans no rule matches");

    let sums = common::sums(&common::read(&path));
    for r in &routes {
        assert_eq!(sums[&format!("statement/api/{r}")].count, 3 + rounds, "{r}");
    }
}
