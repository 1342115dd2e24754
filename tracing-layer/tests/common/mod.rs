//! Shared by the integration tests: the client's segment in a temporary
//! directory, reading it back, a real axum server and a real HTTP client,
//! a multi-threaded runtime, and a buffer for what a fmt layer writes.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pfs_shm_layout::Segment;
use pfs_shm_layout::reader::{ReadOptions, SegmentSnapshot, Summary, snapshot};

/// Initialises the client with every `history_long` consumer on; returns
/// the directory (keep it alive) and the segment path.
pub fn init(service: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    pfs_client::init_with(
        pfs_client::Config::new(service)
            .shm_dir(dir.path())
            .consumer("events_%_history_long", true),
    )
    .unwrap();
    let path = pfs_client::segment_path().unwrap().to_path_buf();
    (dir, path)
}

pub fn read(path: &Path) -> SegmentSnapshot {
    let seg = Segment::open(std::fs::File::open(path).unwrap(), false).unwrap();
    snapshot(&seg, &ReadOptions::default()).unwrap()
}

/// Summaries by class name: exited threads' and live threads' rows.
pub fn sums(s: &SegmentSnapshot) -> HashMap<String, Summary> {
    let names: HashMap<u32, &str> = s
        .classes
        .iter()
        .map(|c| (c.index, c.name.as_str()))
        .collect();
    let mut out: HashMap<String, Summary> = HashMap::new();
    for (class, row) in s
        .exited
        .iter()
        .chain(s.threads.iter().flat_map(|t| t.rows.iter()))
    {
        if let Some(name) = names.get(class) {
            out.entry(name.to_string()).or_default().merge(row);
        }
    }
    out
}

/// A multi-threaded tokio runtime with `workers` workers, every driver on.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// The index of class `name`, if registered.
pub fn class_index(s: &SegmentSnapshot, name: &str) -> Option<u32> {
    s.classes.iter().find(|c| c.name == name).map(|c| c.index)
}

/// A server on 127.0.0.1:0; send on the sender (or drop it) to shut it
/// down gracefully, then await the handle: every connection is closed by
/// then, so every request span has closed.
pub async fn serve(
    app: Router,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    (addr, tx, handle)
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends one request; returns the status once the whole body is read.
pub async fn send(client: &HttpClient, method: &str, url: &str) -> u16 {
    let req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .expect("no timeout")
        .expect("a response");
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("the body");
    status
}

/// What a `fmt` layer writes (`.with_writer(move || buffer.clone())`),
/// for a test to read back.
#[derive(Clone, Default)]
pub struct Buffer(pub Arc<Mutex<Vec<u8>>>);

impl Buffer {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// Everything written once `needle` is (a warning given from inside
    /// a subscriber's callback is written by a thread of its own: see
    /// `pfs_client::warning`), or after 10 s without it.
    pub fn text_with(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.text();
            if text.contains(needle) || std::time::Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
