//! Instruction counts of the layer's span (`scripts/bench --callgrind`):
//! run under `valgrind --tool=callgrind`, each `probe_*` function is one
//! operation of the `async` bench group (`benches/layer.rs`), so its
//! inclusive instructions / the iterations are the operation's.
//!
//! ```text
//! layer_probe layer|registry|ignored|client N
//! ```

#[path = "../benches/spans/mod.rs"]
mod spans;

use pfs_client::Config;
use pfs_tracing::PfsLayer;
use tracing::Dispatch;
use tracing_subscriber::prelude::*;

/// One request span (the bench's `layer_span` under the layered
/// dispatcher, `registry_span` under the bare one).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_span() {
    spans::request_span();
}

/// A span the rules ignore (`layer_span_ignored`).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_ignored() {
    spans::ignored_span();
}

/// The client calls the layer makes for one statement span
/// (`client_statement_work`).
#[inline(never)]
#[unsafe(no_mangle)]
pub fn probe_client() {
    spans::client_statement_work();
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
