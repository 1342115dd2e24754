//! Layer 0. Telling a response sent whole from one cut short (feature
//! `http`). A request's statement ends when tower-http's span closes:
//! once the response body is sent, or when hyper drops it because the
//! client hung up. tower-http says nothing of which: its end-of-stream
//! event does not come for every body. [`CutBodyLayer`], inside the
//! `TraceLayer`, wraps each response body; one dropped after it began to
//! be sent and before its end records [`FIELD`] `= true` on the request
//! span, which the default rules read as cancelled (a download or an
//! event stream whose client went away). A body that was never polled
//! (`HEAD`, `204`, `304`, or a client gone before the head) records
//! nothing: it was not cut.
//!
//! hyper takes a body given whole (a `Vec`, a `String`: one frame) at
//! once and drops it, before the bytes are written: the span would close
//! then, and a client hanging up during the download would go unseen. So
//! the wrapper hands data on in pieces of [`PIECE_BYTES`]: hyper asks for
//! the next one as its buffer drains, and the body, with the span, lives
//! until its last piece is handed on. That is the last byte, give or take
//! what hyper and the kernel buffer for a slow client (a few megabytes on
//! Linux's loopback and LAN defaults): a download shorter than that ends
//! its statement when it is handed over whole, and a hang-up then is not
//! seen.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

/// The request span's field a cut body records (`true`): declared empty
/// by the `http` module's span, and read by the HTTP default rule
/// (`StatementRule::cut`).
pub const FIELD: &str = "body_cut";

/// A `tower` layer that wraps each response body in a [`CutBody`]. Put it
/// inside tower-http's `TraceLayer`, so that the request span is the
/// current span when the response is made: with axum's `Router::layer`,
/// `.layer(CutBodyLayer)` *before* `.layer(TraceLayer::...)` (the layer
/// added last is the outermost); with tonic's `Server::builder().layer`
/// or tower's `ServiceBuilder`, *after* it (the first is the outermost).
/// Outside the `TraceLayer` it records nothing (the span current then is
/// not the request's).
///
/// ```
/// use pfs_tracing::CutBodyLayer;
/// use tower_http::trace::TraceLayer;
///
/// let app: axum::Router = axum::Router::new()
///     .route("/export", axum::routing::get(|| async { "a long body" }))
///     .layer(CutBodyLayer)
///     .layer(TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span));
/// # let _ = app;
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CutBodyLayer;

impl<S> tower_layer::Layer<S> for CutBodyLayer {
    type Service = CutBodyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CutBodyService { inner }
    }
}

/// The service of [`CutBodyLayer`]: `inner`'s responses, their bodies
/// wrapped.
#[derive(Clone, Debug)]
pub struct CutBodyService<S> {
    inner: S,
}

impl<S, Req, B> tower_service::Service<Req> for CutBodyService<S>
where
    S: tower_service::Service<Req, Response = http::Response<B>>,
    B: Body,
{
    type Response = http::Response<CutBody<B>>;
    type Error = S::Error;
    type Future = CutBodyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        CutBodyFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`CutBodyService`].
    #[derive(Debug)]
    pub struct CutBodyFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, B, E> Future for CutBodyFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    B: Body,
{
    type Output = Result<http::Response<CutBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let res = ready!(self.project().inner.poll(cx));
        // Made now, inside the `TraceLayer`'s poll: its span is current.
        Poll::Ready(res.map(|r| r.map(CutBody::new)))
    }
}

/// The most bytes [`CutBody`] hands on at once: a body given whole (a
/// `Vec`, a `String`: one frame) goes out in pieces of this size, so that
/// it stays alive, and its span open, while a slow client reads it, and
/// a client that hangs up during it is seen.
pub const PIECE_BYTES: usize = 64 * 1024;

pin_project_lite::pin_project! {
    /// A response body that, dropped after it began to be sent and before
    /// its end, records [`FIELD`] `= true` on the span that was current
    /// when it was made (see the module's documentation). Its data goes
    /// out in pieces of at most [`PIECE_BYTES`].
    #[derive(Debug)]
    pub struct CutBody<B>
    where
        B: Body,
    {
        #[pin]
        inner: B,
        span: tracing::Span,
        // What is left of the last frame taken from `inner`.
        rest: Bytes,
        // A frame was asked for: the response's head is out.
        started: bool,
        // Its end, or an error, was reached.
        ended: bool,
        // Bytes left of a body of known length (its exact size hint when
        // it was made): all handed on is its end, whether or not it is
        // polled again (hyper stops at the length).
        left: Option<u64>,
    }

    impl<B> PinnedDrop for CutBody<B>
    where
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let at_end = this.rest.is_empty() && this.inner.is_end_stream();
            if *this.started && !*this.ended && !at_end {
                this.span.record(FIELD, true);
            }
        }
    }
}

impl<B: Body> CutBody<B> {
    /// `inner`, for the current span.
    pub fn new(inner: B) -> Self {
        Self {
            left: inner.size_hint().exact(),
            inner,
            span: tracing::Span::current(),
            rest: Bytes::new(),
            started: false,
            ended: false,
        }
    }
}

impl<B: Body> Body for CutBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        *this.started = true;
        let piece = if this.rest.is_empty() {
            match ready!(this.inner.poll_frame(cx)) {
                // The end; or an error, which tower-http reports as a
                // failure.
                None => {
                    *this.ended = true;
                    return Poll::Ready(None);
                }
                Some(Err(e)) => {
                    *this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        *this.rest = data.copy_to_bytes(data.remaining());
                        let n = this.rest.len().min(PIECE_BYTES);
                        this.rest.split_to(n)
                    }
                    Err(frame) => {
                        *this.ended |= frame.is_trailers();
                        let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                        return Poll::Ready(Some(Ok(frame)));
                    }
                },
            }
        } else {
            let n = this.rest.len().min(PIECE_BYTES);
            this.rest.split_to(n)
        };
        if let Some(left) = this.left.as_mut() {
            *left = left.saturating_sub(piece.len() as u64);
            *this.ended |= *left == 0;
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint.set_lower(inner.lower().saturating_add(rest));
        hint
    }
}
