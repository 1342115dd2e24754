//! Scrape storms and hostile clients against a real agent on loopback.
//!
//! * A storm: `wrk` (Debian's package; scripts/test installs it) with 128
//!   connections for a few seconds against `/metrics` over a set of
//!   segments. Latency (p50/p99), requests/s and the agent's peak memory
//!   (VmHWM) before and after are reported; the test asserts no socket
//!   error, no non-2xx answer, and a generous memory bound (growth under
//!   64 MiB). Latency is reported, never asserted (shared machine).
//! * A slowloris connection (headers trickled forever) and an idle one are
//!   closed by the header timeout, while other clients are served.
//! * Oversize headers get 431; an oversize control body gets 413.
//! * Requests on connections beyond `--max-connections` wait until a slot
//!   frees, except `/healthz`, answered at once (the kubelet's probes never
//!   queue behind the limit); idle connections (silent, or kept alive
//!   after a request) are closed to make room.
//! * A client that never reads its responses is cut off by the connection
//!   timeout, and does not hold up anyone else's scrape.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use pfs_tests::{Agent, Writer, http_get, spawn_exact, writer_exe};

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"))
}

fn addr(agent: &Agent) -> String {
    agent.base.trim_start_matches("http://").to_string()
}

/// wrk's figures.
#[derive(Debug, Default)]
struct Wrk {
    requests: u64,
    requests_per_sec: f64,
    p50: String,
    p99: String,
    socket_errors: Option<String>,
    non_2xx: u64,
}

fn parse_wrk(out: &str) -> Wrk {
    let mut w = Wrk::default();
    for line in out.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            w.requests_per_sec = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = line.strip_prefix("50%") {
            w.p50 = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("99%") {
            w.p99 = v.trim().to_string();
        } else if let Some(v) = line.strip_prefix("Socket errors:") {
            w.socket_errors = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            w.non_2xx = v.trim().parse().unwrap_or(u64::MAX);
        } else if line.contains(" requests in ") {
            w.requests = line
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    w
}

#[test]
fn wrk_storm_has_bounded_memory_and_no_errors() {
    assert!(
        Command::new("wrk").arg("--version").output().is_ok(),
        "`wrk` is not on PATH: install it (Debian: apt-get install wrk; scripts/test does this)"
    );
    let dir = tempfile::tempdir().unwrap();
    // A set of segments: 8 services, 8 threads each, every class used.
    let mut writers: Vec<Writer> = Vec::new();
    for s in 0..8 {
        let (w, _) =
            spawn_exact(writer_exe!(), dir.path(), &format!("storm-{s}"), 8, 50, 2).unwrap();
        writers.push(w);
    }
    let agent = Agent::serve(dir.path()).unwrap();
    let body = agent.get("/metrics").unwrap().body;
    let pid = agent.guard.pid();
    let before = vm_hwm_kib(pid);
    let out = Command::new("wrk")
        .args(["-t2", "-c128", "-d4s", "--latency", "--timeout", "10s"])
        .arg(format!("{}/metrics", agent.base))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wrk failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let w = parse_wrk(&text);
    let after = vm_hwm_kib(pid);
    eprintln!(
        "scrape_storm: wrk 2 threads x 128 connections x 4 s on /metrics ({} bytes, 8 services x 8 threads): \
         {} requests, {:.0} requests/s, p50 {}, p99 {}, socket errors {}, non-2xx {}; \
         agent VmHWM {} KiB before, {} KiB after (+{} KiB)",
        body.len(),
        w.requests,
        w.requests_per_sec,
        w.p50,
        w.p99,
        w.socket_errors.as_deref().unwrap_or("none"),
        w.non_2xx,
        before,
        after,
        after.saturating_sub(before)
    );
    assert!(w.requests > 0, "wrk made no request:\n{text}");
    assert!(
        w.socket_errors.is_none(),
        "socket errors: {:?}\n{text}",
        w.socket_errors
    );
    assert_eq!(w.non_2xx, 0, "non-2xx answers:\n{text}");
    assert!(
        after.saturating_sub(before) < 64 * 1024,
        "agent peak memory grew by {} KiB during the storm",
        after - before
    );
    // Still healthy, still right.
    assert_eq!(agent.get("/healthz").unwrap().status, 200);
    assert!(agent.get("/metrics").unwrap().body.contains("storm-7"));
}

/// Reads until EOF or `limit`; returns the bytes and whether EOF came.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (got, false);
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return (got, true), // reset: closed too
        }
    }
}

#[test]
fn slowloris_and_idle_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let agent =
        Agent::serve_with_env(dir.path(), &[("PFS_HEADER_TIMEOUT", "1s".to_string())]).unwrap();
    let a = addr(&agent);
    let mut idle = TcpStream::connect(&a).unwrap();
    let mut slow = TcpStream::connect(&a).unwrap();
    let start = Instant::now();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    let mut closed_after = None;
    let mut buf = [0u8; 4096];
    slow.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    while start.elapsed() < Duration::from_secs(10) {
        // Another client is served meanwhile.
        assert_eq!(agent.get("/healthz").unwrap().status, 200);
        if slow.write_all(b"X-Slow: 1\r\n").is_err() {
            closed_after = Some(start.elapsed());
            break;
        }
        match slow.read(&mut buf) {
            Ok(_) => {
                // EOF, or an error response followed by the close.
                closed_after = Some(start.elapsed());
                break;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                closed_after = Some(start.elapsed());
                break;
            }
        }
    }
    let closed_after = closed_after.expect("slowloris connection still open after 10 s");
    let (_, idle_closed) = read_until_closed(&mut idle, Duration::from_secs(5));
    eprintln!("scrape_storm: slowloris closed after {closed_after:?} (header timeout 1 s)");
    assert!(
        idle_closed,
        "an idle connection outlived the header timeout"
    );
    assert!(
        closed_after < Duration::from_secs(6),
        "slowloris closed only after {closed_after:?}"
    );
}

fn status_line(resp: &[u8]) -> String {
    String::from_utf8_lossy(resp)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[test]
fn oversize_headers_and_bodies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let agent = Agent::serve_with_env(
        dir.path(),
        &[(
            "PFS_CONTROL_TOKEN_FILE",
            token_file.to_string_lossy().into_owned(),
        )],
    )
    .unwrap();
    let a = addr(&agent);
    // 32 KiB of headers: 431 (or at least a closed connection, no answer).
    let mut s = TcpStream::connect(&a).unwrap();
    let big = "x".repeat(32 * 1024);
    let _ = s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    );
    let (resp, closed) = read_until_closed(&mut s, Duration::from_secs(10));
    let headers_line = status_line(&resp);
    assert!(
        headers_line.contains(" 431 ") || (resp.is_empty() && closed),
        "oversize headers answered {headers_line:?}"
    );
    // A 200 KiB control body: 413.
    let mut s = TcpStream::connect(&a).unwrap();
    let body = format!(
        "{{\"name\": \"{}\", \"enabled\": true}}",
        "y".repeat(200 * 1024)
    );
    let head = format!(
        "POST /api/v1/setup/instruments HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer s3cret\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body.as_bytes());
    let (resp, _) = read_until_closed(&mut s, Duration::from_secs(10));
    let line = status_line(&resp);
    assert!(line.contains(" 413 "), "oversize body answered {line:?}");
    eprintln!("scrape_storm: 32 KiB headers -> {headers_line:?}; 200 KiB body -> {line:?}");
    assert_eq!(agent.get("/healthz").unwrap().status, 200);
}

#[test]
fn connections_beyond_the_limit_wait_for_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let token_file = secrets.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let agent = Agent::serve_with_env(
        dir.path(),
        &[
            ("PFS_MAX_CONNECTIONS", "2".to_string()),
            (
                "PFS_CONTROL_TOKEN_FILE",
                token_file.to_string_lossy().into_owned(),
            ),
        ],
    )
    .unwrap();
    let a = addr(&agent);
    // Two control requests whose bodies are still arriving take both
    // slots (until their clients go away), once the start-up
    // probe's connection has given its slot back (else one may be accepted
    // as a spare, leaving a slot free). (Idle connections, silent or kept
    // alive after a request, would be closed to make room: see the tests
    // below.)
    std::thread::sleep(Duration::from_millis(500));
    let busy = || {
        let mut s = TcpStream::connect(&a).unwrap();
        s.write_all(
            b"POST /api/v1/setup/consumers HTTP/1.1\r\nHost: localhost\r\n\
              Authorization: Bearer s3cret\r\nContent-Length: 100\r\n\r\n[",
        )
        .unwrap();
        s
    };
    let x = busy();
    let y = busy();
    std::thread::sleep(Duration::from_millis(400));
    let start = Instant::now();
    let mut third = TcpStream::connect(&a).unwrap();
    third
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    // A probe meanwhile is answered at once.
    let mut probe = TcpStream::connect(&a).unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (resp, _) = read_until_closed(&mut probe, Duration::from_secs(1));
    assert!(
        status_line(&resp).contains(" 200 "),
        "/healthz with both slots taken: {:?}",
        String::from_utf8_lossy(&resp)
    );
    third
        .set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let mut buf = [0u8; 1024];
    let early = third.read(&mut buf);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "the third connection was served while both slots were taken: {early:?}"
    );
    // The two clients give up: their slots free.
    drop((x, y));
    let (resp, _) = read_until_closed(&mut third, Duration::from_secs(10));
    let waited = start.elapsed();
    eprintln!("scrape_storm: third connection over a limit of 2 served after {waited:?}");
    assert!(
        status_line(&resp).contains(" 200 "),
        "after the slots freed: {:?}",
        String::from_utf8_lossy(&resp)
    );
}

/// An agent over `dir` with 4 slots and a header timeout (30 s) longer
/// than any test here, and its address, once its start-up probe's
/// connection has given its slot back.
fn four_slots(dir: &std::path::Path) -> (Agent, String) {
    let agent = Agent::serve_with_env(
        dir,
        &[
            ("PFS_MAX_CONNECTIONS", "4".to_string()),
            ("PFS_HEADER_TIMEOUT", "30s".to_string()),
        ],
    )
    .unwrap();
    let a = addr(&agent);
    std::thread::sleep(Duration::from_millis(300));
    (agent, a)
}

/// A flood of connections that send nothing (each would hold a slot until
/// its header timeout): more than the slots and the spare ones together.
/// A probe is still answered at once (the oldest silent connection makes
/// room), and so is a scrape.
#[test]
fn silent_connections_never_keep_a_probe_out() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, a) = four_slots(dir.path());
    // 4 slots + 16 spare ones, and 40 more; every other one sends a head
    // it never finishes (a slowloris).
    let silent: Vec<TcpStream> = (0..60)
        .map(|i| {
            let mut c = TcpStream::connect(&a).unwrap();
            if i % 2 == 1 {
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                    .unwrap();
            }
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    probe_and_scrape_are_answered(&a, "60 silent connections");
    drop(silent);
}

/// `/healthz`, then `/metrics`, each on a new connection, are answered
/// within 3 s (behind `what`).
fn probe_and_scrape_are_answered(a: &str, what: &str) {
    for path in ["/healthz", "/metrics"] {
        let start = Instant::now();
        let mut probe = TcpStream::connect(a).unwrap();
        probe
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
        let (resp, _) = read_until_closed(&mut probe, Duration::from_secs(5));
        let took = start.elapsed();
        assert!(
            status_line(&resp).contains(" 200 "),
            "{path} behind {what}: {:?}",
            String::from_utf8_lossy(&resp)
        );
        assert!(took < Duration::from_secs(3), "{path} took {took:?}");
        eprintln!("scrape_storm: {path} behind {what} in {took:?}");
    }
}

/// Keep-alive connections left open after a request each, as many as the
/// slots and the spare ones together, would hold them all until their
/// header timeout: the one idle the longest makes room for a probe, and
/// for a scrape. (That a connection with a response in flight is never
/// chosen is `server::conns`'s unit test; the slot tests above hold their
/// slots with such connections.)
#[test]
fn idle_keep_alive_connections_never_keep_a_probe_out() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, a) = four_slots(dir.path());
    // 4 slots + 16 spare ones: each answers a probe, then stays open.
    let kept: Vec<TcpStream> = (0..20)
        .map(|i| {
            let mut c = TcpStream::connect(&a).unwrap();
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 512];
            let n = c.read(&mut buf).unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(
                head.contains(" 200 "),
                "keep-alive connection {i}: {head:?}"
            );
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    probe_and_scrape_are_answered(&a, "20 idle keep-alive connections");
    // Some were closed to make room, with nothing sent on them since
    // their answer (read whole above).
    let closed = kept
        .into_iter()
        .filter_map(|mut c| {
            c.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut buf = [0u8; 64];
            match c.read(&mut buf) {
                Ok(0) => Some(()),
                Ok(n) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
                Err(_) => None,
            }
        })
        .count();
    assert!(
        closed >= 1,
        "no kept-alive connection was closed to make room"
    );
}

#[test]
fn a_client_that_never_reads_is_cut_off_and_blocks_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let mut writers = Vec::new();
    for s in 0..4 {
        let (w, _) =
            spawn_exact(writer_exe!(), dir.path(), &format!("slow-{s}"), 4, 10, 0).unwrap();
        writers.push(w);
    }
    let agent =
        Agent::serve_with_env(dir.path(), &[("PFS_CONNECTION_TIMEOUT", "2s".to_string())]).unwrap();
    let body_len = agent.get("/metrics").unwrap().body.len();
    // Pipeline far more responses than the socket buffers hold, read none.
    let n = (64 << 20) / body_len.max(1) + 1;
    let mut s = TcpStream::connect(addr(&agent)).unwrap();
    let start = Instant::now();
    let req = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    for _ in 0..n {
        if s.write_all(req).is_err() {
            break;
        }
    }
    // Others are served meanwhile, from the shared cached body.
    for _ in 0..5 {
        let r = http_get(&format!("{}/metrics", agent.base)).unwrap();
        assert_eq!(r.status, 200);
    }
    std::thread::sleep(Duration::from_secs(3).saturating_sub(start.elapsed()));
    let (resp, closed) = read_until_closed(&mut s, Duration::from_secs(20));
    let answered = String::from_utf8_lossy(&resp)
        .matches("HTTP/1.1 200 OK")
        .count();
    eprintln!(
        "scrape_storm: a non-reading client pipelined {n} scrapes of {body_len} bytes; \
         {answered} were answered before the connection timeout (2 s) closed it"
    );
    assert!(closed, "the connection was not closed");
    assert!(
        answered < n,
        "all {n} answers were written: the connection timeout did not apply"
    );
}
