//! Client hot path, each case beside its baselines in the same run (issue 9).
//!
//! * `hot_path/*`: one thread.
//!   - `timer_pair`: two raw TSC reads (`RDTSC` inlined, as the client's
//!     CYCLE timer reads it) — the floor for any timed event;
//!     `timer_pair_quanta`: the same through `quanta::Clock::raw` (a call).
//!   - `floor`: the timer pair plus the 43 stores a timed wait of this
//!     design cannot avoid (current row at start and end, history slot,
//!     ring words, summary row with its pending bucket and the previous
//!     event's bucket (layout 7.0), each with its sequence word) to seven
//!     lines only this thread writes, and nothing else: how close the
//!     timed wait is to what its own writes cost.
//!   - `disabled_lazy`: a `LazyWaitClass` whose class the setup flags
//!     disabled; `disabled_const`: `WaitClass::disabled()`.
//!   - `untimed_wait`: an enabled wait with TIMED off (current, history,
//!     summary; no timer reads).
//!   - `timed_wait`: an enabled, timed wait: two timer reads, current,
//!     history ring, summary row and histogram bucket.
//!   - `timed_wait_no_current`: the same with `events_waits_current` off
//!     (the history slot is then written whole at the end: what an event
//!     written once, straight into its history slot, would store), and
//!     `timed_wait_summary_only`: with `events_waits_history` off too. What
//!     the rows' stores cost inside a real wait (issue 18, see
//!     docs/PERFORMANCE.md).
//!   - `timed_wait_varied`: a timed wait around a spin whose length is
//!     drawn at random from six (waits from a few nanoseconds to a few
//!     hundred, five histogram buckets), and `spin_varied` the spin alone:
//!     their difference is a timed wait whose bucket the CPU cannot
//!     predict (`timed_wait` always lands in the same bucket), which keeps
//!     a change that only wins on a predictable bucket (a branch per
//!     bucket instead of an indexed increment) honest.
//!   - `stage_change`: `LazyStageClass::enter` (ends the open stage, starts
//!     the next; stages use the NANOSECOND timer by default).
//!   - `statement`: a statement begin and end (NANOSECOND timer).
//!   - `prom_client`: `prometheus_client` `Histogram::observe` of the
//!     difference of two `Instant::now()`, what a user would write instead.
//!   - `metrics_histogram`: the `metrics` crate's histogram handle over
//!     `metrics-util`'s atomic storage (the storage of
//!     `metrics-exporter-prometheus`), with two `Instant::now()`.
//!   - `bucket_index`: the histogram bucket of a duration (layout 4.0:
//!     powers of two of a second, one table compare more), over 64
//!     durations spread across the buckets; `bucket_index_3x`: the same
//!     with layout 3.x's powers of two of a picosecond, its formula copied
//!     here. The difference is what exact native histograms cost per
//!     timed event.
//! * `hot_path_2t/*`: the same on two threads at once, reported per
//!   operation per thread (wall time of the slower thread / iterations;
//!   samples where the two threads did not run at the same time are taken
//!   again, see `Pair::measure`).
//!   Baselines share one series, as every request handler of a service
//!   would; pfs threads share one instrument but each writes its own record.
//!
//! Run through `scripts/bench`, which prints the summary line.

use std::fs::File;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use pfs_client::{Config, LazyStageClass, LazyStatementClass, LazyWaitClass, Operation, WaitClass};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

static DISABLED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/bench/disabled");
static UNTIMED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/bench/untimed");
static TIMED: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/bench/timed");
static STAGE: LazyStageClass = LazyStageClass::new("stage/bench/step");
static STATEMENT: LazyStatementClass = LazyStatementClass::new("statement/bench/query");

/// Initialises the client into a temporary directory and applies the
/// setup the cases need, through the segment's own setup words (as the
/// agent does).
fn init() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    pfs_client::init_with(Config::new("hot-path-bench").shm_dir(dir.path())).expect("init");
    // Register every class before changing its flags.
    let _ = (DISABLED.get(), UNTIMED.get(), TIMED.get(), STAGE.get());
    let _ = STATEMENT.get();
    let seg = segment();
    use pfs_shm_layout::setup::set_instruments;
    assert_eq!(set_instruments(&seg, DISABLED.name(), Some(false), None), 1);
    assert_eq!(set_instruments(&seg, UNTIMED.name(), None, Some(false)), 1);
    assert!(!DISABLED.get().is_enabled());
    assert!(TIMED.get().is_enabled() && UNTIMED.get().is_enabled());
    dir
}

/// The client's segment, mapped writable as the agent maps it to change
/// the setup.
fn segment() -> pfs_shm_layout::Segment {
    let path = pfs_client::segment_path().expect("segment path");
    let file = File::options()
        .read(true)
        .write(true)
        .open(path)
        .expect("open segment");
    pfs_shm_layout::Segment::open(file, true).expect("map segment")
}

#[inline(always)]
fn timer_pair() -> u64 {
    let a = pfs_shm_layout::writer::read_tsc();
    let b = pfs_shm_layout::writer::read_tsc();
    b.wrapping_sub(a)
}

#[inline(always)]
fn timer_pair_quanta(clock: &quanta::Clock) -> u64 {
    let a = clock.raw();
    let b = clock.raw();
    b.wrapping_sub(a)
}

/// Seven cache lines written only by the bench thread (see `floor`).
#[repr(C, align(64))]
struct Lines([AtomicU64; 56]);

static LINES: Lines = Lines([const { AtomicU64::new(0) }; 56]);

/// Two TSC reads and the stores of a timed wait, from registers.
#[inline(always)]
fn floor(l: &Lines) {
    let w = &l.0;
    let st = |i: usize, v: u64| w[i].store(v, Relaxed);
    let t0 = pfs_shm_layout::writer::read_tsc();
    // Start: events_waits_current (lines 0-1), sequence odd, 10 fields, even.
    st(0, t0 | 1);
    for i in 1..11 {
        st(i, t0 + i as u64);
    }
    st(0, t0 + 2);
    let t1 = pfs_shm_layout::writer::read_tsc();
    let d = t1.wrapping_sub(t0);
    // End: the current row's 4 changed fields.
    st(0, t1 | 1);
    for i in 11..15 {
        st(i, d + i as u64);
    }
    st(0, t1 + 2);
    // History slot (lines 2-3): sequence, 14 fields, sequence.
    st(16, t1 | 1);
    for i in 17..31 {
        st(i, d ^ i as u64);
    }
    st(16, t1 + 2);
    // Ring next and count (line 4).
    st(32, d);
    st(33, t1);
    // Summary row (line 5): count, timed count, sum, and the new event's
    // pending bucket; the previous event's bucket (line 6), whose address
    // does not depend on this event's duration (layout 7.0).
    st(40, t1 | 1);
    st(41, d);
    st(42, d + 1);
    st(43, d + 2);
    st(44, (d >> 3) & 31);
    st(48 + (t0 & 7) as usize, t1);
    st(40, t1 + 2);
}

/// A spin length drawn from six (0 to 900 loop turns: waits from a few
/// nanoseconds to a few hundred, five histogram buckets), by xorshift.
#[inline(always)]
fn next_spin(state: &mut u64) -> u32 {
    const SPINS: [u32; 8] = [0, 20, 60, 150, 400, 900, 60, 150];
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    SPINS[(*state >> 61) as usize]
}

#[inline(always)]
fn spin(n: u32) {
    for i in 0..n {
        black_box(i);
    }
}

#[inline(always)]
fn timed_wait() {
    drop(black_box(&TIMED).get().start(Operation::Lock, 0));
}

#[inline(always)]
fn prom_observe(h: &Histogram) {
    let t0 = Instant::now();
    let t1 = Instant::now();
    h.observe(t1.duration_since(t0).as_secs_f64());
}

#[inline(always)]
fn metrics_record(h: &metrics::Histogram) {
    let t0 = Instant::now();
    let t1 = Instant::now();
    h.record(t1.duration_since(t0).as_secs_f64());
}

/// A `prometheus-client` histogram with buckets like ours (powers of two
/// of a second from 7.45 ns, 31 of them).
fn prom_histogram() -> Histogram {
    Histogram::new(exponential_buckets(2f64.powi(-27), 2.0, 31))
}

type Bucket = Arc<metrics_util::storage::AtomicBucket<f64>>;

fn metrics_histogram() -> (metrics::Histogram, Bucket) {
    let registry = metrics_util::registry::Registry::atomic();
    let key = metrics::Key::from_name("bench_seconds");
    let bucket: Bucket = registry.get_or_create_histogram(&key, |h| h.clone());
    (metrics::Histogram::from_arc(bucket.clone()), bucket)
}

/// Runs `op` `iters` times on this thread and on one persistent helper
/// thread at once (started together by a barrier); returns the slower
/// thread's time, so `time / iters` is the per-operation cost of each
/// thread under contention. The helper stays alive across samples so that
/// its pfs thread record is registered once, outside the measurement.
struct Pair {
    go: Option<Sender<u64>>,
    done: Receiver<Duration>,
    barrier: Arc<Barrier>,
    helper: Option<std::thread::JoinHandle<()>>,
    op: Arc<dyn Fn() + Send + Sync>,
}

fn run(op: &dyn Fn(), iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        op();
    }
    start.elapsed()
}

impl Pair {
    fn new(op: impl Fn() + Send + Sync + 'static) -> Self {
        let op: Arc<dyn Fn() + Send + Sync> = Arc::new(op);
        let (go, go_rx) = channel::<u64>();
        let (done_tx, done) = channel();
        let barrier = Arc::new(Barrier::new(2));
        let (b, o) = (barrier.clone(), op.clone());
        let helper = std::thread::Builder::new()
            .name("bench-helper".into())
            .spawn(move || {
                o(); // registers this thread's record before any measurement
                while let Ok(iters) = go_rx.recv() {
                    b.wait();
                    let _ = done_tx.send(run(&*o, iters));
                }
            })
            .expect("spawn helper");
        op();
        Self {
            go: Some(go),
            done,
            barrier,
            helper: Some(helper),
            op,
        }
    }

    /// One sample: the slower thread's time. Both threads run the same
    /// operation, so when both really ran at once their times are within a
    /// few percent; a sample where they are not (the machine's other work
    /// took a core from one of them: the pair ran partly one at a time) is
    /// taken again, up to 20 times, so that the figure is the two-thread
    /// one on a shared machine too. Every case, baselines included, is
    /// measured this way.
    fn measure(&self, iters: u64) -> Duration {
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            let (mine, theirs) = self.once(iters);
            last = mine.max(theirs);
            let skew = mine.abs_diff(theirs).as_secs_f64() / last.as_secs_f64().max(1e-12);
            if skew < 0.10 {
                break;
            }
        }
        last
    }

    fn once(&self, iters: u64) -> (Duration, Duration) {
        self.go
            .as_ref()
            .expect("helper")
            .send(iters)
            .expect("helper");
        self.barrier.wait();
        let mine = run(&*self.op, iters);
        let theirs = self.done.recv().expect("helper result");
        (mine, theirs)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.go.take();
        if let Some(h) = self.helper.take() {
            let _ = h.join();
        }
    }
}

/// Layout 3.x's bucket of a duration (powers of two of a picosecond),
/// kept here as the baseline of `bucket_index`.
#[inline(always)]
fn bucket_index_3x(ps: u64) -> usize {
    if ps <= 1 << 13 {
        return 0;
    }
    let i = 64 - (ps - 1).leading_zeros() as usize - 13;
    i.min(31)
}

/// 64 durations from 1 ns to 16 s, spread over the buckets.
fn durations() -> [u64; 64] {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    std::array::from_fn(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        1000 << (x % 34)
    })
}

fn one_thread(c: &mut Criterion) {
    let clock = quanta::Clock::new();
    let prom = prom_histogram();
    let (met, bucket) = metrics_histogram();
    let mut g = c.benchmark_group("hot_path");
    g.bench_function("timer_pair", |b| b.iter(timer_pair));
    g.bench_function("timer_pair_quanta", |b| {
        b.iter(|| timer_pair_quanta(black_box(&clock)))
    });
    g.bench_function("floor", |b| b.iter(|| floor(black_box(&LINES))));
    g.bench_function("disabled_lazy", |b| {
        b.iter(|| drop(black_box(&DISABLED).get().start(Operation::Lock, 0)))
    });
    g.bench_function("disabled_const", |b| {
        let class = WaitClass::disabled();
        b.iter(|| drop(black_box(&class).start(Operation::Lock, 0)))
    });
    g.bench_function("untimed_wait", |b| {
        b.iter(|| drop(black_box(&UNTIMED).get().start(Operation::Lock, 0)))
    });
    g.bench_function("timed_wait", |b| b.iter(timed_wait));
    {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        g.bench_function("spin_varied", |b| b.iter(|| spin(next_spin(&mut rng))));
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        g.bench_function("timed_wait_varied", |b| {
            b.iter(|| {
                let n = next_spin(&mut rng);
                let w = black_box(&TIMED).get().start(Operation::Lock, 0);
                spin(n);
                drop(w);
            })
        });
    }
    {
        let seg = segment();
        use pfs_shm_layout::setup::set_consumers;
        assert_eq!(set_consumers(&seg, "events_waits_current", false), 1);
        g.bench_function("timed_wait_no_current", |b| b.iter(timed_wait));
        assert_eq!(set_consumers(&seg, "events_waits_history", false), 1);
        g.bench_function("timed_wait_summary_only", |b| b.iter(timed_wait));
        set_consumers(&seg, "events_waits_current", true);
        set_consumers(&seg, "events_waits_history", true);
    }
    g.bench_function("stage_change", |b| b.iter(|| black_box(&STAGE).enter()));
    pfs_client::end_stage();
    g.bench_function("statement", |b| {
        b.iter(|| drop(black_box(&STATEMENT).start()))
    });
    // The drop-in `sync::Mutex` (a `try_lock`, else a block, inside a
    // timed wait) against std's, uncontended lock + unlock: what the
    // application pays per lock, beside `timed_wait` alone.
    {
        let std_m = std::sync::Mutex::new(0u64);
        g.bench_function("std_mutex", |b| {
            b.iter(|| *black_box(&std_m).lock().unwrap() += 1)
        });
        let pfs_m = pfs_client::sync::Mutex::new(&TIMED, 0u64);
        g.bench_function("pfs_mutex", |b| {
            b.iter(|| *black_box(&pfs_m).lock().unwrap() += 1)
        });
    }
    g.bench_function("prom_client", |b| b.iter(|| prom_observe(black_box(&prom))));
    let ds = durations();
    g.bench_function("bucket_index", |b| {
        b.iter(|| {
            for d in black_box(&ds) {
                black_box(pfs_shm_layout::layout::bucket_index(*d));
            }
        })
    });
    g.bench_function("bucket_index_3x", |b| {
        b.iter(|| {
            for d in black_box(&ds) {
                black_box(bucket_index_3x(*d));
            }
        })
    });
    g.bench_function("metrics_histogram", |b| {
        b.iter_custom(|iters| {
            let d = run(&|| metrics_record(black_box(&met)), iters);
            bucket.clear(); // the exporter drains it on scrape; keep memory flat
            d
        })
    });
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_path_2t");
    let pair = Pair::new(|| {
        black_box(timer_pair());
    });
    g.bench_function("timer_pair", |b| b.iter_custom(|n| pair.measure(n)));
    drop(pair);
    let pair = Pair::new(timed_wait);
    g.bench_function("timed_wait", |b| b.iter_custom(|n| pair.measure(n)));
    drop(pair);
    let prom = Arc::new(prom_histogram());
    let pair = Pair::new(move || prom_observe(black_box(&prom)));
    g.bench_function("prom_client", |b| b.iter_custom(|n| pair.measure(n)));
    drop(pair);
    let (met, bucket) = metrics_histogram();
    let pair = Pair::new(move || metrics_record(black_box(&met)));
    g.bench_function("metrics_histogram", |b| {
        b.iter_custom(|n| {
            let d = pair.measure(n);
            bucket.clear();
            d
        })
    });
    drop(pair);
    g.finish();
}

fn benches(c: &mut Criterion) {
    let _dir = init();
    one_thread(c);
    two_threads(c);
}

criterion_group!(hot_path, benches);
criterion_main!(hot_path);
