//! Async instrumentation, each case beside its baseline in the same run.
//! Futures are polled by hand with a no-op waker: no runtime is in the
//! measurement.
//!
//! * `async/tokio_mutex`: an uncontended `tokio::sync::Mutex` lock (one
//!   poll of `lock()`, ready) and unlock.
//! * `async/pfs_tokio_mutex`: the same with `pfs_client::tokio::Mutex`, its
//!   instrument enabled and timed (an uncontended lock records nothing: the
//!   difference is the drop-in's own cost).
//! * `async/poll_ctx`: one poll of a `pfs_client::task::Task` whose task
//!   has a statement open (swap the task's event context in, time the
//!   poll for the statement's `CPU_TIME`, swap it out), around a future
//!   that polls a fresh ready future and returns `Pending`.
//! * `async/poll_ctx_no_cpu`: `poll_ctx` with the `events_statements_cpu`
//!   consumer off (no poll timing, no `CPU_TIME`).
//! * `async/poll_ctx_no_statement`: the same with no statement open (no
//!   poll timing): the context swap alone.
//! * `async/tracing_instrument`: the same poll through
//!   `tracing::Instrument`, a `Registry` with one no-op layer as the
//!   default subscriber and the span enabled, so the span's enter and exit
//!   really run.
//!
//! Run with `--features tokio` (as `scripts/bench` does).

use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use looper::{Looper, NoopLayer};
use pfs_client::task::Task;
use pfs_client::{Config, LazyStatementClass, LazyWaitClass};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

mod looper;

static LOCK: LazyWaitClass = LazyWaitClass::new("wait/synch/mutex/bench/tokio_mutex");
static REQUEST: LazyStatementClass = LazyStatementClass::new("statement/bench/request");

/// Initialises the client into a temporary directory, with the classes
/// the cases use registered (enabled and timed, the defaults).
fn init() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    pfs_client::init_with(Config::new("async-bench").shm_dir(dir.path())).expect("init");
    assert!(LOCK.get().is_enabled() && REQUEST.get().is_enabled());
    dir
}

fn poll_pending<F: Future>(f: Pin<&mut F>, cx: &mut Context<'_>) {
    assert!(black_box(f.poll(cx)).is_pending());
}

fn benches(c: &mut Criterion) {
    let _dir = init();
    let mut cx = Context::from_waker(Waker::noop());
    let mut g = c.benchmark_group("async");

    let m = tokio::sync::Mutex::new(0u64);
    g.bench_function("tokio_mutex", |b| {
        b.iter(|| match pin!(black_box(&m).lock()).poll(&mut cx) {
            Poll::Ready(guard) => drop(black_box(guard)),
            Poll::Pending => unreachable!("uncontended"),
        })
    });

    let m = pfs_client::tokio::Mutex::new(&LOCK, 0u64);
    g.bench_function("pfs_tokio_mutex", |b| {
        b.iter(|| match pin!(black_box(&m).lock()).poll(&mut cx) {
            Poll::Ready(guard) => drop(black_box(guard)),
            Poll::Pending => unreachable!("uncontended"),
        })
    });

    let mut task = pin!(Task::new(Looper::new(Some(&REQUEST))));
    poll_pending(task.as_mut(), &mut cx); // opens the statement
    assert_ne!(task.thread_id(), 0, "the task is recording");
    g.bench_function("poll_ctx", |b| {
        b.iter(|| poll_pending(task.as_mut(), &mut cx))
    });

    // As `pfs-agent setup consumers events_statements_cpu --enabled no`.
    let set_cpu = |on: bool| {
        let path = pfs_client::segment_path().expect("initialised");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("segment");
        let seg = pfs_shm_layout::Segment::open(file, true).expect("segment");
        assert_eq!(
            pfs_shm_layout::setup::set_consumers(&seg, "events_statements_cpu", on),
            1
        );
    };
    set_cpu(false);
    g.bench_function("poll_ctx_no_cpu", |b| {
        b.iter(|| poll_pending(task.as_mut(), &mut cx))
    });
    set_cpu(true);

    let mut idle = pin!(Task::new(Looper::new(None)));
    poll_pending(idle.as_mut(), &mut cx);
    assert_ne!(idle.thread_id(), 0, "the task has its context");
    g.bench_function("poll_ctx_no_statement", |b| {
        b.iter(|| poll_pending(idle.as_mut(), &mut cx))
    });

    let subscriber = tracing_subscriber::registry().with(NoopLayer);
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("request");
        assert!(!span.is_disabled(), "the span is enabled");
        let mut instrumented = pin!(Looper::new(None).instrument(span));
        poll_pending(instrumented.as_mut(), &mut cx);
        g.bench_function("tracing_instrument", |b| {
            b.iter(|| poll_pending(instrumented.as_mut(), &mut cx))
        });
    });

    g.finish();
}

criterion_group!(async_tasks, benches);
criterion_main!(async_tasks);
