//! Tables written while they are sent: a blocking task serialises the
//! rows one at a time into [`TABLE_CHUNK`]-byte chunks, at most
//! [`TABLE_CHUNKS_QUEUED`] ahead of the client, so a request holds the
//! (shared) full snapshot and a few chunks, never the whole JSON nor a
//! `Value` per cell.

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;
use hyper::header::{CONTENT_TYPE, HeaderValue};

use super::body::{Body, Resp};
use super::state::AppState;
use crate::filter::Filter;
use crate::tables::{self, PfsTable};

/// Size of the chunks a streamed table is sent in.
pub const TABLE_CHUNK: usize = 64 * 1024;

/// Chunks in flight between the task writing a table and the connection.
pub const TABLE_CHUNKS_QUEUED: usize = 4;

/// Where a streamed table is written: chunks of [`TABLE_CHUNK`] bytes,
/// each sent to the connection once full (blocking while
/// [`TABLE_CHUNKS_QUEUED`] wait), so that the JSON is never held whole.
struct ChunkWriter {
    buf: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(TABLE_CHUNK + 1024));
        self.tx
            .blocking_send(Ok(Bytes::from(chunk)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client gone"))
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

/// Answers a table request: its JSON is written row by row by a blocking
/// task into [`Body::Stream`]. A client that stops reading stalls the
/// task, which then keeps the snapshot alive until the connection
/// timeout; a failure after the headers closes the connection without
/// the final chunk, so a cut table is never taken for a whole one.
pub fn stream_table(state: Arc<AppState>, table: &'static dyn PfsTable, filter: Filter) -> Resp {
    let (tx, rx) = tokio::sync::mpsc::channel(TABLE_CHUNKS_QUEUED);
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkWriter {
            buf: Vec::with_capacity(TABLE_CHUNK + 1024),
            tx: tx.clone(),
        };
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let snap = state.snap.get();
            let baselines = state.baselines().clone();
            tables::write_json(table, &snap, &filter, &baselines, &mut out)
        }));
        let failed = match written {
            Ok(Ok(())) => match std::io::Write::flush(&mut out) {
                Ok(()) => None,
                Err(_) => return, // the client went away
            },
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => return,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("building the table panicked".to_string()),
        };
        if let Some(why) = failed {
            tracing::warn!(table = table.name(), "table response cut short: {why}");
            let _ = tx.blocking_send(Err(std::io::Error::other(why)));
        }
    });
    let mut r = Response::new(Body::Stream(rx));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
