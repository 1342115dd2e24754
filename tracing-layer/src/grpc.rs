//! Layer 0. A request span for a gRPC server (tonic, or any server behind
//! tower-http's `TraceLayer::new_for_grpc()`) that names the RPC from the
//! request path (feature `http`).
//!
//! A gRPC path is `/<package.Service>/<Method>`; the span's `rpc` field
//! is `package.Service/Method`, which the default rules
//! ([`crate::StatementRule::grpc`]) make `statement/grpc/<rpc>`. The path
//! comes from the client: a scanner sending made-up paths would name as
//! many classes, up to the layer's bound (then they fold into
//! `statement/grpc/unknown`, counted lost). [`make_span_for`] names only
//! the methods the server has, so the bound is never reached.

/// The target of the spans this module creates.
pub const TARGET: &str = "pfs_tracing::grpc";

/// The RPC a gRPC request path names: `package.Service/Method` for
/// `/package.Service/Method`, or `None` for a path that is not one (not two
/// non-empty parts, or characters other than ASCII letters, digits, `_`
/// and `.`).
///
/// ```
/// use pfs_tracing::grpc::rpc_name;
/// assert_eq!(rpc_name("/shop.Cart/AddItem"), Some("shop.Cart/AddItem"));
/// assert_eq!(rpc_name("/shop.Cart"), None);
/// assert_eq!(rpc_name("/../etc/passwd"), None);
/// ```
pub fn rpc_name(path: &str) -> Option<&str> {
    let rpc = path.strip_prefix('/')?;
    let (service, method) = rpc.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    };
    (ok(service) && ok(method) && !service.starts_with('.')).then_some(rpc)
}

/// A span `grpc_request` at INFO level with fields `rpc` ([`rpc_name`] of
/// the request path; absent for a path that is not a gRPC method's) and
/// `uri`. Use it as
/// `TraceLayer::new_for_grpc().make_span_with(pfs_tracing::grpc::make_span)`
/// (with tonic: `Server::builder().layer(...)`): tower-http's gRPC
/// classifier then reports every non-OK `grpc-status` as a failure, which
/// the default rule counts as an error. A call completes with its
/// `grpc-status` (in the response's headers, or its stream's trailers): a
/// response stream the client drops before its trailers is cancelled, as
/// a call whose future is dropped is.
///
/// ```
/// let req = http::Request::post("/shop.Cart/AddItem").body(()).unwrap();
/// let span = pfs_tracing::grpc::make_span(&req);
/// # let _ = span;
/// ```
pub fn make_span<B>(request: &::http::Request<B>) -> tracing::Span {
    span(request, rpc_name(request.uri().path()))
}

/// [`make_span`] naming only the RPCs in `methods` (`package.Service/Method`,
/// with or without the leading `/`); any other path is `rpc`-less, so its
/// statement is `statement/grpc/unknown`: the classes are the server's
/// methods, whatever paths clients send.
///
/// ```
/// static METHODS: &[&str] = &["shop.Cart/AddItem", "/shop.Cart/Checkout"];
/// let make_span = pfs_tracing::grpc::make_span_for(METHODS);
/// let req = http::Request::post("/shop.Cart/Checkout").body(()).unwrap();
/// let span = make_span(&req);
/// # let _ = span;
/// ```
pub fn make_span_for<B>(
    methods: &'static [&'static str],
) -> impl Fn(&::http::Request<B>) -> tracing::Span + Clone {
    move |request: &::http::Request<B>| {
        let rpc = rpc_name(request.uri().path())
            .filter(|rpc| methods.iter().any(|m| m.trim_start_matches('/') == *rpc));
        span(request, rpc)
    }
}

fn span<B>(request: &::http::Request<B>, rpc: Option<&str>) -> tracing::Span {
    tracing::info_span!(target: TARGET, "grpc_request", rpc, uri = %request.uri())
}
