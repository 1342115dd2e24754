//! The operations of the `async` bench group's span cases, shared by the
//! bench (`benches/layer.rs`) and its instruction-count probe
//! (`examples/layer_probe.rs`), so that both measure the same spans.

use std::hint::black_box;

use pfs_client::LazyStatementClass;
use pfs_client::task::TaskContext;

/// One request span's new + enter + exit + close: a statement under
/// `PfsLayer::http()` (`layer_span`), or a bare `Registry`'s span
/// (`registry_span`).
#[inline(always)]
pub fn request_span() {
    let s = tracing::info_span!("request", method = "GET", route = "/x");
    let g = s.enter();
    drop(black_box(g));
    drop(s);
}

/// A span the rules ignore (`layer_span_ignored`).
#[inline(always)]
pub fn ignored_span() {
    let s = tracing::info_span!("other", method = "GET", route = "/x");
    let g = s.enter();
    drop(black_box(g));
    drop(s);
}

static GET_X: LazyStatementClass = LazyStatementClass::new("statement/http/GET /x");

/// The `pfs-client` calls the layer makes for one statement span
/// (`client_statement_work`).
#[inline(always)]
pub fn client_statement_work() {
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
