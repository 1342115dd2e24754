//! The layer's cost per span, beside a bare `Registry` in the same run
//! (group `async`, read by `scripts/bench`):
//!
//! * `layer_span`: one span's new + enter + exit + close,
//!   `info_span!("request", method = "GET", route = "/x")`, on a `Registry`
//!   with `PfsLayer::http()`. The default rules make it a statement
//!   (`statement/http/GET /x`): a context swapped in and out twice, a
//!   statement started and ended (current row, history ring, summary),
//!   its class found by name, its text and digest rendered.
//! * `registry_span`: the same span on a bare `Registry`.
//! * `layer_span_ignored`: a span the rules ignore (`other`), on the
//!   layered `Registry`: what every other span of an application pays.
//! * `client_statement_work`: the `pfs-client` calls the layer makes for
//!   one statement span, without `tracing`: a new `TaskContext` swapped in,
//!   a statement started, swapped out; swapped in, text and digest set,
//!   the statement ended, swapped out. `layer_span` minus this minus
//!   `registry_span` is the layer's own bookkeeping.
//!
//! Each case runs under its own dispatcher, set as this thread's default
//! for the measurement.

use criterion::{Criterion, criterion_group, criterion_main};
use pfs_client::Config;
use pfs_tracing::PfsLayer;
use spans::{client_statement_work, ignored_span, request_span};
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

mod spans;

fn init() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    pfs_client::init_with(Config::new("layer-bench").shm_dir(dir.path())).expect("init");
    dir
}

fn benches(c: &mut Criterion) {
    let _dir = init();
    let layered = Dispatch::new(tracing_subscriber::registry().with(PfsLayer::http()));
    let bare = Dispatch::new(tracing_subscriber::registry());
    // Register the thread, the class and the callsites before measuring.
    tracing::dispatcher::with_default(&layered, || {
        request_span();
        ignored_span();
    });
    tracing::dispatcher::with_default(&bare, request_span);

    let mut g = c.benchmark_group("async");
    tracing::dispatcher::with_default(&layered, || {
        g.bench_function("layer_span", |b| b.iter(request_span));
    });
    tracing::dispatcher::with_default(&bare, || {
        g.bench_function("registry_span", |b| b.iter(request_span));
    });
    tracing::dispatcher::with_default(&layered, || {
        g.bench_function("layer_span_ignored", |b| b.iter(ignored_span));
    });
    g.bench_function("client_statement_work", |b| b.iter(client_statement_work));
    g.finish();
}

criterion_group!(layer, benches);
criterion_main!(layer);
