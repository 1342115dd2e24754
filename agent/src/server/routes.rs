//! Which request goes where: the path picks a route (404 if none), the
//! route's methods are checked (405 with an `Allow` header otherwise, before
//! any token: a 405 only tells that the path exists), then its token, then
//! its query string.
//!
//! | method | path | answer |
//! |--------|------|--------|
//! | GET | `/` | the landing page (HTML; no data, so no token: see [`landing`]) |
//! | GET | `/metrics` | OpenMetrics text, or what the `Accept` header prefers: Prometheus protobuf with native histograms, or the classic text format |
//! | GET | `/healthz` | `ok`, or 503 and why if the background discovery is stuck ([`AppState::unhealthy`]); `ok` and a `degraded:` line if it cannot list the segment directory ([`AppState::degraded`]) |
//! | GET | `/api/v1/tables` | `{"tables": [...]}` |
//! | GET | `/api/v1/tables/{table}?service=S&pid=N` | `{"table", "columns", "rows"}` (chunked), and `"warning"` if no segment matches `service`/`pid` |
//! | POST | `/api/v1/setup/{instruments,consumers,timers,actors}[?service=S&pid=N]` | `{"matched": n, "segments": m}` |
//! | POST | `/api/v1/tables/{table}/truncate` | `{"truncated": table, "errors": [...]}` |
//!
//! Every GET path also answers HEAD. A path is split at its `/` first,
//! then each segment is percent-decoded, so `/api/v1/tables/%74hreads` is
//! `threads` (and `/%68ealthz` the health check), while an encoded slash
//! is part of a name, never a separator (`/api/v1/tables/threads%2Ftruncate`
//! names no table: 404). Query values are percent-decoded as a form would
//! encode them (`%20` or `+` for a space, `%2F` for `/`), so
//! `?service=orders%20api%2Fv2` matches the service `orders api/v2`; each
//! parameter may appear once. A path or query that is not UTF-8 once
//! decoded gets 400, and a path and query longer than [`MAX_URI_BYTES`]
//! together get 414, both with a JSON error (a request head longer than
//! [`MAX_HEADER_BYTES`](super::MAX_HEADER_BYTES) never gets here: see
//! [`super`]).

use std::borrow::Cow;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{ALLOW, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use serde_json::json;

use super::MAX_URI_BYTES;
use super::body::{Resp, error, json_reply, no_such_table, reply};
use super::control;
use super::landing;
use super::state::AppState;
use super::stream::stream_table;
use crate::export::prometheus::Exposition;
use crate::filter::Filter;
use crate::tables::{self, PfsTable};

/// The setup tables that `POST /api/v1/setup/{what}` changes.
const SETUP_TABLES: [&str; 4] = ["instruments", "consumers", "timers", "actors"];

/// A query string that is not `service=S` and/or `pid=N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `pid=` is not a process id (the decoded value).
    #[error("pid must be a positive integer (a process id), got {0:?}")]
    Pid(String),
    /// Another parameter (its decoded name).
    #[error("unknown query parameter {0:?}; use service= or pid=")]
    Unknown(String),
    /// A parameter given more than once.
    #[error(
        "query parameter {0:?} is given more than once; give it once (a filter selects one {0})"
    )]
    Repeated(&'static str),
    /// A name or value whose percent-decoding is not UTF-8 (as sent).
    #[error("query parameter {0:?} is not UTF-8 once percent-decoded; percent-encode UTF-8 text")]
    NotUtf8(String),
}

/// Percent-decodes `raw` (a path segment, or a query part with its `+`
/// already read), or `None` if the result is not UTF-8.
fn percent_decode(raw: &str) -> Option<Cow<'_, str>> {
    percent_encoding::percent_decode_str(raw).decode_utf8().ok()
}

/// Percent-decodes a query string's name or value, reading `+` as a space
/// (as HTML forms and `URLSearchParams` encode them).
fn decode(raw: &str) -> Result<String, QueryError> {
    percent_decode(&raw.replace('+', " "))
        .map(Cow::into_owned)
        .ok_or_else(|| QueryError::NotUtf8(raw.to_string()))
}

/// The [`Filter`] of a query string (`service=S&pid=N`, percent-decoded;
/// each at most once).
pub fn parse_filter(query: Option<&str>) -> Result<Filter, QueryError> {
    let mut f = Filter::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (decode(k)?, decode(v)?);
        match k.as_str() {
            "service" if f.service.is_some() => return Err(QueryError::Repeated("service")),
            "pid" if f.pid.is_some() => return Err(QueryError::Repeated("pid")),
            "service" => f.service = Some(v),
            // Digits only: `parse` would take `+5` (as `%2B5`) too.
            "pid" => match v.parse::<u32>() {
                Ok(p) if p > 0 && v.bytes().all(|b| b.is_ascii_digit()) => f.pid = Some(p),
                _ => return Err(QueryError::Pid(v)),
            },
            _ => return Err(QueryError::Unknown(k)),
        }
    }
    Ok(f)
}

/// What a path names.
#[derive(Clone, Copy)]
enum Route {
    Landing,
    Healthz,
    Metrics,
    TableList,
    Table(&'static dyn PfsTable),
    Truncate(&'static dyn PfsTable),
    /// One of [`SETUP_TABLES`].
    Setup(&'static str),
}

/// Who may use a route, and with which methods.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// GET/HEAD, no token (probes, the landing page).
    Open,
    /// GET/HEAD, with the read token if one is configured.
    Read,
    /// POST, with the control token.
    Control,
}

impl Access {
    fn allows(self, m: &Method) -> bool {
        match self {
            Access::Open | Access::Read => m == Method::GET || m == Method::HEAD,
            Access::Control => m == Method::POST,
        }
    }

    /// The `Allow` header's value.
    fn allow(self) -> &'static str {
        match self {
            Access::Open | Access::Read => "GET, HEAD",
            Access::Control => "POST",
        }
    }
}

impl Route {
    fn access(&self) -> Access {
        match self {
            Route::Landing | Route::Healthz => Access::Open,
            Route::Metrics | Route::TableList | Route::Table(_) => Access::Read,
            Route::Truncate(_) | Route::Setup(_) => Access::Control,
        }
    }
}

/// Whether `path` is the health check's (which has a connection slot of
/// its own).
pub(crate) fn is_healthz(path: &str) -> bool {
    matches!(route(path), Ok(Route::Healthz))
}

/// The route of `path`, or the error to send: 404, or 400 if the path is
/// not UTF-8 once percent-decoded. The path is split at its `/`, then each
/// segment decoded (`%2F` stays within its segment); one trailing slash is
/// ignored (`/api/v1/tables/threads/` is the table).
fn route(path: &str) -> Result<Route, Box<Resp>> {
    let path = match path.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => path,
    };
    let not_found = || {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "not found; try /, /metrics, /healthz or /api/v1/tables (control: POST \
             /api/v1/setup/{instruments,consumers,timers,actors} or \
             /api/v1/tables/{table}/truncate)",
        ))
    };
    // `*` (as in `OPTIONS *`) is the one target without a leading slash.
    let Some(segments) = path.strip_prefix('/') else {
        return Err(not_found());
    };
    let decoded = segments
        .split('/')
        .map(percent_decode)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            Box::new(error(
                StatusCode::BAD_REQUEST,
                "the path is not UTF-8 once percent-decoded; percent-encode UTF-8 text",
            ))
        })?;
    let segments: Vec<&str> = decoded.iter().map(|s| &**s).collect();
    let table = |name: &str| tables::lookup(name).ok_or_else(|| Box::new(no_such_table(name)));
    Ok(match segments.as_slice() {
        [""] => Route::Landing,
        ["healthz"] => Route::Healthz,
        ["metrics"] => Route::Metrics,
        ["api", "v1", "tables"] => Route::TableList,
        ["api", "v1", "tables", name] => Route::Table(table(name)?),
        ["api", "v1", "tables", name, "truncate"] => Route::Truncate(table(name)?),
        ["api", "v1", "tables", rest @ ..] => return Err(Box::new(no_such_table(&rest.join("/")))),
        ["api", "v1", "setup", what @ ..] => {
            let what = what.join("/");
            match SETUP_TABLES.iter().find(|s| **s == what) {
                Some(s) => Route::Setup(s),
                None => {
                    return Err(Box::new(error(
                        StatusCode::NOT_FOUND,
                        format!(
                            "no setup table {what:?}; POST to /api/v1/setup/{{{}}}",
                            SETUP_TABLES.join(",")
                        ),
                    )));
                }
            }
        }
        _ => return Err(not_found()),
    })
}

/// 414 if `uri`'s path and query are longer than [`MAX_URI_BYTES`]
/// together.
fn uri_too_long(uri: &Uri) -> Option<Resp> {
    let len = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    (len > MAX_URI_BYTES).then(|| {
        error(
            StatusCode::URI_TOO_LONG,
            format!(
                "the URL's path and query are {len} bytes long, more than the {MAX_URI_BYTES} \
                 accepted; shorten them (the only query parameters are service= and pid=, each once)"
            ),
        )
    })
}

/// 405 for `method` on `path`, whose route is `r`, with the `Allow` header
/// and a hint at what to do instead.
fn method_not_allowed(method: &Method, path: &str, r: Route) -> Resp {
    let access = r.access();
    let hint = match r {
        Route::Setup(what) => format!(
            "; it changes setup_{what} (with the control token), \
             GET /api/v1/tables/setup_{what} reads it"
        ),
        Route::Truncate(t) => format!(
            "; it runs TRUNCATE TABLE (with the control token), GET /api/v1/tables/{} reads the table",
            t.name()
        ),
        _ => String::new(),
    };
    let mut resp = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not allowed on {path}: use {}{hint}",
            access.allow().replace(", ", " or ")
        ),
    );
    resp.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(access.allow()));
    resp
}

/// Answers one request.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    if let Some(too_long) = uri_too_long(req.uri()) {
        return too_long;
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let r = match route(&path) {
        Ok(r) => r,
        Err(not_found) => return *not_found,
    };
    let access = r.access();
    if !access.allows(req.method()) {
        return method_not_allowed(req.method(), &path, r);
    }
    let authorized = match access {
        Access::Open => Ok(()),
        Access::Read => state.tokens.authorize_read(&req),
        Access::Control => state.tokens.authorize(&req),
    };
    if let Err(refusal) = authorized {
        return *refusal;
    }
    let filter = match r {
        Route::Table(_) | Route::Setup(_) => match parse_filter(query.as_deref()) {
            Ok(f) => f,
            Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
        },
        Route::Truncate(t) if query.as_deref().is_some_and(|q| !q.is_empty()) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "TRUNCATE applies to every process: POST /api/v1/tables/{}/truncate takes no query parameters",
                    t.name()
                ),
            );
        }
        _ => Filter::default(),
    };
    match r {
        Route::Landing => landing::page(),
        Route::Healthz => match state.unhealthy() {
            None => match state.degraded() {
                None => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
                Some(why) => reply(
                    StatusCode::OK,
                    "text/plain; charset=utf-8",
                    format!("ok\n{why}"),
                ),
            },
            Some(why) => {
                tracing::warn!("/healthz answers 503: {}", why.trim_end());
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    why,
                )
            }
        },
        Route::Metrics => {
            let accept = req.headers().get(hyper::header::ACCEPT);
            let exposition = Exposition::from_accept(accept.and_then(|v| v.to_str().ok()));
            let content_type = exposition.content_type();
            if let Some(body) = state.metrics.fresh(exposition) {
                return reply(StatusCode::OK, content_type, body);
            }
            let s = state.clone();
            match tokio::task::spawn_blocking(move || s.metrics.render(exposition)).await {
                Ok(Ok(body)) => reply(StatusCode::OK, content_type, body),
                _ => error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed"),
            }
        }
        Route::TableList => json_reply(StatusCode::OK, json!({ "tables": tables::names() })),
        Route::Table(table) => {
            let s = state.clone();
            let baselines = move || s.baselines().clone();
            stream_table(
                &state.table_streams,
                state.snap.clone(),
                baselines,
                table,
                filter,
            )
            .await
        }
        Route::Truncate(table) => control::truncate(state, table.name()).await,
        Route::Setup(what) => control::setup(state, req, what, filter).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_from_query_strings() {
        assert_eq!(parse_filter(None), Ok(Filter::default()));
        assert_eq!(
            parse_filter(Some("service=a&pid=7")),
            Ok(Filter {
                service: Some("a".into()),
                pid: Some(7)
            })
        );
        assert_eq!(
            parse_filter(Some("pid=x")),
            Err(QueryError::Pid("x".into()))
        );
        assert_eq!(
            parse_filter(Some("host=h")),
            Err(QueryError::Unknown("host".into()))
        );
    }

    #[test]
    fn query_strings_are_percent_decoded() {
        let service = |q| parse_filter(Some(q)).map(|f| f.service);
        assert_eq!(
            service("service=kvstore%2Ddemo"),
            Ok(Some("kvstore-demo".into()))
        );
        for q in [
            "service=orders%20api%2Fv2",
            "service=orders+api/v2",
            "service=orders%20api/v2",
            "%73ervice=orders+api%2fv2",
        ] {
            assert_eq!(service(q), Ok(Some("orders api/v2".into())), "{q}");
        }
        assert_eq!(service("service=a%2Bb"), Ok(Some("a+b".into())));
        assert_eq!(service("service=caf%C3%A9"), Ok(Some("café".into())));
        assert_eq!(
            service("service=100%"),
            Ok(Some("100%".into())),
            "a lone % stays"
        );
        assert_eq!(
            service("service=%FF"),
            Err(QueryError::NotUtf8("%FF".into()))
        );
        assert_eq!(
            parse_filter(Some("pid=%2013080")),
            Err(QueryError::Pid(" 13080".into())),
            "the decoded value is echoed"
        );
        assert_eq!(
            parse_filter(Some("pid=%31%33")).map(|f| f.pid),
            Ok(Some(13))
        );
        assert_eq!(
            parse_filter(Some("pid=%2B5")),
            Err(QueryError::Pid("+5".into())),
            "digits only, as a literal `+5` (a space) is refused"
        );
        assert_eq!(
            parse_filter(Some("ho%73t=h")),
            Err(QueryError::Unknown("host".into()))
        );
    }

    #[test]
    fn bad_pids_and_repeats_are_refused() {
        for pid in ["-1", "0", "", "1.5", "4294967296"] {
            let e = parse_filter(Some(&format!("pid={pid}"))).unwrap_err();
            assert_eq!(e, QueryError::Pid(pid.into()));
            assert!(e.to_string().contains("positive integer"), "{e}");
        }
        let e = parse_filter(Some("service=a&service=b")).unwrap_err();
        assert_eq!(e, QueryError::Repeated("service"));
        assert!(e.to_string().contains("\"service\""), "{e}");
        assert_eq!(
            parse_filter(Some("pid=1&service=a&pid=1")),
            Err(QueryError::Repeated("pid"))
        );
    }

    #[test]
    fn paths_route_and_methods_are_checked() {
        let access = |p| route(p).map(|r| r.access()).ok();
        assert!(access("/") == Some(Access::Open));
        assert!(access("/healthz") == Some(Access::Open));
        assert!(access("/metrics") == Some(Access::Read));
        assert!(access("/api/v1/tables/") == Some(Access::Read));
        assert!(access("/api/v1/tables/threads") == Some(Access::Read));
        assert!(access("/api/v1/tables/threads/truncate") == Some(Access::Control));
        assert!(access("/api/v1/setup/instruments") == Some(Access::Control));
        // One trailing slash is ignored.
        assert!(is_healthz("/healthz") && is_healthz("/healthz/"));
        assert!(!is_healthz("/healthz//") && !is_healthz("/metrics"));
        assert!(access("/metrics/") == Some(Access::Read));
        assert!(access("/api/v1/tables/threads/") == Some(Access::Read));
        assert!(access("/api/v1/tables/threads/truncate/") == Some(Access::Control));
        for p in [
            "/api/v1/tables//",
            "/api/v1/tables/threads//",
            "/nope",
            "/api/v1/tables/nope",
            "/api/v1/tables/nope/truncate",
            "/api/v1/tables/threads/x",
            "/api/v1/setup/nope",
            "/api/v1/setup/",
        ] {
            assert_eq!(
                route(p).err().map(|r| r.status()),
                Some(StatusCode::NOT_FOUND),
                "{p}"
            );
        }
        let r = route("/api/v1/setup/timers").ok().unwrap();
        let resp = method_not_allowed(&Method::GET, "/api/v1/setup/timers", r);
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers()[ALLOW], "POST");
        assert!(Access::Read.allows(&Method::HEAD));
        assert!(!Access::Read.allows(&Method::POST));
        assert!(!Access::Control.allows(&Method::GET));
    }

    #[test]
    fn paths_are_percent_decoded_segment_by_segment() {
        let access = |p| route(p).map(|r| r.access()).ok();
        let table = |p| match route(p) {
            Ok(Route::Table(t) | Route::Truncate(t)) => Some(t.name()),
            _ => None,
        };
        assert_eq!(table("/api/v1/tables/%74hreads"), Some("threads"));
        assert_eq!(table("/api/v1/tables/thread%73/"), Some("threads"));
        assert_eq!(
            table("/%61pi/v1/tables/threads/%74runcate"),
            Some("threads")
        );
        assert!(access("/api/v1/tables/threads/%74runcate") == Some(Access::Control));
        assert!(access("/api/v1/setup/%74imers") == Some(Access::Control));
        assert!(access("/%6detrics") == Some(Access::Read));
        assert!(access("/api/v1/%74ables") == Some(Access::Read));
        // The health check's own slot follows the same rule.
        assert!(is_healthz("/%68ealthz") && is_healthz("/%68ealth%7A/"));
        // An encoded slash is part of a name, never a separator, and a
        // lone `%` stays as it is.
        assert!(!is_healthz("/healthz%2F") && !is_healthz("/%2Fhealthz"));
        for p in [
            "/healthz%2F",
            "/%2F",
            "/api%2Fv1/tables",
            "/api/v1/tables%2Fthreads",
            "/api/v1/tables/threads%2Ftruncate",
            "/api/v1/tables/threads%2F",
            "/api/v1/setup/timers%2F",
            "/api/v1/tables/100%",
        ] {
            assert_eq!(
                route(p).err().map(|r| r.status()),
                Some(StatusCode::NOT_FOUND),
                "{p}"
            );
        }
        // Not UTF-8 once decoded: the request is wrong, not the route.
        for p in ["/api/v1/tables/%FF", "/%C3", "/healthz/%E2%82"] {
            assert_eq!(
                route(p).err().map(|r| r.status()),
                Some(StatusCode::BAD_REQUEST),
                "{p}"
            );
        }
        assert!(!is_healthz("/%FF"));
    }

    /// The body of a whole response, as text.
    fn text(r: Resp) -> String {
        use http_body_util::BodyExt;
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let body = rt.block_on(r.into_body().collect()).unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[test]
    fn urls_longer_than_the_limit_get_414_and_why() {
        let prefix = "/api/v1/tables/threads?service=";
        let uri = |len: usize| {
            format!("{prefix}{}", "a".repeat(len - prefix.len()))
                .parse::<Uri>()
                .unwrap()
        };
        assert!(uri_too_long(&uri(MAX_URI_BYTES)).is_none());
        let r = uri_too_long(&uri(MAX_URI_BYTES + 1)).expect("414");
        assert_eq!(r.status(), StatusCode::URI_TOO_LONG);
        assert_eq!(r.headers()[hyper::header::CONTENT_TYPE], "application/json");
        let body: serde_json::Value = serde_json::from_str(&text(r)).unwrap();
        let e = body["error"].as_str().unwrap();
        assert!(
            e.contains(&format!("{} bytes", MAX_URI_BYTES + 1))
                && e.contains(&MAX_URI_BYTES.to_string())
                && e.contains("shorten"),
            "{e}"
        );
        // The path counts too, whatever it names.
        let long_path = format!("/{}", "x".repeat(MAX_URI_BYTES))
            .parse::<Uri>()
            .unwrap();
        assert!(uri_too_long(&long_path).is_some());
    }
}
