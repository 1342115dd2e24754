//! A global `EnvFilter` at INFO (`registry().with(EnvFilter::new("info"))`,
//! the most common setup) disables tower-http's response event, DEBUG, for
//! every layer: the layer never sees a status. Before, every request that
//! did not fail was then counted as cancelled, silently. Now, with a real
//! axum + tower-http server answering real requests: no request is
//! counted as cancelled while no status has ever been seen, a 5xx still
//! counts as an error (its failure event is ERROR), and the log says once
//! why and what to do. One test function: the subscriber is global.

mod common;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use pfs_tracing::PfsLayer;
use tower_http::trace::TraceLayer;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

const OK: u64 = 12;
const FAILED: u64 = 3;

#[test]
fn requests_under_a_global_info_filter_are_not_counted_as_cancelled() {
    let (_dir, path) = common::init("global-filter");
    let out = common::Buffer::default();
    let fmt_out = out.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(EnvFilter::new("info"))
            .with(PfsLayer::http())
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || fmt_out.clone()),
            ),
    )
    .unwrap();

    let rt = common::runtime(2);
    rt.block_on(async {
        let app = Router::new()
            .route("/ok", get(|| async { "fine" }))
            .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
            .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
        let (addr, shutdown, server) = common::serve(app).await;
        let client = common::client();
        for _ in 0..OK {
            assert_eq!(
                common::send(&client, "GET", &format!("http://{addr}/ok")).await,
                200
            );
        }
        for _ in 0..FAILED {
            assert_eq!(
                common::send(&client, "GET", &format!("http://{addr}/fail")).await,
                500
            );
        }
        shutdown.send(()).unwrap();
        server.await.unwrap();
    });
    drop(rt);

    let sums = common::sums(&common::read(&path));
    let ok = &sums["statement/http/GET /ok"];
    assert_eq!(
        (ok.count, ok.statement.cancelled, ok.statement.errors),
        (OK, 0, 0)
    );
    let fail = &sums["statement/http/GET /fail"];
    assert_eq!(
        (fail.count, fail.statement.cancelled, fail.statement.errors),
        (FAILED, 0, FAILED),
        "a 5xx is an error (tower-http's failure event is ERROR)"
    );
    let text = out.text_with("without a response event");
    assert_eq!(
        text.matches("without a response event").count(),
        1,
        "once: {text}"
    );
    assert!(
        text.contains("WARN") && text.contains("with_filter") && text.contains("DefaultOnResponse"),
        "says what to do: {text}"
    );
}
