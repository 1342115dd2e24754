//! The HTTP API's request handling, against a real `pfs-agent serve` and
//! real instrumented processes: query values percent-decoded (a service
//! named `orders api/v2`, `kvstore%2Ddemo`), repeated or malformed
//! parameters refused with 400 naming them, paths percent-decoded segment
//! by segment (`/api/v1/tables/%74hreads`; an encoded `/` stays within a
//! name), a URL too long refused with 414 and a JSON error (a request
//! head too long as a whole: hyper's bare 431), 405 with `Allow` for a
//! known path asked with the wrong method (before any token check), the
//! `Bearer` scheme in any case, `performance_timers` per process,
//! unknown `setup_timers` event kinds refused, and the `Host` header
//! of a loopback connection checked (DNS rebinding: 403 for a name that
//! is not the agent's, `--allowed-host` to add one).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pfs_agent::server::{MAX_HEADER_BYTES, MAX_URI_BYTES};
use pfs_tests::{Agent, Writer, poll, rows, spawn_exact, writer_exe};
use serde_json::{Value, json};

const READ: &str = "read-token-0123";
const CONTROL: &str = "control-token-4567";

/// One answer: status, `Allow` header, body (JSON when it parses).
#[derive(Debug)]
struct Answer {
    status: u16,
    allow: Option<String>,
    body: Value,
}

/// `method url` with an optional `Authorization` header value and JSON body.
fn request(method: &str, url: &str, auth: Option<&str>, body: Option<Value>) -> Result<Answer> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .allow_non_standard_methods(true)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut b = ureq::http::Request::builder().method(method).uri(url);
    if let Some(a) = auth {
        b = b.header("authorization", a);
    }
    let sent = match body {
        Some(v) => agent.run(
            b.header("content-type", "application/json")
                .body(v.to_string())?,
        ),
        None => agent.run(b.body(())?),
    };
    let mut r = sent.with_context(|| format!("{method} {url}"))?;
    let status = r.status().as_u16();
    let allow = r
        .headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(Answer {
        status,
        allow,
        body,
    })
}

fn get(url: &str) -> Result<Answer> {
    request("GET", url, None, None)
}

/// Two processes, `kvstore-demo` and `orders api/v2`, and an agent with a
/// control token (and a read token with `read`).
struct Setup {
    _dir: tempfile::TempDir,
    _secrets: tempfile::TempDir,
    writers: Vec<(Writer, String)>,
    agent: Agent,
}

impl Setup {
    fn start(read: bool) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let secrets = tempfile::tempdir()?;
        let mut writers = Vec::new();
        for service in ["kvstore-demo", "orders api/v2"] {
            let (w, _) = spawn_exact(writer_exe!(), dir.path(), service, 2, 5, 0)?;
            writers.push((w, service.to_string()));
        }
        let control = secrets.path().join("control");
        std::fs::write(&control, format!("{CONTROL}\n"))?;
        let read_file = secrets.path().join("read");
        std::fs::write(&read_file, format!("{READ}\n"))?;
        let mut args = vec![
            "--control-token-file".to_string(),
            control.to_string_lossy().into_owned(),
        ];
        if read {
            args.push("--read-token-file".into());
            args.push(read_file.to_string_lossy().into_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let agent = Agent::serve_with_args(dir.path(), &args)?;
        let s = Self {
            _dir: dir,
            _secrets: secrets,
            writers,
            agent,
        };
        if !read {
            // Both processes are visible before the test starts.
            poll(Duration::from_secs(20), || {
                let t = s.table("threads", "")?;
                let services: std::collections::BTreeSet<String> = rows(&t)?
                    .iter()
                    .filter_map(|r| r["service"].as_str().map(str::to_string))
                    .collect();
                Ok((services.len() == 2).then_some(()))
            })?;
        }
        Ok(s)
    }

    fn pid(&self, service: &str) -> u32 {
        self.writers
            .iter()
            .find(|(_, s)| s == service)
            .map(|(w, _)| w.guard.pid())
            .unwrap()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.agent.base)
    }

    /// `GET /api/v1/tables/{table}{query}`, which must answer 200.
    fn table(&self, table: &str, query: &str) -> Result<Value> {
        let a = get(&self.url(&format!("/api/v1/tables/{table}{query}")))?;
        if a.status != 200 {
            bail!("{table}{query} answered {}: {}", a.status, a.body);
        }
        Ok(a.body)
    }
}

/// The `service` of every row of `t` (at least one row).
fn services(t: &Value) -> Result<Vec<String>> {
    let r = rows(t)?;
    if r.is_empty() {
        bail!("no rows: {t}");
    }
    Ok(r.iter()
        .map(|r| r["service"].as_str().unwrap_or("?").to_string())
        .collect())
}

fn error_of(a: &Answer) -> String {
    a.body["error"].as_str().unwrap_or_default().to_string()
}

#[test]
fn query_values_are_percent_decoded_and_checked() -> Result<()> {
    let s = Setup::start(false)?;
    let t = s.table("threads", "?service=kvstore%2Ddemo")?;
    assert!(services(&t)?.iter().all(|x| x == "kvstore-demo"), "{t}");
    assert!(t.get("warning").is_none(), "{t}");
    // A mistyped name: an empty table, and a warning naming what exists.
    let t = s.table("threads", "?service=kvstore-dmeo")?;
    assert!(rows(&t)?.is_empty(), "{t}");
    let w = t["warning"].as_str().unwrap_or_default();
    assert!(
        w.contains("service=\"kvstore-dmeo\"")
            && w.contains("\"kvstore-demo\"")
            && w.contains("\"orders api/v2\""),
        "{t}"
    );
    for q in [
        "?service=orders%20api%2Fv2",
        "?service=orders+api%2Fv2",
        "?service=orders+api/v2",
        "?service=orders%20api/v2",
    ] {
        let t = s.table("threads", q)?;
        assert!(
            services(&t)?.iter().all(|x| x == "orders api/v2"),
            "{q}: {t}"
        );
    }
    // Both filters, decoded.
    let pid = s.pid("orders api/v2");
    let t = s.table(
        "events_waits_summary_global_by_event_name",
        &format!("?service=orders+api%2Fv2&pid={pid}"),
    )?;
    assert!(rows(&t)?.iter().all(|r| r["pid"] == pid), "{t}");

    // The decoded value is echoed, never the raw text.
    let a = get(&s.url(&format!("/api/v1/tables/threads?pid=%20{pid}")))?;
    assert_eq!(a.status, 400, "{a:?}");
    let e = error_of(&a);
    assert!(
        e.contains(&format!("\" {pid}\"")) && !e.contains("%20"),
        "{e}"
    );
    for bad in ["-1", "0", "x"] {
        let a = get(&s.url(&format!("/api/v1/tables/threads?pid={bad}")))?;
        assert_eq!(a.status, 400, "{bad}: {a:?}");
        assert!(error_of(&a).contains("positive integer"), "{bad}: {a:?}");
    }
    // A repeated parameter is refused, naming it.
    for (q, name) in [
        ("service=kvstore-demo&service=orders+api%2Fv2", "service"),
        ("pid=1&pid=2", "pid"),
    ] {
        let a = get(&s.url(&format!("/api/v1/tables/threads?{q}")))?;
        assert_eq!(a.status, 400, "{q}: {a:?}");
        let e = error_of(&a);
        assert!(
            e.contains(&format!("\"{name}\"")) && e.contains("more than once"),
            "{q}: {e}"
        );
    }

    // Control requests decode the same way: only `orders api/v2` changes.
    let a = request(
        "POST",
        &s.url("/api/v1/setup/consumers?service=orders%20api%2Fv2"),
        Some(&format!("Bearer {CONTROL}")),
        Some(json!({"name": "events_waits_history_long", "enabled": true})),
    )?;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body["segments"], 1, "{a:?}");
    assert!(a.body["matched"].as_u64().unwrap_or(0) > 0, "{a:?}");
    let c = s.table("setup_consumers", "?service=orders+api/v2")?;
    let row = rows(&c)?
        .iter()
        .find(|r| r["name"] == "events_waits_history_long")
        .cloned()
        .context("consumer row")?;
    assert_eq!(row["enabled"], "YES", "{row}");
    let c = s.table("setup_consumers", "?service=kvstore-demo")?;
    let row = rows(&c)?
        .iter()
        .find(|r| r["name"] == "events_waits_history_long")
        .cloned()
        .context("consumer row")?;
    assert_eq!(
        row["enabled"], "NO",
        "the other service is untouched: {row}"
    );
    Ok(())
}

/// A path is routed once decoded, segment by segment, health check
/// included; a URL too long is told the limit and what to do, unless it
/// alone overflows the request head (then hyper answers 431 itself, with
/// no body), and the agent goes on serving.
#[test]
fn paths_are_percent_decoded_and_long_urls_refused() -> Result<()> {
    let s = Setup::start(false)?;
    let t = s.table("%74hreads", "?service=kvstore%2Ddemo")?;
    assert_eq!(t["table"], "threads", "{t}");
    assert!(services(&t)?.iter().all(|x| x == "kvstore-demo"), "{t}");
    let a = get(&s.url("/%68ealthz"))?;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        a.body.as_str().is_some_and(|b| b.starts_with("ok")),
        "{a:?}"
    );
    // An encoded slash is part of the table's name: nothing is truncated.
    let a = request(
        "POST",
        &s.url("/api/v1/tables/threads%2Ftruncate"),
        Some(&format!("Bearer {CONTROL}")),
        None,
    )?;
    assert_eq!(a.status, 404, "{a:?}");
    assert!(
        error_of(&a).starts_with(r#"no table "threads/truncate";"#),
        "{a:?}"
    );
    // A near miss names what it most likely meant.
    let a = get(&s.url("/api/v1/tables/file_summary_by_event"))?;
    assert_eq!(a.status, 404, "{a:?}");
    assert!(
        error_of(&a).contains("did you mean file_summary_by_event_name?"),
        "{a:?}"
    );
    let a = get(&s.url("/api/v1/tables/%FF"))?;
    assert_eq!(a.status, 400, "{a:?}");
    assert!(error_of(&a).contains("not UTF-8"), "{a:?}");

    let long = |len: usize| {
        let base = "/api/v1/tables/threads?service=";
        s.url(&format!("{base}{}", "x".repeat(len - base.len())))
    };
    let a = get(&long(MAX_URI_BYTES + 1))?;
    assert_eq!(a.status, 414, "{a:?}");
    let e = error_of(&a);
    assert!(
        e.contains(&MAX_URI_BYTES.to_string()) && e.contains("shorten"),
        "{a:?}"
    );
    // Longer than the whole head may be: hyper's 431, before any handler.
    let a = get(&long(MAX_HEADER_BYTES + 1))?;
    assert_eq!(a.status, 431, "{a:?}");
    assert_eq!(a.body, Value::String(String::new()), "{a:?}");
    // Still serving, and a URL at the limit is fine.
    let a = get(&long(MAX_URI_BYTES))?;
    assert_eq!(a.status, 200, "{a:?}");
    Ok(())
}

/// 405 and `Allow` for every known path asked with another method, with
/// or without tokens (the 405 comes before the token check).
fn check_wrong_methods(s: &Setup) -> Result<()> {
    let table_paths = [
        "/api/v1/tables/threads",
        "/api/v1/tables/performance_timers",
    ];
    let mut cases: Vec<(&str, String, &str)> = vec![
        ("POST", "/metrics".into(), "GET, HEAD"),
        ("POST", "/healthz".into(), "GET, HEAD"),
        ("PUT", "/".into(), "GET, HEAD"),
        ("DELETE", "/api/v1/tables".into(), "GET, HEAD"),
        ("GET", "/api/v1/tables/threads/truncate".into(), "POST"),
        ("HEAD", "/api/v1/tables/threads/truncate".into(), "POST"),
    ];
    for p in table_paths {
        cases.push(("DELETE", p.into(), "GET, HEAD"));
        cases.push(("POST", p.into(), "GET, HEAD"));
    }
    for what in ["instruments", "consumers", "timers", "actors"] {
        cases.push(("GET", format!("/api/v1/setup/{what}"), "POST"));
        cases.push(("PUT", format!("/api/v1/setup/{what}"), "POST"));
    }
    for (method, path, allow) in &cases {
        for auth in [
            None,
            Some(format!("Bearer {READ}")),
            Some(format!("Bearer {CONTROL}")),
            Some("Bearer wrong".to_string()),
        ] {
            let a = request(method, &s.url(path), auth.as_deref(), None)?;
            assert_eq!(a.status, 405, "{method} {path} ({auth:?}): {a:?}");
            assert_eq!(
                a.allow.as_deref(),
                Some(*allow),
                "{method} {path} ({auth:?}): {a:?}"
            );
        }
    }
    // Unknown paths and tables stay 404, whatever the method.
    for (method, path) in [
        ("GET", "/nope"),
        ("POST", "/nope"),
        ("GET", "/api/v1/tables/nope"),
        ("POST", "/api/v1/tables/nope/truncate"),
        ("POST", "/api/v1/setup/nope"),
    ] {
        let a = request(method, &s.url(path), None, None)?;
        assert_eq!(a.status, 404, "{method} {path}: {a:?}");
        assert_eq!(a.allow, None, "{method} {path}");
    }
    Ok(())
}

#[test]
fn wrong_methods_get_405_with_allow() -> Result<()> {
    let s = Setup::start(false)?;
    check_wrong_methods(&s)?;
    let s = Setup::start(true)?;
    check_wrong_methods(&s)?;
    // Right methods still need their tokens.
    let a = get(&s.url("/api/v1/tables/threads"))?;
    assert_eq!(a.status, 401, "{a:?}");
    let a = request(
        "POST",
        &s.url("/api/v1/tables/threads/truncate"),
        Some(&format!("Bearer {READ}")),
        None,
    )?;
    assert_eq!(a.status, 401, "{a:?}");
    Ok(())
}

#[test]
fn the_bearer_scheme_is_case_insensitive() -> Result<()> {
    let s = Setup::start(true)?;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let a = request(
            "GET",
            &s.url("/api/v1/tables/setup_timers"),
            Some(&format!("{scheme} {READ}")),
            None,
        )?;
        assert_eq!(a.status, 200, "{scheme}: {a:?}");
        let a = request(
            "POST",
            &s.url("/api/v1/setup/consumers"),
            Some(&format!("{scheme} {CONTROL}")),
            Some(json!({"name": "events_waits_history", "enabled": true})),
        )?;
        assert_eq!(a.status, 200, "{scheme}: {a:?}");
    }
    for auth in [
        format!("Basic {READ}"),
        format!("bearer {CONTROL}x"),
        format!("bearer{READ}"),
    ] {
        let a = request("GET", &s.url("/metrics"), Some(&auth), None)?;
        assert_eq!(a.status, 401, "{auth}: {a:?}");
    }
    Ok(())
}

#[test]
fn performance_timers_are_per_process_and_filtered() -> Result<()> {
    let s = Setup::start(false)?;
    let all = s.table("performance_timers", "")?;
    let cols: Vec<&str> = all["columns"]
        .as_array()
        .context("columns")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(&cols[..3], ["service", "pid", "timer_name"], "{all}");
    let mut got = services(&all)?;
    got.sort();
    got.dedup();
    assert_eq!(got, ["kvstore-demo", "orders api/v2"]);
    let one = s.table("performance_timers", "?service=kvstore%2Ddemo")?;
    let r = rows(&one)?;
    assert_eq!(r.len(), 5, "one row per timer: {one}");
    let pid = s.pid("kvstore-demo");
    assert!(
        r.iter()
            .all(|r| r["pid"] == pid && r["service"] == "kvstore-demo")
    );
    let cycle = r
        .iter()
        .find(|r| r["timer_name"] == "CYCLE")
        .context("CYCLE row")?;
    assert!(
        cycle["timer_frequency"].as_u64().unwrap_or(0) > 0,
        "{cycle}"
    );
    let by_pid = s.table("performance_timers", &format!("?pid={pid}"))?;
    assert_eq!(rows(&by_pid)?.len(), 5, "{by_pid}");
    let none = s.table("performance_timers", "?service=nobody")?;
    assert!(rows(&none)?.is_empty(), "{none}");
    Ok(())
}

#[test]
fn unknown_event_kinds_of_setup_timers_are_refused() -> Result<()> {
    let s = Setup::start(false)?;
    let url = s.url("/api/v1/setup/timers");
    let auth = format!("Bearer {CONTROL}");
    for name in ["idle", "waits", "WAITS"] {
        let a = request(
            "POST",
            &url,
            Some(&auth),
            Some(json!({"name": name, "timer_name": "NANOSECOND"})),
        )?;
        assert_eq!(a.status, 400, "{name}: {a:?}");
        let e = error_of(&a);
        assert!(
            e.contains(&format!("{name:?}")) && e.contains("wait, stage, statement"),
            "{name}: {e}"
        );
    }
    let a = request(
        "POST",
        &url,
        Some(&auth),
        // In any case, as MySQL compares it.
        Some(json!({"name": "STAGE", "timer_name": "NANOSECOND"})),
    )?;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.body["matched"], 2,
        "one kind in each of two processes: {a:?}"
    );
    // The valid change took effect.
    let t = s.table("setup_timers", "?service=kvstore-demo")?;
    let stage = rows(&t)?
        .iter()
        .find(|r| r["name"] == "stage")
        .cloned()
        .context("stage row")?;
    assert_eq!(stage["timer_name"], "NANOSECOND", "{t}");
    Ok(())
}

/// `raw` (a whole request) to the agent at `base` on a connection of its
/// own: the status and how long the answer took.
fn raw_status(base: &str, raw: &str) -> Result<(u16, Duration)> {
    let addr = base.strip_prefix("http://").context("an http:// base")?;
    let mut c = TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let start = std::time::Instant::now();
    c.write_all(raw.as_bytes())?;
    let mut head = [0u8; 64];
    let n = c.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]).into_owned();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("a status line: {line:?}"))?;
    Ok((status, start.elapsed()))
}

/// A control body that cannot be read: said too large up front by its
/// `Content-Length` (413 at once, not after waiting for the body), or a
/// malformed chunked encoding (400, not 413).
#[test]
fn unreadable_control_bodies_are_told_apart() -> Result<()> {
    let s = Setup::start(false)?;
    let base = &s.agent.base;
    let head = format!(
        "POST /api/v1/setup/consumers HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {CONTROL}\r\nContent-Type: application/json\r\n"
    );
    let (status, took) = raw_status(
        base,
        &format!("{head}Content-Length: 99999999999999\r\n\r\n{{"),
    )?;
    assert_eq!(status, 413);
    assert!(took < Duration::from_secs(2), "answered at once: {took:?}");
    let (status, _) = raw_status(
        base,
        &format!("{head}Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"),
    )?;
    assert_eq!(status, 400);
    Ok(())
}

/// `GET path` from the agent at `base` (`http://127.0.0.1:PORT`) with
/// `Host: host`, on a connection of its own: the status and the body.
fn get_with_host(base: &str, path: &str, host: &str) -> Result<(u16, String)> {
    let addr = base.strip_prefix("http://").context("an http:// base")?;
    let mut c = TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    c.read_to_string(&mut raw)?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("a status line: {raw:?}"))?;
    let body = raw.split_once("\r\n\r\n").map_or("", |b| b.1).to_string();
    Ok((status, body))
}

/// A request on a loopback address naming another host (a page that
/// rebound its name to 127.0.0.1) is refused with 403 and what to do,
/// whatever the path; the agent's own names are served, and
/// `--allowed-host` adds one (`*`: any).
#[test]
fn loopback_requests_naming_another_host_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let agent = Agent::serve(dir.path())?;
    let port = agent.base.rsplit(':').next().unwrap().to_string();
    for path in ["/metrics", "/api/v1/tables/threads", "/healthz", "/"] {
        let (status, body) = get_with_host(&agent.base, path, &format!("evil.example:{port}"))?;
        assert_eq!(status, 403, "{path}: {body}");
        let error: Value = serde_json::from_str(&body).context("a JSON error")?;
        let e = error["error"].as_str().unwrap_or_default();
        assert!(
            e.contains("DNS rebinding")
                && e.contains(&format!("http://127.0.0.1:{port}/"))
                && e.contains("--allowed-host evil.example"),
            "{e}"
        );
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LOCALHOST".to_string(),
    ] {
        let (status, body) = get_with_host(&agent.base, "/metrics", &host)?;
        assert_eq!(status, 200, "{host}: {body}");
    }
    let (status, _) = get_with_host(&agent.base, "/metrics", "metrics.example")?;
    assert_eq!(status, 403);
    // A second Host header, or an absolute target, naming another host.
    let (status, _) = get_with_host(
        &agent.base,
        "/metrics",
        &format!("localhost:{port}\r\nHost: evil.example"),
    )?;
    assert_eq!(status, 403);
    let (status, _) = get_with_host(&agent.base, "http://evil.example/metrics", "localhost")?;
    assert_eq!(status, 403);
    // The first refusal of a name is logged, once.
    let log = poll(Duration::from_secs(5), || {
        let log = agent.guard.stderr();
        Ok(log.contains("request refused").then_some(log))
    })?;
    assert_eq!(
        log.matches("\"evil.example:").count(),
        1,
        "one warning for evil.example:\n{log}"
    );
    drop(agent);

    let allowed = Agent::serve_with_args(dir.path(), &["--allowed-host", "Metrics.Example"])?;
    let (status, body) = get_with_host(&allowed.base, "/metrics", "metrics.example:80")?;
    assert_eq!(status, 200, "{body}");
    let (status, _) = get_with_host(&allowed.base, "/metrics", "evil.example")?;
    assert_eq!(status, 403);
    drop(allowed);

    let any = Agent::serve_with_args(dir.path(), &["--allowed-host", "*"])?;
    let (status, body) = get_with_host(&any.base, "/metrics", "evil.example")?;
    assert_eq!(status, 200, "{body}");
    drop(any);

    // Every connection checked: loopback ones as before (the other
    // addresses' case is `rebinding.rs`'s unit test).
    let all = Agent::serve_with_args(dir.path(), &["--host-check", "all"])?;
    let (status, _) = get_with_host(&all.base, "/metrics", "evil.example")?;
    assert_eq!(status, 403);
    let (status, body) = get_with_host(&all.base, "/metrics", "localhost")?;
    assert_eq!(status, 200, "{body}");
    assert!(
        all.guard.stderr().contains("scope=All"),
        "{}",
        all.guard.stderr()
    );
    Ok(())
}
