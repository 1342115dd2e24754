//! The bound on classes: a layer that may name 3 classes from field
//! values. Routes past the bound fold into `statement/http/other`, each
//! distinct folded name counted once in the lost classes; a request no
//! route matched is `statement/http/unknown`, outside the bound; a method
//! nobody routes (`FOO`, recorded as `_OTHER`) is one more name, folded too. Requests are sent
//! one at a time so that the first three names are known. One test
//! function: `init` is once per process.

mod common;

use axum::Router;
use axum::routing::get;
use pfs_shm_layout::layout::LostKind;
use pfs_tracing::PfsLayer;
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

async fn ok() -> &'static str {
    "ok"
}

#[test]
fn classes_past_the_bound_fold_into_other() {
    let (_dir, path) = common::init("tracing-bound");
    let layer = PfsLayer::builder().http_defaults().max_classes(3).build();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let rt = common::runtime(2);
    rt.block_on(async {
        let mut app = Router::new();
        for r in 0..6 {
            app = app.route(&format!("/r{r}"), get(ok));
        }
        let app =
            app.layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
        let (addr, shutdown, server) = common::serve(app).await;
        let client = common::client();
        for _round in 0..2 {
            for r in 0..6 {
                let url = format!("http://{addr}/r{r}");
                assert_eq!(common::send(&client, "GET", &url).await, 200);
            }
        }
        let url = format!("http://{addr}/nowhere");
        assert_eq!(common::send(&client, "GET", &url).await, 404);
        let url = format!("http://{addr}/r0");
        assert_eq!(common::send(&client, "FOO", &url).await, 405);
        drop(client);
        shutdown.send(()).unwrap();
        server.await.unwrap();
    });
    let s = common::read(&path);
    drop(rt);

    let sums = common::sums(&s);
    for r in 0..3 {
        assert_eq!(sums[&format!("statement/http/GET /r{r}")].count, 2);
    }
    for r in 3..6 {
        let name = format!("statement/http/GET /r{r}");
        assert!(
            common::class_index(&s, &name).is_none(),
            "{name} not created"
        );
    }
    assert_eq!(
        sums["statement/http/other"].count,
        3 * 2 + 1,
        "r3..r5 twice, and FOO /r0 (as _OTHER /r0)"
    );
    assert_eq!(sums["statement/http/unknown"].count, 1);
    assert_eq!(
        s.lost[LostKind::Classes as usize],
        4,
        "one lost class per distinct name folded: GET /r3, /r4, /r5, _OTHER /r0"
    );
    let http_classes: Vec<&str> = s
        .classes
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| n.starts_with("statement/"))
        .collect();
    assert_eq!(
        http_classes.len(),
        5,
        "3 named, other, unknown: {http_classes:?}"
    );
    // A folded statement keeps its own text.
    let other = common::class_index(&s, "statement/http/other").unwrap();
    let mut texts: Vec<&str> = s
        .long_statements
        .iter()
        .filter(|e| e.ev.class == other)
        .map(|e| e.text.as_str())
        .collect();
    texts.sort_unstable();
    assert_eq!(
        texts,
        [
            "GET /r3",
            "GET /r3",
            "GET /r4",
            "GET /r4",
            "GET /r5",
            "GET /r5",
            "_OTHER /r0"
        ]
    );
}
