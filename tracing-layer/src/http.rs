//! Layer 0. A request span for tower-http's `TraceLayer` that names the
//! route (feature `http`; the route from axum's `MatchedPath` with feature
//! `axum`).

/// The target of the spans [`make_span`] creates.
pub const TARGET: &str = "pfs_tracing::http";

/// A span `request` at INFO level with fields `method`, `uri`, `version`,
/// with feature `axum` `route` (axum's `MatchedPath`, absent for a
/// request no route matched), and `body_cut` (empty until
/// [`crate::CutBodyLayer`] records that the response's body was cut
/// short): what the default rules
/// ([`crate::StatementRule::http`]) make a `statement/http/<METHOD> <route>`.
/// `method` is one of the nine methods of RFC 9110 and RFC 5789, or
/// `_OTHER` (as OpenTelemetry's `http.request.method`): a client inventing
/// methods cannot make classes, as one requesting unknown paths cannot.
/// Use it as `TraceLayer::new_for_http().make_span_with(pfs_tracing::http::make_span)`,
/// in a layer added with axum's `Router::layer` (inside the router, where
/// `MatchedPath` is known).
///
/// INFO, not tower-http's default DEBUG, so that a subscriber filtered at
/// INFO still creates it: a `fmt` layer at INFO then prefixes the lines
/// logged inside a request with `request{method=GET uri=/users/7 ...}`
/// (filter `pfs_tracing::http=warn` out of it to keep its lines as they
/// were: the span is still created for the pfs layer). Its fields print as
/// tower-http's own span prints them (`method=GET`, unquoted).
///
/// ```
/// let req = http::Request::get("/users/7").body(()).unwrap();
/// let span = pfs_tracing::http::make_span(&req);
/// # let _ = span;
/// assert_eq!(pfs_tracing::http::method_name(&http::Method::PATCH), "PATCH");
/// let made_up = http::Method::from_bytes(b"X42").unwrap();
/// assert_eq!(pfs_tracing::http::method_name(&made_up), "_OTHER");
/// ```
pub fn make_span<B>(request: &::http::Request<B>) -> tracing::Span {
    #[cfg(feature = "axum")]
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str);
    #[cfg(not(feature = "axum"))]
    let route: Option<&str> = None;
    tracing::info_span!(
        target: TARGET,
        "request",
        method = %method_name(request.method()),
        uri = %request.uri(),
        version = ?request.version(),
        route,
        body_cut = tracing::field::Empty,
    )
}

/// A request method as [`make_span`] records it: a standard method's name,
/// else `_OTHER`.
pub fn method_name(m: &::http::Method) -> &str {
    match m.as_str() {
        known @ ("GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "CONNECT" | "OPTIONS" | "TRACE"
        | "PATCH") => known,
        _ => "_OTHER",
    }
}
