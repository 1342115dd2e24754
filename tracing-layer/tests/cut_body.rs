//! A response body cut short: a client that hangs up after the response's
//! head, while its body streams. tower-http's span closes then, with the
//! response's status already seen; with `CutBodyLayer` inside the
//! `TraceLayer`, the statement is recorded as cancelled (not an error).
//! A body sent whole, a short one, and a `HEAD` (no body sent) are not.
//! A gRPC response stream (`TraceLayer::new_for_grpc()`) needs no such
//! layer: a call completes with the `grpc-status` of its trailers, so
//! one cut before them is cancelled, one read whole is not.
//! One test function: `init` is once per process.

mod common;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http_body::{Body, Frame};
use hyper::body::Bytes;
use pfs_tracing::{CutBodyLayer, PfsLayer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_http::trace::TraceLayer;
use tracing_subscriber::prelude::*;

/// A body of `left` chunks, one every 50 ms (an export, an event stream),
/// then `trailers` if any.
struct Drip {
    left: u32,
    next: Pin<Box<tokio::time::Sleep>>,
    trailers: Option<axum::http::HeaderMap>,
}

impl Drip {
    fn new(chunks: u32) -> Self {
        Self {
            left: chunks,
            next: Box::pin(tokio::time::sleep(Duration::ZERO)),
            trailers: None,
        }
    }
}

impl Body for Drip {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        std::task::ready!(self.next.as_mut().poll(cx));
        self.left -= 1;
        let at = tokio::time::Instant::now() + Duration::from_millis(50);
        self.next.as_mut().reset(at);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk\n")))))
    }
}

async fn drip() -> axum::response::Response {
    axum::response::Response::new(axum::body::Body::new(Drip::new(10)))
}

async fn short() -> &'static str {
    "ok"
}

/// A body given whole (one frame), larger than what the sockets buffer:
/// a download.
async fn large() -> Vec<u8> {
    vec![b'x'; LARGE]
}

const LARGE: usize = 32 << 20;

/// A gRPC server-streaming answer: the same drip, its `grpc-status` (OK)
/// in its trailers.
async fn watch() -> axum::response::Response {
    let mut body = Drip::new(10);
    let mut trailers = axum::http::HeaderMap::new();
    trailers.insert("grpc-status", axum::http::HeaderValue::from_static("0"));
    body.trailers = Some(trailers);
    let mut r = axum::response::Response::new(axum::body::Body::new(body));
    r.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/grpc"),
    );
    r
}

static METHODS: &[&str] = &["demo.Feed/Watch"];

const WATCH: &str = "statement/grpc/demo.Feed/Watch";
const DRIP: &str = "statement/http/GET /drip";
const SHORT: &str = "statement/http/GET /short";
const LARGE_CLASS: &str = "statement/http/GET /large";
const SHORT_HEAD: &str = "statement/http/HEAD /short";

/// Sends `request` on a raw connection and hangs up once the head and
/// the first chunk have come.
async fn hang_up_mid_body(addr: std::net::SocketAddr, request: &[u8]) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("chunk") && !got.ends_with(b"xxxx") {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .expect("the first chunk")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    drop(conn);
}

#[test]
fn a_body_cut_short_cancels_the_statement() {
    let (_dir, path) = common::init("tracing-cut-body");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PfsLayer::http()))
        .unwrap();
    let rt = common::runtime(2);
    rt.block_on(async {
        let grpc = Router::new()
            .route("/demo.Feed/Watch", axum::routing::post(watch))
            .layer(
                TraceLayer::new_for_grpc()
                    .make_span_with(pfs_tracing::grpc::make_span_for(METHODS)),
            );
        let app = Router::new()
            .route("/drip", get(drip))
            .route("/short", get(short))
            .route("/large", get(large))
            .layer(CutBodyLayer)
            .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span))
            .merge(grpc);
        let (addr, _shutdown, _server) = common::serve(app).await;
        for _ in 0..2 {
            hang_up_mid_body(addr, b"GET /drip HTTP/1.1\r\nhost: test\r\n\r\n").await;
        }
        // A download given whole, cut after its first kilobytes.
        hang_up_mid_body(addr, b"GET /large HTTP/1.1\r\nhost: test\r\n\r\n").await;
        assert_eq!(
            common::send(&common::client(), "GET", &format!("http://{addr}/large")).await,
            200
        );
        hang_up_mid_body(
            addr,
            b"POST /demo.Feed/Watch HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        assert_eq!(
            common::send(
                &common::client(),
                "POST",
                &format!("http://{addr}/demo.Feed/Watch")
            )
            .await,
            200
        );
        let client = common::client();
        assert_eq!(
            common::send(&client, "GET", &format!("http://{addr}/drip")).await,
            200
        );
        assert_eq!(
            common::send(&client, "GET", &format!("http://{addr}/short")).await,
            200
        );
        assert_eq!(
            common::send(&client, "HEAD", &format!("http://{addr}/short")).await,
            200
        );
        // The server notices each hang-up on its own.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let sums = common::sums(&common::read(&path));
            let count = |c: &str| sums.get(c).map_or(0, |x| x.count);
            if count(DRIP) == 3
                && count(SHORT) == 1
                && count(SHORT_HEAD) == 1
                && count(WATCH) == 2
                && count(LARGE_CLASS) == 2
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "statements: {} {} {}",
                count(DRIP),
                count(SHORT),
                count(SHORT_HEAD)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let s = common::read(&path);
    drop(rt);
    let sums = common::sums(&s);
    assert_eq!(sums[DRIP].statement.cancelled, 2, "the two cut short");
    assert_eq!(sums[DRIP].statement.errors, 0, "a hang-up is not an error");
    assert_eq!(sums[SHORT].statement.cancelled, 0);
    assert_eq!(sums[SHORT_HEAD].statement.cancelled, 0, "no body to send");
    assert_eq!(
        sums[WATCH].statement.cancelled, 1,
        "the gRPC stream cut short"
    );
    assert_eq!(sums[WATCH].statement.errors, 0);
    assert_eq!(
        sums[LARGE_CLASS].statement.cancelled, 1,
        "the download cut short, not the one read whole"
    );
    assert_eq!(sums[LARGE_CLASS].statement.errors, 0);
    // The whole stream took its ten chunks' time; the cut ones ended at
    // the hang-up.
    let drip = common::class_index(&s, DRIP).unwrap();
    let mut cut = 0;
    for st in s.long_statements.iter().filter(|e| e.ev.class == drip) {
        let wait = st.ev.timer_wait.unwrap();
        if st.figures.cancelled == 1 {
            cut += 1;
            assert!(wait < 400_000_000_000, "ended at the hang-up: {wait} ps");
        } else {
            assert!(wait >= 450_000_000_000, "the whole body: {wait} ps");
        }
    }
    assert_eq!(cut, 2);
}
