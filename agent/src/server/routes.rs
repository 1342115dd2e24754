//! Which request goes where.
//!
//! | method | path | answer |
//! |--------|------|--------|
//! | GET | `/` | the landing page (HTML; no data, so no token: see [`landing`]) |
//! | GET | `/metrics` | OpenMetrics text, or Prometheus protobuf with native histograms if the `Accept` header asks for it |
//! | GET | `/healthz` | `ok` |
//! | GET | `/api/v1/tables` | `{"tables": [...]}` |
//! | GET | `/api/v1/tables/{table}?service=S&pid=N` | `{"table", "columns", "rows"}` (chunked) |
//! | POST | `/api/v1/setup/{instruments,consumers,timers,actors}[?service=S&pid=N]` | `{"matched": n, "segments": m}` |
//! | POST | `/api/v1/tables/{table}/truncate` | `{"truncated": table}` |

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde_json::json;

use super::body::{Resp, error, json_reply, no_such_table, reply};
use super::control;
use super::landing;
use super::state::AppState;
use super::stream::stream_table;
use crate::export::prometheus::Exposition;
use crate::filter::Filter;
use crate::tables;

/// A query string that is not `service=S` and/or `pid=N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// `pid=` is not a number.
    #[error("pid must be a number, got {0:?}")]
    Pid(String),
    /// Another parameter.
    #[error("unknown query parameter {0:?}; use service= or pid=")]
    Unknown(String),
}

/// The [`Filter`] of a query string (`service=S&pid=N`).
pub fn parse_filter(query: Option<&str>) -> Result<Filter, QueryError> {
    let mut f = Filter::default();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "service" => f.service = Some(v.to_string()),
            "pid" => f.pid = Some(v.parse().map_err(|_| QueryError::Pid(v.to_string()))?),
            _ => return Err(QueryError::Unknown(k.to_string())),
        }
    }
    Ok(f)
}

async fn post(
    state: Arc<AppState>,
    req: Request<Incoming>,
    path: &str,
    query: Option<&str>,
) -> Resp {
    if let Err(refusal) = state.tokens.authorize(&req) {
        return *refusal;
    }
    let filter = match parse_filter(query) {
        Ok(f) => f,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    if let Some(table) = path
        .strip_prefix("/api/v1/tables/")
        .and_then(|t| t.strip_suffix("/truncate"))
    {
        return control::truncate(state, table).await;
    }
    match path.strip_prefix("/api/v1/setup/") {
        Some(what) => control::setup(state, req, what, filter).await,
        None => error(
            StatusCode::NOT_FOUND,
            "control paths: /api/v1/setup/{instruments,consumers,timers,actors}, /api/v1/tables/{table}/truncate",
        ),
    }
}

/// Answers one request.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    if req.method() == Method::POST {
        return post(state, req, &path, query.as_deref()).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET reads; POST changes setup or truncates",
        );
    }
    // `/healthz` (probes) and the landing page (links, no data) are open.
    if path != "/healthz"
        && path != "/"
        && let Err(refusal) = state.tokens.authorize_read(&req)
    {
        return *refusal;
    }
    match path.as_str() {
        "/" => landing::page(),
        "/healthz" => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        "/metrics" => {
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
        "/api/v1/tables" | "/api/v1/tables/" => {
            json_reply(StatusCode::OK, json!({ "tables": tables::names() }))
        }
        p if p.starts_with("/api/v1/tables/") => {
            let name = p.trim_start_matches("/api/v1/tables/");
            let filter = match parse_filter(query.as_deref()) {
                Ok(f) => f,
                Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
            };
            match tables::lookup(name) {
                Some(table) => stream_table(state, table, filter),
                None => no_such_table(),
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "not found; try /, /metrics, /healthz or /api/v1/tables",
        ),
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
}
