//! Control requests (POST): live setup changes and `TRUNCATE TABLE`, each
//! allowed only with the control token. Nothing changes unless the token
//! matches, and a change that names nothing that exists (an unknown
//! timer or event kind) is refused with 400 before any segment is touched.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::json;

use super::body::{Resp, error, json_reply, no_such_table};
use super::state::AppState;
use crate::filter::Filter;
use crate::setup::{self, Change};
use crate::tables;

/// Largest control request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// `POST /api/v1/tables/{table}/truncate`: the table's baselines as of a
/// fresh snapshot, saved in the segment directory.
pub async fn truncate(state: Arc<AppState>, name: &str) -> Resp {
    let Some(table) = tables::lookup(name) else {
        return no_such_table(name);
    };
    let s = state.clone();
    let r = tokio::task::spawn_blocking(move || {
        let snap = s.snap.take();
        let mut b = s.baselines();
        let unreached = table.truncate(&mut b, &snap)?;
        // A cached snapshot older than these baselines would show the rows
        // before the truncation minus the counts at it: the next read
        // takes a fresh one.
        s.snap.invalidate();
        if let Some(dir) = &s.baselines_dir
            && let Err(e) = b.save(dir)
        {
            tracing::warn!(dir = %crate::util::shown::path(dir), error = %e, "cannot save the TRUNCATE baselines; a restarted agent would show lifetime values");
        }
        Ok::<_, tables::NotTruncatable>((table.name(), unreached))
    })
    .await;
    match r {
        Ok(Ok((t, errors))) => {
            json_reply(StatusCode::OK, json!({ "truncated": t, "errors": errors }))
        }
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "truncate failed"),
    }
}

/// `POST /api/v1/setup/{what}` with a JSON body: applied to every live
/// segment that passes `filter`.
pub async fn setup(
    state: Arc<AppState>,
    req: Request<Incoming>,
    what: &str,
    filter: Filter,
) -> Resp {
    use http_body_util::BodyExt;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body larger than {MAX_BODY} bytes"),
        )
    };
    // Said too large up front: not waited for.
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        // A malformed chunked encoding, a connection cut mid-body.
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            );
        }
    };
    // serde's message for another JSON value names our types ("expected
    // struct InstrumentChange"): say what the body must be instead.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        let example = match what {
            "instruments" => r#"{"name": "wait/synch/%", "enabled": true, "timed": true}"#,
            "consumers" => r#"{"name": "events_waits_history", "enabled": true}"#,
            "timers" => r#"{"name": "wait", "timer_name": "NANOSECOND"}"#,
            "actors" => r#"{"host": "%", "user": "%", "role": "%", "enabled": true}"#,
            _ => "{...}",
        };
        return error(
            StatusCode::BAD_REQUEST,
            format!("the body of setup/{what} must be one JSON object, such as {example}"),
        );
    }
    let parsed: Result<Change, serde_json::Error> = match what {
        "instruments" => serde_json::from_slice(&body).map(Change::Instruments),
        "consumers" => serde_json::from_slice(&body).map(Change::Consumers),
        "timers" => serde_json::from_slice(&body).map(Change::Timers),
        "actors" => serde_json::from_slice(&body).map(Change::Actors),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                "setup tables: instruments, consumers, timers, actors",
            );
        }
    };
    let change = match parsed {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid JSON body for setup/{what}: {e}"),
            );
        }
    };
    if let Err(e) = setup::validate(&change) {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    let change_kind = change.clone();
    let s = state.clone();
    let out = tokio::task::spawn_blocking(move || {
        let paths = s.snap.live_paths();
        let out = setup::apply(&paths, &filter, &change);
        s.metrics.invalidate(&s.snap);
        out
    })
    .await;
    match out {
        Ok(o) if o.full > 0 && o.matched == 0 => error(
            StatusCode::CONFLICT,
            format!(
                "{} in {} segment(s): nothing changed",
                pfs_shm_layout::setup::ActorsFull,
                o.full
            ),
        ),
        Ok(o) => {
            let errors: Vec<String> = o.errors.iter().map(ToString::to_string).collect();
            for e in &errors {
                tracing::warn!("setup change not applied: {e}");
            }
            let mut body =
                json!({ "matched": o.matched, "segments": o.segments, "errors": errors });
            if let Some(w) = o.nothing_matched(&change_kind) {
                body["warning"] = w.into();
            }
            json_reply(StatusCode::OK, body)
        }
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "setup change failed"),
    }
}
