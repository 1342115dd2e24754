//! The layer composes with others on one `Registry`: fmt (filtered to
//! INFO on its own, writing to a buffer) and tracing-opentelemetry (an
//! in-memory exporter), behind tower-http's *default* `TraceLayer`, whose
//! request span and response event are DEBUG. The fmt layer shows only
//! the handlers' INFO events, OpenTelemetry exports every request span,
//! and the pfs layer records every request as a statement (route unknown:
//! tower-http's own span has none) with its 5xx errors. One test
//! function: `init` is once per process.

mod common;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use pfs_tracing::PfsLayer;
use tower_http::trace::TraceLayer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

async fn ok() -> &'static str {
    tracing::info!("handled ok");
    "ok"
}

async fn boom() -> StatusCode {
    tracing::info!("handled boom");
    StatusCode::SERVICE_UNAVAILABLE
}

const OK: u64 = 10;
const BOOM: u64 = 5;

#[test]
fn with_fmt_and_opentelemetry_on_one_registry() {
    let (_dir, path) = common::init("tracing-compose");
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let out = common::Buffer::default();
    let fmt_out = out.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(PfsLayer::http())
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || fmt_out.clone())
                    .with_filter(LevelFilter::INFO),
            )
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("compose"))),
    )
    .unwrap();
    let rt = common::runtime(2);
    rt.block_on(async {
        let app = Router::new()
            .route("/ok", get(ok))
            .route("/boom", get(boom))
            .layer(TraceLayer::new_for_http());
        let (addr, shutdown, server) = common::serve(app).await;
        let client = common::client();
        for _ in 0..OK {
            assert_eq!(
                common::send(&client, "GET", &format!("http://{addr}/ok")).await,
                200
            );
        }
        for _ in 0..BOOM {
            assert_eq!(
                common::send(&client, "GET", &format!("http://{addr}/boom")).await,
                503
            );
        }
        drop(client);
        shutdown.send(()).unwrap();
        server.await.unwrap();
    });
    let s = common::read(&path);
    drop(rt);

    // pfs: every request, its errors; none cancelled (the DEBUG response
    // event was seen although fmt filters it out).
    let sums = common::sums(&s);
    let unknown = &sums["statement/http/unknown"];
    assert_eq!(unknown.count, OK + BOOM);
    assert_eq!(unknown.statement.errors, BOOM);
    assert_eq!(unknown.statement.cancelled, 0);
    let texts: Vec<&str> = s.long_statements.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(texts.iter().filter(|t| **t == "GET /ok").count() as u64, OK);
    assert_eq!(
        texts.iter().filter(|t| **t == "GET /boom").count() as u64,
        BOOM
    );

    // fmt: the INFO events, nothing of tower-http's DEBUG ones.
    let text = out.text();
    assert_eq!(text.matches("handled ok").count() as u64, OK);
    assert_eq!(text.matches("handled boom").count() as u64, BOOM);
    assert!(!text.contains("finished processing request"), "{text}");

    // OpenTelemetry: every request span, exported.
    let spans = exporter.get_finished_spans().unwrap();
    let requests = spans.iter().filter(|s| s.name == "request").count() as u64;
    assert_eq!(requests, OK + BOOM);
}
