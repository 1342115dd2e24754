//! Tables written while they are sent: a thread of the stream's own
//! serialises the rows one at a time into [`TABLE_CHUNK`]-byte chunks, at
//! most [`TABLE_CHUNKS_QUEUED`] ahead of the client, so a request holds the
//! (shared) full snapshot and a few chunks, never the whole JSON nor a
//! `Value` per cell.
//!
//! A client that stops reading stalls its stream's thread. That thread is
//! never one of the runtime's blocking threads, which `/metrics`, OTLP and
//! control need: at most [`MAX_TABLE_STREAMS`] streams run at once, each
//! on a thread started for it, and a table request that finds them all
//! taken waits up to [`TABLE_STREAM_WAIT`] (holding no thread) before it
//! gets 503. A stream whose client takes none of its chunks for
//! [`TABLE_STALL_LIMIT`] is given up: its thread, snapshot and slot are
//! freed, and its connection is closed without the last chunk.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};

use super::body::{Body, Chunk, Chunks, Resp, error};
use crate::filter::Filter;
use crate::snapshot::Snapshotter;
use crate::tables::{self, PfsTable};
use crate::truncate::Baselines;

/// Size of the chunks a streamed table is sent in.
pub const TABLE_CHUNK: usize = 64 * 1024;

/// Chunks in flight between the thread writing a table and the connection.
pub const TABLE_CHUNKS_QUEUED: usize = 4;

/// Table streams served at once. Each may hold a full snapshot of its own
/// (about 100 MiB at 1 000 processes × 200 threads, docs/PERFORMANCE.md)
/// for as long as its client takes to read it, which bounds the agent's
/// memory as well as its threads.
pub const MAX_TABLE_STREAMS: usize = 2;

/// How long a table request waits for one of the [`MAX_TABLE_STREAMS`]
/// to end before it is answered 503.
pub const TABLE_STREAM_WAIT: Duration = Duration::from_secs(10);

/// How long a stream waits for its client to take a chunk before it gives
/// the client up. Shorter than [`TABLE_STREAM_WAIT`], so that a request
/// waiting behind streams whose clients stopped reading is served, not
/// refused. (A client this slow reads under 8 KiB/s.)
pub const TABLE_STALL_LIMIT: Duration = Duration::from_secs(8);

/// How long a stopping server waits for its streams' threads to end
/// (each ends at its next chunk, or at once if it is blocked on its
/// client) before its runtime goes away.
pub const STOP_WAIT: Duration = Duration::from_secs(2);

/// The stream slots of one server, [`MAX_TABLE_STREAMS`] permits, and
/// whether it is stopping.
#[derive(Debug)]
pub struct TableStreams {
    slots: Arc<tokio::sync::Semaphore>,
    stopping: tokio::sync::watch::Sender<bool>,
}

impl Default for TableStreams {
    fn default() -> Self {
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_TABLE_STREAMS)),
            stopping: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl TableStreams {
    /// Stops every stream (each is cut short, without its final chunk, at
    /// its next chunk, or at once if it is waiting for its client) and
    /// waits up to [`STOP_WAIT`] for their threads to end, so that none is
    /// left using the runtime while it shuts down.
    pub async fn stop(&self) {
        self.stopping.send_replace(true);
        let all = u32::try_from(MAX_TABLE_STREAMS).expect("a few streams");
        if tokio::time::timeout(STOP_WAIT, self.slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(
                "table streams still running {} s after the stop",
                STOP_WAIT.as_secs()
            );
        }
    }
}

/// Where a streamed table is written: chunks of [`TABLE_CHUNK`] bytes,
/// each sent to the connection once full (blocking the stream's own
/// thread, at most [`TABLE_STALL_LIMIT`], while [`TABLE_CHUNKS_QUEUED`]
/// wait), so that the JSON is never held whole.
struct ChunkWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<Chunk>,
    /// The server's runtime, whose timer bounds each send.
    rt: tokio::runtime::Handle,
    /// Set when the server stops.
    stopping: tokio::sync::watch::Receiver<bool>,
}

impl ChunkWriter {
    /// Sends `chunk`, waiting at most [`TABLE_STALL_LIMIT`] for room:
    /// `BrokenPipe` if the client went away, `TimedOut` if it stopped
    /// reading, `Interrupted` if the server is stopping.
    fn put(&self, chunk: Chunk) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        let stopped = || Error::new(ErrorKind::Interrupted, "the agent is stopping");
        // Never into a runtime that is shutting down (its timer would
        // panic): a stopping server says so first, and waits for this
        // thread before its runtime goes.
        if *self.stopping.borrow() {
            return Err(stopped());
        }
        let mut stopping = self.stopping.clone();
        // (The timeout is made inside the runtime, whose timer it needs.)
        let sent = self.rt.block_on(async {
            tokio::select! {
                r = tokio::time::timeout(TABLE_STALL_LIMIT, self.tx.send(chunk)) => Some(r),
                _ = stopping.wait_for(|s| *s) => None,
            }
        });
        match sent {
            None => Err(stopped()),
            Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(_))) => Err(Error::new(ErrorKind::BrokenPipe, "client gone")),
            Some(Err(_)) => Err(Error::new(
                ErrorKind::TimedOut,
                format!(
                    "the client took no data for {} s (a {} KiB chunk waited for room: a client \
                     reading under {} KiB/s is given up; read with a faster client, or ask for \
                     less with ?service= or ?pid=)",
                    TABLE_STALL_LIMIT.as_secs(),
                    TABLE_CHUNK / 1024,
                    TABLE_CHUNK as u64 / 1024 / TABLE_STALL_LIMIT.as_secs(),
                ),
            )),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(TABLE_CHUNK + 1024));
        self.put(Chunk::Data(Bytes::from(chunk)))
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= TABLE_CHUNK {
            self.send()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// 503 for a table request that found every stream taken, or no thread.
fn busy(why: String) -> Resp {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, why);
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

/// Writes `table` into `tx` (on the stream's own thread), then
/// [`Chunk::End`]. A failure after the headers fails the body, which
/// closes the connection without the final chunk.
fn produce(
    snap: &Snapshotter,
    baselines: impl FnOnce() -> Baselines,
    table: &'static dyn PfsTable,
    filter: &Filter,
    out: ChunkWriter,
) {
    use std::io::ErrorKind;
    let mut out = out;
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let snap = snap.get();
        tables::write_json(table, &snap, filter, &baselines(), &mut out)?;
        std::io::Write::flush(&mut out)?;
        out.put(Chunk::End)
    }));
    let why = match written {
        Ok(Ok(())) => return,
        Ok(Err(e)) if e.kind() == ErrorKind::BrokenPipe => return, // the client went away
        Ok(Err(e)) => e.to_string(),
        Err(_) => "building the table panicked".to_string(),
    };
    tracing::warn!(table = table.name(), "table response cut short: {why}");
    // Without room for it (a client that stopped reading), the writer's
    // going away fails the body just the same.
    let _ = out.tx.try_send(Chunk::Fail(std::io::Error::other(why)));
}

/// Answers a table request: once one of `streams` is free (503 after
/// [`TABLE_STREAM_WAIT`]), its JSON (a snapshot from `snap`, less the
/// `TRUNCATE` baselines that `baselines` gives once it is taken) is
/// written row by row by a thread of its own into [`Body::Stream`]. A
/// client that stops reading stalls that thread, which keeps the snapshot
/// and its stream's slot until [`TABLE_STALL_LIMIT`] passes without
/// progress; a failure after the headers closes the connection without
/// the final chunk, so a cut table is never taken for a whole one.
pub async fn stream_table(
    streams: &TableStreams,
    snap: Arc<Snapshotter>,
    baselines: impl FnOnce() -> Baselines + Send + 'static,
    table: &'static dyn PfsTable,
    filter: Filter,
) -> Resp {
    let slots = streams.slots.clone();
    let permit = match tokio::time::timeout(TABLE_STREAM_WAIT, slots.acquire_owned()).await {
        Ok(Ok(p)) => p,
        _ => {
            tracing::debug!(
                table = table.name(),
                "table request refused: {MAX_TABLE_STREAMS} table streams busy"
            );
            return busy(format!(
                "{MAX_TABLE_STREAMS} tables are being sent already (to clients that may not be \
                 reading them) and none ended within {} s; retry later",
                TABLE_STREAM_WAIT.as_secs()
            ));
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(TABLE_CHUNKS_QUEUED);
    let out = ChunkWriter {
        buf: Vec::with_capacity(TABLE_CHUNK + 1024),
        tx,
        rt: tokio::runtime::Handle::current(),
        stopping: streams.stopping.subscribe(),
    };
    let started = std::thread::Builder::new()
        .name("pfs-table".into())
        .spawn(move || {
            let _permit = permit;
            produce(&snap, baselines, table, &filter, out);
        });
    if let Err(e) = started {
        tracing::warn!(table = table.name(), error = %e, "cannot start a thread to send a table");
        return busy(format!(
            "cannot start a thread to send the table ({e}); retry later"
        ));
    }
    let mut r = Response::new(Body::Stream(Chunks::new(rx)));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
