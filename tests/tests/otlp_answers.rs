//! How the agent reads an OTLP/HTTP endpoint's answers, against a tiny
//! fake endpoint (Python's `http.server`, below) that answers every export
//! the same way: a 200 HTML page is a failure, not a success; an error's
//! `google.rpc.Status` is decoded for the log; `Retry-After` is honoured;
//! a partial success is logged once, with the collector's message. Each
//! export's arrival time is a line on the server's stdout. Over gRPC (a
//! fake grpcio server), the `RetryInfo` of an error status is honoured.
//! An endpoint of the other transport (the real receiver's gRPC port for
//! OTLP/HTTP, and the reverse) gets a failure that says what to change.
//! An endpoint that answers a huge body does not make the agent keep it;
//! one that is slow still gets the final export when the agent stops in
//! the middle of an export.

use std::process::Command;
use std::time::{Duration, Instant};

use pfs_tests::{Agent, ChildGuard, OtlpReceiver, free_port, poll, sample};

const SERVER: &str = r#"
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
mode, port = sys.argv[1], int(sys.argv[2])
def status_pb(code, msg):
    m = msg.encode()
    return bytes([0x08, code, 0x12, len(m)]) + m
def partial_pb(rejected, msg):
    m = msg.encode()
    inner = bytes([0x08, rejected, 0x12, len(m)]) + m
    return bytes([0x0a, len(inner)]) + inner
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        print(time.monotonic(), flush=True)
        if mode == "huge":
            # A 3 GB error page, streamed as fast as it is read.
            self.send_response(502)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(3 * 10**9))
            self.end_headers()
            chunk = b"x" * (1 << 20)
            try:
                for _ in range(3000):
                    self.wfile.write(chunk)
            except OSError:
                pass
            return
        if mode == "slow":
            time.sleep(4)
        headers = {}
        if mode == "html":
            code, ctype, body = 200, "text/html", b"<html><body>Please log in</body></html>"
        elif mode == "status":
            code, ctype, body = 400, "application/x-protobuf", status_pb(3, "metric name is bad")
        elif mode == "retry":
            code, ctype, body = 503, "text/plain", b"busy"
            headers["Retry-After"] = "4"
        elif mode == "slow":
            code, ctype, body = 200, "application/x-protobuf", b""
        else:
            code, ctype, body = 200, "application/x-protobuf", partial_pb(2, "2 points had no name")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

/// A gRPC collector that answers every export UNAVAILABLE with a
/// `google.rpc.RetryInfo` of 4 s in the status details (the protobuf bytes
/// written out by hand).
const GRPC_SERVER: &str = r#"
import sys, time
from concurrent import futures
import grpc
port = int(sys.argv[1])
def field(tag, b):
    return bytes([tag << 3 | 2, len(b)]) + b
duration = bytes([0x08, 4])
retry_info = field(1, duration)
any_ = field(1, b"type.googleapis.com/google.rpc.RetryInfo") + field(2, retry_info)
status = bytes([0x08, 14]) + field(2, b"busy") + field(3, any_)
def export(request, context):
    print(time.monotonic(), flush=True)
    context.set_trailing_metadata([("grpc-status-details-bin", status)])
    context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
handler = grpc.method_handlers_generic_handler(
    "opentelemetry.proto.collector.metrics.v1.MetricsService",
    {"Export": grpc.unary_unary_rpc_method_handler(export)})
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers((handler,))
server.add_insecure_port("127.0.0.1:%d" % port)
server.start()
server.wait_for_termination()
"#;

/// The fake endpoint in `mode` and an agent exporting to it every second.
fn start(mode: &str) -> (ChildGuard, Agent) {
    let port = free_port();
    let mut cmd = Command::new("python3");
    cmd.arg("-u")
        .arg("-c")
        .arg(SERVER)
        .arg(mode)
        .arg(port.to_string());
    let server = ChildGuard::spawn("fake-otlp", cmd, false).unwrap();
    (server, agent_to(port, "http/protobuf"))
}

/// An agent exporting to `port` every second over `protocol`.
fn agent_to(port: u16, protocol: &str) -> Agent {
    std::thread::sleep(Duration::from_millis(500));
    let dir = tempfile::tempdir().unwrap();
    Agent::serve_with_env(
        dir.path(),
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{port}"),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000".to_string()),
        ],
    )
    .unwrap()
}

/// Arrival times of the exports the server has seen.
fn arrivals(server: &ChildGuard) -> Vec<f64> {
    server
        .stdout()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn wait_exports(server: &ChildGuard, n: usize, timeout: Duration) -> Vec<f64> {
    let deadline = Instant::now() + timeout;
    loop {
        let a = arrivals(server);
        if a.len() >= n || Instant::now() > deadline {
            return a;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn counted(agent: &Agent, result: &str) -> f64 {
    let m = agent.metrics().unwrap();
    sample(&m, "pfs_agent_otlp_exports_total", &[("result", result)]).unwrap()
}

#[test]
fn otlp_http_200_that_is_not_otlp_is_a_failure() {
    let (server, agent) = start("html");
    let failures = poll(Duration::from_secs(15), || {
        let f = counted(&agent, "failure");
        Ok((f > 0.0).then_some(f))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.guard.stderr()));
    assert!(failures >= 1.0);
    assert_eq!(counted(&agent, "success"), 0.0);
    let log = agent.guard.stderr();
    assert!(log.contains("not an OTLP response"), "{log}");
    assert!(
        log.contains("text/html") && log.contains("check the endpoint"),
        "{log}"
    );
    drop(server);
}

#[test]
fn otlp_http_error_status_body_is_decoded() {
    let (server, agent) = start("status");
    wait_exports(&server, 1, Duration::from_secs(15));
    let log = poll(Duration::from_secs(10), || {
        let log = agent.guard.stderr();
        Ok(log.contains("OTLP export failed").then_some(log))
    })
    .unwrap();
    assert!(
        log.contains("HTTP 400 Bad Request: metric name is bad"),
        "{log}"
    );
    assert!(!log.contains('\u{8}') && !log.contains('\u{12}'), "{log:?}");
}

#[test]
fn otlp_http_retry_after_is_honoured() {
    let (server, agent) = start("retry");
    let a = wait_exports(&server, 3, Duration::from_secs(25));
    assert!(a.len() >= 3, "{a:?}\n{}", agent.guard.stderr());
    // Retry-After: 4 on every answer, with a 1 s interval (whose back-off
    // would retry after 1 s, then 2 s).
    for w in a.windows(2) {
        assert!(
            w[1] - w[0] >= 3.4,
            "retried after {:.1} s: {a:?}",
            w[1] - w[0]
        );
    }
}

#[test]
fn otlp_grpc_retry_info_is_honoured() {
    let port = free_port();
    let mut cmd = Command::new("python3");
    cmd.arg("-u")
        .arg("-c")
        .arg(GRPC_SERVER)
        .arg(port.to_string());
    let server = ChildGuard::spawn("fake-otlp-grpc", cmd, false).unwrap();
    let agent = agent_to(port, "grpc");
    let a = wait_exports(&server, 3, Duration::from_secs(25));
    assert!(
        a.len() >= 3,
        "{a:?}\n{}\n{}",
        agent.guard.stderr(),
        server.describe()
    );
    // RetryInfo of 4 s on every answer, with a 1 s interval (whose
    // back-off would retry after 1 s, then 2 s).
    for w in a.windows(2) {
        assert!(
            w[1] - w[0] >= 3.4,
            "retried after {:.1} s: {a:?}",
            w[1] - w[0]
        );
    }
    let log = agent.guard.stderr();
    assert!(log.contains("Unavailable") && log.contains("busy"), "{log}");
    assert!(log.contains("retry_in=4s"), "{log}");
}

#[test]
fn otlp_partial_success_is_logged_once_with_the_message() {
    let (server, agent) = start("partial");
    let a = wait_exports(&server, 4, Duration::from_secs(20));
    assert!(a.len() >= 4, "{a:?}");
    std::thread::sleep(Duration::from_millis(300));
    // Delivered, but partly: counted as such, with the points rejected.
    let partial = counted(&agent, "partial");
    assert!(partial >= 4.0, "partial exports counted: {partial}");
    assert_eq!(counted(&agent, "success"), 0.0);
    let m = agent.metrics().unwrap();
    let rejected = sample(&m, "pfs_agent_otlp_rejected_points_total", &[]).unwrap();
    assert!(
        rejected >= 2.0 * partial - 2.0,
        "2 per export: {rejected} for {partial}"
    );
    let log = agent.guard.stderr();
    assert_eq!(
        log.matches("2 points had no name").count(),
        1,
        "logged once per change, with the collector's message:\n{log}"
    );
    assert!(log.contains("rejected=2"), "{log}");
}

#[test]
fn otlp_to_the_other_transports_port_says_what_to_change() {
    let (grpc_port, http_port) = (free_port(), free_port());
    let _receiver = OtlpReceiver::start(Some(grpc_port), Some(http_port)).unwrap();
    for (port, protocol, hint) in [
        (
            grpc_port,
            "http/protobuf",
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
        ),
        (
            http_port,
            "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
        ),
    ] {
        let agent = agent_to(port, protocol);
        // Which error an attempt meets depends on timing (gRPC's preface
        // answered in HTTP/1.1 reads as a bad frame, or, when the server
        // closed first, as a broken pipe, which a collector that went
        // away also gives and which gets no hint): the hint comes with
        // the first attempt that shows the cause, within a few retries.
        let log = poll(Duration::from_secs(20), || {
            let log = agent.guard.stderr();
            Ok(log.contains(hint).then_some(log))
        })
        .unwrap_or_else(|e| {
            panic!(
                "{protocol} to the other port: {e:#}\n{}",
                agent.guard.stderr()
            )
        });
        assert!(log.contains("OTLP export failed"), "{log}");
    }
}

/// An answer of 3 GB (an error page streamed at full speed) is read only
/// up to a bound: the agent's memory stays flat, the export counts as
/// failed, and `/metrics` answers.
#[test]
fn otlp_http_huge_answer_is_not_kept_in_memory() {
    let (server, agent) = start("huge");
    let a = wait_exports(&server, 3, Duration::from_secs(40));
    assert!(a.len() >= 3, "{}", agent.guard.describe());
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.guard.pid())).unwrap();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        hwm_kib < 200 * 1024,
        "the agent's peak RSS is {hwm_kib} KiB after 3 answers of 3 GB"
    );
    assert!(
        counted(&agent, "failure") >= 1.0,
        "{}",
        agent.guard.describe()
    );
    let log = agent.guard.stderr();
    assert!(log.contains("not read"), "{log}");
}

/// The agent stopped (SIGTERM) while an export waits for a slow
/// collector: that export is given up and a final one, of fresh figures,
/// is still sent before the agent exits.
#[test]
fn otlp_stop_during_an_export_still_sends_the_final_one() {
    let (server, mut agent) = start("slow");
    let first = wait_exports(&server, 1, Duration::from_secs(20));
    assert_eq!(first.len(), 1, "{}", agent.guard.describe());
    std::thread::sleep(Duration::from_millis(1000)); // in flight (4 s)
    agent.guard.signal(libc::SIGTERM);
    let status = agent.guard.wait_timeout(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        agent.guard.describe()
    );
    let a = arrivals(&server);
    assert!(
        a.len() >= 2,
        "no final export after the stop: {a:?}\n{}",
        agent.guard.describe()
    );
}
