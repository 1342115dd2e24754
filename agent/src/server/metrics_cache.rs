//! The `/metrics` body, rendered at most once per snapshot lifetime and
//! exposition (text, protobuf) and shared: every request in that time gets
//! the same reference-counted bytes. While one request renders the next body, the others get the
//! previous one (at most [`STALE_WHILE_RENDERING`] old) instead of
//! queueing, and no lock is held while a body is written to a client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::registry::Registry;

use crate::export::model::AgentStats;
use crate::export::prometheus::{self, Exposition, RenderError};
use crate::snapshot::Snapshotter;

/// While a render is in progress, bodies up to this old are served.
pub const STALE_WHILE_RENDERING: Duration = Duration::from_secs(1);

/// The shared `/metrics` body.
#[derive(Debug)]
pub struct MetricsCache {
    registry: Registry,
    stats: Arc<AgentStats>,
    /// Held while rendering: identical concurrent scrapes wait for one
    /// render instead of each doing it.
    rendering: Mutex<()>,
    /// The newest body of each exposition and when its render started,
    /// readable while a render is in progress (locked only to copy it).
    latest: Mutex<[Option<(Instant, Bytes)>; Exposition::ALL.len()]>,
    /// Bodies younger than this are served without asking the snapshotter.
    max_age: Duration,
}

impl MetricsCache {
    /// A cache over `snap`'s summaries, reporting `stats` (and recording
    /// each render's duration there).
    pub fn new(snap: Arc<Snapshotter>, stats: Arc<AgentStats>) -> Self {
        let max_age = snap.max_age();
        Self {
            registry: prometheus::registry(snap, stats.clone()),
            stats,
            rendering: Mutex::new(()),
            latest: Mutex::new([const { None }; Exposition::ALL.len()]),
            max_age,
        }
    }

    fn latest(&self, exposition: Exposition) -> Option<(Instant, Bytes)> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner())[exposition.index()].clone()
    }

    /// The newest body without waiting: if its snapshot is younger than a
    /// snapshot's lifetime, or, while another request is rendering the
    /// next one, younger than [`STALE_WHILE_RENDERING`] (a scrape storm
    /// then never queues behind a render). Bodies only move forward, so a
    /// client never sees an older body than before.
    pub fn fresh(&self, exposition: Exposition) -> Option<Bytes> {
        let (at, body) = self.latest(exposition)?;
        let age = at.elapsed();
        if age < self.max_age {
            return Some(body);
        }
        let rendering = self.rendering.try_lock().is_err();
        (rendering && age < STALE_WHILE_RENDERING).then_some(body)
    }

    /// Renders `/metrics`, or returns the body rendered less than a
    /// snapshot's lifetime ago (blocking: waits for a render in progress,
    /// and the render walks the segments if the snapshot is stale).
    pub fn render(&self, exposition: Exposition) -> Result<Bytes, RenderError> {
        let _rendering = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, body)) = self.latest(exposition)
            && at.elapsed() < self.max_age
        {
            return Ok(body);
        }
        let start = Instant::now();
        let body = Bytes::from(prometheus::render_as(&self.registry, exposition)?);
        self.stats.set_scrape_seconds(start.elapsed().as_secs_f64());
        self.latest.lock().unwrap_or_else(|p| p.into_inner())[exposition.index()] =
            Some((start, body.clone()));
        Ok(body)
    }

    /// Drops the cached body and `snap`'s snapshots (after a setup change,
    /// so that the next scrape shows it).
    pub fn invalidate(&self, snap: &Snapshotter) {
        let _rendering = self.rendering.lock().unwrap_or_else(|p| p.into_inner());
        snap.invalidate();
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) =
            [const { None }; Exposition::ALL.len()];
    }
}
