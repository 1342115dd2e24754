//! Shared helpers for the cross-process and end-to-end tests.
//!
//! * [`agent_bin`] builds `pfs-agent` once (escargot) and caches its path.
//! * [`ChildGuard`] kills and reaps a child process on drop, even when the
//!   test panics, and keeps its stdout/stderr in log files.
//! * [`Writer`] runs `pfs-test-writer` and reads its JSON lines with a
//!   timeout.
//! * [`Agent`] runs `pfs-agent serve` on a free loopback port and waits for
//!   `/healthz`.
//! * [`http_get`], [`get_json`] and [`parse_metrics`] talk to it.
//! * [`memory_tables`] reads the memory tables and truncates them.
//! * [`torn`] records and checks waits whose torn copies are detectable.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

pub mod memory_tables;
pub mod torn;

/// Path of the `pfs-test-writer` binary; expands in the calling test crate,
/// where Cargo sets `CARGO_BIN_EXE_pfs-test-writer`.
#[macro_export]
macro_rules! writer_exe {
    () => {
        std::path::Path::new(env!("CARGO_BIN_EXE_pfs-test-writer"))
    };
}

/// The workspace root (parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Builds `pfs-agent` once per test process and returns its path.
pub fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let run = escargot::CargoBuild::new()
            .manifest_path(workspace_root().join("Cargo.toml"))
            .package("pfs-agent")
            .bin("pfs-agent")
            .run()
            .unwrap_or_else(|e| panic!("cannot build pfs-agent: {e}"));
        run.path().to_path_buf()
    })
}

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A child process that is killed (SIGKILL) and reaped on drop. Its stdout
/// (unless piped by the caller) and stderr go to log files.
pub struct ChildGuard {
    /// The process.
    pub child: Child,
    name: String,
    stderr_log: PathBuf,
    stdout_log: Option<PathBuf>,
    _logdir: tempfile::TempDir,
}

impl ChildGuard {
    /// Spawns `cmd`. If `pipe_stdout`, stdout and stdin are pipes for the
    /// caller; otherwise stdout goes to a log file and stdin is null.
    pub fn spawn(name: &str, mut cmd: Command, pipe_stdout: bool) -> Result<Self> {
        let logdir = tempfile::Builder::new().prefix("pfs-test-log").tempdir()?;
        let stderr_log = logdir.path().join(format!("{name}.stderr"));
        cmd.stderr(std::fs::File::create(&stderr_log)?);
        let stdout_log = if pipe_stdout {
            cmd.stdout(Stdio::piped()).stdin(Stdio::piped());
            None
        } else {
            let p = logdir.path().join(format!("{name}.stdout"));
            cmd.stdout(std::fs::File::create(&p)?).stdin(Stdio::null());
            Some(p)
        };
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {name}: {cmd:?}"))?;
        Ok(Self {
            child,
            name: name.to_string(),
            stderr_log,
            stdout_log,
            _logdir: logdir,
        })
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the child wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// Everything the child wrote to stdout so far (if not piped).
    pub fn stdout(&self) -> String {
        self.stdout_log
            .as_ref()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    }

    /// Exit status if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the child to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) {
        let sig = rustix::process::Signal::from_named_raw(signal)
            .unwrap_or_else(|| panic!("{signal} is not a signal"));
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a child's pid");
        // A child that already exited (not reaped yet) ignores it.
        let _ = rustix::process::kill_process(pid, sig);
    }

    /// A description for assertion messages: name and its logs.
    pub fn describe(&self) -> String {
        format!(
            "--- {} stderr ---\n{}\n--- {} stdout ---\n{}",
            self.name,
            self.stderr(),
            self.name,
            self.stdout()
        )
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A running `pfs-test-writer`, with its stdout lines read on a thread.
pub struct Writer {
    /// The process (killed on drop).
    pub guard: ChildGuard,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

/// Takes the child's piped stdout and forwards its lines to a channel from
/// a reader thread (so reads can time out).
fn stdout_lines(guard: &mut ChildGuard) -> Result<Receiver<String>> {
    let stdout = guard
        .child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout pipe"))?;
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

impl Writer {
    /// Spawns `exe` (use [`writer_exe!`]) with `args`.
    pub fn spawn(exe: &Path, args: &[&str]) -> Result<Self> {
        let mut cmd = Command::new(exe);
        cmd.args(args);
        let mut guard = ChildGuard::spawn("pfs-test-writer", cmd, true)?;
        let stdin = guard.child.stdin.take();
        let rx = stdout_lines(&mut guard)?;
        Ok(Self {
            guard,
            stdin,
            lines: rx,
        })
    }

    /// The next stdout line parsed as JSON, within `timeout`.
    pub fn read_json(&mut self, timeout: Duration) -> Result<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => serde_json::from_str(&line)
                .with_context(|| format!("writer printed non-JSON line {line:?}")),
            Err(RecvTimeoutError::Timeout) => {
                bail!(
                    "writer printed nothing within {timeout:?}\n{}",
                    self.guard.describe()
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                bail!("writer closed stdout\n{}", self.guard.describe())
            }
        }
    }

    /// The next stdout line parsed as JSON, if one is already available.
    pub fn try_read_json(&mut self) -> Result<Option<Value>> {
        match self.lines.try_recv() {
            Ok(line) => {
                Ok(Some(serde_json::from_str(&line).with_context(|| {
                    format!("writer printed non-JSON line {line:?}")
                })?))
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                bail!("writer closed stdout\n{}", self.guard.describe())
            }
        }
    }

    /// Writes one line to the writer's stdin (modes that wait for a step).
    pub fn send_line(&mut self, line: &str) -> Result<()> {
        use std::io::Write as _;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("the writer's stdin is already closed"))?;
        writeln!(stdin, "{line}").context("writing to the writer's stdin")?;
        stdin.flush().context("flushing the writer's stdin")
    }

    /// Closes the writer's stdin (it exits at EOF) and waits for a clean
    /// exit within `timeout`.
    pub fn finish(&mut self, timeout: Duration) -> Result<()> {
        drop(self.stdin.take());
        match self.guard.wait_timeout(timeout) {
            Some(s) if s.success() => Ok(()),
            Some(s) => bail!("writer exited with {s}\n{}", self.guard.describe()),
            None => bail!("writer did not exit within {timeout:?}"),
        }
    }

    /// The segment files in `dir` created by this writer's pid.
    pub fn segment_in(&self, dir: &Path, service: &str) -> PathBuf {
        dir.join(pfs_client::segment_file_name(service, self.guard.pid()))
    }
}

/// A running `pfs-agent serve`.
pub struct Agent {
    /// The process (killed on drop).
    pub guard: ChildGuard,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Agent {
    /// Starts `pfs-agent serve --shm-dir DIR --listen 127.0.0.1:PORT` and
    /// waits (up to 20 s) for `/healthz` to answer 200 "ok".
    pub fn serve(shm_dir: &Path) -> Result<Self> {
        Self::serve_with_args(shm_dir, &[])
    }

    /// [`Agent::serve`] with more `serve` arguments (tokens, limits,
    /// defaults).
    pub fn serve_with_args(shm_dir: &Path, args: &[&str]) -> Result<Self> {
        let port = free_port();
        let mut cmd = Command::new(agent_bin());
        cmd.arg("serve")
            .arg("--shm-dir")
            .arg(shm_dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args);
        let guard = ChildGuard::spawn("pfs-agent", cmd, false)?;
        let mut agent = Self {
            guard,
            base: format!("http://127.0.0.1:{port}"),
        };
        agent.wait_healthy(Duration::from_secs(20))?;
        Ok(agent)
    }

    /// Polls `/healthz` until it answers 200 "ok".
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        wait_healthz(&self.base, &mut self.guard, timeout)
    }

    /// `GET base + path`.
    pub fn get(&self, path: &str) -> Result<HttpResponse> {
        http_get(&format!("{}{path}", self.base))
    }

    /// `GET /api/v1/tables/{table}` as JSON (status must be 200).
    pub fn table(&self, table: &str) -> Result<Value> {
        get_json(&format!("{}/api/v1/tables/{table}", self.base))
    }

    /// `GET /metrics`, parsed.
    pub fn metrics(&self) -> Result<Vec<Sample>> {
        let r = self.get("/metrics")?;
        if r.status != 200 {
            bail!("/metrics answered {}: {}", r.status, r.body);
        }
        parse_metrics(&r.body)
    }
}

/// Polls `base/healthz` until it answers 200 "ok", failing early if
/// `child` exits.
pub fn wait_healthz(base: &str, child: &mut ChildGuard, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait() {
            bail!(
                "process exited with {s} before /healthz answered\n{}",
                child.describe()
            );
        }
        let last = match http_get(&format!("{base}/healthz")) {
            // Ready: 200 and `ok` (then possibly `degraded:` lines).
            Ok(r) if r.status == 200 && r.body.lines().next() == Some("ok") => return Ok(()),
            Ok(r) => format!("status {} body {:?}", r.status, r.body),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "{base}/healthz not ready after {timeout:?} (last: {last})\n{}",
                child.describe()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// Body as text.
    pub body: String,
}

fn http_agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into()
    })
}

/// `GET url`; any status is returned (not an error).
pub fn http_get(url: &str) -> Result<HttpResponse> {
    let mut r = http_agent()
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = r
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .with_context(|| format!("read body of {url}"))?;
    Ok(HttpResponse {
        status,
        content_type,
        body,
    })
}

/// `GET url` as JSON; the status must be 200.
pub fn get_json(url: &str) -> Result<Value> {
    let r = http_get(url)?;
    if r.status != 200 {
        bail!("GET {url} answered {}: {}", r.status, r.body);
    }
    serde_json::from_str(&r.body)
        .with_context(|| format!("GET {url}: body is not JSON: {}", r.body))
}

/// One sample of an OpenMetrics / Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Sample name (with `_total`, `_bucket`, ... suffixes).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// Whether every `(k, v)` of `want` is a label of this sample.
    pub fn has_labels(&self, want: &[(&str, &str)]) -> bool {
        want.iter()
            .all(|(k, v)| self.labels.get(*k).map(String::as_str) == Some(*v))
    }
}

/// Parses the text exposition format (comments skipped). Strict enough to
/// fail on malformed lines.
pub fn parse_metrics(text: &str) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_sample(line).with_context(|| format!("metrics line {}: {line:?}", n + 1))?);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| anyhow!("no value"))?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let end = loop {
            // label name
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' || c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            let Some(&(start, c)) = chars.peek() else {
                bail!("unterminated labels")
            };
            if c == '}' {
                break start + 1;
            }
            let mut key_end = start;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    key_end = i;
                    break;
                }
            }
            let key = r[start..key_end].to_string();
            match chars.next() {
                Some((_, '"')) => {}
                _ => bail!("label {key} value is not quoted"),
            }
            let mut val = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, 'n')) => val.push('\n'),
                        Some((_, c)) => val.push(c),
                        None => bail!("dangling escape"),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => val.push(c),
                }
            }
            if !closed {
                bail!("unterminated label value");
            }
            labels.insert(key, val);
        };
        rest = &r[end..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("no value"))?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse::<f64>()
            .with_context(|| format!("bad value {v:?}"))?,
    };
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// The single sample named `name` with labels `want`; fails if there is
/// none or more than one.
pub fn sample(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> Result<f64> {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name && s.has_labels(want))
        .collect();
    match found.as_slice() {
        [s] => Ok(s.value),
        [] => bail!("no sample {name}{want:?}"),
        many => bail!("{} samples {name}{want:?}: {many:?}", many.len()),
    }
}

/// Rows of a table JSON object (`{"rows": [...]}`).
pub fn rows(table: &Value) -> Result<&Vec<Value>> {
    table
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("table has no rows array: {table}"))
}

/// Integer column `col` of `row` (u64), failing on null or non-integers.
pub fn u64_col(row: &Value, col: &str) -> Result<u64> {
    row.get(col)
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("column {col} is not an unsigned integer in {row}"))
}

/// Integer column `col` as u128 (sums may exceed u64 in principle).
pub fn u128_col(row: &Value, col: &str) -> Result<u128> {
    match row.get(col) {
        Some(Value::Number(n)) => n
            .as_u64()
            .map(u128::from)
            .or_else(|| n.to_string().parse().ok())
            .ok_or_else(|| anyhow!("column {col} is not an unsigned integer in {row}")),
        _ => bail!("column {col} missing or not a number in {row}"),
    }
}

/// String column `col` of `row`.
pub fn str_col<'a>(row: &'a Value, col: &str) -> Result<&'a str> {
    row.get(col)
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("column {col} is not a string in {row}"))
}

/// Polls `f` every 100 ms until it returns `Ok(Some(_))` or `timeout`
/// passes; returns the last error or `None` result as an error.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut last: Option<anyhow::Error> = None;
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(last.unwrap_or_else(|| anyhow!("condition not met within {timeout:?}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether this machine can make PID namespaces (root and `unshare`), as
/// a container runtime does; if not, says that `test` skips its
/// namespace test, and why.
pub fn can_unshare(test: &str) -> bool {
    if !rustix::process::geteuid().is_root() {
        eprintln!("{test}: skipped the PID-namespace test: it needs root");
        return false;
    }
    let ok = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "{test}: skipped the PID-namespace test: `unshare --pid --fork --mount-proc true` failed"
        );
    }
    ok
}

/// The instruments `pfs-test-writer` registers, in registration order.
pub const TEST_CLASSES: [&str; 3] = [
    "wait/synch/mutex/test/a",
    "wait/synch/rwlock/test/b",
    "wait/io/file/test/c",
];

/// Runs `pfs-test-writer exact` and returns it with its ready line.
pub fn spawn_exact(
    exe: &Path,
    dir: &Path,
    service: &str,
    threads: u32,
    per_class: u32,
    exit_midway: u32,
) -> Result<(Writer, Value)> {
    let d = dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 temp dir"))?;
    let (n, k, m) = (
        threads.to_string(),
        per_class.to_string(),
        exit_midway.to_string(),
    );
    let mut w = Writer::spawn(
        exe,
        &[
            "exact",
            "--shm-dir",
            d,
            "--service",
            service,
            "--threads",
            &n,
            "--per-class",
            &k,
            "--exit-midway",
            &m,
        ],
    )?;
    let ready = w.read_json(Duration::from_secs(30))?;
    if ready["ready"] != true {
        bail!("exact writer is not ready: {ready}");
    }
    Ok((w, ready))
}

/// A running `tests/otlp_receiver.py` (an OTLP receiver built on the
/// official Python protobuf classes and grpcio), with its JSON lines read
/// on a thread.
pub struct OtlpReceiver {
    /// The process (killed on drop).
    pub guard: ChildGuard,
    lines: Receiver<String>,
}

impl OtlpReceiver {
    /// Starts the receiver on the given loopback ports and waits (up to
    /// 30 s) for its ready line. Needs `python3` with `opentelemetry-proto`
    /// and `grpcio` (scripts/test installs them).
    pub fn start(grpc_port: Option<u16>, http_port: Option<u16>) -> Result<Self> {
        Self::start_with(grpc_port, http_port, None)
    }

    /// Like [`OtlpReceiver::start`], serving TLS only (and requiring a
    /// client certificate if [`ReceiverTls::client_ca`] is set).
    pub fn start_tls(
        grpc_port: Option<u16>,
        http_port: Option<u16>,
        tls: &ReceiverTls,
    ) -> Result<Self> {
        Self::start_with(grpc_port, http_port, Some(tls))
    }

    fn start_with(
        grpc_port: Option<u16>,
        http_port: Option<u16>,
        tls: Option<&ReceiverTls>,
    ) -> Result<Self> {
        let mut cmd = Command::new("python3");
        cmd.arg("-u")
            .arg(workspace_root().join("tests/otlp_receiver.py"));
        if let Some(p) = grpc_port {
            cmd.arg("--grpc-port").arg(p.to_string());
        }
        if let Some(p) = http_port {
            cmd.arg("--http-port").arg(p.to_string());
        }
        if let Some(t) = tls {
            cmd.arg("--tls-cert")
                .arg(&t.cert)
                .arg("--tls-key")
                .arg(&t.key);
            if let Some(ca) = &t.client_ca {
                cmd.arg("--tls-client-ca").arg(ca);
            }
        }
        let mut guard = ChildGuard::spawn("otlp-receiver", cmd, true)?;
        let rx = stdout_lines(&mut guard)?;
        let mut r = Self { guard, lines: rx };
        let ready = r.next(Duration::from_secs(30))?.ok_or_else(|| {
            anyhow!(
                "otlp_receiver.py printed nothing within 30 s (is `python3 -m pip install \
                 opentelemetry-proto grpcio protobuf` done?)\n{}",
                r.guard.describe()
            )
        })?;
        if ready["ready"] != true {
            bail!("receiver is not ready: {ready}");
        }
        Ok(r)
    }

    /// The next received request (JSON), or `None` after `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Value>> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                Ok(Some(serde_json::from_str(&line).with_context(|| {
                    format!("receiver printed non-JSON line {line:?}")
                })?))
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                bail!("receiver exited\n{}", self.guard.describe())
            }
        }
    }

    /// The first request within `timeout` for which `want` returns true.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        mut want: impl FnMut(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no matching OTLP request within {timeout:?} ({seen} others received)");
            }
            if let Some(v) = self.next(left)? {
                seen += 1;
                if want(&v) {
                    return Ok(v);
                }
            }
        }
    }
}

/// The TLS files of a TLS [`OtlpReceiver`] (PEM).
#[derive(Debug, Clone)]
pub struct ReceiverTls {
    /// The server certificate (chain).
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
    /// If set, client certificates issued by this CA are required (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// The metric `name` of every resource of an OTLP request printed by
/// [`OtlpReceiver`], with its resource attributes.
pub fn otlp_metrics<'a>(req: &'a Value, name: &str) -> Vec<(&'a Value, &'a Value)> {
    let mut out = Vec::new();
    for rm in req["resource_metrics"].as_array().into_iter().flatten() {
        for m in rm["metrics"].as_array().into_iter().flatten() {
            if m["name"] == name {
                out.push((&rm["resource"], m));
            }
        }
    }
    out
}

impl Agent {
    /// Starts `pfs-agent serve` like [`Agent::serve`], with `env` added to
    /// its environment (and every inherited `OTEL_*` variable removed).
    pub fn serve_with_env(shm_dir: &Path, env: &[(&str, String)]) -> Result<Self> {
        let port = free_port();
        let mut cmd = Command::new(agent_bin());
        cmd.arg("serve")
            .arg("--shm-dir")
            .arg(shm_dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"));
        for (k, _) in std::env::vars() {
            if k.starts_with("OTEL_") || k.starts_with("K8S_") {
                cmd.env_remove(k);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let guard = ChildGuard::spawn("pfs-agent", cmd, false)?;
        let mut agent = Self {
            guard,
            base: format!("http://127.0.0.1:{port}"),
        };
        agent.wait_healthy(Duration::from_secs(20))?;
        Ok(agent)
    }
}

/// Starts a real `prometheus` with `config`, storing data in `data`, on
/// 127.0.0.1:`port`, and waits (up to 30 s) until it is ready.
pub fn start_prometheus(config: &Path, data: &Path, port: u16) -> Result<ChildGuard> {
    start_prometheus_with(config, data, port, &[])
}

/// [`start_prometheus`] with extra flags (e.g.
/// `--enable-feature=native-histograms`).
pub fn start_prometheus_with(
    config: &Path,
    data: &Path,
    port: u16,
    flags: &[&str],
) -> Result<ChildGuard> {
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .args(flags);
    let mut prom = ChildGuard::spawn("prometheus", cmd, false)?;
    let ready = format!("http://127.0.0.1:{port}/-/ready");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = prom.try_wait() {
            bail!("prometheus exited with {s}\n{}", prom.describe());
        }
        if http_get(&ready).is_ok_and(|r| r.status == 200) {
            return Ok(prom);
        }
        if Instant::now() > deadline {
            bail!("prometheus not ready after 30 s\n{}", prom.describe());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Percent-encodes a URL query value (RFC 3986 unreserved characters kept).
pub fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The `result` vector of a Prometheus instant query at `base`.
pub fn prom_query(base: &str, q: &str) -> Result<Vec<Value>> {
    let v = get_json(&format!("{base}/api/v1/query?query={}", url_encode(q)))?;
    if v["status"] != "success" {
        bail!("query {q} failed: {v}");
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// A range query (`/api/v1/query_range`) over the last `span`, one point
/// per `step`, as Grafana runs a time series panel: the series it returns.
pub fn prom_query_range(base: &str, q: &str, span: Duration, step: Duration) -> Result<Vec<Value>> {
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let start = end - span.as_secs_f64();
    let v = get_json(&format!(
        "{base}/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={}",
        url_encode(q),
        step.as_secs_f64()
    ))?;
    if v["status"] != "success" {
        bail!("range query {q} failed: {v}");
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// A private tmpfs of `size` bytes, unmounted (lazily) on drop. Needs
/// root, as the suite runs.
pub struct Tmpfs(pub tempfile::TempDir);

impl Tmpfs {
    /// Mounts it (panics, saying root is needed, if it cannot).
    pub fn mount(size: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let opts = std::ffi::CString::new(format!("size={size},mode=0755")).unwrap();
        rustix::mount::mount(
            "tmpfs",
            dir.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            opts.as_c_str(),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs (this test needs root): {e}"));
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(self.0.path(), rustix::mount::UnmountFlags::DETACH);
    }
}
