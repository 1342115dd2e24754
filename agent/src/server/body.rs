//! Responses: a whole body, or a table's chunks as they are written.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::json;

/// A response.
pub type Resp = Response<Body>;

/// A response body: whole, or a table written by a blocking task while it
/// is sent (the table streams).
#[derive(Debug)]
pub enum Body {
    /// The whole body.
    Full(Full<Bytes>),
    /// Chunks as they are written, up to [`Chunk::End`]; anything else
    /// ends the response abnormally (the connection is closed without the
    /// last chunk, so the client cannot take a cut table for a whole one).
    Stream(Chunks),
}

/// What the writer of a streamed body sends.
#[derive(Debug)]
pub enum Chunk {
    /// The next bytes.
    Data(Bytes),
    /// The body is complete.
    End,
    /// The body cannot be completed.
    Fail(std::io::Error),
}

/// The receiving end of a streamed body. A writer that goes away without
/// [`Chunk::End`] (it gave up on a client that stopped reading, or
/// panicked) fails the response like a [`Chunk::Fail`].
#[derive(Debug)]
pub struct Chunks {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    ended: bool,
}

impl Chunks {
    /// A body read from `rx`.
    pub fn new(rx: tokio::sync::mpsc::Receiver<Chunk>) -> Self {
        Self { rx, ended: false }
    }

    fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        Poll::Ready(match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(Chunk::Data(b)) => Some(Ok(hyper::body::Frame::data(b))),
            Some(Chunk::End) => {
                self.ended = true;
                None
            }
            Some(Chunk::Fail(e)) => Some(Err(e)),
            None => Some(Err(std::io::Error::other(
                "the table's writer stopped before the table's end",
            ))),
        })
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Body::Full(f) => std::pin::Pin::new(f)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Body::Stream(chunks) => chunks.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(f) => f.is_end_stream(),
            Body::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Full(f) => f.size_hint(),
            Body::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// A whole response.
pub fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Body::Full(Full::new(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A JSON response.
pub fn json_reply(status: StatusCode, v: serde_json::Value) -> Resp {
    reply(status, "application/json", v.to_string())
}

/// An error as `{"error": msg}`.
pub fn error(status: StatusCode, msg: impl Into<String>) -> Resp {
    json_reply(status, json!({ "error": msg.into() }))
}

/// 404 for a table name that is not in the registry: the name asked
/// for, what it most likely meant, and the tables (`GET /api/v1/tables`
/// lists them too).
pub fn no_such_table(name: &str) -> Resp {
    error(StatusCode::NOT_FOUND, crate::tables::not_found(name))
}
