//! A small binary for instruction counts (callgrind) and assembly review of
//! the hot path (issue 9, see docs/PERFORMANCE.md and scripts/bench):
//!
//! ```sh
//! cargo build --release -p pfs-client --example hot_path_probe
//! valgrind --tool=callgrind target/release/examples/hot_path_probe timed 100000
//! objdump -d --no-show-raw-insn -C target/release/examples/hot_path_probe | less  # look for probe_
//! ```
//!
//! Each `probe_*` function is one operation, kept out of line so that its
//! code and its cost per call can be read on their own.

use std::alloc::{GlobalAlloc, Layout};
use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Waker};

#[path = "../benches/looper/mod.rs"]
mod looper;

use looper::{Looper, NoopLayer};
use pfs_client::alloc::PfsAllocator;
use pfs_client::task::Task;
use pfs_client::{
    Config, LazyMemoryClass, LazyStageClass, LazyStatementClass, LazyWaitClass, Operation,
    WaitClass, memory_scope,
};

static TIMED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/probe/timed");
static DISABLED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/probe/disabled");
static UNTIMED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/probe/untimed");
static STAGE: LazyStageClass = LazyStageClass::new("stage/probe/step");
static STATEMENT: LazyStatementClass = LazyStatementClass::new("statement/probe/query");
static BUF: LazyMemoryClass = LazyMemoryClass::new("memory/probe/buf");
/// Not the global allocator: the probe calls it directly, so that only
/// the probed allocation goes through it.
static PFS_ALLOC: PfsAllocator = PfsAllocator::new();

/// One timed wait: timer, current, history, summary, histogram.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_timed_wait(class: &LazyWaitClass) {
    drop(class.get().start(Operation::Lock, 0));
}

/// One wait on a disabled class.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_disabled(class: &WaitClass) {
    drop(class.start(Operation::Lock, 0));
}

/// One wait on a lazily registered class that the setup disabled.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_disabled_lazy(class: &LazyWaitClass) {
    drop(class.get().start(Operation::Lock, 0));
}

/// Two raw timer reads (inlined `RDTSC`, as the CYCLE timer), the floor.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_timer_pair() -> u64 {
    let a = pfs_shm_layout::writer::read_tsc();
    let b = pfs_shm_layout::writer::read_tsc();
    b.wrapping_sub(a)
}

/// An enabled wait whose class is not timed: the bookkeeping alone.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_untimed_wait(class: &LazyWaitClass) {
    drop(class.get().start(Operation::Lock, 0));
}

/// One stage change.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_stage(class: &LazyStageClass) {
    class.enter();
}

/// One statement begin and end.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_statement(class: &LazyStatementClass) {
    drop(class.start());
}

/// One accounted allocation and its free through the token API.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_memory_token(class: &LazyMemoryClass) {
    class.alloc(64).free();
}

/// One 64-byte allocation and its free through the `GlobalAlloc` wrapper,
/// in a memory scope (the system allocator's own cost included).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_global_alloc(a: &PfsAllocator) {
    let l = Layout::new::<[u64; 8]>();
    // SAFETY: `l` has a non-zero size; the block is freed once, at once,
    // with the layout it was allocated with, by the allocator that
    // returned it, and never read or written (a null result is passed to
    // `dealloc` only if non-null).
    unsafe {
        let p = a.alloc(l);
        if !p.is_null() {
            a.dealloc(p, l);
        }
    }
}

/// One 64-byte allocation grown to 128 bytes, then freed, through the
/// `GlobalAlloc` wrapper (the system allocator's own cost included).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_global_realloc(a: &PfsAllocator) {
    let l = Layout::new::<[u64; 8]>();
    let grown = Layout::new::<[u64; 16]>();
    // SAFETY: `l` has a non-zero size, and `grown` is a valid layout of
    // `l`'s alignment, so its size is a valid `realloc` target. Each block
    // is used only if non-null, never read or written, and freed once by
    // the allocator that returned it, with the layout it has then (a
    // successful `realloc` took ownership of `p`; a failed one left it).
    unsafe {
        let p = a.alloc(l);
        if !p.is_null() {
            let q = a.realloc(p, l, grown.size());
            if q.is_null() {
                a.dealloc(p, l);
            } else {
                a.dealloc(q, grown);
            }
        }
    }
}

/// One poll through `tracing::Instrument`, a `Registry` with one no-op
/// layer as the default subscriber (the `async` bench's
/// `tracing_instrument`, what `probe_poll` is compared with).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_instrumented(
    fut: Pin<&mut tracing::instrument::Instrumented<Looper>>,
    cx: &mut Context<'_>,
) {
    black_box(fut.poll(cx).is_pending());
}

/// One poll of a task (`pfs_client::task::Task`): the context swapped in
/// and out, and, with a statement open, the poll timed for its `CPU_TIME`
/// (the `async` bench's `poll_ctx` and `poll_ctx_no_statement`).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_poll(task: Pin<&mut Task<Looper>>, cx: &mut Context<'_>) {
    black_box(task.poll(cx).is_pending());
}

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "timed".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let dir = std::env::temp_dir().join(format!("pfs-probe-{}", std::process::id()));
    let cfg = Config::new("hot-path-probe")
        .shm_dir(&dir)
        .instrument(UNTIMED.name(), pfs_shm_layout::layout::FLAG_ENABLED)
        .instrument(DISABLED.name(), 0);
    pfs_client::init_with(cfg).expect("init");
    let disabled = WaitClass::disabled();
    // Warm up: register the thread, the classes and the call sites.
    probe_timed_wait(&TIMED);
    probe_untimed_wait(&UNTIMED);
    assert!(UNTIMED.get().is_enabled());
    assert!(!DISABLED.get().is_enabled());
    probe_stage(&STAGE);
    probe_statement(&STATEMENT);
    let _scope = memory_scope(&BUF);
    probe_memory_token(&BUF);
    probe_global_alloc(&PFS_ALLOC);
    probe_global_realloc(&PFS_ALLOC);
    let mut cx = Context::from_waker(Waker::noop());
    let open = (what != "poll_idle").then_some(&STATEMENT);
    let mut task = pin!(Task::new(Looper::new(open)));
    probe_poll(task.as_mut(), &mut cx);
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::layer::SubscriberExt::with(tracing_subscriber::registry(), NoopLayer),
    );
    let mut instrumented = pin!(tracing::Instrument::instrument(
        Looper::new(None),
        tracing::info_span!("request")
    ));
    probe_instrumented(instrumented.as_mut(), &mut cx);
    if what == "timed_no_current" {
        // The timed wait without its `events_waits_current` row (the
        // bench's `timed_wait_no_current`): what the row's writes cost.
        let path = pfs_client::segment_path().expect("initialised");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("the segment");
        let seg = pfs_shm_layout::Segment::open(file, true).expect("the segment");
        pfs_shm_layout::setup::set_consumers(&seg, "events_waits_current", false);
    }
    let mut sink = 0u64;
    for _ in 0..n {
        match what.as_str() {
            "timed" | "timed_no_current" => probe_timed_wait(black_box(&TIMED)),
            "disabled" => probe_disabled(black_box(&disabled)),
            "disabled_lazy" => probe_disabled_lazy(black_box(&DISABLED)),
            "timer" => sink = sink.wrapping_add(probe_timer_pair()),
            "untimed" => probe_untimed_wait(black_box(&UNTIMED)),
            "stage" => probe_stage(black_box(&STAGE)),
            "statement" => probe_statement(black_box(&STATEMENT)),
            "memory_token" => probe_memory_token(black_box(&BUF)),
            "global_alloc" => probe_global_alloc(black_box(&PFS_ALLOC)),
            "global_realloc" => probe_global_realloc(black_box(&PFS_ALLOC)),
            "poll" | "poll_idle" => probe_poll(task.as_mut(), &mut cx),
            "instrumented" => probe_instrumented(instrumented.as_mut(), &mut cx),
            other => panic!(
                "unknown probe {other}: timed|timed_no_current|untimed|disabled|disabled_lazy|timer|stage|statement|memory_token|global_alloc|global_realloc|poll|poll_idle|instrumented"
            ),
        }
    }
    black_box(sink);
    let _ = std::fs::remove_dir_all(&dir);
}
