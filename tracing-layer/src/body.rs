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

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
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

pin_project_lite::pin_project! {
    /// A response body that, dropped after it began to be sent and before
    /// its end, records [`FIELD`] `= true` on the span that was current
    /// when it was made (see the module's documentation).
    #[derive(Debug)]
    pub struct CutBody<B>
    where
        B: Body,
    {
        #[pin]
        inner: B,
        span: tracing::Span,
        // A frame was asked for: the response's head is out.
        started: bool,
        // Its end, or an error, was reached.
        ended: bool,
        // Bytes left of a body of known length (its exact size hint when
        // it was made): all sent is its end, whether or not it is polled
        // again (hyper stops at the length).
        left: Option<u64>,
    }

    impl<B> PinnedDrop for CutBody<B>
    where
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.started && !*this.ended && !this.inner.is_end_stream() {
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
            started: false,
            ended: false,
        }
    }
}

impl<B: Body> Body for CutBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        *this.started = true;
        let frame = ready!(this.inner.poll_frame(cx));
        // The end; or an error, which tower-http reports as a failure.
        let ended = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(f)) => {
                if let (Some(left), Some(data)) = (this.left.as_mut(), f.data_ref()) {
                    *left = left.saturating_sub(data.remaining() as u64);
                }
                f.is_trailers() || *this.left == Some(0)
            }
        };
        *this.ended |= ended;
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
