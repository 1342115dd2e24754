//! The layer's gRPC defaults inside a real server: tower-http's
//! `TraceLayer::new_for_grpc()` with `pfs_tracing::grpc::make_span_for`
//! over an axum router answering gRPC calls (trailers-only responses:
//! `grpc-status` in the headers, as tonic sends an error), on a
//! multi-threaded runtime, called by 4 concurrent clients: one statement
//! class per RPC the server has, non-OK statuses counted as errors
//! (whatever the HTTP status), made-up paths in `statement/grpc/unknown`.
//! One test function: `init` is once per process.

mod common;

use std::collections::HashMap;

use axum::Router;
use axum::http::{HeaderValue, Response, Uri};
use pfs_shm_layout::layout::LostKind;
use pfs_tracing::PfsLayer;
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

const CLIENTS: usize = 4;
const PER_CLIENT: usize = 30;

/// The server's methods.
static METHODS: &[&str] = &["demo.Greeter/Hello", "demo.Greeter/Fail"];

/// A gRPC answer by path: OK, NOT_FOUND (5), or UNIMPLEMENTED (12) for a
/// method the server does not have.
async fn answer(uri: Uri) -> Response<axum::body::Body> {
    tokio::task::yield_now().await;
    let code = match uri.path() {
        "/demo.Greeter/Hello" => "0",
        "/demo.Greeter/Fail" => "5",
        _ => "12",
    };
    let mut r = Response::new(axum::body::Body::empty());
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from_static(code));
    r
}

/// What call `i` of client `c` is: its path and the class it must count in.
fn call(c: usize, i: usize) -> (String, &'static str) {
    let n = c * PER_CLIENT + i;
    match n % 3 {
        0 => (
            "/demo.Greeter/Hello".into(),
            "statement/grpc/demo.Greeter/Hello",
        ),
        1 => (
            "/demo.Greeter/Fail".into(),
            "statement/grpc/demo.Greeter/Fail",
        ),
        _ => (format!("/scan.Probe{n}/X"), "statement/grpc/unknown"),
    }
}

#[test]
fn one_class_per_rpc_and_non_ok_statuses_are_errors() {
    let (_dir, path) = common::init("grpc-test");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PfsLayer::http()))
        .unwrap();
    let rt = common::runtime(2);
    let mut sent: HashMap<&'static str, u64> = HashMap::new();
    rt.block_on(async {
        let app = Router::new().fallback(answer).layer(
            TraceLayer::new_for_grpc().make_span_with(pfs_tracing::grpc::make_span_for(METHODS)),
        );
        let (addr, shutdown, server) = common::serve(app).await;
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            clients.push(tokio::spawn(async move {
                let client = common::client();
                let mut got = Vec::new();
                for i in 0..PER_CLIENT {
                    let (p, class) = call(c, i);
                    let status = common::send(&client, "POST", &format!("http://{addr}{p}")).await;
                    assert_eq!(status, 200, "gRPC answers are HTTP 200");
                    got.push(class);
                }
                got
            }));
        }
        for c in clients {
            for class in c.await.unwrap() {
                *sent.entry(class).or_default() += 1;
            }
        }
        shutdown.send(()).unwrap();
        server.await.unwrap();
    });
    drop(rt);
    let s = common::read(&path);
    let sums = common::sums(&s);
    for (class, n) in &sent {
        let sum = sums
            .get(*class)
            .unwrap_or_else(|| panic!("{class} recorded"));
        assert_eq!(sum.count, *n, "{class}: one statement per call");
        let errors = if class.ends_with("/Hello") { 0 } else { *n };
        assert_eq!(
            sum.statement.errors, errors,
            "{class}: non-OK grpc-status are errors"
        );
        assert_eq!(sum.statement.cancelled, 0, "{class}");
    }
    let grpc_classes: Vec<&str> = s
        .classes
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| n.starts_with("statement/grpc/"))
        .collect();
    assert_eq!(
        grpc_classes.len(),
        3,
        "the two methods and unknown, whatever paths were sent: {grpc_classes:?}"
    );
    assert_eq!(s.lost[LostKind::Classes as usize], 0);

    // SQL_TEXT: the RPC, or for a path that names no method its URI.
    let class_name: HashMap<u32, &str> = s
        .classes
        .iter()
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    let mut texts = 0;
    for st in &s.long_statements {
        let class = class_name[&st.ev.class];
        let Some(rpc) = class.strip_prefix("statement/grpc/") else {
            continue;
        };
        texts += 1;
        if rpc == "unknown" {
            assert!(st.text.contains("/scan.Probe"), "{class}: {:?}", st.text);
        } else {
            assert_eq!(st.text, rpc, "{class}");
        }
    }
    assert_eq!(texts, CLIENTS * PER_CLIENT, "every call in history_long");
}
