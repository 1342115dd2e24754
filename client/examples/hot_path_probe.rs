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

use std::hint::black_box;

use pfs_client::{Config, LazyStageClass, LazyStatementClass, LazyWaitClass, Operation, WaitClass};

static TIMED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/probe/timed");
static STAGE: LazyStageClass = LazyStageClass::new("stage/probe/step");
static STATEMENT: LazyStatementClass = LazyStatementClass::new("statement/probe/query");

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

/// Two raw timer reads, the floor.
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_timer_pair(clock: &quanta::Clock) -> u64 {
    let a = clock.raw();
    let b = clock.raw();
    b.wrapping_sub(a)
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

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "timed".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let dir = std::env::temp_dir().join(format!("pfs-probe-{}", std::process::id()));
    pfs_client::init_with(Config::new("hot-path-probe").shm_dir(&dir)).expect("init");
    let clock = quanta::Clock::new();
    let disabled = WaitClass::disabled();
    // Warm up: register the thread, the classes and the call sites.
    probe_timed_wait(&TIMED);
    probe_stage(&STAGE);
    probe_statement(&STATEMENT);
    let mut sink = 0u64;
    for _ in 0..n {
        match what.as_str() {
            "timed" => probe_timed_wait(black_box(&TIMED)),
            "disabled" => probe_disabled(black_box(&disabled)),
            "timer" => sink = sink.wrapping_add(probe_timer_pair(black_box(&clock))),
            "stage" => probe_stage(black_box(&STAGE)),
            "statement" => probe_statement(black_box(&STATEMENT)),
            other => panic!("unknown probe {other}: timed|disabled|timer|stage|statement"),
        }
    }
    black_box(sink);
    let _ = std::fs::remove_dir_all(&dir);
}
