//! Instruction counts of the layer's span (`scripts/bench --callgrind`):
//! run under `valgrind --tool=callgrind`, each `probe_*` function is one
//! operation of the `async` bench group (`benches/layer.rs`), so its
//! inclusive instructions / the iterations are the operation's.
//!
//! ```text
//! layer_probe layer|registry|ignored|client N
//! ```

use std::hint::black_box;

use pfs_client::task::TaskContext;
use pfs_client::{Config, LazyStatementClass};
use pfs_tracing::PfsLayer;
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

/// One request span's new + enter + exit + close (the bench's
/// `layer_span` under the layered dispatcher, `registry_span` under the
/// bare one).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_span() {
    let s = tracing::info_span!("request", method = "GET", route = "/x");
    let g = s.enter();
    drop(black_box(g));
    drop(s);
}

/// A span the rules ignore (`layer_span_ignored`).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_ignored() {
    let s = tracing::info_span!("other", method = "GET", route = "/x");
    let g = s.enter();
    drop(black_box(g));
    drop(s);
}

static GET_X: LazyStatementClass = LazyStatementClass::new("statement/http/GET /x");

/// The client calls the layer makes for one statement span
/// (`client_statement_work`).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_client() {
    let mut ctx = TaskContext::new();
    ctx.swap_in();
    let mut stmt = GET_X.start_task();
    ctx.swap_out();
    stmt.set_text("GET ?");
    stmt.set_digest_text("GET /x");
    stmt.mark_cancelled();
    ctx.swap_in_unmeasured();
    drop(black_box(stmt));
    ctx.swap_out();
}

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "layer".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let dir = std::env::temp_dir().join(format!("pfs-layer-probe-{}", std::process::id()));
    pfs_client::init_with(Config::new("layer-probe").shm_dir(&dir)).expect("init");
    let layered = Dispatch::new(tracing_subscriber::registry().with(PfsLayer::http()));
    let bare = Dispatch::new(tracing_subscriber::registry());
    let dispatch = match what.as_str() {
        "registry" => bare,
        _ => layered,
    };
    tracing::dispatcher::with_default(&dispatch, || {
        // Warm up: the thread, the class and the callsites registered.
        probe_span();
        probe_ignored();
        probe_client();
        for _ in 0..n {
            match what.as_str() {
                "layer" | "registry" => probe_span(),
                "ignored" => probe_ignored(),
                "client" => probe_client(),
                other => panic!("unknown probe {other}: layer|registry|ignored|client"),
            }
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}
