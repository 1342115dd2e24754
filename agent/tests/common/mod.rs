//! The agent's integration tests' harness: a real `pfs-agent serve` on
//! loopback (killed on drop, its stderr in a file) and plain HTTP/1.1
//! requests to it on new connections.

#![allow(dead_code)] // each test file uses part of it

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The agent binary Cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_pfs-agent");

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The agent run as `nobody` (uid and gid 65534, no other group) through
/// `setpriv`, to meet directories it may not read; `None` (the caller
/// skips its test, saying so) unless the tests run as root and `setpriv`
/// exists.
pub fn as_nobody() -> Option<Command> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    match (root, setpriv) {
        (true, Some(setpriv)) => {
            let mut cmd = Command::new(setpriv);
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
            Some(cmd)
        }
        _ => {
            eprintln!("skipped: needs root and setpriv to run the agent as another user");
            None
        }
    }
}

/// A running `pfs-agent serve`, killed on drop; its stderr in a file.
pub struct Serve {
    child: Child,
    /// Where requests go.
    pub addr: SocketAddr,
    _logs: tempfile::TempDir,
    stderr: PathBuf,
}

impl Serve {
    /// Serves `dir` on `listen` (`PFS_LISTEN`; the default if `None`);
    /// requests go to `connect`.
    pub fn start_on(
        dir: &Path,
        listen: Option<String>,
        connect: SocketAddr,
        args: &[&str],
    ) -> Self {
        Self::start_with(Command::new(BIN), dir, listen, connect, args)
    }

    /// [`Serve::start_on`] with `cmd` as the agent (e.g. [`as_nobody`]).
    pub fn start_with(
        mut cmd: Command,
        dir: &Path,
        listen: Option<String>,
        connect: SocketAddr,
        args: &[&str],
    ) -> Self {
        let logs = tempfile::tempdir().unwrap();
        let stderr = logs.path().join("stderr");
        cmd.arg("serve").arg("--shm-dir").arg(dir);
        match &listen {
            Some(l) => cmd.env("PFS_LISTEN", l),
            None => cmd.env_remove("PFS_LISTEN"),
        };
        let child = cmd
            .args(args)
            .env("PFS_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            addr: connect,
            _logs: logs,
            stderr,
        }
    }

    /// Serves `dir` on 127.0.0.1 and a free port.
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        Self::start_on(dir, Some(addr.to_string()), addr, args)
    }

    /// What the agent logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// See [`request`].
    pub fn request(
        &self,
        method: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, String), String> {
        request(self.addr, method, path, timeout)
    }

    /// See [`get`].
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        get(self.addr, path)
    }

    /// Waits for `/healthz` to answer 200; panics with the log if not.
    pub fn wait_healthy(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                panic!("pfs-agent exited with {s}:\n{}", self.stderr());
            }
            if self
                .request("GET", "/healthz", Duration::from_secs(2))
                .is_ok_and(|(st, _)| st == 200)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "pfs-agent did not answer /healthz within {timeout:?}:\n{}",
            self.stderr()
        );
    }

    /// Sends SIGTERM and waits at most `timeout` for the agent to exit:
    /// its exit status, or `None` if it is still running.
    pub fn stop(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM failed");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The value of the first `/metrics` sample of family `name` whose
    /// labels include every one of `labels` (`key="value"` each).
    pub fn metric(&self, name: &str, labels: &[&str]) -> Result<f64, String> {
        let (status, body) = self.get("/metrics")?;
        if status != 200 {
            return Err(format!("/metrics answered {status}: {body}"));
        }
        let prefix = format!("{name}{{");
        body.lines()
            .find(|l| l.starts_with(&prefix) && labels.iter().all(|want| l.contains(want)))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .ok_or_else(|| format!("no {name}{{{}}} in /metrics", labels.join(",")))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `method path` to `addr` on a new connection: status and body, or why
/// there was no answer within `timeout`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("no answer to {method} {path} within {timeout:?}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

/// `GET path` to `addr`, answered within 5 s.
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    request(addr, "GET", path, Duration::from_secs(5))
}
